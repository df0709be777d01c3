/* activation.cu: gelu (GPT-2's tanh form), silu, swiglu's gate, softmax over the last dim and
 * seeded dropout, forward and backward, matching runtime/cpu/activation.c: outputs take the
 * dtype of the input they are the result or gradient of, math is f32. Dropout's mask comes
 * from the Philox stream (core/philox_internal.h) at (seed, offset + i), recomputed in
 * backward, never stored.
 *
 * The pointwise ones share one kernel: up to three inputs and two outputs of one dtype,
 * 16-byte packs when every pointer allows it, and the activation picked by a uniform switch
 * (they are memory-bound). Softmax gives each row to a block: a max pass, a sum pass, and a
 * write pass over a row that stays in L1/L2. */
#include "common.cuh"
#include "core/backend_internal.h"
#include "core/philox_internal.h"

enum { DROPOUT_THREADS = 256 };
enum { ACT_GELU_F, ACT_GELU_B, ACT_SILU_F, ACT_SILU_B, ACT_SWIGLU_F, ACT_SWIGLU_B };
enum { ACT_THREADS = 256 };

/* One element: inputs x (a), y2 (dy or b), y3 (b for swiglu backward); outputs r0, r1. */
__device__ __forceinline__ void act_elem(int op, float x, float u, float w, float &r0, float &r1) {
  switch (op) {
    case ACT_GELU_F: r0 = gelu_f(x); break;
    case ACT_GELU_B: r0 = u * gelu_grad_f(x); break;
    case ACT_SILU_F: r0 = x * sigmoid_f(x); break;
    case ACT_SILU_B: { float s = sigmoid_f(x); r0 = u * s * (1.0f + x * (1.0f - s)); break; }
    case ACT_SWIGLU_F: r0 = x * sigmoid_f(x) * u; break;
    default: {   /* swiglu backward: u = dy, w = b; r0 = da, r1 = db */
      float s = sigmoid_f(x);
      r0 = u * w * s * (1.0f + x * (1.0f - s));
      r1 = u * x * s;
    }
  }
}

template <typename T>
__global__ void act_kernel(int op, const T *x, const T *u, const T *w, T *o0, T *o1, int64_t n, int vec) {
  constexpr int N = sh_pack<T>::N;
  int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  int64_t nvec = vec ? n / N : 0;
  for (int64_t v = tid; v < nvec; v += stride) {
    sh_pack<T> px = load_pack(x + v * N), pu, pw, p0, p1;
    if (u) pu = load_pack(u + v * N);
    if (w) pw = load_pack(w + v * N);
#pragma unroll
    for (int j = 0; j < N; j++) {
      float r0 = 0, r1 = 0;
      act_elem(op, to_f(px.v[j]), u ? to_f(pu.v[j]) : 0.0f, w ? to_f(pw.v[j]) : 0.0f, r0, r1);
      p0.v[j] = from_f<T>(r0);
      p1.v[j] = from_f<T>(r1);
    }
    if (o0) store_pack(o0 + v * N, p0);
    if (o1) store_pack(o1 + v * N, p1);
  }
  for (int64_t i = nvec * N + tid; i < n; i += stride) {
    float r0 = 0, r1 = 0;
    act_elem(op, to_f(x[i]), u ? to_f(u[i]) : 0.0f, w ? to_f(w[i]) : 0.0f, r0, r1);
    if (o0) o0[i] = from_f<T>(r0);
    if (o1) o1[i] = from_f<T>(r1);
  }
}

/* The table's pointwise kernels (runtime/cpu/activation.c checked the arguments and
 * allocated the outputs, contiguous, of x's shape). Stages the inputs to x's dtype and
 * contiguity and launches; out1 may be NULL (one output), and in the swiglu backward either
 * may be. out0 has x's dtype; out1 (swiglu's db) has b's, so it goes through a scratch of
 * x's dtype when they differ. */
static int run_act(const char *op, int act, sh_tensor *out0, sh_tensor *out1, const sh_tensor *x,
                   const sh_tensor *u, const sh_tensor *w) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, x->device, &st));
  sh_tguard xc, uc, wc, o1c;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), x, x->dtype));
  if (u) SH_TRY(sh_cuda_contiguous_as(uc.out(), u, x->dtype));
  if (w) SH_TRY(sh_cuda_contiguous_as(wc.out(), w, x->dtype));
  if (out1 && out1->dtype != x->dtype) SH_TRY(sh_tensor_empty(o1c.out(), x->ndim, x->shape, x->dtype, x->device));
  sh_tensor *o1 = o1c.t ? o1c.t : out1;
  int64_t n = sh_tensor_numel(x);
  if (n > 0) {
    const void *px = sh_tensor_data(xc.t), *pu = uc.t ? sh_tensor_data(uc.t) : NULL, *pw = wc.t ? sh_tensor_data(wc.t) : NULL;
    void *p0 = out0 ? sh_tensor_data(out0) : NULL, *p1 = o1 ? sh_tensor_data(o1) : NULL;
    int vec = sh_aligned16(px) && (!pu || sh_aligned16(pu)) && (!pw || sh_aligned16(pw)) &&
              (!p0 || sh_aligned16(p0)) && (!p1 || sh_aligned16(p1));
    SH_DISPATCH_FLOAT(x->dtype, T, op, {
      int64_t work = vec ? (n + sh_pack<T>::N - 1) / sh_pack<T>::N : n;
      act_kernel<T><<<sh_blocks(work, ACT_THREADS), ACT_THREADS, 0, st>>>(
          act, (const T *)px, (const T *)pu, (const T *)pw, (T *)p0, (T *)p1, n, vec);
    });
    CU_LAUNCHED(op);
  }
  if (o1c.t) SH_TRY(sh_kernel_copy_(out1, o1c.t));
  return SH_OK;
}

extern "C" int sh_kcuda_gelu_forward(sh_tensor *y, const sh_tensor *x) {
  return run_act("gelu", ACT_GELU_F, y, NULL, x, NULL, NULL);
}
extern "C" int sh_kcuda_gelu_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x) {
  return run_act("gelu_backward", ACT_GELU_B, dx, NULL, x, dy, NULL);
}
extern "C" int sh_kcuda_silu_forward(sh_tensor *y, const sh_tensor *x) {
  return run_act("silu", ACT_SILU_F, y, NULL, x, NULL, NULL);
}
extern "C" int sh_kcuda_silu_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x) {
  return run_act("silu_backward", ACT_SILU_B, dx, NULL, x, dy, NULL);
}
extern "C" int sh_kcuda_swiglu_forward(sh_tensor *y, const sh_tensor *a, const sh_tensor *b) {
  return run_act("swiglu", ACT_SWIGLU_F, y, NULL, a, b, NULL);
}
extern "C" int sh_kcuda_swiglu_backward(sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a,
                                        const sh_tensor *b) {
  return run_act("swiglu_backward", ACT_SWIGLU_B, da, db, a, dy, b);
}

/* ---- softmax ----------------------------------------------------------------------------- */

template <typename T>
__global__ void softmax_fwd_kernel(const T *x, T *y, int64_t C) {
  __shared__ float sh[32];
  const T *xr = x + blockIdx.x * C;
  T *yr = y + blockIdx.x * C;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) m = fmaxf(m, to_f(xr[i]));
  m = block_max(m, sh);
  float s = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += __expf(to_f(xr[i]) - m);
  s = block_sum(s, sh);
  float inv = 1.0f / s;   /* a row of -inf gives NaN, as on the CPU and in PyTorch */
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) yr[i] = from_f<T>(__expf(to_f(xr[i]) - m) * inv);
}

/* dx = y (dy - sum(dy y)) */
template <typename T>
__global__ void softmax_bwd_kernel(const T *dy, const T *y, T *dx, int64_t C) {
  __shared__ float sh[32];
  const T *yr = y + blockIdx.x * C, *dyr = dy + blockIdx.x * C;
  T *dxr = dx + blockIdx.x * C;
  float s = 0;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) s += to_f(dyr[i]) * to_f(yr[i]);
  s = block_sum(s, sh);
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) dxr[i] = from_f<T>(to_f(yr[i]) * (to_f(dyr[i]) - s));
}

/* backward (b = y given): a = dy, and dx takes y's dtype */
static int softmax_run(const char *op, sh_tensor *out, const sh_tensor *a, const sh_tensor *b) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, a->device, &st));
  int dt = out->dtype;
  sh_tguard ac, bc;
  SH_TRY(sh_cuda_contiguous_as(ac.out(), a, dt));
  if (b) SH_TRY(sh_cuda_contiguous_as(bc.out(), b, dt));
  int64_t C = a->shape[a->ndim - 1], rows = C ? sh_tensor_numel(a) / C : 0;
  int threads = C >= 1024 ? 512 : C >= 256 ? 256 : 64;
  for (int64_t r0 = 0; r0 < rows; r0 += 2147483647LL) {
    unsigned nb = (unsigned)sh_min64(2147483647LL, rows - r0);
    SH_DISPATCH_FLOAT(dt, T, op, {
      if (b) softmax_bwd_kernel<T><<<nb, threads, 0, st>>>((const T *)sh_tensor_data(ac.t) + r0 * C,
                                                           (const T *)sh_tensor_data(bc.t) + r0 * C, (T *)sh_tensor_data(out) + r0 * C, C);
      else softmax_fwd_kernel<T><<<nb, threads, 0, st>>>((const T *)sh_tensor_data(ac.t) + r0 * C, (T *)sh_tensor_data(out) + r0 * C, C);
    });
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

extern "C" int sh_kcuda_softmax_forward(sh_tensor *y, const sh_tensor *x) { return softmax_run("softmax", y, x, NULL); }
extern "C" int sh_kcuda_softmax_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *y) {
  return softmax_run("softmax_backward", dx, dy, y);
}

/* ---- dropout ------------------------------------------------------------------------------ */

/* Element i is kept when uniform i of (seed, offset) is > p, and scaled by 1/(1-p). */
template <typename T>
__global__ void dropout_kernel(const T *x, T *y, int64_t n, float p, float scale, uint64_t seed, uint64_t offset) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float u = sh_philox_uniform(seed, offset, (uint64_t)i);
    y[i] = from_f<T>(u > p ? to_f(x[i]) * scale : 0.0f);
  }
}

/* y = dropout of x; y is the front's output (contiguous, x's shape and dtype). */
static int dropout(const char *op, sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  int64_t n = sh_tensor_numel(x);
  if (n == 0) return SH_OK;
  if (p == 0) return sh_kernel_copy_(y, x);
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, x->device, &st));
  sh_tguard xc;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), x, x->dtype));
  float scale = (float)(1.0 / (1.0 - p));
  SH_DISPATCH_FLOAT(x->dtype, T, op, {
    dropout_kernel<T><<<sh_blocks(n, DROPOUT_THREADS), DROPOUT_THREADS, 0, st>>>(
        (const T *)sh_tensor_data(xc.t), (T *)sh_tensor_data(y), n, (float)p, scale, seed, offset);
  });
  CU_LAUNCHED(op);
  return SH_OK;
}

extern "C" int sh_kcuda_dropout_forward(sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  return dropout("dropout", y, x, p, seed, offset);
}

extern "C" int sh_kcuda_dropout_backward(sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  return dropout("dropout_backward", dx, dy, p, seed, offset);
}
