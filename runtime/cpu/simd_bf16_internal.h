/* simd_bf16_internal.h: bf16 <-> f32 on SH_SIMD_W lanes, built once per width by
 * simd_internal.h (no include guard): sh_f32_to_bf16_x16 / _x8 and sh_bf16_to_f32_x16 / _x8,
 * the bits of bf16_internal.h's inline conversions. */

/* W f32 rounded as sh_f32_to_bf16_inline rounds them: nearest even, NaN made quiet, and
 * denormals kept (vcvtneps2bf16 flushes them to zero, so it is not used). */
SH_V_OP SH_VH SH_V(f32_to_bf16)(SH_VF x) {
  SH_VI u = SH_V(bits)(x), hi = SH_V(shr16)(u);
  SH_VI lsb = SH_V(and_i32)(hi, SH_V(set1_i32)(1));
  SH_VI rounded = SH_V(shr16)(SH_V(add_i32)(SH_V(add_i32)(u, SH_V(set1_i32)(0x7FFF)), lsb));
  SH_VI nan = SH_V(or_i32)(hi, SH_V(set1_i32)(0x40));
  return SH_V(narrow16)(SH_V(unless_nan)(x, rounded, nan));
}

/* W bf16 widened to f32 (exact). */
SH_V_OP SH_VF SH_V(bf16_to_f32)(SH_VH h) {
  return SH_V(floats)(SH_V(shl16)(SH_V(widen16)(h)));
}
