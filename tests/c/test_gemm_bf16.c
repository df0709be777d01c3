/* test_gemm_bf16.c: sh_gemm_bf16 (runtime/gemm_bf16.c) against a float64 product of the same
 * bf16 inputs, on both of its paths in one process: AVX-512 BF16 when this CPU has it, and
 * the widened-to-f32 fallback forced by SHARD_CPU_BF16=0 (and the two against each other).
 * Shapes: sizes 1, tails of every block (rows of 12, columns of 32, 128 k-pairs, odd k),
 * all four transposes (linear's backward uses dx = dy W and dW = dy^T x), leading dimensions
 * wider than the matrix, alpha and beta (beta 0 must not read c: it starts as NaN), and
 * products large enough for the threaded path.
 * Tolerance: the products of two bf16 are exact in f32 and the sums are f32, so each element
 * is within k * 2^-23 * sum_p |a_ip b_pj| of the exact value (plus |beta c| rounding); the
 * check allows 4 times that. */
#include "check.h"
#include "blas_internal.h"
#include "dtype.h"
#include "status.h"
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

/* Runs one case on the current path into c (c0 its start); checks against float64. */
static void run_case(const gcase *g, const char *path, const uint16_t *a, int lda, const uint16_t *b, int ldb,
                     const float *c0, float *c, int ldc) {
  memcpy(c, c0, sizeof(float) * (size_t)g->m * ldc);
  CHECK_OK(sh_gemm_bf16(g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->m, g->n, g->k,
                        g->alpha, a, lda, b, ldb, g->beta, c, ldc));
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
      double tol = 4 * (g->k + 2) * ldexp(1, -23) * (fabs(g->alpha) * mag + fabs(g->beta * (g->beta == 0 ? 0 : start))) + 1e-30;
      if (!(fabs(got - want) <= tol)) {
        bad++;
        CHECK(0, "%s ta=%d tb=%d m=%d n=%d k=%d alpha=%g beta=%g: c[%d][%d] = %.9g, want %.9g (tol %.3g)", path,
              g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->beta, i, j, got, want, tol);
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
  for (int i = 0; i < g.m * ldc; i++) c0[i] = g.beta == 0 && i % ldc < g.n ? NAN : (float)urand();
  unsetenv("SHARD_CPU_BF16");
  run_case(&g, sh_cpu_bf16_available() ? "avx512bf16" : "fallback (no avx512bf16)", a, lda, b, ldb, c0, c, ldc);
  setenv("SHARD_CPU_BF16", "0", 1);
  run_case(&g, "fallback", a, lda, b, ldb, c0, cf, ldc);
  unsetenv("SHARD_CPU_BF16");
  /* the two paths sum in different orders; both are within the bound of the exact value,
   * so within twice it of each other: checked above. Here: same shape of result. */
  int differ = 0;
  for (int i = 0; i < g.m; i++)
    for (int j = 0; j < g.n; j++) differ += isnan(c[(size_t)i * ldc + j]) != isnan(cf[(size_t)i * ldc + j]);
  CHECK(differ == 0, "ta=%d tb=%d m=%d n=%d k=%d: %d elements NaN on one path only", g.ta, g.tb, g.m, g.n, g.k, differ);
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

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_gemm_shapes);
  RUN(test_gemm_alpha_beta);
  RUN(test_gemm_linear_shapes);
  return check_summary("test_gemm_bf16");
}
