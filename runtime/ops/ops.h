/* ops.h: tensor math on the CPU (and, through the same entry points, on CUDA).
 * Results are new contiguous tensors returned through `out`; names ending in _ write into
 * their first argument. Binary ops broadcast (numpy rules) and promote dtypes: a float
 * beats an integer, and the wider float wins (bf16 + f32 -> f32). bf16/f16 math runs in f32.
 * Dims are 0-based here; Lua converts from its 1-based dims.
 * EQ, LT and GT give 0/1 in the promoted dtype (no bool result); DIV of integers and exp,
 * log, sqrt, rsqrt, tanh, reciprocal of integers give f32; arithmetic on bool is an error.
 * A scalar never widens a float tensor. Sums give i64 for integers, means f32. */
#pragma once
#include <stdint.h>
#include "core/kernel_args.h"


/* elementwise */
int sh_binary(sh_tensor **out, int op, const sh_tensor *a, const sh_tensor *b);
int sh_binary_scalar(sh_tensor **out, int op, const sh_tensor *a, double s, int scalar_first); /* a op s, or s op a */
int sh_unary(sh_tensor **out, int op, const sh_tensor *a);
int sh_binary_(sh_tensor *dst, int op, const sh_tensor *b);       /* dst = dst op b; b broadcasts to dst */
int sh_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x);   /* dst += alpha * x; x broadcasts to dst */
int sh_scale_(sh_tensor *dst, double alpha);                      /* dst *= alpha */

/* reductions: over one dim (keepdim 0/1), or over everything into a 0-dim tensor */
int sh_reduce(sh_tensor **out, int op, const sh_tensor *a, int dim, int keepdim);
int sh_reduce_all(sh_tensor **out, int op, const sh_tensor *a);
int sh_argmax(sh_tensor **out, const sh_tensor *a, int dim, int keepdim);  /* i64 indices */
/* Sums a over the dims that were broadcast to reach its shape from `shape` (autograd of
 * broadcasting ops): the result has exactly `shape`. */
int sh_sum_to_shape(sh_tensor **out, const sh_tensor *a, int ndim, const int64_t *shape);
double sh_sumsq(const sh_tensor *a, int *status);                 /* sum of squares, in f64 */

/* matrix products (OpenBLAS on the CPU; f32 math, bf16/f16 inputs converted) */
int sh_matmul(sh_tensor **out, const sh_tensor *a, const sh_tensor *b);  /* 1-D..N-D, batch dims broadcast */
/* c = alpha * op(a) @ op(b) + beta * c for 2-D a, b, c; op transposes when trans_* is 1.
 * Views with a unit inner or outer stride need no copy. */
int sh_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
             double alpha, double beta);

/* creation */
int sh_arange(sh_tensor **out, double start, double end, double step, int dtype, int device);
/* Fills t from the counter-based stream (seed, offset): element i uses counter offset + i,
 * the same on every backend and rank. Callers advance their offset by numel. */
int sh_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
int sh_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high);
