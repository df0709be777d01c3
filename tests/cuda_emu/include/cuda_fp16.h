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

struct __half_raw { unsigned short x; };
struct __half2_raw { unsigned short x, y; };

struct __half;
inline __half __ushort_as_half(unsigned short i);

struct __half {
  unsigned short __x;

  __half() = default;
  constexpr __half(const __half_raw &hr) : __x(hr.x) {}
  __half &operator=(const __half_raw &hr) { __x = hr.x; return *this; }
  operator __half_raw() const { return __half_raw{__x}; }

#if !defined(__CUDA_NO_HALF_CONVERSIONS__)
  __half(float f) : __x(emu_fp::from_f32(f, emu_fp::HALF, emu_fp::RN)) {}
  __half(double f) : __x(emu_fp::from_f64(f, emu_fp::HALF, emu_fp::RN)) {}
  __half(short v) : __x(emu_fp::from_i64(v, emu_fp::HALF, emu_fp::RN)) {}
  __half(unsigned short v) : __x(emu_fp::from_u64(v, false, emu_fp::HALF, emu_fp::RN)) {}
  __half(int v) : __x(emu_fp::from_i64(v, emu_fp::HALF, emu_fp::RN)) {}
  __half(unsigned int v) : __x(emu_fp::from_u64(v, false, emu_fp::HALF, emu_fp::RN)) {}
  __half(long v) : __x(emu_fp::from_i64(v, emu_fp::HALF, emu_fp::RN)) {}
  __half(unsigned long v) : __x(emu_fp::from_u64(v, false, emu_fp::HALF, emu_fp::RN)) {}
  __half(long long v) : __x(emu_fp::from_i64(v, emu_fp::HALF, emu_fp::RN)) {}
  __half(unsigned long long v) : __x(emu_fp::from_u64(v, false, emu_fp::HALF, emu_fp::RN)) {}
  __half &operator=(float f) { __x = emu_fp::from_f32(f, emu_fp::HALF, emu_fp::RN); return *this; }
  __half &operator=(double f) { __x = emu_fp::from_f64(f, emu_fp::HALF, emu_fp::RN); return *this; }
  __half &operator=(short v) { return *this = __half(v); }
  __half &operator=(unsigned short v) { return *this = __half(v); }
  __half &operator=(int v) { return *this = __half(v); }
  __half &operator=(unsigned int v) { return *this = __half(v); }
  __half &operator=(long long v) { return *this = __half(v); }
  __half &operator=(unsigned long long v) { return *this = __half(v); }

  operator float() const { return emu_fp::half_to_f32(__x); }
  /* To integers: round towards zero, NaN -> 0, saturating (the documented __half2*_rz). */
  operator signed char() const { return emu_fp::to_int<signed char>(float(*this), emu_fp::RZ, -128, 127, 0); }
  operator unsigned char() const { return emu_fp::to_int<unsigned char>(float(*this), emu_fp::RZ, 0, 255, 0); }
  operator char() const { return char(emu_fp::to_int<signed char>(float(*this), emu_fp::RZ, -128, 127, 0)); }
  operator short() const { return emu_fp::to_int<short>(float(*this), emu_fp::RZ, -32768, 32767, 0); }
  operator unsigned short() const { return emu_fp::to_int<unsigned short>(float(*this), emu_fp::RZ, 0, 65535, 0); }
  operator int() const { return emu_fp::to_int<int>(float(*this), emu_fp::RZ, -2147483648.0L, 2147483647.0L, 0); }
  operator unsigned int() const { return emu_fp::to_int<unsigned int>(float(*this), emu_fp::RZ, 0, 4294967295.0L, 0); }
  operator long() const { return long(emu_fp::to_int<long long>(float(*this), emu_fp::RZ, -9223372036854775808.0L, 9223372036854775807.0L, (long long)0x8000000000000000ull)); }
  operator unsigned long() const { return (unsigned long)emu_fp::to_int<unsigned long long>(float(*this), emu_fp::RZ, 0, 18446744073709551615.0L, 0x8000000000000000ull); }
  operator long long() const { return emu_fp::to_int<long long>(float(*this), emu_fp::RZ, -9223372036854775808.0L, 9223372036854775807.0L, (long long)0x8000000000000000ull); }
  operator unsigned long long() const { return emu_fp::to_int<unsigned long long>(float(*this), emu_fp::RZ, 0, 18446744073709551615.0L, 0x8000000000000000ull); }
  constexpr operator bool() const { return (__x & 0x7FFFu) != 0; }
#endif
};

struct __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(const __half &a, const __half &b) : x(a), y(b) {}
  __half2(const __half2_raw &h2r) { x = __half_raw{h2r.x}; y = __half_raw{h2r.y}; }
  __half2 &operator=(const __half2_raw &h2r) { x = __half_raw{h2r.x}; y = __half_raw{h2r.y}; return *this; }
  operator __half2_raw() const { return __half2_raw{x.__x, y.__x}; }
};

static_assert(sizeof(__half) == 2 && alignof(__half) == 2, "__half is 2 bytes");
static_assert(sizeof(__half2) == 4, "__half2 is 4 bytes");

/* ---- bits and conversions ---------------------------------------------------------------- */

inline __half __ushort_as_half(unsigned short i) { __half h; h.__x = i; return h; }
inline __half __short_as_half(short i) { return __ushort_as_half((unsigned short)i); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }

inline __half __float2half_rn(float a) { return __ushort_as_half(emu_fp::from_f32(a, emu_fp::HALF, emu_fp::RN)); }
inline __half __float2half(float a) { return __float2half_rn(a); }
inline __half __float2half_rz(float a) { return __ushort_as_half(emu_fp::from_f32(a, emu_fp::HALF, emu_fp::RZ)); }
inline __half __float2half_rd(float a) { return __ushort_as_half(emu_fp::from_f32(a, emu_fp::HALF, emu_fp::RD)); }
inline __half __float2half_ru(float a) { return __ushort_as_half(emu_fp::from_f32(a, emu_fp::HALF, emu_fp::RU)); }
inline __half __double2half(double a) { return __ushort_as_half(emu_fp::from_f64(a, emu_fp::HALF, emu_fp::RN)); }
inline float __half2float(__half a) { return emu_fp::half_to_f32(a.__x); }

#define EMU_HALF_FROM_INT(name, T, conv, mode) \
  inline __half name(T i) { return __ushort_as_half(conv); }
EMU_HALF_FROM_INT(__int2half_rn, int, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RN), RN)
EMU_HALF_FROM_INT(__int2half_rz, int, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RZ), RZ)
EMU_HALF_FROM_INT(__int2half_rd, int, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RD), RD)
EMU_HALF_FROM_INT(__int2half_ru, int, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RU), RU)
EMU_HALF_FROM_INT(__uint2half_rn, unsigned int, emu_fp::from_u64(i, false, emu_fp::HALF, emu_fp::RN), RN)
EMU_HALF_FROM_INT(__short2half_rn, short, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RN), RN)
EMU_HALF_FROM_INT(__ushort2half_rn, unsigned short, emu_fp::from_u64(i, false, emu_fp::HALF, emu_fp::RN), RN)
EMU_HALF_FROM_INT(__ll2half_rn, long long, emu_fp::from_i64(i, emu_fp::HALF, emu_fp::RN), RN)
EMU_HALF_FROM_INT(__ull2half_rn, unsigned long long, emu_fp::from_u64(i, false, emu_fp::HALF, emu_fp::RN), RN)
#undef EMU_HALF_FROM_INT

#define EMU_HALF_TO_INT(suffix, mode) \
  inline int __half2int_##suffix(__half h) { return emu_fp::to_int<int>(__half2float(h), emu_fp::mode, -2147483648.0L, 2147483647.0L, 0); } \
  inline unsigned int __half2uint_##suffix(__half h) { return emu_fp::to_int<unsigned int>(__half2float(h), emu_fp::mode, 0, 4294967295.0L, 0); } \
  inline short __half2short_##suffix(__half h) { return emu_fp::to_int<short>(__half2float(h), emu_fp::mode, -32768, 32767, 0); } \
  inline unsigned short __half2ushort_##suffix(__half h) { return emu_fp::to_int<unsigned short>(__half2float(h), emu_fp::mode, 0, 65535, 0); } \
  inline long long __half2ll_##suffix(__half h) { return emu_fp::to_int<long long>(__half2float(h), emu_fp::mode, -9223372036854775808.0L, 9223372036854775807.0L, (long long)0x8000000000000000ull); } \
  inline unsigned long long __half2ull_##suffix(__half h) { return emu_fp::to_int<unsigned long long>(__half2float(h), emu_fp::mode, 0, 18446744073709551615.0L, 0x8000000000000000ull); }
EMU_HALF_TO_INT(rn, RN)
EMU_HALF_TO_INT(rz, RZ)
EMU_HALF_TO_INT(rd, RD)
EMU_HALF_TO_INT(ru, RU)
#undef EMU_HALF_TO_INT

inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline __half2 make_half2(__half x, __half y) { return __half2(x, y); }
inline __half2 __float2half2_rn(float a) { __half h = __float2half_rn(a); return __half2(h, h); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half_rn(a), __float2half_rn(b)); }
inline __half __low2half(__half2 a) { return a.x; }
inline __half __high2half(__half2 a) { return a.y; }
inline float __low2float(__half2 a) { return __half2float(a.x); }
inline float __high2float(__half2 a) { return __half2float(a.y); }
inline __half2 __lowhigh2highlow(__half2 a) { return __half2(a.y, a.x); }
inline __half2 __low2half2(__half2 a) { return __half2(a.x, a.x); }
inline __half2 __high2half2(__half2 a) { return __half2(a.y, a.y); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }

/* ---- arithmetic and comparison ----------------------------------------------------------- */

inline bool __hisnan(__half a) { return (a.__x & 0x7FFF) > 0x7C00; }
inline int __hisinf(__half a) { return a.__x == 0x7C00 ? 1 : a.__x == 0xFC00 ? -1 : 0; }
inline __half __hadd(__half a, __half b) { return __float2half_rn(__half2float(a) + __half2float(b)); }
inline __half __hsub(__half a, __half b) { return __float2half_rn(__half2float(a) - __half2float(b)); }
inline __half __hmul(__half a, __half b) { return __float2half_rn(__half2float(a) * __half2float(b)); }
inline __half __hdiv(__half a, __half b) { return __float2half_rn(__half2float(a) / __half2float(b)); }
inline __half __hadd_rn(__half a, __half b) { return __hadd(a, b); }
inline __half __hsub_rn(__half a, __half b) { return __hsub(a, b); }
inline __half __hmul_rn(__half a, __half b) { return __hmul(a, b); }
inline __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000)); }
inline __half __habs(__half a) { return __ushort_as_half((unsigned short)(a.__x & 0x7FFF)); }
inline __half __hfma(__half a, __half b, __half c) {
  return __ushort_as_half(emu_fp::fma_bits(__half2float(a), __half2float(b), __half2float(c), emu_fp::HALF));
}
inline __half __hadd_sat(__half a, __half b) { float r = __half2float(a) + __half2float(b); return __float2half_rn(std::isnan(r) ? 0.0f : std::fmin(1.0f, std::fmax(0.0f, r))); }
inline __half __hmax(__half a, __half b) {
  if (__hisnan(a)) return __hisnan(b) ? __ushort_as_half(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return __half2float(a) >= __half2float(b) ? a : b;
}
inline __half __hmin(__half a, __half b) {
  if (__hisnan(a)) return __hisnan(b) ? __ushort_as_half(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return __half2float(a) <= __half2float(b) ? a : b;
}
inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }
inline bool __hne(__half a, __half b) { return !__hisnan(a) && !__hisnan(b) && __half2float(a) != __half2float(b); }
inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
inline bool __hle(__half a, __half b) { return __half2float(a) <= __half2float(b); }
inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
inline bool __hge(__half a, __half b) { return __half2float(a) >= __half2float(b); }
inline bool __hequ(__half a, __half b) { return __hisnan(a) || __hisnan(b) || __heq(a, b); }
inline bool __hneu(__half a, __half b) { return __half2float(a) != __half2float(b); }
inline __half hsqrt(__half a) { return __float2half_rn(std::sqrt(__half2float(a))); }
inline __half hexp(__half a) { return __float2half_rn(std::exp(__half2float(a))); }
inline __half hlog(__half a) { return __float2half_rn(std::log(__half2float(a))); }
inline __half hrcp(__half a) { return __float2half_rn(1.0f / __half2float(a)); }
inline __half htanh(__half a) { return __float2half_rn(std::tanh(__half2float(a))); }

inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
inline __half2 __h2div(__half2 a, __half2 b) { return __half2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
inline __half2 __hneg2(__half2 a) { return __half2(__hneg(a.x), __hneg(a.y)); }
inline __half2 __habs2(__half2 a) { return __half2(__habs(a.x), __habs(a.y)); }

#if !defined(__CUDA_NO_HALF_OPERATORS__)
inline __half operator+(const __half &a, const __half &b) { return __hadd(a, b); }
inline __half operator-(const __half &a, const __half &b) { return __hsub(a, b); }
inline __half operator*(const __half &a, const __half &b) { return __hmul(a, b); }
inline __half operator/(const __half &a, const __half &b) { return __hdiv(a, b); }
inline __half &operator+=(__half &a, const __half &b) { return a = __hadd(a, b); }
inline __half &operator-=(__half &a, const __half &b) { return a = __hsub(a, b); }
inline __half &operator*=(__half &a, const __half &b) { return a = __hmul(a, b); }
inline __half &operator/=(__half &a, const __half &b) { return a = __hdiv(a, b); }
inline __half &operator++(__half &h) { return h = __hadd(h, __ushort_as_half(0x3C00)); }
inline __half &operator--(__half &h) { return h = __hsub(h, __ushort_as_half(0x3C00)); }
inline __half operator++(__half &h, int) { __half r = h; ++h; return r; }
inline __half operator--(__half &h, int) { __half r = h; --h; return r; }
inline __half operator+(const __half &h) { return h; }
inline __half operator-(const __half &h) { return __hneg(h); }
inline bool operator==(const __half &a, const __half &b) { return __heq(a, b); }
inline bool operator!=(const __half &a, const __half &b) { return __hneu(a, b); }
inline bool operator<(const __half &a, const __half &b) { return __hlt(a, b); }
inline bool operator<=(const __half &a, const __half &b) { return __hle(a, b); }
inline bool operator>(const __half &a, const __half &b) { return __hgt(a, b); }
inline bool operator>=(const __half &a, const __half &b) { return __hge(a, b); }
inline __half2 operator+(const __half2 &a, const __half2 &b) { return __hadd2(a, b); }
inline __half2 operator-(const __half2 &a, const __half2 &b) { return __hsub2(a, b); }
inline __half2 operator*(const __half2 &a, const __half2 &b) { return __hmul2(a, b); }
inline __half2 operator/(const __half2 &a, const __half2 &b) { return __h2div(a, b); }
#endif

#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_FP16 __ushort_as_half((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)

typedef __half half;
typedef __half2 half2;
