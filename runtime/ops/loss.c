/* loss.c: the fronts of cross-entropy (nn.h): logits and targets checked, the loss and the
 * log-sum-exp planned on the logits' device, then that device's kernel (cpu/loss.c,
 * kernels/loss.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"

/* ---- the fronts: checks and output planning for every device ------------------------------ */

/* Every target of a cpu tensor that is not ignored lies in [0, V). */
static int check_targets(const char *op, const sh_tensor *targets, int64_t V, int64_t ignore) {
  sh_tensor *tc = NULL;
  SH_TRY(sh_tensor_contiguous(&tc, targets));
  int64_t n = sh_tensor_numel(tc), r = 0, t = 0;
  for (; r < n; r++)
    if ((t = sh_index_at(tc, r)) != ignore && (t < 0 || t >= V)) break;
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
