/* meta_backend.c: the meta device's kernel table (core/meta.h): every kernel counts the bytes its tensors
 * span and, for the products, their floating-point operations, and computes nothing. The
 * fronts have checked the arguments and allocated the outputs (on the meta device, where the
 * allocator accounts them), so a dry run sees the real shapes, dtypes and memory. */
#include <stdarg.h>
#include <stdint.h>
#include "meta_backend_internal.h"
#include "core/tensor_internal.h"

static void add(int kind, int64_t n) { sh_meta_add(kind, n); }

static int64_t span(const sh_tensor *t) { return t ? sh_tensor_numel(t) * sh_dtype_size(t->dtype) : 0; }

/* One kernel call over n tensors (NULL where an optional one is absent); on the host side when
 * any of them is there. */
static int touch(int n, ...) {
  va_list ap;
  va_start(ap, n);
  int64_t bytes = 0;
  int host = 0;
  for (int i = 0; i < n; i++) {
    const sh_tensor *t = va_arg(ap, const sh_tensor *);
    bytes += span(t);
    host |= t && t->device == SH_DEVICE_META_HOST;
  }
  va_end(ap);
  add(host ? SH_META_HOST_BYTES : SH_META_BYTES, bytes);
  add(SH_META_KERNELS, 1);
  return SH_OK;
}

static int64_t last_dim(const sh_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* ---- copies, elementwise, reductions, creation ----------------------------------------- */

static int k_copy_(sh_tensor *dst, const sh_tensor *src) { return touch(2, dst, src); }
static int k_fill_(sh_tensor *t, double value) { return touch(1, t); }
static int k_binary(sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b) { return touch(3, out, a, b); }
static int k_binary_scalar(sh_tensor *out, int op, const sh_tensor *a, double s, int first) { return touch(2, out, a); }
static int k_unary(sh_tensor *out, int op, const sh_tensor *a) { return touch(2, out, a); }
static int k_binary_(sh_tensor *dst, int op, const sh_tensor *b) { return touch(2, dst, b); }
static int k_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) { return touch(2, dst, x); }
static int k_scale_(sh_tensor *dst, double alpha) { return touch(1, dst); }
static int k_reduce(sh_tensor *out, int op, const sh_tensor *a, int dim) { return touch(2, out, a); }
static int k_reduce_all(sh_tensor *out, int op, const sh_tensor *a) { return touch(2, out, a); }
static int k_argmax(sh_tensor *out, const sh_tensor *a, int dim) { return touch(2, out, a); }
static int k_sum_to_shape(sh_tensor *out, const sh_tensor *a) { return touch(2, out, a); }
static int k_sumsq(const sh_tensor *a, double *out) { *out = 0; return touch(1, a); }
static int k_arange(sh_tensor *out, double start, double step) { return touch(1, out); }
static int k_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) { return touch(1, t); }
static int k_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi) { return touch(1, t); }

/* ---- products: 2*M*N*K each ------------------------------------------------------------ */

static int k_matmul(sh_tensor *out, const sh_tensor *a, const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, 2 * sh_tensor_numel(out) * last_dim(a));
  return touch(3, out, a, b);
}

static int k_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int ta, int tb, double alpha, double beta) {
  add(SH_META_FLOPS_MATMUL, 2 * sh_tensor_numel(c) * (ta ? a->shape[0] : a->shape[1]));
  return touch(3, c, a, b);
}

/* y = x w^T: 2 * numel(y) * in; the backward does it once for dx and once for dw. */
static int64_t linear_flops(const sh_tensor *y, const sh_tensor *w) { return 2 * sh_tensor_numel(y) * w->shape[1]; }

static int k_linear_forward(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, linear_flops(y, w));
  return touch(4, y, x, w, b);
}
static int k_linear_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                             const sh_tensor *w, int set_dw) {
  add(SH_META_FLOPS_MATMUL, linear_flops(dy, w) * ((dx != NULL) + (dw != NULL)));
  return touch(6, dx, dw, db, dy, x, w);
}
static int k_linear_gelu_forward(sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                                 const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, linear_flops(y, w));
  return touch(5, y, pre, x, w, b);
}
static int k_linear_backward_dgelu(sh_tensor *dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                   const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set_dw) {
  add(SH_META_FLOPS_MATMUL, linear_flops(dy, w) * ((dpre != NULL) + (dw != NULL)));
  return touch(7, dpre, dw, db, dy, x, w, pre);
}

/* ---- normalisation, activations --------------------------------------------------------- */

static int k_layernorm_forward(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                               const sh_tensor *w, const sh_tensor *b, double eps) {
  return touch(6, y, mean, rstd, x, w, b);
}
static int k_layernorm_residual_forward(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                        const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                        const sh_tensor *b, double eps) {
  return touch(8, y, r, mean, rstd, x, res, w, b);
}
static int k_layernorm_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                                const sh_tensor *w, const sh_tensor *mean, const sh_tensor *rstd) {
  return touch(8, dx, dw, db, dy, x, w, mean, rstd);
}
static int k_rmsnorm_forward(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  return touch(4, y, rstd, x, w);
}
static int k_rmsnorm_backward(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                              const sh_tensor *w, const sh_tensor *rstd) {
  return touch(6, dx, dw, dy, x, w, rstd);
}
static int k_act_forward(sh_tensor *y, const sh_tensor *x) { return touch(2, y, x); }
static int k_act_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x) { return touch(3, dx, dy, x); }
static int k_swiglu_forward(sh_tensor *y, const sh_tensor *a, const sh_tensor *b) { return touch(3, y, a, b); }
static int k_swiglu_backward(sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b) {
  return touch(5, da, db, dy, a, b);
}
static int k_rope(sh_tensor *y, const sh_tensor *x, double theta, int inverse) { return touch(2, y, x); }
static int k_dropout_forward(sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  return touch(2, y, x);
}
static int k_dropout_backward(sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  return touch(2, dx, dy);
}

/* ---- attention: q, k, v [B, H, T, D]; QK^T and PV are 2*B*H*T*T*D each -------------------- */

static int64_t attention_flops(const sh_tensor *q) {
  return 4 * q->shape[0] * q->shape[1] * q->shape[2] * q->shape[2] * q->shape[3];
}
static int k_attention_forward(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                               const sh_tensor *v, double scale) {
  add(SH_META_FLOPS_ATTENTION, attention_flops(q));
  return touch(5, out, lse, q, k, v);
}
static int k_attention_backward(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                                const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                                const sh_tensor *out, const sh_tensor *lse, double scale) {
  add(SH_META_FLOPS_ATTENTION, 2 * attention_flops(q));   /* dV, dP, dQ, dK */
  return touch(9, dq, dk, dv, dout, q, k, v, out, lse);
}

/* ---- embedding, loss, optimizer ---------------------------------------------------------- */

static int k_embedding_forward(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w) { return touch(2, y, idx); }
static int k_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) { return touch(2, dy, idx); }
static int k_cross_entropy_forward(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,
                                   const sh_tensor *targets, int64_t ignore) {
  return touch(4, loss, lse, logits, targets);
}
static int k_cross_entropy_backward(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                    const sh_tensor *lse, double dloss, int64_t ignore) {
  return touch(4, dlogits, logits, targets, lse);
}

static int k_adamw_step_multi_(int n, const sh_adamw_param *params, double lr, double beta1, double beta2,
                               double eps, int64_t step, double grad_scale) {
  for (int i = 0; i < n; i++) touch(5, params[i].param, params[i].grad, params[i].m, params[i].v, params[i].shadow);
  return SH_OK;
}
static int k_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov, int first_step, double grad_scale) {
  return touch(3, param, grad, buf);
}
static int k_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *t, const double *weights, int kind) {
  for (int i = 0; i < n; i++) touch(1, t[i]);
  return touch(1, out);
}
static int k_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm) {
  return touch(3, coef, norm, part);
}

static const sh_backend meta_backend = {
  .name = "meta",
  .copy_ = k_copy_, .fill_ = k_fill_,
  .binary = k_binary, .binary_scalar = k_binary_scalar, .unary = k_unary, .binary_ = k_binary_,
  .axpy_ = k_axpy_, .scale_ = k_scale_,
  .reduce = k_reduce, .reduce_all = k_reduce_all, .argmax = k_argmax, .sum_to_shape = k_sum_to_shape,
  .sumsq = k_sumsq,
  .matmul = k_matmul, .gemm_ = k_gemm_,
  .arange = k_arange, .random_normal_ = k_random_normal_, .random_uniform_ = k_random_uniform_,
  .linear_forward = k_linear_forward, .linear_backward = k_linear_backward,
  .linear_gelu_forward = k_linear_gelu_forward, .linear_backward_dgelu = k_linear_backward_dgelu,
  .layernorm_forward = k_layernorm_forward, .layernorm_residual_forward = k_layernorm_residual_forward,
  .layernorm_backward = k_layernorm_backward,
  .rmsnorm_forward = k_rmsnorm_forward, .rmsnorm_backward = k_rmsnorm_backward,
  .gelu_forward = k_act_forward, .gelu_backward = k_act_backward,
  .silu_forward = k_act_forward, .silu_backward = k_act_backward,
  .swiglu_forward = k_swiglu_forward, .swiglu_backward = k_swiglu_backward,
  .softmax_forward = k_act_forward, .softmax_backward = k_act_backward,
  .dropout_forward = k_dropout_forward, .dropout_backward = k_dropout_backward, .rope = k_rope,
  .attention_forward = k_attention_forward, .attention_backward = k_attention_backward,
  .embedding_forward = k_embedding_forward, .embedding_backward = k_embedding_backward,
  .cross_entropy_forward = k_cross_entropy_forward, .cross_entropy_backward = k_cross_entropy_backward,
  .adamw_step_multi_ = k_adamw_step_multi_, .sgd_step_ = k_sgd_step_, .grad_norm_part = k_grad_norm_part,
  .grad_clip_coef = k_grad_clip_coef,
};

const sh_backend *sh_meta_backend(void) { return &meta_backend; }

/* ---- copies ------------------------------------------------------------------------------ */

int sh_meta_copy_across(sh_tensor *dst, const sh_tensor *src) {
  if (sh_is_meta(dst->device) && sh_is_meta(src->device)) { add(SH_META_COPY_BYTES, span(dst)); return SH_OK; }
  if (sh_is_meta(dst->device)) return touch(2, dst, src);
  return sh_kernel_fill_(dst, 0);
}

/* ---- CPU offload (meta_internal.h): one copy stream, marks that are always reached ---------- */

static int no_mark;     /* what a recorded mark points at: made, and never waited for */

static int off_stream_enter(int device, void **saved) { *saved = NULL; return SH_OK; }
static int off_stream_leave(int device, void *saved) { return SH_OK; }
static int off_copy_async(sh_tensor *dst, const sh_tensor *src) { return sh_meta_copy_across(dst, src); }
static int off_mark_record(int device, void **mark) { *mark = &no_mark; return SH_OK; }
static int off_mark_order(int device, void *mark) { return SH_OK; }
static int off_mark_wait(void *mark) { return SH_OK; }
static void off_mark_free(void *mark) {}

static const sh_mem_backend meta_offload = {
  .copy_stream_enter = off_stream_enter, .copy_stream_leave = off_stream_leave, .copy_async = off_copy_async,
  .mark_record = off_mark_record, .mark_order = off_mark_order, .mark_wait = off_mark_wait, .mark_free = off_mark_free,
};

const sh_mem_backend *sh_meta_offload_backend(void) { return &meta_offload; }
