/* optim.c: AdamW and SGD steps over flat f32 buffers, one pass per buffer, with PyTorch's
 * formulas (torch.optim.AdamW / SGD, single-tensor path) evaluated in f32 in the same order:
 *   AdamW: g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 *          v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD:   g = grad * grad_scale + wd p;  buf = g on the first step, else
 *          momentum buf + (1 - dampening) g;  g = nesterov ? g + momentum buf : buf;  p -= lr g
 * The scalars (bias corrections, step size) are formed in f64 once per call, as PyTorch
 * forms them in Python. The loops are memory-bound, so each is one pass: AdamW reads param,
 * grad, m and v once and writes param, m, v and the shadow once.
 * On the CPU the threads take blocks of the step as they finish (optim_parallel). AdamW runs
 * over a group of parameters per call: on the CPU one parallel region over all of them, each
 * thread running the AVX-512 loop (optim_cpu_avx512.c) where the CPU has it and the portable
 * loop below for the rest; on CUDA one launch per up to 16. SGD's loop is built once per CPU kernel
 * set (SH_CPU_KERNEL) rather than written in intrinsics. The gradient-norm part sums a list of tensors into one number on
 * their device, so a clip reads back one number however many tensors there are.
 * The public fronts at the end check every buffer and hyper-parameter, dispatch to the
 * params' device (backend_internal.h) and bump the versions of what the kernel updated. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "backend_internal.h"
#include "nn_internal.h"
#include "ops.h"
#include "ops_internal.h"
#include "optim.h"
#include "optim_internal.h"
#include "parallel.h"

/* The SGD kernel's arguments. */
typedef struct opt_args {
  float *p, *buf;
  const float *g32;
  const uint16_t *g16;       /* bf16 grad when g32 is NULL */
  sh_sgd_hyper s;
} opt_args;

/* The portable AdamW loop over [i0, i1) of one parameter, the shadow written in the same pass.
 * It is a macro over the grad's load and the shadow's store so that each pair is straight
 * vector code; every scalar is a local so that the stores through p, m, v (floats) cannot be
 * taken to modify it. The Makefile builds this file with -fno-math-errno (a sqrtf that may set
 * errno does not vectorize) and -ffp-contract=off (no FMA: the AVX-512 loop's bits). */
#define ADAMW_LOOP(LOAD, STORE) \
  _Pragma("omp simd") \
  for (int64_t i = i0; i < i1; i++) { \
    float g = (LOAD) * scale; \
    float mi = m[i] * b1 + g * omb1, vi = v[i] * b2 + g * g * omb2; \
    float pi = p[i] * decay - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps)); \
    m[i] = mi; \
    v[i] = vi; \
    p[i] = pi; \
    STORE; \
  }
#define ADAMW_GRADS(STORE) \
  if (g32) { ADAMW_LOOP(g32[i], STORE) } \
  else { ADAMW_LOOP(sh_bf16_to_f32_inline(g16[i]), STORE) }

static void adamw_portable(const sh_adamw_buf *b, int64_t i0, int64_t i1) {
  float *restrict p = b->p, *restrict m = b->m, *restrict v = b->v;
  const float *restrict g32 = b->g32;
  const uint16_t *restrict g16 = b->g16;
  const float scale = b->h.scale, decay = b->h.decay, b1 = b->h.b1, omb1 = b->h.omb1, b2 = b->h.b2, omb2 = b->h.omb2;
  const float step_size = b->h.step_size, bc2_sqrt = b->h.bc2_sqrt, eps = b->h.eps;
  void *shadow = b->shadow;
  const int sdt = b->shadow_dtype;
  if (!shadow) { ADAMW_GRADS((void)0) }
  else if (sdt == SH_BF16) { uint16_t *restrict s = shadow; ADAMW_GRADS(s[i] = sh_f32_to_bf16_inline(pi)) }
  else if (sdt == SH_F32) { float *restrict s = shadow; ADAMW_GRADS(s[i] = pi) }
  else { ADAMW_GRADS(sh_store(shadow, sdt, i, pi)) }
}

/* [i0, i1) of one parameter: the AVX-512 loop's whole vectors where the CPU has it, the rest
 * portably. */
static void adamw_range(const sh_adamw_buf *b, int64_t i0, int64_t i1) {
#if SH_OPTIM_HAVE_AVX512
  if (sh_optim_avx512()) i0 = sh_adamw_avx512(b, i0, i1);
#endif
  adamw_portable(b, i0, i1);
}

/* Calls fn(arg, e0, e1) over [0, total) in blocks of OPTIM_BLOCK elements (whole vectors and
 * cache lines) that the threads take in turn as they finish: dynamic scheduling, so that on a
 * shared machine a thread that loses its core delays only the blocks it holds, not a fixed
 * share of the step. Every element is updated on its own, so the bits do not depend on the
 * split. One thread when the step is too small to wake the team (SH_NN_PAR_MIN). */
enum { OPTIM_BLOCK = 1 << 16 };
typedef struct optim_blocks {
  int64_t total;
  sh_nn_range_fn fn;
  const void *arg;
  _Atomic int64_t next;   /* the next block nobody took */
} optim_blocks;

static void optim_task(void *arg, int t, int nt) {
  optim_blocks *j = arg;
  for (int64_t b; (b = atomic_fetch_add(&j->next, 1)) * OPTIM_BLOCK < j->total;) {
    int64_t e1 = (b + 1) * OPTIM_BLOCK;
    j->fn(j->arg, b * OPTIM_BLOCK, e1 < j->total ? e1 : j->total);
  }
}

static void optim_parallel(int64_t total, sh_nn_range_fn fn, const void *arg) {
  int64_t blocks = (total + OPTIM_BLOCK - 1) / OPTIM_BLOCK;
  int nt = total * 4 >= SH_NN_PAR_MIN ? sh_parallel_threads() : 1;
  if (nt > blocks) nt = (int)blocks;
  if (nt <= 1) {
    if (total > 0) fn(arg, 0, total);
    return;
  }
  optim_blocks job = { total, fn, arg, 0 };
  sh_parallel(nt, optim_task, &job);
}

/* A multi-tensor AdamW step is one loop over the concatenation of its n parameters (start:
 * n + 1 offsets). */
typedef struct adamw_job {
  int n;
  const sh_adamw_buf *bufs;
  const int64_t *start;
} adamw_job;

/* Elements [e0, e1) of the concatenation. */
static void adamw_span(const void *arg, int64_t e0, int64_t e1) {
  const adamw_job *j = arg;
  for (int k = 0; k < j->n && j->start[k] < e1; k++) {
    int64_t s = j->start[k], e = j->start[k + 1];
    if (e <= e0) continue;
    adamw_range(&j->bufs[k], (e0 > s ? e0 : s) - s, (e1 < e ? e1 : e) - s);
  }
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

SH_CPU_KERNEL(sgd_range, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const opt_args *a = arg;
  float *restrict p = a->p, *restrict buf = a->buf;
  const float scale = a->s.scale, wd = a->s.wd, momentum = a->s.momentum, omd = a->s.omd, lr = a->s.lr;
  const int first = a->s.first, nesterov = a->s.nesterov;
  const float *restrict g32 = a->g32;
  const uint16_t *restrict g16 = a->g16;
  if (g32 && buf) { SGD_MOMENTUM_LOOP(g32[i]) }
  else if (buf) { SGD_MOMENTUM_LOOP(sh_bf16_to_f32_inline(g16[i])) }
  else if (g32) { SGD_LOOP(g32[i]) }
  else { SGD_LOOP(sh_bf16_to_f32_inline(g16[i])) }
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

/* One parameter's buffers, as the loops see them. */
static sh_adamw_buf adamw_buf_of(const sh_adamw_param *e, sh_adamw_hyper h) {
  sh_adamw_buf b = {.p = sh_nn_ptr(e->param), .m = sh_nn_ptr(e->m), .v = sh_nn_ptr(e->v), .h = h};
  if (e->grad->dtype == SH_F32) b.g32 = sh_nn_ptr(e->grad);
  else b.g16 = sh_tensor_data(e->grad);
  b.shadow = e->shadow ? sh_tensor_data(e->shadow) : NULL;
  b.shadow_dtype = e->shadow ? e->shadow->dtype : SH_F32;
  if (e->clip) b.h.scale *= *(const float *)sh_tensor_data(e->clip);   /* as optim.cu: one f32 product */
  return b;
}

static int cpu_adamw_step_multi_(int n, const sh_adamw_param *ps, double lr, double beta1, double beta2,
                                 double eps, int64_t step, double grad_scale) {
  sh_adamw_buf *bufs = malloc(sizeof *bufs * (size_t)n);
  int64_t *start = malloc(sizeof *start * (size_t)(n + 1));
  if (!bufs || !start) {
    free(bufs); free(start);
    return sh_fail(SH_ERR_OOM, "adamw: out of host memory for the step's list of %d parameters", n);
  }
  start[0] = 0;
  for (int i = 0; i < n; i++) {
    bufs[i] = adamw_buf_of(&ps[i], sh_adamw_hyper_of(lr, beta1, beta2, eps, ps[i].weight_decay, step, grad_scale));
    start[i + 1] = start[i] + sh_tensor_numel(ps[i].param);
  }
  optim_parallel(start[n], adamw_span, &(adamw_job){n, bufs, start});
  free(bufs); free(start);
  return SH_OK;
}

static int cpu_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                         double momentum, double dampening, double weight_decay, int nesterov,
                         int first_step, double grad_scale) {
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  if (grad->dtype == SH_F32) a.g32 = sh_nn_ptr(grad);
  else a.g16 = sh_tensor_data(grad);
  a.p = sh_nn_ptr(param);
  a.s = sh_sgd_hyper_of(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  a.buf = a.s.has_buf ? sh_nn_ptr(momentum_buf) : NULL;
  optim_parallel(n, sgd_range, &a);
  return SH_OK;
}

static double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

/* sum |x| (SH_NORM_L1) or the NaN-propagating max |x| (SH_NORM_MAX) of t, in f64. */
static int cpu_abs_part(const sh_tensor *t, int kind, double *out) {
  sh_tensor *d = NULL;
  SH_TRY(sh_contiguous_as(&d, t, t->dtype));
  const void *x = sh_tensor_data(d);
  double acc = 0;
  for (int64_t i = 0, n = sh_tensor_numel(d); i < n; i++) {
    double a = fabs(sh_load(x, d->dtype, i));
    acc = kind == SH_NORM_L1 ? acc + a : nan_max(acc, a);
  }
  sh_tensor_destroy(d);
  *out = acc;
  return SH_OK;
}

/* Tensor by tensor: the sum of squares is ops.h's sumsq (the runtime's vectorized reduction),
 * the rarer norms 1 and inf a plain loop. */
static int cpu_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *t, const double *weights, int kind) {
  double acc = 0;
  for (int i = 0; i < n; i++) {
    double part;
    int rc = SH_OK;
    if (kind == SH_NORM_L2) part = sh_sumsq(t[i], &rc);
    else rc = cpu_abs_part(t[i], kind, &part);
    SH_TRY(rc);
    if (kind == SH_NORM_MAX) acc = nan_max(acc, part);
    else acc += (weights ? weights[i] : 1.0) * part;
  }
  *(double *)sh_tensor_data(out) = acc;
  return SH_OK;
}

static int cpu_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm) {
  double n = sh_clip_norm_of(*(const double *)sh_tensor_data(part), kind);
  *(double *)sh_tensor_data(norm) = n;
  *(float *)sh_tensor_data(coef) = sh_clip_coef_of(n, max_norm);
  return SH_OK;
}

void sh_optim_register_cpu(sh_backend *b) {
  b->adamw_step_multi_ = cpu_adamw_step_multi_;
  b->sgd_step_ = cpu_sgd_step_;
  b->grad_norm_part = cpu_grad_norm_part;
  b->grad_clip_coef = cpu_grad_clip_coef;
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
