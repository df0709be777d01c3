/* lib_fp16_bf16.cpp: the emulator's cuda_fp16.h / cuda_bf16.h against an independent,
 * bit-exact reference. The reference knows nothing of the implementation's bit tricks: it
 * lists every finite value of the format (in double, exactly), brackets the input between two
 * neighbours and decides by comparing the input with their midpoint (a midpoint of two 11-bit
 * or 8-bit significands is exact in double), ties to the even encoding. Checked: every
 * float <-> half / bfloat16 boundary case (each representable value, the midpoints between
 * neighbours and the floats just beside them, subnormals, overflow, inf, NaN, -0), the four
 * rounding directions, double and integer sources, a million random floats, and arithmetic
 * (+ - * / fma) against exact results rounded by the reference. */
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>
#include "tests/lib_check.h"

namespace {

struct fmt {
  const char *name;
  int man, bias;
  std::vector<double> vals;   /* every non-negative finite value, ascending; index = encoding */
  double beyond;              /* the value the next encoding would have without overflow */
};

double decode_ref(unsigned e, int man, int bias) {   /* sign-less finite encodings */
  unsigned E = e >> man, M = e & ((1u << man) - 1);
  if (E == 0) return std::ldexp((double)M, 1 - bias - man);
  return std::ldexp((double)((1u << man) | M), (int)E - bias - man);
}

fmt make(const char *name, int man, int bias) {
  fmt f{name, man, bias, {}, 0};
  unsigned maxe = ((unsigned)(2 * bias) << man) | ((1u << man) - 1);   /* largest finite */
  for (unsigned e = 0; e <= maxe; e++) f.vals.push_back(decode_ref(e, man, bias));
  f.beyond = std::ldexp(1.0, bias + 1);
  return f;
}

enum { RN, RZ, RD, RU };

/* The reference rounding of an exact value x (a double; or x + err exactly, |err| tiny). */
uint16_t ref_round(const fmt &f, double x, int mode, double err = 0) {
  bool neg = std::signbit(x);
  double a = std::fabs(x);
  double e = neg ? -err : err;            /* the error in the magnitude's direction */
  uint16_t s = neg ? 0x8000 : 0;
  uint16_t inf = (uint16_t)(((2 * f.bias + 1)) << f.man);
  size_t n = f.vals.size();
  /* lo, lo + 1: the values around the exact a + e (lo + 1 may be the overflow "beyond"). */
  size_t lo = (size_t)(std::upper_bound(f.vals.begin(), f.vals.end(), a) - f.vals.begin()) - 1;
  if (f.vals[lo] == a) {
    if (e == 0) return (uint16_t)(s | lo);        /* exact */
    if (e < 0) lo--;                              /* just below a value (a > 0 here: a 0 sum has e == 0) */
  }
  double vlo = f.vals[lo], vhi = lo + 1 < n ? f.vals[lo + 1] : f.beyond;
  bool up;
  bool toward_plus = !neg;
  switch (mode) {
    case RZ: up = false; break;
    case RU: up = toward_plus; break;
    case RD: up = !toward_plus; break;
    default: {
      double mid = (vlo + vhi) / 2;               /* exact */
      double d = a - mid;                         /* exact near the midpoint */
      if (d > 0 || (d == 0 && e > 0)) up = true;
      else if (d < 0 || (d == 0 && e < 0)) up = false;
      else up = (lo & 1) != 0;                    /* a tie: to the even encoding */
    }
  }
  if (!up) return (uint16_t)(s | lo);
  if (lo + 1 >= n) return (uint16_t)(s | inf);
  return (uint16_t)(s | (lo + 1));
}

uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t emu_conv(bool half, float x, int mode) {
  if (half) {
    switch (mode) {
      case RZ: return __half_as_ushort(__float2half_rz(x));
      case RD: return __half_as_ushort(__float2half_rd(x));
      case RU: return __half_as_ushort(__float2half_ru(x));
      default: return __half_as_ushort(__float2half_rn(x));
    }
  }
  switch (mode) {
    case RZ: return __bfloat16_as_ushort(__float2bfloat16_rz(x));
    case RD: return __bfloat16_as_ushort(__float2bfloat16_rd(x));
    case RU: return __bfloat16_as_ushort(__float2bfloat16_ru(x));
    default: return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}

int mismatches = 0;
void check_float(const fmt &f, bool half, float x, int mode) {
  if (std::isnan(x) || std::isinf(x)) return;
  uint16_t want = ref_round(f, (double)x, mode), got = emu_conv(half, x, mode);
  /* the directed modes overflow to the largest finite value where they round towards zero */
  uint16_t inf = (uint16_t)(((2 * f.bias + 1)) << f.man), maxfin = (uint16_t)(inf - 1);
  if ((want & 0x7fff) == inf && mode != RN) {
    bool neg = std::signbit(x);
    bool to_inf = (mode == RU && !neg) || (mode == RD && neg);
    if (!to_inf) want = (uint16_t)((want & 0x8000) | maxfin);
  }
  if (got != want) {
    mismatches++;
    CHECK(false, "%s mode %d: %a (0x%08x) -> 0x%04x, reference 0x%04x", f.name, mode, x, fbits(x), got, want);
  }
}

}  // namespace

int main() {
  fmt H = make("half", 10, 15), B = make("bf16", 7, 127);

  /* 1. Boundary sweep: every value, every midpoint, and the floats right beside them. */
  for (int which = 0; which < 2; which++) {
    const fmt &f = which ? B : H;
    bool half = which == 0;
    long before = mismatches;
    std::vector<double> pts = f.vals;
    pts.push_back(f.beyond);
    for (size_t i = 0; i + 1 < pts.size(); i++) {
      double cand[3] = {pts[i], (pts[i] + pts[i + 1]) / 2, pts[i + 1]};
      for (double c : cand)
        for (int sgn = 0; sgn < 2; sgn++) {
          float x = (float)(sgn ? -c : c);
          if ((double)std::fabs(x) != c) continue;          /* not a float (none here, but be safe) */
          float around[3] = {std::nextafter(x, -INFINITY), x, std::nextafter(x, INFINITY)};
          for (float y : around)
            for (int mode = 0; mode < 4; mode++) check_float(f, half, y, mode);
        }
    }
    CHECK(mismatches == before, "%s: %ld boundary mismatches", f.name, mismatches - before);
  }

  /* 2. A million random floats (all exponents), both formats, all modes. */
  {
    std::mt19937 rng(12345);
    long before = mismatches;
    for (int i = 0; i < 1000000; i++) {
      float x = bitsf(rng());
      for (int mode = 0; mode < 4; mode++) {
        check_float(H, true, x, mode);
        check_float(B, false, x, mode);
      }
    }
    CHECK(mismatches == before, "random floats: %ld mismatches", mismatches - before);
  }

  /* 3. Specials. */
  {
    float qn = std::numeric_limits<float>::quiet_NaN(), sn = bitsf(0x7f800001u), nn = bitsf(0xffc01234u);
    for (float x : {qn, sn, nn}) {
      CHECK(__half_as_ushort(__float2half_rn(x)) == 0x7fff, "half(NaN 0x%08x) = 0x%04x, want the canonical NaN 0x7fff", fbits(x),
            __half_as_ushort(__float2half_rn(x)));
      CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(x)) == 0x7fff, "bf16(NaN 0x%08x) = 0x%04x, want 0x7fff", fbits(x),
            __bfloat16_as_ushort(__float2bfloat16_rn(x)));
      CHECK(std::isnan(__half2float(__float2half_rn(x))) && std::isnan(__bfloat162float(__float2bfloat16_rn(x))), "NaN round trip");
    }
    CHECK(__half_as_ushort(__float2half_rn(INFINITY)) == 0x7c00 && __half_as_ushort(__float2half_rn(-INFINITY)) == 0xfc00, "half(+-inf)");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(INFINITY)) == 0x7f80 && __bfloat16_as_ushort(__float2bfloat16_rn(-INFINITY)) == 0xff80,
          "bf16(+-inf)");
    CHECK(__half_as_ushort(__float2half_rn(-0.0f)) == 0x8000 && __bfloat16_as_ushort(__float2bfloat16_rn(-0.0f)) == 0x8000, "-0 keeps its sign");
    CHECK(__half_as_ushort(__float2half_rn(65519.996f)) == 0x7bff, "65519.996 -> 65504");
    CHECK(__half_as_ushort(__float2half_rn(65520.0f)) == 0x7c00, "65520 (the tie above 65504) -> inf");
    CHECK(__half_as_ushort(__float2half_rn(std::ldexp(1.0f, -25))) == 0x0000, "2^-25 (tie) -> +0 (even)");
    CHECK(__half_as_ushort(__float2half_rn(std::nextafter(std::ldexp(1.0f, -25), 1.0f))) == 0x0001, "just above 2^-25 -> least subnormal");
    CHECK(__half_as_ushort(__float2half_rn(std::ldexp(3.0f, -25))) == 0x0002, "3 * 2^-25 (tie) -> 2 * 2^-24 (even)");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(bitsf(0x00008000u))) == 0x0000, "the f32 subnormal tie 0x00008000 -> +0");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(bitsf(0x00018000u))) == 0x0002, "tie 0x00018000 -> 0x0002 (even)");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(bitsf(0x7f7fffffu))) == 0x7f80, "FLT_MAX -> bf16 inf");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rz(bitsf(0x7f7fffffu))) == 0x7f7f, "FLT_MAX rz -> bf16 max finite");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(1.00390625f)) == 0x3f80, "1 + 2^-8 (tie) -> 1 (even)");
    CHECK(__bfloat16_as_ushort(__float2bfloat16_rn(1.01171875f)) == 0x3f82, "1 + 3 * 2^-8 (tie) -> 1 + 2^-6 (even)");
  }

  /* 4. Widening is exact for every encoding. */
  {
    long bad = 0;
    for (unsigned e = 0; e < 65536; e++) {
      for (int which = 0; which < 2; which++) {
        const fmt &f = which ? B : H;
        float got = which ? __bfloat162float(__ushort_as_bfloat16((unsigned short)e)) : __half2float(__ushort_as_half((unsigned short)e));
        unsigned mag = e & 0x7fff, inf = (unsigned)((2 * f.bias + 1) << f.man);
        if (mag > inf) { if (!std::isnan(got)) bad++; continue; }
        double want = mag == inf ? INFINITY : f.vals[mag];
        if (e & 0x8000) want = -want;
        if ((double)got != want || std::signbit(got) != (bool)(e & 0x8000)) bad++;
      }
    }
    CHECK(bad == 0, "widening: %ld encodings differ from their exact value", bad);
    CHECK(fbits(__bfloat162float(__ushort_as_bfloat16(0xffc1))) == 0xffc10000u, "bf16 NaN widens with its sign and payload");
  }

  /* 5. double and integer sources. */
  {
    std::mt19937_64 rng(7);
    long bad = 0;
    for (int i = 0; i < 200000; i++) {
      uint64_t u = rng();
      double x;
      memcpy(&x, &u, 8);
      if (std::isnan(x) || std::isinf(x)) continue;
      if (std::fabs(x) > 1e6 || std::fabs(x) < 1e-12) x = std::ldexp((double)(int64_t)(rng() >> 11) / (double)(1ull << 52), (int)(rng() % 40) - 30);
      if (__half_as_ushort(__double2half(x)) != ref_round(H, x, RN)) bad++;
      if (__bfloat16_as_ushort(__double2bfloat16(x)) != ref_round(B, x, RN)) bad++;
    }
    CHECK(bad == 0, "double -> half/bf16: %ld mismatches (single rounding from double)", bad);
    /* a double whose float rounding would create a false tie: 1 + 2^-11 + 2^-40 must round up in half */
    double tricky = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
    CHECK(__half_as_ushort(__double2half(tricky)) == 0x3c01, "__double2half rounds once (0x%04x)", __half_as_ushort(__double2half(tricky)));
    long ibad = 0;
    for (long long v : {0LL, 1LL, -1LL, 2049LL, 2051LL, 65504LL, 65519LL, 65520LL, 100000LL, -70000LL, 257LL, 259LL, (long long)INT32_MAX,
                        (long long)INT32_MIN}) {
      if (__half_as_ushort(__ll2half_rn(v)) != ref_round(H, (double)v, RN)) ibad++;
      if (__bfloat16_as_ushort(__ll2bfloat16_rn(v)) != ref_round(B, (double)v, RN)) ibad++;
      if ((v >= INT32_MIN && v <= INT32_MAX) && __half_as_ushort(__int2half_rn((int)v)) != ref_round(H, (double)v, RN)) ibad++;
    }
    CHECK(ibad == 0, "integer -> half/bf16: %ld mismatches", ibad);
    CHECK(__half2int_rz(__float2half_rn(-2.75f)) == -2 && __half2int_rn(__float2half_rn(2.5f)) == 2 && __half2int_rd(__float2half_rn(-2.25f)) == -3 &&
              __half2int_ru(__float2half_rn(2.25f)) == 3,
          "half -> int rounding directions");
    CHECK(__half2int_rz(__ushort_as_half(0x7fff)) == 0 && __bfloat162int_rz(__ushort_as_bfloat16(0x7fff)) == 0, "NaN -> 0 (documented)");
    CHECK(__half2int_rz(__ushort_as_half(0x7c00)) == INT32_MAX && __bfloat162int_rz(__ushort_as_bfloat16(0xff80)) == INT32_MIN, "inf saturates");
  }

  /* 6. Arithmetic: correctly rounded + - * / and fma. */
  {
    std::mt19937 rng(99);
    long bad = 0;
    auto rh = [&]() {
      unsigned e;
      do { e = rng() & 0xffff; } while ((e & 0x7c00) == 0x7c00);
      return __ushort_as_half((unsigned short)e);
    };
    auto rb = [&]() {
      unsigned e;
      do { e = rng() & 0xffff; } while ((e & 0x7f80) == 0x7f80);
      e = (e & 0x8000) | ((e & 0x7fff) % 0x4000 + 0x3000);   /* moderate exponents, so fma sums stay interesting */
      return __ushort_as_bfloat16((unsigned short)e);
    };
    for (int i = 0; i < 300000; i++) {
      __half a = rh(), b = rh(), c = rh();
      double x = __half2float(a), y = __half2float(b), z = __half2float(c);
      if (__half_as_ushort(__hadd(a, b)) != ref_round(H, x + y, RN)) bad++;
      if (__half_as_ushort(a - b) != ref_round(H, x - y, RN)) bad++;
      if (__half_as_ushort(a * b) != ref_round(H, x * y, RN)) bad++;
      if (y != 0 && __half_as_ushort(__hdiv(a, b)) != ref_round(H, x / y, RN)) bad++;
      double p = x * y, s = p + z, bb = s - p, err = (p - (s - bb)) + (z - bb);
      if (!(s == 0 && err == 0) && __half_as_ushort(__hfma(a, b, c)) != ref_round(H, s, RN, err)) bad++;
      __nv_bfloat16 ba = rb(), bbb = rb(), bc = rb();
      double bx = __bfloat162float(ba), by = __bfloat162float(bbb), bz = __bfloat162float(bc);
      if (__bfloat16_as_ushort(__hadd(ba, bbb)) != ref_round(B, bx + by, RN)) bad++;
      if (__bfloat16_as_ushort(ba * bbb) != ref_round(B, bx * by, RN)) bad++;
      if (by != 0 && __bfloat16_as_ushort(ba / bbb) != ref_round(B, bx / by, RN)) bad++;
      double bp = bx * by, bs = bp + bz, b2 = bs - bp, berr = (bp - (bs - b2)) + (bz - b2);
      if (!(bs == 0 && berr == 0) && __bfloat16_as_ushort(__hfma(ba, bbb, bc)) != ref_round(B, bs, RN, berr)) bad++;
    }
    CHECK(bad == 0, "arithmetic: %ld results not correctly rounded", bad);
    /* An fma whose exact value lies just above a half tie, by less than a float ulp:
     * (2^-11 (1 + 32 2^-10)) (1 - 31 2^-10) + 1 = 1 + 2^-11 + 2^-26. Rounding the sum to float
     * first (a double rounding) lands on the tie 1 + 2^-11 and gives 1; once-rounded it is
     * 1 + 2^-10. */
    CHECK(__half_as_ushort(__hfma(__ushort_as_half(0x1020), __ushort_as_half(0x3bc2), __ushort_as_half(0x3c00))) == 0x3c01,
          "__hfma rounds once (got 0x%04x)", __half_as_ushort(__hfma(__ushort_as_half(0x1020), __ushort_as_half(0x3bc2), __ushort_as_half(0x3c00))));
    CHECK(__half_as_ushort(__hfma(__ushort_as_half(0x1000), __ushort_as_half(0x3c00), __ushort_as_half(0x3c00))) == 0x3c00,
          "1 + 2^-11, an exact tie, goes to the even 1");
    CHECK(__hisnan(__hadd(__ushort_as_half(0x7c00), __ushort_as_half(0xfc00))), "inf - inf is NaN");
    CHECK(__hlt(__float2half_rn(1.0f), __float2half_rn(2.0f)) && !(__ushort_as_half(0x7fff) == __ushort_as_half(0x7fff)) &&
              (__ushort_as_half(0x7fff) != __ushort_as_half(0x7fff)),
          "comparisons, NaN unordered");
  }

  /* 7. The type is what kernels need: 2 bytes, trivially copyable, movable through int4 packs. */
  CHECK(sizeof(__nv_bfloat16) == 2 && sizeof(__half) == 2 && std::is_trivially_copyable<__nv_bfloat16>::value &&
            std::is_trivially_copyable<__half>::value && std::is_trivial<__nv_bfloat16>::value,
        "layout");
  return lib_summary("lib_fp16_bf16");
}
