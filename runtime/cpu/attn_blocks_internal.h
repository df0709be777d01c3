/* attn_blocks_internal.h: the block products of CPU attention (attention.c) as register-tiled
 * kernels in the avx512 and avx2 kernel sets (attn_blocks.c: AVX-512F or AVX2 + FMA), for head
 * dims D that are a multiple of 16 up to 64 (GPT-2's 64, the benchmark's 32). A block is at
 * most 64 keys by a few dozen queries: a general GEMM (OpenBLAS's small-matrix path, or
 * sgemm.c's) spends as long on packing and dispatch as on the
 * 32 x 64 x 32 multiply-adds, where these keep the whole block of results in registers and
 * read both operands where they lie. Q K^T (and dO V^T) reads K transposed, once per key
 * block, so that a row of scores is a few vectors of one FMA chain each.
 *
 * Sums: each element is its products summed in order, one FMA after another, so the bits do
 * not depend on the threads, nor on the kernel set (avx2 or avx512). */
#pragma once
#include <stdint.h>

/* Whether the kernels run for head dim D: an avx2 or avx512 kernel set (cpu.h), D % 16 == 0,
 * D <= 64 (else attention's blocks go through sh_sgemm). */
int sh_attn_blocks_wanted(int64_t D);

/* bt[d * ldbt + j] = b[j * ldb + d] for j < n, d < D; columns n .. n rounded up to the
 * vector width (8 or 16) are 0. */
void sh_attn_transpose(float *bt, int ldbt, const float *b, int64_t ldb, int n, int D);

/* The causal mask: the block's query i sees its key j when j <= i + diag (diag: the query
 * block's first position minus the key block's). The kernels skip the column vectors and
 * the reduction steps that no row of a tile can see; what they skip is a product with a 0 of
 * P or dS, so the sums are as if it ran. */

/* s[i * lds + j] = scale sum_d a[i * lda + d] bt[d * ldbt + j] for i < m and j < n rounded
 * up to the vector width, where some row of i's tile sees j (bt from sh_attn_transpose:
 * padding columns come out 0). */
void sh_attn_scores(float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int m, int n, int D,
                    float scale, int diag);

/* c[i * ldc + e] += sum_q a(i, q) b[q * ldb + e] for i < m, q < k, e < D, over the (i, q) the
 * mask lets through, where a(i, q) is a[i * lda + q] (rows: O += P V, dQ += dS K; i a query,
 * q a key) or a[q * lda + i] (trans: dV += P^T dO, dK += dS^T Q; i a key, q a query). */
void sh_attn_accumulate(float *c, int64_t ldc, const float *a, int lda, int trans, const float *b, int64_t ldb,
                        int m, int k, int D, int diag);
