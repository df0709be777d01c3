#include "blas_internal.h"
#include "core/parallel.h"
#include <pthread.h>

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

/* The rows and columns a block of a split holds whole: the kernel's row tile and panel
 * (sgemm.c: 12 x 32 in the avx512 sets, 6 x 16 in avx2), or OpenBLAS's 16. */
static int row_unit(const sh_sgemm_kernel *own) { return own ? own->mr : 16; }
static int col_unit(const sh_sgemm_kernel *own) { return own ? own->nr : 16; }

/* Whether to split c by rows (else by columns): rows always when each block is finished by
 * `rows`, and always for OpenBLAS, whose bits depend on where an element falls in its blocking
 * (its AVX2 kernels: a column split gives other bits than a row split, so a fused epilogue
 * would differ from its composition); else the side that splits into whole units evenly over
 * the threads, and when both or neither do, the longer (a row block of c needs rows of
 * op(a), a column block columns of op(b)). */
static int split_by_rows(int m, int n, int threads, const sh_sgemm_kernel *own, int rows) {
  if (rows || !own) return 1;
  int even_rows = m % (row_unit(own) * threads) == 0, even_cols = n % (col_unit(own) * threads) == 0;
  return even_rows != even_cols ? even_rows : m >= n;
}

/* Rows [r0, r1) of c, through `rows` when there is one, on the calling thread. */
static void finish_rows(const sh_sgemm_rows *rows, int r0, int r1) {
  if (rows && r1 > r0) rows->fn(rows->ctx, r0, r1);
}

/* One thread's product: sgemm.c's kernel `own` when there is one (and its scratch could grow),
 * else OpenBLAS's. */
static void block_product(const sh_sgemm_kernel *own, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                          const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (own && sh_sgemm_run(own, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == 0) return;
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* A product split into parts: part p is rows (or columns) [p chunk, (p + 1) chunk) of c. */
typedef struct sgemm_job {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k, lda, ldb, ldc, split_rows, len, chunk, parts;
  const sh_sgemm_kernel *own;   /* chosen once, so every part runs the same kernel */
  float alpha, beta;
  const float *a, *b;
  float *c;
  const sh_sgemm_rows *rows;
} sgemm_job;

static void sgemm_part(const sgemm_job *j, int p) {
  int s = p * j->chunk, e = s + j->chunk < j->len ? s + j->chunk : j->len;
  if (j->split_rows) {
    const float *ap = j->ta == CblasNoTrans ? j->a + (long)s * j->lda : j->a + s;
    block_product(j->own, j->ta, j->tb, e - s, j->n, j->k, j->alpha, ap, j->lda, j->b, j->ldb, j->beta,
                  j->c + (long)s * j->ldc, j->ldc);
    finish_rows(j->rows, s, e);   /* while its block of c is still in this core's cache */
  } else {
    const float *bp = j->tb == CblasNoTrans ? j->b + s : j->b + (long)s * j->ldb;
    block_product(j->own, j->ta, j->tb, j->m, e - s, j->k, j->alpha, j->a, j->lda, bp, j->ldb, j->beta, j->c + s,
                  j->ldc);
  }
}

static void sgemm_task(void *arg, int t, int nt) {
  const sgemm_job *j = arg;
  for (int p = t; p < j->parts; p += nt) sgemm_part(j, p);
}

void sh_sgemm_then(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc, const sh_sgemm_rows *rows) {
  pthread_once(&blas_once, blas_single_threaded);
  int threads = sh_parallel_inside() ? 1 : sh_parallel_threads();
  int small = threads < 2 || (double)m * n * k < SH_SGEMM_SPLIT_MIN_WORK;
  const sh_sgemm_kernel *own = sh_sgemm_wanted(m, n, k, alpha);
  int split_rows = split_by_rows(m, n, threads, own, rows != NULL);
  int len = split_rows ? m : n, unit = split_rows ? row_unit(own) : col_unit(own);
  int chunk = ((len + threads - 1) / threads + unit - 1) / unit * unit;
  int parts = small ? 1 : (len + chunk - 1) / chunk;
  if (parts < 2) {
    block_product(own, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    finish_rows(rows, 0, m);
    return;
  }
  sgemm_job job = { ta, tb, m, n, k, lda, ldb, ldc, split_rows, len, chunk, parts, own, alpha, beta, a, b, c, rows };
  sh_parallel(parts, sgemm_task, &job);
}

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  sh_sgemm_then(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
}
