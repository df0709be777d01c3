/* test_sgemm.c: the CPU's f32 GEMM (runtime/cpu/blas.c, runtime/cpu/sgemm.c) against a float64
 * product, under every kernel set from avx2 up to the one in use, each picked with
 * sh_cpu_set_isa, and under generic (check_cpu.h): avx2 runs sgemm.c's AVX2 kernel (6 x 16
 * tiles, a transposed a packed, b always packed), the avx512 sets its AVX-512 kernel (12 x 32,
 * a transposed a and, up to 256 rows of c, b read in place with prefetching), generic OpenBLAS.
 * - Each kernel itself (sh_sgemm_run on one thread), which sh_sgemm uses only for products
 *   past its size threshold: sizes 1, the tails of every block (rows of 12 and of 6, panels of
 *   32, 16 and 8, k chunks of 1024, column blocks of the 512 KiB pack, groups of 8 packed
 *   tiles of a), all four transposes, leading dimensions wider than the matrix (their padding
 *   is NaN in a and b, and must stay as it was in c), alpha and beta (beta 0 must not read c:
 *   it starts as NaN), b read in place on both sides of 256 rows of c, and the layouts that
 *   prefetch (a transposed and read in place, b read in place, both).
 * - The kernels of different sets give the same bits: each sums an element's k products in
 *   order, one FMA after another (c carrying the partial sum from one chunk of 1024 to the
 *   next), then times alpha, then plus beta c in one FMA; only the vector width differs.
 * - sh_sgemm on 1 and 2 threads on every path on the model's shapes and on ones whose split
 *   leaves tails; a kernel's bits must not depend on the thread count or the split, and the
 *   gelu epilogue (sh_sgemm_then) sees each row once, after its product.
 * Tolerance: f32 sums of f32 products, each element within (k + 2) 2^-24 sum_p |a_ip b_pj|
 * (times |alpha|, plus beta c's rounding) of the exact value; the check allows 4 times that. */
#include "check_cpu.h"
#include "cpu/blas_internal.h"
#include "core/parallel.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x13198A2E03707344ull;
static double urand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

typedef struct gcase { int ta, tb, m, n, k, extra; float alpha, beta; } gcase;

/* Operands and a starting c of a case, with NaN in every padding element. */
typedef struct operands { float *a, *b, *c0; int lda, ldb, ldc; } operands;

static operands make_operands(const gcase *g) {
  int ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k, br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
  operands o = { NULL, NULL, NULL, ac + g->extra, bc + g->extra, g->n + g->extra };
  o.a = malloc(sizeof(float) * ((size_t)ar * o.lda + 1));
  o.b = malloc(sizeof(float) * ((size_t)br * o.ldb + 1));
  o.c0 = malloc(sizeof(float) * ((size_t)g->m * o.ldc + 1));
  for (size_t i = 0; i < (size_t)ar * o.lda; i++) o.a[i] = (int)(i % o.lda) < ac ? (float)urand() : NAN;
  for (size_t i = 0; i < (size_t)br * o.ldb; i++) o.b[i] = (int)(i % o.ldb) < bc ? (float)urand() : NAN;
  for (size_t i = 0; i < (size_t)g->m * o.ldc; i++)
    o.c0[i] = (int)(i % o.ldc) >= g->n ? NAN : g->beta == 0 ? NAN : (float)urand();
  return o;
}

static void free_operands(operands *o) { free(o->a); free(o->b); free(o->c0); }

static double el(const float *x, int ld, int t, int i, int p) { return t ? x[(size_t)p * ld + i] : x[(size_t)i * ld + p]; }

/* c (computed from o.c0 by `path`) against float64; padding past n untouched. */
static void check_result(const gcase *g, const operands *o, const float *c, const char *path) {
  int bad = 0;
  for (int i = 0; i < g->m && bad < 3; i++)
    for (int j = 0; j < o->ldc && bad < 3; j++) {
      double got = c[(size_t)i * o->ldc + j], start = o->c0[(size_t)i * o->ldc + j];
      if (j >= g->n) {
        if (!isnan(got)) { bad++; CHECK(0, "%s m=%d n=%d k=%d: c[%d][%d] past n changed", path, g->m, g->n, g->k, i, j); }
        continue;
      }
      double s = 0, mag = 0;
      for (int p = 0; p < g->k; p++) {
        double t = el(o->a, o->lda, g->ta, i, p) * el(o->b, o->ldb, g->tb, p, j);
        s += t;
        mag += fabs(t);
      }
      double beta_c = g->beta == 0 ? 0 : g->beta * start;
      double want = g->alpha * s + beta_c;
      double tol = 4 * (g->k + 2) * ldexp(1, -24) * (fabs(g->alpha) * mag + fabs(beta_c)) + 1e-30;
      if (!(fabs(got - want) <= tol)) {
        bad++;
        CHECK(0, "%s ta=%d tb=%d m=%d n=%d k=%d alpha=%g beta=%g: c[%d][%d] = %.9g, want %.9g (tol %.3g)", path, g->ta,
              g->tb, g->m, g->n, g->k, g->alpha, g->beta, i, j, got, want, tol);
      }
    }
  if (!bad) CHECK(1, "%s", path);
}

static CBLAS_TRANSPOSE tr(int t) { return t ? CblasTrans : CblasNoTrans; }

static float *copy_c(const gcase *g, const operands *o) {
  float *c = malloc(sizeof(float) * ((size_t)g->m * o->ldc + 1));
  memcpy(c, o->c0, sizeof(float) * (size_t)g->m * o->ldc);
  return c;
}

/* ---- the kernels on one thread ------------------------------------------------------------ */

/* The set in use (SHARD_CPU_ISA, or the CPU's best): the kernel tests run each set from avx2
 * up to it. */
static int set_in_use(void) {
  check_sets();
  return check_isa_top;
}

/* The kernel of set isa's c for g, from o's starting c (the caller frees it). */
static float *kernel_product(int isa, const gcase *g, const operands *o) {
  float *c = copy_c(g, o);
  CHECK(sh_cpu_set_isa(isa) == SH_OK, "kernel set %s runs here", sh_cpu_isa_name(isa));
  CHECK(sh_sgemm_run(sh_sgemm_kernel_of(isa), tr(g->ta), tr(g->tb), g->m, g->n, g->k, g->alpha, o->a, o->lda, o->b,
                     o->ldb, g->beta, c, o->ldc) == 0,
        "sh_sgemm_run [%s] m=%d n=%d k=%d runs", sh_cpu_isa_name(isa), g->m, g->n, g->k);
  return c;
}

/* g through the kernel of every set from avx2 up to the one in use: each against float64, and
 * each with the bits of the first. */
static void kernel_case(gcase g) {
  operands o = make_operands(&g);
  float *first = NULL;
  for (int isa = SH_CPU_AVX2; isa <= set_in_use(); isa++) {
    float *c = kernel_product(isa, &g, &o);
    char what[64];
    snprintf(what, sizeof what, "kernel [%s]", sh_cpu_isa_name(isa));
    check_result(&g, &o, c, what);
    if (!first) { first = c; continue; }
    CHECK(memcmp(c, first, sizeof(float) * (size_t)g.m * o.ldc) == 0,
          "ta=%d tb=%d m=%d n=%d k=%d alpha=%g beta=%g: the kernel of %s gives avx2's bits", g.ta, g.tb, g.m, g.n, g.k,
          g.alpha, g.beta, sh_cpu_isa_name(isa));
    free(c);
  }
  free(first);
  free_operands(&o);
  check_use_set(0);
}

static int have_kernels(void) {
  if (set_in_use() >= SH_CPU_AVX2) return 1;
  printf("# kernel tests skipped: kernel set %s has no GEMM of shard's own\n", sh_cpu_isa_name(sh_cpu_isa()));
  return 0;
}

static void test_kernel_shapes(void) {
  if (!have_kernels()) return;
  /* m around the 6- and 12-row tiles, n around the 8-, 16- and 32-column panels, k from 1 */
  static const int dims[][3] = {{1, 1, 1}, {1, 7, 3}, {3, 1, 2}, {12, 32, 2}, {13, 33, 5}, {11, 16, 9},
                                {11, 17, 31}, {24, 48, 64}, {25, 65, 257}, {36, 96, 100}, {7, 100, 1},
                                {6, 16, 4}, {5, 8, 3}, {7, 9, 11}, {6, 24, 17}, {18, 40, 33}};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
    for (int t = 0; t < 4; t++) kernel_case((gcase){t & 1, t >> 1, dims[d][0], dims[d][1], dims[d][2], (int)(d % 3) * 3, 1, 0});
}

static void test_kernel_alpha_beta(void) {
  if (!have_kernels()) return;
  kernel_case((gcase){0, 1, 17, 40, 9, 2, 0.5f, 1.0f});
  kernel_case((gcase){1, 0, 30, 20, 33, 0, -2.0f, 0.25f});
  kernel_case((gcase){1, 1, 13, 50, 70, 1, 1.0f, -1.0f});
}

/* k past one chunk (c carries the partial sums between chunks, beta applied once), n past
 * one column block of the pack (128 columns at k >= 1024), and a transposed a past one group
 * of packed tiles (48 rows in avx2) */
static void test_kernel_blocks(void) {
  if (!have_kernels()) return;
  kernel_case((gcase){0, 0, 14, 40, 2100, 1, 1.0f, 0.0f});
  kernel_case((gcase){1, 1, 13, 300, 1100, 0, 0.75f, 0.5f});
  kernel_case((gcase){0, 1, 25, 290, 600, 3, 1.0f, 1.0f});
  kernel_case((gcase){1, 0, 47, 33, 70, 0, 1.0f, 0.0f});
  kernel_case((gcase){1, 0, 48, 16, 65, 2, 1.0f, 1.0f});
  kernel_case((gcase){1, 1, 103, 40, 1030, 1, -0.5f, 2.0f});
}

/* The layouts that prefetch, and the bound of b read in place (avx512: up to 256 rows of c, b
 * not transposed; a transposed a read in place prefetches in each tile's first panel, b read
 * in place in each panel's first tile). */
static void test_kernel_in_place(void) {
  if (!have_kernels()) return;
  kernel_case((gcase){1, 0, 24, 96, 300, 0, 1.0f, 1.0f});     /* a and b prefetched */
  kernel_case((gcase){0, 0, 36, 64, 200, 5, 1.0f, 0.0f});     /* b prefetched, a as rows */
  kernel_case((gcase){1, 1, 36, 64, 200, 1, 1.0f, 0.0f});     /* a prefetched, b packed */
  kernel_case((gcase){1, 0, 256, 80, 100, 0, 1.0f, 0.5f});    /* the last m that reads b in place */
  kernel_case((gcase){1, 0, 257, 80, 100, 3, 1.0f, 0.5f});    /* the first that packs it */
  kernel_case((gcase){0, 0, 250, 1100, 1030, 0, 1.0f, 0.0f}); /* b in place past a chunk and a pack */
}

/* ---- sh_sgemm: the split, both paths, thread counts ------------------------------------------ */

/* What the epilogue saw: how often each row, and each row of c as it was then. */
typedef struct seen { int *rows; float *snap; const float *c; int ldc; } seen;

static void mark_rows(const void *ctx, int r0, int r1) {
  const seen *s = ctx;
  for (int r = r0; r < r1; r++) s->rows[r]++;
  memcpy(s->snap + (size_t)r0 * s->ldc, s->c + (size_t)r0 * s->ldc, sizeof(float) * (size_t)(r1 - r0) * s->ldc);
}

/* Runs g through sh_sgemm_then on `threads` threads on the current path; checks it against
 * float64, and that the epilogue saw every row once, when it already held its result. Returns c. */
static float *split_case(const gcase *g, const operands *o, int threads, const char *path) {
  float *c = copy_c(g, o);
  seen s = { calloc((size_t)g->m, sizeof(int)), malloc(sizeof(float) * ((size_t)g->m * o->ldc + 1)), c, o->ldc };
  sh_parallel_set_threads(threads);
  sh_sgemm_then(tr(g->ta), tr(g->tb), g->m, g->n, g->k, g->alpha, o->a, o->lda, o->b, o->ldb, g->beta, c, o->ldc,
                &(sh_sgemm_rows){mark_rows, &s});
  char what[96];
  snprintf(what, sizeof what, "%s, %d thread%s", path, threads, threads > 1 ? "s" : "");
  check_result(g, o, c, what);
  int once = 1;
  for (int r = 0; r < g->m; r++) once &= s.rows[r] == 1;
  CHECK(once, "%s m=%d: the epilogue saw every row once", what, g->m);
  int final = 1;
  for (size_t i = 0; i < (size_t)g->m * o->ldc; i++)
    final &= s.snap[i] == c[i] || (isnan(s.snap[i]) && isnan(c[i]));
  CHECK(final, "%s m=%d n=%d k=%d: the epilogue saw each row's final values", what, g->m, g->n, g->k);
  free(s.rows);
  free(s.snap);
  return c;
}

/* g through sh_sgemm on 1 and 2 threads under the set in use, each lower set with a kernel,
 * and generic: each against float64; a kernel's bits the same on 1 and 2 threads, and the same
 * in every set with a kernel. */
static void split_all_paths(gcase g) {
  operands o = make_operands(&g);
  float *first = NULL;
  int threads_before = sh_parallel_threads();
  for (int isa = set_in_use(); isa >= SH_CPU_GENERIC; isa--) {
    if (isa < check_isa_top && isa > SH_CPU_GENERIC && isa != SH_CPU_AVX2) continue;   /* avx512 under avx512bf16 */
    CHECK(sh_cpu_set_isa(isa) == SH_OK, "kernel set %s runs here", sh_cpu_isa_name(isa));
    int own = sh_sgemm_kernel_of(isa) != NULL;
    char path[48];
    snprintf(path, sizeof path, "%s [%s]", own ? "kernel" : "OpenBLAS", sh_cpu_isa_name(isa));
    float *c1 = split_case(&g, &o, 1, path), *c2 = split_case(&g, &o, 2, path);
    if (own) {
      size_t bytes = sizeof(float) * (size_t)g.m * o.ldc;
      CHECK(memcmp(c2, c1, bytes) == 0, "%s m=%d n=%d k=%d: 2 threads give the bits of 1", path, g.m, g.n, g.k);
      if (first)
        CHECK(memcmp(c1, first, bytes) == 0, "%s m=%d n=%d k=%d: the bits of the set above", path, g.m, g.n, g.k);
      else
        first = c1, c1 = NULL;
    }
    free(c1);
    free(c2);
  }
  free(first);
  check_use_set(0);
  sh_parallel_set_threads(threads_before);
  free_operands(&o);
}

/* the model's shapes (12 x 64 tokens, n_embd 128): y = x W^T, dx = dy W, dW += dy^T x */
static void test_split_model_shapes(void) {
  split_all_paths((gcase){0, 1, 768, 384, 128, 0, 1.0f, 0.0f});
  split_all_paths((gcase){0, 0, 768, 128, 512, 0, 1.0f, 0.0f});
  split_all_paths((gcase){1, 0, 512, 128, 768, 0, 1.0f, 1.0f});
  split_all_paths((gcase){1, 0, 128, 128, 768, 0, 1.0f, 1.0f});
  split_all_paths((gcase){0, 1, 768, 65, 128, 0, 1.0f, 0.0f});
}

/* splits that leave a tail tile or panel on one thread, and a tall k */
static void test_split_tails(void) {
  split_all_paths((gcase){0, 0, 101, 77, 333, 3, 0.5f, 0.5f});
  split_all_paths((gcase){1, 1, 37, 290, 65, 1, -1.0f, 0.0f});
  split_all_paths((gcase){0, 1, 9, 40, 1500, 0, 1.0f, 0.0f});
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_kernel_shapes);
  RUN(test_kernel_alpha_beta);
  RUN(test_kernel_blocks);
  RUN(test_kernel_in_place);
  RUN(test_split_model_shapes);
  RUN(test_split_tails);
  return check_summary("test_sgemm");
}
