/* backend_internal.h: the per-device kernel table behind every public op (not in the FFI).
 *
 * A public op (ops.h, nn.h, optim.h, copy_/fill_ of tensor.h) does everything that does not
 * depend on the device once, in its front: it checks its arguments (live, dtypes, shapes, all
 * on one device), plans the output shapes and dtypes, and allocates the outputs on the
 * inputs' device. Then it calls the kernel of that device through sh_backend_for(). A kernel
 * therefore trusts its arguments: it never validates, never allocates an output, and writes
 * every element of each output it is given. It may stage inputs (the CPU converts to f32, CUDA
 * makes strided inputs contiguous) and use scratch tensors of its own.
 *
 * Each op family registers its kernels in its own file (sh_<family>_register_cpu in
 * runtime/, sh_<family>_register_cuda in kernels/), so a signature is written once, here.
 * The CPU table is filled on first use; the CUDA table by kernels/device.cu's sh_cuda_init. A
 * build without CUDA has no CUDA table, so a CUDA tensor cannot be made and no op reaches one.
 * An entry left NULL means the backend lacks that kernel: the front fails naming op and device.
 *
 * Conventions: outputs first, as non-const tensors, already of the planned shape and dtype
 * (NULL where the op's front allows the caller to skip one, e.g. dx); "_" kernels update
 * their first argument; accumulating gradients (dw, db) add into what the tensor holds;
 * bf16/f16 math runs in f32, f64 in f64, as the CPU reference defines. */
#pragma once
#include <stdint.h>
#include "tensor.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sh_backend {
  const char *name;   /* "cpu", "cuda" */

  /* tensor.h: dst and src on this device, any dtypes; src broadcasts to dst (checked). */
  int (*copy_)(sh_tensor *dst, const sh_tensor *src);
  int (*fill_)(sh_tensor *t, double value);

  /* ops.h, elementwise: out has the broadcast shape and the result dtype (sh_binary_result). */
  int (*binary)(sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b);
  int (*binary_scalar)(sh_tensor *out, int op, const sh_tensor *a, double s, int scalar_first);
  int (*unary)(sh_tensor *out, int op, const sh_tensor *a);
  int (*binary_)(sh_tensor *dst, int op, const sh_tensor *b);
  int (*axpy_)(sh_tensor *dst, double alpha, const sh_tensor *x);
  int (*scale_)(sh_tensor *dst, double alpha);

  /* ops.h, reductions: dim is checked and non-negative; out has the reduced shape. */
  int (*reduce)(sh_tensor *out, int op, const sh_tensor *a, int dim);
  int (*reduce_all)(sh_tensor *out, int op, const sh_tensor *a);       /* out is 0-dim */
  int (*argmax)(sh_tensor *out, const sh_tensor *a, int dim);          /* out is i64 */
  /* a and out come with the same number of dims (the front groups runs of summed and kept
   * dims); every dim where out is 1 and a is not is summed. */
  int (*sum_to_shape)(sh_tensor *out, const sh_tensor *a);
  int (*sumsq)(const sh_tensor *a, double *out);

  /* ops.h, products */
  int (*matmul)(sh_tensor *out, const sh_tensor *a, const sh_tensor *b);
  int (*gemm_)(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
               double alpha, double beta);

  /* ops.h, creation: out is 1-D with the planned length */
  int (*arange)(sh_tensor *out, double start, double step);
  int (*random_normal_)(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std);
  int (*random_uniform_)(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high);

  /* nn.h, linear (and the cuBLASLt-epilogue fusions, which equal their compositions) */
  int (*linear_forward)(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b);
  /* set_dw: dw is written, not summed into (its contents are never read) */
  int (*linear_backward)(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                         const sh_tensor *x, const sh_tensor *w, int set_dw);
  int (*linear_gelu_forward)(sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                             const sh_tensor *b);
  int (*linear_backward_dgelu)(sh_tensor *dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                               const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set_dw);

  /* nn.h, normalisation */
  int (*layernorm_forward)(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                           const sh_tensor *w, const sh_tensor *b, double eps);
  int (*layernorm_residual_forward)(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                    const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                    const sh_tensor *b, double eps);
  int (*layernorm_backward)(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                            const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                            const sh_tensor *rstd);
  int (*rmsnorm_forward)(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps);
  int (*rmsnorm_backward)(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                          const sh_tensor *w, const sh_tensor *rstd);

  /* nn.h, activations */
  int (*gelu_forward)(sh_tensor *y, const sh_tensor *x);
  int (*gelu_backward)(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x);
  int (*silu_forward)(sh_tensor *y, const sh_tensor *x);
  int (*silu_backward)(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x);
  int (*swiglu_forward)(sh_tensor *y, const sh_tensor *a, const sh_tensor *b);
  int (*swiglu_backward)(sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a,
                         const sh_tensor *b);
  int (*softmax_forward)(sh_tensor *y, const sh_tensor *x);
  int (*softmax_backward)(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *y);
  int (*dropout_forward)(sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset);
  int (*dropout_backward)(sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset);

  /* nn.h, attention, embedding, loss; attention's scale is resolved by the front (> 0) */
  int (*attention_forward)(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                           const sh_tensor *v, double scale);
  int (*attention_backward)(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                            const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                            const sh_tensor *out, const sh_tensor *lse, double scale);
  /* nn.h, rotary embeddings: y contiguous [B, H, T, D] of x's dtype, D even, theta > 0;
   * inverse rotates back (the transpose) */
  int (*rope)(sh_tensor *y, const sh_tensor *x, double theta, int inverse);
  int (*embedding_forward)(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w);
  int (*embedding_backward)(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx);
  int (*cross_entropy_forward)(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,
                               const sh_tensor *targets, int64_t ignore_index);
  int (*cross_entropy_backward)(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                const sh_tensor *lse, double dloss, int64_t ignore_index);

  /* optim.h: n >= 1 parameters' flat buffers, all checked */
  int (*adamw_step_multi_)(int n, const sh_adamw_param *params, double lr, double beta1, double beta2,
                           double eps, int64_t step, double grad_scale);
  /* optim.h: one parameter's flat buffers, all checked */
  int (*sgd_step_)(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,
                   double momentum, double dampening, double weight_decay, int nesterov,
                   int first_step, double grad_scale);
  /* optim.h: n >= 0 float tensors; kind SH_NORM_L2, _L1 or _MAX (optim_internal.h); weights
   * NULL means all 1; out holds one f64 */
  int (*grad_norm_part)(sh_tensor *out, int n, const sh_tensor *const *t, const double *weights, int kind);
  int (*grad_clip_coef)(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm);
} sh_backend;

/* The table of `device` (-1: cpu, N: cuda:N); fails naming op when that device has none. */
int sh_backend_for(const sh_backend **out, int device, const char *op);
/* The kernel entry `field` of the table for `device`, called with the remaining arguments;
 * fails naming op when the backend lacks it. Used by every front after its checks. */
#define SH_KERNEL(op, device, field, ...)                                                       \
  ({                                                                                           \
    const sh_backend *sh_be_;                                                                  \
    int sh_rc_ = sh_backend_for(&sh_be_, (device), (op));                                      \
    if (!sh_rc_) sh_rc_ = sh_be_->field ? sh_be_->field(__VA_ARGS__)                           \
                                        : sh_backend_missing(sh_be_, (op), #field);            \
    sh_rc_;                                                                                    \
  })
int sh_backend_missing(const sh_backend *b, const char *op, const char *kernel);

/* kernels/device.cu hands its table over at sh_cuda_init. */
void sh_backend_register_cuda(const sh_backend *b);

/* Each family's registration: the CPU side in runtime/, the CUDA side in kernels/. */
void sh_copy_register_cpu(sh_backend *b);          /* tensor_copy.c: copy_, fill_ */
void sh_elementwise_register_cpu(sh_backend *b);   /* ops_elementwise.c */
void sh_reduce_register_cpu(sh_backend *b);        /* ops_reduce.c */
void sh_matmul_register_cpu(sh_backend *b);        /* ops_matmul.c: matmul, gemm_ */
void sh_create_register_cpu(sh_backend *b);        /* ops_create.c: arange, random */
void sh_linear_register_cpu(sh_backend *b);        /* nn_linear.c */
void sh_norm_register_cpu(sh_backend *b);          /* nn_norm.c */
void sh_activation_register_cpu(sh_backend *b);    /* nn_activation.c: activations, softmax, dropout */
void sh_attention_register_cpu(sh_backend *b);     /* nn_attention.c */
void sh_embedding_register_cpu(sh_backend *b);     /* nn_embedding.c */
void sh_loss_register_cpu(sh_backend *b);          /* nn_loss.c */
void sh_optim_register_cpu(sh_backend *b);         /* optim.c */

void sh_elementwise_register_cuda(sh_backend *b);  /* elementwise.cu: copy_, fill_, elementwise */
void sh_reduce_register_cuda(sh_backend *b);       /* reduce.cu */
void sh_matmul_register_cuda(sh_backend *b);       /* matmul.cu: matmul, gemm_, linear and its fusions */
void sh_random_register_cuda(sh_backend *b);       /* random.cu: arange, random, dropout */
void sh_norm_register_cuda(sh_backend *b);         /* layernorm.cu */
void sh_activation_register_cuda(sh_backend *b);   /* activation.cu */
void sh_attention_register_cuda(sh_backend *b);    /* attention.cu */
void sh_embedding_register_cuda(sh_backend *b);    /* embedding.cu */
void sh_loss_register_cuda(sh_backend *b);         /* classifier.cu */
void sh_optim_register_cuda(sh_backend *b);        /* optim.cu */
#ifdef __cplusplus
}
#endif
