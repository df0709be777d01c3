/* loss.c: cross-entropy of logits [..., V] against integer targets [...], fused with
 * the log-softmax so the probabilities are never stored: forward keeps only the row
 * log-sum-exp lse (f32, targets' shape), and backward rebuilds softmax = exp(x - lse) while
 * writing dlogits = (softmax - onehot(target)) * dloss / count.
 *
 * The loss is the mean over the rows whose target is not ignore_index. When every target
 * is ignored (count = 0) the loss is defined here as 0 and the gradient as all zeros;
 * PyTorch returns NaN (0/0) there, but a micro-batch that happens to be fully masked should
 * add nothing to the accumulated gradients rather than poison them with NaN.
 * Row losses are summed in f64 in row order, so the loss does not depend on threads.
 * The fronts are ops/loss.c. */
#include <math.h>
#include <stdlib.h>
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

typedef struct ce_args {
  const float *x;
  const void *t;       /* targets, contiguous i64 or i32 */
  int t64;
  int64_t V, ignore;
  float *lse, *dx;
  double *row_loss;
  float g;             /* dloss / count */
} ce_args;

static inline int64_t target_at(const ce_args *a, int64_t r) {
  return a->t64 ? ((const int64_t *)a->t)[r] : ((const int32_t *)a->t)[r];
}

SH_CPU_KERNEL(ce_fwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
  const ce_args *a = arg;
  int64_t V = a->V;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * V;
    float m = -INFINITY, s = 0.0f;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; j++) s += sh_expf(x[j] - m);
    float lse = m + logf(s);
    a->lse[r] = lse;
    int64_t t = target_at(a, r);
    a->row_loss[r] = t == a->ignore ? 0.0 : (double)lse - (double)x[t];
  }
}

SH_CPU_KERNEL(ce_bwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
  const ce_args *a = arg;
  int64_t V = a->V;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * V;
    float *dx = a->dx + r * V;
    int64_t t = target_at(a, r);
    if (t == a->ignore) {
      memset(dx, 0, (size_t)V * sizeof(float));
      continue;
    }
    float lse = a->lse[r], g = a->g;
#pragma omp simd
    for (int64_t j = 0; j < V; j++) dx[j] = sh_expf(x[j] - lse) * g;
    dx[t] -= g;
  }
}

/* Stages logits (f32) and targets (contiguous) into a and counts the rows not ignored. */
static int stage_ce(sh_tensor **xc, sh_tensor **tc, ce_args *a, int64_t *count, const char *op,
                    const sh_tensor *logits, const sh_tensor *targets, int64_t ignore) {
  a->V = logits->shape[logits->ndim - 1];
  a->ignore = ignore;
  a->t64 = targets->dtype == SH_I64;
  SH_TRY(sh_kernel_contiguous_as(tc, targets, (targets)->dtype));
  a->t = sh_tensor_data(*tc);
  int64_t n = sh_tensor_numel(targets);
  *count = 0;
  for (int64_t r = 0; r < n; r++) *count += target_at(a, r) != ignore;
  SH_TRY(sh_stage_f32(xc, logits, op, "logits"));
  a->x = sh_stage_ptr(*xc);
  return SH_OK;
}

/* loss and lse are the front's f32 outputs (0-dim and targets' shape): written in place. */
int sh_kcpu_cross_entropy_forward(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,
                                  const sh_tensor *targets, int64_t ignore_index) {
  const char *op = "cross_entropy";
  sh_tensor *xc = NULL, *tc = NULL;
  ce_args a = {0};
  int64_t count = 0, n = sh_tensor_numel(targets);
  int rc = stage_ce(&xc, &tc, &a, &count, op, logits, targets, ignore_index);
  if (!rc && !(a.row_loss = malloc(sizeof(double) * (size_t)(n + 1))))
    rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for %lld row losses", op, (long long)n);
  if (!rc) {
    a.lse = sh_stage_ptr(lse);
    sh_stage_parallel_for(n, n * a.V * 4, ce_fwd, &a);
    double sum = 0.0;
    for (int64_t r = 0; r < n; r++) sum += a.row_loss[r];
    *sh_stage_ptr(loss) = count ? (float)(sum / (double)count) : 0.0f;
  }
  free(a.row_loss);
  sh_tensor_destroy(xc); sh_tensor_destroy(tc);
  return rc;
}

/* dlogits may be logits itself (sh_cross_entropy_backward_): ce_bwd writes each element after reading it. */
int sh_kcpu_cross_entropy_backward(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                   const sh_tensor *lse, double dloss, int64_t ignore_index) {
  const char *op = "cross_entropy_backward";
  sh_tensor *xc = NULL, *tc = NULL, *lc = NULL;
  sh_stage_accum dx = {0};
  ce_args a = {0};
  int64_t count = 0;
  int rc = stage_ce(&xc, &tc, &a, &count, op, logits, targets, ignore_index);
  if (!rc) rc = sh_stage_f32(&lc, lse, op, "lse");
  if (!rc) rc = sh_stage_out_begin(&dx, dlogits);
  if (!rc) {
    int64_t n = sh_tensor_numel(targets);
    a.lse = sh_stage_ptr(lc);
    a.dx = sh_stage_ptr(dx.buf);
    a.g = count ? (float)(dloss / (double)count) : 0.0f;
    sh_stage_parallel_for(n, n * a.V * 4, ce_bwd, &a);
    rc = sh_stage_accum_end(&dx);
  }
  sh_stage_accum_drop(&dx);
  sh_tensor_destroy(xc); sh_tensor_destroy(tc); sh_tensor_destroy(lc);
  return rc;
}
