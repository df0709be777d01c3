/* bf16_internal.h: bf16 <-> f32 conversions as inline functions, the one definition of the
 * rounding every kernel uses (dtype.h's sh_f32_to_bf16 / sh_bf16_to_f32 are these behind a
 * call, which stops a loop from vectorizing). Round to nearest even; Inf stays Inf; a NaN
 * stays a (quiet) NaN. */
#pragma once
#include <stdint.h>

static inline float sh_bf16_to_f32_inline(uint16_t h) {
  union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
  return v.f;
}

static inline uint16_t sh_f32_to_bf16_inline(float x) {
  union { float f; uint32_t u; } v = { .f = x };
  uint32_t rounded = (v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16;
  uint32_t nan = (v.u >> 16) | 0x40u;
  return (uint16_t)(x != x ? nan : rounded);
}

/* The same conversions over n elements at element strides ds and ss (bf16_vec.c): contiguous
 * runs go 16 at a time through AVX-512F in the avx512 kernel sets (cpu.h), the rest through
 * the inline functions above; the bits are the same either way (tests compare the sets). */
void sh_bf16_to_f32_n(float *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t n);
void sh_f32_to_bf16_n(uint16_t *dst, int64_t ds, const float *src, int64_t ss, int64_t n);

#if defined(__x86_64__) && defined(__GNUC__)
#define SH_BF16_HAVE_AVX512 1
#include <immintrin.h>
/* 16 f32 rounded as sh_f32_to_bf16_inline rounds them: nearest even, NaN made quiet, and
 * denormals kept (vcvtneps2bf16 flushes them to zero, so it is not used). */
__attribute__((target("avx512f"))) static inline __m256i sh_f32_to_bf16_x16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, nan));
}

/* 16 bf16 widened to f32 (exact). */
__attribute__((target("avx512f"))) static inline __m512 sh_bf16_to_f32_x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#else
#define SH_BF16_HAVE_AVX512 0
#endif
