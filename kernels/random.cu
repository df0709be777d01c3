/* random.cu: Philox normal/uniform fills and arange on CUDA (the random family; dropout, which
 * draws from the same stream, is activation.cu's). The draws come from
 * runtime/core/philox_internal.h, compiled here for the device: element i in row-major order
 * of the target's shape takes counter offset + i, with the same f32 math as
 * runtime/cpu/random.c, so CUDA and CPU produce the same numbers (to the last bit in f32, up
 * to the device's sqrtf/logf/sincos rounding). */
#include "common.cuh"
#include "core/backend_internal.h"
#include "core/philox_internal.h"

enum { RNG_THREADS = 256, RNG_NORMAL = 0, RNG_UNIFORM = 1 };

struct rng_view { int ndim; int64_t shape[SH_MAX_DIMS], stride[SH_MAX_DIMS]; };

__global__ void random_fill_kernel(char *base, int dtype, rng_view v, int64_t n, uint64_t seed, uint64_t offset,
                                   float a, float b, int kind) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t off = 0, rest = i;
    for (int d = v.ndim - 1; d >= 0; d--) { off += (rest % v.shape[d]) * v.stride[d]; rest /= v.shape[d]; }
    float r = kind == RNG_NORMAL ? a + b * sh_philox_normal(seed, offset, (uint64_t)i)
                                 : a + (b - a) * sh_philox_uniform(seed, offset, (uint64_t)i);
    ew_store<float>(base, dtype, off, r);
  }
}

static int random_fill(const char *op, sh_tensor *t, uint64_t seed, uint64_t offset, double a, double b, int kind) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, t->device, &st));
  int64_t n = sh_tensor_numel(t);
  if (n == 0) return SH_OK;
  rng_view v;
  memset(&v, 0, sizeof v);
  v.ndim = t->ndim;
  memcpy(v.shape, t->shape, sizeof v.shape);
  memcpy(v.stride, t->stride, sizeof v.stride);
  random_fill_kernel<<<sh_blocks(n, RNG_THREADS), RNG_THREADS, 0, st>>>((char *)sh_tensor_data(t), t->dtype, v, n, seed,
                                                                       offset, (float)a, (float)b, kind);
  CU_LAUNCHED(op);
  return SH_OK;
}

extern "C" int sh_kcuda_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  return random_fill("normal_", t, seed, offset, mean, std, RNG_NORMAL);
}

extern "C" int sh_kcuda_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  return random_fill("uniform_", t, seed, offset, low, high, RNG_UNIFORM);
}

/* ---- arange -------------------------------------------------------------------------------- */

__global__ void arange_kernel(char *base, int dtype, int64_t n, double start, double step) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    ew_store<double>(base, dtype, i, start + (double)i * step);
}

extern "C" int sh_kcuda_arange(sh_tensor *out, double start, double step) {
  const char *op = "arange";
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, out->device, &st));
  int64_t n = out->shape[0];
  if (n == 0) return SH_OK;
  arange_kernel<<<sh_blocks(n, RNG_THREADS), RNG_THREADS, 0, st>>>((char *)sh_tensor_data(out), out->dtype, n, start, step);
  CU_LAUNCHED(op);
  return SH_OK;
}
