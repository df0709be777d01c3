/* optim_internal.h: the per-step constants of an optimizer update, formed once per call from
 * the hyper-parameters (which optim.c's fronts have checked) by the kernels of every backend
 * (optim.c's CPU loops, kernels/optim.cu), and the kinds of gradient-norm part. */
#pragma once
#include "tensor_internal.h"

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
