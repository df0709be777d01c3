/* cuda_fp16.h (CUDA emulator): __half and __half2 as the CUDA Math API documents them
 * ("Half Precision Intrinsics", "Half Precision Conversion and Data Movement"), for g++ on a
 * machine without the CUDA toolkit. Test infrastructure only (tests/cuda_emu).
 *
 * Storage is the IEEE binary16 bit pattern (2 bytes, 2-byte aligned, trivially copyable, so
 * kernels may move halves through int4 packs). Conversions round as the hardware does
 * (emu_fpconv.h: _rn ties to even, subnormals kept, NaN -> canonical NaN 0x7FFF).
 * Arithmetic (__hadd, operators, ...) is computed in float and rounded once to half, which is
 * correctly rounded for + - * / and sqrt (float has more than 2 * 11 + 2 bits); __hfma rounds
 * once from an exact intermediate. As in CUDA, defining __CUDA_NO_HALF_OPERATORS__ removes the
 * operators and __CUDA_NO_HALF_CONVERSIONS__ the implicit conversions. */
#pragma once
#include "emu_fpconv.h"

/* The shared definitions (emu_half_common.h) for this type: */
#define EMU_T __half
#define EMU_T2 __half2
#define EMU_RAW __half_raw
#define EMU_RAW2 __half2_raw
#define EMU_N half
#define EMU_N2 half2
#define EMU_FMT emu_fp::HALF
#define EMU_TO_F32 emu_fp::half_to_f32
#define EMU_INF_BITS 0x7C00
#define EMU_ONE_BITS 0x3C00
#if defined(__CUDA_NO_HALF_CONVERSIONS__)
#define EMU_CONVERSIONS 0
#else
#define EMU_CONVERSIONS 1
#endif
#if defined(__CUDA_NO_HALF_OPERATORS__)
#define EMU_OPERATORS 0
#else
#define EMU_OPERATORS 1
#endif
#define EMU_EXTRA_CONVERSIONS
#include "emu_half_common.h"

#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_FP16 __ushort_as_half((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)

typedef __half half;
typedef __half2 half2;
