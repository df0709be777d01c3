/* test_ops.c: every CPU op of ops.h against a straightforward f64 loop written here, over
 * broadcasting shapes, strided views and dtypes; the error paths; the allocator's stats
 * around ops; and the Philox streams behind the random fills. */
#include "check.h"
#include "core/tensor_internal.h"
#include "core/alloc.h"
#include "ops/ops.h"
#include "core/philox_internal.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static double urand(void) {          /* xorshift64: uniform in [0, 1) */
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

enum { HALVES, SIGNED, POSITIVE };
/* HALVES: +-{0.5, 1, 1.5, 2} (exact in every float dtype, never 0, often equal);
 * SIGNED: uniform in (-1, 1); POSITIVE: uniform in [0.5, 2). Integers get -4..4. */
static double draw(int kind, int dtype) {
  if (dtype == SH_BOOL) return urand() < 0.5;
  if (!sh_dtype_is_float(dtype)) return dtype == SH_U8 ? floor(urand() * 9) : floor(urand() * 9) - 4;
  if (kind == HALVES) return (urand() < 0.5 ? -1 : 1) * 0.5 * (1 + floor(urand() * 4));
  if (kind == SIGNED) return 2 * urand() - 1;
  return 0.5 + 1.5 * urand();
}

static sh_tensor *make(int ndim, const int64_t *shape, int dtype, int kind) {
  sh_tensor *t = NULL;
  if (sh_tensor_empty(&t, ndim, shape, dtype, -1)) return NULL;
  int64_t n = sh_tensor_numel(t);
  double *v = malloc(sizeof(double) * (n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = draw(kind, dtype);
  sh_tensor_write_f64(t, v);
  free(v);
  return t;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static double *values(const sh_tensor *t) {
  int64_t n = sh_tensor_numel(t);
  double *v = malloc(sizeof(double) * (n ? n : 1));
  sh_tensor_read_f64(t, v);
  return v;
}

/* The value v as stored in dtype (bf16/f16 through f32, as the ops compute). */
static double round_to(int dtype, double v) {
  switch (dtype) {
    case SH_F32: return (float)v;
    case SH_BF16: return sh_bf16_to_f32(sh_f32_to_bf16((float)v));
    case SH_F16: return sh_f16_to_f32(sh_f32_to_f16((float)v));
    default: return v;
  }
}

static int near(double got, double want, double rtol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= rtol * fabs(want) + 1e-300 || fabs(got - want) <= rtol * 1e-3;
}

/* Element of t (values in row-major order) that output element `flat` of `shape` reads. */
static int64_t bcast_index(const sh_tensor *t, int ndim, const int64_t *shape, int64_t flat) {
  int64_t idx = 0, mul = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t i = flat % shape[d];
    flat /= shape[d];
    int td = d - (ndim - t->ndim);
    if (td < 0) continue;
    if (t->shape[td] != 1) idx += i * mul;
    mul *= t->shape[td];
  }
  return idx;
}

static double ref_binary(int op, double x, double y) {
  switch (op) {
    case SH_OP_ADD: return x + y;
    case SH_OP_SUB: return x - y;
    case SH_OP_MUL: return x * y;
    case SH_OP_DIV: return x / y;
    case SH_OP_POW: return pow(x, y);
    case SH_OP_MAXIMUM: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    case SH_OP_MINIMUM: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    case SH_OP_EQ: return x == y;
    case SH_OP_LT: return x < y;
    default: return x > y;
  }
}

static double ref_unary(int op, double x) {
  switch (op) {
    case SH_OP_NEG: return -x;
    case SH_OP_EXP: return exp(x);
    case SH_OP_LOG: return log(x);
    case SH_OP_SQRT: return sqrt(x);
    case SH_OP_RSQRT: return 1 / sqrt(x);
    case SH_OP_TANH: return tanh(x);
    case SH_OP_ABS: return fabs(x);
    case SH_OP_SQUARE: return x * x;
    case SH_OP_RECIPROCAL: return 1 / x;
    default: return (x > 0) - (x < 0);
  }
}

static const char *opname[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "lt", "gt"};

/* out (computed by the runtime) against the f64 loop over a and b broadcast. */
static void check_binary_result(const char *what, int op, const sh_tensor *out, const sh_tensor *a,
                                const sh_tensor *b, double rtol) {
  double *va = values(a), *vb = values(b), *vo = values(out);
  int64_t n = sh_tensor_numel(out), bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    double x = va[bcast_index(a, out->ndim, out->shape, i)], y = vb[bcast_index(b, out->ndim, out->shape, i)];
    double want = round_to(out->dtype, ref_binary(op, x, y));
    if (!near(vo[i], want, rtol)) { if (!bad++) first = i; }
  }
  CHECK(bad == 0, "%s %s: %lld of %lld elements wrong (first %lld: got %g)", what, opname[op], (long long)bad,
        (long long)n, (long long)first, first >= 0 ? vo[first] : 0.0);
  free(va); free(vb); free(vo);
}

static void test_binary(const char *what, int op, sh_tensor *a, sh_tensor *b, int want_dtype, double rtol) {
  sh_tensor *out = NULL;
  int rc = sh_binary(&out, op, a, b);
  CHECK(rc == 0, "%s %s: %s", what, opname[op], sh_last_error());
  if (rc) return;
  CHECK(out->dtype == want_dtype, "%s %s: dtype %s, expected %s", what, opname[op], sh_dtype_name(out->dtype),
        sh_dtype_name(want_dtype));
  check_binary_result(what, op, out, a, b, rtol);
  sh_tensor_destroy(out);
}

static sh_tensor *transposed(sh_tensor *t, int d0, int d1) {
  sh_tensor *v = NULL;
  sh_view_transpose(&v, t, d0, d1);
  return v;
}

static sh_tensor *narrowed(sh_tensor *t, int dim, int64_t start, int64_t len) {
  sh_tensor *v = NULL;
  sh_view_narrow(&v, t, dim, start, len);
  return v;
}

static int64_t allocated(void) {
  sh_mem_stats s;
  sh_mem_stats_get(-1, &s);
  return s.allocated;
}

/* ---- elementwise --------------------------------------------------------------------- */

static void test_broadcasting(void) {
  static const struct { int na; int64_t a[3]; int nb; int64_t b[3]; } cases[] = {
    {2, {3, 4}, 2, {3, 4}}, {3, {2, 3, 4}, 1, {4}}, {3, {2, 1, 4}, 2, {3, 1}}, {1, {5}, 0, {0}},
    {2, {4, 1}, 2, {1, 5}}, {0, {0}, 2, {2, 3}}, {2, {64, 600}, 2, {64, 600}},   /* 64*600 > the OpenMP cut */
    {1, {70001}, 1, {70001}}, {3, {8, 64, 100}, 1, {100}}, {3, {8, 64, 100}, 3, {8, 64, 1}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sh_tensor *a = make(cases[c].na, cases[c].a, SH_F32, HALVES), *b = make(cases[c].nb, cases[c].b, SH_F32, HALVES);
    for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) {
      sh_tensor *base = a;
      sh_tensor *pa = NULL;
      if (op == SH_OP_POW) { sh_unary(&pa, SH_OP_ABS, a); base = pa; }
      test_binary("broadcast f32", op, base, b, SH_F32, 1e-6);
      sh_tensor_destroy(pa);
    }
    sh_tensor_destroy(a); sh_tensor_destroy(b);
  }
}

static void test_strided_inputs(void) {
  sh_tensor *a0 = make(2, SHAPE(4, 3), SH_F32, HALVES), *b0 = make(2, SHAPE(3, 8), SH_F32, HALVES);
  sh_tensor *a = transposed(a0, 0, 1), *b = narrowed(b0, 1, 2, 4);     /* both [3, 4], neither contiguous */
  for (int op = SH_OP_ADD; op <= SH_OP_GT; op++)
    if (op != SH_OP_POW) test_binary("strided", op, a, b, SH_F32, 1e-6);
  /* a transposed view with a broadcast row: rows of stride 3 against a [4] vector */
  sh_tensor *big0 = make(2, SHAPE(300, 200), SH_F32, SIGNED), *big = transposed(big0, 0, 1);
  sh_tensor *row = make(1, SHAPE(300), SH_F32, SIGNED);
  test_binary("strided big", SH_OP_MUL, big, row, SH_F32, 1e-6);
  sh_tensor_destroy(big0); sh_tensor_destroy(big); sh_tensor_destroy(row);
  sh_tensor_destroy(a0); sh_tensor_destroy(b0); sh_tensor_destroy(a); sh_tensor_destroy(b);
}

static void test_dtypes(void) {
  static const struct { int a, b, want; } pairs[] = {
    {SH_F64, SH_F64, SH_F64}, {SH_F32, SH_BF16, SH_F32}, {SH_BF16, SH_BF16, SH_BF16}, {SH_BF16, SH_F16, SH_F32},
    {SH_F16, SH_F16, SH_F16}, {SH_I64, SH_I32, SH_I64}, {SH_I32, SH_F32, SH_F32}, {SH_U8, SH_I64, SH_I64},
    {SH_F32, SH_F64, SH_F64}, {SH_I32, SH_I32, SH_I32}, {SH_BOOL, SH_I32, SH_I32},
  };
  for (size_t c = 0; c < sizeof pairs / sizeof pairs[0]; c++) {
    sh_tensor *a = make(2, SHAPE(5, 7), pairs[c].a, HALVES), *b = make(1, SHAPE(7), pairs[c].b, HALVES);
    char what[64];
    snprintf(what, sizeof what, "%s with %s", sh_dtype_name(pairs[c].a), sh_dtype_name(pairs[c].b));
    int ops[] = {SH_OP_ADD, SH_OP_SUB, SH_OP_MUL, SH_OP_MAXIMUM, SH_OP_MINIMUM, SH_OP_EQ, SH_OP_LT, SH_OP_GT};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
      if (pairs[c].a == SH_BOOL && ops[k] <= SH_OP_MUL) continue;
      test_binary(what, ops[k], a, b, pairs[c].want, pairs[c].want == SH_F16 || pairs[c].want == SH_BF16 ? 0 : 1e-12);
    }
    sh_tensor_destroy(a); sh_tensor_destroy(b);
  }
  /* integer division is true division into f32; integer pow stays integer */
  sh_tensor *i = make(1, SHAPE(9), SH_I32, HALVES), *j = NULL, *q = NULL;
  sh_tensor_fill_(i, 7);
  sh_binary_scalar(&j, SH_OP_ADD, i, -5, 0);             /* 2 */
  CHECK_OK(sh_binary(&q, SH_OP_DIV, i, j));
  double v = 0;
  if (q) sh_tensor_get(q, SHAPE(0), &v);
  CHECK(q && q->dtype == SH_F32 && v == 3.5, "i32 / i32 = %g in %s", v, q ? sh_dtype_name(q->dtype) : "-");
  sh_tensor_destroy(q); q = NULL;
  test_binary("i32 pow", SH_OP_POW, i, j, SH_I32, 0);
  /* a scalar an i64 cannot hold turns integer math into f32 */
  CHECK_OK(sh_binary_scalar(&q, SH_OP_ADD, i, INFINITY, 0));
  if (q) sh_tensor_get(q, SHAPE(0), &v);
  CHECK(q && q->dtype == SH_F32 && isinf(v), "i32 + inf = %g in %s", v, q ? sh_dtype_name(q->dtype) : "-");
  sh_tensor_destroy(q); q = NULL;
  CHECK_FAILS(sh_scale_(i, 1e30), SH_ERR_ARG, "scale_: cannot scale integer tensor");
  /* i64 math is exact beyond 2^53 */
  sh_tensor *big = NULL, *sum = NULL;
  sh_tensor_empty(&big, 0, SHAPE(0), SH_I64, -1);
  *(int64_t *)sh_tensor_data(big) = ((int64_t)1 << 60) + 1;
  CHECK_OK(sh_binary_scalar(&sum, SH_OP_ADD, big, 2, 0));
  CHECK(sum && *(int64_t *)sh_tensor_data(sum) == ((int64_t)1 << 60) + 3, "i64 add beyond 2^53 is exact");
  sh_tensor_destroy(big); sh_tensor_destroy(sum); sh_tensor_destroy(i); sh_tensor_destroy(j);
  /* bf16 results are f32 math rounded to nearest even once */
  sh_tensor *x = NULL, *y = NULL, *z = NULL;
  sh_tensor_empty(&x, 1, SHAPE(1), SH_BF16, -1);
  sh_tensor_empty(&y, 1, SHAPE(1), SH_BF16, -1);
  sh_tensor_fill_(x, 1.0);
  sh_tensor_fill_(y, 1.0 / 256);                          /* 1 + 2^-8 is a tie in bf16: rounds to 1 */
  CHECK_OK(sh_binary(&z, SH_OP_ADD, x, y));
  double r = 0;
  if (z) sh_tensor_item(z, &r);
  CHECK(r == 1.0, "bf16 1 + 2^-8 rounds to even: got %.9g", r);
  sh_tensor_destroy(z); z = NULL;
  sh_tensor_fill_(y, 3.0 / 256);                          /* 1 + 3*2^-8 rounds up to 1 + 2^-6 */
  CHECK_OK(sh_binary(&z, SH_OP_ADD, x, y));
  if (z) sh_tensor_item(z, &r);
  CHECK(r == 1.0 + 1.0 / 64, "bf16 1 + 3*2^-8 rounds up: got %.9g", r);
  sh_tensor_destroy(x); sh_tensor_destroy(y); sh_tensor_destroy(z);
}

static void test_scalars(void) {
  int dts[] = {SH_F32, SH_F64, SH_BF16, SH_I32};
  double scalars[] = {1.5, -2, 0.5};
  for (size_t d = 0; d < 4; d++) {
    sh_tensor *a = make(2, SHAPE(6, 5), dts[d], HALVES), *abs_a = NULL;
    if (sh_dtype_is_float(dts[d])) sh_unary(&abs_a, SH_OP_ABS, a);
    for (size_t k = 0; k < 3; k++) {
      sh_tensor *s = NULL;
      sh_tensor_empty(&s, 0, SHAPE(0), SH_F64, -1);
      sh_tensor_fill_(s, scalars[k]);
      for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) {
        for (int first = 0; first <= 1; first++) {
          if (op == SH_OP_POW && (!abs_a || first)) continue;
          sh_tensor *in = op == SH_OP_POW ? abs_a : a, *out = NULL;
          int rc = sh_binary_scalar(&out, op, in, scalars[k], first);
          CHECK(rc == 0, "scalar %s: %s", opname[op], sh_last_error());
          if (rc) continue;
          int integral = scalars[k] == floor(scalars[k]);
          int want = sh_dtype_is_float(dts[d]) ? dts[d] : (integral && op != SH_OP_DIV ? dts[d] : SH_F32);
          CHECK(out->dtype == want, "scalar %s on %s gives %s", opname[op], sh_dtype_name(dts[d]), sh_dtype_name(out->dtype));
          /* reference: the scalar rounded to the compute dtype, as the runtime does */
          s->dtype = SH_F64;
          sh_tensor_fill_(s, want == SH_F64 || !sh_dtype_is_float(want) ? scalars[k] : (float)scalars[k]);
          char what[64];
          snprintf(what, sizeof what, "scalar %s first=%d", sh_dtype_name(dts[d]), first);
          if (first) check_binary_result(what, op, out, s, in, want == SH_BF16 ? 0 : 1e-6);
          else check_binary_result(what, op, out, in, s, want == SH_BF16 ? 0 : 1e-6);
          sh_tensor_destroy(out);
        }
      }
      sh_tensor_destroy(s);
    }
    sh_tensor_destroy(a); sh_tensor_destroy(abs_a);
  }
}

static void test_unary(void) {
  int dts[] = {SH_F32, SH_F64, SH_BF16, SH_I32};
  for (size_t d = 0; d < 4; d++) {
    sh_tensor *a0 = make(2, SHAPE(70, 600), dts[d], POSITIVE), *a = transposed(a0, 0, 1);
    sh_tensor *s = make(2, SHAPE(3, 4), dts[d], SIGNED);
    for (int op = SH_OP_NEG; op <= SH_OP_SIGN; op++) {
      int keeps = op == SH_OP_NEG || op == SH_OP_ABS || op == SH_OP_SQUARE || op == SH_OP_SIGN;
      int want = sh_dtype_is_float(dts[d]) || keeps ? dts[d] : SH_F32;
      sh_tensor *ins[2] = {a, s};
      for (int k = 0; k < 2; k++) {
        if (k == 1 && (op == SH_OP_LOG || op == SH_OP_SQRT || op == SH_OP_RSQRT)) continue;
        sh_tensor *out = NULL;
        int rc = sh_unary(&out, op, ins[k]);
        CHECK(rc == 0 && out->dtype == want, "unary %d on %s: %s", op, sh_dtype_name(dts[d]), sh_last_error());
        if (rc) continue;
        double *vi = values(ins[k]), *vo = values(out);
        int64_t n = sh_tensor_numel(out), bad = 0;
        double rtol = want == SH_BF16 ? 1.0 / 256 : want == SH_F32 ? 3e-7 : 1e-15;
        for (int64_t i = 0; i < n; i++) bad += !near(vo[i], round_to(want, ref_unary(op, vi[i])), rtol);
        CHECK(bad == 0, "unary %d on %s%s: %lld wrong", op, sh_dtype_name(dts[d]), k ? "" : " (transposed)", (long long)bad);
        free(vi); free(vo);
        sh_tensor_destroy(out);
      }
    }
    sh_tensor_destroy(a0); sh_tensor_destroy(a); sh_tensor_destroy(s);
  }
}

/* exp and tanh over their whole range (overflow, denormal results, the tanh switch at
 * 0.625) against libm in f64: within 3e-7 of the f32-rounded value. */
static void test_exp_tanh_range(void) {
  enum { N = 2000 };
  sh_tensor *x = NULL, *e = NULL, *t = NULL;
  sh_tensor_empty(&x, 1, SHAPE(N), SH_F32, -1);
  for (int i = 0; i < N; i++) ((float *)sh_tensor_data(x))[i] = -110.0f + 200.0f * i / N + 0.0137f * (i % 7);
  CHECK_OK(sh_unary(&e, SH_OP_EXP, x));
  CHECK_OK(sh_unary(&t, SH_OP_TANH, x));
  sh_tensor *ts = NULL;
  int bad_e = 0, bad_t = 0, bad_s = 0;
  for (int i = 0; e && t && i < N; i++) {
    double v = ((float *)sh_tensor_data(x))[i];
    bad_e += !near(((float *)sh_tensor_data(e))[i], (float)exp(v), 3e-7);
    bad_t += !near(((float *)sh_tensor_data(t))[i], (float)tanh(v), 3e-7);
  }
  /* and finely around 0, where tanh is its polynomial and exp is near 1 */
  for (int i = 0; i < N; i++) ((float *)sh_tensor_data(x))[i] = -1.5f + 3.0f * i / N;
  CHECK_OK(sh_unary(&ts, SH_OP_TANH, x));
  for (int i = 0; ts && i < N; i++) {
    double v = ((float *)sh_tensor_data(x))[i];
    bad_s += !near(((float *)sh_tensor_data(ts))[i], (float)tanh(v), 3e-7);
  }
  CHECK(bad_e == 0 && bad_t == 0 && bad_s == 0, "exp/tanh over their range: %d, %d, %d wrong", bad_e, bad_t, bad_s);
  sh_tensor_destroy(x); sh_tensor_destroy(e); sh_tensor_destroy(t); sh_tensor_destroy(ts);
}

static void test_nan_inf(void) {
  sh_tensor *a = NULL, *b = NULL, *o = NULL;
  sh_tensor_empty(&a, 1, SHAPE(4), SH_F32, -1);
  sh_tensor_empty(&b, 1, SHAPE(4), SH_F32, -1);
  sh_tensor_write_f64(a, (const double[]){NAN, 1, INFINITY, -INFINITY});
  sh_tensor_write_f64(b, (const double[]){1, NAN, 1, 2});
  for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) test_binary("nan/inf", op, a, b, SH_F32, 0);
  int uops[] = {SH_OP_EXP, SH_OP_LOG, SH_OP_TANH, SH_OP_SQRT, SH_OP_ABS, SH_OP_SIGN};
  for (size_t k = 0; k < sizeof uops / sizeof uops[0]; k++) {
    CHECK_OK(sh_unary(&o, uops[k], a));
    double *vi = values(a), *vo = values(o);
    for (int i = 0; i < 4; i++) {
      double want = uops[k] == SH_OP_SIGN && isnan(vi[i]) ? 0 : ref_unary(uops[k], vi[i]);  /* torch: sign(NaN) = 0 */
      CHECK(near(vo[i], (float)want, 3e-7), "unary %d of %g = %g, expected %g", uops[k], vi[i], vo[i], want);
    }
    free(vi); free(vo);
    sh_tensor_destroy(o); o = NULL;
  }
  CHECK_OK(sh_reduce_all(&o, SH_OP_SUM, a));
  double v = 0;
  if (o) sh_tensor_item(o, &v);
  CHECK(isnan(v), "sum with a NaN is NaN, got %g", v);
  sh_tensor_destroy(o); o = NULL;
  for (int op = SH_OP_MAX; op <= SH_OP_MIN; op++) {
    CHECK_OK(sh_reduce_all(&o, op, a));
    if (o) sh_tensor_item(o, &v);
    CHECK(isnan(v), "max/min with a NaN is NaN, got %g", v);
    sh_tensor_destroy(o); o = NULL;
  }
  CHECK_OK(sh_reduce_all(&o, SH_OP_MAX, b));   /* b has its NaN second: the row kernel must see it */
  if (o) sh_tensor_item(o, &v);
  CHECK(isnan(v), "max of b is NaN, got %g", v);
  sh_tensor_destroy(o); o = NULL;
  CHECK_OK(sh_argmax(&o, b, 0, 0));
  if (o) sh_tensor_item(o, &v);
  CHECK(v == 1, "argmax points at the NaN: %g", v);
  sh_tensor_destroy(o); o = NULL;
  sh_tensor_write_f64(b, (const double[]){1, 2, INFINITY, 3});
  CHECK_OK(sh_reduce_all(&o, SH_OP_MAX, b));
  if (o) sh_tensor_item(o, &v);
  CHECK(isinf(v) && v > 0, "max with +inf is inf, got %g", v);
  sh_tensor_destroy(o);
  sh_tensor_destroy(a); sh_tensor_destroy(b);
}

static void test_inplace(void) {
  sh_tensor *d0 = make(2, SHAPE(40, 30), SH_F32, HALVES), *b = make(1, SHAPE(40), SH_F32, HALVES);
  sh_tensor *dst = transposed(d0, 0, 1);                    /* [30, 40], strided */
  for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) {
    if (op == SH_OP_POW) continue;
    sh_tensor *before = NULL;
    sh_tensor_to(&before, dst, SH_F32, -1);
    int64_t version = dst->version;
    CHECK_OK(sh_binary_(dst, op, b));
    CHECK(dst->version == version + 1, "binary_ bumps the version");
    check_binary_result("binary_", op, dst, before, b, 1e-6);
    sh_tensor_fill_(dst, 0);
    sh_tensor_copy_(dst, before);
    sh_tensor_destroy(before);
  }
  /* axpy_ on the strided destination, x broadcast */
  sh_tensor *before = NULL;
  sh_tensor_to(&before, dst, SH_F64, -1);
  CHECK_OK(sh_axpy_(dst, 0.25, b));
  double *vb = values(before), *vx = values(b), *vd = values(dst);
  int bad = 0;
  for (int64_t i = 0; i < 30 * 40; i++) bad += !near(vd[i], (float)(vb[i] + 0.25 * vx[i % 40]), 1e-6);
  CHECK(bad == 0, "axpy_: %d wrong", bad);
  free(vb); free(vx); free(vd);
  CHECK_OK(sh_scale_(dst, -3));
  vd = values(dst);
  vb = values(before);
  vx = values(b);
  bad = 0;
  for (int64_t i = 0; i < 30 * 40; i++) bad += !near(vd[i], -3 * (float)(vb[i] + 0.25 * vx[i % 40]), 1e-6);
  CHECK(bad == 0, "scale_: %d wrong", bad);
  free(vb); free(vx); free(vd);
  sh_tensor_destroy(before);
  /* bf16 destination, f32 source: computed in f32, rounded once */
  sh_tensor *h = make(1, SHAPE(40), SH_BF16, SIGNED), *h0 = NULL;
  sh_tensor_to(&h0, h, SH_F64, -1);
  CHECK_OK(sh_binary_(h, SH_OP_MUL, b));
  check_binary_result("bf16 binary_", SH_OP_MUL, h, h0, b, 0);
  /* errors: a float result into an int tensor; b not broadcasting to dst; bool */
  sh_tensor *i = make(1, SHAPE(40), SH_I32, HALVES), *big = make(2, SHAPE(2, 40), SH_F32, HALVES);
  sh_tensor *bl = make(1, SHAPE(40), SH_BOOL, HALVES);
  CHECK_FAILS(sh_binary_(i, SH_OP_ADD, b), SH_ERR_ARG, "cannot be stored in place");
  CHECK_FAILS(sh_binary_(b, SH_OP_ADD, big), SH_ERR_ARG, "does not broadcast to the in-place destination");
  CHECK_FAILS(sh_axpy_(bl, 1, bl), SH_ERR_ARG, "bool");
  CHECK_FAILS(sh_scale_(bl, 2), SH_ERR_ARG, "bool");
  CHECK_FAILS(sh_scale_(i, 0.5), SH_ERR_ARG, "in place by 0.5 (not a whole number)");
  CHECK_OK(sh_scale_(i, 2));
  sh_tensor_destroy(i); sh_tensor_destroy(big); sh_tensor_destroy(bl);
  sh_tensor_destroy(h); sh_tensor_destroy(h0);
  sh_tensor_destroy(d0); sh_tensor_destroy(dst); sh_tensor_destroy(b);
}

static void test_elementwise_errors(void) {
  sh_tensor *a = make(2, SHAPE(2, 3), SH_F32, HALVES), *b = make(2, SHAPE(4, 3), SH_F32, HALVES);
  sh_tensor *bl = make(1, SHAPE(3), SH_BOOL, HALVES), *out = (sh_tensor *)1;
  CHECK_FAILS(sh_binary(&out, SH_OP_ADD, a, b), SH_ERR_ARG, "add: shapes [2,3] and [4,3] do not broadcast");
  CHECK(out == NULL, "out is NULL after an error");
  CHECK_FAILS(sh_binary(&out, SH_OP_MUL, bl, bl), SH_ERR_ARG, "mul: arithmetic on bool");
  CHECK_FAILS(sh_binary(&out, SH_OP_SUB, a, bl), SH_ERR_ARG, "bool");
  CHECK_FAILS(sh_binary_scalar(&out, SH_OP_ADD, bl, 1, 0), SH_ERR_ARG, "bool");
  CHECK_FAILS(sh_unary(&out, SH_OP_EXP, bl), SH_ERR_ARG, "exp: not defined for bool");
  CHECK_FAILS(sh_binary(&out, 42, a, a), SH_ERR_ARG, "unknown op");
  CHECK_FAILS(sh_unary(&out, -1, a), SH_ERR_ARG, "unknown op");
  CHECK_FAILS(sh_binary(&out, SH_OP_ADD, a, NULL), SH_ERR_ARG, "add: expected a tensor");
  CHECK_OK(sh_binary(&out, SH_OP_EQ, bl, bl));
  CHECK(out && out->dtype == SH_BOOL, "bool == bool is allowed and gives bool");
  sh_tensor_destroy(out);
  sh_tensor_release(b);
  CHECK_FAILS(sh_binary(&out, SH_OP_ADD, a, b), SH_ERR_FREED, "used after :free()");
  CHECK_FAILS(sh_unary(&out, SH_OP_NEG, b), SH_ERR_FREED, "neg");
  CHECK_FAILS(sh_binary_(b, SH_OP_ADD, a), SH_ERR_FREED, "add");
  CHECK_FAILS(sh_reduce(&out, SH_OP_SUM, b, 0, 0), SH_ERR_FREED, "sum");
  CHECK_FAILS(sh_matmul(&out, a, b), SH_ERR_FREED, "matmul");
  int st = 0;
  CHECK(isnan(sh_sumsq(b, &st)) && st == SH_ERR_FREED, "sumsq of a freed tensor fails");
  sh_tensor_destroy(a); sh_tensor_destroy(b); sh_tensor_destroy(bl);
}

/* ---- reductions ---------------------------------------------------------------------- */

/* out against an f64 loop reducing a's values over dim. */
static void check_reduce(int op, const sh_tensor *a, int dim, const sh_tensor *out, double rtol, const char *what) {
  double *va = values(a), *vo = values(out);
  int64_t outer = 1, inner = 1, R = a->shape[dim], bad = 0;
  for (int d = 0; d < dim; d++) outer *= a->shape[d];
  for (int d = dim + 1; d < a->ndim; d++) inner *= a->shape[d];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      double acc = op == SH_OP_MAX ? -INFINITY : op == SH_OP_MIN ? INFINITY : 0;
      for (int64_t r = 0; r < R; r++) {
        double x = va[(o * R + r) * inner + i];
        acc = op == SH_OP_MAX ? fmax(acc, x) : op == SH_OP_MIN ? fmin(acc, x) : acc + x;
      }
      if (op == SH_OP_MEAN) acc /= R;
      bad += !near(vo[o * inner + i], round_to(out->dtype, acc), rtol);
    }
  CHECK(bad == 0, "%s op %d dim %d of %s: %lld wrong", what, op, dim, sh_desc(a), (long long)bad);
  free(va); free(vo);
}

static void test_reduce(void) {
  static const struct { int n; int64_t s[3]; } shapes[] = {
    {3, {5, 7, 9}}, {2, {3, 100000}}, {2, {100000, 3}}, {1, {1}}, {2, {4, 1}}, {2, {2, 20000}},
  };
  int dts[] = {SH_F32, SH_F64, SH_BF16, SH_I32};
  for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
    for (size_t k = 0; k < 4; k++) {
      if (k > 0 && c > 0 && c != 5) continue;                /* big shapes: f32 only */
      sh_tensor *a = make(shapes[c].n, shapes[c].s, dts[k], SIGNED);
      for (int op = SH_OP_SUM; op <= SH_OP_MIN; op++)
        for (int dim = -1; dim < shapes[c].n; dim++)
          for (int keep = 0; keep <= 1; keep++) {
            sh_tensor *o = NULL;
            int rc = sh_reduce(&o, op, a, dim, keep);
            CHECK(rc == 0, "reduce: %s", sh_last_error());
            if (rc) continue;
            int d = dim < 0 ? dim + a->ndim : dim;
            int want = sh_dtype_is_float(dts[k]) || op >= SH_OP_MAX ? dts[k] : op == SH_OP_MEAN ? SH_F32 : SH_I64;
            CHECK(o->dtype == want && o->ndim == a->ndim - !keep, "reduce result %s", sh_desc(o));
            check_reduce(op, a, d, o, dts[k] == SH_BF16 ? 1.0 / 128 : 1e-6, "reduce");
            sh_tensor_destroy(o);
          }
      sh_tensor_destroy(a);
    }
  /* a transposed input */
  sh_tensor *t0 = make(2, SHAPE(30, 50), SH_F32, SIGNED), *t = transposed(t0, 0, 1), *tc = NULL, *o = NULL;
  sh_tensor_to(&tc, t, SH_F32, -1);
  for (int dim = 0; dim < 2; dim++) {
    CHECK_OK(sh_reduce(&o, SH_OP_SUM, t, dim, 0));
    if (o) check_reduce(SH_OP_SUM, tc, dim, o, 1e-6, "transposed");
    sh_tensor_destroy(o); o = NULL;
  }
  sh_tensor_destroy(t0); sh_tensor_destroy(t); sh_tensor_destroy(tc);
  /* sums of a million f32 values match f64 (a plain f32 loop would be off by ~1e-4) */
  sh_tensor *m = make(1, SHAPE(1000000), SH_F32, POSITIVE), *s = NULL;
  CHECK_OK(sh_reduce_all(&s, SH_OP_SUM, m));
  double *vm = values(m), ref = 0, got = 0;
  for (int i = 0; i < 1000000; i++) ref += vm[i];
  if (s) sh_tensor_item(s, &got);
  CHECK(s && s->ndim == 0 && fabs(got - ref) <= 1e-7 * ref, "sum of 1e6 f32 = %.10g, f64 %.10g", got, ref);
  sh_tensor_destroy(s); s = NULL;
  CHECK_OK(sh_reduce_all(&s, SH_OP_MEAN, m));
  if (s) sh_tensor_item(s, &got);
  CHECK(fabs(got - ref / 1e6) <= 1e-7 * ref / 1e6, "mean of 1e6 f32 = %.10g", got);
  sh_tensor_destroy(s); s = NULL;
  int st = -1;
  double sq = sh_sumsq(m, &st), sref = 0;
  for (int i = 0; i < 1000000; i++) sref += vm[i] * vm[i];
  CHECK(st == 0 && fabs(sq - sref) <= 1e-12 * sref, "sumsq %.15g vs %.15g", sq, sref);
  free(vm);
  sh_tensor_destroy(m);
  /* sumsq of a strided bf16 view */
  sh_tensor *h0 = make(2, SHAPE(20, 30), SH_BF16, SIGNED), *h = transposed(h0, 0, 1);
  double *vh = values(h);
  sref = 0;
  for (int i = 0; i < 600; i++) sref += vh[i] * vh[i];
  sq = sh_sumsq(h, &st);
  CHECK(st == 0 && fabs(sq - sref) <= 1e-12 * sref, "sumsq bf16 %.15g vs %.15g", sq, sref);
  free(vh);
  sh_tensor_destroy(h0); sh_tensor_destroy(h);
  /* errors */
  sh_tensor *a = make(2, SHAPE(3, 0), SH_F32, SIGNED), *e = (sh_tensor *)1;
  CHECK_FAILS(sh_reduce(&e, SH_OP_SUM, a, 2, 0), SH_ERR_ARG, "sum: dim 2 out of range for f32[3,0]");
  CHECK(e == NULL, "out is NULL after an error");
  CHECK_FAILS(sh_reduce(&e, SH_OP_MAX, a, -1, 0), SH_ERR_ARG, "max: the reduced dim of f32[3,0] cpu is empty");
  CHECK_FAILS(sh_argmax(&e, a, 1, 0), SH_ERR_ARG, "argmax: the reduced dim");
  CHECK_FAILS(sh_reduce(&e, 9, a, 0, 0), SH_ERR_ARG, "unknown op");
  CHECK_OK(sh_reduce(&e, SH_OP_SUM, a, 1, 0));                /* an empty sum is 0 */
  double z = 1;
  if (e) { sh_tensor *row = NULL; sh_view_select(&row, e, 0, 2); sh_tensor_item(row, &z); sh_tensor_destroy(row); }
  CHECK(z == 0, "empty sum is 0, got %g", z);
  sh_tensor_destroy(e);
  sh_tensor_destroy(a);
}

static void test_argmax(void) {
  sh_tensor *a = make(3, SHAPE(4, 6, 5), SH_F32, HALVES);   /* HALVES: many ties */
  double *v = values(a);
  for (int dim = 0; dim < 3; dim++) {
    sh_tensor *o = NULL;
    CHECK_OK(sh_argmax(&o, a, dim, dim == 1));
    if (!o) continue;
    CHECK(o->dtype == SH_I64 && o->ndim == (dim == 1 ? 3 : 2), "argmax result %s", sh_desc(o));
    double *vo = values(o);
    int64_t outer = 1, inner = 1, R = a->shape[dim], bad = 0;
    for (int d = 0; d < dim; d++) outer *= a->shape[d];
    for (int d = dim + 1; d < 3; d++) inner *= a->shape[d];
    for (int64_t p = 0; p < outer; p++)
      for (int64_t i = 0; i < inner; i++) {
        int64_t best = 0;
        for (int64_t r = 1; r < R; r++)
          if (v[(p * R + r) * inner + i] > v[(p * R + best) * inner + i]) best = r;
        bad += vo[p * inner + i] != best;
      }
    CHECK(bad == 0, "argmax dim %d: %lld wrong (first max wins ties)", dim, (long long)bad);
    free(vo);
    sh_tensor_destroy(o);
  }
  free(v);
  sh_tensor_destroy(a);
}

static void test_sum_to_shape(void) {
  static const struct { int n; int64_t s[4]; } targets[] = {
    {1, {6}}, {2, {5, 1}}, {2, {1, 6}}, {3, {4, 1, 6}}, {0, {0}}, {3, {4, 5, 6}}, {3, {1, 5, 1}},
  };
  sh_tensor *a0 = make(3, SHAPE(6, 5, 4), SH_F32, SIGNED), *a = NULL;
  sh_view_permute(&a, a0, (const int[]){2, 1, 0});        /* [4,5,6], non-contiguous */
  double *va = values(a);
  for (size_t c = 0; c < sizeof targets / sizeof targets[0]; c++) {
    int n = targets[c].n;
    sh_tensor *o = NULL;
    int rc = sh_sum_to_shape(&o, a, n, targets[c].s);
    CHECK(rc == 0, "sum_to_shape: %s", sh_last_error());
    if (rc) continue;
    CHECK(o->ndim == n, "sum_to_shape gives %s", sh_desc(o));
    double *want = calloc(120, sizeof(double)), *vo = values(o);
    /* every element of a adds into the target element it broadcast from */
    for (int64_t i = 0; i < 120; i++) want[bcast_index(o, 3, a->shape, i)] += va[i];
    int64_t bad = 0;
    for (int64_t i = 0; i < sh_tensor_numel(o); i++) bad += !near(vo[i], (float)want[i], 1e-6);
    CHECK(bad == 0, "sum_to_shape to %s: %lld wrong", sh_desc(o), (long long)bad);
    free(want); free(vo);
    sh_tensor_destroy(o);
  }
  free(va);
  /* [B,T,C] -> [C], big enough to split the rows over threads */
  sh_tensor *g = make(3, SHAPE(16, 512, 48), SH_F32, SIGNED), *o = NULL;
  CHECK_OK(sh_sum_to_shape(&o, g, 1, SHAPE(48)));
  double *vg = values(g), *vo = o ? values(o) : NULL;
  int bad = 0;
  for (int c = 0; c < 48 && vo; c++) {
    double s = 0;
    for (int r = 0; r < 16 * 512; r++) s += vg[r * 48 + c];
    bad += !near(vo[c], (float)s, 1e-6);
  }
  CHECK(vo && bad == 0, "sum_to_shape [16,512,48] -> [48]: %d wrong", bad);
  free(vg); free(vo);
  sh_tensor_destroy(o); o = (sh_tensor *)1;
  CHECK_FAILS(sh_sum_to_shape(&o, g, 1, SHAPE(3)), SH_ERR_ARG, "sum_to_shape: f32[16,512,48] cpu does not broadcast from shape [3]");
  CHECK(o == NULL, "out is NULL after an error");
  CHECK_FAILS(sh_sum_to_shape(&o, g, 4, SHAPE(1, 16, 512, 48)), SH_ERR_ARG, "does not broadcast");
  sh_tensor_destroy(g);
  sh_tensor_destroy(a0); sh_tensor_destroy(a);
}

/* ---- matmul -------------------------------------------------------------------------- */

/* out against an f64 loop: a [..., M, K] (1-D: one row), b [..., K, N] (1-D: one column). */
static void check_matmul(const sh_tensor *a, const sh_tensor *b, const sh_tensor *out, double rtol, const char *what) {
  double *va = values(a), *vb = values(b), *vo = values(out);
  int64_t M = a->ndim == 1 ? 1 : a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
  int64_t N = b->ndim == 1 ? 1 : b->shape[b->ndim - 1];
  int nb = out->ndim - (a->ndim > 1) - (b->ndim > 1);
  int64_t batch = 1;
  for (int d = 0; d < nb; d++) batch *= out->shape[d];
  /* batch index -> each operand's batch index, by broadcasting over the batch shape */
  int64_t bad = 0;
  for (int64_t p = 0; p < batch; p++) {
    int64_t pa = 0, pb = 0, ma = 1, mb = 1, rest = p;
    for (int d = nb - 1; d >= 0; d--) {
      int64_t i = rest % out->shape[d];
      rest /= out->shape[d];
      int da = d - (nb - (a->ndim - 2)), db = d - (nb - (b->ndim - 2));
      if (a->ndim > 2 && da >= 0) { if (a->shape[da] != 1) pa += i * ma; ma *= a->shape[da]; }
      if (b->ndim > 2 && db >= 0) { if (b->shape[db] != 1) pb += i * mb; mb *= b->shape[db]; }
    }
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0, mag = 0;
        for (int64_t k = 0; k < K; k++) {
          double x = va[pa * M * K + i * K + k] * vb[pb * K * N + k * N + j];
          s += x;
          mag += fabs(x);
        }
        double got = vo[(p * M + i) * N + j];
        bad += !(fabs(got - round_to(out->dtype, s)) <= rtol * mag + 1e-30);
      }
  }
  CHECK(bad == 0, "%s: %s @ %s -> %s: %lld wrong", what, sh_desc(a), sh_desc(b), sh_desc(out), (long long)bad);
  free(va); free(vb); free(vo);
}

static void test_matmul_case(const char *what, sh_tensor *a, sh_tensor *b, int want_ndim, const int64_t *want_shape,
                             int want_dtype, double rtol) {
  sh_tensor *o = NULL;
  int rc = sh_matmul(&o, a, b);
  CHECK(rc == 0, "%s: %s", what, sh_last_error());
  if (rc) return;
  CHECK(o->ndim == want_ndim && memcmp(o->shape, want_shape, sizeof(int64_t) * want_ndim) == 0 && o->dtype == want_dtype,
        "%s: result %s", what, sh_desc(o));
  check_matmul(a, b, o, rtol, what);
  sh_tensor_destroy(o);
}

static void test_matmul(void) {
  static const struct { int na; int64_t a[4]; int nb; int64_t b[4]; int no; int64_t o[4]; } cases[] = {
    {2, {3, 4}, 2, {4, 5}, 2, {3, 5}},
    {1, {4}, 1, {4}, 0, {0}},
    {1, {4}, 2, {4, 5}, 1, {5}},
    {2, {3, 4}, 1, {4}, 1, {3}},
    {3, {2, 3, 4}, 2, {4, 5}, 3, {2, 3, 5}},                 /* folds into one gemm */
    {3, {2, 3, 4}, 3, {2, 4, 5}, 3, {2, 3, 5}},
    {4, {2, 1, 3, 4}, 3, {5, 4, 2}, 4, {2, 5, 3, 2}},         /* batch broadcast */
    {2, {3, 4}, 3, {2, 4, 5}, 3, {2, 3, 5}},
    {3, {2, 3, 4}, 1, {4}, 2, {2, 3}},
    {1, {4}, 3, {2, 4, 5}, 2, {2, 5}},
    {3, {128, 8, 8}, 3, {128, 8, 8}, 3, {128, 8, 8}},         /* small products: OpenMP over the batch */
    {2, {300, 200}, 2, {200, 100}, 2, {300, 100}},
    {2, {0, 4}, 2, {4, 5}, 2, {0, 5}},
    {2, {3, 0}, 2, {0, 5}, 2, {3, 5}},                         /* K = 0: zeros */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sh_tensor *a = make(cases[c].na, cases[c].a, SH_F32, SIGNED), *b = make(cases[c].nb, cases[c].b, SH_F32, SIGNED);
    test_matmul_case("matmul f32", a, b, cases[c].no, cases[c].o, SH_F32, 1e-6);
    sh_tensor_destroy(a); sh_tensor_destroy(b);
  }
  /* views: a transposed (column-major), b with a row stride of 8, a strided copy-needing view */
  sh_tensor *a0 = make(2, SHAPE(4, 3), SH_F32, SIGNED), *a = transposed(a0, 0, 1);           /* [3,4] */
  sh_tensor *b0 = make(2, SHAPE(4, 8), SH_F32, SIGNED), *b = narrowed(b0, 1, 1, 5);          /* [4,5] */
  sh_tensor *bt = transposed(b0, 0, 1), *bs = NULL;                                        /* [8,4] */
  sh_view_strided(&bs, b0, 2, SHAPE(4, 3), SHAPE(8, 2), 1);                                /* both strides > 1 */
  test_matmul_case("transposed a", a, b, 2, SHAPE(3, 5), SH_F32, 1e-6);
  test_matmul_case("transposed b", a, b0, 2, SHAPE(3, 8), SH_F32, 1e-6);
  test_matmul_case("a @ column-major", bt, a0, 2, SHAPE(8, 3), SH_F32, 1e-6);
  test_matmul_case("strided", a, bs, 2, SHAPE(3, 3), SH_F32, 1e-6);
  sh_tensor *x0 = make(3, SHAPE(2, 4, 3), SH_F32, SIGNED), *x = transposed(x0, 1, 2);       /* [2,3,4] strided */
  test_matmul_case("batched transposed", x, b, 3, SHAPE(2, 3, 5), SH_F32, 1e-6);
  /* dtypes: bf16 in, bf16 out (f32 math); f64 through dgemm; mixed promotes */
  sh_tensor *h = NULL, *hb = NULL, *d = NULL, *db = NULL;
  sh_tensor_to(&h, a, SH_BF16, -1);
  sh_tensor_to(&hb, b, SH_BF16, -1);
  sh_tensor_to(&d, a, SH_F64, -1);
  sh_tensor_to(&db, b, SH_F64, -1);
  test_matmul_case("bf16", h, hb, 2, SHAPE(3, 5), SH_BF16, 1.0 / 128);
  test_matmul_case("bf16 @ f32", h, b, 2, SHAPE(3, 5), SH_F32, 1e-6);
  test_matmul_case("f64", d, db, 2, SHAPE(3, 5), SH_F64, 1e-14);
  test_matmul_case("f32 @ f64", a, db, 2, SHAPE(3, 5), SH_F64, 1e-6);
  /* errors */
  sh_tensor *i = make(2, SHAPE(4, 5), SH_I32, HALVES), *s = make(0, SHAPE(0), SH_F32, SIGNED), *o = (sh_tensor *)1;
  CHECK_FAILS(sh_matmul(&o, a, a), SH_ERR_ARG, "matmul: inner dims differ (4 vs 3) in f32[3,4] cpu @ f32[3,4] cpu");
  CHECK(o == NULL, "out is NULL after an error");
  sh_tensor *i2 = make(2, SHAPE(5, 2), SH_I32, HALVES);
  CHECK_FAILS(sh_matmul(&o, i, i2), SH_ERR_ARG, "matmul: needs float tensors, got i32[4,5] cpu @ i32[5,2] cpu");
  /* an integer operand is refused, not promoted (issue 12, item 13) */
  CHECK_FAILS(sh_matmul(&o, a, i), SH_ERR_ARG, "matmul: needs float tensors, got f32[3,4] cpu @ i32[4,5] cpu");
  sh_tensor_destroy(i2);
  CHECK_FAILS(sh_matmul(&o, s, a), SH_ERR_ARG, "at least 1-D");
  sh_tensor *y = make(3, SHAPE(3, 4, 5), SH_F32, SIGNED);
  CHECK_FAILS(sh_matmul(&o, x, y), SH_ERR_ARG, "matmul: shapes [2] and [3] do not broadcast");
  sh_tensor_destroy(y); sh_tensor_destroy(i); sh_tensor_destroy(s);
  sh_tensor_destroy(h); sh_tensor_destroy(hb); sh_tensor_destroy(d); sh_tensor_destroy(db);
  sh_tensor_destroy(x0); sh_tensor_destroy(x);
  sh_tensor_destroy(a0); sh_tensor_destroy(a); sh_tensor_destroy(b0); sh_tensor_destroy(b);
  sh_tensor_destroy(bt); sh_tensor_destroy(bs);
}

static void test_gemm(void) {
  sh_tensor *a = make(2, SHAPE(4, 3), SH_F32, SIGNED), *b = make(2, SHAPE(5, 4), SH_F32, SIGNED);
  /* c = 2 a^T b^T + 0.5 c, into a row-major, a column-major (transposed view) and a bf16 c */
  for (int form = 0; form < 3; form++) {
    sh_tensor *c0 = form == 1 ? make(2, SHAPE(5, 3), SH_F32, SIGNED) : make(2, SHAPE(3, 5), form == 2 ? SH_BF16 : SH_F32, SIGNED);
    sh_tensor *c = form == 1 ? transposed(c0, 0, 1) : c0, *before = NULL;
    sh_tensor_to(&before, c, SH_F64, -1);
    CHECK_OK(sh_gemm_(c, a, b, 1, 1, 2.0, 0.5));
    double *va = values(a), *vb = values(b), *vc = values(c), *v0 = values(before);
    int bad = 0;
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += va[k * 3 + i] * vb[j * 4 + k];
        double want = round_to(c->dtype, 2 * s + 0.5 * v0[i * 5 + j]);
        bad += !(fabs(vc[i * 5 + j] - want) <= (form == 2 ? 1.0 / 64 : 1e-5));
      }
    CHECK(bad == 0, "gemm_ form %d: %d wrong", form, bad);
    free(va); free(vb); free(vc); free(v0);
    sh_tensor_destroy(before);
    if (c != c0) sh_tensor_destroy(c);
    sh_tensor_destroy(c0);
  }
  /* accumulating into the same c twice doubles the product (beta = 1) */
  sh_tensor *c = NULL, *ref = NULL;
  sh_tensor_empty(&c, 2, SHAPE(3, 5), SH_F32, -1);
  sh_tensor_fill_(c, 0);
  CHECK_OK(sh_gemm_(c, a, b, 1, 1, 1.0, 1.0));
  CHECK_OK(sh_gemm_(c, a, b, 1, 1, 1.0, 1.0));
  sh_tensor *at = transposed(a, 0, 1), *btt = transposed(b, 0, 1);
  sh_matmul(&ref, at, btt);
  double *vc = values(c), *vr = values(ref);
  int bad = 0;
  for (int i = 0; i < 15; i++) bad += !near(vc[i], 2 * vr[i], 1e-6);
  CHECK(bad == 0, "gemm_ accumulates with beta = 1: %d wrong", bad);
  free(vc); free(vr);
  CHECK_FAILS(sh_gemm_(c, a, b, 0, 1, 1, 0), SH_ERR_ARG, "gemm_: op(a) [4,3] @ op(b) [4,5] does not give c f32[3,5] cpu");
  CHECK_FAILS(sh_gemm_(c, at, b, 0, 0, 1, 0), SH_ERR_ARG, "gemm_");
  sh_tensor_destroy(at); sh_tensor_destroy(btt); sh_tensor_destroy(ref);
  sh_tensor_destroy(c); sh_tensor_destroy(a); sh_tensor_destroy(b);
}

/* ---- creation ------------------------------------------------------------------------ */

static void test_arange(void) {
  static const struct { double s, e, st; int dtype; int64_t n; } cases[] = {
    {0, 5, 1, SH_I64, 5}, {1, 2, 0.25, SH_F32, 4}, {5, 0, -2, SH_F64, 3}, {0, 0, 1, SH_F32, 0}, {-1, 1, 0.3, SH_F64, 7},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sh_tensor *t = NULL;
    CHECK_OK(sh_arange(&t, cases[c].s, cases[c].e, cases[c].st, cases[c].dtype, -1));
    if (!t) continue;
    CHECK(t->ndim == 1 && t->shape[0] == cases[c].n && t->dtype == cases[c].dtype, "arange gives %s", sh_desc(t));
    double *v = values(t);
    int bad = 0;
    for (int64_t i = 0; i < t->shape[0]; i++) bad += !near(v[i], round_to(t->dtype, cases[c].s + i * cases[c].st), 1e-7);
    CHECK(bad == 0, "arange(%g, %g, %g): %d wrong", cases[c].s, cases[c].e, cases[c].st, bad);
    free(v);
    sh_tensor_destroy(t);
  }
  sh_tensor *t = (sh_tensor *)1;
  CHECK_FAILS(sh_arange(&t, 0, 5, 0, SH_F32, -1), SH_ERR_ARG, "non-zero step");
  CHECK(t == NULL, "out is NULL after an error");
  CHECK_FAILS(sh_arange(&t, 0, 5, -1, SH_F32, -1), SH_ERR_ARG, "never reaches");
  CHECK_FAILS(sh_arange(&t, 0, 5, 1, 99, -1), SH_ERR_ARG, "dtype");
}

static void test_random(void) {
  enum { N = 1000000 };
  sh_tensor *a = NULL, *b = NULL;
  sh_tensor_empty(&a, 1, SHAPE(N), SH_F32, -1);
  sh_tensor_empty(&b, 1, SHAPE(N), SH_F32, -1);
  CHECK_OK(sh_random_normal_(a, 42, 8, 0, 1));
  CHECK_OK(sh_random_normal_(b, 42, 8, 0, 1));
  CHECK(memcmp(sh_tensor_data(a), sh_tensor_data(b), sizeof(float) * N) == 0, "same (seed, offset), same numbers");
  double *v = values(a), mean = 0, var = 0;
  for (int i = 0; i < N; i++) mean += v[i];
  mean /= N;
  for (int i = 0; i < N; i++) var += (v[i] - mean) * (v[i] - mean);
  double sd = sqrt(var / N);
  CHECK(fabs(mean) < 5e-3 && fabs(sd - 1) < 5e-3, "1e6 normals: mean %g, std %g", mean, sd);
  /* drawing n then m equals drawing n + m; n = 1001 also splits a Box-Muller pair */
  sh_tensor *p = NULL, *q = NULL;
  sh_view_narrow(&p, b, 0, 0, 1001);
  sh_view_narrow(&q, b, 0, 1001, N - 1001);
  CHECK_OK(sh_random_normal_(p, 42, 8, 0, 1));
  CHECK_OK(sh_random_normal_(q, 42, 8 + 1001, 0, 1));
  CHECK(memcmp(sh_tensor_data(a), sh_tensor_data(b), sizeof(float) * N) == 0, "n then m equals n + m");
  CHECK_OK(sh_random_normal_(b, 43, 8, 0, 1));
  CHECK(memcmp(sh_tensor_data(a), sh_tensor_data(b), sizeof(float) * N) != 0, "another seed, other numbers");
  /* every value is the reference formula's, also from a counter that starts mid-block */
  sh_tensor *r = NULL, *u = NULL;
  sh_tensor_empty(&r, 2, SHAPE(7, 15), SH_F32, -1);
  sh_tensor_empty(&u, 2, SHAPE(7, 15), SH_F32, -1);
  CHECK_OK(sh_random_normal_(r, 99, 6, 0.5, 2));
  CHECK_OK(sh_random_uniform_(u, 99, 3, -1, 2));
  int exact = 0;
  for (int i = 0; i < 105; i++) {
    exact += ((float *)sh_tensor_data(r))[i] == 0.5f + 2.0f * sh_philox_normal(99, 6, i);
    exact += ((float *)sh_tensor_data(u))[i] == -1.0f + 3.0f * sh_philox_uniform(99, 3, i);
  }
  CHECK(exact == 210, "fills equal sh_philox_normal/uniform bit for bit: %d of 210", exact);
  sh_tensor_destroy(r); sh_tensor_destroy(u);
  /* a strided target gets the same numbers in row-major order */
  sh_tensor *m0 = NULL, *mt = NULL, *mc = NULL;
  sh_tensor_empty(&m0, 2, SHAPE(300, 200), SH_F32, -1);
  sh_tensor_empty(&mc, 2, SHAPE(200, 300), SH_F32, -1);
  sh_view_transpose(&mt, m0, 0, 1);
  CHECK_OK(sh_random_normal_(mt, 7, 0, 3, 2));
  CHECK_OK(sh_random_normal_(mc, 7, 0, 3, 2));
  double *vt = values(mt), *vc = values(mc);
  CHECK(memcmp(vt, vc, sizeof(double) * 60000) == 0, "strided and contiguous targets agree");
  mean = 0;
  for (int i = 0; i < 60000; i++) mean += vc[i] / 60000;
  CHECK(fabs(mean - 3) < 0.05, "normal_(mean 3, std 2) has mean %g", mean);
  free(vt); free(vc);
  /* uniform: in (low, high], mean in the middle, and the normals' Box-Muller inputs */
  CHECK_OK(sh_random_uniform_(a, 5, 0, -1, 3));
  free(v);
  v = values(a);
  double lo = 1e9, hi = -1e9;
  mean = 0;
  for (int i = 0; i < N; i++) { mean += v[i] / N; lo = fmin(lo, v[i]); hi = fmax(hi, v[i]); }
  CHECK(lo > -1 && hi <= 3 && fabs(mean - 1) < 0.01, "uniform(-1, 3): min %g max %g mean %g", lo, hi, mean);
  /* a bf16 target holds the f32 numbers rounded */
  sh_tensor *h = NULL;
  sh_tensor_empty(&h, 1, SHAPE(100), SH_BF16, -1);
  CHECK_OK(sh_random_normal_(h, 42, 8, 0, 1));
  CHECK_OK(sh_random_normal_(b, 42, 8, 0, 1));
  double *vh = values(h), *vf = values(b);
  int bad = 0;
  for (int i = 0; i < 100; i++) bad += vh[i] != round_to(SH_BF16, vf[i]);
  CHECK(bad == 0, "bf16 normals are the f32 ones rounded: %d differ", bad);
  free(vh); free(vf);
  sh_tensor *i32 = NULL;
  sh_tensor_empty(&i32, 1, SHAPE(4), SH_I32, -1);
  CHECK_FAILS(sh_random_normal_(i32, 1, 0, 0, 1), SH_ERR_ARG, "normal_: needs a float tensor");
  CHECK_FAILS(sh_random_uniform_(a, 1, 0, 2, 1), SH_ERR_ARG, "low <= high");
  CHECK_FAILS(sh_random_normal_(a, 1, 0, 0, -1), SH_ERR_ARG, "std");
  free(v);
  sh_tensor_destroy(i32); sh_tensor_destroy(h);
  sh_tensor_destroy(m0); sh_tensor_destroy(mt); sh_tensor_destroy(mc);
  sh_tensor_destroy(p); sh_tensor_destroy(q); sh_tensor_destroy(a); sh_tensor_destroy(b);
}

/* ---- memory -------------------------------------------------------------------------- */

static void test_memory(void) {
  sh_mem_stats s0, s1, s2;
  sh_mem_stats_get(-1, &s0);
  int old = sh_mem_set_tag(SH_TAG_ACTIVATION);
  sh_tensor *a = make(2, SHAPE(512, 512), SH_F32, SIGNED), *b = NULL;     /* 1 MiB */
  CHECK_OK(sh_binary(&b, SH_OP_ADD, a, a));
  sh_mem_set_tag(old);
  sh_mem_stats_get(-1, &s1);
  CHECK(s1.allocated - s0.allocated >= 2 << 20, "two 1 MiB tensors: allocated rose by %lld",
        (long long)(s1.allocated - s0.allocated));
  CHECK(s1.by_tag[SH_TAG_ACTIVATION] - s0.by_tag[SH_TAG_ACTIVATION] >= 2 << 20, "op results take the current tag");
  CHECK(s1.peak >= s1.allocated, "peak >= allocated");
  sh_tensor_destroy(b);
  sh_tensor_destroy(a);
  sh_mem_stats_get(-1, &s2);
  CHECK(s2.allocated == s0.allocated && s2.by_tag[SH_TAG_ACTIVATION] == s0.by_tag[SH_TAG_ACTIVATION],
        "freed: allocated back to %lld (is %lld)", (long long)s0.allocated, (long long)s2.allocated);
  CHECK(s2.reserved >= s0.allocated + (2 << 20), "freed blocks stay reserved in the cache");
  CHECK(s2.peak >= s1.allocated, "peak remembers the high point");
  sh_mem_reset_peak(-1);
  sh_mem_stats_get(-1, &s2);
  CHECK(s2.peak == s2.allocated, "reset_peak: peak %lld = allocated %lld", (long long)s2.peak, (long long)s2.allocated);
  /* every op releases its temporaries: a round of ops leaves allocated where it was */
  int64_t base = allocated();
  sh_tensor *x0 = make(2, SHAPE(64, 48), SH_BF16, SIGNED), *x = transposed(x0, 0, 1), *w = make(2, SHAPE(64, 32), SH_F32, SIGNED);
  sh_tensor *o[6] = {NULL};
  int st;
  sh_matmul(&o[0], x, w);
  sh_reduce(&o[1], SH_OP_SUM, x, 0, 0);
  sh_sum_to_shape(&o[2], x, 1, SHAPE(64));
  sh_argmax(&o[3], x, 1, 1);
  sh_binary(&o[4], SH_OP_ADD, x, x);
  sh_unary(&o[5], SH_OP_EXP, x);
  sh_sumsq(x, &st);
  int64_t live = allocated();
  for (int i = 0; i < 6; i++) { CHECK(o[i] != NULL, "op %d ran", i); sh_tensor_destroy(o[i]); }
  sh_tensor_destroy(x0); sh_tensor_destroy(x); sh_tensor_destroy(w);
  CHECK(allocated() == base && live > base, "ops free their temporaries (%lld -> %lld)", (long long)base, (long long)allocated());
  /* a memory limit turns an op's allocation into SH_ERR_OOM naming the breakdown */
  sh_tensor *c = make(2, SHAPE(256, 256), SH_F32, SIGNED), *d = (sh_tensor *)1;
  sh_mem_set_limit(-1, allocated() + 4096);
  CHECK_FAILS(sh_binary(&d, SH_OP_MUL, c, c), SH_ERR_OOM, "by tag: param");
  CHECK(d == NULL && strstr(sh_last_error(), "memory limit") != NULL, "OOM leaves out NULL: %s", sh_last_error());
  CHECK_FAILS(sh_matmul(&d, c, c), SH_ERR_OOM, "out of memory");
  sh_tensor *ct = transposed(c, 0, 1);                       /* its dense copy cannot be made */
  CHECK_FAILS(sh_reduce(&d, SH_OP_SUM, ct, 0, 0), SH_ERR_OOM, "activation");
  sh_tensor_destroy(ct);
  sh_mem_set_limit(-1, 0);
  CHECK_OK(sh_binary(&d, SH_OP_MUL, c, c));
  sh_tensor_destroy(d); sh_tensor_destroy(c);
  sh_mem_empty_cache(-1);
  sh_mem_stats_get(-1, &s2);
  CHECK(s2.reserved == s2.allocated, "empty_cache returns cached blocks: reserved %lld, allocated %lld",
        (long long)s2.reserved, (long long)s2.allocated);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_broadcasting);
  RUN(test_strided_inputs);
  RUN(test_dtypes);
  RUN(test_scalars);
  RUN(test_unary);
  RUN(test_exp_tanh_range);
  RUN(test_nan_inf);
  RUN(test_inplace);
  RUN(test_elementwise_errors);
  RUN(test_reduce);
  RUN(test_argmax);
  RUN(test_sum_to_shape);
  RUN(test_matmul);
  RUN(test_gemm);
  RUN(test_arange);
  RUN(test_random);
  RUN(test_memory);
  return check_summary("ops");
}
