/* cuda_runtime.h of the CUDA emulator (tests/cuda_emu): the CUDA runtime API and the device
 * built-ins that the kernels (kernels/ *.cu) use, for g++ -std=c++17 on a machine without the CUDA toolkit.
 * Written from NVIDIA's CUDA C++ Programming Guide and Runtime API reference; no NVIDIA header
 * is used. Test infrastructure only: never linked into lib/libshard.so or bin/shard.
 * Kernel launches `k<<<g, b, smem, stream>>>(args)` and `__shared__` declarations are turned
 * into the calls below by tests/cuda_emu/rewrite.lua at build time (line numbers kept).
 * See tests/cuda_emu/README.md for what is emulated and what cannot be shown. */
#pragma once
#ifndef __cplusplus
#error "the CUDA emulator's cuda_runtime.h is C++ only"
#endif
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <math.h>
#include <limits.h>
#include <tuple>
#include <type_traits>
#include <utility>
#include <memory>

#define SHARD_CUDA_EMU 1
#define CUDART_VERSION 12000

/* ---- execution space and other qualifiers ------------------------------------------- */
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __cudart_builtin__
/* Every __shared__ declaration must have been rewritten by rewrite.lua; one that reaches the
 * compiler (a header that was not rewritten, a form the rewriter does not know) fails here. */
#define __shared__ __shared___declaration_not_rewritten_by_tests_cuda_emu_rewrite_lua

/* ---- vector types ------------------------------------------------------------------- */
#define EMU_VEC2(name, T, al) struct __attribute__((aligned(al))) name { T x, y; }; \
  static inline name make_##name(T x, T y) { name r; r.x = x; r.y = y; return r; }
#define EMU_VEC3(name, T) struct name { T x, y, z; }; \
  static inline name make_##name(T x, T y, T z) { name r; r.x = x; r.y = y; r.z = z; return r; }
#define EMU_VEC4(name, T, al) struct __attribute__((aligned(al))) name { T x, y, z, w; }; \
  static inline name make_##name(T x, T y, T z, T w) { name r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }
EMU_VEC2(char2, signed char, 2) EMU_VEC4(char4, signed char, 4)
EMU_VEC2(uchar2, unsigned char, 2) EMU_VEC4(uchar4, unsigned char, 4)
EMU_VEC2(short2, short, 4) EMU_VEC4(short4, short, 8)
EMU_VEC2(ushort2, unsigned short, 4) EMU_VEC4(ushort4, unsigned short, 8)
EMU_VEC2(int2, int, 8) EMU_VEC3(int3, int) EMU_VEC4(int4, int, 16)
EMU_VEC2(uint2, unsigned, 8) EMU_VEC3(uint3, unsigned) EMU_VEC4(uint4, unsigned, 16)
EMU_VEC2(float2, float, 8) EMU_VEC3(float3, float) EMU_VEC4(float4, float, 16)
EMU_VEC2(double2, double, 16)
EMU_VEC2(longlong2, long long, 16) EMU_VEC2(ulonglong2, unsigned long long, 16)
#undef EMU_VEC2
#undef EMU_VEC3
#undef EMU_VEC4

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* ---- the built-in variables: set by the emulator's scheduler for the running thread --- */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ---- runtime types -------------------------------------------------------------------- */
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorCudartUnloading = 4,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidSymbol = 13,
  cudaErrorInvalidHostPointer = 16,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorAssert = 710,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4
};
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
  cudaFuncAttributeMax
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrWarpSize = 10, cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};

/* The fields CUDA documents for cudaDeviceProp that shard or a kernel might read (not the
 * real struct's layout, which nothing here depends on). */
struct cudaDeviceProp {
  char name[256];
  char uuid[16];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  size_t memPitch;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int clockRate;
  size_t totalConstMem;
  int major, minor;
  size_t textureAlignment;
  int deviceOverlap;
  int multiProcessorCount;
  int kernelExecTimeoutEnabled;
  int integrated;
  int canMapHostMemory;
  int computeMode;
  int concurrentKernels;
  int ECCEnabled;
  int pciBusID, pciDeviceID, pciDomainID;
  int asyncEngineCount;
  int unifiedAddressing;
  int memoryClockRate;
  int memoryBusWidth;
  int l2CacheSize;
  int persistingL2CacheMaxSize;
  int maxThreadsPerMultiProcessor;
  int streamPrioritiesSupported;
  int globalL1CacheSupported, localL1CacheSupported;
  size_t sharedMemPerMultiprocessor;
  int regsPerMultiprocessor;
  int managedMemory;
  int isMultiGpuBoard;
  int multiGpuBoardGroupID;
  int concurrentManagedAccess;
  int cooperativeLaunch;
  size_t sharedMemPerBlockOptin;
  int maxBlocksPerMultiProcessor;
  size_t reservedSharedMemPerBlock;
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1, cudaStreamCaptureStatusInvalidated = 2 };
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

/* ---- the runtime API ------------------------------------------------------------------- */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t err);
const char *cudaGetErrorString(cudaError_t err);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *ptr);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t count);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t count, cudaStream_t stream = 0);
cudaError_t cudaMemset(void *ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

/* Stream capture and graphs (Programming Guide "CUDA Graphs"): tests/cuda_emu/README.md says
 * which rules and errors are emulated. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status);
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status, unsigned long long *id = 0,
                                     cudaGraph_t *graph = 0);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute((const void *)entry, attr, value);
}

/* ---- device intrinsics ------------------------------------------------------------------ */
namespace emu {
/* Barriers and warp collectives, implemented by the scheduler (emu_core.cpp). `file`/`line`
 * name the call site in diagnostics. */
void syncthreads(const char *file, int line);
int syncthreads_reduce(int op, int pred, const char *file, int line);   /* 0 count, 1 and, 2 or */
void syncwarp(unsigned mask, const char *file, int line);
/* kind: 0 idx, 1 up, 2 down, 3 xor. `val` is at most 16 bytes; the result is written to `out`. */
void shfl(int kind, unsigned mask, const void *val, void *out, size_t bytes, int arg, int width, const char *file, int line);
unsigned vote(int kind, unsigned mask, int pred, const char *file, int line);       /* 0 ballot, 1 all, 2 any */
unsigned match_any(unsigned mask, const void *val, size_t bytes, const char *file, int line);
[[noreturn]] void device_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *dynamic_shared();
void *static_shared(void **slot, unsigned long *generation, size_t bytes, size_t align);
unsigned lane_id_of_current();
}  // namespace emu

static inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::syncthreads(file, line);
}
static inline int __syncthreads_count(int p, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return emu::syncthreads_reduce(0, p, file, line);
}
static inline int __syncthreads_and(int p, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return emu::syncthreads_reduce(1, p, file, line);
}
static inline int __syncthreads_or(int p, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return emu::syncthreads_reduce(2, p, file, line);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::syncwarp(mask, file, line);
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline void __threadfence_system(void) {}

#define EMU_SHFL(name, kind, argname) \
  template <class T> static inline T name(unsigned mask, T var, int argname, int width = warpSize, \
                                          const char *file = __builtin_FILE(), int line = __builtin_LINE()) { \
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16, #name ": a type of at most 16 bytes"); \
    T r; \
    emu::shfl(kind, mask, &var, &r, sizeof(T), argname, width, file, line); \
    return r; \
  }
EMU_SHFL(__shfl_sync, 0, srcLane)
EMU_SHFL(__shfl_up_sync, 1, delta)
EMU_SHFL(__shfl_down_sync, 2, delta)
EMU_SHFL(__shfl_xor_sync, 3, laneMask)
#undef EMU_SHFL

static inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return emu::vote(0, mask, pred, file, line);
}
static inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)emu::vote(1, mask, pred, file, line);
}
static inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)emu::vote(2, mask, pred, file, line);
}
template <class T> static inline unsigned __match_any_sync(unsigned mask, T v, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return emu::match_any(mask, &v, sizeof v, file, line);
}
/* The mask of lanes that execute this point together. Under independent thread scheduling
 * CUDA only promises the calling lane's own bit, which is what the emulator returns. */
static inline unsigned __activemask(void) { return 1u << emu::lane_id_of_current(); }

/* Read-only cache loads: a plain load (the alignment a vector load needs is checked). */
template <class T> static inline T __ldg(const T *p) {
  if ((uintptr_t)p % alignof(T) != 0) emu::device_fail("__ldg: misaligned address %p for a %zu-byte load", (const void *)p, sizeof(T));
  return *p;
}
template <class T> static inline T __ldcs(const T *p) { return __ldg(p); }
template <class T> static inline T __ldlu(const T *p) { return __ldg(p); }
template <class T> static inline T __ldcg(const T *p) { return __ldg(p); }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
template <class T> static inline void __stcg(T *p, T v) { *p = v; }

/* Atomics: blocks and threads run one at a time, so a plain read-modify-write is atomic. */
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <class T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> static inline T atomicXor(T *p, T v) { T o = *p; *p = o ^ v; return o; }
template <class T> static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
static inline unsigned atomicInc(unsigned *p, unsigned v) { unsigned o = *p; *p = o >= v ? 0 : o + 1; return o; }
static inline unsigned atomicDec(unsigned *p, unsigned v) { unsigned o = *p; *p = (o == 0 || o > v) ? v : o - 1; return o; }

/* ---- math: the fast intrinsics are computed exactly in float, which lies within their
 * documented error bounds (Programming Guide, "Intrinsic Functions") ------------------- */
/* glibc declares (but does not export) __expf & co as its internal names; these inline
 * extern "C" definitions match those declarations. */
#define EMU_M1(name, f) extern "C" inline float name(float x) noexcept { return f(x); }
EMU_M1(__expf, expf) EMU_M1(__exp10f, exp10f) EMU_M1(__logf, logf) EMU_M1(__log2f, log2f) EMU_M1(__log10f, log10f)
EMU_M1(__sinf, sinf) EMU_M1(__cosf, cosf) EMU_M1(__tanf, tanf)
#undef EMU_M1
extern "C" inline void __sincosf(float x, float *s, float *c) noexcept { *s = sinf(x); *c = cosf(x); }
extern "C" inline float __powf(float x, float y) noexcept { return powf(x, y); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float __fadd_rn(float x, float y) { return x + y; }
static inline float __fmul_rn(float x, float y) { return x * y; }
static inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
static inline double __fma_rn(double x, double y, double z) { return fma(x, y, z); }
static inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
static inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
static inline int __mul24(int x, int y) { return (int)((long long)(x << 8 >> 8) * (y << 8 >> 8)); }
static inline unsigned __umulhi(unsigned x, unsigned y) { return (unsigned)(((unsigned long long)x * y) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
  return (unsigned long long)(((unsigned __int128)x * y) >> 64);
}
namespace emu { long long clock64_now(); }
static inline long long clock64(void) { return emu::clock64_now(); }

/* CUDA's device min/max overloads (integer and floating): one template for every pair of
 * arithmetic types, with the usual arithmetic conversions, as CUDA's mixed overloads do. */
template <class A, class B, class = std::enable_if_t<(std::is_arithmetic<A>::value || std::is_enum<A>::value) &&
                                                    (std::is_arithmetic<B>::value || std::is_enum<B>::value)>>
static inline std::common_type_t<A, B> min(A a, B b) {
  typedef std::common_type_t<A, B> C;
  return (C)a < (C)b ? (C)a : (C)b;
}
template <class A, class B, class = std::enable_if_t<(std::is_arithmetic<A>::value || std::is_enum<A>::value) &&
                                                    (std::is_arithmetic<B>::value || std::is_enum<B>::value)>>
static inline std::common_type_t<A, B> max(A a, B b) {
  typedef std::common_type_t<A, B> C;
  return (C)a > (C)b ? (C)a : (C)b;
}

/* ---- launches (rewrite.lua turns `k<<<g, b, smem, st>>>(args)` into
 * `::emu::launch(k, "k", __FILE__, __LINE__, g, b, smem, st)(args)`) -------------------- */
namespace emu {

struct launch_config {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  const char *name, *file;
  int line;
};

/* Checks the configuration and queues the grid on the stream; run(ctx) is called once per
 * CUDA thread (on its fiber), destroy(ctx) when the launch is finished or dropped. Errors
 * go where CUDA puts them: the thread's last error (read by cudaGetLastError). */
void launch_grid(const launch_config &c, const void *func, void (*run)(void *), void *ctx, void (*destroy)(void *));

template <class... P> struct launcher {
  void (*k)(P...);
  launch_config c;
  template <class... A> void operator()(A &&...a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launch: wrong number of arguments");
    struct ctx {
      void (*k)(P...);
      std::tuple<std::decay_t<P>...> args;
    };
    /* The arguments are converted to the kernel's parameter types and copied at the launch,
     * as CUDA copies them into the launch's parameter buffer. */
    ctx *x = new ctx{k, std::tuple<std::decay_t<P>...>(std::forward<A>(a)...)};
    launch_grid(c, (const void *)k, [](void *p) { ctx *y = (ctx *)p; std::apply(y->k, y->args); }, x,
                [](void *p) { delete (ctx *)p; });
  }
};

template <class... P>
static inline launcher<P...> launch(void (*k)(P...), const char *name, const char *file, int line, dim3 grid, dim3 block,
                                    size_t smem = 0, cudaStream_t stream = 0) {
  return launcher<P...>{k, launch_config{grid, block, smem, stream, name, file, line}};
}

/* `__shared__ T x[N];` becomes `T (&x)[N] = ::emu::shared_var<T[N], 0>([]{});`: per-block
 * storage carved from the block's shared memory (NaN bytes at every block start); the lambda
 * makes one slot per declaration (and per template instantiation). Align: __align__(n). */
template <class T, size_t Align, class Tag> static inline T &shared_var(Tag) {
  static void *slot;
  static unsigned long generation;
  const size_t a = Align > alignof(T) ? Align : alignof(T);
  return *(T *)static_shared(&slot, &generation, sizeof(T), a > 16 ? a : 16);
}

}  // namespace emu
