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

int sh_kmeta_copy_(sh_tensor *dst, const sh_tensor *src) { return touch(2, dst, src); }
int sh_kmeta_fill_(sh_tensor *t, double value) { return touch(1, t); }
int sh_kmeta_binary(sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b) { return touch(3, out, a, b); }
int sh_kmeta_binary_scalar(sh_tensor *out, int op, const sh_tensor *a, double s, int first) { return touch(2, out, a); }
int sh_kmeta_unary(sh_tensor *out, int op, const sh_tensor *a) { return touch(2, out, a); }
int sh_kmeta_binary_(sh_tensor *dst, int op, const sh_tensor *b) { return touch(2, dst, b); }
int sh_kmeta_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) { return touch(2, dst, x); }
int sh_kmeta_scale_(sh_tensor *dst, double alpha) { return touch(1, dst); }
int sh_kmeta_reduce(sh_tensor *out, int op, const sh_tensor *a, int dim) { return touch(2, out, a); }
int sh_kmeta_reduce_all(sh_tensor *out, int op, const sh_tensor *a) { return touch(2, out, a); }
int sh_kmeta_argmax(sh_tensor *out, const sh_tensor *a, int dim) { return touch(2, out, a); }
int sh_kmeta_sum_to_shape(sh_tensor *out, const sh_tensor *a) { return touch(2, out, a); }
int sh_kmeta_sumsq(const sh_tensor *a, double *out) { *out = 0; return touch(1, a); }
int sh_kmeta_arange(sh_tensor *out, double start, double step) { return touch(1, out); }
int sh_kmeta_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) { return touch(1, t); }
int sh_kmeta_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double lo, double hi) { return touch(1, t); }

/* ---- products: 2*M*N*K each ------------------------------------------------------------ */

int sh_kmeta_matmul(sh_tensor *out, const sh_tensor *a, const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, 2 * sh_tensor_numel(out) * last_dim(a));
  return touch(3, out, a, b);
}

int sh_kmeta_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int ta, int tb, double alpha, double beta) {
  add(SH_META_FLOPS_MATMUL, 2 * sh_tensor_numel(c) * (ta ? a->shape[0] : a->shape[1]));
  return touch(3, c, a, b);
}

/* y = x w^T: 2 * numel(y) * in; the backward does it once for dx and once for dw. */
static int64_t linear_flops(const sh_tensor *y, const sh_tensor *w) { return 2 * sh_tensor_numel(y) * w->shape[1]; }

int sh_kmeta_linear_forward(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, linear_flops(y, w));
  return touch(4, y, x, w, b);
}
int sh_kmeta_linear_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                             const sh_tensor *w, int set_dw) {
  add(SH_META_FLOPS_MATMUL, linear_flops(dy, w) * ((dx != NULL) + (dw != NULL)));
  return touch(6, dx, dw, db, dy, x, w);
}
int sh_kmeta_linear_gelu_forward(sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                                 const sh_tensor *b) {
  add(SH_META_FLOPS_MATMUL, linear_flops(y, w));
  return touch(5, y, pre, x, w, b);
}
int sh_kmeta_linear_backward_dgelu(sh_tensor *dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                   const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set_dw) {
  add(SH_META_FLOPS_MATMUL, linear_flops(dy, w) * ((dpre != NULL) + (dw != NULL)));
  return touch(7, dpre, dw, db, dy, x, w, pre);
}

/* ---- normalisation, activations --------------------------------------------------------- */

int sh_kmeta_layernorm_forward(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                               const sh_tensor *w, const sh_tensor *b, double eps) {
  return touch(6, y, mean, rstd, x, w, b);
}
int sh_kmeta_layernorm_residual_forward(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                        const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                        const sh_tensor *b, double eps) {
  return touch(8, y, r, mean, rstd, x, res, w, b);
}
int sh_kmeta_layernorm_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                                const sh_tensor *w, const sh_tensor *mean, const sh_tensor *rstd) {
  return touch(8, dx, dw, db, dy, x, w, mean, rstd);
}
int sh_kmeta_rmsnorm_forward(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  return touch(4, y, rstd, x, w);
}
int sh_kmeta_rmsnorm_backward(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                              const sh_tensor *w, const sh_tensor *rstd) {
  return touch(6, dx, dw, dy, x, w, rstd);
}
/* gelu, silu and softmax alike: forward y, x; backward dx, dy and x (softmax: y) */
static int act_forward(sh_tensor *y, const sh_tensor *x) { return touch(2, y, x); }
static int act_backward(sh_tensor *dx, const sh_tensor *dy, const sh_tensor *x) { return touch(3, dx, dy, x); }
#define sh_kmeta_gelu_forward act_forward
#define sh_kmeta_gelu_backward act_backward
#define sh_kmeta_silu_forward act_forward
#define sh_kmeta_silu_backward act_backward
#define sh_kmeta_softmax_forward act_forward
#define sh_kmeta_softmax_backward act_backward
int sh_kmeta_swiglu_forward(sh_tensor *y, const sh_tensor *a, const sh_tensor *b) { return touch(3, y, a, b); }
int sh_kmeta_swiglu_backward(sh_tensor *da, sh_tensor *db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b) {
  return touch(5, da, db, dy, a, b);
}
int sh_kmeta_rope(sh_tensor *y, const sh_tensor *x, double theta, int inverse) { return touch(2, y, x); }
int sh_kmeta_dropout_forward(sh_tensor *y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  return touch(2, y, x);
}
int sh_kmeta_dropout_backward(sh_tensor *dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  return touch(2, dx, dy);
}

/* ---- attention: q, k, v [B, H, T, D]; QK^T and PV are 2*B*H*T*T*D each -------------------- */

static int64_t attention_flops(const sh_tensor *q) {
  return 4 * q->shape[0] * q->shape[1] * q->shape[2] * q->shape[2] * q->shape[3];
}
int sh_kmeta_attention_forward(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                               const sh_tensor *v, double scale) {
  add(SH_META_FLOPS_ATTENTION, attention_flops(q));
  return touch(5, out, lse, q, k, v);
}
int sh_kmeta_attention_backward(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                                const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                                const sh_tensor *out, const sh_tensor *lse, double scale) {
  add(SH_META_FLOPS_ATTENTION, 2 * attention_flops(q));   /* dV, dP, dQ, dK */
  return touch(9, dq, dk, dv, dout, q, k, v, out, lse);
}

/* ---- embedding, loss, optimizer ---------------------------------------------------------- */

int sh_kmeta_embedding_forward(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w) { return touch(2, y, idx); }
int sh_kmeta_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) { return touch(2, dy, idx); }
int sh_kmeta_cross_entropy_forward(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits,
                                   const sh_tensor *targets, int64_t ignore) {
  return touch(4, loss, lse, logits, targets);
}
int sh_kmeta_cross_entropy_backward(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                    const sh_tensor *lse, double dloss, int64_t ignore) {
  return touch(4, dlogits, logits, targets, lse);
}

int sh_kmeta_adamw_step_multi_(int n, const sh_adamw_param *params, double lr, double beta1, double beta2,
                               double eps, int64_t step, double grad_scale) {
  for (int i = 0; i < n; i++) touch(5, params[i].param, params[i].grad, params[i].m, params[i].v, params[i].shadow);
  return SH_OK;
}
int sh_kmeta_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov, int first_step, double grad_scale) {
  return touch(3, param, grad, buf);
}
int sh_kmeta_grad_norm_part(sh_tensor *out, int n, const sh_tensor *const *t, const double *weights, int kind) {
  for (int i = 0; i < n; i++) touch(1, t[i]);
  return touch(1, out);
}
int sh_kmeta_grad_clip_coef(sh_tensor *coef, sh_tensor *norm, const sh_tensor *part, int kind, double max_norm) {
  return touch(3, coef, norm, part);
}

/* Slot X holds sh_kmeta_X, made from SH_KERNELS as the CPU and CUDA tables are. */
#define SH_KERNEL_OF(slot) sh_kmeta_##slot
SH_KERNEL_TABLE(meta_backend, "meta", NULL);
#undef SH_KERNEL_OF

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
