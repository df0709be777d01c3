/* common.cuh: what every CUDA file in kernels/ shares: error checks that turn a cudaError into a
 * shard status, entering a device (its current stream), dtype dispatch over the float types,
 * element conversions, warp/block reductions and a scope guard for scratch tensors. */
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <atomic>
#include <functional>
#include <initializer_list>
#include <type_traits>
extern "C" {
#include "core/tensor_internal.h"
#include "core/cuda.h"
#include "core/alloc_internal.h"
#include "core/rules_internal.h"
#include "core/backend_internal.h"
}

/* Formats "op: cuda error <name> (<text>) at file:line" and returns SH_ERR_DEVICE. */
int sh_cuda_fail(const char *op, cudaError_t err, const char *file, int line);

#define CU_TRY(op, call) do { cudaError_t cu_e_ = (call); \
    if (cu_e_ != cudaSuccess) return sh_cuda_fail(op, cu_e_, __FILE__, __LINE__); } while (0)
/* After every launch: a bad configuration shows up here, not at the next sync. */
#define CU_LAUNCHED(op) CU_TRY(op, cudaGetLastError())

/* Makes `device` current on this thread (initialising it on first use) and returns the
 * thread's current stream there. */
int sh_cuda_enter(const char *op, int device, cudaStream_t *stream);
/* The raw stream behind a runtime stream (the NCCL backend issues its collectives on it). */
cudaStream_t sh_cuda_stream_raw(const sh_cuda_stream *s);
/* Properties read once per device. */
const cudaDeviceProp *sh_cuda_props(int device);

/* The graph `device` is capturing (sh_cuda_graph_begin), or NULL. A kernel whose arguments
 * change every step (an optimizer's lr and bias correction) reads them from a buffer the
 * graph owns (sh_cuda_graph_buffer, freed with the graph) that fn fills on the host before
 * each launch, queuing its copy on `stream` (the compute stream, ahead of the launch);
 * `launch` counts the graph's launches before this one, so the captured step itself is
 * launch 0; `lr` is the learning rate of the step the launch runs: the one
 * sh_cuda_graph_set_lr gave the graph, else `captured_lr` (the step's at the capture). */
sh_cuda_graph *sh_cuda_graph_capturing(int device);
void *sh_cuda_graph_buffer(sh_cuda_graph *g, size_t nbytes);
int sh_cuda_graph_before_launch(sh_cuda_graph *g, double captured_lr,
                                std::function<int(cudaStream_t stream, int64_t launch, double lr)> fn);

/* Scratch and output tensors released at scope exit unless taken. */
struct sh_tguard {
  sh_tensor *t = nullptr;
  sh_tguard() = default;
  sh_tguard(const sh_tguard &) = delete;
  sh_tguard &operator=(const sh_tguard &) = delete;
  ~sh_tguard() { sh_tensor_destroy(t); }
  sh_tensor *take() { sh_tensor *r = t; t = nullptr; return r; }
  sh_tensor **out() { return &t; }
};

/* *out = t as a contiguous tensor of `dtype` on t's device: an alias when it already is
 * one, else a converted copy (elementwise.cu). */
int sh_cuda_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype);
/* dst (contiguous) += src (contiguous, same numel), any float dtypes, on `stream`. */
int sh_cuda_accumulate(const char *op, sh_tensor *dst, const sh_tensor *src);

/* ---- element types ---------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

/* 16 bytes of T, so one load or store instruction moves a whole pack. */
template <typename T> struct alignas(16) sh_pack {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

template <typename T> __device__ __forceinline__ sh_pack<T> load_pack(const T *p) {
  sh_pack<T> r;
  *reinterpret_cast<int4 *>(&r) = __ldg(reinterpret_cast<const int4 *>(p));
  return r;
}
template <typename T> __device__ __forceinline__ void store_pack(T *p, const sh_pack<T> &r) {
  *reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(&r);
}

static inline bool sh_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Raises kernel's dynamic shared-memory limit to bytes (a launch above 48 KiB needs it) once
 * per kernel, not per launch: raised, a static of the caller's per kernel instantiation,
 * remembers the largest limit set. (The attribute belongs to the function in the context of
 * the current device; shard runs one device per process.) */
template <typename Kernel>
static inline cudaError_t sh_cuda_raise_smem(Kernel *kernel, size_t bytes, std::atomic<size_t> &raised) {
  if (bytes <= 48 * 1024 || raised.load() >= bytes) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e == cudaSuccess) raised.store(bytes);
  return e;
}

/* W consecutive elements of T: moved by 16-byte accesses when W * sizeof(T) is a multiple
 * of 16 (the address must then be 16-byte aligned), else element by element. Plain loads,
 * not __ldg: a kernel may read what it wrote (a row it stored, logits overwritten in place). */
template <typename T, int W> struct alignas((W * sizeof(T)) % 16 == 0 ? 16 : alignof(T)) sh_vec {
  static constexpr bool WIDE = (W * sizeof(T)) % 16 == 0;
  T v[W];
};

template <typename T, int W> __device__ __forceinline__ sh_vec<T, W> load_vec(const T *p) {
  sh_vec<T, W> r;
  if constexpr (sh_vec<T, W>::WIDE) {
#pragma unroll
    for (int i = 0; i < (int)(W * sizeof(T) / 16); i++) reinterpret_cast<int4 *>(&r)[i] = reinterpret_cast<const int4 *>(p)[i];
  } else {
#pragma unroll
    for (int i = 0; i < W; i++) r.v[i] = p[i];
  }
  return r;
}
template <typename T, int W> __device__ __forceinline__ void store_vec(T *p, const sh_vec<T, W> &r) {
  if constexpr (sh_vec<T, W>::WIDE) {
#pragma unroll
    for (int i = 0; i < (int)(W * sizeof(T) / 16); i++) reinterpret_cast<int4 *>(p)[i] = reinterpret_cast<const int4 *>(&r)[i];
  } else {
#pragma unroll
    for (int i = 0; i < W; i++) p[i] = r.v[i];
  }
}

/* Rows of n elements of `size` bytes can go by 16-byte chunks: each row starts 16-byte
 * aligned in every tensor given (NULLs aside). */
static inline bool sh_rows_wide(int64_t n, size_t size, std::initializer_list<const void *> ptrs) {
  if ((n * (int64_t)size) % 16 != 0) return false;
  for (const void *p : ptrs)
    if (p && !sh_aligned16(p)) return false;
  return true;
}

/* f(std::integral_constant<int, W>()): W = 16 bytes of T (the sh_vec width of one 16-byte
 * access) when `wide`, else 1 (the element-by-element path). */
template <typename T, typename F> static inline void with_width(bool wide, F f) {
  if (wide) f(std::integral_constant<int, 16 / sizeof(T)>());
  else f(std::integral_constant<int, 1>());
}

/* Runs `body` with T bound to the C++ type of a float dtype (f32, bf16, f16). */
#define SH_DISPATCH_FLOAT(dtype, T, op, ...) \
  switch (dtype) { \
    case SH_F32: { typedef float T; __VA_ARGS__; break; } \
    case SH_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; } \
    case SH_F16: { typedef __half T; __VA_ARGS__; break; } \
    default: return sh_fail(SH_ERR_ARG, "%s: cuda kernels take f32, bf16 or f16, got %s", op, sh_dtype_name(dtype)); \
  }

/* ---- any dtype in and out, by a run-time switch ---------------------------------------- */

template <typename C> __device__ __forceinline__ C ew_load(const char *base, int dt, int64_t i) {
  switch (dt) {
    case SH_F64: return (C)((const double *)base)[i];
    case SH_F32: return (C)((const float *)base)[i];
    case SH_BF16: return (C)__bfloat162float(((const __nv_bfloat16 *)base)[i]);
    case SH_F16: return (C)__half2float(((const __half *)base)[i]);
    case SH_I64: return (C)((const int64_t *)base)[i];
    case SH_I32: return (C)((const int32_t *)base)[i];
    case SH_U8: return (C)((const uint8_t *)base)[i];
    default: return (C)(((const uint8_t *)base)[i] != 0);
  }
}

template <typename C> __device__ __forceinline__ void ew_store(char *base, int dt, int64_t i, C v) {
  switch (dt) {
    case SH_F64: ((double *)base)[i] = (double)v; break;
    case SH_F32: ((float *)base)[i] = (float)v; break;
    case SH_BF16: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn((float)v); break;
    case SH_F16: ((__half *)base)[i] = __float2half_rn((float)v); break;
    case SH_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case SH_I32: ((int32_t *)base)[i] = (int32_t)(int64_t)v; break;
    case SH_U8: ((uint8_t *)base)[i] = (uint8_t)(int64_t)v; break;
    default: ((uint8_t *)base)[i] = v != (C)0; break;
  }
}

/* ---- reductions ------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* A reduction over the block (blockDim.x a multiple of 32, at most 1024) from the warp one,
 * warp(v); `empty` is its identity; every thread gets it. `shared` holds 32 values. Contains
 * __syncthreads: call from all threads. */
template <typename T, typename W>
__device__ __forceinline__ T block_reduce(T v, T *shared, T empty, W warp) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp(v);
  __syncthreads();
  if (lane == 0) shared[w] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : empty;
  return warp(v);
}
__device__ __forceinline__ float block_sum(float v, float *shared) {
  return block_reduce(v, shared, 0.0f, [](float x) { return warp_sum(x); });
}
__device__ __forceinline__ float block_max(float v, float *shared) {
  return block_reduce(v, shared, -INFINITY, [](float x) { return warp_max(x); });
}
__device__ __forceinline__ double block_sum_d(double v, double *shared) {
  return block_reduce(v, shared, 0.0, [](double x) { return warp_sum_d(x); });
}

/* GPT-2's tanh gelu and its derivative, as the CPU reference computes them. */
__device__ __forceinline__ float gelu_f(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  float u = k * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
  const float k = 0.7978845608028654f;
  float u = k * (x + 0.044715f * x * x * x);
  float t = tanhf(u);
  float du = k * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + __expf(-x)); }

static inline int64_t sh_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The grid of a grid-stride loop over n items, `threads` per block, on the current device:
 * one block per `threads` items, at most 32 per SM (the usual sizing of grid-stride launches:
 * enough blocks to fill every SM several times over; past that each thread loops). Every
 * kernel launched with it must be a grid-stride loop, or the items past the grid are skipped. */
static inline unsigned sh_blocks(int64_t n, int threads) {
  int device = 0;
  cudaGetDevice(&device);
  int64_t cap = (int64_t)sh_cuda_props(device)->multiProcessorCount * 32;
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b < cap ? b : cap);
}

/* The kernel of slot X (core/backend_internal.h: SH_KERNELS) is sh_kcuda_X, an extern "C"
 * function of kernels/<family>.cu; its prototype here is made from the slot's entry, and
 * device.cu's table from the same list. */
extern "C" {
#define SH_KERNEL_OF(slot) sh_kcuda_##slot
SH_KERNEL_PROTOTYPES
#undef SH_KERNEL_OF
}
