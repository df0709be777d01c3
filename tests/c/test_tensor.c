/* test_tensor.c: the tensor core from C: creation, every view against index arithmetic,
 * copies between all dtype pairs, bf16/f16 rounding against an independent nearest-value
 * reference, lifetime (free, aliases, refcounts) and the allocator's statistics. */
#include "core/alloc_internal.h"
#include "check.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const int DTYPES[] = {SH_F64, SH_F32, SH_BF16, SH_F16, SH_I64, SH_I32, SH_U8, SH_BOOL};
enum { N_DT = 8 };

static sh_tensor *make(int ndim, const int64_t *shape, int dtype) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, ndim, shape, dtype, -1));
  return t;
}

/* A 2x3x4 f64 tensor whose element (i, j, k) is 100i + 10j + k. */
static sh_tensor *iota3(void) {
  int64_t shape[3] = {2, 3, 4};
  sh_tensor *t = make(3, shape, SH_F64);
  double v[24];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) v[(i * 3 + j) * 4 + k] = 100 * i + 10 * j + k;
  CHECK_OK(sh_tensor_write_f64(t, v));
  return t;
}

static int same_shape(const sh_tensor *t, int ndim, const int64_t *shape) {
  if (t->ndim != ndim) return 0;
  for (int d = 0; d < ndim; d++) if (t->shape[d] != shape[d]) return 0;
  return 1;
}

/* Every element of view v (up to 3-d) equals ref(index) of the 100i+10j+k pattern. */
typedef double (*ref_fn)(const int64_t *idx);
static void check_elements(const char *what, const sh_tensor *v, ref_fn ref) {
  int64_t n[3] = {1, 1, 1}, idx[3];
  for (int d = 0; d < v->ndim; d++) n[d] = v->shape[d];
  int bad = 0;
  for (idx[0] = 0; idx[0] < n[0]; idx[0]++)
    for (idx[1] = 0; idx[1] < n[1]; idx[1]++)
      for (idx[2] = 0; idx[2] < n[2]; idx[2]++) {
        double got = NAN;
        if (sh_tensor_get(v, idx, &got) != SH_OK || got != ref(idx)) bad++;
      }
  CHECK(bad == 0, "%s: %d elements differ from the reference", what, bad);
}

static double ref_narrow(const int64_t *i) { return 100 * i[0] + 10 * (i[1] + 1) + i[2]; }
static double ref_select(const int64_t *i) { return 100 * i[0] + 10 * 2 + i[1]; }
static double ref_transpose(const int64_t *i) { return 100 * i[2] + 10 * i[1] + i[0]; }   /* (k, j, i) */
static double ref_permute(const int64_t *i) { return 100 * i[1] + 10 * i[2] + i[0]; }     /* (k, i, j) */
/* The value at flat (row-major) position f of the 2x3x4 pattern. */
static double flat_value(int64_t f) { return 100 * (f / 12) + 10 * (f / 4 % 3) + f % 4; }
static double ref_flat6x4(const int64_t *i) { return flat_value(i[0] * 4 + i[1]); }
static double ref_expand(const int64_t *i) { return 10 * 1 + i[1]; }                      /* row j=1 of i=0 */

/* Sizes whose element count (or whose strides, when a dim is 0) overflows 64 bits are refused
 * by every constructor instead of wrapping to a small count. */
static void test_size_overflow(void) {
  sh_tensor *t = NULL;
  int64_t huge[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
  CHECK_FAILS(sh_tensor_empty(&t, 2, huge, SH_F32, -1), SH_ERR_ARG, "2^50 elements");
  CHECK(t == NULL, "no tensor on failure");
  int64_t empty_but_wide[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_FAILS(sh_tensor_empty(&t, 3, empty_but_wide, SH_F32, -1), SH_ERR_ARG, "elements");
  CHECK_FAILS(sh_tensor_meta(&t, 2, huge, SH_F32, -1), SH_ERR_ARG, "elements");
  int64_t fine[3] = {0, (int64_t)1 << 20, (int64_t)1 << 20};
  CHECK_OK(sh_tensor_empty(&t, 3, fine, SH_F32, -1));
  sh_tensor *v = NULL;   /* views too: an empty tensor viewed with huge dims, a product that wraps */
  CHECK_FAILS(sh_view_reshape(&v, t, 3, empty_but_wide), SH_ERR_ARG, "2^50 elements");
  int64_t wraps[3] = {0, (int64_t)1 << 62, 4};
  CHECK_FAILS(sh_view_reshape(&v, t, 3, wraps), SH_ERR_ARG, "2^50 elements");
  CHECK(v == NULL, "no view on failure");
  sh_tensor_destroy(t);
}

static void test_create(void) {
  int64_t shape[3] = {2, 3, 4};
  sh_tensor *t = make(3, shape, SH_F32);
  CHECK(sh_tensor_numel(t) == 24, "numel %lld", (long long)sh_tensor_numel(t));
  CHECK(t->stride[0] == 12 && t->stride[1] == 4 && t->stride[2] == 1, "strides %lld %lld %lld",
        (long long)t->stride[0], (long long)t->stride[1], (long long)t->stride[2]);
  CHECK(sh_tensor_is_contiguous(t), "fresh tensor is contiguous");
  CHECK(((uintptr_t)sh_tensor_data(t) & 63) == 0, "storage is 64-byte aligned");
  char buf[64];
  sh_tensor_describe(t, buf, sizeof buf);
  CHECK(strcmp(buf, "f32[2,3,4] cpu") == 0, "describe: %s", buf);
  sh_tensor_destroy(t);

  sh_tensor *s = make(0, NULL, SH_I64);
  CHECK(sh_tensor_numel(s) == 1 && s->ndim == 0, "0-dim tensor has one element");
  CHECK_OK(sh_tensor_fill_(s, 42));
  double v = 0;
  CHECK_OK(sh_tensor_item(s, &v));
  CHECK(v == 42, "item %g", v);
  sh_tensor_destroy(s);

  int64_t empty_shape[2] = {0, 5};
  sh_tensor *e = make(2, empty_shape, SH_F32);
  CHECK(sh_tensor_numel(e) == 0, "empty tensor numel");
  sh_tensor_destroy(e);

  sh_tensor *bad = (sh_tensor *)1;
  int64_t neg[2] = {2, -1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_FAILS(sh_tensor_empty(&bad, 2, neg, SH_F32, -1), SH_ERR_ARG, "negative size");
  CHECK(bad == NULL, "failed creation leaves *out NULL");
  CHECK_FAILS(sh_tensor_empty(&bad, 9, nine, SH_F32, -1), SH_ERR_ARG, "0 to 8");
  CHECK_FAILS(sh_tensor_empty(&bad, 2, shape, 99, -1), SH_ERR_ARG, "unknown dtype");
}

static void test_views(void) {
  sh_tensor *t = iota3(), *v = NULL;

  CHECK_OK(sh_view_narrow(&v, t, 1, 1, 2));
  CHECK(same_shape(v, 3, (int64_t[]){2, 2, 4}) && v->storage == t->storage, "narrow shape, shared storage");
  check_elements("narrow", v, ref_narrow);
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_narrow(&v, t, 1, 2, 2), SH_ERR_ARG, "out of range");
  CHECK(v == NULL, "failed view leaves *out NULL");
  CHECK_FAILS(sh_view_narrow(&v, t, 3, 0, 1), SH_ERR_ARG, "dim 3 out of range");

  CHECK_OK(sh_view_select(&v, t, 1, -1));
  CHECK(same_shape(v, 2, (int64_t[]){2, 4}), "select drops the dim");
  check_elements("select", v, ref_select);
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_select(&v, t, 0, 2), SH_ERR_ARG, "index 2 is out of range");

  CHECK_OK(sh_view_reshape(&v, t, 2, (int64_t[]){6, 4}));
  check_elements("view 6x4", v, ref_flat6x4);
  sh_tensor_destroy(v);
  CHECK_OK(sh_view_reshape(&v, t, 2, (int64_t[]){-1, 4}));
  CHECK(same_shape(v, 2, (int64_t[]){6, 4}), "view infers -1");
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_reshape(&v, t, 2, (int64_t[]){-1, -1}), SH_ERR_ARG, "only one dim can be -1");
  CHECK_FAILS(sh_view_reshape(&v, t, 2, (int64_t[]){5, 5}), SH_ERR_ARG, "has 25 elements");
  CHECK_FAILS(sh_view_reshape(&v, t, 2, (int64_t[]){-1, 5}), SH_ERR_ARG, "cannot infer");

  sh_tensor *tt = NULL;
  CHECK_OK(sh_view_transpose(&tt, t, 0, 2));
  CHECK(same_shape(tt, 3, (int64_t[]){4, 3, 2}) && !sh_tensor_is_contiguous(tt), "transpose shape, non-contiguous");
  check_elements("transpose", tt, ref_transpose);
  CHECK_FAILS(sh_view_reshape(&v, tt, 1, (int64_t[]){24}), SH_ERR_ARG, "non-contiguous");
  /* Merging dims that stay contiguous among themselves is still a view: (3, 2) of the
   * transposed tensor have strides (4, 12), not mergeable; but dim 0 alone splits fine. */
  CHECK_OK(sh_view_reshape(&v, tt, 4, (int64_t[]){2, 2, 3, 2}));
  CHECK(v->storage == tt->storage, "splitting a dim of a non-contiguous tensor is a view");
  sh_tensor_destroy(v);
  CHECK_OK(sh_tensor_reshape(&v, tt, 2, (int64_t[]){4, 6}));
  CHECK(v->storage != tt->storage && sh_tensor_is_contiguous(v), "reshape copies when it must");
  int64_t i2[2] = {3, 5};
  double x = 0;
  CHECK_OK(sh_tensor_get(v, i2, &x));
  CHECK(x == 3 + 10 * 2 + 100 * 1, "reshape copy keeps row-major order of the view: %g", x);
  sh_tensor_destroy(v);

  CHECK_OK(sh_tensor_contiguous(&v, tt));
  CHECK(v->storage != tt->storage && sh_tensor_is_contiguous(v), "contiguous copies a transposed view");
  check_elements("contiguous", v, ref_transpose);
  sh_tensor_destroy(v);
  CHECK_OK(sh_tensor_contiguous(&v, t));
  CHECK(v->storage == t->storage, "contiguous of a contiguous tensor is an alias");
  sh_tensor_destroy(v);
  sh_tensor_destroy(tt);

  CHECK_OK(sh_view_permute(&v, t, (int[]){2, 0, 1}));
  CHECK(same_shape(v, 3, (int64_t[]){4, 2, 3}), "permute shape");
  check_elements("permute", v, ref_permute);
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_permute(&v, t, (int[]){0, 0, 1}), SH_ERR_ARG, "not a permutation");

  sh_tensor *row = NULL;
  CHECK_OK(sh_view_select(&row, t, 0, 0));          /* 3x4 */
  sh_tensor *r1 = NULL;
  CHECK_OK(sh_view_narrow(&r1, row, 0, 1, 1));      /* 1x4: row j=1 */
  CHECK_OK(sh_view_expand(&v, r1, 2, (int64_t[]){5, 4}));
  CHECK(v->stride[0] == 0 && same_shape(v, 2, (int64_t[]){5, 4}), "expand gives stride 0");
  check_elements("expand", v, ref_expand);
  sh_tensor_destroy(v);
  CHECK_OK(sh_view_expand(&v, r1, 3, (int64_t[]){2, -1, 4}));
  CHECK(same_shape(v, 3, (int64_t[]){2, 1, 4}), "expand adds leading dims, -1 keeps a size");
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_expand(&v, row, 2, (int64_t[]){5, 4}), SH_ERR_ARG, "cannot expand");
  sh_tensor_destroy(r1);
  sh_tensor_destroy(row);

  CHECK_OK(sh_view_unsqueeze(&v, t, 1));
  CHECK(same_shape(v, 4, (int64_t[]){2, 1, 3, 4}) && sh_tensor_is_contiguous(v), "unsqueeze");
  sh_tensor *sq = NULL;
  CHECK_OK(sh_view_squeeze(&sq, v, 1));
  CHECK(same_shape(sq, 3, (int64_t[]){2, 3, 4}), "squeeze undoes unsqueeze");
  sh_tensor_destroy(sq);
  CHECK_OK(sh_view_unsqueeze(&sq, t, -1));
  CHECK(same_shape(sq, 4, (int64_t[]){2, 3, 4, 1}), "unsqueeze at the end");
  sh_tensor_destroy(sq);
  CHECK_FAILS(sh_view_squeeze(&sq, v, 2), SH_ERR_ARG, "not 1");
  sh_tensor_destroy(v);

  CHECK_OK(sh_view_strided(&v, t, 2, (int64_t[]){3, 2}, (int64_t[]){8, 1}, 4));
  int bad = 0;
  for (int64_t a = 0; a < 3; a++)
    for (int64_t b = 0; b < 2; b++)
      if (sh_tensor_get(v, (int64_t[]){a, b}, &x) != SH_OK || x != flat_value(4 + 8 * a + b)) bad++;
  CHECK(bad == 0, "as_strided: %d elements differ from storage[4 + 8a + b]", bad);
  sh_tensor_destroy(v);
  CHECK_FAILS(sh_view_strided(&v, t, 2, (int64_t[]){3, 2}, (int64_t[]){8, 1}, 10), SH_ERR_ARG, "outside the storage");
  CHECK_FAILS(sh_view_strided(&v, t, 1, (int64_t[]){3}, (int64_t[]){-1}, 1), SH_ERR_ARG, "outside the storage");
  sh_tensor_destroy(t);
}

/* ---- copies between dtypes ------------------------------------------------------------ */

/* Values every dtype holds exactly (bool keeps only "non-zero"). */
static const double EXACT[6] = {0, 1, 2, 3, 5, 100};

static void test_copy_all_pairs(void) {
  int bad_pairs = 0;
  for (int a = 0; a < N_DT; a++)
    for (int b = 0; b < N_DT; b++) {
      int st = DTYPES[a], dt = DTYPES[b];
      /* The source is a transposed 3x2 view, so the strided path is taken too. */
      sh_tensor *src = make(2, (int64_t[]){2, 3}, st), *srcT = NULL, *dst = NULL;
      int ok = sh_tensor_write_f64(src, EXACT) == SH_OK && sh_view_transpose(&srcT, src, 0, 1) == SH_OK &&
               sh_tensor_to(&dst, srcT, dt, -1) == SH_OK;
      ok = ok && dst != NULL && dst->dtype == dt && sh_tensor_is_contiguous(dst);
      for (int i = 0; ok && i < 3; i++)
        for (int j = 0; ok && j < 2; j++) {
          double v = NAN, want = (st == SH_BOOL || dt == SH_BOOL) ? EXACT[j * 3 + i] != 0 : EXACT[j * 3 + i];
          if (sh_tensor_get(dst, (int64_t[]){i, j}, &v) != SH_OK || v != want) ok = 0;
        }
      if (!ok) { bad_pairs++; printf("# copy %s -> %s wrong\n", sh_dtype_name(st), sh_dtype_name(dt)); }
      sh_tensor_destroy(dst);
      sh_tensor_destroy(srcT);
      sh_tensor_destroy(src);
    }
  CHECK(bad_pairs == 0, "%d of 64 dtype pairs copied wrongly", bad_pairs);

  /* float -> int truncates toward zero, as C and torch do */
  sh_tensor *f = make(1, (int64_t[]){2}, SH_F32), *i = NULL;
  CHECK_OK(sh_tensor_write_f64(f, (double[]){-2.75, 2.75}));
  CHECK_OK(sh_tensor_to(&i, f, SH_I32, -1));
  double v0 = 0, v1 = 0;
  CHECK_OK(sh_tensor_get(i, (int64_t[]){0}, &v0));
  CHECK_OK(sh_tensor_get(i, (int64_t[]){1}, &v1));
  CHECK(v0 == -2 && v1 == 2, "f32 -> i32 truncates: %g %g", v0, v1);
  sh_tensor_destroy(i);
  sh_tensor_destroy(f);

  /* copy_ broadcasts the source and checks shapes */
  sh_tensor *dst = make(2, (int64_t[]){3, 4}, SH_F32), *row = make(1, (int64_t[]){4}, SH_F64);
  CHECK_OK(sh_tensor_write_f64(row, (double[]){1, 2, 3, 4}));
  CHECK_OK(sh_tensor_copy_(dst, row));
  double got[12];
  CHECK_OK(sh_tensor_read_f64(dst, got));
  int bad = 0;
  for (int k = 0; k < 12; k++) if (got[k] != k % 4 + 1) bad++;
  CHECK(bad == 0, "copy_ broadcast a row into every row");
  sh_tensor *wrong = make(1, (int64_t[]){3}, SH_F32);
  CHECK_FAILS(sh_tensor_copy_(dst, wrong), SH_ERR_ARG, "do not broadcast");
  CHECK_FAILS(sh_tensor_copy_(row, dst), SH_ERR_ARG, "does not broadcast to destination");
  sh_tensor_destroy(wrong);
  sh_tensor_destroy(row);
  sh_tensor_destroy(dst);
}

/* ---- bf16 / f16 rounding --------------------------------------------------------------- */

/* Independent decoders: the value of a bit pattern by its definition, in double. */
static double bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static double f16_value(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

/* h is the correctly rounded (nearest, ties to even) encoding of finite x when no
 * neighbour is strictly closer and, on a tie with a neighbour, h is the even one. The
 * neighbours of a pattern are the patterns one unit of magnitude up and down. */
static int is_nearest_even(double x, uint16_t h, double (*value)(uint16_t), uint16_t max_finite_mag) {
  double hv = value(h);
  if (isinf(hv)) {                 /* overflow: only right past the last finite value's half-ulp */
    uint16_t big = (uint16_t)((h & 0x8000) | max_finite_mag);
    double lim = value(big), ulp = fabs(lim - value((uint16_t)(big - 1)));
    return fabs(x) >= fabs(lim) + ulp / 2 && ((x < 0) == (hv < 0));
  }
  double err = fabs(hv - x);
  uint16_t mag = h & 0x7fff;
  for (int dir = -1; dir <= 1; dir += 2) {
    if ((mag == 0 && dir < 0) || (mag == max_finite_mag && dir > 0)) continue;
    uint16_t nb = (uint16_t)((h & 0x8000) | (mag + dir));
    double e2 = fabs(value(nb) - x);
    if (e2 < err) return 0;
    if (e2 == err && (h & 1)) return 0;
  }
  if (mag == 0 && x != 0 && hv == 0) {   /* rounding to zero: the other-signed side is no closer */
    uint16_t other = (uint16_t)((h ^ 0x8000) | 1);
    if (fabs(value(other) - x) < err) return 0;
  }
  return 1;
}

static float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_rounding(void) {
  /* exact ties: lower bits exactly half a unit */
  CHECK(sh_f32_to_bf16(bits_to_f32(0x3f808000u)) == 0x3f80, "bf16 tie rounds down to even");
  CHECK(sh_f32_to_bf16(bits_to_f32(0x3f818000u)) == 0x3f82, "bf16 tie rounds up to even");
  CHECK(sh_f32_to_bf16(bits_to_f32(0xbf818000u)) == 0xbf82, "bf16 negative tie");
  CHECK(sh_f32_to_bf16(bits_to_f32(0x3f808001u)) == 0x3f81, "bf16 just past a tie rounds up");
  CHECK(sh_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "f16 tie rounds down to even");
  CHECK(sh_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "f16 tie rounds up to even");
  CHECK(sh_f32_to_f16(ldexpf(1, -25)) == 0x0000, "f16 subnormal tie to zero (even)");
  CHECK(sh_f32_to_f16(3 * ldexpf(1, -25)) == 0x0002, "f16 subnormal tie up to even");
  CHECK(sh_f32_to_f16(65504.0f) == 0x7bff, "f16 largest finite");
  CHECK(sh_f32_to_f16(65520.0f) == 0x7c00, "f16 tie above the largest finite goes to inf");
  CHECK(sh_f32_to_f16(65519.99f) == 0x7bff, "f16 just below that tie stays finite");

  /* NaN stays NaN, +-Inf stay +-Inf, both ways */
  CHECK(isnan(sh_bf16_to_f32(sh_f32_to_bf16(NAN))), "bf16 keeps NaN");
  CHECK(isnan(sh_bf16_to_f32(sh_f32_to_bf16(bits_to_f32(0x7f800001u)))), "bf16 keeps a NaN whose payload is in the low bits");
  CHECK(isnan(sh_f16_to_f32(sh_f32_to_f16(NAN))), "f16 keeps NaN");
  CHECK(sh_bf16_to_f32(sh_f32_to_bf16(INFINITY)) == INFINITY, "bf16 keeps +inf");
  CHECK(sh_bf16_to_f32(sh_f32_to_bf16(-INFINITY)) == -INFINITY, "bf16 keeps -inf");
  CHECK(sh_f16_to_f32(sh_f32_to_f16(INFINITY)) == INFINITY, "f16 keeps +inf");
  CHECK(sh_f16_to_f32(sh_f32_to_f16(-INFINITY)) == -INFINITY, "f16 keeps -inf");
  CHECK(signbit(sh_f16_to_f32(sh_f32_to_f16(-0.0f))) && signbit(sh_bf16_to_f32(sh_f32_to_bf16(-0.0f))), "-0 keeps its sign");

  /* the decoders agree with the runtime on every pattern */
  int bad_dec = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    double a = sh_bf16_to_f32((uint16_t)h), b = bf16_value((uint16_t)h);
    double c = sh_f16_to_f32((uint16_t)h), d = f16_value((uint16_t)h);
    if (!(a == b || (isnan(a) && isnan(b))) || !(c == d || (isnan(c) && isnan(d)))) bad_dec++;
  }
  CHECK(bad_dec == 0, "%d bf16/f16 patterns decode differently from the definition", bad_dec);

  /* a sweep over f32 bit patterns (a stride coprime to 2^32 hits every exponent) */
  int bad_bf = 0, bad_h = 0;
  for (uint64_t k = 0; k < (1u << 22); k++) {
    uint32_t u = (uint32_t)(k * 1031u + (k >> 7) * 0x8000u);
    float x = bits_to_f32(u);
    if (!isfinite(x)) continue;
    if (!is_nearest_even(x, sh_f32_to_bf16(x), bf16_value, 0x7f7f)) bad_bf++;
    if (!is_nearest_even(x, sh_f32_to_f16(x), f16_value, 0x7bff)) bad_h++;
  }
  CHECK(bad_bf == 0, "%d f32 values not rounded to the nearest-even bf16", bad_bf);
  CHECK(bad_h == 0, "%d f32 values not rounded to the nearest-even f16", bad_h);

  /* through tensors: NaN and Inf survive f32 -> bf16/f16 -> f64 copies */
  double in[4] = {NAN, INFINITY, -INFINITY, 1.0 + ldexp(1, -8)};   /* the last: a bf16 tie */
  sh_tensor *f = make(1, (int64_t[]){4}, SH_F32);
  CHECK_OK(sh_tensor_write_f64(f, in));
  const int half[2] = {SH_BF16, SH_F16};
  for (int k = 0; k < 2; k++) {
    sh_tensor *h = NULL, *back = NULL;
    CHECK_OK(sh_tensor_to(&h, f, half[k], -1));
    CHECK_OK(sh_tensor_to(&back, h, SH_F64, -1));
    double out[4];
    CHECK_OK(sh_tensor_read_f64(back, out));
    CHECK(isnan(out[0]) && out[1] == INFINITY && out[2] == -INFINITY, "%s tensor keeps NaN and Inf", sh_dtype_name(half[k]));
    CHECK(out[3] == (half[k] == SH_BF16 ? 1.0 : 1.0 + ldexp(1, -8)), "%s tensor rounding of 1+2^-8: %.10g",
          sh_dtype_name(half[k]), out[3]);
    sh_tensor_destroy(back);
    sh_tensor_destroy(h);
  }
  sh_tensor_destroy(f);
}

/* ---- lifetime --------------------------------------------------------------------------- */

static void test_lifetime(void) {
  sh_mem_stats s0, s1;
  CHECK_OK(sh_mem_stats_get(-1, &s0));
  sh_tensor *t = iota3(), *v = NULL, *a = NULL;
  CHECK_OK(sh_view_select(&v, t, 0, 1));
  CHECK(t->storage->refcount == 2, "a view holds a reference");
  sh_tensor_release(t);
  CHECK(t->storage == NULL, "release drops the storage pointer");
  CHECK_FAILS(sh_view_narrow(&a, t, 0, 0, 1), SH_ERR_FREED, "used after :free()");
  CHECK_FAILS(sh_tensor_fill_(t, 1), SH_ERR_FREED, "fill_");
  double x = 0;
  CHECK_FAILS(sh_tensor_item(t, &x), SH_ERR_FREED, "freed");
  CHECK_OK(sh_tensor_get(v, (int64_t[]){2, 3}, &x));
  CHECK(x == 123, "the view still reads the storage its parent released: %g", x);
  CHECK_OK(sh_mem_stats_get(-1, &s1));
  CHECK(s1.allocated > s0.allocated, "storage alive while a view holds it");
  sh_tensor_destroy(v);
  CHECK_OK(sh_mem_stats_get(-1, &s1));
  CHECK(s1.allocated == s0.allocated, "last reference gone: allocated back to %lld, got %lld",
        (long long)s0.allocated, (long long)s1.allocated);
  sh_tensor_destroy(t);

  /* grads: same shape only; owned by the tensor */
  sh_tensor *p = make(2, (int64_t[]){2, 3}, SH_F32), *g = make(2, (int64_t[]){2, 3}, SH_F32);
  sh_tensor *g_bad = make(2, (int64_t[]){3, 2}, SH_F32);
  CHECK_FAILS(sh_tensor_set_grad(p, g_bad), SH_ERR_ARG, "does not match");
  CHECK_OK(sh_tensor_set_grad(p, g));
  CHECK(p->grad != NULL && p->grad->storage == g->storage, "grad is a view of the given tensor");
  CHECK_OK(sh_tensor_set_grad(p, NULL));
  CHECK(p->grad == NULL, "set_grad(NULL) clears");
  sh_tensor_destroy(g_bad);
  sh_tensor_destroy(g);
  sh_tensor_destroy(p);

  /* external memory is viewed, never counted or freed */
  static float ext[6] = {1, 2, 3, 4, 5, 6};
  sh_tensor *e = NULL;
  CHECK_OK(sh_mem_stats_get(-1, &s0));
  CHECK_OK(sh_tensor_wrap_external(&e, ext, sizeof ext, 2, (int64_t[]){2, 3}, SH_F32));
  CHECK_OK(sh_tensor_get(e, (int64_t[]){1, 2}, &x));
  CHECK(x == 6, "external tensor reads the buffer");
  CHECK_OK(sh_mem_stats_get(-1, &s1));
  CHECK(s1.allocated == s0.allocated, "external memory is not counted");
  sh_tensor_destroy(e);
  CHECK_FAILS(sh_tensor_wrap_external(&e, ext, sizeof ext, 2, (int64_t[]){2, 4}, SH_F32), SH_ERR_ARG, "cannot hold");
}

/* ---- allocator ------------------------------------------------------------------------ */

/* The size class of n bytes, computed from its definition: the smallest of 64, 128, ...,
 * 1024 and 2^p + k 2^(p-2) (k = 1..4) that holds n. */
static int64_t class_bytes(int64_t n) {
  for (int64_t b = 64; b <= 1024; b += 64) if (n <= b) return b;
  for (int p = 10; p < 62; p++)
    for (int k = 1; k <= 4; k++) {
      int64_t b = ((int64_t)1 << p) + k * ((int64_t)1 << (p - 2));
      if (n <= b) return b;
    }
  return -1;
}

static void test_allocator(void) {
  sh_mem_stats s0, s;
  CHECK_OK(sh_mem_empty_cache(-1));
  CHECK_OK(sh_mem_stats_get(-1, &s0));
  const int64_t sizes[4] = {1, 100, 2500, 100000};   /* f32 elements */
  sh_tensor *ts[4];
  /* allocated counts the bytes asked for (64-byte aligned); reserved the size-class blocks,
   * each fresh from the system since the cache was just emptied */
  int64_t expect = s0.allocated, expect_reserved = s0.reserved;
  for (int k = 0; k < 4; k++) {
    ts[k] = make(1, &sizes[k], SH_F32);
    expect += (sizes[k] * 4 + 63) / 64 * 64;
    expect_reserved += class_bytes(sizes[k] * 4);
    CHECK_OK(sh_mem_stats_get(-1, &s));
    CHECK(s.allocated == expect, "after %lld floats: allocated %lld, expected %lld", (long long)sizes[k],
          (long long)s.allocated, (long long)expect);
    CHECK(s.reserved == expect_reserved, "after %lld floats: reserved %lld, expected %lld", (long long)sizes[k],
          (long long)s.reserved, (long long)expect_reserved);
  }
  CHECK(s.peak >= s.allocated && s.reserved >= s.allocated, "peak and reserved cover allocated");
  int64_t high = s.allocated, n_sys = s.n_system_alloc;
  for (int k = 0; k < 4; k++) sh_tensor_destroy(ts[k]);
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.allocated == s0.allocated, "all freed: allocated %lld back to %lld", (long long)s.allocated, (long long)s0.allocated);
  CHECK(s.peak == high, "peak remembers the high point: %lld vs %lld", (long long)s.peak, (long long)high);
  CHECK(s.reserved - s.allocated >= high - s0.allocated, "freed blocks stay cached");

  /* the same sizes again come from the cache */
  for (int k = 0; k < 4; k++) ts[k] = make(1, &sizes[k], SH_F32);
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.n_system_alloc == n_sys, "cached blocks reused: %lld system allocations, expected %lld",
        (long long)s.n_system_alloc, (long long)n_sys);
  for (int k = 0; k < 4; k++) sh_tensor_destroy(ts[k]);

  CHECK_OK(sh_mem_reset_peak(-1));
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.peak == s.allocated, "reset_peak sets peak to the current allocation");
  CHECK_OK(sh_mem_empty_cache(-1));
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.reserved == s.allocated, "empty_cache: reserved %lld == allocated %lld", (long long)s.reserved, (long long)s.allocated);

  /* tags */
  int old = sh_mem_set_tag(SH_TAG_PARAM);
  sh_tensor *p = make(1, (int64_t[]){256}, SH_F32);
  sh_mem_set_tag(SH_TAG_GRAD);
  sh_tensor *g = make(1, (int64_t[]){512}, SH_F32);
  CHECK(sh_mem_set_tag(old) == SH_TAG_GRAD, "set_tag returns the previous tag");
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.by_tag[SH_TAG_PARAM] - s0.by_tag[SH_TAG_PARAM] == 1024, "param bytes %lld",
        (long long)(s.by_tag[SH_TAG_PARAM] - s0.by_tag[SH_TAG_PARAM]));
  CHECK(s.by_tag[SH_TAG_GRAD] - s0.by_tag[SH_TAG_GRAD] == 2048, "grad bytes");
  CHECK(s.peak_by_tag[SH_TAG_GRAD] - s0.by_tag[SH_TAG_GRAD] == 2048, "peak_by_tag at the peak");
  sh_tensor_destroy(g);
  sh_tensor_destroy(p);
  CHECK_OK(sh_mem_stats_get(-1, &s));
  CHECK(s.by_tag[SH_TAG_PARAM] == s0.by_tag[SH_TAG_PARAM] && s.by_tag[SH_TAG_GRAD] == s0.by_tag[SH_TAG_GRAD],
        "tagged bytes return on free");
  CHECK(strcmp(sh_mem_tag_name(SH_TAG_ACTIVATION), "activation") == 0, "tag names");

  /* out of memory through the limit: an error with the breakdown, nothing allocated */
  CHECK_OK(sh_mem_set_limit(-1, s.allocated + 1000));
  sh_tensor *big = (sh_tensor *)1;
  CHECK_FAILS(sh_tensor_empty(&big, 1, (int64_t[]){1024}, SH_F32, -1), SH_ERR_OOM, "memory limit reached");
  CHECK(big == NULL, "OOM leaves *out NULL");
  CHECK(strstr(sh_last_error(), "by tag: param") != NULL && strstr(sh_last_error(), "empty f32[1024]") != NULL,
        "OOM message names the request and the breakdown: %s", sh_last_error());
  sh_mem_stats s2;
  CHECK_OK(sh_mem_stats_get(-1, &s2));
  CHECK(s2.allocated == s.allocated && s2.limit == s.allocated + 1000, "a refused allocation changes nothing");
  sh_tensor *small = make(1, (int64_t[]){16}, SH_F32);
  CHECK(small != NULL, "allocations under the limit still succeed");
  sh_tensor_destroy(small);
  CHECK_OK(sh_mem_set_limit(-1, 0));
  CHECK_FAILS(sh_mem_set_limit(-1, -5), SH_ERR_ARG, "limit must be");
  CHECK_FAILS(sh_mem_stats_get(3, &s2), SH_ERR_DEVICE, "cuda:3");
}

static uint64_t f64_bits(double v) { uint64_t b; memcpy(&b, &v, 8); return b; }

/* NaNs with payloads (as kernels write them: f32 0xffffffff, bf16 0xffff, a signalling f64) read
 * back through item, get and read_f64 as the plain quiet NaN 0x7ff8000000000000, the one
 * LuaJIT takes for a number (its own values live in NaN payloads). */
static void test_host_nan(void) {
  static const struct { int dtype; uint64_t bits; } cases[] = {
    {SH_F32, 0xffffffffu}, {SH_F32, 0x7fc00001u}, {SH_BF16, 0xffffu}, {SH_F16, 0xfe01u},
    {SH_F64, 0xfff8000000000001ull}, {SH_F64, 0x7ff0000000000001ull}};
  const int64_t shape[1] = {2};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sh_tensor *t = make(1, shape, cases[c].dtype);
    size_t size = (size_t)sh_dtype_size(cases[c].dtype);
    memcpy((char *)t->storage->data + size, &cases[c].bits, size);   /* element 1; little-endian */
    double item = 0, got = 0, all[2] = {0, 0};
    sh_tensor *one = NULL;
    CHECK_OK(sh_view_narrow(&one, t, 0, 1, 1));
    CHECK_OK(sh_tensor_item(one, &item));
    CHECK_OK(sh_tensor_get(t, (const int64_t[]){1}, &got));
    CHECK_OK(sh_tensor_read_f64(t, all));
    CHECK(f64_bits(item) == 0x7ff8000000000000ull && f64_bits(got) == 0x7ff8000000000000ull &&
          f64_bits(all[1]) == 0x7ff8000000000000ull,
          "case %zu (%s 0x%llx): item 0x%016llx get 0x%016llx read 0x%016llx", c, sh_dtype_name(cases[c].dtype),
          (unsigned long long)cases[c].bits, (unsigned long long)f64_bits(item), (unsigned long long)f64_bits(got),
          (unsigned long long)f64_bits(all[1]));
    sh_tensor_destroy(one);
    sh_tensor_destroy(t);
  }
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_create);
  RUN(test_size_overflow);
  RUN(test_views);
  RUN(test_copy_all_pairs);
  RUN(test_rounding);
  RUN(test_lifetime);
  RUN(test_allocator);
  RUN(test_host_nan);
  return check_summary("test_tensor");
}
