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
 * runs go a vector at a time in the avx2 and avx512 kernel sets (cpu.h; the vector forms are
 * cpu/simd_bf16_internal.h's), the rest through the inline functions above; the bits are the
 * same either way (tests compare the sets). */
void sh_bf16_to_f32_n(float *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t n);
void sh_f32_to_bf16_n(uint16_t *dst, int64_t ds, const float *src, int64_t ss, int64_t n);
