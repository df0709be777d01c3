/* backend_internal.h: the per-device kernel table behind every public op (not in the FFI),
 * written once as the list SH_KERNELS, from which the table, its slot names and the check
 * that a backend fills every slot are all made.
 *
 * A public op (ops.h, nn.h, optim.h, copy_/fill_ of tensor.h) does everything that does not
 * depend on the device once, in its front: it checks its arguments (live, dtypes, shapes, all
 * on one device), plans the output shapes and dtypes, and allocates the outputs on the
 * inputs' device. Then it calls the kernel of that device through sh_backend_for(). A kernel
 * therefore trusts its arguments: it never validates, never allocates an output, and writes
 * every element of each output it is given. It may stage inputs (the CPU converts to f32, CUDA
 * makes strided inputs contiguous) and use scratch tensors of its own.
 *
 * Every table is made from the list by one naming rule: the kernel of slot X is sh_kcpu_X
 * (runtime/cpu/<family>.c), sh_kcuda_X (kernels/<family>.cu, extern "C") or sh_kmeta_X
 * (ops/meta_backend.c); one header per backend declares them all from the list
 * (cpu/backend_cpu_internal.h, kernels/common.cuh, ops/meta_backend_internal.h), so a kernel
 * whose parameters differ from its slot's does not compile, and one designated initializer
 * per backend fills the table (cpu/backend.c, kernels/device.cu, ops/meta_backend.c). A
 * family has one name on every side: runtime/ops/<family>.c (the front), runtime/cpu/<family>.c,
 * kernels/<family>.cu. Each table is handed down here by registration (sh_backend_register),
 * so no layer calls up to find one. A build without CUDA has no CUDA table, so a CUDA tensor
 * cannot be made and no op reaches one. A backend that lacks a kernel says so twice: its
 * table's file defines the name to NULL (`#define sh_kcuda_X NULL`, with the reason) and its
 * `absent` list names the slot; the front then fails naming op and device, and
 * sh_backend_unfilled (checked by the op-table tests for every backend) finds a slot left NULL
 * without being named.
 *
 * Adding a kernel slot: its entry below, its front in runtime/ops/<family>.c (and public
 * header), sh_kcpu_X, sh_kcuda_X (or the NULL define and absent entry), sh_kmeta_X, and a row
 * in tests/ops/op_table.h (the op-table tests fail on a slot no row reaches).
 *
 * Conventions: outputs first, as non-const tensors, already of the planned shape and dtype
 * (NULL where the op's front allows the caller to skip one, e.g. dx); "_" kernels update
 * their first argument; accumulating gradients (dw, db) add into what the tensor holds;
 * bf16/f16 math runs in f32, f64 in f64, as the CPU reference defines. */
#pragma once
#include <stdint.h>
#include "tensor.h"
#include "kernel_args.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SH_KERNELS(X)                                                                           \
  /* tensor.h: dst and src on this device, any dtypes; src broadcasts to dst (checked). */      \
  X(copy_, (sh_tensor *dst, const sh_tensor *src))                                              \
  X(fill_, (sh_tensor *t, double value))                                                        \
  /* ops.h, elementwise: out has the broadcast shape and the result dtype                       \
    (sh_binary_result). */                                                                      \
  X(binary, (sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b))                   \
  X(binary_scalar, (sh_tensor *out, int op, const sh_tensor *a, double s, int scalar_first))    \
  X(unary, (sh_tensor *out, int op, const sh_tensor *a))                                        \
  X(binary_, (sh_tensor *dst, int op, const sh_tensor *b))                                      \
  X(axpy_, (sh_tensor *dst, double alpha, const sh_tensor *x))                                  \
  X(scale_, (sh_tensor *dst, double alpha))                                                     \
  /* ops.h, reductions: dim is checked and non-negative; out has the reduced shape. */          \
  X(reduce, (sh_tensor *out, int op, const sh_tensor *a, int dim))                              \
  X(reduce_all, (sh_tensor *out, int op, const sh_tensor *a))   /* out is 0-dim */              \
  X(argmax, (sh_tensor *out, const sh_tensor *a, int dim))      /* out is i64 */                \
  /* a and out come with the same number of dims (the front groups runs of summed and kept      \
     dims); every dim where out is 1 and a is not is summed. */                                 \
  X(sum_to_shape, (sh_tensor *out, const sh_tensor *a))                                         \
  X(sumsq, (const sh_tensor *a, double *out))                                                   \
  /* ops.h, products */                                                                         \
  X(matmul, (sh_tensor *out, const sh_tensor *a, const sh_tensor *b))                           \
  X(gemm_, (sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,     \
            double alpha, double beta))                                                         \
  /* ops.h, creation: out is 1-D with the planned length */                                     \
  X(arange, (sh_tensor *out, double start, double step))                                        \
  X(random_normal_, (sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std))    \
  X(random_uniform_, (sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high))   \
  /* nn.h, linear (and the cuBLASLt-epilogue fusions, which equal their compositions) */        \
  X(linear_forward, (sh_tensor *y, const sh_tensor *x, const sh_tensor *w,                      \
                     const sh_tensor *b))                                                       \
  /* set_dw: dw is written, not summed into (its contents are never read) */                    \
  X(linear_backward, (sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,         \
                      const sh_tensor *x, const sh_tensor *w, int set_dw))                      \
  X(linear_gelu_forward, (sh_tensor *y, sh_tensor *pre, const sh_tensor *x,                     \
                          const sh_tensor *w, const sh_tensor *b))                              \
  X(linear_backward_dgelu, (sh_tensor *dpre, sh_tensor *dw, sh_tensor *db,                      \
                            const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w,        \
                            const sh_tensor *pre, int set_dw))                                  \
  /* nn.h, normalisation */                                                                     \
  X(layernorm_forward, (sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,     \
                        const sh_tensor *w, const sh_tensor *b, double eps))                    \
  X(layernorm_residual_forward, (sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,  \
                                 const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,  \
                                 const sh_tensor *b, double eps))                               \
  X(layernorm_backward, (sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,      \
                         const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,         \
                         const sh_tensor *rstd))                                                \
  X(rmsnorm_forward, (sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w,    \
                      double eps))                                                              \
  X(rmsnorm_backward, (sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,   \
                       const sh_tensor *w, const sh_tensor *rstd))                              \
  /* nn.h, activations */                                                                       \
  X(gelu_forward, (sh_tensor *y, const sh_tensor *x))                                           \
  X(gelu_backward, (sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x))                    \
  X(silu_forward, (sh_tensor *y, const sh_tensor *x))                                           \
  X(silu_backward, (sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x))                    \
  X(swiglu_forward, (sh_tensor *y, const sh_tensor *a, const sh_tensor *b))                     \
  X(swiglu_backward, (sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a,    \
                      const sh_tensor *b))                                                      \
  X(softmax_forward, (sh_tensor *y, const sh_tensor *x))                                        \
  X(softmax_backward, (sh_tensor *dx, const sh_tensor *dy, const sh_tensor *y))                 \
  X(dropout_forward, (sh_tensor *y, const sh_tensor *x, double p, uint64_t seed,                \
                      uint64_t offset))                                                         \
  X(dropout_backward, (sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed,             \
                       uint64_t offset))                                                        \
  /* nn.h, attention, embedding, loss; attention's scale is resolved by the front (> 0) */      \
  X(attention_forward, (sh_tensor *out, sh_tensor *lse, const sh_tensor *q,                     \
                        const sh_tensor *k, const sh_tensor *v, double scale))                  \
  X(attention_backward, (sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,    \
                         const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,            \
                         const sh_tensor *out, const sh_tensor *lse, double scale))             \
  /* nn.h, rotary embeddings: y contiguous [B, H, T, D] of x's dtype, D even, theta > 0;        \
    inverse rotates back (the transpose) */                                                     \
  X(rope, (sh_tensor *y, const sh_tensor *x, double theta, int inverse))                        \
  X(embedding_forward, (sh_tensor *y, const sh_tensor *idx, const sh_tensor *w))                \
  X(embedding_backward, (sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx))             \
  X(cross_entropy_forward, (sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,           \
                            const sh_tensor *targets, int64_t ignore_index))                    \
  X(cross_entropy_backward, (sh_tensor *dlogits, const sh_tensor *logits,                       \
                             const sh_tensor *targets, const sh_tensor *lse, double dloss,      \
                             int64_t ignore_index))                                             \
  /* optim.h: n >= 1 parameters' flat buffers, all checked */                                   \
  X(adamw_step_multi_, (int n, const sh_adamw_param *params, double lr, double beta1,           \
                        double beta2, double eps, int64_t step, double grad_scale))             \
  /* optim.h: one parameter's flat buffers, all checked */                                      \
  X(sgd_step_, (sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr,    \
                double momentum, double dampening, double weight_decay, int nesterov,           \
                int first_step, double grad_scale))                                             \
  /* optim.h: n >= 0 float tensors; kind SH_NORM_L2, _L1 or _MAX (core/rules_internal.h); weights    \
    NULL means all 1; out holds one f64 */                                                      \
  X(grad_norm_part, (sh_tensor *out, int n, const sh_tensor *const *t, const double *weights,   \
                     int kind))                                                                 \
  X(grad_clip_coef, (sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind,         \
                     double max_norm))                                                          \

typedef struct sh_backend {
  const char *name;     /* "cpu", "cuda", "meta" */
  const char *absent;   /* NULL, or the slots left empty on purpose, separated by spaces */
#define SH_KERNEL_SLOT(name, params) int(*name) params;
  SH_KERNELS(SH_KERNEL_SLOT)
#undef SH_KERNEL_SLOT
} sh_backend;

/* The slots by number, for the coverage checks. */
enum {
#define SH_KERNEL_SLOT(name, params) SH_SLOT_##name,
  SH_KERNELS(SH_KERNEL_SLOT)
#undef SH_KERNEL_SLOT
  SH_SLOT_COUNT
};
/* A backend's kernels and table by the naming rule: with SH_KERNEL_OF(slot) defined to the
 * kernel's name (sh_kcpu_##slot), SH_KERNEL_PROTOTYPES declares every kernel from its slot's
 * entry and SH_KERNEL_TABLE(var, "cpu", absent) defines the table `var` (a static const). */
#define SH_KERNEL_PROTOTYPE_(slot, params) int SH_KERNEL_OF(slot) params;
#define SH_KERNEL_PROTOTYPES SH_KERNELS(SH_KERNEL_PROTOTYPE_)
#define SH_KERNEL_ENTRY_(slot, params) .slot = SH_KERNEL_OF(slot),
#define SH_KERNEL_TABLE(var, device_name, absent_slots)                                         \
  static const sh_backend var = {.name = device_name, .absent = absent_slots, SH_KERNELS(SH_KERNEL_ENTRY_)}

const char *sh_backend_slot_name(int slot);
int sh_backend_has(const sh_backend *b, int slot);
/* The first slot b leaves NULL without naming it in b->absent, or NULL when there is none. */
const char *sh_backend_unfilled(const sh_backend *b);

/* Fails naming op, the backend and the kernel it lacks (the fronts, through SH_KERNEL). */
int sh_backend_missing(const sh_backend *b, const char *op, const char *kernel);

/* The tables by device kind, handed down by the layers that assemble them: ops/dispatch.c
 * registers the CPU table (cpu/backend.c) and the meta device's (ops/meta_backend.c) on first
 * use, kernels/device.cu the CUDA one at sh_cuda_init. sh_backend_of gives the table of a
 * device id (-1: cpu, N: cuda:N, meta), NULL where none is registered. */
enum { SH_BACKEND_CPU = 0, SH_BACKEND_CUDA = 1, SH_BACKEND_META = 2, SH_BACKEND_KINDS = 3 };
void sh_backend_register(int kind, const sh_backend *b);
const sh_backend *sh_backend_of(int device);
/* The kind (SH_BACKEND_*) of a device id. */
int sh_backend_kind(int device);

/* What a kernel may ask of its own device's kernels, with no front's checks (kernels trust
 * their arguments): a copy into dst of a same-device src that broadcasts to it (dst's version
 * counts it, as sh_tensor_copy_'s would), a fill, and a contiguous copy of t in dtype. */
int sh_kernel_copy_(sh_tensor *dst, const sh_tensor *src);
int sh_kernel_fill_(sh_tensor *t, double value);
int sh_kernel_to(sh_tensor **out, const sh_tensor *t, int dtype);
/* t itself (an alias) when it is contiguous in dtype, else sh_kernel_to. */
int sh_kernel_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype);

#ifdef __cplusplus
}
#endif
