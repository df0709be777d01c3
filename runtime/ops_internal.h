/* ops_internal.h: dtype rules and helpers shared by the CPU op files (not in the FFI). */
#pragma once
#include "tensor_internal.h"
#include "cpu_internal.h"

/* The dtype a binary op's operands promote to (ops.h): a float beats an integer, the wider
 * float wins, bf16 with f16 gives f32; among integers the wider wins and bool is the lowest. */
int sh_promote(int a, int b);

/* Internal binary ops beyond sh_binop: a + alpha * b, and copy (the second operand). */
enum { SH_OP_AXPY = 100, SH_OP_COPY = 101 };

/* Elementwise result dtypes, the same on every backend: `a op b` promotes (a division of
 * integers gives f32; arithmetic on bool fails, naming the op), a unary op keeps its dtype
 * when it is a float or the op is neg/abs/square/sign, else gives f32. */
int sh_binary_result(int op, int da, int db, int *out);
int sh_unary_result(int op, int da, int *out);
const char *sh_binop_name(int op);
const char *sh_unop_name(int op);

/* Drops size-1 dims of an N-d walk and merges neighbouring dims that are contiguous for
 * every operand (strides[k] is operand k's stride array, updated in place). Returns the new
 * number of dims (at least 1: a single element is one dim of size 1 with stride 0). */
int sh_collapse_dims(int ndim, int64_t *shape, int nargs, int64_t *const *strides);

/* Reductions, the same on every backend: the op's name, the result dtype (floats keep theirs,
 * as do max/min; an integer sum is i64, an integer mean f32), the dim (negative from the end;
 * out of range fails naming op and tensor) and the output shape (the dim kept as 1 or dropped;
 * returns the number of dims). */
const char *sh_reduce_name(int op);
int sh_reduce_result_dtype(int op, int dtype);
int sh_reduce_dim(const char *op, const sh_tensor *a, int *dim);
int sh_reduced_shape(const sh_tensor *a, int dim, int keepdim, int64_t *shape);

/* The dtype the CPU computes in for results of `dtype`: f64 for f64, f32 for every other
 * float (bf16/f16 math runs in f32), i64 for integers and bool. */
int sh_compute_dtype(int dtype);

/* Copies t into a new contiguous tensor of dtype unless it already is one (then an alias),
 * so kernels can assume a dense row-major array of a known type. */
int sh_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype);

