/* optim_internal.h: what an optimizer step checks and derives before any backend runs it,
 * defined once for the CPU loops (optim.c) and the CUDA kernels (kernels/optim.cu). */
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

/* Check param, m, v (f32), grad (f32 or bf16) and shadow (any float): flat, param's numel,
 * param's device; and the hyper-parameters' ranges. Errors name the op, tensor and value. */
int sh_adamw_prepare(const sh_tensor *param, const sh_tensor *grad, const sh_tensor *m, const sh_tensor *v,
                     const sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step, double grad_scale, sh_adamw_hyper *h);
int sh_sgd_prepare(const sh_tensor *param, const sh_tensor *grad, const sh_tensor *momentum_buf, double lr,
                   double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                   double grad_scale, sh_sgd_hyper *h);
