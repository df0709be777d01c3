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
 * thread running the vector loop of the kernel set in use (optim_simd_internal.h: 16 lanes of
 * AVX-512F in the avx512 sets, 8 of AVX2 in avx2) and the portable loop below for the tails and
 * the generic set; on CUDA one launch per up to 16. SGD's loop is built once per CPU kernel
 * set (SH_CPU_KERNEL) rather than written in intrinsics. The gradient-norm part sums a list of tensors into one number on
 * their device, so a clip reads back one number however many tensors there are.
 * The public fronts at the end check every buffer and hyper-parameter, dispatch to the
 * params' device (backend_internal.h) and bump the versions of what the kernel updated.
 * The fronts are ops/optim.c. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "simd_internal.h"
#include "core/parallel.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

/* The SGD kernel's arguments. */
typedef struct opt_args {
  float *p, *buf;
  const float *g32;
  const uint16_t *g16;       /* bf16 grad when g32 is NULL */
  sh_sgd_hyper s;
} opt_args;

/* One parameter of a CPU AdamW step: its host buffers and constants. The grad is g32 (f32) or,
 * when g32 is NULL, g16 (bf16); shadow is NULL or a buffer of shadow_dtype. */
typedef struct adamw_buf {
  float *p, *m, *v;
  const float *g32;
  const uint16_t *g16;
  void *shadow;
  int shadow_dtype;
  sh_adamw_hyper h;
} adamw_buf;

/* The portable AdamW loop over [i0, i1) of one parameter, the shadow written in the same pass.
 * It is a macro over the grad's load and the shadow's store so that each pair is straight
 * vector code; every scalar is a local so that the stores through p, m, v (floats) cannot be
 * taken to modify it. The Makefile builds this file with -fno-math-errno (a sqrtf that may set
 * errno does not vectorize) and -ffp-contract=off (no FMA: the vector loops' bits). */
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

static void adamw_portable(const adamw_buf *b, int64_t i0, int64_t i1) {
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

/* The vector loops, adamw_vectors_x16 and adamw_vectors_x8. */
#define SH_SIMD_W 16
#include "optim_simd_internal.h"
#undef SH_SIMD_W
#define SH_SIMD_W 8
#include "optim_simd_internal.h"
#undef SH_SIMD_W

/* [i0, i1) of one parameter: the whole vectors through the kernel set's vector loop, the rest
 * portably. */
static void adamw_range(const adamw_buf *b, int64_t i0, int64_t i1) {
  int isa = sh_cpu_isa_fast();
  if (isa >= SH_CPU_AVX512) i0 = adamw_vectors_x16(b, i0, i1);
  else if (isa == SH_CPU_AVX2) i0 = adamw_vectors_x8(b, i0, i1);
  adamw_portable(b, i0, i1);
}

/* Calls fn(arg, e0, e1) over [0, total) in blocks of OPTIM_BLOCK elements (whole vectors and
 * cache lines) that the threads take in turn as they finish: dynamic scheduling, so that on a
 * shared machine a thread that loses its core delays only the blocks it holds, not a fixed
 * share of the step. Every element is updated on its own, so the bits do not depend on the
 * split. One thread when the step is too small to wake the team (SH_STAGE_PAR_MIN). */
enum { OPTIM_BLOCK = 1 << 16 };

typedef struct optim_blocks {
  int64_t total;
  sh_stage_range_fn fn;
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

static void optim_parallel(int64_t total, sh_stage_range_fn fn, const void *arg) {
  int64_t blocks = (total + OPTIM_BLOCK - 1) / OPTIM_BLOCK;
  int nt = total * 4 >= SH_STAGE_PAR_MIN ? sh_parallel_threads() : 1;
  if (nt > blocks) nt = (int)blocks;
  if (nt <= 1) {
    if (total > 0) fn(arg, 0, total);
    return;
  }
  optim_blocks job = {.total = total, .fn = fn, .arg = arg, .next = 0};
  sh_parallel(nt, optim_task, &job);
}

/* A multi-tensor AdamW step is one loop over the concatenation of its n parameters (start:
 * n + 1 offsets). */
typedef struct adamw_job {
  int n;
  const adamw_buf *bufs;
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

/* ---- CPU kernels ---------------------------------------------------------------------- */

/* One parameter's buffers, as the loops see them. */
static adamw_buf adamw_buf_of(const sh_adamw_param *e, sh_adamw_hyper h) {
  adamw_buf b = {.p = sh_stage_ptr(e->param), .m = sh_stage_ptr(e->m), .v = sh_stage_ptr(e->v), .h = h};
  if (e->grad->dtype == SH_F32) b.g32 = sh_stage_ptr(e->grad);
  else b.g16 = sh_tensor_data(e->grad);
  b.shadow = e->shadow ? sh_tensor_data(e->shadow) : NULL;
  b.shadow_dtype = e->shadow ? e->shadow->dtype : SH_F32;
  if (e->clip) b.h.scale *= *(const float *)sh_tensor_data(e->clip);   /* as optim.cu: one f32 product */
  return b;
}

int sh_kcpu_adamw_step_multi_(int n, const sh_adamw_param *ps, double lr, double beta1, double beta2,
                              double eps, int64_t step, double grad_scale) {
  adamw_buf *bufs = malloc(sizeof *bufs * (size_t)n);
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

int sh_kcpu_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                      double momentum, double dampening, double weight_decay, int nesterov,
                      int first_step, double grad_scale) {
  int64_t n = sh_tensor_numel(param);
  opt_args a = {0};
  if (grad->dtype == SH_F32) a.g32 = sh_stage_ptr(grad);
  else a.g16 = sh_tensor_data(grad);
  a.p = sh_stage_ptr(param);
  a.s = sh_sgd_hyper_of(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  a.buf = a.s.has_buf ? sh_stage_ptr(momentum_buf) : NULL;
  optim_parallel(n, sgd_range, &a);
  return SH_OK;
}

static double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

/* sum |x| (SH_NORM_L1) or the NaN-propagating max |x| (SH_NORM_MAX) of t, in f64. */
static int cpu_abs_part(const sh_tensor *t, int kind, double *out) {
  sh_tensor *d = NULL;
  SH_TRY(sh_kernel_contiguous_as(&d, t, t->dtype));
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
int sh_kcpu_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *t, const double *weights, int kind) {
  double acc = 0;
  for (int i = 0; i < n; i++) {
    double part;
    int rc = SH_OK;
    if (kind == SH_NORM_L2) rc = sh_kcpu_sumsq(t[i], &part);
    else rc = cpu_abs_part(t[i], kind, &part);
    SH_TRY(rc);
    if (kind == SH_NORM_MAX) acc = nan_max(acc, part);
    else acc += (weights ? weights[i] : 1.0) * part;
  }
  *(double *)sh_tensor_data(out) = acc;
  return SH_OK;
}

int sh_kcpu_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm) {
  double n = sh_clip_norm_of(*(const double *)sh_tensor_data(part), kind);
  *(double *)sh_tensor_data(norm) = n;
  *(float *)sh_tensor_data(coef) = sh_clip_coef_of(n, max_norm);
  return SH_OK;
}
