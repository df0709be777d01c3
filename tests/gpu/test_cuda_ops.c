/* test_cuda_ops.c: every CUDA op against its CPU reference (make test-gpu; needs a GPU).
 * Each case draws fresh random inputs (the seed changes per run and is printed, so a failure
 * can be replayed with SHARD_TEST_SEED), runs the CPU op and the CUDA op on the same values,
 * and compares by normwise relative error ||got - ref|| / ||ref|| in f64 with a tolerance
 * for the dtype (f32 1e-5, bf16 1e-2, f16 5e-3; TF32 is never on here); NaN never passes.
 * Outputs are poisoned: each CUDA op runs twice, and before the second run the first run's
 * outputs are filled with NaN and freed, so the caching allocator hands the same blocks to
 * the second run and any element the kernel fails to write shows up as NaN. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "tensor_internal.h"
#include "alloc.h"
#include "ops.h"
#include "nn.h"
#include "optim.h"
#include "cuda_internal.h"

#define S(...) (int64_t[]){__VA_ARGS__}
#define NDIM(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

static uint64_t seed;
static const int DEV = 0;

static double tol_of(int dtype) { return dtype == SH_F32 ? 1e-5 : dtype == SH_F64 ? 1e-12 : dtype == SH_F16 ? 5e-3 : 1e-2; }

/* A fresh CPU tensor: normal(mean, std) or uniform(lo, hi), rounded to dtype. */
static sh_tensor *rnd_(int ndim, const int64_t *shape, int dtype, double a, double b, int uniform) {
  sh_tensor *t = NULL;
  if (sh_tensor_empty(&t, ndim, shape, dtype, -1)) { printf("empty: %s\n", sh_last_error()); exit(2); }
  int rc = uniform ? sh_random_uniform_(t, seed++, 0, a, b) : sh_random_normal_(t, seed++, 0, a, b);
  if (rc) { printf("random: %s\n", sh_last_error()); exit(2); }
  return t;
}
#define RANDN(dtype, ...) rnd_(NDIM(__VA_ARGS__), S(__VA_ARGS__), dtype, 0.0, 1.0, 0)
#define RANDU(dtype, lo, hi, ...) rnd_(NDIM(__VA_ARGS__), S(__VA_ARGS__), dtype, lo, hi, 1)

static sh_tensor *to_dev(const sh_tensor *t) {
  sh_tensor *d = NULL;
  if (sh_tensor_to(&d, t, t->dtype, DEV)) { printf("to cuda: %s\n", sh_last_error()); exit(2); }
  return d;
}

/* Fills a CUDA output with NaN and frees it, so its block returns to the cache poisoned. */
static void poison(sh_tensor **t) {
  if (!*t) return;
  if (sh_dtype_is_float((*t)->dtype)) sh_cuda_fill_(*t, NAN);
  else sh_cuda_fill_(*t, -7);
  sh_tensor_destroy(*t);
  *t = NULL;
}

/* Runs `call` twice, poisoning the listed outputs in between (see the file comment). */
#define TWICE(poisons, call) do { \
    for (int pass_ = 0; pass_ < 2; pass_++) { \
      if (pass_) { poisons; } \
      int rc_ = (call); \
      if (rc_) { CHECK(0, "%s failed: %s", #call, sh_last_error()); break; } \
    } \
  } while (0)
#define P(t) poison(&(t))

static double *as_f64(const sh_tensor *t, int64_t *n) {
  sh_tensor *h = NULL, *c = NULL;
  const sh_tensor *src = t;
  if (t->device >= 0 && !sh_tensor_is_contiguous(t)) {
    sh_tensor_empty(&c, t->ndim, t->shape, t->dtype, t->device);
    sh_cuda_copy_(c, t);
    src = c;
  }
  if (sh_tensor_to(&h, src, SH_F64, -1)) { printf("to host: %s\n", sh_last_error()); exit(2); }
  *n = sh_tensor_numel(h);
  double *v = malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
  memcpy(v, sh_tensor_data(h), sizeof(double) * (size_t)*n);
  sh_tensor_destroy(h);
  sh_tensor_destroy(c);
  return v;
}

/* Normwise relative error of got (any device) against ref (cpu), with shape and dtype checks. */
static void cmp(const char *what, const sh_tensor *got, const sh_tensor *ref, double tol) {
  if (!got || !ref) { CHECK(0, "%s: missing result (got %p, ref %p)", what, (void *)got, (void *)ref); return; }
  int same = got->ndim == ref->ndim && memcmp(got->shape, ref->shape, sizeof(int64_t) * got->ndim) == 0;
  CHECK(same, "%s: shape %s vs reference %s", what, sh_desc(got), sh_desc(ref));
  CHECK(got->dtype == ref->dtype, "%s: dtype %s vs reference %s", what, sh_desc(got), sh_desc(ref));
  if (!same) return;
  int64_t n, m;
  double *a = as_f64(got, &n), *b = as_f64(ref, &m);
  double num = 0, den = 0;
  int64_t nan_at = -1;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) != isnan(b[i]) && nan_at < 0) nan_at = i;
    if (isnan(a[i]) || isnan(b[i])) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  double err = den > 0 ? sqrt(num / den) : sqrt(num);
  CHECK(nan_at < 0, "%s: NaN mismatch at element %lld (got %g, ref %g): unwritten output?", what, (long long)nan_at,
        nan_at >= 0 ? a[nan_at] : 0.0, nan_at >= 0 ? b[nan_at] : 0.0);
  CHECK(err <= tol, "%s: relative error %.3g > %.3g (%s)", what, err, tol, sh_desc(got));
  if (getenv("SHARD_TEST_VERBOSE")) printf("  %-48s err %.3g\n", what, err);
  free(a);
  free(b);
}

static void drop(int n, ...) {
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) sh_tensor_destroy(va_arg(ap, sh_tensor *));
  va_end(ap);
}

static const char *dn(int dt) { return sh_dtype_name(dt); }

/* ---- tensor copies ------------------------------------------------------------------------- */

static void test_copy(void) {
  int dts[] = {SH_F32, SH_BF16, SH_F16, SH_F64, SH_I64, SH_I32};
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 6; j++) {
      sh_tensor *x = RANDU(SH_F32, -50, 50, 7, 9, 5), *xs = NULL, *xt = NULL, *ref = NULL, *dx = NULL, *got = NULL;
      sh_tensor_to(&xs, x, dts[i], -1);
      sh_view_transpose(&xt, xs, 0, 2);          /* a strided source */
      sh_tensor_empty(&ref, 3, xt->shape, dts[j], -1);
      CHECK_OK(sh_tensor_copy_(ref, xt));
      dx = to_dev(xs);
      sh_tensor *dxt = NULL;
      sh_view_transpose(&dxt, dx, 0, 2);
      sh_tensor_empty(&got, 3, xt->shape, dts[j], DEV);
      sh_cuda_fill_(got, NAN);
      CHECK_OK(sh_cuda_copy_(got, dxt));
      char name[64];
      snprintf(name, sizeof name, "copy_ %s -> %s (transposed)", dn(dts[i]), dn(dts[j]));
      cmp(name, got, ref, tol_of(dts[j] == SH_F64 ? SH_F32 : dts[j]) * 0.5);
      drop(7, x, xs, xt, ref, dx, dxt, got);
    }
  /* broadcast copy and fill */
  sh_tensor *row = RANDN(SH_F32, 1, 13), *ref = NULL, *got = NULL, *drow = to_dev(row);
  sh_tensor_empty(&ref, 2, S(6, 13), SH_BF16, -1);
  sh_tensor_copy_(ref, row);
  sh_tensor_empty(&got, 2, S(6, 13), SH_BF16, DEV);
  CHECK_OK(sh_cuda_copy_(got, drow));
  cmp("copy_ broadcast f32 [1,13] -> bf16 [6,13]", got, ref, 1e-2);
  CHECK_OK(sh_cuda_fill_(got, 2.5));
  sh_tensor_fill_(ref, 2.5);
  cmp("fill_ bf16", got, ref, 0);
  drop(4, row, ref, got, drow);
}

/* ---- elementwise -------------------------------------------------------------------------- */

static void test_binary(void) {
  int dts[] = {SH_F32, SH_BF16, SH_F16};
  for (int di = 0; di < 3; di++) {
    int dt = dts[di];
    for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) {
      /* broadcast [4,33,17] op [33,1], and the contiguous fast path [1000, 37] op [1000, 37] */
      for (int shape_case = 0; shape_case < 2; shape_case++) {
        sh_tensor *a, *b;
        if (shape_case == 0) { a = RANDU(dt, 0.5, 2, 4, 33, 17); b = RANDU(dt, 0.5, 2, 33, 1); }
        else { a = RANDU(dt, 0.5, 2, 1000, 37); b = RANDU(dt, 0.5, 2, 1000, 37); }
        if (op >= SH_OP_EQ) sh_tensor_copy_(b, a);   /* some ties for the comparisons... */
        if (op >= SH_OP_EQ && shape_case == 1) { sh_tensor *h = NULL; sh_view_narrow(&h, b, 0, 0, 500); sh_random_uniform_(h, seed++, 0, 0.5, 2); sh_tensor_destroy(h); }
        sh_tensor *da = to_dev(a), *db = to_dev(b), *ref = NULL, *got = NULL;
        CHECK_OK(sh_binary(&ref, op, a, b));
        TWICE(P(got), sh_cuda_binary(&got, op, da, db));
        char name[64];
        snprintf(name, sizeof name, "binary op %d %s case %d", op, dn(dt), shape_case);
        cmp(name, got, ref, op == SH_OP_POW ? 2 * tol_of(dt) : tol_of(dt));
        sh_tensor *r2 = NULL, *g2 = NULL;
        CHECK_OK(sh_binary_scalar(&r2, op, a, 1.5, op & 1));
        TWICE(P(g2), sh_cuda_binary_scalar(&g2, op, da, 1.5, op & 1));
        snprintf(name, sizeof name, "binary_scalar op %d %s", op, dn(dt));
        cmp(name, g2, r2, op == SH_OP_POW ? 2 * tol_of(dt) : tol_of(dt));
        drop(8, a, b, da, db, ref, got, r2, g2);
      }
    }
    for (int op = SH_OP_NEG; op <= SH_OP_SIGN; op++) {
      sh_tensor *a = RANDU(dt, 0.25, 3, 3, 129), *da = to_dev(a), *ref = NULL, *got = NULL;
      CHECK_OK(sh_unary(&ref, op, a));
      TWICE(P(got), sh_cuda_unary(&got, op, da));
      char name[64];
      snprintf(name, sizeof name, "unary op %d %s", op, dn(dt));
      cmp(name, got, ref, tol_of(dt));
      drop(4, a, da, ref, got);
    }
    /* in place: binary_, axpy_, scale_ (dst keeps its dtype; b broadcasts) */
    sh_tensor *d = RANDN(dt, 64, 48), *b = RANDN(SH_F32, 48), *dd = to_dev(d), *db = to_dev(b);
    CHECK_OK(sh_binary_(d, SH_OP_MUL, b));
    CHECK_OK(sh_cuda_binary_(dd, SH_OP_MUL, db));
    cmp("binary_ mul broadcast", dd, d, tol_of(dt));
    CHECK_OK(sh_axpy_(d, -0.75, b));
    CHECK_OK(sh_cuda_axpy_(dd, -0.75, db));
    cmp("axpy_", dd, d, tol_of(dt));
    CHECK_OK(sh_scale_(d, 3.0));
    CHECK_OK(sh_cuda_scale_(dd, 3.0));
    cmp("scale_", dd, d, tol_of(dt));
    drop(4, d, b, dd, db);
  }
  /* integer arithmetic computes in i64; division of integers gives f32 */
  sh_tensor *a = RANDU(SH_F32, -20, 20, 50), *b = RANDU(SH_F32, 1, 9, 50), *ai = NULL, *bi = NULL;
  sh_tensor_to(&ai, a, SH_I64, -1);
  sh_tensor_to(&bi, b, SH_I32, -1);
  sh_tensor *dai = to_dev(ai), *dbi = to_dev(bi);
  for (int op = SH_OP_ADD; op <= SH_OP_GT; op++) {
    if (op == SH_OP_POW) continue;
    sh_tensor *ref = NULL, *got = NULL;
    CHECK_OK(sh_binary(&ref, op, ai, bi));
    TWICE(P(got), sh_cuda_binary(&got, op, dai, dbi));
    char name[64];
    snprintf(name, sizeof name, "binary op %d i64,i32", op);
    cmp(name, got, ref, 1e-6);
    drop(2, ref, got);
  }
  drop(6, a, b, ai, bi, dai, dbi);
}

static void test_reduce(void) {
  int dts[] = {SH_F32, SH_BF16, SH_F64};
  for (int di = 0; di < 3; di++) {
    int dt = dts[di];
    sh_tensor *a = RANDN(dt, 5, 300, 7), *da = to_dev(a);
    for (int op = SH_OP_SUM; op <= SH_OP_MIN; op++) {
      for (int dim = -1; dim < 3; dim++) {
        for (int keep = 0; keep < 2; keep++) {
          sh_tensor *ref = NULL, *got = NULL;
          char name[64];
          if (dim < 0) {
            if (keep) continue;
            CHECK_OK(sh_reduce_all(&ref, op, a));
            TWICE(P(got), sh_cuda_reduce_all(&got, op, da));
          } else {
            CHECK_OK(sh_reduce(&ref, op, a, dim, keep));
            TWICE(P(got), sh_cuda_reduce(&got, op, da, dim, keep));
          }
          snprintf(name, sizeof name, "reduce op %d dim %d keep %d %s", op, dim, keep, dn(dt));
          cmp(name, got, ref, tol_of(dt));
          drop(2, ref, got);
        }
      }
    }
    for (int dim = 0; dim < 3; dim++) {
      sh_tensor *ref = NULL, *got = NULL;
      CHECK_OK(sh_argmax(&ref, a, dim, dim == 1));
      TWICE(P(got), sh_cuda_argmax(&got, da, dim, dim == 1));
      cmp("argmax", got, ref, 0);
      drop(2, ref, got);
    }
    int64_t targets[][3] = {{7, 0, 0}, {300, 1, 0}, {5, 1, 7}, {1, 300, 1}};
    int tnd[] = {1, 2, 3, 3};
    for (int t = 0; t < 4; t++) {
      sh_tensor *ref = NULL, *got = NULL;
      CHECK_OK(sh_sum_to_shape(&ref, a, tnd[t], targets[t]));
      TWICE(P(got), sh_cuda_sum_to_shape(&got, da, tnd[t], targets[t]));
      cmp("sum_to_shape", got, ref, tol_of(dt));
      drop(2, ref, got);
    }
    int st1 = 0, st2 = 0;
    double r = sh_sumsq(a, &st1), g = sh_cuda_sumsq(da, &st2);
    CHECK(st1 == 0 && st2 == 0 && fabs(g - r) <= 1e-9 * r, "sumsq %s: %.12g vs %.12g (%s)", dn(dt), g, r, sh_last_error());
    drop(2, a, da);
  }
  /* a reduction large enough to split R into chunks */
  sh_tensor *big = RANDN(SH_F32, 3000000), *dbig = to_dev(big), *ref = NULL, *got = NULL;
  CHECK_OK(sh_reduce_all(&ref, SH_OP_SUM, big));
  CHECK_OK(sh_cuda_reduce_all(&got, SH_OP_SUM, dbig));
  double r, g;
  sh_tensor *gh = NULL;
  sh_tensor_to(&gh, got, SH_F64, -1);
  sh_tensor_item(ref, &r);
  sh_tensor_item(gh, &g);
  CHECK(fabs(r - g) <= 1e-6 * sqrt(3000000.0), "sum of 3M: %.9g vs %.9g", g, r);
  drop(5, big, dbig, ref, got, gh);
}

/* ---- matmul --------------------------------------------------------------------------------- */

static void test_matmul(void) {
  int dts[] = {SH_F32, SH_BF16, SH_F16};
  for (int di = 0; di < 3; di++) {
    int dt = dts[di];
    double tol = dt == SH_F32 ? 1e-5 : tol_of(dt);
    struct { int na, nb; int64_t as[4], bs[4]; } cases[] = {
      {2, 2, {67, 45}, {45, 29}}, {3, 2, {3, 40, 24}, {24, 31}}, {3, 3, {4, 17, 32}, {4, 32, 9}},
      {4, 3, {2, 3, 8, 16}, {3, 16, 5}}, {1, 2, {33}, {33, 7}}, {2, 1, {9, 33}, {33}}, {3, 4, {1, 6, 8}, {2, 3, 8, 4}},
    };
    for (int c = 0; c < 7; c++) {
      sh_tensor *a = rnd_(cases[c].na, cases[c].as, dt, 0, 1, 0), *b = rnd_(cases[c].nb, cases[c].bs, dt, 0, 1, 0);
      sh_tensor *da = to_dev(a), *db = to_dev(b), *ref = NULL, *got = NULL;
      CHECK_OK(sh_matmul(&ref, a, b));
      TWICE(P(got), sh_cuda_matmul(&got, da, db));
      char name[64];
      snprintf(name, sizeof name, "matmul case %d %s", c, dn(dt));
      cmp(name, got, ref, tol);
      drop(6, a, b, da, db, ref, got);
    }
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        sh_tensor *a = ta ? RANDN(dt, 23, 41) : RANDN(dt, 41, 23), *b = tb ? RANDN(dt, 19, 23) : RANDN(dt, 23, 19);
        sh_tensor *c = RANDN(dt, 41, 19), *da = to_dev(a), *db = to_dev(b), *dc = to_dev(c);
        CHECK_OK(sh_gemm_(c, a, b, ta, tb, 0.5, -1.25));
        CHECK_OK(sh_cuda_gemm_(dc, da, db, ta, tb, 0.5, -1.25));
        char name[64];
        snprintf(name, sizeof name, "gemm_ ta %d tb %d %s", ta, tb, dn(dt));
        cmp(name, dc, c, tol);
        /* a transposed view as an operand: no copy on either side */
        sh_tensor *at = NULL, *dat = NULL;
        sh_view_transpose(&at, a, 0, 1);
        sh_view_transpose(&dat, da, 0, 1);
        CHECK_OK(sh_gemm_(c, at, b, !ta, tb, 1.0, 0.0));
        CHECK_OK(sh_cuda_gemm_(dc, dat, db, !ta, tb, 1.0, 0.0));
        snprintf(name, sizeof name, "gemm_ view ta %d tb %d %s", ta, tb, dn(dt));
        cmp(name, dc, c, tol);
        drop(8, a, b, c, da, db, dc, at, dat);
      }
  }
}

/* ---- nn ---------------------------------------------------------------------------------------- */

static void test_linear(void) {
  int dts[] = {SH_F32, SH_BF16};
  for (int di = 0; di < 2; di++) {
    int dt = dts[di];
    double tol = dt == SH_F32 ? 1e-5 : 1e-2;
    for (int with_b = 0; with_b < 2; with_b++) {
      sh_tensor *x = RANDN(dt, 3, 21, 64), *w = RANDN(dt, 48, 64), *b = with_b ? RANDN(dt, 48) : NULL;
      sh_tensor *dx_ = to_dev(x), *dw_ = to_dev(w), *db_ = b ? to_dev(b) : NULL, *ref = NULL, *got = NULL;
      CHECK_OK(sh_linear_forward(&ref, x, w, b));
      TWICE(P(got), sh_cuda_linear_forward(&got, dx_, dw_, db_));
      cmp(with_b ? "linear forward +b" : "linear forward", got, ref, tol);
      /* backward: dx new, dw and db accumulate into random starting values (f32 grads) */
      sh_tensor *dy = RANDN(dt, 3, 21, 48), *gw = RANDN(SH_F32, 48, 64), *gb = RANDN(SH_F32, 48);
      sh_tensor *ddy = to_dev(dy), *dgw = to_dev(gw), *dgb = to_dev(gb), *rdx = NULL, *gdx = NULL;
      CHECK_OK(sh_linear_backward(&rdx, gw, gb, dy, x, w));
      CHECK_OK(sh_cuda_linear_backward(&gdx, dgw, dgb, ddy, dx_, dw_));
      cmp("linear backward dx", gdx, rdx, tol);
      cmp("linear backward dw (f32 accumulate)", dgw, gw, tol);
      cmp("linear backward db (f32 accumulate)", dgb, gb, tol);
      drop(16, x, w, b, dx_, dw_, db_, ref, got, dy, gw, gb, ddy, dgw, dgb, rdx, gdx);
    }
    /* fused epilogues against their compositions: linear + gelu, and dgelu */
    sh_tensor *x = RANDN(dt, 37, 64), *w = RANDN(dt, 96, 64), *b = RANDN(dt, 96);
    sh_tensor *dx_ = to_dev(x), *dw_ = to_dev(w), *db_ = to_dev(b);
    sh_tensor *rpre = NULL, *ry = NULL, *gy = NULL, *gpre = NULL;
    CHECK_OK(sh_linear_forward(&rpre, x, w, b));
    CHECK_OK(sh_gelu_forward(&ry, rpre));
    TWICE((P(gy), P(gpre)), sh_cuda_linear_gelu_forward(&gy, &gpre, dx_, dw_, db_));
    cmp("linear_gelu y", gy, ry, tol);
    cmp("linear_gelu pre", gpre, rpre, tol);
    /* a projection whose input was gelu(pre): [37, 96] -> [37, 32] */
    sh_tensor *w2 = RANDN(dt, 32, 96), *dy = RANDN(dt, 37, 32), *gw2 = RANDN(SH_F32, 32, 96), *gb2 = RANDN(SH_F32, 32);
    sh_tensor *dw2 = to_dev(w2), *ddy = to_dev(dy), *dgw2 = to_dev(gw2), *dgb2 = to_dev(gb2);
    sh_tensor *rdh = NULL, *rdpre = NULL, *gdpre = NULL;
    CHECK_OK(sh_linear_backward(&rdh, gw2, gb2, dy, ry, w2));
    CHECK_OK(sh_gelu_backward(&rdpre, rdh, rpre));
    sh_tensor *dry = to_dev(ry), *drpre = to_dev(rpre), *once = NULL;
    /* poisoned runs without parameter grads, then one run that accumulates dw and db */
    TWICE(P(gdpre), sh_cuda_linear_backward_dgelu(&gdpre, NULL, NULL, ddy, dry, dw2, drpre));
    cmp("linear_backward_dgelu dpre", gdpre, rdpre, 2 * tol);
    CHECK_OK(sh_cuda_linear_backward_dgelu(&once, dgw2, dgb2, ddy, dry, dw2, drpre));
    cmp("linear_backward_dgelu dw", dgw2, gw2, tol);
    cmp("linear_backward_dgelu db", dgb2, gb2, tol);
    drop(23, x, w, b, dx_, dw_, db_, rpre, ry, gy, gpre, w2, dy, gw2, gb2, dw2, ddy, dgw2, dgb2, rdh, rdpre, gdpre, dry, once);
    sh_tensor_destroy(drpre);
  }
}

static void test_norms(void) {
  int dts[] = {SH_F32, SH_BF16};
  for (int di = 0; di < 2; di++) {
    int dt = dts[di];
    double tol = tol_of(dt);
    for (int affine = 0; affine < 2; affine++) {
      sh_tensor *x = RANDN(dt, 6, 33, 200), *w = affine ? RANDN(SH_F32, 200) : NULL, *b = affine ? RANDN(SH_F32, 200) : NULL;
      sh_tensor *dx_ = to_dev(x), *dw_ = w ? to_dev(w) : NULL, *db_ = b ? to_dev(b) : NULL;
      sh_tensor *ry = NULL, *rm = NULL, *rr = NULL, *gy = NULL, *gm = NULL, *gr = NULL;
      CHECK_OK(sh_layernorm_forward(&ry, &rm, &rr, x, w, b, 1e-5));
      TWICE((P(gy), P(gm), P(gr)), sh_cuda_layernorm_forward(&gy, &gm, &gr, dx_, dw_, db_, 1e-5));
      cmp("layernorm y", gy, ry, tol);
      cmp("layernorm mean", gm, rm, 1e-5);
      cmp("layernorm rstd", gr, rr, 1e-5);
      sh_tensor *dy = RANDN(dt, 6, 33, 200), *gw = RANDN(SH_F32, 200), *gb = RANDN(SH_F32, 200);
      sh_tensor *ddy = to_dev(dy), *dgw = to_dev(gw), *dgb = to_dev(gb), *rdx = NULL, *gdx = NULL;
      CHECK_OK(sh_layernorm_backward(&rdx, gw, gb, dy, x, w, rm, rr));
      CHECK_OK(sh_cuda_layernorm_backward(&gdx, dgw, dgb, ddy, dx_, dw_, gm, gr));
      cmp("layernorm dx", gdx, rdx, tol);
      cmp("layernorm dw", dgw, gw, tol);
      cmp("layernorm db", dgb, gb, tol);
      /* rmsnorm */
      sh_tensor *ry2 = NULL, *rr2 = NULL, *gy2 = NULL, *gr2 = NULL, *rdx2 = NULL, *gdx2 = NULL;
      CHECK_OK(sh_rmsnorm_forward(&ry2, &rr2, x, w, 1e-6));
      TWICE((P(gy2), P(gr2)), sh_cuda_rmsnorm_forward(&gy2, &gr2, dx_, dw_, 1e-6));
      cmp("rmsnorm y", gy2, ry2, tol);
      cmp("rmsnorm rstd", gr2, rr2, 1e-5);
      CHECK_OK(sh_rmsnorm_backward(&rdx2, gw, dy, x, w, rr2));
      CHECK_OK(sh_cuda_rmsnorm_backward(&gdx2, dgw, ddy, dx_, dw_, gr2));
      cmp("rmsnorm dx", gdx2, rdx2, tol);
      cmp("rmsnorm dw", dgw, gw, tol);
      drop(25, x, w, b, dx_, dw_, db_, ry, rm, rr, gy, gm, gr, dy, gw, gb, ddy, dgw, dgb, rdx, gdx, ry2, rr2, gy2, gr2, rdx2);
      sh_tensor_destroy(gdx2);
    }
    /* residual add fused into layernorm = add, then layernorm */
    sh_tensor *x = RANDN(dt, 17, 96), *res = RANDN(dt, 17, 96), *w = RANDN(dt, 96), *b = RANDN(dt, 96);
    sh_tensor *dx_ = to_dev(x), *dres = to_dev(res), *dw_ = to_dev(w), *db_ = to_dev(b);
    sh_tensor *rsum = NULL, *ry = NULL, *rm = NULL, *rr = NULL, *gy = NULL, *gsum = NULL, *gm = NULL, *gr = NULL;
    CHECK_OK(sh_binary(&rsum, SH_OP_ADD, x, res));
    CHECK_OK(sh_layernorm_forward(&ry, &rm, &rr, rsum, w, b, 1e-5));
    TWICE((P(gy), P(gsum), P(gm), P(gr)), sh_cuda_layernorm_residual_forward(&gy, &gsum, &gm, &gr, dx_, dres, dw_, db_, 1e-5));
    cmp("layernorm_residual r", gsum, rsum, tol);
    cmp("layernorm_residual y", gy, ry, tol);
    drop(16, x, res, w, b, dx_, dres, dw_, db_, rsum, ry, rm, rr, gy, gsum, gm, gr);
  }
}

typedef int (*unary_fwd)(sh_tensor **, const sh_tensor *);
typedef int (*unary_bwd)(sh_tensor **, const sh_tensor *, const sh_tensor *);

static void test_activations(void) {
  struct { const char *name; unary_fwd f, cf; unary_bwd b, cb; } acts[] = {
    {"gelu", sh_gelu_forward, sh_cuda_gelu_forward, sh_gelu_backward, sh_cuda_gelu_backward},
    {"silu", sh_silu_forward, sh_cuda_silu_forward, sh_silu_backward, sh_cuda_silu_backward},
    {"softmax", sh_softmax_forward, sh_cuda_softmax_forward, sh_softmax_backward, sh_cuda_softmax_backward},
  };
  int dts[] = {SH_F32, SH_BF16, SH_F16};
  for (int di = 0; di < 3; di++) {
    int dt = dts[di];
    for (int k = 0; k < 3; k++) {
      int64_t cols = k == 2 ? 1031 : 333;   /* odd sizes exercise the scalar tails */
      sh_tensor *x = rnd_(2, S(7, cols), dt, 0, 2, 0), *dy = rnd_(2, S(7, cols), dt, 0, 1, 0);
      sh_tensor *dx_ = to_dev(x), *ddy = to_dev(dy), *ry = NULL, *gy = NULL, *rdx = NULL, *gdx = NULL;
      CHECK_OK(acts[k].f(&ry, x));
      TWICE(P(gy), acts[k].cf(&gy, dx_));
      char name[64];
      snprintf(name, sizeof name, "%s forward %s", acts[k].name, dn(dt));
      cmp(name, gy, ry, tol_of(dt));
      /* softmax backward takes y, the others x */
      sh_tensor *dry = k == 2 ? to_dev(ry) : NULL;
      CHECK_OK(acts[k].b(&rdx, dy, k == 2 ? ry : x));
      TWICE(P(gdx), acts[k].cb(&gdx, ddy, k == 2 ? dry : dx_));
      snprintf(name, sizeof name, "%s backward %s", acts[k].name, dn(dt));
      cmp(name, gdx, rdx, tol_of(dt));
      drop(9, x, dy, dx_, ddy, ry, gy, rdx, gdx, dry);
    }
    sh_tensor *a = RANDN(dt, 5, 77), *b = RANDN(dt, 5, 77), *dy = RANDN(dt, 5, 77);
    sh_tensor *da = to_dev(a), *db = to_dev(b), *ddy = to_dev(dy), *ry = NULL, *gy = NULL, *rda = NULL, *rdb = NULL, *gda = NULL, *gdb = NULL;
    CHECK_OK(sh_swiglu_forward(&ry, a, b));
    TWICE(P(gy), sh_cuda_swiglu_forward(&gy, da, db));
    cmp("swiglu forward", gy, ry, tol_of(dt));
    CHECK_OK(sh_swiglu_backward(&rda, &rdb, dy, a, b));
    TWICE((P(gda), P(gdb)), sh_cuda_swiglu_backward(&gda, &gdb, ddy, da, db));
    cmp("swiglu backward da", gda, rda, tol_of(dt));
    cmp("swiglu backward db", gdb, rdb, tol_of(dt));
    drop(12, a, b, dy, da, db, ddy, ry, gy, rda, rdb, gda, gdb);
    /* dropout: the same mask on both backends, from (seed, offset) */
    sh_tensor *x = RANDN(dt, 9, 1001), *dx_ = to_dev(x), *rdrop = NULL, *gdrop = NULL, *rb = NULL, *gb = NULL;
    CHECK_OK(sh_dropout_forward(&rdrop, x, 0.3, 1234, 77));
    TWICE(P(gdrop), sh_cuda_dropout_forward(&gdrop, dx_, 0.3, 1234, 77));
    cmp("dropout forward", gdrop, rdrop, tol_of(dt));
    CHECK_OK(sh_dropout_backward(&rb, x, 0.3, 1234, 77));
    TWICE(P(gb), sh_cuda_dropout_backward(&gb, dx_, 0.3, 1234, 77));
    cmp("dropout backward", gb, rb, tol_of(dt));
    drop(6, x, dx_, rdrop, gdrop, rb, gb);
  }
}

static void test_random(void) {
  int dts[] = {SH_F32, SH_BF16, SH_F64};
  for (int di = 0; di < 3; di++) {
    sh_tensor *c = NULL, *g = NULL, *gt = NULL, *ct = NULL;
    sh_tensor_empty(&c, 2, S(31, 65), dts[di], -1);
    sh_tensor_empty(&g, 2, S(31, 65), dts[di], DEV);
    CHECK_OK(sh_random_normal_(c, 99, 1000, 0.5, 2.0));
    CHECK_OK(sh_cuda_random_normal_(g, 99, 1000, 0.5, 2.0));
    cmp("random normal_", g, c, 1e-6);
    /* a transposed view draws in its own row-major order */
    sh_view_transpose(&ct, c, 0, 1);
    sh_view_transpose(&gt, g, 0, 1);
    CHECK_OK(sh_random_uniform_(ct, 5, 3, -1.0, 4.0));
    CHECK_OK(sh_cuda_random_uniform_(gt, 5, 3, -1.0, 4.0));
    cmp("random uniform_ (transposed view)", g, c, 1e-6);
    drop(4, c, g, ct, gt);
  }
  sh_tensor *r = NULL, *g = NULL;
  CHECK_OK(sh_arange(&r, -3, 7.5, 0.25, SH_F32, -1));
  TWICE(P(g), sh_cuda_arange(&g, -3, 7.5, 0.25, SH_F32, DEV));
  cmp("arange", g, r, 0);
  drop(2, r, g);
}

static void test_attention(void) {
  struct { int dt; int64_t B, H, T, D; int strided; } cases[] = {
    {SH_BF16, 2, 3, 200, 64, 0},   /* tensor cores, T not a multiple of the tile */
    {SH_BF16, 1, 2, 128, 128, 1},  /* tensor cores, heads split out of a fused qkv */
    {SH_BF16, 1, 1, 70, 48, 0},
    {SH_F32, 2, 2, 77, 40, 0},     /* the simple path */
    {SH_F16, 1, 2, 33, 64, 0},
  };
  for (int c = 0; c < 5; c++) {
    int dt = cases[c].dt;
    int64_t B = cases[c].B, H = cases[c].H, T = cases[c].T, D = cases[c].D;
    sh_tensor *q, *k, *v, *qkv = NULL;
    if (cases[c].strided) {
      /* qkv [B, T, 3, H, D] -> q/k/v [B, H, T, D] views with row stride 3 H D */
      qkv = rnd_(5, S(B, T, 3, H, D), dt, 0, 1, 0);
      sh_tensor *parts[3];
      for (int j = 0; j < 3; j++) {
        sh_tensor *sel = NULL;
        sh_view_select(&sel, qkv, 2, j);
        sh_view_transpose(&parts[j], sel, 1, 2);
        sh_tensor_destroy(sel);
      }
      q = parts[0]; k = parts[1]; v = parts[2];
    } else {
      q = rnd_(4, S(B, H, T, D), dt, 0, 1, 0);
      k = rnd_(4, S(B, H, T, D), dt, 0, 1, 0);
      v = rnd_(4, S(B, H, T, D), dt, 0, 1, 0);
    }
    sh_tensor *dqkv = qkv ? to_dev(qkv) : NULL, *dq_ = NULL, *dk_ = NULL, *dv_ = NULL;
    if (qkv) {
      sh_tensor *parts[3];
      for (int j = 0; j < 3; j++) {
        sh_tensor *sel = NULL;
        sh_view_select(&sel, dqkv, 2, j);
        sh_view_transpose(&parts[j], sel, 1, 2);
        sh_tensor_destroy(sel);
      }
      dq_ = parts[0]; dk_ = parts[1]; dv_ = parts[2];
    } else {
      dq_ = to_dev(q); dk_ = to_dev(k); dv_ = to_dev(v);
    }
    double tol = dt == SH_F32 ? 1e-5 : 2e-2;
    sh_tensor *ro = NULL, *rl = NULL, *go = NULL, *gl = NULL;
    CHECK_OK(sh_attention_forward(&ro, &rl, q, k, v, 0));
    TWICE((P(go), P(gl)), sh_cuda_attention_forward(&go, &gl, dq_, dk_, dv_, 0));
    char name[80];
    snprintf(name, sizeof name, "attention out %s T %lld D %lld%s", dn(dt), (long long)T, (long long)D, cases[c].strided ? " strided" : "");
    cmp(name, go, ro, tol);
    snprintf(name, sizeof name, "attention lse %s T %lld D %lld", dn(dt), (long long)T, (long long)D);
    cmp(name, gl, rl, dt == SH_F32 ? 1e-5 : 5e-3);
    sh_tensor *dout = rnd_(4, S(B, H, T, D), dt, 0, 1, 0), *ddout = to_dev(dout);
    sh_tensor *rq = NULL, *rk = NULL, *rv = NULL, *gq = NULL, *gk = NULL, *gv = NULL;
    CHECK_OK(sh_attention_backward(&rq, &rk, &rv, dout, q, k, v, ro, rl, 0));
    /* the device backward uses the device forward's out and lse, as training does */
    TWICE((P(gq), P(gk), P(gv)), sh_cuda_attention_backward(&gq, &gk, &gv, ddout, dq_, dk_, dv_, go, gl, 0));
    snprintf(name, sizeof name, "attention dq %s T %lld D %lld", dn(dt), (long long)T, (long long)D);
    cmp(name, gq, rq, 2 * tol);
    snprintf(name, sizeof name, "attention dk %s T %lld D %lld", dn(dt), (long long)T, (long long)D);
    cmp(name, gk, rk, 2 * tol);
    snprintf(name, sizeof name, "attention dv %s T %lld D %lld", dn(dt), (long long)T, (long long)D);
    cmp(name, gv, rv, 2 * tol);
    drop(22, q, k, v, qkv, dqkv, dq_, dk_, dv_, ro, rl, go, gl, dout, ddout, rq, rk, rv, gq, gk, gv, NULL, NULL);
  }
}

static void test_embedding_and_loss(void) {
  int dts[] = {SH_F32, SH_BF16};
  for (int di = 0; di < 2; di++) {
    int dt = dts[di];
    int64_t V = 301, C = 40;
    sh_tensor *w = RANDN(dt, V, C), *u = RANDU(SH_F32, 0, 50, 4, 37), *idx = NULL;   /* few distinct: many repeats */
    sh_tensor_to(&idx, u, di ? SH_I32 : SH_I64, -1);
    sh_tensor *dw_ = to_dev(w), *didx = to_dev(idx), *ry = NULL, *gy = NULL;
    CHECK_OK(sh_embedding_forward(&ry, idx, w));
    TWICE(P(gy), sh_cuda_embedding_forward(&gy, didx, dw_));
    cmp("embedding forward", gy, ry, 0);
    sh_tensor *dy = RANDN(dt, 4, 37, C), *gw = RANDN(dt, V, C), *ddy = to_dev(dy), *dgw = to_dev(gw);
    CHECK_OK(sh_embedding_backward(gw, dy, idx));
    CHECK_OK(sh_cuda_embedding_backward(dgw, ddy, didx));
    cmp("embedding backward (accumulate)", dgw, gw, tol_of(dt));
    drop(11, w, u, idx, dw_, didx, ry, gy, dy, gw, ddy, dgw);

    /* cross-entropy with some ignored targets */
    int64_t N = 67, Vc = 1000;
    sh_tensor *logits = rnd_(2, S(N, Vc), dt, 0, 3, 0), *tu = RANDU(SH_F32, 0, 999.99, 67), *tg = NULL;
    sh_tensor_to(&tg, tu, SH_I64, -1);
    for (int64_t r = 0; r < N; r += 5) sh_tensor_set(tg, S(r), -100);
    sh_tensor *dl = to_dev(logits), *dt_ = to_dev(tg), *rl = NULL, *rlse = NULL, *gl = NULL, *glse = NULL;
    CHECK_OK(sh_cross_entropy_forward(&rl, &rlse, logits, tg, -100));
    TWICE((P(gl), P(glse)), sh_cuda_cross_entropy_forward(&gl, &glse, dl, dt_, -100));
    cmp("cross_entropy loss", gl, rl, 1e-5);
    cmp("cross_entropy lse", glse, rlse, 1e-5);
    sh_tensor *rd = NULL, *gd = NULL;
    CHECK_OK(sh_cross_entropy_backward(&rd, logits, tg, rlse, 0.7, -100));
    TWICE(P(gd), sh_cuda_cross_entropy_backward(&gd, dl, dt_, glse, 0.7, -100));
    cmp("cross_entropy dlogits", gd, rd, tol_of(dt));
    drop(11, logits, tu, tg, dl, dt_, rl, rlse, gl, glse, rd, gd);
  }
}

static void test_optim(void) {
  int gdts[] = {SH_F32, SH_BF16};
  for (int gi = 0; gi < 2; gi++) {
    int64_t n = 100003;
    sh_tensor *p = RANDN(SH_F32, n), *g = RANDN(gdts[gi], n), *m = RANDN(SH_F32, n), *v = RANDU(SH_F32, 0, 1, n);
    sh_tensor *sh = NULL, *dsh = NULL;
    sh_tensor_empty(&sh, 1, S(n), SH_BF16, -1);
    sh_tensor_empty(&dsh, 1, S(n), SH_BF16, DEV);
    sh_cuda_fill_(dsh, NAN);
    sh_tensor *dp = to_dev(p), *dg = to_dev(g), *dm = to_dev(m), *dv = to_dev(v);
    for (int step = 1; step <= 3; step++) {
      CHECK_OK(sh_adamw_step_(p, g, m, v, sh, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.5));
      CHECK_OK(sh_cuda_adamw_step_(dp, dg, dm, dv, dsh, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.5));
    }
    cmp("adamw param", dp, p, 1e-6);
    cmp("adamw m", dm, m, 1e-6);
    cmp("adamw v", dv, v, 1e-6);
    cmp("adamw bf16 shadow", dsh, sh, 1e-2);
    drop(10, p, g, m, v, sh, dsh, dp, dg, dm, dv);
    for (int nesterov = 0; nesterov < 2; nesterov++) {
      sh_tensor *p2 = RANDN(SH_F32, 5000), *g2 = RANDN(gdts[gi], 5000), *b2 = RANDN(SH_F32, 5000);
      sh_tensor *dp2 = to_dev(p2), *dg2 = to_dev(g2), *db2 = to_dev(b2);
      for (int step = 0; step < 3; step++) {
        CHECK_OK(sh_sgd_step_(p2, g2, b2, 0.1, 0.9, 0, 0.01, nesterov, step == 0, 1.0));
        CHECK_OK(sh_cuda_sgd_step_(dp2, dg2, db2, 0.1, 0.9, 0, 0.01, nesterov, step == 0, 1.0));
      }
      cmp("sgd param", dp2, p2, 1e-6);
      cmp("sgd momentum", db2, b2, 1e-6);
      drop(6, p2, g2, b2, dp2, dg2, db2);
    }
  }
}

/* ---- runtime: allocator, streams, events, errors --------------------------------------------- */

static void test_runtime(void) {
  sh_mem_stats s0, s1;
  sh_tensor *a = NULL, *b = NULL;
  CHECK_OK(sh_tensor_empty(&a, 1, S(1 << 20), SH_F32, DEV));
  sh_tensor_destroy(a);
  CHECK_OK(sh_mem_stats_get(DEV, &s0));
  /* freed on compute, reused on the all-gather stream: same block, ordered by an event */
  sh_cuda_stream *ag = NULL, *comp = NULL;
  CHECK_OK(sh_cuda_stream_get(&ag, DEV, SH_STREAM_ALL_GATHER));
  CHECK_OK(sh_cuda_stream_get(&comp, DEV, SH_STREAM_COMPUTE));
  CHECK_OK(sh_cuda_set_stream(ag));
  CHECK_OK(sh_tensor_empty(&b, 1, S(1 << 20), SH_F32, DEV));
  CHECK_OK(sh_cuda_fill_(b, 3.0));
  CHECK_OK(sh_mem_stats_get(DEV, &s1));
  CHECK(s1.n_system_alloc == s0.n_system_alloc, "cached block reused across streams (%lld system allocs, was %lld)",
        (long long)s1.n_system_alloc, (long long)s0.n_system_alloc);
  sh_cuda_event *e = NULL, *t0 = NULL, *t1 = NULL;
  CHECK_OK(sh_cuda_event_create(&e, DEV, 0));
  CHECK_OK(sh_cuda_event_record(e, ag));
  CHECK_OK(sh_cuda_set_stream(comp));
  CHECK_OK(sh_cuda_stream_wait_event(comp, e));
  double sum = 0;
  sh_tensor *r = NULL, *rh = NULL;
  CHECK_OK(sh_cuda_reduce_all(&r, SH_OP_SUM, b));
  sh_tensor_to(&rh, r, SH_F64, -1);
  sh_tensor_item(rh, &sum);
  CHECK(sum == 3.0 * (1 << 20), "fill on the all-gather stream seen by compute after the event: %g", sum);
  int done = 0;
  CHECK_OK(sh_cuda_event_synchronize(e));
  CHECK_OK(sh_cuda_event_query(e, &done));
  CHECK(done == 1, "event done after synchronize");
  CHECK_OK(sh_cuda_event_create(&t0, DEV, 1));
  CHECK_OK(sh_cuda_event_create(&t1, DEV, 1));
  CHECK_OK(sh_cuda_event_record(t0, comp));
  CHECK_OK(sh_cuda_fill_(b, 1.0));
  CHECK_OK(sh_cuda_event_record(t1, comp));
  CHECK_OK(sh_cuda_event_synchronize(t1));
  double ms = -1;
  CHECK_OK(sh_cuda_event_elapsed(t0, t1, &ms));
  CHECK(ms >= 0, "elapsed %g ms", ms);
  sh_cuda_event_destroy(e);
  sh_cuda_event_destroy(t0);
  sh_cuda_event_destroy(t1);
  drop(3, b, r, rh);
  /* pinned buffers are cached, and async copies round-trip */
  void *h1 = NULL, *h2 = NULL;
  CHECK_OK(sh_cuda_host_alloc(&h1, 1 << 16));
  sh_cuda_host_free(h1);
  CHECK_OK(sh_cuda_host_alloc(&h2, 1 << 16));
  CHECK(h1 == h2, "pinned buffer reused from the cache");
  sh_tensor *hp = NULL, *hq = NULL, *d = NULL, *x = RANDN(SH_F32, 4096);
  sh_tensor_wrap_external(&hp, h2, 1 << 16, 1, S(4096), SH_F32);
  sh_tensor_copy_(hp, x);
  sh_tensor_empty(&d, 1, S(4096), SH_F32, DEV);
  sh_tensor_empty(&hq, 1, S(4096), SH_F32, -1);
  CHECK_OK(sh_cuda_copy_async(d, hp));
  CHECK_OK(sh_cuda_copy_async(hq, d));
  CHECK_OK(sh_cuda_synchronize(DEV));
  cmp("copy_async round trip", hq, x, 0);
  drop(4, hp, hq, d, x);
  sh_cuda_host_free(h2);
  CHECK_OK(sh_cuda_host_empty_cache());
  /* errors name the op and the devices */
  sh_tensor *c = RANDN(SH_F32, 3), *dc = to_dev(c), *o = NULL;
  CHECK_FAILS(sh_cuda_binary(&o, SH_OP_ADD, dc, c), SH_ERR_DEVICE, "add");
  CHECK(o == NULL, "no output on error");
  drop(2, c, dc);
}

int main(void) {
  if (sh_cuda_device_count() == 0) {
    printf("C test_cuda_ops: no CUDA device; skipped (0 passed, 0 failed)\n");
    return 0;
  }
  const char *env = getenv("SHARD_TEST_SEED");
  seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  printf("test_cuda_ops: seed %llu (SHARD_TEST_SEED=%llu replays), lt epilogues %s\n", (unsigned long long)seed,
         (unsigned long long)seed, getenv("SHARD_NO_LT_EPILOGUE") ? "off" : "on");
  if (sh_cuda_init(DEV)) { printf("cuda init: %s\n", sh_last_error()); return 1; }
  test_runtime();
  test_copy();
  test_binary();
  test_reduce();
  test_matmul();
  test_linear();
  test_norms();
  test_activations();
  test_random();
  test_attention();
  test_embedding_and_loss();
  test_optim();
  CHECK_OK(sh_cuda_synchronize(DEV));
  return check_summary("test_cuda_ops");
}
