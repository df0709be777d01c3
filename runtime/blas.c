#include "blas_internal.h"
#include <omp.h>
#include <pthread.h>

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

/* Below this many multiply-adds a split costs more than it gains. */
enum { SPLIT_MIN_WORK = 1 << 20, ALIGN_ROWS = 16 };

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  pthread_once(&blas_once, blas_single_threaded);
  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads < 2 || (double)m * n * k < SPLIT_MIN_WORK) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  /* split the longer side of C; a row block of C needs rows of op(a), a column block
   * columns of op(b) */
  int split_rows = m >= n;
  int len = split_rows ? m : n;
  int chunk = (len + threads - 1) / threads;
  chunk = (chunk + ALIGN_ROWS - 1) / ALIGN_ROWS * ALIGN_ROWS;
  int parts = (len + chunk - 1) / chunk;
  #pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    int s = p * chunk, e = s + chunk < len ? s + chunk : len;
    if (split_rows) {
      const float *ap = ta == CblasNoTrans ? a + (long)s * lda : a + s;
      cblas_sgemm(CblasRowMajor, ta, tb, e - s, n, k, alpha, ap, lda, b, ldb, beta, c + (long)s * ldc, ldc);
    } else {
      const float *bp = tb == CblasNoTrans ? b + s : b + (long)s * ldb;
      cblas_sgemm(CblasRowMajor, ta, tb, m, e - s, k, alpha, a, lda, bp, ldb, beta, c + s, ldc);
    }
  }
}
