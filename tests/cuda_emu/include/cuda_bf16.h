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

struct __nv_bfloat16_raw { unsigned short x; };
struct __nv_bfloat162_raw { unsigned short x, y; };

struct __nv_bfloat16;
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short i);

struct __nv_bfloat16 {
  unsigned short __x;

  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw &hr) : __x(hr.x) {}
  __nv_bfloat16 &operator=(const __nv_bfloat16_raw &hr) { __x = hr.x; return *this; }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }

#if !defined(__CUDA_NO_BFLOAT16_CONVERSIONS__)
  __nv_bfloat16(float f) : __x(emu_fp::from_f32(f, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(double f) : __x(emu_fp::from_f64(f, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(const __half f) : __x(emu_fp::from_f32(__half2float(f), emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(short v) : __x(emu_fp::from_i64(v, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(unsigned short v) : __x(emu_fp::from_u64(v, false, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(int v) : __x(emu_fp::from_i64(v, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(unsigned int v) : __x(emu_fp::from_u64(v, false, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(long v) : __x(emu_fp::from_i64(v, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(unsigned long v) : __x(emu_fp::from_u64(v, false, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(long long v) : __x(emu_fp::from_i64(v, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16(unsigned long long v) : __x(emu_fp::from_u64(v, false, emu_fp::BF16, emu_fp::RN)) {}
  __nv_bfloat16 &operator=(float f) { __x = emu_fp::from_f32(f, emu_fp::BF16, emu_fp::RN); return *this; }
  __nv_bfloat16 &operator=(double f) { __x = emu_fp::from_f64(f, emu_fp::BF16, emu_fp::RN); return *this; }
  __nv_bfloat16 &operator=(short v) { return *this = __nv_bfloat16(v); }
  __nv_bfloat16 &operator=(unsigned short v) { return *this = __nv_bfloat16(v); }
  __nv_bfloat16 &operator=(int v) { return *this = __nv_bfloat16(v); }
  __nv_bfloat16 &operator=(unsigned int v) { return *this = __nv_bfloat16(v); }
  __nv_bfloat16 &operator=(long long v) { return *this = __nv_bfloat16(v); }
  __nv_bfloat16 &operator=(unsigned long long v) { return *this = __nv_bfloat16(v); }

  operator float() const { return emu_fp::bf16_to_f32(__x); }
  /* To integers: round towards zero, NaN -> 0, saturating (the documented __nv_bfloat162*_rz). */
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

struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
  __nv_bfloat162(const __nv_bfloat162_raw &h2r) { x = __nv_bfloat16_raw{h2r.x}; y = __nv_bfloat16_raw{h2r.y}; }
  __nv_bfloat162 &operator=(const __nv_bfloat162_raw &h2r) { x = __nv_bfloat16_raw{h2r.x}; y = __nv_bfloat16_raw{h2r.y}; return *this; }
  operator __nv_bfloat162_raw() const { return __nv_bfloat162_raw{x.__x, y.__x}; }
};

static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "__nv_bfloat16 is 2 bytes");
static_assert(sizeof(__nv_bfloat162) == 4, "__nv_bfloat162 is 4 bytes");

/* ---- bits and conversions ---------------------------------------------------------------- */

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short i) { __nv_bfloat16 h; h.__x = i; return h; }
inline __nv_bfloat16 __short_as_bfloat16(short i) { return __ushort_as_bfloat16((unsigned short)i); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return (short)h.__x; }

inline __nv_bfloat16 __float2bfloat16_rn(float a) { return __ushort_as_bfloat16(emu_fp::from_f32(a, emu_fp::BF16, emu_fp::RN)); }
inline __nv_bfloat16 __float2bfloat16(float a) { return __float2bfloat16_rn(a); }
inline __nv_bfloat16 __float2bfloat16_rz(float a) { return __ushort_as_bfloat16(emu_fp::from_f32(a, emu_fp::BF16, emu_fp::RZ)); }
inline __nv_bfloat16 __float2bfloat16_rd(float a) { return __ushort_as_bfloat16(emu_fp::from_f32(a, emu_fp::BF16, emu_fp::RD)); }
inline __nv_bfloat16 __float2bfloat16_ru(float a) { return __ushort_as_bfloat16(emu_fp::from_f32(a, emu_fp::BF16, emu_fp::RU)); }
inline __nv_bfloat16 __double2bfloat16(double a) { return __ushort_as_bfloat16(emu_fp::from_f64(a, emu_fp::BF16, emu_fp::RN)); }
inline float __bfloat162float(__nv_bfloat16 a) { return emu_fp::bf16_to_f32(a.__x); }

#define EMU_BF16_FROM_INT(name, T, conv, mode) \
  inline __nv_bfloat16 name(T i) { return __ushort_as_bfloat16(conv); }
EMU_BF16_FROM_INT(__int2bfloat16_rn, int, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RN), RN)
EMU_BF16_FROM_INT(__int2bfloat16_rz, int, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RZ), RZ)
EMU_BF16_FROM_INT(__int2bfloat16_rd, int, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RD), RD)
EMU_BF16_FROM_INT(__int2bfloat16_ru, int, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RU), RU)
EMU_BF16_FROM_INT(__uint2bfloat16_rn, unsigned int, emu_fp::from_u64(i, false, emu_fp::BF16, emu_fp::RN), RN)
EMU_BF16_FROM_INT(__short2bfloat16_rn, short, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RN), RN)
EMU_BF16_FROM_INT(__ushort2bfloat16_rn, unsigned short, emu_fp::from_u64(i, false, emu_fp::BF16, emu_fp::RN), RN)
EMU_BF16_FROM_INT(__ll2bfloat16_rn, long long, emu_fp::from_i64(i, emu_fp::BF16, emu_fp::RN), RN)
EMU_BF16_FROM_INT(__ull2bfloat16_rn, unsigned long long, emu_fp::from_u64(i, false, emu_fp::BF16, emu_fp::RN), RN)
#undef EMU_BF16_FROM_INT

#define EMU_BF16_TO_INT(suffix, mode) \
  inline int __bfloat162int_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<int>(__bfloat162float(h), emu_fp::mode, -2147483648.0L, 2147483647.0L, 0); } \
  inline unsigned int __bfloat162uint_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<unsigned int>(__bfloat162float(h), emu_fp::mode, 0, 4294967295.0L, 0); } \
  inline short __bfloat162short_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<short>(__bfloat162float(h), emu_fp::mode, -32768, 32767, 0); } \
  inline unsigned short __bfloat162ushort_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<unsigned short>(__bfloat162float(h), emu_fp::mode, 0, 65535, 0); } \
  inline long long __bfloat162ll_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<long long>(__bfloat162float(h), emu_fp::mode, -9223372036854775808.0L, 9223372036854775807.0L, (long long)0x8000000000000000ull); } \
  inline unsigned long long __bfloat162ull_##suffix(__nv_bfloat16 h) { return emu_fp::to_int<unsigned long long>(__bfloat162float(h), emu_fp::mode, 0, 18446744073709551615.0L, 0x8000000000000000ull); }
EMU_BF16_TO_INT(rn, RN)
EMU_BF16_TO_INT(rz, RZ)
EMU_BF16_TO_INT(rd, RD)
EMU_BF16_TO_INT(ru, RU)
#undef EMU_BF16_TO_INT

inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { __nv_bfloat16 h = __float2bfloat16_rn(a); return __nv_bfloat162(h, h); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__float2bfloat16_rn(a), __float2bfloat16_rn(b)); }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 a) { return a.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 a) { return a.y; }
inline float __low2float(__nv_bfloat162 a) { return __bfloat162float(a.x); }
inline float __high2float(__nv_bfloat162 a) { return __bfloat162float(a.y); }
inline __nv_bfloat162 __lowhigh2highlow(__nv_bfloat162 a) { return __nv_bfloat162(a.y, a.x); }
inline __nv_bfloat162 __low2bfloat162(__nv_bfloat162 a) { return __nv_bfloat162(a.x, a.x); }
inline __nv_bfloat162 __high2bfloat162(__nv_bfloat162 a) { return __nv_bfloat162(a.y, a.y); }
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(a.x, b.x); }
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(a.y, b.y); }

/* ---- arithmetic and comparison ----------------------------------------------------------- */

inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7FFF) > 0x7F80; }
inline int __hisinf(__nv_bfloat16 a) { return a.__x == 0x7F80 ? 1 : a.__x == 0xFF80 ? -1 : 0; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b)); }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(__bfloat162float(a) - __bfloat162float(b)); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(b)); }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16_rn(__bfloat162float(a) / __bfloat162float(b)); }
inline __nv_bfloat16 __hadd_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
inline __nv_bfloat16 __hsub_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return __hsub(a, b); }
inline __nv_bfloat16 __hmul_rn(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return __ushort_as_bfloat16((unsigned short)(a.__x ^ 0x8000)); }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return __ushort_as_bfloat16((unsigned short)(a.__x & 0x7FFF)); }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __ushort_as_bfloat16(emu_fp::fma_bits(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c), emu_fp::BF16));
}
inline __nv_bfloat16 __hadd_sat(__nv_bfloat16 a, __nv_bfloat16 b) { float r = __bfloat162float(a) + __bfloat162float(b); return __float2bfloat16_rn(std::isnan(r) ? 0.0f : std::fmin(1.0f, std::fmax(0.0f, r))); }
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a)) return __hisnan(b) ? __ushort_as_bfloat16(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return __bfloat162float(a) >= __bfloat162float(b) ? a : b;
}
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
  if (__hisnan(a)) return __hisnan(b) ? __ushort_as_bfloat16(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return __bfloat162float(a) <= __bfloat162float(b) ? a : b;
}
inline bool __heq(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) == __bfloat162float(b); }
inline bool __hne(__nv_bfloat16 a, __nv_bfloat16 b) { return !__hisnan(a) && !__hisnan(b) && __bfloat162float(a) != __bfloat162float(b); }
inline bool __hlt(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) < __bfloat162float(b); }
inline bool __hle(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) <= __bfloat162float(b); }
inline bool __hgt(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) > __bfloat162float(b); }
inline bool __hge(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) >= __bfloat162float(b); }
inline bool __hequ(__nv_bfloat16 a, __nv_bfloat16 b) { return __hisnan(a) || __hisnan(b) || __heq(a, b); }
inline bool __hneu(__nv_bfloat16 a, __nv_bfloat16 b) { return __bfloat162float(a) != __bfloat162float(b); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __float2bfloat16_rn(std::sqrt(__bfloat162float(a))); }
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16_rn(std::exp(__bfloat162float(a))); }
inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __float2bfloat16_rn(std::log(__bfloat162float(a))); }
inline __nv_bfloat16 hrcp(__nv_bfloat16 a) { return __float2bfloat16_rn(1.0f / __bfloat162float(a)); }
inline __nv_bfloat16 htanh(__nv_bfloat16 a) { return __float2bfloat16_rn(std::tanh(__bfloat162float(a))); }

inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
inline __nv_bfloat162 __h2div(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) { return __nv_bfloat162(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
inline __nv_bfloat162 __hneg2(__nv_bfloat162 a) { return __nv_bfloat162(__hneg(a.x), __hneg(a.y)); }
inline __nv_bfloat162 __habs2(__nv_bfloat162 a) { return __nv_bfloat162(__habs(a.x), __habs(a.y)); }

#if !defined(__CUDA_NO_BFLOAT16_OPERATORS__)
inline __nv_bfloat16 operator+(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hadd(a, b); }
inline __nv_bfloat16 operator-(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hsub(a, b); }
inline __nv_bfloat16 operator*(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hmul(a, b); }
inline __nv_bfloat16 operator/(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hdiv(a, b); }
inline __nv_bfloat16 &operator+=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hadd(a, b); }
inline __nv_bfloat16 &operator-=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hsub(a, b); }
inline __nv_bfloat16 &operator*=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hmul(a, b); }
inline __nv_bfloat16 &operator/=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hdiv(a, b); }
inline __nv_bfloat16 &operator++(__nv_bfloat16 &h) { return h = __hadd(h, __ushort_as_bfloat16(0x3F80)); }
inline __nv_bfloat16 &operator--(__nv_bfloat16 &h) { return h = __hsub(h, __ushort_as_bfloat16(0x3F80)); }
inline __nv_bfloat16 operator++(__nv_bfloat16 &h, int) { __nv_bfloat16 r = h; ++h; return r; }
inline __nv_bfloat16 operator--(__nv_bfloat16 &h, int) { __nv_bfloat16 r = h; --h; return r; }
inline __nv_bfloat16 operator+(const __nv_bfloat16 &h) { return h; }
inline __nv_bfloat16 operator-(const __nv_bfloat16 &h) { return __hneg(h); }
inline bool operator==(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __heq(a, b); }
inline bool operator!=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hneu(a, b); }
inline bool operator<(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hlt(a, b); }
inline bool operator<=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hle(a, b); }
inline bool operator>(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hgt(a, b); }
inline bool operator>=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hge(a, b); }
inline __nv_bfloat162 operator+(const __nv_bfloat162 &a, const __nv_bfloat162 &b) { return __hadd2(a, b); }
inline __nv_bfloat162 operator-(const __nv_bfloat162 &a, const __nv_bfloat162 &b) { return __hsub2(a, b); }
inline __nv_bfloat162 operator*(const __nv_bfloat162 &a, const __nv_bfloat162 &b) { return __hmul2(a, b); }
inline __nv_bfloat162 operator/(const __nv_bfloat162 &a, const __nv_bfloat162 &b) { return __h2div(a, b); }
#endif

#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7F80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7FFFU)
#define CUDART_MIN_DENORM_BF16 __ushort_as_bfloat16((unsigned short)0x0001U)
#define CUDART_MAX_NORMAL_BF16 __ushort_as_bfloat16((unsigned short)0x7F7FU)
#define CUDART_ZERO_BF16 __ushort_as_bfloat16((unsigned short)0x0000U)
#define CUDART_ONE_BF16 __ushort_as_bfloat16((unsigned short)0x3F80U)

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
