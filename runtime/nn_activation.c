/* nn_activation.c: gelu (GPT-2's tanh form), silu, swiglu's gate, softmax over the last
 * dim, and seeded dropout; forward and backward. Each kernel is a range function run by
 * sh_nn_parallel_for, with exp/tanh from nn_internal.h so the loops vectorize. Outputs take
 * the dtype of the input they are the result or gradient of; math is f32. */
#include <math.h>
#include "backend_internal.h"
#include "nn_internal.h"
#include "nn.h"
#include "philox_internal.h"
#include "cuda_internal.h"

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

SH_NN_SIMD static void gelu_fwd(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i];
    a->out[i] = 0.5f * x * (1.0f + sh_tanhf_abs(GELU_K * (x + GELU_A * x * x * x)));
  }
}

/* d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 A x^2), t = tanh(K (x + A x^3)) */
SH_NN_SIMD static void gelu_bwd(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i];
    float t = sh_tanhf_abs(GELU_K * (x + GELU_A * x * x * x));
    float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    a->out[i] = a->dy[i] * d;
  }
}

/* ---- silu and swiglu ----------------------------------------------------------------- */

SH_NN_SIMD static void silu_fwd(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) a->out[i] = a->x[i] * sh_sigmoidf(a->x[i]);
}

/* d silu = s (1 + x (1 - s)), s = sigmoid(x) */
SH_NN_SIMD static void silu_bwd(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) {
    float x = a->x[i], s = sh_sigmoidf(x);
    a->out[i] = a->dy[i] * s * (1.0f + x * (1.0f - s));
  }
}

SH_NN_SIMD static void swiglu_fwd(const void *arg, int64_t i0, int64_t i1) {
  const ew_args *a = arg;
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) a->out[i] = a->x[i] * sh_sigmoidf(a->x[i]) * a->b[i];
}

/* y = silu(a) b: da = dy b silu'(a), db = dy silu(a). out is da, out2 is db (either NULL). */
SH_NN_SIMD static void swiglu_bwd(const void *arg, int64_t i0, int64_t i1) {
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

SH_NN_SIMD static void softmax_fwd(const void *arg, int64_t r0, int64_t r1) {
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
SH_NN_SIMD static void softmax_bwd(const void *arg, int64_t r0, int64_t r1) {
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

/* ---- entry points -------------------------------------------------------------------- */

/* out = fn(x) elementwise (or per row of length c when c > 0); out has x's shape and
 * `dtype`. If dy is given it must have x's shape and is staged too. */
static int run_unary(sh_tensor **out, const char *op, sh_nn_range_fn fn, ew_args *a, const sh_tensor *x,
                     const char *xname, const sh_tensor *dy, int rows, int dtype) {
  *out = NULL;
  SH_TRY(sh_nn_check_float(x, op, xname));
  if (dy) {
    SH_TRY(sh_nn_check_float(dy, op, "dy"));
    SH_TRY(sh_nn_check_same_shape(dy, x, op, "dy", xname));
  }
  if (rows && x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: %s must have at least 1 dim, got %s", op, xname, sh_desc(x));
  sh_tensor *xc = NULL, *dyc = NULL, *o = NULL;
  int rc = sh_nn_f32(&xc, x, op, xname);
  if (!rc && dy) rc = sh_nn_f32(&dyc, dy, op, "dy");
  if (!rc) rc = sh_nn_new_f32(&o, x->ndim, x->shape);
  if (!rc) {
    int64_t n = sh_tensor_numel(x);
    a->x = a->y = sh_nn_ptr(xc);
    a->dy = dyc ? sh_nn_ptr(dyc) : NULL;
    a->out = sh_nn_ptr(o);
    a->c = rows ? x->shape[x->ndim - 1] : 1;
    int64_t units = a->c > 0 ? n / a->c : 0;
    sh_nn_parallel_for(units, n * (rows ? 4 : 16), fn, a);
    rc = sh_nn_finish(&o, dtype);
  }
  sh_tensor_destroy(xc); sh_tensor_destroy(dyc);
  if (rc) sh_tensor_destroy(o);
  else *out = o;
  return rc;
}

int sh_gelu_forward(sh_tensor **y, const sh_tensor *x) {
  if (x && x->device >= 0) return sh_cuda_gelu_forward(y, x);
  ew_args a = {0};
  return run_unary(y, "gelu", gelu_fwd, &a, x, "x", NULL, 0, x ? x->dtype : SH_F32);
}

int sh_gelu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x) {
  if (x && x->device >= 0) return sh_cuda_gelu_backward(dx, dy, x);
  ew_args a = {0};
  return run_unary(dx, "gelu_backward", gelu_bwd, &a, x, "x", dy, 0, x ? x->dtype : SH_F32);
}

int sh_silu_forward(sh_tensor **y, const sh_tensor *x) {
  if (x && x->device >= 0) return sh_cuda_silu_forward(y, x);
  ew_args a = {0};
  return run_unary(y, "silu", silu_fwd, &a, x, "x", NULL, 0, x ? x->dtype : SH_F32);
}

int sh_silu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x) {
  if (x && x->device >= 0) return sh_cuda_silu_backward(dx, dy, x);
  ew_args a = {0};
  return run_unary(dx, "silu_backward", silu_bwd, &a, x, "x", dy, 0, x ? x->dtype : SH_F32);
}

int sh_softmax_forward(sh_tensor **y, const sh_tensor *x) {
  if (x && x->device >= 0) return sh_cuda_softmax_forward(y, x);
  ew_args a = {0};
  return run_unary(y, "softmax", softmax_fwd, &a, x, "x", NULL, 1, x ? x->dtype : SH_F32);
}

int sh_softmax_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *y) {
  if (y && y->device >= 0) return sh_cuda_softmax_backward(dx, dy, y);
  ew_args a = {0};
  return run_unary(dx, "softmax_backward", softmax_bwd, &a, y, "y", dy, 1, y ? y->dtype : SH_F32);
}

int sh_swiglu_forward(sh_tensor **y, const sh_tensor *a, const sh_tensor *b) {
  if (a && a->device >= 0) return sh_cuda_swiglu_forward(y, a, b);
  const char *op = "swiglu";
  *y = NULL;
  SH_TRY(sh_nn_check_float(a, op, "a"));
  SH_TRY(sh_nn_check_float(b, op, "b"));
  SH_TRY(sh_nn_check_same_shape(a, b, op, "a", "b"));
  sh_tensor *bc = NULL;
  SH_TRY(sh_nn_f32(&bc, b, op, "b"));
  ew_args e = {.b = sh_nn_ptr(bc)};
  int rc = run_unary(y, op, swiglu_fwd, &e, a, "a", NULL, 0, a->dtype);
  sh_tensor_destroy(bc);
  return rc;
}

int sh_swiglu_backward(sh_tensor **da, sh_tensor **db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b) {
  if (a && a->device >= 0) return sh_cuda_swiglu_backward(da, db, dy, a, b);
  const char *op = "swiglu_backward";
  if (da) *da = NULL;
  if (db) *db = NULL;
  SH_TRY(sh_nn_check_float(dy, op, "dy"));
  SH_TRY(sh_nn_check_float(a, op, "a"));
  SH_TRY(sh_nn_check_float(b, op, "b"));
  SH_TRY(sh_nn_check_same_shape(a, b, op, "a", "b"));
  SH_TRY(sh_nn_check_same_shape(dy, a, op, "dy", "a"));
  sh_tensor *ac = NULL, *bc = NULL, *dyc = NULL, *dao = NULL, *dbo = NULL;
  int rc = sh_nn_f32(&ac, a, op, "a");
  if (!rc) rc = sh_nn_f32(&bc, b, op, "b");
  if (!rc) rc = sh_nn_f32(&dyc, dy, op, "dy");
  if (!rc && da) rc = sh_nn_new_f32(&dao, a->ndim, a->shape);
  if (!rc && db) rc = sh_nn_new_f32(&dbo, b->ndim, b->shape);
  if (!rc) {
    ew_args e = {.x = sh_nn_ptr(ac), .b = sh_nn_ptr(bc), .dy = sh_nn_ptr(dyc),
                 .out = dao ? sh_nn_ptr(dao) : NULL, .out2 = dbo ? sh_nn_ptr(dbo) : NULL};
    int64_t n = sh_tensor_numel(a);
    sh_nn_parallel_for(n, n * 16, swiglu_bwd, &e);
    if (da) rc = sh_nn_finish(&dao, a->dtype);
    if (!rc && db) rc = sh_nn_finish(&dbo, b->dtype);
  }
  sh_tensor_destroy(ac); sh_tensor_destroy(bc); sh_tensor_destroy(dyc);
  if (rc) { sh_tensor_destroy(dao); sh_tensor_destroy(dbo); return rc; }
  if (da) *da = dao;
  if (db) *db = dbo;
  return SH_OK;
}

static int dropout(sh_tensor **out, const char *op, const sh_tensor *x, const char *xname, double p,
                   uint64_t seed, uint64_t offset) {
  *out = NULL;
  if (!(p >= 0.0 && p < 1.0)) return sh_fail(SH_ERR_ARG, "%s: p must be in [0, 1), got %g", op, p);
  ew_args a = {.p = (float)p, .scale = (float)(1.0 / (1.0 - p)), .seed = seed, .offset = offset};
  return run_unary(out, op, p == 0.0 ? copy_range : dropout_range, &a, x, xname, NULL, 0, x ? x->dtype : SH_F32);
}

int sh_dropout_forward(sh_tensor **y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  if (x && x->device >= 0) return sh_cuda_dropout_forward(y, x, p, seed, offset);
  return dropout(y, "dropout", x, "x", p, seed, offset);
}

int sh_dropout_backward(sh_tensor **dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  if (dy && dy->device >= 0) return sh_cuda_dropout_backward(dx, dy, p, seed, offset);
  return dropout(dx, "dropout_backward", dy, "dy", p, seed, offset);
}

/* TRANSITION: kernels not yet in the table; replaced when this family is converted. */
void sh_activation_register_cpu(sh_backend *b) { (void)b; }
