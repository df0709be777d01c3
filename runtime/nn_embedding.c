/* nn_embedding.c: y[..., :] = w[idx[...], :] and its backward, dw[idx[r], :] += dy[r, :].
 * Every cpu index is checked (by the front) before anything is written, so a bad batch
 * fails cleanly and leaves dw untouched. The backward splits the C columns among threads: each thread adds
 * whole columns for every row in order, so repeated indices never race and the sums come
 * out in the same order on every run. */
#include "backend_internal.h"
#include "nn_internal.h"
#include "nn.h"

static inline int64_t index_at(const sh_tensor *idx, int64_t i) {
  const void *p = sh_tensor_data(idx);
  return idx->dtype == SH_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

typedef struct emb_args {
  const sh_tensor *idx;
  const float *w, *dy;
  float *y, *dw;
  int64_t n, C;
} emb_args;

static void gather_rows(const void *arg, int64_t r0, int64_t r1) {
  const emb_args *a = arg;
  for (int64_t r = r0; r < r1; r++)
    memcpy(a->y + r * a->C, a->w + index_at(a->idx, r) * a->C, (size_t)a->C * sizeof(float));
}

SH_CPU_KERNEL(scatter_columns, (const void *arg, int64_t c0, int64_t c1), (arg, c0, c1)) {
  const emb_args *a = arg;
  for (int64_t r = 0; r < a->n; r++) {
    float *dst = a->dw + index_at(a->idx, r) * a->C;
    const float *src = a->dy + r * a->C;
#pragma omp simd
    for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
  }
}

static int cpu_embedding_forward(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w) {
  const char *op = "embedding";
  sh_tensor *ic = NULL, *wc = NULL;
  sh_nn_accum o = {0};
  int rc = sh_tensor_contiguous(&ic, idx);
  if (!rc) rc = sh_nn_f32(&wc, w, op, "w");
  if (!rc) rc = sh_nn_out_begin(&o, y);
  if (!rc) {
    emb_args a = {.idx = ic, .w = sh_nn_ptr(wc), .y = sh_nn_ptr(o.buf), .n = sh_tensor_numel(ic), .C = w->shape[1]};
    sh_nn_parallel_for(a.n, a.n * a.C, gather_rows, &a);
    rc = sh_nn_accum_end(&o);
  }
  sh_nn_accum_drop(&o);
  sh_tensor_destroy(ic); sh_tensor_destroy(wc);
  return rc;
}

static int cpu_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  const char *op = "embedding_backward";
  sh_tensor *ic = NULL, *dyc = NULL;
  sh_nn_accum acc = {0};
  int rc = sh_tensor_contiguous(&ic, idx);
  if (!rc) rc = sh_nn_f32(&dyc, dy, op, "dy");
  if (!rc) rc = sh_nn_accum_begin(&acc, dw, op, "dw");
  if (!rc) {
    emb_args a = {.idx = ic, .dy = sh_nn_ptr(dyc), .dw = sh_nn_ptr(acc.buf), .n = sh_tensor_numel(ic), .C = dw->shape[1]};
    /* at least 16 columns per thread: narrower slices would share cache lines */
    int64_t work = a.C >= 32 ? a.n * a.C : 0;
    sh_nn_parallel_for(a.C, work, scatter_columns, &a);
    rc = sh_nn_accum_end(&acc);
  }
  sh_nn_accum_drop(&acc);
  sh_tensor_destroy(ic); sh_tensor_destroy(dyc);
  return rc;
}

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
    if ((ix = index_at(ic, i)) < 0 || ix >= V) break;
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

void sh_embedding_register_cpu(sh_backend *b) {
  b->embedding_forward = cpu_embedding_forward;
  b->embedding_backward = cpu_embedding_backward;
}
