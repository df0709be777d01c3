/* cuda_bf16.h (CUDA emulator): __nv_bfloat16 and __nv_bfloat162 as the CUDA Math API
 * documents them ("Bfloat16 Precision Intrinsics", "Bfloat16 Precision Conversion and Data
 * Movement"), for g++ on a machine without the CUDA toolkit. Test infrastructure only.
 *
 * Storage is the bfloat16 bit pattern (the top 16 bits of an IEEE binary32; 2 bytes, 2-byte
 * aligned, trivially copyable). Conversions round as the hardware does (emu_fpconv.h: _rn
 * ties to even, subnormals kept, NaN -> canonical NaN 0x7FFF; bfloat16 -> float is exact).
 * Arithmetic is computed in float and rounded once (correctly rounded for + - * / and sqrt:
 * float has more than 2 * 8 + 2 bits); __hfma rounds once from an exact intermediate.
 * __CUDA_NO_BFLOAT16_OPERATORS__ / __CUDA_NO_BFLOAT16_CONVERSIONS__ work as in CUDA. */
#pragma once
#include "emu_fpconv.h"
#include "cuda_fp16.h"

/* The shared definitions (emu_half_common.h) for this type: */
#define EMU_T __nv_bfloat16
#define EMU_T2 __nv_bfloat162
#define EMU_RAW __nv_bfloat16_raw
#define EMU_RAW2 __nv_bfloat162_raw
#define EMU_N bfloat16
#define EMU_N2 bfloat162
#define EMU_FMT emu_fp::BF16
#define EMU_TO_F32 emu_fp::bf16_to_f32
#define EMU_INF_BITS 0x7F80
#define EMU_ONE_BITS 0x3F80
#if defined(__CUDA_NO_BFLOAT16_CONVERSIONS__)
#define EMU_CONVERSIONS 0
#else
#define EMU_CONVERSIONS 1
#endif
#if defined(__CUDA_NO_BFLOAT16_OPERATORS__)
#define EMU_OPERATORS 0
#else
#define EMU_OPERATORS 1
#endif
#define EMU_EXTRA_CONVERSIONS \
  __nv_bfloat16(const __half f) : __x(emu_fp::from_f32(__half2float(f), emu_fp::BF16, emu_fp::RN)) {}
#include "emu_half_common.h"

#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_BF16 __ushort_as_bfloat16((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
