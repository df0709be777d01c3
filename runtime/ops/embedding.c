/* embedding.c: the embedding fronts (nn.h): indices and weights checked, y planned on w's
 * device, then the kernel of that device (cpu/embedding.c, kernels/embedding.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"
#include <string.h>

/* ---- the fronts: checks and output planning for every device ------------------------------ */

static int check_weight(const sh_tensor *w, const char *op, const char *name) {
  SH_TRY(sh_nn_check_float(w, op, name));
  if (w->ndim != 2) return sh_fail(SH_ERR_ARG, "%s: %s must be [V, C], got %s", op, name, sh_desc(w));
  return SH_OK;
}

/* shape = idx's shape + [C], the shape of y and dy. */
static int rows_shape(int64_t *shape, const sh_tensor *idx, int64_t C, const char *op) {
  SH_TRY(sh_tensor_check(idx, op));
  if (idx->ndim >= SH_MAX_DIMS) return sh_fail(SH_ERR_ARG, "%s: idx %s has too many dims to add C", op, sh_desc(idx));
  memcpy(shape, idx->shape, sizeof(int64_t) * idx->ndim);
  shape[idx->ndim] = C;
  return SH_OK;
}

/* Every entry of a cpu idx lies in [0, V), checked before anything is written. */
static int check_range(const sh_tensor *idx, int64_t V, const char *op) {
  sh_tensor *ic = NULL;
  SH_TRY(sh_tensor_contiguous(&ic, idx));
  int64_t n = sh_tensor_numel(ic), ix = 0, i = 0;
  for (; i < n; i++)
    if ((ix = sh_index_at(ic, i)) < 0 || ix >= V) break;
  sh_tensor_destroy(ic);
  if (i == n) return SH_OK;
  return sh_fail(SH_ERR_ARG, "%s: index %lld (at flat position %lld of idx %s) is outside [0, %lld) for V = %lld",
                 op, (long long)ix, (long long)i, sh_desc(idx), (long long)V, (long long)V);
}

/* idx: i64 or i32 on the device of w (V rows). A cuda idx cannot be read here without a
 * host sync: its kernels give an index outside [0, V) a zero row and no gradient. */
static int check_indices(const sh_tensor *idx, const sh_tensor *w, const char *op) {
  SH_TRY(sh_check_on(idx, w->device, op, "idx"));
  if (idx->dtype != SH_I64 && idx->dtype != SH_I32)
    return sh_fail(SH_ERR_ARG, "%s: idx must be i64 or i32, got %s", op, sh_desc(idx));
  return w->device == -1 ? check_range(idx, w->shape[0], op) : SH_OK;
}

int sh_embedding_forward(sh_tensor **y, const sh_tensor *idx, const sh_tensor *w) {
  const char *op = "embedding";
  *y = NULL;
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(check_weight(w, op, "w"));
  SH_TRY(rows_shape(shape, idx, w->shape[1], op));
  SH_TRY(check_indices(idx, w, op));
  sh_tensor *o = NULL;
  int rc = sh_tensor_empty(&o, idx->ndim + 1, shape, w->dtype, w->device);
  if (!rc) rc = SH_KERNEL(op, w->device, embedding_forward, o, idx, w);
  if (rc) sh_tensor_destroy(o);
  else *y = o;
  return rc;
}

int sh_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  const char *op = "embedding_backward";
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(check_weight(dw, op, "dw"));
  SH_TRY(sh_nn_check_float_on(dy, dw->device, op, "dy"));
  SH_TRY(rows_shape(shape, idx, dw->shape[1], op));
  SH_TRY(sh_nn_check_shape(dy, op, "dy", idx->ndim + 1, shape));
  SH_TRY(check_indices(idx, dw, op));
  return SH_KERNEL(op, dw->device, embedding_backward, dw, dy, idx);
}
