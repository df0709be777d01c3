/* optim.c: the fronts of the optimizer steps and the gradient norm and clip (optim.h):
 * every buffer checked, then the kernel of the parameters' device (cpu/optim.c,
 * kernels/optim.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "optim.h"

/* ---- public steps ---------------------------------------------------------------------- */

/* t is a flat float buffer of n elements (n < 0: any) on `device`, of `dtype` (< 0: any float). */
static int check_flat(const sh_tensor *t, const char *op, const char *name, int dtype, int64_t n, int device) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  SH_TRY(sh_tensor_check(t, op));
  if (dtype >= 0 ? t->dtype != dtype : !sh_dtype_is_float(t->dtype))
    return sh_fail(SH_ERR_ARG, "%s: %s must be %s, got %s", op, name, dtype >= 0 ? sh_dtype_name(dtype) : "a float tensor", sh_desc(t));
  if (!sh_tensor_is_contiguous(t))
    return sh_fail(SH_ERR_ARG, "%s: %s must be contiguous (a flat buffer), got a strided %s", op, name, sh_desc(t));
  if (n >= 0 && sh_tensor_numel(t) != n)
    return sh_fail(SH_ERR_ARG, "%s: %s has %lld elements, param has %lld (%s)", op, name,
                   (long long)sh_tensor_numel(t), (long long)n, sh_desc(t));
  return sh_check_on(t, device, op, name);
}

static int check_param_grad(const char *op, const sh_tensor *param, const sh_tensor *grad) {
  SH_TRY(check_flat(param, op, "param", SH_F32, -1, param ? param->device : -1));
  SH_TRY(check_flat(grad, op, "grad", -1, sh_tensor_numel(param), param->device));
  if (grad->dtype != SH_F32 && grad->dtype != SH_BF16)
    return sh_fail(SH_ERR_ARG, "%s: grad must be f32 or bf16, got %s", op, sh_desc(grad));
  return SH_OK;
}

/* param, m, v (f32), grad (f32 or bf16) and shadow (any float): flat, param's numel, on
 * `device`; weight_decay >= 0. */
static int check_adamw_param(const sh_adamw_param *e, int device) {
  const char *op = "adamw";
  SH_TRY(check_flat(e->param, op, "param", SH_F32, -1, device));
  SH_TRY(check_param_grad(op, e->param, e->grad));
  int64_t n = sh_tensor_numel(e->param);
  SH_TRY(check_flat(e->m, op, "m", SH_F32, n, device));
  SH_TRY(check_flat(e->v, op, "v", SH_F32, n, device));
  if (e->shadow) SH_TRY(check_flat(e->shadow, op, "shadow", -1, n, device));
  if (e->clip) SH_TRY(check_flat(e->clip, op, "clip", SH_F32, 1, device));
  if (!(e->weight_decay >= 0)) return sh_fail(SH_ERR_ARG, "%s: weight_decay must be >= 0, got %g", op, e->weight_decay);
  return SH_OK;
}

static int check_adamw_hyper(double lr, double beta1, double beta2, double eps, int64_t step) {
  const char *op = "adamw";
  if (step < 1) return sh_fail(SH_ERR_ARG, "%s: step is 1-based, got %lld", op, (long long)step);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
    return sh_fail(SH_ERR_ARG, "%s: betas must be in [0, 1), got (%g, %g)", op, beta1, beta2);
  if (!(lr >= 0 && eps >= 0))
    return sh_fail(SH_ERR_ARG, "%s: lr and eps must be >= 0, got %g, %g", op, lr, eps);
  return SH_OK;
}

/* param (f32), grad (f32 or bf16) and, with momentum, momentum_buf (f32): flat, param's
 * numel and device; and the hyper-parameters' ranges. */
static int check_sgd(const sh_tensor *param, const sh_tensor *grad, const sh_tensor *momentum_buf, double lr,
                     double momentum, double dampening, double weight_decay, int nesterov) {
  const char *op = "sgd";
  SH_TRY(check_param_grad(op, param, grad));
  if (!(lr >= 0 && momentum >= 0 && weight_decay >= 0))
    return sh_fail(SH_ERR_ARG, "%s: lr, momentum and weight_decay must be >= 0, got %g, %g, %g", op, lr, momentum, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return sh_fail(SH_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening 0, got momentum %g, dampening %g",
                   op, momentum, dampening);
  if (momentum != 0) {
    if (!momentum_buf) return sh_fail(SH_ERR_ARG, "%s: momentum %g needs a momentum_buf, got nil", op, momentum);
    SH_TRY(check_flat(momentum_buf, op, "momentum_buf", SH_F32, sh_tensor_numel(param), param->device));
  }
  return SH_OK;
}

/* rc, with the failure of item i of a group of n prefixed by its position (n > 1). */
static int in_group(int rc, const char *op, const char *item, int i, int n) {
  if (!rc || n == 1) return rc;
  return sh_fail_context("%s: %s %d of %d: ", op, item, i + 1, n);
}

int sh_adamw_step_multi_(int n, const sh_adamw_param *params, double lr, double beta1, double beta2,
                         double eps, int64_t step, double grad_scale) {
  if (n < 0 || (n > 0 && !params))
    return sh_fail(SH_ERR_ARG, "adamw: needs an array of n >= 0 parameters, got n = %d%s", n, params ? "" : " and NULL");
  if (n == 0) return SH_OK;
  int device = params[0].param ? params[0].param->device : -1;
  for (int i = 0; i < n; i++) SH_TRY(in_group(check_adamw_param(&params[i], device), "adamw", "parameter", i, n));
  SH_TRY(check_adamw_hyper(lr, beta1, beta2, eps, step));
  SH_TRY(SH_KERNEL("adamw", device, adamw_step_multi_, n, params, lr, beta1, beta2, eps, step, grad_scale));
  for (int i = 0; i < n; i++) {
    params[i].param->version++; params[i].m->version++; params[i].v->version++;
    if (params[i].shadow) params[i].shadow->version++;
  }
  return SH_OK;
}

int sh_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                   sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int64_t step, double grad_scale) {
  sh_adamw_param one = {param, grad, m, v, shadow, weight_decay, NULL};
  return sh_adamw_step_multi_(1, &one, lr, beta1, beta2, eps, step, grad_scale);
}

int sh_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                 double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                 double grad_scale) {
  SH_TRY(check_sgd(param, grad, momentum_buf, lr, momentum, dampening, weight_decay, nesterov));
  SH_TRY(SH_KERNEL("sgd", param->device, sgd_step_, param, grad, momentum_buf, lr, momentum, dampening,
                   weight_decay, nesterov, first_step, grad_scale));
  param->version++;
  if (momentum != 0) momentum_buf->version++;
  return SH_OK;
}

/* The kind of norm_type (2, 1 or inf). */
static int norm_kind(const char *op, double norm_type, int *kind) {
  *kind = norm_type == 2 ? SH_NORM_L2 : norm_type == 1 ? SH_NORM_L1 : norm_type == INFINITY ? SH_NORM_MAX : -1;
  if (*kind < 0) return sh_fail(SH_ERR_ARG, "%s: norm_type must be 2, 1 or inf, got %g", op, norm_type);
  return SH_OK;
}

/* t holds one element of dtype on device. */
static int check_scalar(const sh_tensor *t, const char *op, const char *name, int dtype, int device) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  SH_TRY(sh_tensor_check(t, op));
  if (t->dtype != dtype || sh_tensor_numel(t) != 1)
    return sh_fail(SH_ERR_ARG, "%s: %s must hold one %s, got %s", op, name, sh_dtype_name(dtype), sh_desc(t));
  return sh_check_on(t, device, op, name);
}

int sh_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *grads, const double *weights,
                      double norm_type) {
  const char *op = "grad_norm";
  if (n < 0 || (n > 0 && !grads))
    return sh_fail(SH_ERR_ARG, "%s: needs an array of n >= 0 tensors, got n = %d%s", op, n, grads ? "" : " and NULL");
  int kind;
  SH_TRY(norm_kind(op, norm_type, &kind));
  SH_TRY(check_scalar(out, op, "out", SH_F64, out ? out->device : -1));
  for (int i = 0; i < n; i++) SH_TRY(in_group(sh_nn_check_float_on(grads[i], out->device, op, "grad"), op, "tensor", i, n));
  SH_TRY(SH_KERNEL(op, out->device, grad_norm_part, out, n, grads, weights, kind));
  out->version++;
  return SH_OK;
}

int sh_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, double norm_type, double max_norm) {
  const char *op = "grad_clip_coef";
  int kind;
  SH_TRY(norm_kind(op, norm_type, &kind));
  SH_TRY(check_scalar(part, op, "part", SH_F64, part ? part->device : -1));
  SH_TRY(check_scalar(norm, op, "norm", SH_F64, part->device));
  SH_TRY(check_scalar(coef, op, "coef", SH_F32, part->device));
  if (!(max_norm >= 0)) return sh_fail(SH_ERR_ARG, "%s: max_norm must be >= 0, got %g", op, max_norm);
  SH_TRY(SH_KERNEL(op, part->device, grad_clip_coef, coef, norm, part, kind, max_norm));
  coef->version++;
  norm->version++;
  return SH_OK;
}
