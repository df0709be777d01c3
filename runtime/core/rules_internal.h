/* rules_internal.h: what every backend computes the same way (not in the FFI), below the
 * fronts (ops/) that plan with it and the kernels (cpu/, kernels/) that run by it: result
 * dtypes and op names, the N-d walk's dim collapsing and broadcast strides, the optimizers'
 * per-step constants and the clip's formulas. */
#pragma once
#include <math.h>
#include "tensor_internal.h"
#include "kernel_args.h"

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

/* The dtype the CPU computes in for results of `dtype`: f64 for f64, f32 for every other
 * float (bf16/f16 math runs in f32), i64 for integers and bool. */
int sh_compute_dtype(int dtype);

/* Reductions, the same on every backend: the op's name (SH_OP_SUMSQ: the internal sum of
 * squares) and the result dtype (floats keep theirs, as do max/min; an integer sum is i64, an
 * integer mean f32). */
enum { SH_OP_SUMSQ = 100 };
const char *sh_reduce_name(int op);
int sh_reduce_result_dtype(int op, int dtype);

/* Strides of t seen with shape (ndim, shape): 0 where t is broadcast. t must broadcast. */
void sh_broadcast_strides(const sh_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* The per-step constants of an AdamW update (optim.h's formula). */
typedef struct sh_adamw_hyper {
  float scale, decay, b1, omb1, b2, omb2, step_size, bc2_sqrt, eps;
} sh_adamw_hyper;

/* The per-step constants of an SGD update; has_buf when momentum is on. */
typedef struct sh_sgd_hyper {
  float scale, lr, wd, momentum, omd;
  int nesterov, first, has_buf;
} sh_sgd_hyper;

sh_adamw_hyper sh_adamw_hyper_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                                 int64_t step, double grad_scale);
sh_sgd_hyper sh_sgd_hyper_of(double lr, double momentum, double dampening, double weight_decay, int nesterov,
                             int first_step, double grad_scale);

/* What sh_grad_norm_part sums over its tensors (norm_type 2, 1, INFINITY). */
enum { SH_NORM_MAX = 0, SH_NORM_L1 = 1, SH_NORM_L2 = 2 };

#ifdef __CUDACC__
#define SH_OPTIM_HD __host__ __device__ __forceinline__
#else
#define SH_OPTIM_HD static inline
#endif

/* sh_grad_clip_coef's formulas, for the kernels of both backends: the norm of a part in f64,
 * and the coefficient min(1, max_norm / (norm + 1e-6)) rounded once to f32 (NaN stays NaN). */
SH_OPTIM_HD double sh_clip_norm_of(double part, int kind) { return kind == SH_NORM_L2 ? sqrt(part) : part; }
SH_OPTIM_HD float sh_clip_coef_of(double norm, double max_norm) {
  double c = max_norm / (norm + 1e-6);
  return (float)(c > 1 ? 1 : c);
}

/* Entry i of a contiguous index tensor of i64 or i32 (embedding's, cross-entropy's targets). */
static inline int64_t sh_index_at(const sh_tensor *idx, int64_t i) {
  const void *p = sh_tensor_data(idx);
  return idx->dtype == SH_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* Collectives' reductions, the same in every comm backend. */
/* Rounds x to dtype (bf16/f16/f32) and back, as a value of the accumulation type. */
double sh_comm_round(double x, int dtype);
/* The accumulation dtype for a reduction of `dtype` values with reduce dtype rd (f64 or f32,
 * or the integer dtype itself). */
int sh_comm_acc_dtype(int dtype, int rd);
