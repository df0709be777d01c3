/* emu_fpconv.h: the bit-exact conversions behind the emulator's cuda_fp16.h and cuda_bf16.h.
 * Test infrastructure only (tests/cuda_emu): never part of lib/libshard.so or bin/shard.
 *
 * One rounding routine serves every narrowing conversion (float/double/integer -> half or
 * bfloat16) in the four IEEE-754 directions the CUDA Math API names: _rn (to nearest, ties to
 * even), _rz, _rd (towards -inf), _ru (towards +inf). Subnormal results are produced, not
 * flushed (the conversions have no .ftz form in the CUDA Math API); overflow gives inf in
 * _rn, and the largest finite value where the direction rounds towards zero. Any NaN input
 * becomes the canonical NaN 0x7FFF (what NVIDIA's conversions return for a NaN: a quiet
 * NaN, sign and payload not kept). Widening (half/bfloat16 -> float) is exact: bfloat16 is
 * the top half of a float, so its NaNs keep sign and payload; a half NaN keeps its sign and
 * payload (shifted into place, quiet bit set). */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace emu_fp {

enum rounding { RN = 0, RZ = 1, RD = 2, RU = 3 };

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint64_t f64_bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
inline double bits_f64(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }

/* A narrow binary format: `man` stored fraction bits, exponent bias `bias` (emin = 1 - bias,
 * the all-ones exponent is inf/NaN). */
struct format { int man, bias; };
constexpr format HALF = {10, 15};
constexpr format BF16 = {7, 127};

/* Rounds the finite nonzero value m * 2^(e - 63) (m != 0, any bits) with sign `neg` to the
 * format. Returns the encoding. */
inline uint16_t round_bits(bool neg, int e, uint64_t m, format f, rounding r) {
  uint16_t s = neg ? 0x8000 : 0;
  while (!(m >> 63)) { m <<= 1; e--; }           /* normalise: value = 1.xxx * 2^e */
  int emin = 1 - f.bias;
  int shift = 63 - f.man;                        /* keep man + 1 significant bits */
  if (e < emin) shift += emin - e;               /* a subnormal result keeps fewer */
  if (shift > 100) shift = 100;                  /* far below the least subnormal: only the sticky bit matters */
  typedef unsigned __int128 u128;
  u128 wide = u128(m);
  uint64_t q = uint64_t(wide >> shift);
  u128 rem = wide & ((u128(1) << shift) - 1), half = u128(1) << (shift - 1);
  bool inexact = rem != 0, up = false;
  switch (r) {
    case RN: up = rem > half || (rem == half && (q & 1)); break;
    case RZ: up = false; break;
    case RD: up = inexact && neg; break;
    case RU: up = inexact && !neg; break;
  }
  q += up;
  int emax_field = 2 * f.bias + 1;               /* 31 (half), 255 (bfloat16): inf/NaN */
  if (e < emin) return uint16_t(s | q);          /* subnormal; q == 1 << man is the least normal */
  int E = e + f.bias;
  if (q >> (f.man + 1)) { q >>= 1; E++; }        /* rounding carried into a new binade */
  if (E >= emax_field) {                         /* overflow */
    bool to_inf = r == RN || (r == RU && !neg) || (r == RD && neg);
    uint16_t maxfin = uint16_t(((emax_field - 1) << f.man) | ((1u << f.man) - 1));
    return uint16_t(s | (to_inf ? uint16_t(emax_field << f.man) : maxfin));
  }
  return uint16_t(s | (uint32_t(E) << f.man) | (q & ((uint64_t(1) << f.man) - 1)));
}

inline uint16_t inf_bits(bool neg, format f) { return uint16_t((neg ? 0x8000 : 0) | ((2 * f.bias + 1) << f.man)); }
constexpr uint16_t CANONICAL_NAN = 0x7FFF;

inline uint16_t from_f32(float x, format f, rounding r) {
  uint32_t u = f32_bits(x);
  bool neg = u >> 31;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return CANONICAL_NAN;
  if (a == 0x7f800000u) return inf_bits(neg, f);
  if (a == 0) return neg ? 0x8000 : 0;
  int be = int(a >> 23);
  uint64_t m = a & 0x7fffffu;
  int e;
  if (be) { m |= 0x800000u; e = be - 127; } else { e = -126; }
  /* value = m * 2^(e - 23) = (m << 40) * 2^(e - 63) */
  return round_bits(neg, e, m << 40, f, r);
}

inline uint16_t from_f64(double x, format f, rounding r) {
  uint64_t u = f64_bits(x);
  bool neg = u >> 63;
  uint64_t a = u & 0x7fffffffffffffffull;
  if (a > 0x7ff0000000000000ull) return CANONICAL_NAN;
  if (a == 0x7ff0000000000000ull) return inf_bits(neg, f);
  if (a == 0) return neg ? 0x8000 : 0;
  int be = int(a >> 52);
  uint64_t m = a & 0xfffffffffffffull;
  int e;
  if (be) { m |= 0x10000000000000ull; e = be - 1023; } else { e = -1022; }
  return round_bits(neg, e, m << 11, f, r);
}

inline uint16_t from_u64(uint64_t v, bool neg, format f, rounding r) {
  if (v == 0) return 0;                          /* integer zero converts to +0 */
  return round_bits(neg, 63, v, f, r);
}
inline uint16_t from_i64(long long v, format f, rounding r) {
  bool neg = v < 0;
  uint64_t mag = neg ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  return from_u64(mag, neg, f, r);
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

inline float half_to_f32(uint16_t h) {
  uint32_t s = uint32_t(h & 0x8000) << 16, E = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (E == 31) return bits_f32(s | 0x7f800000u | (m ? (0x400000u | (m << 13)) : 0));
  if (E == 0) {
    if (!m) return bits_f32(s);
    float v = std::ldexp(float(m), -24);         /* exact: m < 2^10 */
    return s ? -v : v;
  }
  return bits_f32(s | ((E - 15 + 127) << 23) | (m << 13));
}

inline double narrow_to_f64(uint16_t h, format f) { return f.man == 7 ? double(bf16_to_f32(h)) : double(half_to_f32(h)); }

/* Float to integer as the CUDA Math API's __half2int_rz & co. define it: rounded in the
 * given direction, NaN -> `nan_value`, saturated to [lo, hi]. */
template <typename I>
inline I to_int(float x, rounding r, long double lo, long double hi, I nan_value) {
  if (std::isnan(x)) return nan_value;
  double v = x;
  switch (r) {
    case RN: v = std::nearbyint(v); break;       /* default FE_TONEAREST: ties to even */
    case RZ: v = std::trunc(v); break;
    case RD: v = std::floor(v); break;
    case RU: v = std::ceil(v); break;
  }
  if ((long double)v <= lo) return I(lo);
  if ((long double)v >= hi) return I(hi);
  return I(v);
}

/* a * b + c rounded once to the format: the product of two narrow values is exact in double
 * and the sum is made round-to-odd (sticky) before the final rounding, so no double rounding. */
inline uint16_t fma_bits(double a, double b, double c, format f) {
  double p = a * b;                              /* exact: at most 2 * 11 significant bits */
  double s = p + c;
  if (std::isnan(s)) return CANONICAL_NAN;
  if (std::isinf(s)) return from_f64(s, f, RN);
  double bb = s - p, err = (p - (s - bb)) + (c - bb);   /* TwoSum: s + err == p + c exactly */
  if (err != 0 && !(f64_bits(s) & 1)) s = std::nextafter(s, err > 0 ? INFINITY : -INFINITY);
  return from_f64(s, f, RN);
}

}  // namespace emu_fp
