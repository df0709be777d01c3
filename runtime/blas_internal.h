/* blas_internal.h: the one way shard calls an f32 GEMM on the CPU.
 * OpenBLAS runs single-threaded (its worker threads spin in sched_yield between calls, taking
 * the cores OpenMP needs); sh_sgemm itself splits a large product across the OpenMP threads,
 * each calling BLAS on its block of C. Inside an OpenMP region it is a plain BLAS call. */
#pragma once
#include <cblas.h>

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* c = alpha op(a) op(b) + beta c with a and b bf16 (uint16_t bit patterns) and c f32, row
 * major (gemm_bf16.c): AVX-512 BF16 with f32 sums where the CPU has it, else (or with
 * SHARD_CPU_BF16=0) widened to f32 through sh_sgemm, said once on stderr. SH_OK, or
 * SH_ERR_OOM when its packing buffers cannot be allocated. */
#include <stdint.h>
int sh_gemm_bf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc);
/* The same with c in bf16: the f32 result (beta c read widened) rounded to nearest even once,
 * at the store. */
int sh_gemm_bf16_out16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, uint16_t *c, int ldc);
/* whether the CPU runs vdpbf16ps (cpuid, once) */
int sh_cpu_bf16_available(void);
