/* elementwise.cu: binary, unary, in-place, copy/cast and fill on CUDA, with the dtype rules
 * of runtime/cpu/elementwise.c (the CPU reference): comparisons give the promoted dtype
 * holding 0/1, integer division and transcendental ops of integers give f32, floats compute
 * in f32 (f64 in f64), integers in i64, and NaN propagates through maximum/minimum.
 *
 * Two paths. The fast one covers what a training step does (same-shape contiguous operands of
 * one float dtype, or a tensor and a scalar): each thread moves 16 bytes per load and store.
 * The general one takes any dtypes, strides and broadcasting: dims that are contiguous for
 * every operand are merged on the host, and each thread turns its linear index into one
 * offset per operand. Elementwise work is memory-bound, so the op is a uniform run-time
 * switch rather than a template, which keeps the instantiations (and the build) small. */
#include "common.cuh"
#include "core/backend_internal.h"
extern "C" {
#include "core/rules_internal.h"
}
#include <math.h>
#include <string.h>

enum { EW_THREADS = 256 };

/* ---- the math, per compute type -------------------------------------------------------- */

/* pow in the compute type: f32 through powf, f64 (and the integers' double path) through pow. */
template <typename C> __device__ __forceinline__ C ew_pow(C x, C y) { return (C)pow((double)x, (double)y); }
template <> __device__ __forceinline__ float ew_pow<float>(float x, float y) { return powf(x, y); }

template <typename C> __device__ __forceinline__ C ew_binary(int op, C x, C y, C alpha) {
  switch (op) {
    case SH_OP_ADD: return x + y;
    case SH_OP_SUB: return x - y;
    case SH_OP_MUL: return x * y;
    case SH_OP_DIV: return x / y;
    case SH_OP_POW: return y == (C)2 ? x * x : ew_pow(x, y);
    case SH_OP_MAXIMUM: return (x > y || x != x) ? x : y;
    case SH_OP_MINIMUM: return (x < y || x != x) ? x : y;
    case SH_OP_EQ: return (C)(x == y);
    case SH_OP_LT: return (C)(x < y);
    case SH_OP_GT: return (C)(x > y);
    case SH_OP_AXPY: return x + alpha * y;
    default: return y;   /* SH_OP_COPY: the second operand */
  }
}

/* Integer pow by squaring, wrapping like the CPU's. */
__device__ __forceinline__ int64_t ew_ipow(int64_t x, int64_t y) {
  if (y < 0) return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  for (; y; y >>= 1) { if (y & 1) r *= b; b *= b; }
  return (int64_t)r;
}
template <> __device__ __forceinline__ int64_t ew_binary<int64_t>(int op, int64_t x, int64_t y, int64_t alpha) {
  switch (op) {
    case SH_OP_ADD: return x + y;
    case SH_OP_SUB: return x - y;
    case SH_OP_MUL: return x * y;
    case SH_OP_POW: return ew_ipow(x, y);
    case SH_OP_MAXIMUM: return x > y ? x : y;
    case SH_OP_MINIMUM: return x < y ? x : y;
    case SH_OP_EQ: return x == y;
    case SH_OP_LT: return x < y;
    case SH_OP_GT: return x > y;
    case SH_OP_AXPY: return x + alpha * y;
    default: return y;
  }
}

template <typename C> __device__ __forceinline__ C ew_unary(int op, C x) {
  switch (op) {
    case SH_OP_NEG: return -x;
    case SH_OP_EXP: return exp(x);
    case SH_OP_LOG: return log(x);
    case SH_OP_SQRT: return sqrt(x);
    case SH_OP_RSQRT: return (C)1 / sqrt(x);
    case SH_OP_TANH: return tanh(x);
    case SH_OP_ABS: return fabs(x);
    case SH_OP_SQUARE: return x * x;
    case SH_OP_RECIPROCAL: return (C)1 / x;
    case SH_OP_SIGN: return (C)((x > 0) - (x < 0));
    default: return x;
  }
}
template <> __device__ __forceinline__ float ew_unary<float>(int op, float x) {
  switch (op) {
    case SH_OP_NEG: return -x;
    case SH_OP_EXP: return expf(x);
    case SH_OP_LOG: return logf(x);
    case SH_OP_SQRT: return sqrtf(x);
    case SH_OP_RSQRT: return 1.0f / sqrtf(x);
    case SH_OP_TANH: return tanhf(x);
    case SH_OP_ABS: return fabsf(x);
    case SH_OP_SQUARE: return x * x;
    case SH_OP_RECIPROCAL: return 1.0f / x;
    case SH_OP_SIGN: return (float)((x > 0) - (x < 0));
    default: return x;
  }
}
template <> __device__ __forceinline__ int64_t ew_unary<int64_t>(int op, int64_t x) {
  switch (op) {
    case SH_OP_NEG: return -x;
    case SH_OP_ABS: return x < 0 ? -x : x;
    case SH_OP_SQUARE: return x * x;
    case SH_OP_SIGN: return (x > 0) - (x < 0);
    default: return x;
  }
}

/* An operand seen in the output's (collapsed) shape: strides 0 where broadcast, or a scalar. */
struct ew_arg {
  char *base;            /* element 0 of the view */
  int dtype;
  int scalar;            /* 1: the value is `s`, not memory */
  double s;
  int64_t stride[SH_MAX_DIMS];
};

struct ew_plan {
  int ndim, nin, op, unary;
  double alpha;
  int64_t shape[SH_MAX_DIMS];
  ew_arg arg[3];         /* [0] output, [1] a, [2] b */
};

template <typename C>
__global__ void ew_general_kernel(const ew_plan p, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t off[3] = {0, 0, 0}, rest = i;
    for (int d = p.ndim - 1; d >= 0; d--) {
      int64_t idx = rest % p.shape[d];
      rest /= p.shape[d];
      for (int k = 0; k <= p.nin; k++) off[k] += idx * p.arg[k].stride[d];
    }
    C x = p.arg[1].scalar ? (C)p.arg[1].s : ew_load<C>(p.arg[1].base, p.arg[1].dtype, off[1]);
    C r;
    if (p.unary) {
      r = ew_unary<C>(p.op, x);
    } else {
      C y = p.arg[2].scalar ? (C)p.arg[2].s : ew_load<C>(p.arg[2].base, p.arg[2].dtype, off[2]);
      r = ew_binary<C>(p.op, x, y, (C)p.alpha);
    }
    ew_store<C>(p.arg[0].base, p.arg[0].dtype, off[0], r);
  }
}

/* ---- the fast path: contiguous, one float dtype, 16-byte packs -------------------------- */

/* o = a op b, where b is an array (b != NULL) or the scalar bs; unary when `unary`. */
template <typename T>
__global__ void ew_fast_kernel(T *o, const T *a, const T *b, float as, float bs, int a_scalar, int op,
                               int unary, float alpha, int64_t n, int vec) {
  constexpr int N = sh_pack<T>::N;
  int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  int64_t nvec = vec ? n / N : 0;
  for (int64_t v = tid; v < nvec; v += stride) {
    sh_pack<T> pa, pb, po;
    if (!a_scalar) pa = load_pack(a + v * N);
    if (b) pb = load_pack(b + v * N);
#pragma unroll
    for (int j = 0; j < N; j++) {
      float x = a_scalar ? as : to_f(pa.v[j]);
      float r = unary ? ew_unary<float>(op, x) : ew_binary<float>(op, x, b ? to_f(pb.v[j]) : bs, alpha);
      po.v[j] = from_f<T>(r);
    }
    store_pack(o + v * N, po);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    float x = a_scalar ? as : to_f(a[i]);
    float r = unary ? ew_unary<float>(op, x) : ew_binary<float>(op, x, b ? to_f(b[i]) : bs, alpha);
    o[i] = from_f<T>(r);
  }
}

/* ---- host side ------------------------------------------------------------------------- */

/* The dtype rules and op names are the CPU front's (ops_internal.h): one definition. */

static void arg_from(ew_arg *g, const sh_tensor *t, int ndim, const int64_t *shape) {
  memset(g, 0, sizeof *g);
  g->base = (char *)sh_tensor_data(t);
  g->dtype = t->dtype;
  sh_broadcast_strides(t, ndim, shape, g->stride);
}

static void arg_scalar(ew_arg *g, double s) {
  memset(g, 0, sizeof *g);
  g->scalar = 1;
  g->s = s;
  g->dtype = SH_F64;
}

static void collapse(ew_plan *p) {
  int64_t *strides[3] = {p->arg[0].stride, p->arg[1].stride, p->arg[2].stride};
  p->ndim = sh_collapse_dims(p->ndim, p->shape, p->nin + 1, strides);
}

/* Dense (stride 1 over one collapsed dim) or a scalar. */
static bool arg_dense(const ew_plan *p, int k) {
  return p->arg[k].scalar || (p->ndim == 1 && p->arg[k].stride[0] == 1);
}

template <typename T>
static int launch_fast(const char *op, cudaStream_t st, const ew_plan *p, int64_t n) {
  T *o = (T *)p->arg[0].base;
  const T *a = p->arg[1].scalar ? NULL : (const T *)p->arg[1].base;
  const T *b = (p->unary || p->arg[2].scalar) ? NULL : (const T *)p->arg[2].base;
  int vec = sh_aligned16(o) && (!a || sh_aligned16(a)) && (!b || sh_aligned16(b));
  int64_t work = vec ? (n + sh_pack<T>::N - 1) / sh_pack<T>::N : n;
  ew_fast_kernel<T><<<sh_blocks(work, EW_THREADS), EW_THREADS, 0, st>>>(
      o, a, b, (float)p->arg[1].s, p->unary ? 0.0f : (float)p->arg[2].s, p->arg[1].scalar, p->op, p->unary,
      (float)p->alpha, n, vec);
  CU_LAUNCHED(op);
  return SH_OK;
}

/* Runs a plan whose output is on `device`, computing in `ct`. */
static int run_plan(const char *op, int device, ew_plan *p, int ct) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  int64_t n = 1;
  for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
  if (n == 0) return SH_OK;
  collapse(p);
  int dt = p->arg[0].dtype;
  bool fast = ct == SH_F32 && (dt == SH_F32 || dt == SH_BF16 || dt == SH_F16) && p->ndim == 1 && arg_dense(p, 0);
  for (int k = 1; fast && k <= p->nin; k++)
    fast = arg_dense(p, k) && (p->arg[k].scalar || p->arg[k].dtype == dt);
  fast = fast && !p->arg[0].scalar;
  if (fast && dt == SH_F32) return launch_fast<float>(op, st, p, n);
  if (fast && dt == SH_BF16) return launch_fast<__nv_bfloat16>(op, st, p, n);
  if (fast && dt == SH_F16) return launch_fast<__half>(op, st, p, n);
  unsigned blocks = sh_blocks(n, EW_THREADS);
  if (ct == SH_F32) ew_general_kernel<float><<<blocks, EW_THREADS, 0, st>>>(*p, n);
  else if (ct == SH_F64) ew_general_kernel<double><<<blocks, EW_THREADS, 0, st>>>(*p, n);
  else ew_general_kernel<int64_t><<<blocks, EW_THREADS, 0, st>>>(*p, n);
  CU_LAUNCHED(op);
  return SH_OK;
}

/* A plan over out's shape, with out as operand 0; the caller adds the inputs. */
static ew_plan plan_for(const sh_tensor *out, int nin, int op, double alpha) {
  ew_plan p;
  memset(&p, 0, sizeof p);
  p.ndim = out->ndim; p.nin = nin; p.op = op; p.unary = nin == 1; p.alpha = alpha;
  memcpy(p.shape, out->shape, sizeof p.shape);
  arg_from(&p.arg[0], out, p.ndim, p.shape);
  return p;
}

static void plan_arg(ew_plan *p, int k, const sh_tensor *t) { arg_from(&p->arg[k], t, p->ndim, p->shape); }

/* ---- kernels of the table: outputs planned and allocated by the fronts ---------------------- */

extern "C" int sh_kcuda_binary(sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b) {
  ew_plan p = plan_for(out, 2, op, 0);
  plan_arg(&p, 1, a);
  plan_arg(&p, 2, b);
  return run_plan(sh_binop_name(op), out->device, &p, sh_compute_dtype(out->dtype));
}

extern "C" int sh_kcuda_binary_scalar(sh_tensor *out, int op, const sh_tensor *a, double s, int scalar_first) {
  ew_plan p = plan_for(out, 2, op, 0);
  plan_arg(&p, scalar_first ? 2 : 1, a);
  arg_scalar(&p.arg[scalar_first ? 1 : 2], s);
  return run_plan(sh_binop_name(op), out->device, &p, sh_compute_dtype(out->dtype));
}

extern "C" int sh_kcuda_unary(sh_tensor *out, int op, const sh_tensor *a) {
  ew_plan p = plan_for(out, 1, op, 0);
  plan_arg(&p, 1, a);
  return run_plan(sh_unop_name(op), out->device, &p, sh_compute_dtype(out->dtype));
}

/* A copy between an integer and a float dtype computes in the wider kind of the two. */
static int copy_compute_dtype(int dst, int src) {
  if (dst == SH_F64 || src == SH_F64) return SH_F64;
  if (sh_dtype_is_float(dst)) return SH_F32;
  return sh_dtype_is_float(src) ? SH_F64 : SH_I64;
}

/* dst = dst op b (b broadcast to dst). Arithmetic computes in the dtype the two promote to:
 * the front refused every result that differs from it. */
static int cuda_inplace(sh_tensor *dst, int op, const sh_tensor *b, double alpha) {
  ew_plan p = plan_for(dst, 2, op, alpha);
  plan_arg(&p, 1, dst);
  plan_arg(&p, 2, b);
  int ct = op == SH_OP_COPY ? copy_compute_dtype(dst->dtype, b->dtype)
                            : sh_compute_dtype(sh_promote(dst->dtype, b->dtype));
  return run_plan(sh_binop_name(op), dst->device, &p, ct);
}

extern "C" int sh_kcuda_binary_(sh_tensor *dst, int op, const sh_tensor *b) { return cuda_inplace(dst, op, b, 0); }

extern "C" int sh_kcuda_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) { return cuda_inplace(dst, SH_OP_AXPY, x, alpha); }

extern "C" int sh_kcuda_copy_(sh_tensor *dst, const sh_tensor *src) { return cuda_inplace(dst, SH_OP_COPY, src, 0); }

extern "C" int sh_kcuda_scale_(sh_tensor *dst, double alpha) {
  ew_plan p = plan_for(dst, 2, SH_OP_MUL, 0);
  plan_arg(&p, 1, dst);
  arg_scalar(&p.arg[2], alpha);
  return run_plan("scale_", dst->device, &p, sh_compute_dtype(dst->dtype));
}

/* The value is a scalar operand copied into every element (f64 carries it to integers exactly). */
extern "C" int sh_kcuda_fill_(sh_tensor *t, double value) {
  ew_plan p = plan_for(t, 1, SH_OP_COPY, 0);
  arg_scalar(&p.arg[1], value);
  return run_plan("fill_", t->device, &p, sh_dtype_is_float(t->dtype) && t->dtype != SH_F64 ? SH_F32 : SH_F64);
}

/* ---- helpers for the other kernels (common.cuh) --------------------------------------------- */

int sh_cuda_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype) {
  *out = NULL;
  if (t->dtype == dtype && sh_tensor_is_contiguous(t)) return sh_tensor_alias(out, t);
  sh_tguard o;
  SH_TRY(sh_tensor_empty(o.out(), t->ndim, t->shape, dtype, t->device));
  SH_TRY(sh_kcuda_copy_(o.t, t));
  *out = o.take();
  return SH_OK;
}

int sh_cuda_accumulate(const char *op, sh_tensor *dst, const sh_tensor *src) {
  dst->version++;
  int rc = sh_kcuda_axpy_(dst, 1.0, src);
  return rc ? sh_fail_context("%s: ", op) : SH_OK;
}
