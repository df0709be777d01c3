#include "blas_internal.h"
#include <omp.h>
#include <pthread.h>

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

/* Below this many multiply-adds a split costs more than it gains. */
enum { SPLIT_MIN_WORK = 1 << 20, ALIGN_ROWS = 16 };

/* Rows [r0, r1) of c, through `rows` when there is one, on the calling thread. */
static void finish_rows(const sh_sgemm_rows *rows, int r0, int r1) {
  if (rows && r1 > r0) rows->fn(rows->ctx, r0, r1);
}

void sh_sgemm_then(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc, const sh_sgemm_rows *rows) {
  pthread_once(&blas_once, blas_single_threaded);
  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int small = threads < 2 || (double)m * n * k < SPLIT_MIN_WORK;
  /* split the longer side of C (a row block of C needs rows of op(a), a column block
   * columns of op(b)); rows always when each block is finished by `rows` */
  int split_rows = m >= n || rows;
  int len = split_rows ? m : n;
  int chunk = (len + threads - 1) / threads;
  chunk = (chunk + ALIGN_ROWS - 1) / ALIGN_ROWS * ALIGN_ROWS;
  int parts = small ? 1 : (len + chunk - 1) / chunk;
  if (parts < 2) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    finish_rows(rows, 0, m);
    return;
  }
  #pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int s = p * chunk, e = s + chunk < len ? s + chunk : len;
    if (split_rows) {
      const float *ap = ta == CblasNoTrans ? a + (long)s * lda : a + s;
      cblas_sgemm(CblasRowMajor, ta, tb, e - s, n, k, alpha, ap, lda, b, ldb, beta, c + (long)s * ldc, ldc);
      finish_rows(rows, s, e);   /* while its block of c is still in this core's cache */
    } else {
      const float *bp = tb == CblasNoTrans ? b + s : b + (long)s * ldb;
      cblas_sgemm(CblasRowMajor, ta, tb, m, e - s, k, alpha, a, lda, bp, ldb, beta, c + s, ldc);
    }
  }
}

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  sh_sgemm_then(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
}
