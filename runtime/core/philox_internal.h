/* philox_internal.h: the counter-based generator behind every random number in shard.
 * Philox4x32-10 (Salmon et al., 2011): element i of a draw with (seed, offset) depends only
 * on (seed, offset + i), so CPU and CUDA, and every rank, produce the same numbers. Each
 * 128-bit block gives four uniforms; normals come from Box-Muller on pairs. Header-only so
 * the CUDA kernels use the very same code. */
#pragma once
#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define SH_HD __host__ __device__ __forceinline__
#else
#define SH_HD static inline
#endif

typedef struct sh_philox_out { uint32_t v[4]; } sh_philox_out;

SH_HD uint32_t sh_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

/* The 4 words of block `counter` for key `seed`. */
SH_HD sh_philox_out sh_philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = sh_mulhilo32(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = sh_mulhilo32(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  sh_philox_out o = {{c0, c1, c2, c3}};
  return o;
}

/* Uniform in (0, 1] from 24 random bits, the same in float on every backend. */
SH_HD float sh_u32_to_unit(uint32_t x) { return ((x >> 8) + 1) * (1.0f / 16777216.0f); }

/* Uniform number i of the stream (seed, offset). */
SH_HD float sh_philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t n = offset + i;
  sh_philox_out o = sh_philox4x32(seed, n >> 2);
  return sh_u32_to_unit(o.v[n & 3]);
}

/* Standard normal number i of the stream: Box-Muller over the pair (2k, 2k+1) of uniforms
 * that contains n = offset + i; cos for the even member, sin for the odd one. */
SH_HD float sh_philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t n = offset + i;
  sh_philox_out o = sh_philox4x32(seed, n >> 2);
  int pair = (int)(n & 2);
  float u1 = sh_u32_to_unit(o.v[pair]), u2 = sh_u32_to_unit(o.v[pair + 1]);
  float r = sqrtf(-2.0f * logf(u1));
  float th = 6.283185307179586f * u2;
  return (n & 1) ? r * sinf(th) : r * cosf(th);
}
