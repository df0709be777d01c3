/* nn_common.c: argument checks, f32 staging and gradient accumulation shared by the nn and
 * optimizer kernels (see nn_internal.h for why they stage through f32). */
#include <stdio.h>
#include "nn_internal.h"
#include "parallel.h"

typedef struct nn_range_job { sh_nn_range_fn fn; const void *arg; } nn_range_job;

static void nn_range_task(void *job, int64_t i0, int64_t i1) {
  const nn_range_job *j = job;
  j->fn(j->arg, i0, i1);
}

void sh_nn_parallel_for(int64_t n, int64_t work, sh_nn_range_fn fn, const void *arg) {
  nn_range_job job = { fn, arg };
  sh_parallel_for(n, work >= SH_NN_PAR_MIN, nn_range_task, &job);
}

int sh_nn_check_float(const sh_tensor *t, const char *op, const char *name) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  if (!t->storage) return sh_fail(SH_ERR_FREED, "%s: %s %s was used after :free()", op, name, sh_desc(t));
  if (!sh_dtype_is_float(t->dtype))
    return sh_fail(SH_ERR_ARG, "%s: %s must be a float tensor (f32, bf16, f16, f64), got %s", op, name, sh_desc(t));
  return SH_OK;
}

int sh_check_on(const sh_tensor *t, int device, const char *op, const char *name) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  if (!t->storage) return sh_fail(SH_ERR_FREED, "%s: %s %s was used after :free()", op, name, sh_desc(t));
  if (t->device == device) return SH_OK;
  char want[16];
  return sh_fail(SH_ERR_DEVICE, "%s: %s is %s but the op runs on %s: move it first", op, name, sh_desc(t),
                 sh_device_str(device, want, sizeof want));
}

int sh_nn_check_shape(const sh_tensor *t, const char *op, const char *name, int ndim, const int64_t *shape) {
  int ok = t->ndim == ndim;
  for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || t->shape[d] == shape[d];
  if (ok) return SH_OK;
  char want[200];
  int n = snprintf(want, sizeof want, "[");
  for (int d = 0; d < ndim && n < (int)sizeof want; d++)
    n += shape[d] < 0 ? snprintf(want + n, sizeof want - n, "%s*", d ? "," : "")
                      : snprintf(want + n, sizeof want - n, "%s%lld", d ? "," : "", (long long)shape[d]);
  if (n < (int)sizeof want) snprintf(want + n, sizeof want - n, "]");
  return sh_fail(SH_ERR_ARG, "%s: %s must have shape %s, got %s", op, name, want, sh_desc(t));
}

int sh_nn_check_same_shape(const sh_tensor *a, const sh_tensor *b, const char *op, const char *an, const char *bn) {
  int ok = a->ndim == b->ndim;
  for (int d = 0; ok && d < a->ndim; d++) ok = a->shape[d] == b->shape[d];
  if (ok) return SH_OK;
  return sh_fail(SH_ERR_ARG, "%s: %s and %s must have the same shape, got %s and %s", op, an, bn, sh_desc(a), sh_desc(b));
}

static int stage(sh_tensor **out, const sh_tensor *t, const char *op, const char *name, int rows_only) {
  *out = NULL;
  SH_TRY(sh_nn_check_float(t, op, name));
  int ok = t->dtype == SH_F32;
  if (ok && rows_only) ok = t->ndim == 0 || t->stride[t->ndim - 1] == 1 || t->shape[t->ndim - 1] == 1;
  else if (ok) ok = sh_tensor_is_contiguous(t);
  int rc = ok ? sh_tensor_alias(out, t) : sh_tensor_to(out, t, SH_F32, -1);
  return rc ? sh_fail_context("%s: staging %s: ", op, name) : SH_OK;
}

int sh_nn_f32(sh_tensor **out, const sh_tensor *t, const char *op, const char *name) {
  return stage(out, t, op, name, 0);
}

int sh_nn_f32_rows(sh_tensor **out, const sh_tensor *t, const char *op, const char *name) {
  return stage(out, t, op, name, 1);
}

int sh_nn_new_f32(sh_tensor **out, int ndim, const int64_t *shape) {
  return sh_tensor_empty(out, ndim, shape, SH_F32, -1);
}

int sh_nn_zeros_f32(sh_tensor **out, int ndim, const int64_t *shape) {
  SH_TRY(sh_tensor_empty(out, ndim, shape, SH_F32, -1));
  memset(sh_tensor_data(*out), 0, (size_t)sh_tensor_numel(*out) * sizeof(float));
  return SH_OK;
}

int sh_nn_finish(sh_tensor **t, int dtype) {
  if (dtype == SH_F32) return SH_OK;
  sh_tensor *conv = NULL;
  int rc = sh_tensor_to(&conv, *t, dtype, -1);
  sh_tensor_destroy(*t);
  *t = conv;
  return rc;
}

int sh_nn_accum_begin(sh_nn_accum *a, sh_tensor *dst, const char *op, const char *name) {
  a->dst = dst;
  a->buf = NULL;
  SH_TRY(sh_nn_check_float(dst, op, name));
  if (dst->dtype == SH_F32 && sh_tensor_is_contiguous(dst)) return sh_tensor_alias(&a->buf, dst);
  int rc = sh_tensor_to(&a->buf, dst, SH_F32, -1);
  return rc ? sh_fail_context("%s: staging %s: ", op, name) : SH_OK;
}

int sh_nn_out_begin(sh_nn_accum *a, sh_tensor *dst) {
  a->dst = dst;
  a->buf = NULL;
  if (dst->dtype == SH_F32 && sh_tensor_is_contiguous(dst)) return sh_tensor_alias(&a->buf, dst);
  return sh_tensor_empty(&a->buf, dst->ndim, dst->shape, SH_F32, -1);
}

/* No two elements of t share memory: with the dims of extent > 1 ordered by stride, each
 * stride is at least the span of the dims below it. */
static int non_overlapping(const sh_tensor *t) {
  int order[SH_MAX_DIMS], n = 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] > 1) {
      int i = n++;
      for (; i > 0 && t->stride[order[i - 1]] > t->stride[d]; i--) order[i] = order[i - 1];
      order[i] = d;
    }
  int64_t span = 1;
  for (int i = 0; i < n; i++) {
    if (t->stride[order[i]] < span) return 0;
    span = t->stride[order[i]] * t->shape[order[i]];
  }
  return 1;
}

int sh_nn_out_rows_begin(sh_nn_accum *a, sh_tensor *dst) {
  int rows = dst->ndim > 0 && dst->stride[dst->ndim - 1] == 1 && non_overlapping(dst);
  if (dst->dtype == SH_F32 && rows) {
    a->dst = dst;
    return sh_tensor_alias(&a->buf, dst);
  }
  return sh_nn_out_begin(a, dst);
}

int sh_nn_accum_end(sh_nn_accum *a) {
  int rc = SH_OK;
  if (a->buf && a->buf->storage != a->dst->storage) rc = sh_tensor_copy_(a->dst, a->buf);
  else a->dst->version++;
  sh_tensor_destroy(a->buf);
  a->buf = NULL;
  return rc;
}

void sh_nn_accum_drop(sh_nn_accum *a) {
  sh_tensor_destroy(a->buf);
  a->buf = NULL;
}
