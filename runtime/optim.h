/* optim.h: optimizer steps over flat (sharded) buffers, one fused pass per buffer.
 * param is the f32 master; grad may be f32 or bf16; m and v are f32 state of the same size.
 * AdamW uses decoupled weight decay (param *= 1 - lr*wd) and bias correction with `step`
 * (1-based). When shadow is not NULL, the updated param is also written to it in its dtype
 * (the bf16 compute copy). */
#pragma once
#include <stdint.h>

int sh_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                   sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int64_t step, double grad_scale);
int sh_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                 double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                 double grad_scale);
