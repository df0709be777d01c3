/* cuda_none.c: linked instead of kernels/ when nvcc is absent (make NVCC=). Every CUDA entry
 * point of cuda.h and cuda_internal.h exists so the runtime links unchanged; each fails with
 * SH_ERR_DEVICE saying so, clears its out-parameters, and sh_cuda_device_count() is 0. */
#include <math.h>
#include "status_internal.h"
#include "cuda_internal.h"

static int no_cuda(const char *op) {
  return sh_fail(SH_ERR_DEVICE, "%s: shard was built without CUDA (rebuild with nvcc available)", op);
}

int sh_cuda_device_count(void) { return 0; }

int sh_cuda_init(int device) {
  return no_cuda("init");
}

int sh_cuda_device_info_get(int device, sh_cuda_device_info *out) {
  return no_cuda("device_info_get");
}

int sh_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes) {
  return no_cuda("mem_info");
}

int sh_cuda_synchronize(int device) {
  return no_cuda("synchronize");
}

int sh_cuda_stream_get(sh_cuda_stream **out, int device, int kind) {
  if (out) *out = NULL;
  return no_cuda("stream_get");
}

int sh_cuda_set_stream(sh_cuda_stream *s) {
  return no_cuda("set_stream");
}

int sh_cuda_current_stream(sh_cuda_stream **out, int device) {
  if (out) *out = NULL;
  return no_cuda("current_stream");
}

int sh_cuda_stream_synchronize(sh_cuda_stream *s) {
  return no_cuda("stream_synchronize");
}

int sh_cuda_stream_wait_event(sh_cuda_stream *s, sh_cuda_event *e) {
  return no_cuda("stream_wait_event");
}

int sh_cuda_event_create(sh_cuda_event **out, int device, int timing) {
  if (out) *out = NULL;
  return no_cuda("event_create");
}

void sh_cuda_event_destroy(sh_cuda_event *e) {
}

int sh_cuda_event_record(sh_cuda_event *e, sh_cuda_stream *s) {
  return no_cuda("event_record");
}

int sh_cuda_event_query(sh_cuda_event *e, int *done) {
  return no_cuda("event_query");
}

int sh_cuda_event_synchronize(sh_cuda_event *e) {
  return no_cuda("event_synchronize");
}

int sh_cuda_event_elapsed(sh_cuda_event *start, sh_cuda_event *end, double *ms) {
  return no_cuda("event_elapsed");
}

int sh_cuda_host_alloc(void **out, size_t nbytes) {
  if (out) *out = NULL;
  return no_cuda("host_alloc");
}

void sh_cuda_host_free(void *ptr) {
}

int sh_cuda_host_empty_cache(void) {
  return no_cuda("host_empty_cache");
}

int sh_cuda_copy_async(sh_tensor *dst, const sh_tensor *src) {
  return no_cuda("copy_async");
}

void *sh_cuda_stream_raw(const sh_cuda_stream *s) {
  return NULL;
}

int sh_cuda_stream_device(const sh_cuda_stream *s) {
  return -1;
}

void *sh_cuda_event_raw(const sh_cuda_event *e) {
  return NULL;
}

int sh_cuda_copy_(sh_tensor *dst, const sh_tensor *src) {
  return no_cuda("copy_");
}

int sh_cuda_fill_(sh_tensor *t, double value) {
  return no_cuda("fill_");
}

int sh_cuda_binary(sh_tensor **out, int op, const sh_tensor *a, const sh_tensor *b) {
  if (out) *out = NULL;
  return no_cuda("binary");
}

int sh_cuda_binary_scalar(sh_tensor **out, int op, const sh_tensor *a, double s, int scalar_first) {
  if (out) *out = NULL;
  return no_cuda("binary_scalar");
}

int sh_cuda_unary(sh_tensor **out, int op, const sh_tensor *a) {
  if (out) *out = NULL;
  return no_cuda("unary");
}

int sh_cuda_binary_(sh_tensor *dst, int op, const sh_tensor *b) {
  return no_cuda("binary_");
}

int sh_cuda_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) {
  return no_cuda("axpy_");
}

int sh_cuda_scale_(sh_tensor *dst, double alpha) {
  return no_cuda("scale_");
}

int sh_cuda_reduce(sh_tensor **out, int op, const sh_tensor *a, int dim, int keepdim) {
  if (out) *out = NULL;
  return no_cuda("reduce");
}

int sh_cuda_reduce_all(sh_tensor **out, int op, const sh_tensor *a) {
  if (out) *out = NULL;
  return no_cuda("reduce_all");
}

int sh_cuda_argmax(sh_tensor **out, const sh_tensor *a, int dim, int keepdim) {
  if (out) *out = NULL;
  return no_cuda("argmax");
}

int sh_cuda_sum_to_shape(sh_tensor **out, const sh_tensor *a, int ndim, const int64_t *shape) {
  if (out) *out = NULL;
  return no_cuda("sum_to_shape");
}

double sh_cuda_sumsq(const sh_tensor *a, int *status) {
  if (status) *status = no_cuda("sumsq");
  return NAN;
}

int sh_cuda_matmul(sh_tensor **out, const sh_tensor *a, const sh_tensor *b) {
  if (out) *out = NULL;
  return no_cuda("matmul");
}

int sh_cuda_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b, double alpha, double beta) {
  return no_cuda("gemm_");
}

int sh_cuda_arange(sh_tensor **out, double start, double end, double step, int dtype, int device) {
  if (out) *out = NULL;
  return no_cuda("arange");
}

int sh_cuda_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  return no_cuda("random_normal_");
}

int sh_cuda_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  return no_cuda("random_uniform_");
}

int sh_cuda_linear_forward(sh_tensor **y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  if (y) *y = NULL;
  return no_cuda("linear_forward");
}

int sh_cuda_linear_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w) {
  if (dx) *dx = NULL;
  return no_cuda("linear_backward");
}

int sh_cuda_layernorm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b, double eps) {
  if (y) *y = NULL;
  if (mean) *mean = NULL;
  if (rstd) *rstd = NULL;
  return no_cuda("layernorm_forward");
}

int sh_cuda_layernorm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean, const sh_tensor *rstd) {
  if (dx) *dx = NULL;
  return no_cuda("layernorm_backward");
}

int sh_cuda_rmsnorm_forward(sh_tensor **y, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  if (y) *y = NULL;
  if (rstd) *rstd = NULL;
  return no_cuda("rmsnorm_forward");
}

int sh_cuda_rmsnorm_backward(sh_tensor **dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w, const sh_tensor *rstd) {
  if (dx) *dx = NULL;
  return no_cuda("rmsnorm_backward");
}

int sh_cuda_gelu_forward(sh_tensor **y, const sh_tensor *x) {
  if (y) *y = NULL;
  return no_cuda("gelu_forward");
}

int sh_cuda_gelu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x) {
  if (dx) *dx = NULL;
  return no_cuda("gelu_backward");
}

int sh_cuda_silu_forward(sh_tensor **y, const sh_tensor *x) {
  if (y) *y = NULL;
  return no_cuda("silu_forward");
}

int sh_cuda_silu_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *x) {
  if (dx) *dx = NULL;
  return no_cuda("silu_backward");
}

int sh_cuda_swiglu_forward(sh_tensor **y, const sh_tensor *a, const sh_tensor *b) {
  if (y) *y = NULL;
  return no_cuda("swiglu_forward");
}

int sh_cuda_swiglu_backward(sh_tensor **da, sh_tensor **db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b) {
  if (da) *da = NULL;
  if (db) *db = NULL;
  return no_cuda("swiglu_backward");
}

int sh_cuda_softmax_forward(sh_tensor **y, const sh_tensor *x) {
  if (y) *y = NULL;
  return no_cuda("softmax_forward");
}

int sh_cuda_softmax_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *y) {
  if (dx) *dx = NULL;
  return no_cuda("softmax_backward");
}

int sh_cuda_attention_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v, double scale) {
  if (out) *out = NULL;
  if (lse) *lse = NULL;
  return no_cuda("attention_forward");
}

int sh_cuda_attention_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v, const sh_tensor *out, const sh_tensor *lse, double scale) {
  if (dq) *dq = NULL;
  if (dk) *dk = NULL;
  if (dv) *dv = NULL;
  return no_cuda("attention_backward");
}

int sh_cuda_embedding_forward(sh_tensor **y, const sh_tensor *idx, const sh_tensor *w) {
  if (y) *y = NULL;
  return no_cuda("embedding_forward");
}

int sh_cuda_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  return no_cuda("embedding_backward");
}

int sh_cuda_cross_entropy_forward(sh_tensor **loss, sh_tensor **lse, const sh_tensor *logits, const sh_tensor *targets, int64_t ignore_index) {
  if (loss) *loss = NULL;
  if (lse) *lse = NULL;
  return no_cuda("cross_entropy_forward");
}

int sh_cuda_cross_entropy_backward(sh_tensor **dlogits, const sh_tensor *logits, const sh_tensor *targets, const sh_tensor *lse, double dloss, int64_t ignore_index) {
  if (dlogits) *dlogits = NULL;
  return no_cuda("cross_entropy_backward");
}

int sh_cuda_dropout_forward(sh_tensor **y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  if (y) *y = NULL;
  return no_cuda("dropout_forward");
}

int sh_cuda_dropout_backward(sh_tensor **dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  if (dx) *dx = NULL;
  return no_cuda("dropout_backward");
}

int sh_cuda_linear_gelu_forward(sh_tensor **y, sh_tensor **pre, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  if (y) *y = NULL;
  if (pre) *pre = NULL;
  return no_cuda("linear_gelu_forward");
}

int sh_cuda_linear_backward_dgelu(sh_tensor **dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre) {
  if (dpre) *dpre = NULL;
  return no_cuda("linear_backward_dgelu");
}

int sh_cuda_layernorm_residual_forward(sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *res, const sh_tensor *w, const sh_tensor *b, double eps) {
  if (y) *y = NULL;
  if (r) *r = NULL;
  if (mean) *mean = NULL;
  if (rstd) *rstd = NULL;
  return no_cuda("layernorm_residual_forward");
}

int sh_cuda_adamw_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *m, sh_tensor *v, sh_tensor *shadow, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale) {
  return no_cuda("adamw_step_");
}

int sh_cuda_sgd_step_(sh_tensor *param, const sh_tensor *grad, sh_tensor *momentum_buf, double lr, double momentum, double dampening, double weight_decay, int nesterov, int first_step, double grad_scale) {
  return no_cuda("sgd_step_");
}
