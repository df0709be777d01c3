/* matmul.cuh: the one cuBLASLt product (matmul.cu) that matmul, gemm_ and linear.cu's linear
 * and epilogue fusions all run. */
#pragma once
#include "common.cuh"

/* What a product may fuse after it: BIAS (linear forward), GELU_AUX_BIAS (y = gelu(x w^T + b)
 * keeping the pre-activation), DGELU (dpre = (dy w) * gelu'(pre)) and BGRADB (db = column
 * sums of dy from the dw product). */
enum { EPI_NONE = 0, EPI_BIAS, EPI_GELU_AUX_BIAS, EPI_DGELU, EPI_BGRADB };

/* One product, row-major view: D[M, N] = alpha op(A) op(B) + beta D, over `batch` matrices
 * at the given element strides. op(A) = A [M, K] (lda >= K) or, with ta, A stored [K, M]. */
struct lt_gemm {
  int64_t M, N, K;
  const void *A, *B;
  void *D;
  int64_t lda, ldb, ldd;
  int ta, tb;
  int in_dt, out_dt;
  double alpha, beta;
  int epi;
  const void *bias;       /* BIAS, GELU_AUX_BIAS: [N] in out_dt; BGRADB: output [N] in out_dt */
  void *aux;              /* GELU_AUX_BIAS: pre-activation out; DGELU: pre-activation in; [M, N] ld N */
  int64_t batch, sA, sB, sD;
};

/* Runs g with its epilogue when the library has a kernel for it; returns 1 in *fused when it
 * did, 0 when it ran the plain product instead (the caller then does the epilogue). Fails
 * naming op when cuBLASLt has no algorithm for the plain product either. */
int lt_gemm_epi(const char *op, int device, cudaStream_t st, lt_gemm g, int *fused);
