/* dtype.h: element types, their sizes and names, and the bf16/f16 conversions.
 * bf16 and f16 are stored as uint16_t bit patterns; conversions from f32 round to nearest
 * even and keep NaN (quiet) and +-Inf. */
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef enum sh_dtype {
  SH_F64 = 0, SH_F32 = 1, SH_BF16 = 2, SH_F16 = 3,
  SH_I64 = 4, SH_I32 = 5, SH_U8 = 6, SH_BOOL = 7
} sh_dtype;

int sh_dtype_size(int dtype);             /* bytes per element; 0 for an unknown dtype */
const char *sh_dtype_name(int dtype);     /* "f32", ...; "?" for an unknown dtype */
int sh_dtype_from_name(const char *name); /* -1 when the name is unknown */
int sh_dtype_is_float(int dtype);

uint16_t sh_f32_to_bf16(float x);
float sh_bf16_to_f32(uint16_t h);
uint16_t sh_f32_to_f16(float x);
float sh_f16_to_f32(uint16_t h);
