/* test_emu_core.cu: the emulator's core shows what it claims. Every detection test runs the
 * buggy kernel (or stream program) and asserts the emulator DETECTS it (an error, a report or
 * a wrong answer every time), then runs the fixed version and asserts it passes. Compiled
 * through the same rewrite as the kernels. Prints "C test_emu_core: N passed, N failed". */
#include <cuda_runtime.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string>
#include <vector>
#include <chrono>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "emu_api.h"
#include "emu_test.h"
#include "emu_device.h"

static bool reported(const char *needle) { return strstr(emu::last_report(), needle) != nullptr; }

/* ---- kernels ------------------------------------------------------------------------ */

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* out[b] = sum of x[b * n .. b * n + n), blockDim.x a multiple of 32. */
__global__ void block_sum_kernel(const float *x, int n, float *out, int with_sync) {
  __shared__ float part[32];
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) part[w] = v;
  if (with_sync) __syncthreads();
  if (w == 0) {
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) out[blockIdx.x] = v;
  }
}

/* Two block sums in a row through the same shared array; the barrier before the second
 * one's writes (the first one's readers may still be reading) is optional. */
__device__ float block_sum2(float v, float *part, int guard) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_sum(v);
  if (guard) __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
  return warp_sum(v);
}

__global__ void two_sums_kernel(float *out, int guard) {
  __shared__ float part[32];
  float a = block_sum2(1.0f, part, 1);
  float b = block_sum2(2.0f, part, guard);
  if (threadIdx.x == blockDim.x - 1) out[blockIdx.x] = a + b;
}

/* Lanes exchange through shared memory: out[lane] = smem[(lane + 1) % 32] * 2. */
__global__ void warp_exchange_kernel(float *out, int with_syncwarp) {
  __shared__ float s[32];
  int lane = threadIdx.x & 31;
  s[lane] = (float)lane;
  if (with_syncwarp) __syncwarp();
  float v = s[(lane + 1) % 32];
  v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[lane] = v;
}

/* Threads diverge onto two different __syncthreads. */
__global__ void divergent_barrier_kernel(float *out) {
  if (threadIdx.x < 64) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

/* Half the block returns early, the rest meets at one barrier: legal. */
__global__ void early_exit_barrier_kernel(float *out) {
  if (threadIdx.x >= 64) return;
  __shared__ float s[64];
  s[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

/* Lanes of one warp take different shuffles. */
__global__ void divergent_shuffle_kernel(float *out) {
  float v = (float)threadIdx.x;
  int lane = threadIdx.x & 31;
  if (lane < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else v = __shfl_down_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

/* Half a warp waits at __syncthreads, the other half at a __syncwarp naming the first half. */
__global__ void barrier_deadlock_kernel(float *out) {
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_forms_kernel(int *out) {
  int lane = threadIdx.x & 31;
  out[0 * 32 + lane] = __shfl_sync(0xffffffffu, lane * 10, 5);
  out[1 * 32 + lane] = __shfl_sync(0xffffffffu, lane * 10, lane + 3, 8);
  out[2 * 32 + lane] = __shfl_up_sync(0xffffffffu, lane * 10, 2, 8);
  out[3 * 32 + lane] = __shfl_down_sync(0xffffffffu, lane * 10, 3, 16);
  out[4 * 32 + lane] = __shfl_xor_sync(0xffffffffu, lane * 10, 4, 32);
  out[5 * 32 + lane] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
  out[6 * 32 + lane] = __all_sync(0xffffffffu, lane < 40) + 2 * __any_sync(0xffffffffu, lane == 7);
  out[7 * 32 + lane] = __syncthreads_count(lane & 1);
}

/* Lanes 16..31 exit, lanes 0..15 shuffle over the full mask reading from lanes 16..31. */
__global__ void exited_lane_shuffle_kernel(float *out) {
  int lane = threadIdx.x & 31;
  if (lane >= 16) return;
  out[lane] = __shfl_down_sync(0xffffffffu, 1.0f, 16);
}

__global__ void dyn_smem_kernel(float *out, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
  __syncthreads();
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += buf[n - 1 - i];
  v = warp_sum(v);
  __shared__ float part[32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) s += part[w];
    out[blockIdx.x] = s;
  }
}

__global__ void dyn_smem_overflow_kernel(float *out, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i <= n + 1024; i += blockDim.x) buf[i] = 1.0f;   /* past the end */
  out[0] = buf[0];
}

__global__ void big_static_smem_kernel(float *out) {
  __shared__ float big[13000];   /* 52,000 bytes: over the 48 KiB of static shared memory */
  big[threadIdx.x] = 1.0f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void fill_kernel(float *y, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = v + (float)i;
}

__global__ void fill_overrun_kernel(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) y[i] = 1.0f;   /* one element too many */
}

__global__ void read_overrun_kernel(const float *x, int n, float *out) {
  float s = 0;
  for (int i = 0; i < n + 4096; i++) s += x[i];
  out[0] = s;
}

__global__ void copy_kernel(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 2.0f;
}

__global__ void half_writer_kernel(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / 2) y[i] = 1.0f;   /* the bug: the upper half is never written */
}

/* Block b adds 1 to what block b - 1 wrote: assumes blocks run in order. */
__global__ void ordered_blocks_kernel(float *y) {
  if (threadIdx.x != 0) return;
  unsigned b = blockIdx.x;
  y[b] = b == 0 ? 1.0f : y[b - 1] + 1.0f;
}

template <typename T, int K>
__global__ void templ_kernel(T *y, T v) {
  y[threadIdx.x] = v * (T)K;
}

__global__ void collective_partial_kernel(float *out) {
  int lane = threadIdx.x & 31;
  if (lane < 31) emu::warp_collective("test::collective");
  out[lane] = 1;
}

__global__ void collective_ok_kernel(float *out) {
  int lane = threadIdx.x & 31;
  int arg = 7;
  emu::warp_collective("test::collective", &arg, sizeof arg);
  out[lane] = (float)emu::lane();
}

__global__ void collective_nonuniform_kernel(float *out) {
  int lane = threadIdx.x & 31;
  int arg = lane == 3 ? 8 : 7;
  emu::warp_collective("test::collective", &arg, sizeof arg);
  out[lane] = 1;
}

__global__ void heavy_kernel(float *y, int n) {
  __shared__ float s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? (float)i : 0.0f;
  for (int r = 0; r < 4; r++) {
    s[threadIdx.x] = v;
    __syncthreads();
    v = s[(threadIdx.x + 1) % blockDim.x] + warp_sum(v) * 0.0f;
    __syncthreads();
  }
  if (i < n) y[i] = v;
}

/* ---- helpers ------------------------------------------------------------------------ */

static std::vector<float> to_host(const float *d, size_t n) {
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}

static float *dev_from(const std::vector<float> &h) {
  float *d = nullptr;
  cudaMalloc((void **)&d, h.size() * sizeof(float));
  cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_reduction() {
  int B = 5, n = 1000;
  std::vector<float> h(B * n);
  for (int i = 0; i < B * n; i++) h[i] = (float)(i % 7) - 3.0f;
  float *x = dev_from(h), *out;
  cudaMalloc((void **)&out, B * sizeof(float));
  block_sum_kernel<<<B, 256>>>(x, n, out, 1);
  CHECK(cudaGetLastError() == cudaSuccess, "launch");
  std::vector<float> r = to_host(out, B);
  bool ok = true;
  for (int b = 0; b < B; b++) {
    double s = 0;
    for (int i = 0; i < n; i++) s += h[b * n + i];
    if (fabs(r[b] - s) > 1e-3) ok = false;
  }
  CHECK(ok, "reduction with __syncthreads: %g", r[0]);
  /* the missing __syncthreads: warp 0 reads the other warps' partials before they exist */
  block_sum_kernel<<<B, 256>>>(x, n, out, 0);
  r = to_host(out, B);
  CHECK(std::isnan(r[0]), "missing __syncthreads detected (result is NaN): got %g", r[0]);
  cudaFree(x);
  cudaFree(out);
}

static void test_missing_barrier_war() {
  float *out;
  cudaMalloc((void **)&out, 4 * sizeof(float));
  two_sums_kernel<<<4, 256>>>(out, 0);
  std::vector<float> r = to_host(out, 4);
  CHECK(r[0] != 768.0f, "missing __syncthreads before shared memory is rewritten detected: %g", r[0]);
  two_sums_kernel<<<4, 256>>>(out, 1);
  r = to_host(out, 4);
  CHECK(r[0] == 768.0f && r[3] == 768.0f, "with the barrier: %g", r[0]);
  cudaFree(out);
}

static void test_missing_syncwarp() {
  float *out;
  cudaMalloc((void **)&out, 32 * sizeof(float));
  warp_exchange_kernel<<<1, 32>>>(out, 0);
  std::vector<float> r = to_host(out, 32);
  int bad = 0;
  for (float v : r) bad += std::isnan(v);
  CHECK(bad > 0, "missing __syncwarp before the shuffle detected (%d NaN lanes)", bad);
  warp_exchange_kernel<<<1, 32>>>(out, 1);
  r = to_host(out, 32);
  bool ok = true;
  for (int l = 0; l < 32; l++) ok &= r[l] == (float)(((l ^ 1) + 1) % 32);
  CHECK(ok, "with __syncwarp: lane 0 got %g", r[0]);
  cudaFree(out);
}

static void test_divergence() {
  float *out;
  cudaMalloc((void **)&out, 256 * sizeof(float));
  divergent_barrier_kernel<<<1, 128>>>(out);
  cudaError_t e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure, "two __syncthreads sites: %s", cudaGetErrorName(e));
  CHECK(reported("divergence") && reported("divergent_barrier_kernel"), "report names the kernel: %s", emu::last_report());
  CHECK(cudaMalloc((void **)&out, 4) == cudaErrorLaunchFailure, "the error is sticky");
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure && cudaGetLastError() == cudaErrorLaunchFailure,
        "cudaGetLastError keeps returning a sticky error");
  emu::test_reset();

  cudaMalloc((void **)&out, 256 * sizeof(float));
  divergent_shuffle_kernel<<<1, 64>>>(out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure && reported("divergence in warp"), "shuffles from divergent branches: %s / %s",
        cudaGetErrorName(e), emu::last_report());
  emu::test_reset();

  cudaMalloc((void **)&out, 256 * sizeof(float));
  barrier_deadlock_kernel<<<1, 32>>>(out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure && reported("deadlock") && reported("__syncthreads") && reported("__syncwarp"),
        "__syncwarp against __syncthreads: %s", emu::last_report());
  emu::test_reset();

  cudaMalloc((void **)&out, 256 * sizeof(float));
  early_exit_barrier_kernel<<<1, 128>>>(out);
  e = cudaDeviceSynchronize();
  std::vector<float> r = to_host(out, 64);
  CHECK(e == cudaSuccess && r[0] == 63 && r[63] == 0, "exited threads do not hold a barrier: %s %g", cudaGetErrorName(e), r[0]);

  collective_partial_kernel<<<1, 32>>>(out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure && reported("test::collective"), "warp_collective with a lane missing: %s",
        emu::last_report());
  emu::test_reset();
  cudaMalloc((void **)&out, 256 * sizeof(float));
  collective_nonuniform_kernel<<<1, 32>>>(out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure && reported("other arguments"), "warp_collective with a non-uniform argument: %s",
        emu::last_report());
  emu::test_reset();
  cudaMalloc((void **)&out, 256 * sizeof(float));
  collective_ok_kernel<<<1, 64>>>(out);
  r = to_host(out, 32);
  CHECK(cudaGetLastError() == cudaSuccess && r[5] == 5, "warp_collective of a full warp: %g", r[5]);
  cudaFree(out);
}

static void test_shuffles() {
  int *out;
  cudaMalloc((void **)&out, 8 * 32 * sizeof(int));
  shuffle_forms_kernel<<<1, 32>>>(out);
  std::vector<int> r(8 * 32);
  cudaMemcpy(r.data(), out, r.size() * sizeof(int), cudaMemcpyDeviceToHost);
  int bad = 0;
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++) if (l % 3 == 0) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    int seg8 = l & ~7, seg16 = l & ~15;
    bad += r[0 * 32 + l] != 50;
    bad += r[1 * 32 + l] != (seg8 + (l + 3) % 8) * 10;
    bad += r[2 * 32 + l] != ((l - seg8) >= 2 ? (l - 2) * 10 : l * 10);
    bad += r[3 * 32 + l] != ((l - seg16) + 3 < 16 ? (l + 3) * 10 : l * 10);
    bad += r[4 * 32 + l] != (l ^ 4) * 10;
    bad += (unsigned)r[5 * 32 + l] != ballot;
    bad += r[6 * 32 + l] != 3;
    bad += r[7 * 32 + l] != 16;
  }
  CHECK(bad == 0, "shuffle/vote forms as the Programming Guide defines them: %d wrong (e.g. %d %d %d)", bad, r[32], r[64],
        r[96]);
  cudaFree(out);
  float *f;
  cudaMalloc((void **)&f, 32 * sizeof(float));
  exited_lane_shuffle_kernel<<<1, 32>>>(f);
  std::vector<float> h = to_host(f, 16);
  CHECK(std::isnan(h[0]), "reading an exited lane gives NaN (undefined in CUDA): %g", h[0]);
  cudaFree(f);
}

static void test_dynamic_smem() {
  int n = 20000;   /* 80,000 bytes: above the 48 KiB default */
  float *out;
  cudaMalloc((void **)&out, 4 * sizeof(float));
  size_t bytes = n * sizeof(float);
  dyn_smem_kernel<<<4, 256, bytes>>>(out, n);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "above 48 KiB without the opt-in is refused");
  CHECK(cudaGetLastError() == cudaSuccess, "a launch error is not sticky");
  CHECK(cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448 + 1) ==
            cudaErrorInvalidValue, "the opt-in stops at 227 KiB");
  cudaGetLastError();
  CHECK(cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess, "opt in");
  dyn_smem_kernel<<<4, 256, bytes>>>(out, n);
  CHECK(cudaGetLastError() == cudaSuccess, "launch with the opt-in");
  std::vector<float> r = to_host(out, 4);
  double s = (double)n * (n - 1) / 2;
  CHECK(fabs(r[0] - s) / s < 1e-5 && fabs(r[3] - s) / s < 1e-5, "dynamic shared memory: %g vs %g", r[0], s);
  cudaFuncSetAttribute(dyn_smem_overflow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  dyn_smem_overflow_kernel<<<1, 256, bytes>>>(out, n);
  cudaError_t e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress && reported("dynamic shared memory"), "dynamic shared memory overrun: %s / %s",
        cudaGetErrorName(e), emu::last_report());
  emu::test_reset();
  cudaMalloc((void **)&out, 32 * sizeof(float));
  big_static_smem_kernel<<<1, 32>>>(out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorLaunchFailure && reported("static __shared__"), "static shared memory over 48 KiB: %s / %s",
        cudaGetErrorName(e), emu::last_report());
  emu::test_reset();
}

static void test_launch_limits() {
  float *y;
  cudaMalloc((void **)&y, 4096 * sizeof(float));
  fill_kernel<<<1, 1025>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block refused");
  fill_kernel<<<1, dim3(32, 32, 2)>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "32x32x2 threads refused");
  fill_kernel<<<1, dim3(1, 1, 65)>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block z 65 refused");
  fill_kernel<<<dim3(1, 65536), 32>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y 65536 refused");
  fill_kernel<<<dim3(1, 1, 65536), 32>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid z 65536 refused");
  fill_kernel<<<0, 32>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid refused");
  fill_kernel<<<4, 1024>>>(y, 4096, 1.0f);
  CHECK(cudaGetLastError() == cudaSuccess, "1024 threads accepted");
  std::vector<float> r = to_host(y, 4096);
  CHECK(r[4095] == 4096.0f, "after refused launches the device still works: %g", r[4095]);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaStreamDestroy(s);
  fill_kernel<<<1, 32, 0, s>>>(y, 10, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "launch on a destroyed stream refused");
  cudaFree(y);
}

static void test_streams() {
  int n = 4096;
  float *a, *b;
  cudaMalloc((void **)&a, n * sizeof(float));
  cudaMalloc((void **)&b, n * sizeof(float));
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  /* the bug: s2 reads what s1 writes without waiting for it */
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 1.0f);
  copy_kernel<<<n / 256, 256, 0, s2>>>(a, b, n);
  cudaStreamSynchronize(s2);
  std::vector<float> h(n);
  cudaMemcpy(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  CHECK(std::isnan(h[0]) && std::isnan(h[n - 1]), "missing cudaStreamWaitEvent detected: b[0] = %g", h[0]);
  cudaDeviceSynchronize();
  /* the fix: an event recorded on s1, waited for on s2 */
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 2.0f);
  cudaEventRecord(ev, s1);
  cudaStreamWaitEvent(s2, ev, 0);
  copy_kernel<<<n / 256, 256, 0, s2>>>(a, b, n);
  cudaStreamSynchronize(s2);
  cudaMemcpy(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  CHECK(h[0] == 4.0f && h[n - 1] == 2.0f * (2.0f + n - 1), "with the event wait: b[0] = %g", h[0]);
  /* a buffer rewritten on s1 while s2 still reads it (no wait back): s2 sees the new value */
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 0.0f);
  cudaEventRecord(ev, s1);
  cudaStreamWaitEvent(s2, ev, 0);
  copy_kernel<<<n / 256, 256, 0, s2>>>(a, b, n);       /* reads a */
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 100.0f);  /* overwrites a: needs a wait on s2 first */
  cudaStreamSynchronize(s1);
  cudaStreamSynchronize(s2);
  cudaMemcpy(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  CHECK(h[0] == 200.0f, "write-after-read across streams without a wait detected: b[0] = %g (want the racy 200)", h[0]);
  /* host read before the sync: the pinned destination still holds its old bytes */
  float *pin;
  cudaHostAlloc((void **)&pin, n * sizeof(float), cudaHostAllocDefault);
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 5.0f);
  cudaMemcpyAsync(pin, a, n * sizeof(float), cudaMemcpyDeviceToHost, s1);
  CHECK(std::isnan(pin[0]), "a host read before the sync sees nothing: %g", pin[0]);
  cudaStreamSynchronize(s1);
  CHECK(pin[0] == 5.0f, "after the sync: %g", pin[0]);
  /* pinned source read when the copy runs, pageable source when the call is made */
  std::vector<float> page(n, 1.0f);
  for (int i = 0; i < n; i++) pin[i] = 1.0f;
  cudaMemcpyAsync(a, pin, n * sizeof(float), cudaMemcpyHostToDevice, s1);
  cudaMemcpyAsync(b, page.data(), n * sizeof(float), cudaMemcpyHostToDevice, s1);
  pin[0] = 7.0f;
  page[0] = 7.0f;
  cudaStreamSynchronize(s1);
  std::vector<float> ha = to_host(a, 1), hb = to_host(b, 1);
  CHECK(ha[0] == 7.0f && hb[0] == 1.0f, "pinned read late (%g), pageable staged (%g)", ha[0], hb[0]);
  /* events */
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0, s1);
  fill_kernel<<<n / 256, 256, 0, s1>>>(a, n, 5.0f);
  cudaEventRecord(t1, s1);
  CHECK(cudaEventQuery(t1) == cudaErrorNotReady, "deferred work is not ready");
  CHECK(cudaEventQuery(t1) == cudaSuccess, "a polling loop ends");
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 0, "elapsed time %g", ms);
  CHECK(cudaEventElapsedTime(&ms, t0, ev) == cudaErrorInvalidResourceHandle, "no timing on a DisableTiming event");
  cudaGetLastError();
  /* cudaMemcpyPeerAsync on one device */
  cudaMemcpyPeerAsync(b, 0, a, 0, n * sizeof(float), s1);
  cudaStreamSynchronize(s1);
  hb = to_host(b, 1);
  CHECK(hb[0] == 5.0f, "cudaMemcpyPeerAsync: %g", hb[0]);
  cudaMemsetAsync(b, 0, n * sizeof(float), s1);
  cudaStreamSynchronize(s1);
  hb = to_host(b, 1);
  CHECK(hb[0] == 0.0f, "cudaMemsetAsync: %g", hb[0]);
  CHECK(cudaMemcpyAsync(b, a, (n + 1) * sizeof(float), cudaMemcpyDeviceToDevice, s1) == cudaErrorInvalidValue,
        "a copy past an allocation is refused");
  cudaGetLastError();
  cudaEventDestroy(ev);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFreeHost(pin);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(a);
  cudaFree(b);
}

/* The issue's write-after-read: s2 copies a into b, s1 then zeroes a without waiting for s2,
 * and s2 queues one more, unrelated, op. b[0] is 1 when the copy ran first, 0 when the
 * memset did (the race). `device_sync`: the host waits for the device, else for s2. */
static float war_after_later_work(bool with_wait, bool device_sync) {
  float *a, *b, *c;
  cudaMalloc((void **)&a, 256 * sizeof(float));
  cudaMalloc((void **)&b, 256 * sizeof(float));
  cudaMalloc((void **)&c, 256 * sizeof(float));
  fill_kernel<<<1, 256>>>(a, 1, 1.0f);
  cudaDeviceSynchronize();
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaMemcpyAsync(b, a, sizeof(float), cudaMemcpyDeviceToDevice, s2);
  if (with_wait) {
    cudaEventRecord(ev, s2);
    cudaStreamWaitEvent(s1, ev, 0);
  }
  cudaMemsetAsync(a, 0, sizeof(float), s1);
  cudaMemsetAsync(c, 0, sizeof(float), s2);   /* unrelated: makes s2 the newest stream */
  if (device_sync) cudaDeviceSynchronize();
  else cudaStreamSynchronize(s2);
  float r = to_host(b, 1)[0];
  cudaDeviceSynchronize();
  cudaEventDestroy(ev);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return r;
}

static void test_drain_orders() {
  emu::set_drain_seed(0);
  CHECK(war_after_later_work(false, true) == 1.0f, "newest first alone misses the race (the blind spot the seeds close)");
  bool device_shown = false, stream_shown = false, fixed = true;
  for (unsigned long long seed = 1; seed <= 6; seed++) {
    emu::set_drain_seed(seed);
    device_shown |= war_after_later_work(false, true) == 0.0f;
    stream_shown |= war_after_later_work(false, false) == 0.0f;
    fixed &= war_after_later_work(true, true) == 1.0f && war_after_later_work(true, false) == 1.0f;
  }
  emu::set_drain_seed(0);
  CHECK(device_shown, "a drain seed shows the write-after-read at a device sync");
  CHECK(stream_shown, "a drain seed shows it at a sync of the reader's stream");
  CHECK(fixed, "with the event wait every order gives the copy the old value");
}

static void test_legacy_stream() {
  int n = 1024;
  float *a, *b;
  cudaMalloc((void **)&a, n * sizeof(float));
  cudaMalloc((void **)&b, n * sizeof(float));
  cudaStream_t blocking;
  cudaStreamCreate(&blocking);
  fill_kernel<<<n / 256, 256, 0, blocking>>>(a, n, 3.0f);
  copy_kernel<<<n / 256, 256>>>(a, b, n);   /* legacy stream: waits for the blocking stream */
  std::vector<float> h = to_host(b, 1);
  CHECK(h[0] == 6.0f, "the legacy default stream orders a blocking stream: %g", h[0]);
  cudaStreamDestroy(blocking);
  cudaFree(a);
  cudaFree(b);
}

static void test_memory_bugs() {
  int n = 1024;   /* 4096 bytes: the guard page is right behind the end */
  float *y;
  cudaMalloc((void **)&y, n * sizeof(float));
  fill_overrun_kernel<<<n / 256 + 1, 256>>>(y, n);
  cudaError_t e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress && reported("past the end") && reported("fill_overrun_kernel"),
        "a write past an allocation (guard page): %s / %s", cudaGetErrorName(e), emu::last_report());
  emu::test_reset();
  n = 1000;       /* 4000 bytes: inside the alignment slack, caught by the canary */
  cudaMalloc((void **)&y, n * sizeof(float));
  fill_overrun_kernel<<<n / 256 + 1, 256>>>(y, n);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress && reported("past the end") && reported("fill_overrun_kernel"),
        "a write past an allocation (canary): %s / %s", cudaGetErrorName(e), emu::last_report());
  emu::test_reset();
  float *out;
  cudaMalloc((void **)&y, n * sizeof(float));
  cudaMalloc((void **)&out, sizeof(float));
  read_overrun_kernel<<<1, 1>>>(y, n, out);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress && reported("invalid read"), "a read past an allocation: %s / %s", cudaGetErrorName(e),
        emu::last_report());
  emu::test_reset();
  /* an unwritten output is NaN */
  cudaMalloc((void **)&y, n * sizeof(float));
  half_writer_kernel<<<(n + 255) / 256, 256>>>(y, n);
  std::vector<float> h = to_host(y, n);
  CHECK(h[0] == 1.0f && std::isnan(h[n - 1]), "an unwritten output element is NaN: %g", h[n - 1]);
  /* use after cudaFree */
  float *z;
  cudaMalloc((void **)&z, n * sizeof(float));
  cudaFree(z);
  fill_kernel<<<1, 32>>>(z, 32, 0.0f);
  e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress && reported("use after cudaFree"), "use after cudaFree: %s", emu::last_report());
  emu::test_reset();
  /* host code touching device memory dies with a report (in a child process) */
  cudaMalloc((void **)&y, n * sizeof(float));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stderr);
    volatile float v = y[3];
    (void)v;
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "host read of device memory aborts (status %d)", st);
  CHECK(cudaPointerGetAttributes(nullptr, y) == cudaErrorInvalidValue, "cudaPointerGetAttributes(NULL)");
  cudaGetLastError();
  cudaPointerAttributes pa;
  CHECK(cudaPointerGetAttributes(&pa, y + 5) == cudaSuccess && pa.type == cudaMemoryTypeDevice && pa.device == 0,
        "device pointer attributes");
  int local = 0;
  CHECK(cudaPointerGetAttributes(&pa, &local) == cudaSuccess && pa.type == cudaMemoryTypeUnregistered, "pageable");
  CHECK(cudaFree(y + 1) == cudaErrorInvalidValue, "cudaFree of an interior pointer");
  cudaGetLastError();
  cudaFree(y);
  CHECK(cudaFree(y) == cudaErrorInvalidValue, "double cudaFree");
  cudaGetLastError();
  CHECK(emu::is_device_range(nullptr, 4) == false, "is_device_range(NULL)");
}

static void test_block_order() {
  int n = 64;
  float *y;
  cudaMalloc((void **)&y, n * sizeof(float));
  emu::set_block_order(0, 0);
  cudaMemset(y, 0xFF, n * sizeof(float));
  ordered_blocks_kernel<<<n, 32>>>(y);
  std::vector<float> h = to_host(y, n);
  CHECK(h[n - 1] == (float)n, "forward order: %g", h[n - 1]);
  emu::set_block_order(2, 1);
  cudaMemset(y, 0xFF, n * sizeof(float));
  ordered_blocks_kernel<<<n, 32>>>(y);
  h = to_host(y, n);
  int wrong = 0;
  for (int i = 0; i < n; i++) wrong += h[i] != (float)(i + 1);
  CHECK(wrong > 0, "a kernel assuming an order between blocks fails when shuffled (%d wrong)", wrong);
  emu::set_block_order(1, 0);
  cudaMemset(y, 0xFF, n * sizeof(float));
  ordered_blocks_kernel<<<n, 32>>>(y);
  h = to_host(y, n);
  CHECK(std::isnan(h[n - 1]) || h[n - 1] != (float)n, "reverse order: %g", h[n - 1]);
  emu::set_block_order(2, 1);
  cudaFree(y);
}

/* The knobs for a smaller device: SHARD_EMU_SMS sets the SM count, SHARD_EMU_MAX_GRID_Y the grid's
 * y limit, which launches are held to (run.sh runs this test with and without them). */
static void test_device_knobs() {
  const char *sms = getenv("SHARD_EMU_SMS"), *gy = getenv("SHARD_EMU_MAX_GRID_Y");
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  CHECK(p.multiProcessorCount == (sms ? atoi(sms) : 132), "SM count %d (SHARD_EMU_SMS=%s)", p.multiProcessorCount, sms ? sms : "");
  CHECK(p.maxGridSize[1] == (gy ? atoi(gy) : 65535), "grid y limit %d (SHARD_EMU_MAX_GRID_Y=%s)", p.maxGridSize[1], gy ? gy : "");
  float *y;
  cudaMalloc((void **)&y, sizeof(float));
  fill_kernel<<<dim3(1, p.maxGridSize[1] + 1), 1>>>(y, 1, 0.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y %d refused", p.maxGridSize[1] + 1);
  fill_kernel<<<dim3(1, p.maxGridSize[1]), 1>>>(y, 1, 0.0f);
  CHECK(cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "grid y %d runs", p.maxGridSize[1]);
  cudaFree(y);
}

static void test_misc() {
  int n = 0;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n >= 1, "device count %d", n);
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0) == cudaSuccess, "properties");
  CHECK(p.major == 9 && p.minor == 0 && p.sharedMemPerBlockOptin == 232448 &&
            p.warpSize == 32 && p.maxThreadsPerBlock == 1024 && p.totalGlobalMem >= (size_t)80e9,
        "an H100's properties (%s)", p.name);
  CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice, "cudaSetDevice past the count");
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess, "last error resets");
  size_t fr, tot;
  CHECK(cudaMemGetInfo(&fr, &tot) == cudaSuccess && fr <= tot, "mem info");
  emu::reset_counters();
  float *y;
  cudaMalloc((void **)&y, 256 * sizeof(float));
  templ_kernel<float, 3><<<1, 256>>>(y, 2.0f);
  templ_kernel<float, 3>
      <<<1,
         256>>>(y,
                2.0f);
  int ran = 0;
  emu::enqueue(0, "test::host work", [&ran] { ran++; });
  CHECK(ran == 0, "library work is deferred");
  std::vector<float> h = to_host(y, 256);
  CHECK(ran == 1 && h[255] == 6.0f, "template and multi-line launches: %g", h[255]);
  cudaFree(y);
  emu::counters c = emu::get_counters();
  CHECK(c.mallocs == 1 && c.frees == 1 && c.launches == 2 && c.library_calls == 1 && c.host_syncs == 1,
        "counters: %ld mallocs %ld frees %ld launches %ld syncs %ld library calls", c.mallocs, c.frees, c.launches,
        c.host_syncs, c.library_calls);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaStreamDestroy(s);
  CHECK(emu::enqueue(s, "x", [] {}) == cudaErrorInvalidResourceHandle, "enqueue on a destroyed stream");
  cudaGetLastError();
  CHECK(!emu::in_kernel() && emu::lane() == -1 && !strcmp(emu::kernel_name(), "host"), "device hooks on the host");
  emu::fail_async(cudaErrorLaunchFailure, "test failure");
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "fail_async is sticky");
  emu::test_reset();
}

static void test_speed() {
  int n = 256 * 512;
  float *y;
  cudaMalloc((void **)&y, n * sizeof(float));
  auto t0 = std::chrono::steady_clock::now();
  heavy_kernel<<<n / 256, 256>>>(y, n);
  fill_kernel<<<n / 256, 256>>>(y, n, 0.0f);
  cudaDeviceSynchronize();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> h = to_host(y, 1);
  printf("# speed: %d threads with 8 barriers + 5 shuffles each, then %d plain threads: %.0f ms\n", n, n, ms);
  CHECK(h[0] == 0.0f && ms < 20000, "speed");
  cudaFree(y);
}

int main() {
  emu::set_eager(false);   /* the adversarial schedule is what these tests are about */
  emu::set_thread_order(false);
  emu::set_block_order(2, 1);
  test_reduction();
  test_missing_barrier_war();
  test_missing_syncwarp();
  test_divergence();
  test_shuffles();
  test_dynamic_smem();
  test_launch_limits();
  test_streams();
  test_drain_orders();
  test_legacy_stream();
  test_memory_bugs();
  test_block_order();
  test_device_knobs();
  test_misc();
  test_speed();
  return check_summary("test_emu_core");
}
