/* kernel_args.h: what the kernel table's entries take besides tensors and numbers, and so what
 * every backend and the fronts above them share: the elementwise and reduction op codes (ops.h's
 * ops take them) and the record of one parameter of a multi-tensor AdamW step (optim.h). */
#pragma once
#include <stdint.h>
#include "tensor.h"

typedef enum sh_binop {
  SH_OP_ADD = 0, SH_OP_SUB = 1, SH_OP_MUL = 2, SH_OP_DIV = 3, SH_OP_POW = 4,
  SH_OP_MAXIMUM = 5, SH_OP_MINIMUM = 6, SH_OP_EQ = 7, SH_OP_LT = 8, SH_OP_GT = 9
} sh_binop;

typedef enum sh_unop {
  SH_OP_NEG = 0, SH_OP_EXP = 1, SH_OP_LOG = 2, SH_OP_SQRT = 3, SH_OP_RSQRT = 4,
  SH_OP_TANH = 5, SH_OP_ABS = 6, SH_OP_SQUARE = 7, SH_OP_RECIPROCAL = 8, SH_OP_SIGN = 9
} sh_unop;

typedef enum sh_reduceop { SH_OP_SUM = 0, SH_OP_MEAN = 1, SH_OP_MAX = 2, SH_OP_MIN = 3 } sh_reduceop;

/* One parameter of a multi-tensor AdamW step: sh_adamw_step_'s buffers and weight decay. */
typedef struct sh_adamw_param {
  sh_tensor *param;
  const sh_tensor *grad;
  sh_tensor *m, *v, *shadow;   /* shadow may be NULL */
  double weight_decay;
  /* NULL, or one f32 on the param's device that multiplies grad_scale, read by the kernel so
   * the host never waits for it: the coefficient of a clip (sh_grad_clip_coef). */
  const sh_tensor *clip;
} sh_adamw_param;
