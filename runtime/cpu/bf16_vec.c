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

/* dst[i * ds] = CONVERT(src[i * ss]) for i < n: a contiguous run starts with VECTORS (AVX-512,
 * when the CPU has it) and finishes in a simd loop. */
#define CONVERT_N(VECTORS, CONVERT)                                                               \
  int contiguous = ds == 1 && ss == 1;                                                          \
  int64_t i = contiguous && use_avx512() ? VECTORS(dst, src, n) : 0;                            \
  if (contiguous) {                                                                             \
    _Pragma("omp simd")                                                                         \
    for (int64_t j = i; j < n; j++) dst[j] = CONVERT(src[j]);                                   \
    return;                                                                                     \
  }                                                                                             \
  for (; i < n; i++) dst[i * ds] = CONVERT(src[i * ss]);

void sh_bf16_to_f32_n(float *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t n) {
  CONVERT_N(widen_vectors, sh_bf16_to_f32_inline)
}

void sh_f32_to_bf16_n(uint16_t *dst, int64_t ds, const float *src, int64_t ss, int64_t n) {
  CONVERT_N(round_vectors, sh_f32_to_bf16_inline)
}
