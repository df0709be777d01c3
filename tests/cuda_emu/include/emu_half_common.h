/* emu_half_common.h: everything the emulator's __half (cuda_fp16.h) and __nv_bfloat16
 * (cuda_bf16.h) share, written once: the 2-byte storage struct and its pair, the implicit
 * conversions, the bit casts, the rounding conversions from float/double/integers and back, and
 * the arithmetic, comparison and math intrinsics and operators. Test infrastructure only.
 *
 * Deliberately no include guard: each of the two headers includes this file once, after
 * defining the parameters below; this file #undefs them all at its end.
 *   EMU_T, EMU_T2          the scalar and pair types (__half, __half2)
 *   EMU_RAW, EMU_RAW2      their raw structs (__half_raw, __half2_raw)
 *   EMU_N, EMU_N2          the name fragments in the intrinsics (half, half2: __float2half_rn,
 *                          __half2float, __halves2half2, ...)
 *   EMU_FMT, EMU_TO_F32    the emu_fpconv.h format and its exact widening to float
 *   EMU_INF_BITS, EMU_ONE_BITS  the encodings of +inf and 1
 *   EMU_CONVERSIONS, EMU_OPERATORS  0 where __CUDA_NO_{HALF,BFLOAT16}_{CONVERSIONS,OPERATORS}__
 *                          remove the implicit conversions / the operators
 *   EMU_EXTRA_CONVERSIONS  further members of EMU_T under EMU_CONVERSIONS (may be empty) */

#define EMU_CAT3_(a, b, c) a##b##c
#define EMU_CAT3(a, b, c) EMU_CAT3_(a, b, c)
#define EMU_F(pre, post) EMU_CAT3(pre, EMU_N, post)     /* EMU_F(__float2, _rn): __float2half_rn */
#define EMU_F2(pre, post) EMU_CAT3(pre, EMU_N2, post)   /* EMU_F2(make_, ): make_half2 */
#define EMU_STR_(x) #x
#define EMU_STR(x) EMU_STR_(x)
#define EMU_AS EMU_F(__ushort_as_, )
#define EMU_TO_FLOAT EMU_F(__, 2float)
#define EMU_ROUND EMU_F(__float2, _rn)

struct EMU_RAW { unsigned short x; };
struct EMU_RAW2 { unsigned short x, y; };

struct EMU_T;
inline EMU_T EMU_AS(unsigned short i);

struct EMU_T {
  unsigned short __x;

  EMU_T() = default;
  constexpr EMU_T(const EMU_RAW &hr) : __x(hr.x) {}
  EMU_T &operator=(const EMU_RAW &hr) { __x = hr.x; return *this; }
  operator EMU_RAW() const { return EMU_RAW{__x}; }

#if EMU_CONVERSIONS
  EMU_T(float f) : __x(emu_fp::from_f32(f, EMU_FMT, emu_fp::RN)) {}
  EMU_T(double f) : __x(emu_fp::from_f64(f, EMU_FMT, emu_fp::RN)) {}
  EMU_EXTRA_CONVERSIONS
  EMU_T(short v) : __x(emu_fp::from_i64(v, EMU_FMT, emu_fp::RN)) {}
  EMU_T(unsigned short v) : __x(emu_fp::from_u64(v, false, EMU_FMT, emu_fp::RN)) {}
  EMU_T(int v) : __x(emu_fp::from_i64(v, EMU_FMT, emu_fp::RN)) {}
  EMU_T(unsigned int v) : __x(emu_fp::from_u64(v, false, EMU_FMT, emu_fp::RN)) {}
  EMU_T(long v) : __x(emu_fp::from_i64(v, EMU_FMT, emu_fp::RN)) {}
  EMU_T(unsigned long v) : __x(emu_fp::from_u64(v, false, EMU_FMT, emu_fp::RN)) {}
  EMU_T(long long v) : __x(emu_fp::from_i64(v, EMU_FMT, emu_fp::RN)) {}
  EMU_T(unsigned long long v) : __x(emu_fp::from_u64(v, false, EMU_FMT, emu_fp::RN)) {}
  EMU_T &operator=(float f) { __x = emu_fp::from_f32(f, EMU_FMT, emu_fp::RN); return *this; }
  EMU_T &operator=(double f) { __x = emu_fp::from_f64(f, EMU_FMT, emu_fp::RN); return *this; }
  EMU_T &operator=(short v) { return *this = EMU_T(v); }
  EMU_T &operator=(unsigned short v) { return *this = EMU_T(v); }
  EMU_T &operator=(int v) { return *this = EMU_T(v); }
  EMU_T &operator=(unsigned int v) { return *this = EMU_T(v); }
  EMU_T &operator=(long long v) { return *this = EMU_T(v); }
  EMU_T &operator=(unsigned long long v) { return *this = EMU_T(v); }

  operator float() const { return EMU_TO_F32(__x); }
  /* To integers: round towards zero, NaN -> 0, saturating (the documented __half2*_rz / __bfloat162*_rz). */
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

struct EMU_T2 {
  EMU_T x, y;
  EMU_T2() = default;
  constexpr EMU_T2(const EMU_T &a, const EMU_T &b) : x(a), y(b) {}
  EMU_T2(const EMU_RAW2 &h2r) { x = EMU_RAW{h2r.x}; y = EMU_RAW{h2r.y}; }
  EMU_T2 &operator=(const EMU_RAW2 &h2r) { x = EMU_RAW{h2r.x}; y = EMU_RAW{h2r.y}; return *this; }
  operator EMU_RAW2() const { return EMU_RAW2{x.__x, y.__x}; }
};

static_assert(sizeof(EMU_T) == 2 && alignof(EMU_T) == 2, EMU_STR(EMU_T) " is 2 bytes");
static_assert(sizeof(EMU_T2) == 4, EMU_STR(EMU_T2) " is 4 bytes");

/* ---- bits and conversions ---------------------------------------------------------------- */

inline EMU_T EMU_AS(unsigned short i) { EMU_T h; h.__x = i; return h; }
inline EMU_T EMU_F(__short_as_, )(short i) { return EMU_AS((unsigned short)i); }
inline unsigned short EMU_F(__, _as_ushort)(EMU_T h) { return h.__x; }
inline short EMU_F(__, _as_short)(EMU_T h) { return (short)h.__x; }

inline EMU_T EMU_ROUND(float a) { return EMU_AS(emu_fp::from_f32(a, EMU_FMT, emu_fp::RN)); }
inline EMU_T EMU_F(__float2, )(float a) { return EMU_ROUND(a); }
inline EMU_T EMU_F(__float2, _rz)(float a) { return EMU_AS(emu_fp::from_f32(a, EMU_FMT, emu_fp::RZ)); }
inline EMU_T EMU_F(__float2, _rd)(float a) { return EMU_AS(emu_fp::from_f32(a, EMU_FMT, emu_fp::RD)); }
inline EMU_T EMU_F(__float2, _ru)(float a) { return EMU_AS(emu_fp::from_f32(a, EMU_FMT, emu_fp::RU)); }
inline EMU_T EMU_F(__double2, )(double a) { return EMU_AS(emu_fp::from_f64(a, EMU_FMT, emu_fp::RN)); }
inline float EMU_TO_FLOAT(EMU_T a) { return EMU_TO_F32(a.__x); }

#define EMU_HC_FROM_INT(name, T, conv, mode) \
  inline EMU_T name(T i) { return EMU_AS(conv); }
EMU_HC_FROM_INT(EMU_F(__int2, _rn), int, emu_fp::from_i64(i, EMU_FMT, emu_fp::RN), RN)
EMU_HC_FROM_INT(EMU_F(__int2, _rz), int, emu_fp::from_i64(i, EMU_FMT, emu_fp::RZ), RZ)
EMU_HC_FROM_INT(EMU_F(__int2, _rd), int, emu_fp::from_i64(i, EMU_FMT, emu_fp::RD), RD)
EMU_HC_FROM_INT(EMU_F(__int2, _ru), int, emu_fp::from_i64(i, EMU_FMT, emu_fp::RU), RU)
EMU_HC_FROM_INT(EMU_F(__uint2, _rn), unsigned int, emu_fp::from_u64(i, false, EMU_FMT, emu_fp::RN), RN)
EMU_HC_FROM_INT(EMU_F(__short2, _rn), short, emu_fp::from_i64(i, EMU_FMT, emu_fp::RN), RN)
EMU_HC_FROM_INT(EMU_F(__ushort2, _rn), unsigned short, emu_fp::from_u64(i, false, EMU_FMT, emu_fp::RN), RN)
EMU_HC_FROM_INT(EMU_F(__ll2, _rn), long long, emu_fp::from_i64(i, EMU_FMT, emu_fp::RN), RN)
EMU_HC_FROM_INT(EMU_F(__ull2, _rn), unsigned long long, emu_fp::from_u64(i, false, EMU_FMT, emu_fp::RN), RN)
#undef EMU_HC_FROM_INT

#define EMU_HC_TO_INT(suffix, mode) \
  inline int EMU_F(__, 2int_##suffix)(EMU_T h) { return emu_fp::to_int<int>(EMU_TO_FLOAT(h), emu_fp::mode, -2147483648.0L, 2147483647.0L, 0); } \
  inline unsigned int EMU_F(__, 2uint_##suffix)(EMU_T h) { return emu_fp::to_int<unsigned int>(EMU_TO_FLOAT(h), emu_fp::mode, 0, 4294967295.0L, 0); } \
  inline short EMU_F(__, 2short_##suffix)(EMU_T h) { return emu_fp::to_int<short>(EMU_TO_FLOAT(h), emu_fp::mode, -32768, 32767, 0); } \
  inline unsigned short EMU_F(__, 2ushort_##suffix)(EMU_T h) { return emu_fp::to_int<unsigned short>(EMU_TO_FLOAT(h), emu_fp::mode, 0, 65535, 0); } \
  inline long long EMU_F(__, 2ll_##suffix)(EMU_T h) { return emu_fp::to_int<long long>(EMU_TO_FLOAT(h), emu_fp::mode, -9223372036854775808.0L, 9223372036854775807.0L, (long long)0x8000000000000000ull); } \
  inline unsigned long long EMU_F(__, 2ull_##suffix)(EMU_T h) { return emu_fp::to_int<unsigned long long>(EMU_TO_FLOAT(h), emu_fp::mode, 0, 18446744073709551615.0L, 0x8000000000000000ull); }
EMU_HC_TO_INT(rn, RN)
EMU_HC_TO_INT(rz, RZ)
EMU_HC_TO_INT(rd, RD)
EMU_HC_TO_INT(ru, RU)
#undef EMU_HC_TO_INT

inline EMU_T2 EMU_F2(__halves2, )(EMU_T a, EMU_T b) { return EMU_T2(a, b); }
inline EMU_T2 EMU_F2(EMU_F(__, 2), )(EMU_T a) { return EMU_T2(a, a); }
inline EMU_T2 EMU_F2(make_, )(EMU_T x, EMU_T y) { return EMU_T2(x, y); }
inline EMU_T2 EMU_F2(__float2, _rn)(float a) { EMU_T h = EMU_ROUND(a); return EMU_T2(h, h); }
inline EMU_T2 EMU_F2(__floats2, _rn)(float a, float b) { return EMU_T2(EMU_ROUND(a), EMU_ROUND(b)); }
inline EMU_T EMU_F(__low2, )(EMU_T2 a) { return a.x; }
inline EMU_T EMU_F(__high2, )(EMU_T2 a) { return a.y; }
inline float __low2float(EMU_T2 a) { return EMU_TO_FLOAT(a.x); }
inline float __high2float(EMU_T2 a) { return EMU_TO_FLOAT(a.y); }
inline EMU_T2 __lowhigh2highlow(EMU_T2 a) { return EMU_T2(a.y, a.x); }
inline EMU_T2 EMU_F2(__low2, )(EMU_T2 a) { return EMU_T2(a.x, a.x); }
inline EMU_T2 EMU_F2(__high2, )(EMU_T2 a) { return EMU_T2(a.y, a.y); }
inline EMU_T2 EMU_F2(__lows2, )(EMU_T2 a, EMU_T2 b) { return EMU_T2(a.x, b.x); }
inline EMU_T2 EMU_F2(__highs2, )(EMU_T2 a, EMU_T2 b) { return EMU_T2(a.y, b.y); }

/* ---- arithmetic and comparison ----------------------------------------------------------- */

inline bool __hisnan(EMU_T a) { return (a.__x & 0x7FFF) > EMU_INF_BITS; }
inline int __hisinf(EMU_T a) { return a.__x == EMU_INF_BITS ? 1 : a.__x == (0x8000 | EMU_INF_BITS) ? -1 : 0; }
inline EMU_T __hadd(EMU_T a, EMU_T b) { return EMU_ROUND(EMU_TO_FLOAT(a) + EMU_TO_FLOAT(b)); }
inline EMU_T __hsub(EMU_T a, EMU_T b) { return EMU_ROUND(EMU_TO_FLOAT(a) - EMU_TO_FLOAT(b)); }
inline EMU_T __hmul(EMU_T a, EMU_T b) { return EMU_ROUND(EMU_TO_FLOAT(a) * EMU_TO_FLOAT(b)); }
inline EMU_T __hdiv(EMU_T a, EMU_T b) { return EMU_ROUND(EMU_TO_FLOAT(a) / EMU_TO_FLOAT(b)); }
inline EMU_T __hadd_rn(EMU_T a, EMU_T b) { return __hadd(a, b); }
inline EMU_T __hsub_rn(EMU_T a, EMU_T b) { return __hsub(a, b); }
inline EMU_T __hmul_rn(EMU_T a, EMU_T b) { return __hmul(a, b); }
inline EMU_T __hneg(EMU_T a) { return EMU_AS((unsigned short)(a.__x ^ 0x8000)); }
inline EMU_T __habs(EMU_T a) { return EMU_AS((unsigned short)(a.__x & 0x7FFF)); }
inline EMU_T __hfma(EMU_T a, EMU_T b, EMU_T c) {
  return EMU_AS(emu_fp::fma_bits(EMU_TO_FLOAT(a), EMU_TO_FLOAT(b), EMU_TO_FLOAT(c), EMU_FMT));
}
inline EMU_T __hadd_sat(EMU_T a, EMU_T b) { float r = EMU_TO_FLOAT(a) + EMU_TO_FLOAT(b); return EMU_ROUND(std::isnan(r) ? 0.0f : std::fmin(1.0f, std::fmax(0.0f, r))); }
inline EMU_T __hmax(EMU_T a, EMU_T b) {
  if (__hisnan(a)) return __hisnan(b) ? EMU_AS(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return EMU_TO_FLOAT(a) >= EMU_TO_FLOAT(b) ? a : b;
}
inline EMU_T __hmin(EMU_T a, EMU_T b) {
  if (__hisnan(a)) return __hisnan(b) ? EMU_AS(emu_fp::CANONICAL_NAN) : b;
  if (__hisnan(b)) return a;
  return EMU_TO_FLOAT(a) <= EMU_TO_FLOAT(b) ? a : b;
}
inline bool __heq(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) == EMU_TO_FLOAT(b); }
inline bool __hne(EMU_T a, EMU_T b) { return !__hisnan(a) && !__hisnan(b) && EMU_TO_FLOAT(a) != EMU_TO_FLOAT(b); }
inline bool __hlt(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) < EMU_TO_FLOAT(b); }
inline bool __hle(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) <= EMU_TO_FLOAT(b); }
inline bool __hgt(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) > EMU_TO_FLOAT(b); }
inline bool __hge(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) >= EMU_TO_FLOAT(b); }
inline bool __hequ(EMU_T a, EMU_T b) { return __hisnan(a) || __hisnan(b) || __heq(a, b); }
inline bool __hneu(EMU_T a, EMU_T b) { return EMU_TO_FLOAT(a) != EMU_TO_FLOAT(b); }
inline EMU_T hsqrt(EMU_T a) { return EMU_ROUND(std::sqrt(EMU_TO_FLOAT(a))); }
inline EMU_T hexp(EMU_T a) { return EMU_ROUND(std::exp(EMU_TO_FLOAT(a))); }
inline EMU_T hlog(EMU_T a) { return EMU_ROUND(std::log(EMU_TO_FLOAT(a))); }
inline EMU_T hrcp(EMU_T a) { return EMU_ROUND(1.0f / EMU_TO_FLOAT(a)); }
inline EMU_T htanh(EMU_T a) { return EMU_ROUND(std::tanh(EMU_TO_FLOAT(a))); }

inline EMU_T2 __hadd2(EMU_T2 a, EMU_T2 b) { return EMU_T2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
inline EMU_T2 __hsub2(EMU_T2 a, EMU_T2 b) { return EMU_T2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
inline EMU_T2 __hmul2(EMU_T2 a, EMU_T2 b) { return EMU_T2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
inline EMU_T2 __h2div(EMU_T2 a, EMU_T2 b) { return EMU_T2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }
inline EMU_T2 __hfma2(EMU_T2 a, EMU_T2 b, EMU_T2 c) { return EMU_T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
inline EMU_T2 __hneg2(EMU_T2 a) { return EMU_T2(__hneg(a.x), __hneg(a.y)); }
inline EMU_T2 __habs2(EMU_T2 a) { return EMU_T2(__habs(a.x), __habs(a.y)); }

#if EMU_OPERATORS
inline EMU_T operator+(const EMU_T &a, const EMU_T &b) { return __hadd(a, b); }
inline EMU_T operator-(const EMU_T &a, const EMU_T &b) { return __hsub(a, b); }
inline EMU_T operator*(const EMU_T &a, const EMU_T &b) { return __hmul(a, b); }
inline EMU_T operator/(const EMU_T &a, const EMU_T &b) { return __hdiv(a, b); }
inline EMU_T &operator+=(EMU_T &a, const EMU_T &b) { return a = __hadd(a, b); }
inline EMU_T &operator-=(EMU_T &a, const EMU_T &b) { return a = __hsub(a, b); }
inline EMU_T &operator*=(EMU_T &a, const EMU_T &b) { return a = __hmul(a, b); }
inline EMU_T &operator/=(EMU_T &a, const EMU_T &b) { return a = __hdiv(a, b); }
inline EMU_T &operator++(EMU_T &h) { return h = __hadd(h, EMU_AS(EMU_ONE_BITS)); }
inline EMU_T &operator--(EMU_T &h) { return h = __hsub(h, EMU_AS(EMU_ONE_BITS)); }
inline EMU_T operator++(EMU_T &h, int) { EMU_T r = h; ++h; return r; }
inline EMU_T operator--(EMU_T &h, int) { EMU_T r = h; --h; return r; }
inline EMU_T operator+(const EMU_T &h) { return h; }
inline EMU_T operator-(const EMU_T &h) { return __hneg(h); }
inline bool operator==(const EMU_T &a, const EMU_T &b) { return __heq(a, b); }
inline bool operator!=(const EMU_T &a, const EMU_T &b) { return __hneu(a, b); }
inline bool operator<(const EMU_T &a, const EMU_T &b) { return __hlt(a, b); }
inline bool operator<=(const EMU_T &a, const EMU_T &b) { return __hle(a, b); }
inline bool operator>(const EMU_T &a, const EMU_T &b) { return __hgt(a, b); }
inline bool operator>=(const EMU_T &a, const EMU_T &b) { return __hge(a, b); }
inline EMU_T2 operator+(const EMU_T2 &a, const EMU_T2 &b) { return __hadd2(a, b); }
inline EMU_T2 operator-(const EMU_T2 &a, const EMU_T2 &b) { return __hsub2(a, b); }
inline EMU_T2 operator*(const EMU_T2 &a, const EMU_T2 &b) { return __hmul2(a, b); }
inline EMU_T2 operator/(const EMU_T2 &a, const EMU_T2 &b) { return __h2div(a, b); }
#endif

#undef EMU_CAT3_
#undef EMU_CAT3
#undef EMU_F
#undef EMU_F2
#undef EMU_STR_
#undef EMU_STR
#undef EMU_AS
#undef EMU_TO_FLOAT
#undef EMU_ROUND
#undef EMU_T
#undef EMU_T2
#undef EMU_RAW
#undef EMU_RAW2
#undef EMU_N
#undef EMU_N2
#undef EMU_FMT
#undef EMU_TO_F32
#undef EMU_INF_BITS
#undef EMU_ONE_BITS
#undef EMU_CONVERSIONS
#undef EMU_OPERATORS
#undef EMU_EXTRA_CONVERSIONS
