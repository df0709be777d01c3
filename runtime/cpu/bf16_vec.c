/* bf16_vec.c: bf16 <-> f32 over arrays (bf16_internal.h). A contiguous run goes a vector at a
 * time, 16 elements with AVX-512F in the avx512 kernel sets and 8 with AVX2 in avx2 (cpu.h;
 * simd_bf16_internal.h's conversions); strided elements, tails and the generic set take the
 * inline functions. */
#include "core/bf16_internal.h"
#include "simd_internal.h"

/* The whole vectors of a contiguous run at width W; each returns how many elements it covered. */
#define SH_SIMD_W 16
#include "bf16_vec_simd_internal.h"
#undef SH_SIMD_W
#define SH_SIMD_W 8
#include "bf16_vec_simd_internal.h"
#undef SH_SIMD_W

static int64_t widen_vectors(float *d, const uint16_t *s, int64_t n) {
  int isa = sh_cpu_isa_fast();
  return isa >= SH_CPU_AVX512 ? widen_vectors_x16(d, s, n) : isa == SH_CPU_AVX2 ? widen_vectors_x8(d, s, n) : 0;
}

static int64_t round_vectors(uint16_t *d, const float *s, int64_t n) {
  int isa = sh_cpu_isa_fast();
  return isa >= SH_CPU_AVX512 ? round_vectors_x16(d, s, n) : isa == SH_CPU_AVX2 ? round_vectors_x8(d, s, n) : 0;
}

/* dst[i * ds] = CONVERT(src[i * ss]) for i < n: a contiguous run starts with VECTORS and
 * finishes in a simd loop. */
#define CONVERT_N(VECTORS, CONVERT)                                                               \
  int contiguous = ds == 1 && ss == 1;                                                          \
  int64_t i = contiguous ? VECTORS(dst, src, n) : 0;                                            \
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
