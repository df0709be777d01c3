/* simd_internal.h: the vector operations of the CPU kernels written once for the avx512 and
 * avx2 kernel sets (cpu.h). Each operation exists at two widths, the same operation lane by
 * lane: sh_<op>_x16 on 16 f32 lanes with AVX-512F (zmm) and sh_<op>_x8 on 8 lanes with AVX2 +
 * FMA (ymm); sh_f32_xW, sh_i32_xW and sh_bf16_xW are W floats, W 32-bit words and W bf16.
 *
 * A kernel body is a header without include guard, written with SH_V(op) and the types SH_VF,
 * SH_VI, SH_VH, its functions marked SH_V_TARGET and named through SH_W_NAME(name); a .c file
 * builds it once per width:
 *     #define SH_SIMD_W 16
 *     #include "attn_blocks_simd_internal.h"     (scores_x16, ... with AVX-512F)
 *     #undef SH_SIMD_W
 *     #define SH_SIMD_W 8
 *     #include "attn_blocks_simd_internal.h"     (scores_x8, ... with AVX2 + FMA)
 *     #undef SH_SIMD_W
 * and calls the build of the set in use (sh_cpu_isa_fast). The sums and roundings are the
 * same operations in the same order at either width, so the two builds give the same bits. */
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include "cpu_internal.h"
#include "gemm_pack_internal.h"

#define SH_SIMD_PASTE_(a, b) a##b
#define SH_SIMD_PASTE(a, b) SH_SIMD_PASTE_(a, b)
/* At the width SH_SIMD_W of the body being built: SH_V(add) is sh_add_x16 or sh_add_x8,
 * SH_W_NAME(scores) is scores_x16 or scores_x8. */
#define SH_V(op) SH_SIMD_PASTE(sh_##op##_x, SH_SIMD_W)
#define SH_W_NAME(name) SH_SIMD_PASTE(name##_x, SH_SIMD_W)
#define SH_VF SH_SIMD_PASTE(sh_f32_x, SH_SIMD_W)
#define SH_VI SH_SIMD_PASTE(sh_i32_x, SH_SIMD_W)
#define SH_VH SH_SIMD_PASTE(sh_bf16_x, SH_SIMD_W)
#define SH_V_TARGET SH_SIMD_PASTE(SH_SIMD_TARGET_, SH_SIMD_W)
#define SH_SIMD_TARGET_16 SH_TARGET_AVX512
#define SH_SIMD_TARGET_8 SH_TARGET_AVX2

/* The operations carry only the features they use (a subset of each set's target, so they
 * inline into any function of that set). */
#define SH_SIMD_OP16 static inline __attribute__((always_inline, target("avx512f")))
#define SH_SIMD_OP8 static inline __attribute__((always_inline, target("avx2,fma")))
/* ... at SH_SIMD_W: what simd_bf16_internal.h's operations are declared with */
#define SH_V_OP SH_SIMD_PASTE(SH_SIMD_OP, SH_SIMD_W)

/* ---- 16 lanes: AVX-512F ------------------------------------------------------------------ */

typedef __m512 sh_f32_x16;
typedef __m512i sh_i32_x16;
typedef __m256i sh_bf16_x16;

SH_SIMD_OP16 sh_f32_x16 sh_loadu_x16(const float *p) { return _mm512_loadu_ps(p); }
SH_SIMD_OP16 void sh_storeu_x16(float *p, sh_f32_x16 x) { _mm512_storeu_ps(p, x); }
SH_SIMD_OP16 sh_f32_x16 sh_set1_x16(float x) { return _mm512_set1_ps(x); }
SH_SIMD_OP16 sh_f32_x16 sh_zero_x16(void) { return _mm512_setzero_ps(); }
SH_SIMD_OP16 sh_f32_x16 sh_add_x16(sh_f32_x16 a, sh_f32_x16 b) { return _mm512_add_ps(a, b); }
SH_SIMD_OP16 sh_f32_x16 sh_sub_x16(sh_f32_x16 a, sh_f32_x16 b) { return _mm512_sub_ps(a, b); }
SH_SIMD_OP16 sh_f32_x16 sh_mul_x16(sh_f32_x16 a, sh_f32_x16 b) { return _mm512_mul_ps(a, b); }
SH_SIMD_OP16 sh_f32_x16 sh_div_x16(sh_f32_x16 a, sh_f32_x16 b) { return _mm512_div_ps(a, b); }
SH_SIMD_OP16 sh_f32_x16 sh_sqrt_x16(sh_f32_x16 a) { return _mm512_sqrt_ps(a); }
/* a b + c, rounded once */
SH_SIMD_OP16 sh_f32_x16 sh_fmadd_x16(sh_f32_x16 a, sh_f32_x16 b, sh_f32_x16 c) { return _mm512_fmadd_ps(a, b, c); }

SH_SIMD_OP16 sh_i32_x16 sh_bits_x16(sh_f32_x16 x) { return _mm512_castps_si512(x); }
SH_SIMD_OP16 sh_f32_x16 sh_floats_x16(sh_i32_x16 u) { return _mm512_castsi512_ps(u); }
SH_SIMD_OP16 sh_i32_x16 sh_loadu_i32_x16(const void *p) { return _mm512_loadu_si512(p); }
SH_SIMD_OP16 void sh_storeu_i32_x16(void *p, sh_i32_x16 u) { _mm512_storeu_si512(p, u); }
SH_SIMD_OP16 sh_i32_x16 sh_zero_i32_x16(void) { return _mm512_setzero_si512(); }
SH_SIMD_OP16 sh_i32_x16 sh_set1_i32_x16(int32_t x) { return _mm512_set1_epi32(x); }
SH_SIMD_OP16 sh_i32_x16 sh_add_i32_x16(sh_i32_x16 a, sh_i32_x16 b) { return _mm512_add_epi32(a, b); }
SH_SIMD_OP16 sh_i32_x16 sh_and_i32_x16(sh_i32_x16 a, sh_i32_x16 b) { return _mm512_and_si512(a, b); }
SH_SIMD_OP16 sh_i32_x16 sh_or_i32_x16(sh_i32_x16 a, sh_i32_x16 b) { return _mm512_or_si512(a, b); }
SH_SIMD_OP16 sh_i32_x16 sh_shr16_x16(sh_i32_x16 a) { return _mm512_srli_epi32(a, 16); }
SH_SIMD_OP16 sh_i32_x16 sh_shl16_x16(sh_i32_x16 a) { return _mm512_slli_epi32(a, 16); }
/* the lanes of a where x is not NaN, of b where it is */
SH_SIMD_OP16 sh_i32_x16 sh_unless_nan_x16(sh_f32_x16 x, sh_i32_x16 a, sh_i32_x16 b) {
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), a, b);
}

SH_SIMD_OP16 sh_bf16_x16 sh_loadu_bf16_x16(const uint16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
SH_SIMD_OP16 void sh_storeu_bf16_x16(uint16_t *p, sh_bf16_x16 h) { _mm256_storeu_si256((__m256i *)p, h); }
/* 16-bit halves zero-extended to words, and words below 2^16 cut to halves */
SH_SIMD_OP16 sh_i32_x16 sh_widen16_x16(sh_bf16_x16 h) { return _mm512_cvtepu16_epi32(h); }
SH_SIMD_OP16 sh_bf16_x16 sh_narrow16_x16(sh_i32_x16 u) { return _mm512_cvtepi32_epi16(u); }

/* out[c] = column c of the 16 x 16 words whose rows are in[] (gemm_pack_internal.h's). */
SH_SIMD_OP16 void sh_transpose_x16(const sh_i32_x16 in[16], sh_i32_x16 out[16]) { sh_transpose16(in, out); }

/* ---- 8 lanes: AVX2 + FMA ----------------------------------------------------------------- */

typedef __m256 sh_f32_x8;
typedef __m256i sh_i32_x8;
typedef __m128i sh_bf16_x8;

SH_SIMD_OP8 sh_f32_x8 sh_loadu_x8(const float *p) { return _mm256_loadu_ps(p); }
SH_SIMD_OP8 void sh_storeu_x8(float *p, sh_f32_x8 x) { _mm256_storeu_ps(p, x); }
SH_SIMD_OP8 sh_f32_x8 sh_set1_x8(float x) { return _mm256_set1_ps(x); }
SH_SIMD_OP8 sh_f32_x8 sh_zero_x8(void) { return _mm256_setzero_ps(); }
SH_SIMD_OP8 sh_f32_x8 sh_add_x8(sh_f32_x8 a, sh_f32_x8 b) { return _mm256_add_ps(a, b); }
SH_SIMD_OP8 sh_f32_x8 sh_sub_x8(sh_f32_x8 a, sh_f32_x8 b) { return _mm256_sub_ps(a, b); }
SH_SIMD_OP8 sh_f32_x8 sh_mul_x8(sh_f32_x8 a, sh_f32_x8 b) { return _mm256_mul_ps(a, b); }
SH_SIMD_OP8 sh_f32_x8 sh_div_x8(sh_f32_x8 a, sh_f32_x8 b) { return _mm256_div_ps(a, b); }
SH_SIMD_OP8 sh_f32_x8 sh_sqrt_x8(sh_f32_x8 a) { return _mm256_sqrt_ps(a); }
SH_SIMD_OP8 sh_f32_x8 sh_fmadd_x8(sh_f32_x8 a, sh_f32_x8 b, sh_f32_x8 c) { return _mm256_fmadd_ps(a, b, c); }

SH_SIMD_OP8 sh_i32_x8 sh_bits_x8(sh_f32_x8 x) { return _mm256_castps_si256(x); }
SH_SIMD_OP8 sh_f32_x8 sh_floats_x8(sh_i32_x8 u) { return _mm256_castsi256_ps(u); }
SH_SIMD_OP8 sh_i32_x8 sh_loadu_i32_x8(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
SH_SIMD_OP8 void sh_storeu_i32_x8(void *p, sh_i32_x8 u) { _mm256_storeu_si256((__m256i *)p, u); }
SH_SIMD_OP8 sh_i32_x8 sh_zero_i32_x8(void) { return _mm256_setzero_si256(); }
SH_SIMD_OP8 sh_i32_x8 sh_set1_i32_x8(int32_t x) { return _mm256_set1_epi32(x); }
SH_SIMD_OP8 sh_i32_x8 sh_add_i32_x8(sh_i32_x8 a, sh_i32_x8 b) { return _mm256_add_epi32(a, b); }
SH_SIMD_OP8 sh_i32_x8 sh_and_i32_x8(sh_i32_x8 a, sh_i32_x8 b) { return _mm256_and_si256(a, b); }
SH_SIMD_OP8 sh_i32_x8 sh_or_i32_x8(sh_i32_x8 a, sh_i32_x8 b) { return _mm256_or_si256(a, b); }
SH_SIMD_OP8 sh_i32_x8 sh_shr16_x8(sh_i32_x8 a) { return _mm256_srli_epi32(a, 16); }
SH_SIMD_OP8 sh_i32_x8 sh_shl16_x8(sh_i32_x8 a) { return _mm256_slli_epi32(a, 16); }
SH_SIMD_OP8 sh_i32_x8 sh_unless_nan_x8(sh_f32_x8 x, sh_i32_x8 a, sh_i32_x8 b) {
  return _mm256_blendv_epi8(a, b, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}

SH_SIMD_OP8 sh_bf16_x8 sh_loadu_bf16_x8(const uint16_t *p) { return _mm_loadu_si128((const __m128i *)p); }
SH_SIMD_OP8 void sh_storeu_bf16_x8(uint16_t *p, sh_bf16_x8 h) { _mm_storeu_si128((__m128i *)p, h); }
SH_SIMD_OP8 sh_i32_x8 sh_widen16_x8(sh_bf16_x8 h) { return _mm256_cvtepu16_epi32(h); }
/* packus saturates signed words to 0 .. 65535, so words below 2^16 pass as they are */
SH_SIMD_OP8 sh_bf16_x8 sh_narrow16_x8(sh_i32_x8 u) {
  return _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

/* out[c] = column c of the 8 x 8 words whose rows are in[]: words, then pairs of words, within
 * each 128-bit half; then the halves. */
SH_SIMD_OP8 void sh_transpose_x8(const sh_i32_x8 in[8], sh_i32_x8 out[8]) {
  __m256 t[8], s[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(in[2 * i]), _mm256_castsi256_ps(in[2 * i + 1]));
    t[2 * i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(in[2 * i]), _mm256_castsi256_ps(in[2 * i + 1]));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; i++) {   /* s[4i + e], half H: rows 4i .. 4i+3 of column 4H + e */
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; e++) {
    out[e] = _mm256_castps_si256(_mm256_permute2f128_ps(s[e], s[4 + e], 0x20));
    out[4 + e] = _mm256_castps_si256(_mm256_permute2f128_ps(s[e], s[4 + e], 0x31));
  }
}

/* ---- written once for both widths -------------------------------------------------------- */

#define SH_SIMD_W 16
#include "simd_bf16_internal.h"
#undef SH_SIMD_W
#define SH_SIMD_W 8
#include "simd_bf16_internal.h"
#undef SH_SIMD_W
