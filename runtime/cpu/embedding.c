/* embedding.c: y[..., :] = w[idx[...], :] and its backward, dw[idx[r], :] += dy[r, :].
 * Every cpu index is checked (by the front) before anything is written, so a bad batch
 * fails cleanly and leaves dw untouched. The backward splits the C columns among threads: each thread adds
 * whole columns for every row in order, so repeated indices never race and the sums come
 * out in the same order on every run.
 * The front is ops/embedding.c. */
#include "core/backend_internal.h"
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "backend_cpu_internal.h"

typedef struct emb_args {
  const sh_tensor *idx;
  const float *w, *dy;
  float *y, *dw;
  int64_t n, C;
} emb_args;

static void gather_rows(const void *arg, int64_t r0, int64_t r1) {
  const emb_args *a = arg;
  for (int64_t r = r0; r < r1; r++)
    memcpy(a->y + r * a->C, a->w + sh_index_at(a->idx, r) * a->C, (size_t)a->C * sizeof(float));
}

SH_CPU_KERNEL(scatter_columns, (const void *arg, int64_t c0, int64_t c1), (arg, c0, c1)) {
  const emb_args *a = arg;
  for (int64_t r = 0; r < a->n; r++) {
    float *dst = a->dw + sh_index_at(a->idx, r) * a->C;
    const float *src = a->dy + r * a->C;
#pragma omp simd
    for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
  }
}

int sh_kcpu_embedding_forward(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w) {
  const char *op = "embedding";
  sh_tensor *ic = NULL, *wc = NULL;
  sh_stage_accum o = {0};
  int rc = sh_kernel_contiguous_as(&ic, idx, (idx)->dtype);
  if (!rc) rc = sh_stage_f32(&wc, w, op, "w");
  if (!rc) rc = sh_stage_out_begin(&o, y);
  if (!rc) {
    emb_args a = {.idx = ic, .w = sh_stage_ptr(wc), .y = sh_stage_ptr(o.buf), .n = sh_tensor_numel(ic), .C = w->shape[1]};
    sh_stage_parallel_for(a.n, a.n * a.C, gather_rows, &a);
    rc = sh_stage_accum_end(&o);
  }
  sh_stage_accum_drop(&o);
  sh_tensor_destroy(ic); sh_tensor_destroy(wc);
  return rc;
}

int sh_kcpu_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  const char *op = "embedding_backward";
  sh_tensor *ic = NULL, *dyc = NULL;
  sh_stage_accum acc = {0};
  int rc = sh_kernel_contiguous_as(&ic, idx, (idx)->dtype);
  if (!rc) rc = sh_stage_f32(&dyc, dy, op, "dy");
  if (!rc) rc = sh_stage_accum_begin(&acc, dw, op, "dw");
  if (!rc) {
    emb_args a = {.idx = ic, .dy = sh_stage_ptr(dyc), .dw = sh_stage_ptr(acc.buf), .n = sh_tensor_numel(ic), .C = dw->shape[1]};
    /* at least 16 columns per thread: narrower slices would share cache lines */
    int64_t work = a.C >= 32 ? a.n * a.C : 0;
    sh_stage_parallel_for(a.C, work, scatter_columns, &a);
    rc = sh_stage_accum_end(&acc);
  }
  sh_stage_accum_drop(&acc);
  sh_tensor_destroy(ic); sh_tensor_destroy(dyc);
  return rc;
}
