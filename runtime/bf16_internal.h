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
