/* test_gemm_bf16.c: sh_gemm_bf16 (runtime/cpu/gemm_bf16.c) against a float64 product of the same
 * bf16 inputs, under the CPU kernel set in use and under generic in one process (check.h):
 * AVX-512 BF16 in the avx512bf16 set, widened to f32 in the others (and the two against each other);
 * then linear's forward and backward with bf16 x, w and dy (mixed precision), which read
 * them through it.
 * Shapes: sizes 1, tails of every block (rows of 12, columns of 32, 128 k-pairs, odd k),
 * all four transposes (linear's backward uses dx = dy W and dW = dy^T x), leading dimensions
 * wider than the matrix, alpha and beta (beta 0 must not read c: it starts as NaN), c in f32
 * and in bf16 (sh_gemm_bf16_out16: plus half a bf16 ulp), and products large enough for the
 * threaded path; c in bf16 exactly against float64 nearest-even rounding where the products
 * and sums are exact (denormal results, ties).
 * Tolerance: the products of two bf16 are exact in f32 and the sums are f32, so each element
 * is within k * 2^-23 * sum_p |a_ip b_pj| of the exact value (plus |beta c| rounding); the
 * check allows 4 times that. */
#include "check_cpu.h"
#include "cpu/blas_internal.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/nn.h"          /* after tensor.h: the FFI headers declare no types of their own */
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

typedef struct gcase { int ta, tb, m, n, k, extra; float alpha, beta; } gcase;

/* op(x)[i][p] in float64 */
static double el(const uint16_t *x, int ld, int t, int i, int p) {
  return sh_bf16_to_f32(t ? x[(size_t)p * ld + i] : x[(size_t)i * ld + p]);
}

/* Runs one case on the current path into c (c0 its start; with c16, c is bf16, c0 holds
 * bf16 values and c gets the result widened); checks against float64. */
static void run_case(const gcase *g, const char *path, int c16, const uint16_t *a, int lda, const uint16_t *b, int ldb,
                     const float *c0, float *c, int ldc) {
  CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
  size_t nc = (size_t)g->m * ldc;
  if (c16) {
    uint16_t *h = malloc(sizeof(uint16_t) * (nc + 1));
    for (size_t i = 0; i < nc; i++) h[i] = sh_f32_to_bf16(c0[i]);
    CHECK_OK(sh_gemm_bf16_out16(ta, tb, g->m, g->n, g->k, g->alpha, a, lda, b, ldb, g->beta, h, ldc));
    for (size_t i = 0; i < nc; i++) c[i] = sh_bf16_to_f32(h[i]);
    free(h);
  } else {
    memcpy(c, c0, sizeof(float) * nc);
    CHECK_OK(sh_gemm_bf16(ta, tb, g->m, g->n, g->k, g->alpha, a, lda, b, ldb, g->beta, c, ldc));
  }
  int bad = 0;
  for (int i = 0; i < g->m && bad < 3; i++)
    for (int j = 0; j < ldc && bad < 3; j++) {
      double got = c[(size_t)i * ldc + j], start = c0[(size_t)i * ldc + j];
      if (j >= g->n) {   /* past n: untouched */
        if (!(got == start || (isnan(got) && isnan(start)))) {
          bad++;
          CHECK(0, "%s ta=%d tb=%d m=%d n=%d k=%d: c[%d][%d] past n changed", path, g->ta, g->tb, g->m, g->n, g->k, i, j);
        }
        continue;
      }
      double s = 0, mag = 0;
      for (int p = 0; p < g->k; p++) {
        double t = el(a, lda, g->ta, i, p) * el(b, ldb, g->tb, p, j);
        s += t;
        mag += fabs(t);
      }
      double want = g->alpha * s + (g->beta == 0 ? 0 : g->beta * start);
      double tol = 4 * (g->k + 2) * ldexp(1, -23) * (fabs(g->alpha) * mag + fabs(g->beta * (g->beta == 0 ? 0 : start))) +
                   (c16 ? ldexp(fabs(want), -8) : 0) + 1e-30;
      if (!(fabs(got - want) <= tol)) {
        bad++;
        CHECK(0, "%s c %s ta=%d tb=%d m=%d n=%d k=%d alpha=%g beta=%g: c[%d][%d] = %.9g, want %.9g (tol %.3g)", path,
              c16 ? "bf16" : "f32", g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->beta, i, j, got, want, tol);
      }
    }
  if (!bad) CHECK(1, "%s", path);
}

static void test_case(gcase g) {
  int ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k, br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
  int lda = ac + g.extra, ldb = bc + g.extra, ldc = g.n + g.extra;
  uint16_t *a = malloc(sizeof(uint16_t) * ((size_t)ar * lda + 1)), *b = malloc(sizeof(uint16_t) * ((size_t)br * ldb + 1));
  for (int i = 0; i < ar * lda; i++) a[i] = sh_f32_to_bf16(i % lda < ac ? (float)urand() : NAN);
  for (int i = 0; i < br * ldb; i++) b[i] = sh_f32_to_bf16(i % ldb < bc ? (float)urand() : NAN);
  float *c0 = malloc(sizeof(float) * ((size_t)g.m * ldc + 1)), *c = malloc(sizeof(float) * ((size_t)g.m * ldc + 1));
  float *cf = malloc(sizeof(float) * ((size_t)g.m * ldc + 1));
  for (int c16 = 0; c16 < 2; c16++) {   /* c in f32, then in bf16 (its start on the bf16 grid) */
    for (int i = 0; i < g.m * ldc; i++) {
      c0[i] = g.beta == 0 && i % ldc < g.n ? NAN : (float)urand();
      if (c16) c0[i] = sh_bf16_to_f32(sh_f32_to_bf16(c0[i]));
    }
    run_case(&g, check_use_set(0), c16, a, lda, b, ldb, c0, c, ldc);
    run_case(&g, check_use_set(1), c16, a, lda, b, ldb, c0, cf, ldc);
    check_use_set(0);
    /* the two paths sum in different orders; both are within the bound of the exact value,
     * so within twice it of each other: checked above. Here: same shape of result. */
    int differ = 0;
    for (int i = 0; i < g.m; i++)
      for (int j = 0; j < g.n; j++) differ += isnan(c[(size_t)i * ldc + j]) != isnan(cf[(size_t)i * ldc + j]);
    CHECK(differ == 0, "ta=%d tb=%d m=%d n=%d k=%d: %d elements NaN on one path only", g.ta, g.tb, g.m, g.n, g.k, differ);
  }
  free(a); free(b); free(c0); free(c); free(cf);
}

static void test_gemm_shapes(void) {
  static const int dims[][3] = {{1, 1, 1}, {1, 7, 3}, {3, 1, 2}, {12, 32, 2}, {13, 33, 5}, {11, 31, 256},
                                {25, 65, 257}, {24, 64, 300}, {7, 100, 1}};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
    for (int t = 0; t < 4; t++)
      test_case((gcase){t & 1, t >> 1, dims[d][0], dims[d][1], dims[d][2], (int)(d % 3) * 3, 1.0f, 0.0f});
}

static void test_gemm_alpha_beta(void) {
  test_case((gcase){0, 1, 17, 40, 9, 2, 0.5f, 1.0f});
  test_case((gcase){1, 0, 30, 20, 33, 0, -2.0f, 0.25f});
  test_case((gcase){0, 0, 5, 5, 0, 1, 1.0f, 0.0f});   /* k = 0: c = beta c */
  test_case((gcase){0, 0, 5, 5, 0, 0, 1.0f, 0.5f});
}

/* the model's shapes (rows = 12 x 64 tokens, n_embd 128): threaded, with every transpose */
static void test_gemm_linear_shapes(void) {
  test_case((gcase){0, 1, 768, 384, 128, 0, 1.0f, 0.0f});   /* y = x W^T */
  test_case((gcase){0, 0, 768, 128, 512, 0, 1.0f, 0.0f});   /* dx = dy W */
  test_case((gcase){1, 0, 512, 128, 768, 0, 1.0f, 1.0f});   /* dW += dy^T x */
  test_case((gcase){1, 1, 65, 129, 97, 5, 1.0f, 0.0f});
}

/* ---- c in bf16: the rounding itself ------------------------------------------------------ */

/* x (finite, exact in float64) rounded to the nearest bf16 value, ties to even, by arithmetic:
 * 8 significant bits, and a spacing of no less than 2^-133 (bf16's denormals). */
static double bf16_nearest(double x) {
  if (x == 0) return x;
  int e;
  frexp(x, &e);   /* |x| in [2^(e-1), 2^e) */
  int q = e - 8 < -133 ? -133 : e - 8;
  return ldexp(nearbyint(ldexp(x, -q)), q);
}

/* Small integers times 2^-58 in a and b: every product (2^-116 times an integer) and every sum
 * is exact in f32, and alpha 2^-19 puts alpha times the sum among the f32 denormals, exactly.
 * So each element of c in bf16 must be that value rounded once to nearest even: denormal
 * results kept (not flushed to zero), ties to even. Both paths, all four transposes, tails. */
static void test_gemm_bf16_out_rounding(void) {
  enum { M = 13, N = 35, K = 5 };
  uint16_t a[M * K], b[K * N], c[M * N];
  for (int i = 0; i < M * K; i++) a[i] = sh_f32_to_bf16(ldexpf((float)((int)(urand() * 8)), -58));
  for (int i = 0; i < K * N; i++) b[i] = sh_f32_to_bf16(ldexpf((float)((int)(urand() * 8)), -58));
  float alpha = ldexpf(1, -19);
  for (int s = 0; s < check_sets(); s++) {
    const char *set = check_use_set(s);
    for (int t = 0; t < 4; t++) {
      int ta = t & 1, tb = t >> 1, bad = 0, denormal = 0;
      CHECK_OK(sh_gemm_bf16_out16(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, a,
                                  ta ? M : K, b, tb ? K : N, 0.0f, c, N));
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int p = 0; p < K; p++) s += el(a, ta ? M : K, ta, i, p) * el(b, tb ? K : N, tb, p, j);
          double want = bf16_nearest(ldexp(s, -19));
          uint32_t bits = (uint32_t)c[i * N + j] << 16;
          float got;
          memcpy(&got, &bits, 4);
          denormal += want != 0 && fabs(want) < ldexp(1, -126);
          if (got != want && bad++ < 3)
            printf("# %s ta=%d tb=%d c[%d][%d] = %a, want %a\n", set, ta, tb, i, j, got, want);
        }
      CHECK(bad == 0 && denormal > M * N / 4, "kernel set %s ta=%d tb=%d: bf16 c wrong in %d of %d elements (%d denormal)",
            set, ta, tb, bad, M * N, denormal);
    }
  }
  check_use_set(0);
}

/* ---- linear in bf16 ------------------------------------------------------------------------ */

static sh_tensor *tensor_of(int dtype, int64_t rows, int64_t cols, const double *v) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, 2, (int64_t[]){rows, cols}, dtype, -1));
  for (int64_t i = 0; i < rows * cols; i++) {
    if (dtype == SH_BF16) ((uint16_t *)sh_tensor_data(t))[i] = sh_f32_to_bf16((float)v[i]);
    else ((float *)sh_tensor_data(t))[i] = (float)v[i];
  }
  return t;
}

/* random values already on the bf16 grid, so that the f64 reference sees what the kernel sees */
static double *bf16_values(int64_t n) {
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = sh_bf16_to_f32(sh_f32_to_bf16((float)urand()));
  return v;
}

static double value(const sh_tensor *t, int64_t i) {
  return t->dtype == SH_BF16 ? sh_bf16_to_f32(((const uint16_t *)sh_tensor_data(t))[i]) : ((const float *)sh_tensor_data(t))[i];
}

/* t against want (rows x cols, row-major f64): within the f32-sum bound of a k-term product,
 * plus half a bf16 ulp when t is bf16 */
static void check_product(const char *what, const char *path, const sh_tensor *t, const double *want, const double *mag,
                          int64_t n, int64_t k) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    double tol = 4 * (k + 2) * ldexp(1, -23) * mag[i] + (t->dtype == SH_BF16 ? ldexp(fabs(want[i]), -8) : 0) + 1e-30;
    if (!(fabs(value(t, i) - want[i]) <= tol) && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "linear %s (%s): %lld elements off, first [%lld] = %.9g, want %.9g", what, path, (long long)bad,
        (long long)first, first < 0 ? 0 : value(t, first), first < 0 ? 0 : want[first]);
}

/* y = x w^T, dx = dy w, dw = dy^T x in f64, with sum |terms| for the tolerance */
static void linear_ref(int64_t rows, int64_t in, int64_t out, const double *x, const double *w, const double *dy,
                       double *y, double *ym, double *dx, double *dxm, double *dw, double *dwm) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t o = 0; o < out; o++) {
      double s = 0, m = 0;
      for (int64_t i = 0; i < in; i++) { s += x[r * in + i] * w[o * in + i]; m += fabs(x[r * in + i] * w[o * in + i]); }
      y[r * out + o] = s; ym[r * out + o] = m;
    }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < in; i++) {
      double s = 0, m = 0;
      for (int64_t o = 0; o < out; o++) { s += dy[r * out + o] * w[o * in + i]; m += fabs(dy[r * out + o] * w[o * in + i]); }
      dx[r * in + i] = s; dxm[r * in + i] = m;
    }
  for (int64_t o = 0; o < out; o++)
    for (int64_t i = 0; i < in; i++) {
      double s = 0, m = 0;
      for (int64_t r = 0; r < rows; r++) { s += dy[r * out + o] * x[r * in + i]; m += fabs(dy[r * out + o] * x[r * in + i]); }
      dw[o * in + i] = s; dwm[o * in + i] = m;
    }
}

/* bias (bf16 b) and the dtype of dw (f32: through the f32 buffer; bf16: written in place) */
static void test_linear_case(int64_t rows, int64_t in, int64_t out, int bias, int dw_dtype) {
  double *x = bf16_values(rows * in), *w = bf16_values(out * in), *dy = bf16_values(rows * out), *b = bf16_values(out);
  double *y = malloc(sizeof(double) * (size_t)(rows * out)), *ym = malloc(sizeof(double) * (size_t)(rows * out));
  double *dx = malloc(sizeof(double) * (size_t)(rows * in)), *dxm = malloc(sizeof(double) * (size_t)(rows * in));
  double *dw = malloc(sizeof(double) * (size_t)(out * in)), *dwm = malloc(sizeof(double) * (size_t)(out * in));
  linear_ref(rows, in, out, x, w, dy, y, ym, dx, dxm, dw, dwm);
  for (int64_t i = 0; bias && i < rows * out; i++) { y[i] += b[i % out]; ym[i] += fabs(b[i % out]); }
  double *dw2 = malloc(sizeof(double) * (size_t)(out * in)), *dwm2 = malloc(sizeof(double) * (size_t)(out * in));
  for (int64_t i = 0; i < out * in; i++) { dw2[i] = 2 * dw[i]; dwm2[i] = 2 * dwm[i]; }
  sh_tensor *tb = tensor_of(SH_BF16, 1, out, b), *tb1 = NULL;
  CHECK_OK(sh_view_reshape(&tb1, tb, 1, (int64_t[]){out}));
  sh_tensor *tx = tensor_of(SH_BF16, rows, in, x), *tw = tensor_of(SH_BF16, out, in, w), *tdy = tensor_of(SH_BF16, rows, out, dy);
  for (int s = 0; s < check_sets(); s++) {
    const char *name = check_use_set(s);
    sh_tensor *ty = NULL, *tdx = NULL, *tdw = NULL;
    CHECK_OK(sh_tensor_empty(&tdw, 2, (int64_t[]){out, in}, dw_dtype, -1));
    memset(sh_tensor_data(tdw), 0, (size_t)sh_dtype_size(dw_dtype) * (size_t)(out * in));
    CHECK_OK(sh_linear_forward(&ty, tx, tw, bias ? tb1 : NULL));
    /* twice: dw accumulates (2 dw), dx is new each time */
    CHECK_OK(sh_linear_backward(&tdx, tdw, NULL, tdy, tx, tw));
    sh_tensor_destroy(tdx);
    tdx = NULL;
    CHECK_OK(sh_linear_backward(&tdx, tdw, NULL, tdy, tx, tw));
    if (ty && tdx) {
      CHECK(ty->dtype == SH_BF16 && tdx->dtype == SH_BF16, "linear: y and dx take x's dtype (bf16)");
      check_product("y = x w^T", name, ty, y, ym, rows * out, in);
      check_product("dx = dy w", name, tdx, dx, dxm, rows * in, out);
      check_product("dw = dy^T x, accumulated twice", name, tdw, dw2, dwm2, out * in, rows);
    }
    sh_tensor_destroy(ty); sh_tensor_destroy(tdx); sh_tensor_destroy(tdw);
  }
  check_use_set(0);
  sh_tensor_destroy(tx); sh_tensor_destroy(tw); sh_tensor_destroy(tdy); sh_tensor_destroy(tb); sh_tensor_destroy(tb1);
  free(x); free(w); free(dy); free(b); free(y); free(ym); free(dx); free(dxm); free(dw); free(dwm); free(dw2); free(dwm2);
}

static void test_linear_bf16(void) {
  test_linear_case(1, 1, 1, 0, SH_F32);
  test_linear_case(74, 45, 70, 1, SH_BF16);
  test_linear_case(256, 96, 130, 0, SH_BF16);   /* the threaded path */
  test_linear_case(256, 96, 130, 1, SH_F32);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_gemm_shapes);
  RUN(test_gemm_alpha_beta);
  RUN(test_gemm_linear_shapes);
  RUN(test_gemm_bf16_out_rounding);
  RUN(test_linear_bf16);
  return check_summary("test_gemm_bf16");
}
