/* rules.c: what every backend computes the same way (core/rules_internal.h): result dtypes,
 * op names, the dim walk's collapsing, broadcast strides, the optimizers' per-step constants.
 * The fronts (ops/) plan with these and the kernels (cpu/, kernels/) run by them. */
#include <math.h>
#include "rules_internal.h"
#include "bf16_internal.h"

/* ---- dtypes and op names ------------------------------------------------------------- */

static int float_rank(int d) { return d == SH_F64 ? 3 : d == SH_F32 ? 2 : (d == SH_BF16 || d == SH_F16) ? 1 : 0; }

static int int_rank(int d) { return d == SH_I64 ? 4 : d == SH_I32 ? 3 : d == SH_U8 ? 2 : 1; }

int sh_promote(int a, int b) {
  int fa = float_rank(a), fb = float_rank(b);
  if (fa || fb) {
    if (fa == fb && a != b) return SH_F32;     /* bf16 with f16 */
    return fa >= fb ? a : b;
  }
  return int_rank(a) >= int_rank(b) ? a : b;
}

int sh_compute_dtype(int dtype) {
  if (dtype == SH_F64) return SH_F64;
  return sh_dtype_is_float(dtype) ? SH_F32 : SH_I64;
}

const char *sh_binop_name(int op) {
  static const char *names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "lt", "gt"};
  if (op == SH_OP_AXPY) return "axpy_";
  if (op == SH_OP_COPY) return "copy_";
  return op >= 0 && op <= SH_OP_GT ? names[op] : "binary";
}

const char *sh_unop_name(int op) {
  static const char *names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "abs", "square", "reciprocal", "sign"};
  return op >= 0 && op <= SH_OP_SIGN ? names[op] : "unary";
}

static int is_arith(int op) { return op <= SH_OP_POW || op == SH_OP_AXPY; }

int sh_binary_result(int op, int da, int db, int *out) {
  if (is_arith(op) && (da == SH_BOOL || db == SH_BOOL))
    return sh_fail(SH_ERR_ARG, "%s: arithmetic on bool tensors is not supported (%s, %s); convert with :to()",
                   sh_binop_name(op), sh_dtype_name(da), sh_dtype_name(db));
  int r = sh_promote(da, db);
  if (op == SH_OP_DIV && !sh_dtype_is_float(r)) r = SH_F32;
  *out = r;
  return SH_OK;
}

int sh_unary_result(int op, int da, int *out) {
  if (da == SH_BOOL) return sh_fail(SH_ERR_ARG, "%s: not defined for bool tensors; convert with :to()", sh_unop_name(op));
  int keeps = op == SH_OP_NEG || op == SH_OP_ABS || op == SH_OP_SQUARE || op == SH_OP_SIGN;
  *out = (keeps || sh_dtype_is_float(da)) ? da : SH_F32;
  return SH_OK;
}

const char *sh_reduce_name(int op) {
  static const char *names[] = {"sum", "mean", "max", "min"};
  if (op == SH_OP_SUMSQ) return "sumsq";
  return op >= 0 && op <= SH_OP_MIN ? names[op] : "reduce";
}

int sh_reduce_result_dtype(int op, int dtype) {
  if (sh_dtype_is_float(dtype) || op == SH_OP_MAX || op == SH_OP_MIN) return dtype;
  return op == SH_OP_MEAN ? SH_F32 : SH_I64;
}

/* ---- the N-d walk ---------------------------------------------------------------------- */

int sh_collapse_dims(int ndim, int64_t *shape, int nargs, int64_t *const *strides) {
  int n = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    int merge = n > 0;
    for (int k = 0; k < nargs && merge; k++) merge = strides[k][n - 1] == strides[k][d] * shape[d];
    if (merge) {
      shape[n - 1] *= shape[d];
      for (int k = 0; k < nargs; k++) strides[k][n - 1] = strides[k][d];
    } else {
      shape[n] = shape[d];
      for (int k = 0; k < nargs; k++) strides[k][n] = strides[k][d];
      n++;
    }
  }
  if (n == 0) {            /* one element */
    shape[0] = 1;
    for (int k = 0; k < nargs; k++) strides[k][0] = 0;
    n = 1;
  }
  return n;
}

void sh_broadcast_strides(const sh_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++)
    strides[d] = (d < lead || (t->shape[d - lead] == 1 && shape[d] != 1)) ? 0 : t->stride[d - lead];
}

/* ---- optimizers ---------------------------------------------------------------------- */

sh_adamw_hyper sh_adamw_hyper_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                                 int64_t step, double grad_scale) {
  return (sh_adamw_hyper){
    .scale = (float)grad_scale,
    .decay = (float)(1.0 - lr * weight_decay),
    .b1 = (float)beta1, .omb1 = (float)(1.0 - beta1),
    .b2 = (float)beta2, .omb2 = (float)(1.0 - beta2),
    .step_size = (float)(lr / (1.0 - pow(beta1, (double)step))),
    .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)step)),
    .eps = (float)eps,
  };
}

sh_sgd_hyper sh_sgd_hyper_of(double lr, double momentum, double dampening, double weight_decay, int nesterov,
                             int first_step, double grad_scale) {
  return (sh_sgd_hyper){
    .scale = (float)grad_scale,
    .lr = (float)lr, .wd = (float)weight_decay,
    .momentum = (float)momentum, .omd = (float)(1.0 - dampening),
    .nesterov = nesterov != 0,
    .first = first_step != 0,
    .has_buf = momentum != 0,
  };
}

/* ---- collectives' reductions ------------------------------------------------------------ */

double sh_comm_round(double x, int dtype) {
  switch (dtype) {
    case SH_F32: return (float)x;
    case SH_BF16: return sh_bf16_to_f32(sh_f32_to_bf16((float)x));
    case SH_F16: return sh_f16_to_f32(sh_f32_to_f16((float)x));
    default: return x;
  }
}

int sh_comm_acc_dtype(int dtype, int rd) {
  if (!sh_dtype_is_float(dtype)) return dtype;
  return dtype == SH_F64 || rd == SH_F64 ? SH_F64 : SH_F32;
}
