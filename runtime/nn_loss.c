/* nn_loss.c: cross-entropy of logits [..., V] against integer targets [...], fused with
 * the log-softmax so the probabilities are never stored: forward keeps only the row
 * log-sum-exp lse (f32, targets' shape), and backward rebuilds softmax = exp(x - lse) while
 * writing dlogits = (softmax - onehot(target)) * dloss / count.
 *
 * The loss is the mean over the rows whose target is not ignore_index. When every target
 * is ignored (count = 0) the loss is defined here as 0 and the gradient as all zeros;
 * PyTorch returns NaN (0/0) there, but a micro-batch that happens to be fully masked should
 * add nothing to the accumulated gradients rather than poison them with NaN.
 * Row losses are summed in f64 in row order, so the loss does not depend on threads. */
#include <math.h>
#include <stdlib.h>
#include "backend_internal.h"
#include "nn_internal.h"
#include "nn.h"

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
  SH_TRY(sh_tensor_contiguous(tc, targets));
  a->t = sh_tensor_data(*tc);
  int64_t n = sh_tensor_numel(targets);
  *count = 0;
  for (int64_t r = 0; r < n; r++) *count += target_at(a, r) != ignore;
  SH_TRY(sh_nn_f32(xc, logits, op, "logits"));
  a->x = sh_nn_ptr(*xc);
  return SH_OK;
}

/* loss and lse are the front's f32 outputs (0-dim and targets' shape): written in place. */
static int cpu_cross_entropy_forward(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,
                                     const sh_tensor *targets, int64_t ignore_index) {
  const char *op = "cross_entropy";
  sh_tensor *xc = NULL, *tc = NULL;
  ce_args a = {0};
  int64_t count = 0, n = sh_tensor_numel(targets);
  int rc = stage_ce(&xc, &tc, &a, &count, op, logits, targets, ignore_index);
  if (!rc && !(a.row_loss = malloc(sizeof(double) * (size_t)(n + 1))))
    rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for %lld row losses", op, (long long)n);
  if (!rc) {
    a.lse = sh_nn_ptr(lse);
    sh_nn_parallel_for(n, n * a.V * 4, ce_fwd, &a);
    double sum = 0.0;
    for (int64_t r = 0; r < n; r++) sum += a.row_loss[r];
    *sh_nn_ptr(loss) = count ? (float)(sum / (double)count) : 0.0f;
  }
  free(a.row_loss);
  sh_tensor_destroy(xc); sh_tensor_destroy(tc);
  return rc;
}

/* dlogits may be logits itself (sh_cross_entropy_backward_): ce_bwd writes each element after reading it. */
static int cpu_cross_entropy_backward(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                      const sh_tensor *lse, double dloss, int64_t ignore_index) {
  const char *op = "cross_entropy_backward";
  sh_tensor *xc = NULL, *tc = NULL, *lc = NULL;
  sh_nn_accum dx = {0};
  ce_args a = {0};
  int64_t count = 0;
  int rc = stage_ce(&xc, &tc, &a, &count, op, logits, targets, ignore_index);
  if (!rc) rc = sh_nn_f32(&lc, lse, op, "lse");
  if (!rc) rc = sh_nn_out_begin(&dx, dlogits);
  if (!rc) {
    int64_t n = sh_tensor_numel(targets);
    a.lse = sh_nn_ptr(lc);
    a.dx = sh_nn_ptr(dx.buf);
    a.g = count ? (float)(dloss / (double)count) : 0.0f;
    sh_nn_parallel_for(n, n * a.V * 4, ce_bwd, &a);
    rc = sh_nn_accum_end(&dx);
  }
  sh_nn_accum_drop(&dx);
  sh_tensor_destroy(xc); sh_tensor_destroy(tc); sh_tensor_destroy(lc);
  return rc;
}

/* ---- the fronts: checks and output planning for every device ------------------------------ */

/* Every target of a cpu tensor that is not ignored lies in [0, V). */
static int check_targets(const char *op, const sh_tensor *targets, int64_t V, int64_t ignore) {
  sh_tensor *tc = NULL;
  SH_TRY(sh_tensor_contiguous(&tc, targets));
  ce_args a = {.t = sh_tensor_data(tc), .t64 = targets->dtype == SH_I64};
  int64_t n = sh_tensor_numel(tc), r = 0, t = 0;
  for (; r < n; r++)
    if ((t = target_at(&a, r)) != ignore && (t < 0 || t >= V)) break;
  sh_tensor_destroy(tc);
  if (r == n) return SH_OK;
  return sh_fail(SH_ERR_ARG, "%s: target %lld (row %lld) is outside [0, %lld) for V = %lld and is not ignore_index %lld",
                 op, (long long)t, (long long)r, (long long)V, (long long)V, (long long)ignore);
}

/* Checks logits [..., V] and targets [...] (i64 or i32, on logits' device). A cuda target
 * cannot be read here without a host sync: one outside [0, V) makes its row loss NaN there. */
static int check_ce(const char *op, const sh_tensor *logits, const sh_tensor *targets, int64_t ignore) {
  SH_TRY(sh_nn_check_float(logits, op, "logits"));
  SH_TRY(sh_tensor_check(targets, op));
  if (logits->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: logits must be [N, V], got %s", op, sh_desc(logits));
  if (targets->dtype != SH_I64 && targets->dtype != SH_I32)
    return sh_fail(SH_ERR_ARG, "%s: targets must be i64 or i32, got %s", op, sh_desc(targets));
  SH_TRY(sh_check_on(targets, logits->device, op, "targets"));
  int ok = targets->ndim == logits->ndim - 1;
  for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == logits->shape[d];
  if (!ok)
    return sh_fail(SH_ERR_ARG, "%s: targets must have the shape of logits without its last dim; got logits %s and targets %s",
                   op, sh_desc(logits), sh_desc(targets));
  int64_t V = logits->shape[logits->ndim - 1];
  if (logits->device == -1) SH_TRY(check_targets(op, targets, V, ignore));
  if (V == 0 && sh_tensor_numel(targets) > 0)
    return sh_fail(SH_ERR_ARG, "%s: logits %s has no classes", op, sh_desc(logits));
  return SH_OK;
}

int sh_cross_entropy_forward(sh_tensor **loss, sh_tensor **lse, const sh_tensor *logits,
                             const sh_tensor *targets, int64_t ignore_index) {
  const char *op = "cross_entropy";
  *loss = NULL;
  *lse = NULL;
  SH_TRY(check_ce(op, logits, targets, ignore_index));
  int dev = logits->device;
  sh_tensor *lo = NULL, *lseo = NULL;
  int rc = sh_tensor_empty(&lo, 0, targets->shape, SH_F32, dev);   /* 0-dim: the shape is not read */
  if (!rc) rc = sh_tensor_empty(&lseo, targets->ndim, targets->shape, SH_F32, dev);
  if (!rc) rc = SH_KERNEL(op, dev, cross_entropy_forward, lo, lseo, logits, targets, ignore_index);
  if (rc) { sh_tensor_destroy(lo); sh_tensor_destroy(lseo); return rc; }
  *loss = lo;
  *lse = lseo;
  return SH_OK;
}

int sh_cross_entropy_backward(sh_tensor **dlogits, const sh_tensor *logits, const sh_tensor *targets,
                              const sh_tensor *lse, double dloss, int64_t ignore_index) {
  const char *op = "cross_entropy_backward";
  *dlogits = NULL;
  SH_TRY(check_ce(op, logits, targets, ignore_index));
  SH_TRY(sh_nn_check_float_on(lse, logits->device, op, "lse"));
  SH_TRY(sh_nn_check_shape(lse, op, "lse", targets->ndim, targets->shape));
  sh_tensor *dx = NULL;
  int rc = sh_tensor_empty(&dx, logits->ndim, logits->shape, logits->dtype, logits->device);
  if (!rc) rc = SH_KERNEL(op, logits->device, cross_entropy_backward, dx, logits, targets, lse, dloss, ignore_index);
  if (rc) sh_tensor_destroy(dx);
  else *dlogits = dx;
  return rc;
}

/* Both kernels take dlogits == logits: each row's gradient is written where it was read. */
int sh_cross_entropy_backward_(sh_tensor *logits, const sh_tensor *targets, const sh_tensor *lse, double dloss,
                               int64_t ignore_index) {
  const char *op = "cross_entropy_backward_";
  SH_TRY(check_ce(op, logits, targets, ignore_index));
  SH_TRY(sh_nn_check_float_on(lse, logits->device, op, "lse"));
  SH_TRY(sh_nn_check_shape(lse, op, "lse", targets->ndim, targets->shape));
  if (!sh_tensor_is_contiguous(logits))
    return sh_fail(SH_ERR_ARG, "%s: logits must be contiguous to take the gradient in place, got %s", op, sh_desc(logits));
  SH_TRY(SH_KERNEL(op, logits->device, cross_entropy_backward, logits, logits, targets, lse, dloss, ignore_index));
  logits->version++;
  return SH_OK;
}

void sh_loss_register_cpu(sh_backend *b) {
  b->cross_entropy_forward = cpu_cross_entropy_forward;
  b->cross_entropy_backward = cpu_cross_entropy_backward;
}
