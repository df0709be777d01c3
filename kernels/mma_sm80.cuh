/* mma_sm80.cuh: the sm_80+ warp-level instructions the flash attention kernels are built on,
 * as inline PTX, with the fragment layouts of the PTX ISA ("Matrix Fragments for
 * mma.m16n8k16 with floating point type"; "Warp-level matrix load instruction: ldmatrix"):
 * with g = lane / 4 and t = lane % 4,
 *   A 16x16 bf16 (row-major), four b32 registers of two elements each, low half first:
 *     a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
 *   B 16x8 bf16 (k x n): b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
 *   C, D 16x8 f32: c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
 * so a C tile of 16 x 16 (two n-tiles) is, rounded to bf16 pair by pair, an A fragment: the
 * softmax's probabilities go from one product to the next without leaving registers.
 * Included as <mma_sm80.cuh>: the CUDA emulator (tests/cuda_emu/include) carries a stand-in
 * with the same functions and layouts. */
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

/* Loads four 8x8 bf16 matrices from shared memory: lane l gives the 16-byte row address of
 * row l % 8 of matrix l / 8, and receives in r[j] row l / 4, columns 2 (l % 4) and +1 of
 * matrix j; with trans, rows 2 (l % 4) and +1 of column l / 4 (the matrix transposed). */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *row) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *row) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* d += a b: a 16x16 bf16, b 16x8 bf16, d 16x8 f32 (the layouts above). */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Asynchronous 16-byte copy global -> shared (cp.async.cg: through L2 only); when !valid the
 * 16 bytes are zero-filled and nothing is read. Completes after cp_async_commit groups it and
 * cp_async_wait lets at most n newer groups stay in flight. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(dst);
  int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(n)); }

/* Two floats rounded to a bf16 pair, lo in the low half (an A or B register). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
