/* bf16_vec_simd_internal.h: bf16_vec.c's vector loops at SH_SIMD_W lanes (built per width,
 * simd_internal.h): the whole vectors of a contiguous run; each returns how many elements it
 * covered. */

SH_V_TARGET static int64_t SH_W_NAME(widen_vectors)(float *d, const uint16_t *s, int64_t n) {
  int64_t i = 0;
  for (; i + SH_SIMD_W <= n; i += SH_SIMD_W) SH_V(storeu)(d + i, SH_V(bf16_to_f32)(SH_V(loadu_bf16)(s + i)));
  return i;
}

SH_V_TARGET static int64_t SH_W_NAME(round_vectors)(uint16_t *d, const float *s, int64_t n) {
  int64_t i = 0;
  for (; i + SH_SIMD_W <= n; i += SH_SIMD_W) SH_V(storeu_bf16)(d + i, SH_V(f32_to_bf16)(SH_V(loadu)(s + i)));
  return i;
}
