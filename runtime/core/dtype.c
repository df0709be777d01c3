#include "dtype.h"
#include "bf16_internal.h"
#include <string.h>

static const struct { const char *name; int size; int is_float; } dtype_info[] = {
  [SH_F64] = {"f64", 8, 1}, [SH_F32] = {"f32", 4, 1}, [SH_BF16] = {"bf16", 2, 1},
  [SH_F16] = {"f16", 2, 1}, [SH_I64] = {"i64", 8, 0}, [SH_I32] = {"i32", 4, 0},
  [SH_U8] = {"u8", 1, 0},   [SH_BOOL] = {"bool", 1, 0},
};
enum { N_DTYPES = sizeof dtype_info / sizeof dtype_info[0] };

static int known(int dtype) { return dtype >= 0 && dtype < N_DTYPES; }
int sh_dtype_size(int dtype) { return known(dtype) ? dtype_info[dtype].size : 0; }
const char *sh_dtype_name(int dtype) { return known(dtype) ? dtype_info[dtype].name : "?"; }
int sh_dtype_is_float(int dtype) { return known(dtype) && dtype_info[dtype].is_float; }

int sh_dtype_from_name(const char *name) {
  static const struct { const char *alias; int dtype; } aliases[] = {
    {"float64", SH_F64}, {"double", SH_F64}, {"float32", SH_F32}, {"float", SH_F32},
    {"bfloat16", SH_BF16}, {"float16", SH_F16}, {"half", SH_F16}, {"int64", SH_I64},
    {"long", SH_I64}, {"int32", SH_I32}, {"int", SH_I32}, {"uint8", SH_U8},
  };
  for (int i = 0; i < N_DTYPES; i++)
    if (strcmp(name, dtype_info[i].name) == 0) return i;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) return aliases[i].dtype;
  return -1;
}

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t sh_f32_to_bf16(float x) { return sh_f32_to_bf16_inline(x); }
float sh_bf16_to_f32(uint16_t h) { return sh_bf16_to_f32_inline(h); }

uint16_t sh_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;             /* NaN */
  if (absu >= 0x477ff000u) return sign | 0x7c00u;            /* overflow (after rounding) or Inf */
  if (absu < 0x38800000u) {                                  /* subnormal or zero in f16 */
    if (absu < 0x33000000u) return sign;                     /* below half the smallest subnormal */
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(absu >> 23);                     /* 14..24: units of 2^-24 */
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t r = mant >> shift;
    if (rest > half || (rest == half && (r & 1u))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = absu - 0x38000000u;                           /* rebias exponent 127 -> 15 */
  uint32_t lower = r & 0x1fffu;
  r >>= 13;
  if (lower > 0x1000u || (lower == 0x1000u && (r & 1u))) r++;
  return sign | (uint16_t)r;
}

float sh_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = (float)mant * (1.0f / 16777216.0f);            /* mant * 2^-24 */
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}
