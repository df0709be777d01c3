/* lib_wmma.cu: the emulator's nvcuda::wmma (include/mma.h). Tile products for every layout
 * combination, shape and input type against a double reference; uniform element-wise work on
 * fragments; several warps of one block at once (attention's shape); and the rules the CUDA
 * Programming Guide sets, each shown DETECTED by a buggy kernel and passing when fixed: a lane
 * missing from a _sync call, a pointer that is not 256-bit aligned, an ldm that is not a multiple
 * of 16 bytes, arguments that differ between lanes, a fragment used before anything filled it.
 * Compiled through the emulator's rewrite like the kernels. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "emu_test.h"
#include "tests/lib_check.h"

using namespace nvcuda;

static bool reported(const char *needle) { return strstr(emu::last_report(), needle) != nullptr; }

/* D = A B + C for one M x N x K tile. A: row- or col-major with lda; B likewise; C loaded with
 * layout lc, D stored with layout ld_out (0 row, 1 col); ldm of C and D: ldc. */
template <int M, int N, int K, typename T, typename LA, typename LB>
__global__ void tile_kernel(const T *A, int lda, const T *B, int ldb, const float *C, float *D, int ldc, int c_col, int d_col) {
  wmma::fragment<wmma::matrix_a, M, N, K, T, LA> a;
  wmma::fragment<wmma::matrix_b, M, N, K, T, LB> b;
  wmma::fragment<wmma::accumulator, M, N, K, float> c;
  wmma::load_matrix_sync(a, A, lda);
  wmma::load_matrix_sync(b, B, ldb);
  wmma::load_matrix_sync(c, C, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(D, c, ldc, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

/* Loads C, doubles every element of the fragment, adds 1, stores. */
__global__ void elementwise_kernel(const float *C, float *D) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::load_matrix_sync(c, C, 16, wmma::mem_row_major);
  for (int i = 0; i < c.num_elements; i++) c.x[i] = c.x[i] * 2.0f + 1.0f;
  wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

/* Four warps, each D_w = A_w B_w with its own tiles in shared memory (attention's layout:
 * tiles of 16 rows per warp, ld 24, accumulator from fill_fragment). */
__global__ void four_warps_kernel(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D) {
  __shared__ __align__(128) __nv_bfloat16 as[64 * 24];
  __shared__ __align__(128) __nv_bfloat16 bs[64 * 24];
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
    as[(i / 16) * 24 + i % 16] = A[i];
    bs[(i / 16) * 24 + i % 16] = B[i];
  }
  __syncthreads();
  int w = threadIdx.x / 32;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, as + 16 * w * 24, 24);
  wmma::load_matrix_sync(b, bs + 16 * w * 24, 24);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(D + 256 * w, c, 16, wmma::mem_row_major);
}

/* Bug: only lanes < 16 reach mma_sync (mode 0), or all do (mode 1). */
__global__ void divergent_mma_kernel(const __nv_bfloat16 *A, float *D, int fixed) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, A, 16);
  wmma::load_matrix_sync(b, A, 16);
  if (fixed || threadIdx.x < 16) wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

/* Bug: the pointer is offset by `off` elements (misaligned) / ldm is `ldm`. */
__global__ void load_args_kernel(const __nv_bfloat16 *A, int off, int ldm, float *D) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, A + off, ldm);
  D[threadIdx.x] = __bfloat162float(a.x[0]);
}

/* Bug: each lane passes its own pointer (mode 0); all pass the same one (mode 1). */
__global__ void nonuniform_kernel(const __nv_bfloat16 *A, float *D, int fixed) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, A + (fixed ? 0 : 16 * (threadIdx.x % 2)), 16);
  D[threadIdx.x] = __bfloat162float(a.x[0]);
}

/* Bug: the accumulator is never filled (mode 0) / filled with zeros (mode 1). */
__global__ void unfilled_kernel(const __nv_bfloat16 *A, float *D, int fixed) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  if (fixed) wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, A, 16);
  wmma::load_matrix_sync(b, A, 16);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

/* A filled accumulator stored with leading dimension ldm. */
__global__ void acc_store_kernel(float *D, int ldm) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 1.0f);
  wmma::store_matrix_sync(D, c, ldm, wmma::mem_row_major);
}

template <typename T> static T to_t(float v);
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __half to_t<__half>(float v) { return __float2half_rn(v); }
template <typename T> static double to_d(T v);
template <> double to_d<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> double to_d<__half>(__half v) { return __half2float(v); }

template <typename T> static T *dev_copy(const std::vector<T> &h) {
  T *d;
  cudaMalloc((void **)&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

static std::mt19937 rng(2024);
static float uni() { return std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng); }

/* One tile product with the given layouts; returns the number of elements off the reference. */
template <int M, int N, int K, typename T, typename LA, typename LB>
static int run_tile(int c_col, int d_col, const char *what) {
  const bool a_col = std::is_same<LA, wmma::col_major>::value, b_col = std::is_same<LB, wmma::col_major>::value;
  /* Padded leading dimensions that keep every row aligned to its fragment (the PTX rule):
   * a multiple of 16 elements for A and B, of 8 floats for C and D. */
  const int lda = ((a_col ? M : K) + 31) / 16 * 16, ldb = ((b_col ? K : N) + 31) / 16 * 16, ldc = (N > M ? N : M) + 8;
  std::vector<T> A((size_t)lda * (a_col ? K : M)), B((size_t)ldb * (b_col ? N : K));
  for (auto &x : A) x = to_t<T>(uni());
  for (auto &x : B) x = to_t<T>(uni());
  std::vector<float> C((size_t)ldc * (N > M ? N : M) + 64);
  for (auto &x : C) x = uni();
  auto a_at = [&](int i, int k) { return to_d(A[a_col ? (size_t)k * lda + i : (size_t)i * lda + k]); };
  auto b_at = [&](int k, int j) { return to_d(B[b_col ? (size_t)j * ldb + k : (size_t)k * ldb + j]); };
  auto c_at = [&](int i, int j) { return (double)C[c_col ? (size_t)j * ldc + i : (size_t)i * ldc + j]; };
  T *dA = dev_copy(A), *dB = dev_copy(B);
  float *dC = dev_copy(C), *dD;
  cudaMalloc((void **)&dD, C.size() * sizeof(float));
  tile_kernel<M, N, K, T, LA, LB><<<1, 32>>>(dA, lda, dB, ldb, dC, dD, ldc, c_col, d_col);
  std::vector<float> D(C.size());
  cudaError_t e = cudaMemcpy(D.data(), dD, D.size() * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = e == cudaSuccess ? 0 : M * N;
  for (int i = 0; i < M && e == cudaSuccess; i++)
    for (int j = 0; j < N; j++) {
      double ref = c_at(i, j), mag = std::fabs(ref);
      for (int k = 0; k < K; k++) {
        ref += a_at(i, k) * b_at(k, j);
        mag += std::fabs(a_at(i, k) * b_at(k, j));
      }
      double got = D[d_col ? (size_t)j * ldc + i : (size_t)i * ldc + j];
      if (!(std::fabs(got - ref) <= 1e-6 * mag + 1e-30)) {   /* f32 accumulation of K exact products */
        if (bad < 3) printf("  %s: D[%d][%d] = %.9g, reference %.9g\n", what, i, j, got, ref);
        bad++;
      }
    }
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
  cudaFree(dD);
  return bad;
}

template <int M, int N, int K, typename T> static void all_layouts(const char *name) {
  int bad = 0;
  for (int cc = 0; cc < 2; cc++)
    for (int dc = 0; dc < 2; dc++) {
      bad += run_tile<M, N, K, T, wmma::row_major, wmma::row_major>(cc, dc, name);
      bad += run_tile<M, N, K, T, wmma::row_major, wmma::col_major>(cc, dc, name);
      bad += run_tile<M, N, K, T, wmma::col_major, wmma::row_major>(cc, dc, name);
      bad += run_tile<M, N, K, T, wmma::col_major, wmma::col_major>(cc, dc, name);
    }
  CHECK(bad == 0, "%s: %d elements off the double reference over 16 layout combinations", name, bad);
}

int main() {
  all_layouts<16, 16, 16, __nv_bfloat16>("bf16 16x16x16");
  all_layouts<16, 16, 16, __half>("f16 16x16x16");
  all_layouts<32, 8, 16, __nv_bfloat16>("bf16 32x8x16");
  all_layouts<8, 32, 16, __half>("f16 8x32x16");

  /* Uniform element-wise operations reach every element exactly once. */
  {
    std::vector<float> C(256);
    for (auto &x : C) x = uni();
    float *dC = dev_copy(C), *dD;
    cudaMalloc((void **)&dD, 256 * 4);
    elementwise_kernel<<<1, 32>>>(dC, dD);
    std::vector<float> D(256);
    cudaMemcpy(D.data(), dD, 256 * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += D[i] != C[i] * 2.0f + 1.0f;
    CHECK(bad == 0, "element-wise x[i] = 2 x[i] + 1 over num_elements: %d elements wrong", bad);
    cudaFree(dC);
    cudaFree(dD);
  }

  /* Four warps of one block, each its own product. */
  {
    std::vector<__nv_bfloat16> A(64 * 16), B(64 * 16);
    for (auto &x : A) x = to_t<__nv_bfloat16>(uni());
    for (auto &x : B) x = to_t<__nv_bfloat16>(uni());
    __nv_bfloat16 *dA = dev_copy(A), *dB = dev_copy(B);
    float *dD;
    cudaMalloc((void **)&dD, 4 * 256 * 4);
    four_warps_kernel<<<1, 128>>>(dA, dB, dD);
    std::vector<float> D(4 * 256);
    cudaError_t e = cudaMemcpy(D.data(), dD, D.size() * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int w = 0; w < 4; w++)
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
          double ref = 0, mag = 0;
          for (int k = 0; k < 16; k++) {
            double p = to_d(A[(16 * w + i) * 16 + k]) * to_d(B[(16 * w + j) * 16 + k]);   /* B col-major: column j at row 16w + j */
            ref += p;
            mag += std::fabs(p);
          }
          if (!(std::fabs(D[256 * w + i * 16 + j] - ref) <= 1e-6 * mag + 1e-30)) bad++;
        }
    CHECK(e == cudaSuccess && bad == 0, "four warps in one block: %s, %d elements wrong", cudaGetErrorName(e), bad);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
  }

  /* Detection: each bug, then its fix. */
  std::vector<__nv_bfloat16> A(512);
  for (auto &x : A) x = to_t<__nv_bfloat16>(uni());
  __nv_bfloat16 *dA = dev_copy(A);
  float *dD;
  cudaMalloc((void **)&dD, 1024 * 4);
  {
    divergent_mma_kernel<<<1, 32>>>(dA, dD, 0);
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("wmma::mma_sync") && reported("divergent_mma_kernel"),
          "mma_sync reached by half the warp is reported: %s / %s", cudaGetErrorName(e), emu::last_report());
    emu::test_reset();
    divergent_mma_kernel<<<1, 32>>>(dA, dD, 1);
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "the whole warp at mma_sync passes: %s", cudaGetErrorName(e));
  }
  {
    load_args_kernel<<<1, 32>>>(dA, 1, 16, dD);
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("256-bit"), "a 2-byte aligned mptr is refused: %s / %s", cudaGetErrorName(e),
          emu::last_report());
    emu::test_reset();
    load_args_kernel<<<1, 32>>>(dA, 4, 16, dD);   /* 8 bytes: still not 32 */
    e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("256-bit"), "an 8-byte aligned mptr is refused: %s", cudaGetErrorName(e));
    emu::test_reset();
    load_args_kernel<<<1, 32>>>(dA, 0, 12, dD);   /* 24 bytes */
    e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("ldm 12"), "ldm 12 (24 bytes) is refused: %s / %s", cudaGetErrorName(e), emu::last_report());
    emu::test_reset();
    load_args_kernel<<<1, 32>>>(dA, 16, 24, dD);  /* 32-byte offset, ldm 48 bytes */
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "mptr 32-byte aligned with ldm 24 passes: %s / %s", cudaGetErrorName(e), emu::last_report());
  }
  {
    nonuniform_kernel<<<1, 32>>>(dA, dD, 0);
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("wmma::load_matrix_sync"), "lanes passing different pointers are reported: %s / %s",
          cudaGetErrorName(e), emu::last_report());
    emu::test_reset();
    nonuniform_kernel<<<1, 32>>>(dA, dD, 1);
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "a warp-uniform pointer passes: %s", cudaGetErrorName(e));
  }
  {
    std::vector<float> D(256);
    unfilled_kernel<<<1, 32>>>(dA, dD, 0);
    cudaMemcpy(D.data(), dD, 256 * 4, cudaMemcpyDeviceToHost);
    int nans = 0;
    for (float x : D) nans += std::isnan(x);
    CHECK(nans == 256, "an accumulator nothing filled gives NaN everywhere: %d NaN", nans);
    unfilled_kernel<<<1, 32>>>(dA, dD, 1);
    cudaMemcpy(D.data(), dD, 256 * 4, cudaMemcpyDeviceToHost);
    nans = 0;
    for (float x : D) nans += std::isnan(x);
    CHECK(nans == 0 && cudaGetLastError() == cudaSuccess, "filled, no NaN: %d", nans);
  }
  /* The PTX ISA's stricter row alignment, enforced unless SHARD_EMU_WMMA_PTX=0: a float
   * accumulator with ldm 68 (272 bytes, rows 16-byte aligned) meets the Programming Guide's
   * "multiple of 16 bytes" but not PTX's "aligned with the size of the fragment" (32 bytes). */
  {
    float *dS;
    cudaMalloc((void **)&dS, 16 * 72 * sizeof(float));
    acc_store_kernel<<<1, 32>>>(dS, 68);
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaErrorLaunchFailure && reported("PTX ISA") && reported("32-byte"), "by default, ldm 68 floats is refused: %s / %s",
          cudaGetErrorName(e), emu::last_report());
    emu::test_reset();
    acc_store_kernel<<<1, 32>>>(dS, 72);
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "ldm 72 floats passes: %s", cudaGetErrorName(e));
    setenv("SHARD_EMU_WMMA_PTX", "0", 1);
    acc_store_kernel<<<1, 32>>>(dS, 68);
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "with SHARD_EMU_WMMA_PTX=0, ldm 68 floats passes the Programming Guide's rule: %s", cudaGetErrorName(e));
    unsetenv("SHARD_EMU_WMMA_PTX");
    cudaFree(dS);
  }
  cudaFree(dA);
  cudaFree(dD);
  return lib_summary("lib_wmma");
}
