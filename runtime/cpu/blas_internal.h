/* blas_internal.h: the one way shard calls an f32 GEMM on the CPU.
 * sh_sgemm splits a large product across the thread team (parallel.h), each thread computing
 * its block of C: through sgemm.c's kernels in the avx2 and avx512 kernel sets (below), else
 * through OpenBLAS, which runs single-threaded (its worker threads spin in sched_yield between
 * calls, taking the cores the kernels need). Inside a parallel call it is one block. */
#pragma once
#include <cblas.h>

/* Below this many multiply-adds sh_sgemm runs a product on the calling thread: a split would
 * cost more than it gains. */
enum { SH_SGEMM_SPLIT_MIN_WORK = 1 << 20 };

void sh_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
/* An epilogue over rows of c: fn(ctx, r0, r1) finishes rows [r0, r1) once they hold the
 * product (gelu on a linear's output, say). */
typedef struct sh_sgemm_rows { void (*fn)(const void *ctx, int r0, int r1); const void *ctx; } sh_sgemm_rows;
/* sh_sgemm, then rows->fn over every row of c (rows may be NULL): a split product runs it on
 * each thread's own block of rows as soon as that block is done, in the same parallel
 * region, while the block is still in the thread's cache. */
void sh_sgemm_then(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc, const struct sh_sgemm_rows *rows);

/* sgemm.c: shard's own f32 kernel of a kernel set (cpu.h): AVX2 + FMA in avx2, AVX-512F in
 * the avx512 sets, none in generic. */
typedef struct sh_sgemm_kernel {
  int isa, mr, nr;                /* its set; the rows and columns of c one of its tiles holds */
  const struct sgemm_ops *ops;    /* its packing and micro-kernels (sgemm.c) */
} sh_sgemm_kernel;
/* The kernel of set `isa` (cpu.h), or NULL (generic). */
const sh_sgemm_kernel *sh_sgemm_kernel_of(int isa);
/* The set in use's kernel when a product goes through it (alpha not 0, not tiny), else NULL. */
const sh_sgemm_kernel *sh_sgemm_wanted(int m, int n, int k, float alpha);
/* The product through `kern` on the calling thread: 0, or -1 when its packing scratch cannot
 * grow (the caller then uses OpenBLAS). */
int sh_sgemm_run(const sh_sgemm_kernel *kern, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* c = alpha op(a) op(b) + beta c with a and b bf16 (uint16_t bit patterns) and c f32, row
 * major (gemm_bf16.c): AVX-512 BF16 with f32 sums in the avx512bf16 kernel set (cpu.h), else
 * widened to f32 through sh_sgemm, said once on stderr. SH_OK, or
 * SH_ERR_OOM when its packing buffers cannot be allocated. */
#include <stdint.h>
int sh_gemm_bf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc);
/* The same with c in bf16: the f32 result (beta c read widened) rounded to nearest even once,
 * at the store. */
int sh_gemm_bf16_out16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, uint16_t *c, int ldc);
