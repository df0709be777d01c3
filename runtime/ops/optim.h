/* optim.h: optimizer steps over flat (sharded) buffers, one fused pass per buffer.
 * param is the f32 master; grad may be f32 or bf16; m and v are f32 state of the same size.
 * AdamW uses decoupled weight decay (param *= 1 - lr*wd) and bias correction with `step`
 * (1-based). When shadow is not NULL, the updated param is also written to it in its dtype
 * (the bf16 compute copy). */
#pragma once
#include <stdint.h>
#include "core/tensor.h"
#include "core/kernel_args.h"

int sh_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                   sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                   double weight_decay, int64_t step, double grad_scale);
int sh_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                 double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                 double grad_scale);

/* The AdamW step of n parameters on one device, equal to n sh_adamw_step_ calls; on CUDA
 * one launch per group of up to 16 parameters. n = 0 does nothing. */
int sh_adamw_step_multi_(int n, const sh_adamw_param *params, double lr, double beta1, double beta2,
                         double eps, int64_t step, double grad_scale);

/* The local part of a gradient norm over n float tensors (any layout) on out's device, into
 * out (one f64 element): sum_i w_i sum(g_i^2) for norm_type 2, sum_i w_i sum |g_i| for 1,
 * max_i max |g_i| for INFINITY (weights unused); weights NULL means all 1. Accumulated in f64
 * on the device and not read back (on CUDA ceil(n / 16) + 1 launches), so the parts of several
 * ranks can be all-reduced where they are and the total read once. */
int sh_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *grads, const double *weights,
                      double norm_type);

/* Gradient clipping from a norm part (sh_grad_norm_part's, all-reduced where it is), on part's
 * device and not read back (one launch on CUDA): norm = sqrt(part) for norm_type 2, else part
 * (one f64; may be part itself), and coef = min(1, max_norm / (norm + 1e-6)) (one f32; NaN
 * when the norm is), torch.nn.utils.clip_grad_norm_'s coefficient. max_norm >= 0. */
int sh_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, double norm_type, double max_norm);
