/* fastmath_internal.h: exp and tanh in f32 for the CPU kernels, branch-free and call-free so
 * the loops around them vectorise (and inline into each CPU kernel set's build, cpu_internal.h). */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^xc = the result times 2^*n: the reduction and polynomial of sh_expf, for xc already
 * clamped to where 2^n is a normal float (NaN passes through). */
static inline __attribute__((always_inline)) float sh_expf_reduced(float xc, int32_t *n_out) {
  float t = xc * 1.44269504088896341f + 12582912.0f;   /* 1.5 * 2^23 + n: rounds to n */
  float n = t - 12582912.0f;
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  int32_t ni = (int32_t)(tb - 0x4B400000u);             /* n sits in t's low bits */
  float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  *n_out = ni;
  return p * r * r + r + 1.0f;
}

/* exp(x) = 2^n e^r with |r| <= ln2/2 (Cephes' degree-6 polynomial, within 1.4 ulp of the
 * true value for normal results), written without branches or calls so the loops around it
 * vectorize. 2^n is built in two halves, so results that underflow into denormals or
 * overflow to inf come out as they should; NaN passes through. */
static inline __attribute__((always_inline)) float sh_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  int32_t ni;
  float p = sh_expf_reduced(xc, &ni);
  int32_t h = ni >> 1;
  uint32_t b1 = (uint32_t)(h + 127) << 23, b2 = (uint32_t)(ni - h + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  float y = p * s1 * s2;
  return x != x ? x : y;
}

/* tanh: Cephes' odd polynomial below |x| = 0.625, else 1 - 2 / (exp(2|x|) + 1) with the
 * sign; within 2.3 ulp, +-1 at +-inf, NaN through. */
static inline __attribute__((always_inline)) float sh_tanhf(float x) {
  float ax = fabsf(x), z = x * x;
  float ps = -5.70498872745e-3f;
  ps = ps * z + 2.06390887954e-2f;
  ps = ps * z - 5.37397155531e-2f;
  ps = ps * z + 1.33314422036e-1f;
  ps = ps * z - 3.33332819422e-1f;
  float small = ps * z * x + x;
  float big = 1.0f - 2.0f / (sh_expf(2.0f * ax) + 1.0f);
  big = x < 0 ? -big : big;
  return ax < 0.625f ? small : big;
}

/* tanh to within a few ulps of 1 in absolute terms (not relative near 0): 1 - 2/(e^{2u} + 1).
 * Half the cost of sh_tanhf; enough where the result is added to 1, as in GELU's
 * 0.5 x (1 + tanh(...)). */
static inline __attribute__((always_inline)) float sh_tanhf_abs(float u) {
  /* past |2u| = 30 the result is +-1 in f32 (as with sh_expf's wider range: the same bits),
   * so 2^n is one normal float and needs no second half and no NaN select */
  float xc = 2.0f * u;
  xc = xc < -30.0f ? -30.0f : xc;
  xc = xc > 30.0f ? 30.0f : xc;
  int32_t ni;
  float p = sh_expf_reduced(xc, &ni);
  uint32_t b = (uint32_t)(ni + 127) << 23;
  float s;
  memcpy(&s, &b, sizeof s);
  return 1.0f - 2.0f / (p * s + 1.0f);
}
