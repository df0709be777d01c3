/* cuda_internal.h: the CUDA side of every op (not in the FFI).
 * Each public op in ops.h, nn.h and optim.h (and copy_/fill_ of tensor.h) has a twin here
 * with the same signature, implemented in the kernels/ files and called by the op's front after
 * its validation when the tensors live on cuda:N. Builds without nvcc link
 * runtime/cuda_none.c instead, whose twins fail with SH_ERR_DEVICE. Outputs are allocated
 * with sh_tensor_empty on the inputs' device; math follows the CPU reference (f32 for
 * bf16/f16, outputs in the input's dtype). */
#pragma once
#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "tensor.h"
#include "cuda.h"

/* The raw cudaStream_t of a runtime stream (void * so C files need no CUDA headers); the
 * NCCL backend issues its collectives on these. */
void *sh_cuda_stream_raw(const sh_cuda_stream *s);
int sh_cuda_stream_device(const sh_cuda_stream *s);
/* The raw cudaEvent_t of an event. */
void *sh_cuda_event_raw(const sh_cuda_event *e);

/* tensor.h */
int sh_cuda_copy_(sh_tensor *dst, const sh_tensor *src);   /* same device; any dtypes; src broadcasts */
int sh_cuda_fill_(sh_tensor *t, double value);

/* ops.h */
int sh_cuda_binary(sh_tensor **out, int op, const sh_tensor *a, const sh_tensor *b);
int sh_cuda_binary_scalar(sh_tensor **out, int op, const sh_tensor *a, double s, int scalar_first);
int sh_cuda_unary(sh_tensor **out, int op, const sh_tensor *a);
int sh_cuda_binary_(sh_tensor *dst, int op, const sh_tensor *b);
int sh_cuda_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x);
int sh_cuda_scale_(sh_tensor *dst, double alpha);
int sh_cuda_reduce(sh_tensor **out, int op, const sh_tensor *a, int dim, int keepdim);
int sh_cuda_reduce_all(sh_tensor **out, int op, const sh_tensor *a);
int sh_cuda_argmax(sh_tensor **out, const sh_tensor *a, int dim, int keepdim);
int sh_cuda_sum_to_shape(sh_tensor **out, const sh_tensor *a, int ndim, const int64_t *shape);
double sh_cuda_sumsq(const sh_tensor *a, int *status);
int sh_cuda_matmul(sh_tensor **out, const sh_tensor *a, const sh_tensor *b);
int sh_cuda_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
                  double alpha, double beta);
int sh_cuda_arange(sh_tensor **out, double start, double end, double step, int dtype, int device);
int sh_cuda_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
int sh_cuda_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high);

/* nn.h */
int sh_cuda_linear_forward(sh_tensor **y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b);
int sh_cuda_linear_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                            const sh_tensor *x, const sh_tensor *w);
int sh_cuda_layernorm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x,
                              const sh_tensor *w, const sh_tensor *b, double eps);
int sh_cuda_layernorm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                               const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                               const sh_tensor *rstd);
int sh_cuda_rmsnorm_forward(sh_tensor **y, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, double eps);
int sh_cuda_rmsnorm_backward(sh_tensor **dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                             const sh_tensor *w, const sh_tensor *rstd);
int sh_cuda_gelu_forward(sh_tensor **y, const sh_tensor *x);
int sh_cuda_gelu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x);
int sh_cuda_silu_forward(sh_tensor **y, const sh_tensor *x);
int sh_cuda_silu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x);
int sh_cuda_swiglu_forward(sh_tensor **y, const sh_tensor *a, const sh_tensor *b);
int sh_cuda_swiglu_backward(sh_tensor **da, sh_tensor **db, const sh_tensor *dy, const sh_tensor *a,
                            const sh_tensor *b);
int sh_cuda_softmax_forward(sh_tensor **y, const sh_tensor *x);
int sh_cuda_softmax_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *y);
int sh_cuda_attention_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale);
int sh_cuda_attention_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale);
int sh_cuda_embedding_forward(sh_tensor **y, const sh_tensor *idx, const sh_tensor *w);
int sh_cuda_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx);
int sh_cuda_cross_entropy_forward(sh_tensor **loss, sh_tensor **lse, const sh_tensor *logits,
                                  const sh_tensor *targets, int64_t ignore_index);
int sh_cuda_cross_entropy_backward(sh_tensor **dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                   const sh_tensor *lse, double dloss, int64_t ignore_index);
int sh_cuda_dropout_forward(sh_tensor **y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset);
int sh_cuda_dropout_backward(sh_tensor **dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset);

/* Fused forms with no CPU front yet (cuBLASLt epilogues and the residual add); each equals
 * a composition of the ops above, which is what tests/gpu checks them against.
 * - linear_gelu_forward: pre = x @ w^T + b and y = gelu(pre) from one GEMM (GELU_AUX_BIAS).
 * - linear_backward_dgelu: the backward of a linear layer whose input x was gelu(pre) (an
 *   MLP's projection): dw += dy^T x, db += colsum(dy) (BGRADB), and instead of dx it returns
 *   dpre = (dy @ w) * gelu'(pre) from one GEMM (DGELU).
 * - layernorm_residual_forward: r = x + res, y = layernorm(r); r feeds the next residual. */
int sh_cuda_linear_gelu_forward(sh_tensor **y, sh_tensor **pre, const sh_tensor *x, const sh_tensor *w,
                                const sh_tensor *b);
int sh_cuda_linear_backward_dgelu(sh_tensor **dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                  const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre);
int sh_cuda_layernorm_residual_forward(sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd,
                                       const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                       const sh_tensor *b, double eps);

/* optim.h */
int sh_cuda_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v,
                        sh_tensor *shadow, double lr, double beta1, double beta2, double eps,
                        double weight_decay, int64_t step, double grad_scale);
int sh_cuda_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                      double momentum, double dampening, double weight_decay, int nesterov, int first_step,
                      double grad_scale);

#ifdef __cplusplus
}
#endif
