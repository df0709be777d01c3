/* optim.c: AdamW and SGD steps over flat f32 buffers, one pass per buffer, with PyTorch's
 * formulas (torch.optim.AdamW / SGD, single-tensor path) evaluated in f32 in the same order:
 *   AdamW: g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 *          v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD:   g = grad * grad_scale + wd p;  buf = g on the first step, else
 *          momentum buf + (1 - dampening) g;  g = nesterov ? g + momentum buf : buf;  p -= lr g
 * The scalars (bias corrections, step size) are formed in f64 once per call, as PyTorch
 * forms them in Python. The loops are memory-bound; they are split across threads and
 * compiled with an AVX-512 clone (SH_NN_SIMD) rather than written in intrinsics. */
#include <math.h>
#include "nn_internal.h"
#include "optim.h"
#include "cuda_internal.h"

typedef struct opt_args {
  float *p, *m, *v, *buf;
  const float *g32;
  const uint16_t *g16;       /* bf16 grad when g32 is NULL */
  void *shadow;
  int shadow_dtype;
  float scale, decay, b1, omb1, b2, omb2, step_size, bc2_sqrt, eps;
  float lr, wd, momentum, omd;
  int nesterov, first;
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
  const float scale = a->scale, decay = a->decay, b1 = a->b1, omb1 = a->omb1, b2 = a->b2, omb2 = a->omb2;
  const float step_size = a->step_size, bc2_sqrt = a->bc2_sqrt, eps = a->eps;
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
  const float scale = a->scale, wd = a->wd, momentum = a->momentum, omd = a->omd, lr = a->lr;
  const int first = a->first, nesterov = a->nesterov;
  const float *restrict g32 = a->g32;
  const uint16_t *restrict g16 = a->g16;
  if (g32 && buf) { SGD_MOMENTUM_LOOP(g32[i]) }
  else if (buf) { SGD_MOMENTUM_LOOP(sh_nn_bf16_to_f32(g16[i])) }
  else if (g32) { SGD_LOOP(g32[i]) }
  else { SGD_LOOP(sh_nn_bf16_to_f32(g16[i])) }
}

/* t must be a live, contiguous cpu tensor of `dtype` with n elements. */
static int check_flat(const sh_tensor *t, const char *op, const char *name, int dtype, int64_t n) {
  SH_TRY(sh_nn_check_float(t, op, name));
  if (dtype >= 0 && t->dtype != dtype)
    return sh_fail(SH_ERR_ARG, "%s: %s must be %s, got %s", op, name, sh_dtype_name(dtype), sh_desc(t));
  if (!sh_tensor_is_contiguous(t))
    return sh_fail(SH_ERR_ARG, "%s: %s must be contiguous (a flat buffer), got a strided %s", op, name, sh_desc(t));
  if (n >= 0 && sh_tensor_numel(t) != n)
    return sh_fail(SH_ERR_ARG, "%s: %s has %lld elements, param has %lld (%s vs %s)", op, name,
                   (long long)sh_tensor_numel(t), (long long)n, sh_desc(t), "param");
  return SH_OK;
}

static int check_grad(opt_args *a, const sh_tensor *grad, const char *op, int64_t n) {
  SH_TRY(check_flat(grad, op, "grad", -1, n));
  if (grad->dtype == SH_F32) a->g32 = sh_nn_ptr(grad);
  else if (grad->dtype == SH_BF16) a->g16 = sh_tensor_data(grad);
  else return sh_fail(SH_ERR_ARG, "%s: grad must be f32 or bf16, got %s", op, sh_desc(grad));
  return SH_OK;
}

int sh_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                   sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int64_t step, double grad_scale) {
  if (param && param->device >= 0) return sh_cuda_adamw_step_(param, grad, m, v, shadow, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  const char *op = "adamw";
  SH_TRY(check_flat(param, op, "param", SH_F32, -1));
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  SH_TRY(check_grad(&a, grad, op, n));
  SH_TRY(check_flat(m, op, "m", SH_F32, n));
  SH_TRY(check_flat(v, op, "v", SH_F32, n));
  if (shadow) SH_TRY(check_flat(shadow, op, "shadow", -1, n));
  if (step < 1) return sh_fail(SH_ERR_ARG, "%s: step is 1-based, got %lld", op, (long long)step);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
    return sh_fail(SH_ERR_ARG, "%s: betas must be in [0, 1), got (%g, %g)", op, beta1, beta2);
  if (!(lr >= 0 && eps >= 0 && weight_decay >= 0))
    return sh_fail(SH_ERR_ARG, "%s: lr, eps and weight_decay must be >= 0, got %g, %g, %g", op, lr, eps, weight_decay);
  a.p = sh_nn_ptr(param); a.m = sh_nn_ptr(m); a.v = sh_nn_ptr(v);
  a.shadow = shadow ? sh_tensor_data(shadow) : NULL;
  a.shadow_dtype = shadow ? shadow->dtype : SH_F32;
  a.scale = (float)grad_scale;
  a.decay = (float)(1.0 - lr * weight_decay);
  a.b1 = (float)beta1; a.omb1 = (float)(1.0 - beta1);
  a.b2 = (float)beta2; a.omb2 = (float)(1.0 - beta2);
  a.step_size = (float)(lr / (1.0 - pow(beta1, (double)step)));
  a.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step));
  a.eps = (float)eps;
  sh_nn_parallel_for(n, n * 4, adamw_range, &a);
  param->version++; m->version++; v->version++;
  if (shadow) shadow->version++;
  return SH_OK;
}

int sh_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                 double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                 double grad_scale) {
  if (param && param->device >= 0) return sh_cuda_sgd_step_(param, grad, momentum_buf, lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  const char *op = "sgd";
  SH_TRY(check_flat(param, op, "param", SH_F32, -1));
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  SH_TRY(check_grad(&a, grad, op, n));
  if (!(lr >= 0 && momentum >= 0 && weight_decay >= 0))
    return sh_fail(SH_ERR_ARG, "%s: lr, momentum and weight_decay must be >= 0, got %g, %g, %g", op, lr, momentum, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return sh_fail(SH_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening 0, got momentum %g, dampening %g",
                   op, momentum, dampening);
  if (momentum != 0) {
    if (!momentum_buf) return sh_fail(SH_ERR_ARG, "%s: momentum %g needs a momentum_buf, got nil", op, momentum);
    SH_TRY(check_flat(momentum_buf, op, "momentum_buf", SH_F32, n));
    a.buf = sh_nn_ptr(momentum_buf);
  }
  a.p = sh_nn_ptr(param);
  a.scale = (float)grad_scale;
  a.lr = (float)lr; a.wd = (float)weight_decay;
  a.momentum = (float)momentum; a.omd = (float)(1.0 - dampening);
  a.nesterov = nesterov != 0;
  a.first = first_step != 0;
  sh_nn_parallel_for(n, n * 4, sgd_range, &a);
  param->version++;
  if (a.buf) momentum_buf->version++;
  return SH_OK;
}
