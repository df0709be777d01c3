/* blas_internal.h: the one way shard calls an f32 GEMM on the CPU.
 * OpenBLAS runs single-threaded (its worker threads spin in sched_yield between calls, taking
 * the cores OpenMP needs); sh_sgemm itself splits a large product across the OpenMP threads,
 * each calling BLAS on its block of C. Inside an OpenMP region it is a plain BLAS call. */
#pragma once
#include <cblas.h>

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
