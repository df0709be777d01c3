/* bf16_vec.c: bf16 <-> f32 over arrays (bf16_internal.h). A contiguous run goes 16 elements a
 * vector through AVX-512F in the avx512 kernel sets (cpu.h); strided elements, tails and the
 * other sets take the inline functions. */
#include "core/bf16_internal.h"
#include "cpu_internal.h"

#if SH_BF16_HAVE_AVX512
#define AVX512 __attribute__((target("avx512f")))

static int use_avx512(void) { return sh_cpu_isa_fast() >= SH_CPU_AVX512; }

/* The whole vectors of a contiguous run; returns how many elements they covered. */
AVX512 static int64_t widen_vectors(float *d, const uint16_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, sh_bf16_to_f32_x16(_mm256_loadu_si256((const __m256i *)(s + i))));
  return i;
}

AVX512 static int64_t round_vectors(uint16_t *d, const float *s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(d + i), sh_f32_to_bf16_x16(_mm512_loadu_ps(s + i)));
  return i;
}
#else
static int use_avx512(void) { return 0; }
static int64_t widen_vectors(float *d, const uint16_t *s, int64_t n) { return 0; }
static int64_t round_vectors(uint16_t *d, const float *s, int64_t n) { return 0; }
#endif

void sh_bf16_to_f32_n(float *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t n) {
  int contiguous = ds == 1 && ss == 1;
  int64_t i = contiguous && use_avx512() ? widen_vectors(dst, src, n) : 0;
  if (contiguous) {
#pragma omp simd
    for (int64_t j = i; j < n; j++) dst[j] = sh_bf16_to_f32_inline(src[j]);
    return;
  }
  for (; i < n; i++) dst[i * ds] = sh_bf16_to_f32_inline(src[i * ss]);
}

void sh_f32_to_bf16_n(uint16_t *dst, int64_t ds, const float *src, int64_t ss, int64_t n) {
  int contiguous = ds == 1 && ss == 1;
  int64_t i = contiguous && use_avx512() ? round_vectors(dst, src, n) : 0;
  if (contiguous) {
#pragma omp simd
    for (int64_t j = i; j < n; j++) dst[j] = sh_f32_to_bf16_inline(src[j]);
    return;
  }
  for (; i < n; i++) dst[i * ds] = sh_f32_to_bf16_inline(src[i * ss]);
}
