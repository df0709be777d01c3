/* activation.c: gelu (GPT-2's tanh form), silu, swiglu's gate, softmax over the last
 * dim, and seeded dropout; forward and backward. Each kernel is a range function run by
 * sh_stage_parallel_for, with exp/tanh from staging_internal.h so the loops vectorize. Outputs take
 * the dtype of the input they are the result or gradient of; math is f32.
 * The public ops at the end check, allocate on the input's device and dispatch
 * (backend_internal.h); the sh_kcpu_ kernels above them stage through f32 (staging_internal.h).
 * The fronts are ops/activation.c. */
#include <math.h>
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "core/philox_internal.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

typedef struct ew_args {
  const float *x, *y, *dy, *b;
  float *out, *out2;
  int64_t c;           /* row length, for softmax */
  float p, scale;      /* dropout */
  uint64_t seed, offset;
} ew_args;

/* ---- gelu ---------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f   /* sqrt(2 / pi) */

#define GELU_A 0.044715f

SH_CPU_KERNEL(gelu_fwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i];
    a->out[i] = 0.5f * x * (1.0f + sh_tanhf_abs(GELU_K * (x + GELU_A * x * x * x)));
  }
}

/* d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 A x^2), t = tanh(K (x + A x^3)) */
SH_CPU_KERNEL(gelu_bwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i];
    float t = sh_tanhf_abs(GELU_K * (x + GELU_A * x * x * x));
    float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    a->out[i] = a->dy[i] * d;
  }
}

void sh_stage_gelu_f32(const float *x, float *y, int64_t n) {
  ew_args a = {.x = x, .out = y};
  gelu_fwd(&a, 0, n);
}

void sh_stage_gelu_backward_f32(const float *dy, const float *x, float *dx, int64_t n) {
  ew_args a = {.x = x, .dy = dy, .out = dx};
  gelu_bwd(&a, 0, n);
}

/* ---- silu and swiglu ----------------------------------------------------------------- */

SH_CPU_KERNEL(silu_fwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) a->out[i] = a->x[i] * sh_sigmoidf(a->x[i]);
}

/* d silu = s (1 + x (1 - s)), s = sigmoid(x) */
SH_CPU_KERNEL(silu_bwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i], s = sh_sigmoidf(x);
    a->out[i] = a->dy[i] * s * (1.0f + x * (1.0f - s));
  }
}

SH_CPU_KERNEL(swiglu_fwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) a->out[i] = a->x[i] * sh_sigmoidf(a->x[i]) * a->b[i];
}

/* y = silu(a) b: da = dy b silu'(a), db = dy silu(a). out is da, out2 is db (either NULL). */
SH_CPU_KERNEL(swiglu_bwd, (const void *arg, int64_t i0, int64_t i1), (arg, i0, i1)) {
  const ew_args *a = arg;
  if (a->out) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      float x = a->x[i], s = sh_sigmoidf(x);
      a->out[i] = a->dy[i] * a->b[i] * s * (1.0f + x * (1.0f - s));
    }
  }
  if (a->out2) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) a->out2[i] = a->dy[i] * a->x[i] * sh_sigmoidf(a->x[i]);
  }
}

/* ---- softmax ------------------------------------------------------------------------- */

SH_CPU_KERNEL(softmax_fwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
  const ew_args *a = arg;
  int64_t c = a->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * c;
    float *y = a->out + r * c;
    float m = -INFINITY, s = 0.0f;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < c; i++) m = x[i] > m ? x[i] : m;
    /* a row of -inf (fully masked) gives NaN, as in PyTorch */
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < c; i++) { y[i] = sh_expf(x[i] - m); s += y[i]; }
    float inv = 1.0f / s;
#pragma omp simd
    for (int64_t i = 0; i < c; i++) y[i] *= inv;
  }
}

/* dx = y (dy - sum(dy y)) */
SH_CPU_KERNEL(softmax_bwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
  const ew_args *a = arg;
  int64_t c = a->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *y = a->y + r * c, *dy = a->dy + r * c;
    float *dx = a->out + r * c;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < c; i++) s += dy[i] * y[i];
#pragma omp simd
    for (int64_t i = 0; i < c; i++) dx[i] = y[i] * (dy[i] - s);
  }
}

/* ---- dropout ------------------------------------------------------------------------- */

/* Element i is kept when uniform i of the stream (seed, offset) is > p, i.e. with
 * probability 1 - p, and scaled by 1/(1-p). One Philox block gives four consecutive
 * uniforms, so a block is computed once per four elements. Backward runs the same code
 * on dy: the mask is the same because it depends only on (seed, offset + i). */
static void dropout_range(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
  int64_t i = i0;
  while (i < i1) {
    uint64_t n = a->offset + (uint64_t)i;
    sh_philox_out o = sh_philox4x32(a->seed, n >> 2);
    for (unsigned k = (unsigned)(n & 3); k < 4 && i < i1; k++, i++)
      a->out[i] = sh_u32_to_unit(o.v[k]) > a->p ? a->x[i] * a->scale : 0.0f;
  }
}

/* dropout with p = 0 keeps everything: a copy, with no random numbers drawn */
static void copy_range(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
  memcpy(a->out + i0, a->x + i0, (size_t)(i1 - i0) * sizeof(float));
}

/* ---- CPU kernels ---------------------------------------------------------------------- */

/* out = fn(x) elementwise, or per row of length c when rows; x (named xname) and dy, when
 * given, are staged in f32, and out (x's shape, any float dtype) is written through f32. */
static int run_unary(sh_tensor *out, const char *op, sh_stage_range_fn fn, ew_args *a, const sh_tensor *x,
                     const char *xname, const sh_tensor *dy, int rows) {
  sh_tensor *xc = NULL, *dyc = NULL;
  sh_stage_accum o = {0};
  int rc = sh_stage_f32(&xc, x, op, xname);
  if (!rc && dy) rc = sh_stage_f32(&dyc, dy, op, "dy");
  if (!rc) rc = sh_stage_out_begin(&o, out);
  if (!rc) {
    int64_t n = sh_tensor_numel(x);
    a->x = a->y = sh_stage_ptr(xc);
    a->dy = dyc ? sh_stage_ptr(dyc) : NULL;
    a->out = sh_stage_ptr(o.buf);
    a->c = rows ? x->shape[x->ndim - 1] : 1;
    int64_t units = a->c > 0 ? n / a->c : 0;
    sh_stage_parallel_for(units, n * (rows ? 4 : 16), fn, a);
    rc = sh_stage_accum_end(&o);
  }
  sh_stage_accum_drop(&o);
  sh_tensor_destroy(xc); sh_tensor_destroy(dyc);
  return rc;
}

/* The kernels of an activation `name` whose backward reads `saved` (x, or softmax's y), its
 * range functions name_fwd and name_bwd; rows: per row of the last dim. */
#define ACTIVATION_KERNELS(name, saved, rows)                                                    \
  int sh_kcpu_##name##_forward(sh_tensor *y, const sh_tensor *x) {                              \
    ew_args a = {0};                                                                            \
    return run_unary(y, #name, name##_fwd, &a, x, "x", NULL, rows);                             \
  }                                                                                             \
  int sh_kcpu_##name##_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *saved) {   \
    ew_args a = {0};                                                                            \
    return run_unary(dx, #name "_backward", name##_bwd, &a, saved, #saved, dy, rows);           \
  }

ACTIVATION_KERNELS(gelu, x, 0)      /* sh_kcpu_gelu_forward, sh_kcpu_gelu_backward */
ACTIVATION_KERNELS(silu, x, 0)      /* sh_kcpu_silu_forward, sh_kcpu_silu_backward */
ACTIVATION_KERNELS(softmax, y, 1)   /* sh_kcpu_softmax_forward, sh_kcpu_softmax_backward */

int sh_kcpu_swiglu_forward(sh_tensor *y, const sh_tensor *a, const sh_tensor *b) {
  const char *op = "swiglu";
  sh_tensor *bc = NULL;
  SH_TRY(sh_stage_f32(&bc, b, op, "b"));
  ew_args e = {.b = sh_stage_ptr(bc)};
  int rc = run_unary(y, op, swiglu_fwd, &e, a, "a", NULL, 0);
  sh_tensor_destroy(bc);
  return rc;
}

/* da and db may each be NULL. */
int sh_kcpu_swiglu_backward(sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a,
                            const sh_tensor *b) {
  const char *op = "swiglu_backward";
  sh_tensor *ac = NULL, *bc = NULL, *dyc = NULL;
  sh_stage_accum oa = {0}, ob = {0};
  int rc = sh_stage_f32(&ac, a, op, "a");
  if (!rc) rc = sh_stage_f32(&bc, b, op, "b");
  if (!rc) rc = sh_stage_f32(&dyc, dy, op, "dy");
  if (!rc && da) rc = sh_stage_out_begin(&oa, da);
  if (!rc && db) rc = sh_stage_out_begin(&ob, db);
  if (!rc) {
    ew_args e = {.x = sh_stage_ptr(ac), .b = sh_stage_ptr(bc), .dy = sh_stage_ptr(dyc),
                 .out = da ? sh_stage_ptr(oa.buf) : NULL, .out2 = db ? sh_stage_ptr(ob.buf) : NULL};
    int64_t n = sh_tensor_numel(a);
    sh_stage_parallel_for(n, n * 16, swiglu_bwd, &e);
  }
  if (!rc && da) rc = sh_stage_accum_end(&oa);
  if (!rc && db) rc = sh_stage_accum_end(&ob);
  sh_stage_accum_drop(&oa); sh_stage_accum_drop(&ob);
  sh_tensor_destroy(ac); sh_tensor_destroy(bc); sh_tensor_destroy(dyc);
  return rc;
}

/* Forward and backward alike: the mask depends only on (seed, offset + i). */
int sh_kcpu_dropout_forward(sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  ew_args a = {.p = (float)p, .scale = (float)(1.0 / (1.0 - p)), .seed = seed, .offset = offset};
  return run_unary(y, "dropout", p == 0.0 ? copy_range : dropout_range, &a, x, "x", NULL, 0);
}

int sh_kcpu_dropout_backward(sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  return sh_kcpu_dropout_forward(dx, dy, p, seed, offset);
}
