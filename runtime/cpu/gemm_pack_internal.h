/* gemm_pack_internal.h: what the CPU GEMMs (sgemm.c in f32, gemm_bf16.c in bf16) share
 * for packing their operands with AVX-512F: the per-thread packing scratch, lane masks for
 * tails, and a 16 x 16 transpose of 32-bit words. */
#pragma once
#include <immintrin.h>
#include <stddef.h>

#define SH_GEMM_AVX512 __attribute__((target("avx512f")))

/* The calling thread's packing buffer of at least `bytes` (64-byte aligned), grown as needed
 * and kept between calls: a fresh allocation of this size per call is an mmap, and its page
 * faults cost as much as a small product. NULL when it cannot grow. */
void *sh_gemm_scratch(size_t bytes);

/* The first min(max(lanes, 0), 16) of 16 lanes. */
static inline __mmask16 sh_lanes_mask(int lanes) {
  return lanes >= 16 ? (__mmask16)0xFFFF : lanes <= 0 ? 0 : (__mmask16)((1u << lanes) - 1);
}

/* out[c] = column c of the 16 x 16 matrix of 32-bit words whose rows are in[0 .. 15]: words,
 * then pairs of words, within each 128-bit lane; then the 4 x 4 transpose of the lanes. */
SH_GEMM_AVX512 static inline void sh_transpose16(const __m512i in[16], __m512i out[16]) {
  __m512i t[16], s[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {   /* s[4i + e], lane L: rows 4i .. 4i+3 of column 4L + e */
    s[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; e++) {
    __m512i p0 = _mm512_shuffle_i32x4(s[e], s[4 + e], 0x44), p1 = _mm512_shuffle_i32x4(s[e], s[4 + e], 0xEE);
    __m512i p2 = _mm512_shuffle_i32x4(s[8 + e], s[12 + e], 0x44), p3 = _mm512_shuffle_i32x4(s[8 + e], s[12 + e], 0xEE);
    out[e] = _mm512_shuffle_i32x4(p0, p2, 0x88);
    out[4 + e] = _mm512_shuffle_i32x4(p0, p2, 0xDD);
    out[8 + e] = _mm512_shuffle_i32x4(p1, p3, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(p1, p3, 0xDD);
  }
}
