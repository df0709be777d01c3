/* optim.c: AdamW and SGD steps over flat f32 buffers, one pass per buffer, with PyTorch's
 * formulas (torch.optim.AdamW / SGD, single-tensor path) evaluated in f32 in the same order:
 *   AdamW: g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 *          v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD:   g = grad * grad_scale + wd p;  buf = g on the first step, else
 *          momentum buf + (1 - dampening) g;  g = nesterov ? g + momentum buf : buf;  p -= lr g
 * The scalars (bias corrections, step size) are formed in f64 once per call, as PyTorch
 * forms them in Python. The loops are memory-bound; they are split across threads and
 * compiled with an AVX-512 clone (SH_NN_SIMD) rather than written in intrinsics.
 * The public steps at the end check every buffer and hyper-parameter, dispatch to the
 * param's device (backend_internal.h) and bump the versions of what the kernel updated. */
#include <math.h>
#include "backend_internal.h"
#include "nn_internal.h"
#include "optim.h"
#include "optim_internal.h"

typedef struct opt_args {
  float *p, *m, *v, *buf;
  const float *g32;
  const uint16_t *g16;       /* bf16 grad when g32 is NULL */
  void *shadow;
  int shadow_dtype;
  sh_adamw_hyper h;          /* AdamW's constants */
  sh_sgd_hyper s;            /* SGD's */
} opt_args;

static void write_shadow(const opt_args *a, int64_t i0, int64_t i1) {
  if (!a->shadow) return;
  if (a->shadow_dtype == SH_BF16) {
    uint16_t *s = a->shadow;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) s[i] = sh_nn_f32_to_bf16(a->p[i]);
  } else if (a->shadow_dtype == SH_F32) {
    memcpy((float *)a->shadow + i0, a->p + i0, (size_t)(i1 - i0) * sizeof(float));
  } else {
    for (int64_t i = i0; i < i1; i++) sh_store(a->shadow, a->shadow_dtype, i, a->p[i]);
  }
}

/* The loop bodies are macros over the grad's load so that the f32 and bf16 loops are both
 * straight vector code; every scalar is a local so that the stores through p, m, v (floats)
 * cannot be taken to modify it. The Makefile builds
 * this file with -fno-math-errno: a sqrtf that may set errno does not vectorize. */
#define ADAMW_LOOP(LOAD) \
  _Pragma("omp simd") \
  for (int64_t i = i0; i < i1; i++) { \
    float g = (LOAD) * scale; \
    float mi = m[i] * b1 + g * omb1, vi = v[i] * b2 + g * g * omb2; \
    m[i] = mi; \
    v[i] = vi; \
    p[i] = p[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps)); \
  }

SH_NN_SIMD static void adamw_range(const void *arg, int64_t i0, int64_t i1) {
  const opt_args *a = arg;
  float *restrict p = a->p, *restrict m = a->m, *restrict v = a->v;
  const float scale = a->h.scale, decay = a->h.decay, b1 = a->h.b1, omb1 = a->h.omb1, b2 = a->h.b2, omb2 = a->h.omb2;
  const float step_size = a->h.step_size, bc2_sqrt = a->h.bc2_sqrt, eps = a->h.eps;
  if (a->g32) {
    const float *restrict g32 = a->g32;
    ADAMW_LOOP(g32[i])
  } else {
    const uint16_t *restrict g16 = a->g16;
    ADAMW_LOOP(sh_nn_bf16_to_f32(g16[i]))
  }
  write_shadow(a, i0, i1);
}

/* SGD without momentum, and with it (first step: buf = g) */
#define SGD_LOOP(LOAD) \
  _Pragma("omp simd") \
  for (int64_t i = i0; i < i1; i++) p[i] -= lr * ((LOAD) * scale + wd * p[i]);
#define SGD_MOMENTUM_LOOP(LOAD) \
  _Pragma("omp simd") \
  for (int64_t i = i0; i < i1; i++) { \
    float g = (LOAD) * scale + wd * p[i]; \
    float b = first ? g : buf[i] * momentum + g * omd; \
    buf[i] = b; \
    p[i] -= lr * (nesterov ? g + momentum * b : b); \
  }

SH_NN_SIMD static void sgd_range(const void *arg, int64_t i0, int64_t i1) {
  const opt_args *a = arg;
  float *restrict p = a->p, *restrict buf = a->buf;
  const float scale = a->s.scale, wd = a->s.wd, momentum = a->s.momentum, omd = a->s.omd, lr = a->s.lr;
  const int first = a->s.first, nesterov = a->s.nesterov;
  const float *restrict g32 = a->g32;
  const uint16_t *restrict g16 = a->g16;
  if (g32 && buf) { SGD_MOMENTUM_LOOP(g32[i]) }
  else if (buf) { SGD_MOMENTUM_LOOP(sh_nn_bf16_to_f32(g16[i])) }
  else if (g32) { SGD_LOOP(g32[i]) }
  else { SGD_LOOP(sh_nn_bf16_to_f32(g16[i])) }
}

sh_adamw_hyper sh_adamw_hyper_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                                 int64_t step, double grad_scale) {
  return (sh_adamw_hyper){
    .scale = (float)grad_scale,
    .decay = (float)(1.0 - lr * weight_decay),
    .b1 = (float)beta1, .omb1 = (float)(1.0 - beta1),
    .b2 = (float)beta2, .omb2 = (float)(1.0 - beta2),
    .step_size = (float)(lr / (1.0 - pow(beta1, (double)step))),
    .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step)),
    .eps = (float)eps,
  };
}

sh_sgd_hyper sh_sgd_hyper_of(double lr, double momentum, double dampening, double weight_decay, int nesterov,
                             int first_step, double grad_scale) {
  return (sh_sgd_hyper){
    .scale = (float)grad_scale,
    .lr = (float)lr, .wd = (float)weight_decay,
    .momentum = (float)momentum, .omd = (float)(1.0 - dampening),
    .nesterov = nesterov != 0,
    .first = first_step != 0,
    .has_buf = momentum != 0,
  };
}

/* ---- CPU kernels ---------------------------------------------------------------------- */

/* The grad's pointer: f32, or bf16 (the only other dtype the fronts let through). */
static void set_grad(opt_args *a, const sh_tensor *grad) {
  if (grad->dtype == SH_F32) a->g32 = sh_nn_ptr(grad);
  else a->g16 = sh_tensor_data(grad);
}

static int cpu_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                           sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                           double weight_decay, int64_t step, double grad_scale) {
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  set_grad(&a, grad);
  a.p = sh_nn_ptr(param); a.m = sh_nn_ptr(m); a.v = sh_nn_ptr(v);
  a.shadow = shadow ? sh_tensor_data(shadow) : NULL;
  a.shadow_dtype = shadow ? shadow->dtype : SH_F32;
  a.h = sh_adamw_hyper_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  sh_nn_parallel_for(n, n * 4, adamw_range, &a);
  return SH_OK;
}

static int cpu_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                         double momentum, double dampening, double weight_decay, int nesterov,
                         int first_step, double grad_scale) {
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  set_grad(&a, grad);
  a.p = sh_nn_ptr(param);
  a.s = sh_sgd_hyper_of(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  a.buf = a.s.has_buf ? sh_nn_ptr(momentum_buf) : NULL;
  sh_nn_parallel_for(n, n * 4, sgd_range, &a);
  return SH_OK;
}

void sh_optim_register_cpu(sh_backend *b) {
  b->adamw_step_ = cpu_adamw_step_;
  b->sgd_step_ = cpu_sgd_step_;
}

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

/* param, m, v (f32), grad (f32 or bf16) and shadow (any float): flat, param's numel, param's
 * device; and the hyper-parameters' ranges. */
static int check_adamw(const sh_tensor *param, const sh_tensor *grad, const sh_tensor *m, const sh_tensor *v,
                       const sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step) {
  const char *op = "adamw";
  SH_TRY(check_param_grad(op, param, grad));
  int64_t n = sh_tensor_numel(param);
  SH_TRY(check_flat(m, op, "m", SH_F32, n, param->device));
  SH_TRY(check_flat(v, op, "v", SH_F32, n, param->device));
  if (shadow) SH_TRY(check_flat(shadow, op, "shadow", -1, n, param->device));
  if (step < 1) return sh_fail(SH_ERR_ARG, "%s: step is 1-based, got %lld", op, (long long)step);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
    return sh_fail(SH_ERR_ARG, "%s: betas must be in [0, 1), got (%g, %g)", op, beta1, beta2);
  if (!(lr >= 0 && eps >= 0 && weight_decay >= 0))
    return sh_fail(SH_ERR_ARG, "%s: lr, eps and weight_decay must be >= 0, got %g, %g, %g", op, lr, eps, weight_decay);
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

int sh_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                   sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int64_t step, double grad_scale) {
  SH_TRY(check_adamw(param, grad, m, v, shadow, lr, beta1, beta2, eps, weight_decay, step));
  SH_TRY(SH_KERNEL("adamw", param->device, adamw_step_, param, grad, m, v, shadow, lr, beta1, beta2, eps,
                   weight_decay, step, grad_scale));
  param->version++; m->version++; v->version++;
  if (shadow) shadow->version++;
  return SH_OK;
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
