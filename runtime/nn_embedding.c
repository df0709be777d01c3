/* nn_embedding.c: y[..., :] = w[idx[...], :] and its backward, dw[idx[r], :] += dy[r, :].
 * Every index is checked before anything is written, so a bad batch fails cleanly and
 * leaves dw untouched. The backward splits the C columns among threads: each thread adds
 * whole columns for every row in order, so repeated indices never race and the sums come
 * out in the same order on every run. */
#include "backend_internal.h"
#include "nn_internal.h"
#include "nn.h"
#include "cuda_internal.h"

/* Stages idx as a contiguous i64/i32 tensor and checks every entry lies in [0, V). */
static int stage_indices(sh_tensor **out, const sh_tensor *idx, int64_t V, const char *op) {
  *out = NULL;
  SH_TRY(sh_tensor_check(idx, op));
  if (idx->device >= 0)
    return sh_fail(SH_ERR_DEVICE, "%s: idx is %s; this build runs it on cpu tensors only", op, sh_desc(idx));
  if (idx->dtype != SH_I64 && idx->dtype != SH_I32)
    return sh_fail(SH_ERR_ARG, "%s: idx must be i64 or i32, got %s", op, sh_desc(idx));
  SH_TRY(sh_tensor_contiguous(out, idx));
  int64_t n = sh_tensor_numel(idx);
  const void *p = sh_tensor_data(*out);
  for (int64_t i = 0; i < n; i++) {
    int64_t ix = idx->dtype == SH_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
    if (ix < 0 || ix >= V) {
      sh_tensor_destroy(*out);
      *out = NULL;
      return sh_fail(SH_ERR_ARG, "%s: index %lld (at flat position %lld of idx %s) is outside [0, %lld) for V = %lld",
                     op, (long long)ix, (long long)i, sh_desc(idx), (long long)V, (long long)V);
    }
  }
  return SH_OK;
}

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

SH_NN_SIMD static void scatter_columns(const void *arg, int64_t c0, int64_t c1) {
  const emb_args *a = arg;
  for (int64_t r = 0; r < a->n; r++) {
    float *dst = a->dw + index_at(a->idx, r) * a->C;
    const float *src = a->dy + r * a->C;
#pragma omp simd
    for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
  }
}

static int check_weight(const sh_tensor *w, const char *op, const char *name) {
  SH_TRY(sh_nn_check_float(w, op, name));
  if (w->ndim != 2) return sh_fail(SH_ERR_ARG, "%s: %s must be [V, C], got %s", op, name, sh_desc(w));
  return SH_OK;
}

int sh_embedding_forward(sh_tensor **y, const sh_tensor *idx, const sh_tensor *w) {
  if (w && w->device >= 0) return sh_cuda_embedding_forward(y, idx, w);
  const char *op = "embedding";
  *y = NULL;
  SH_TRY(check_weight(w, op, "w"));
  SH_TRY(sh_tensor_check(idx, op));
  if (idx->ndim >= 8) return sh_fail(SH_ERR_ARG, "%s: idx %s has too many dims to add C", op, sh_desc(idx));
  int64_t shape[8];
  memcpy(shape, idx->shape, sizeof(int64_t) * idx->ndim);
  shape[idx->ndim] = w->shape[1];
  sh_tensor *ic = NULL, *wc = NULL, *o = NULL;
  int rc = stage_indices(&ic, idx, w->shape[0], op);
  if (!rc) rc = sh_nn_f32(&wc, w, op, "w");
  if (!rc) rc = sh_nn_new_f32(&o, idx->ndim + 1, shape);
  if (!rc) {
    emb_args a = {.idx = ic, .w = sh_nn_ptr(wc), .y = sh_nn_ptr(o), .n = sh_tensor_numel(ic), .C = w->shape[1]};
    sh_nn_parallel_for(a.n, a.n * a.C, gather_rows, &a);
    rc = sh_nn_finish(&o, w->dtype);
  }
  sh_tensor_destroy(ic); sh_tensor_destroy(wc);
  if (rc) sh_tensor_destroy(o);
  else *y = o;
  return rc;
}

int sh_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  if (dw && dw->device >= 0) return sh_cuda_embedding_backward(dw, dy, idx);
  const char *op = "embedding_backward";
  SH_TRY(check_weight(dw, op, "dw"));
  SH_TRY(sh_nn_check_float(dy, op, "dy"));
  SH_TRY(sh_tensor_check(idx, op));
  int64_t shape[8];
  if (idx->ndim >= 8) return sh_fail(SH_ERR_ARG, "%s: idx %s has too many dims to add C", op, sh_desc(idx));
  memcpy(shape, idx->shape, sizeof(int64_t) * idx->ndim);
  shape[idx->ndim] = dw->shape[1];
  SH_TRY(sh_nn_check_shape(dy, op, "dy", idx->ndim + 1, shape));
  sh_tensor *ic = NULL, *dyc = NULL;
  sh_nn_accum acc = {0};
  int rc = stage_indices(&ic, idx, dw->shape[0], op);
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

/* TRANSITION: kernels not yet in the table; replaced when this family is converted. */
void sh_embedding_register_cpu(sh_backend *b) { (void)b; }
