/* staging.c: the f32 staging, gradient accumulation and parallel_for every CPU kernel family
 * shares (see staging_internal.h for why they stage through f32). */
#include <stdio.h>
#include "staging_internal.h"
#include "core/parallel.h"

typedef struct stage_range_job { sh_stage_range_fn fn; const void *arg; } stage_range_job;

static void stage_range_task(void *job, int64_t i0, int64_t i1) {
  const stage_range_job *j = job;
  j->fn(j->arg, i0, i1);
}

void sh_stage_parallel_for(int64_t n, int64_t work, sh_stage_range_fn fn, const void *arg) {
  stage_range_job job = { fn, arg };
  sh_parallel_for(n, work >= SH_STAGE_PAR_MIN, stage_range_task, &job);
}

static int stage(sh_tensor **out, const sh_tensor *t, const char *op, const char *name, int rows_only) {
  *out = NULL;
  SH_TRY(sh_nn_check_float(t, op, name));
  int ok = t->dtype == SH_F32;
  if (ok && rows_only) ok = t->ndim == 0 || t->stride[t->ndim - 1] == 1 || t->shape[t->ndim - 1] == 1;
  else if (ok) ok = sh_tensor_is_contiguous(t);
  int rc = ok ? sh_tensor_alias(out, t) : sh_kernel_to(out, t, SH_F32);
  return rc ? sh_fail_context("%s: staging %s: ", op, name) : SH_OK;
}

int sh_stage_f32(sh_tensor **out, const sh_tensor *t, const char *op, const char *name) {
  return stage(out, t, op, name, 0);
}

int sh_stage_f32_rows(sh_tensor **out, const sh_tensor *t, const char *op, const char *name) {
  return stage(out, t, op, name, 1);
}

int sh_stage_new_f32(sh_tensor **out, int ndim, const int64_t *shape) {
  return sh_tensor_empty(out, ndim, shape, SH_F32, -1);
}

int sh_stage_zeros_f32(sh_tensor **out, int ndim, const int64_t *shape) {
  SH_TRY(sh_tensor_empty(out, ndim, shape, SH_F32, -1));
  memset(sh_tensor_data(*out), 0, (size_t)sh_tensor_numel(*out) * sizeof(float));
  return SH_OK;
}

int sh_stage_finish(sh_tensor **t, int dtype) {
  if (dtype == SH_F32) return SH_OK;
  sh_tensor *conv = NULL;
  int rc = sh_kernel_to(&conv, *t, dtype);
  sh_tensor_destroy(*t);
  *t = conv;
  return rc;
}

int sh_stage_accum_begin(sh_stage_accum *a, sh_tensor *dst, const char *op, const char *name) {
  a->dst = dst;
  a->buf = NULL;
  SH_TRY(sh_nn_check_float(dst, op, name));
  if (dst->dtype == SH_F32 && sh_tensor_is_contiguous(dst)) return sh_tensor_alias(&a->buf, dst);
  int rc = sh_kernel_to(&a->buf, dst, SH_F32);
  return rc ? sh_fail_context("%s: staging %s: ", op, name) : SH_OK;
}

int sh_stage_out_begin(sh_stage_accum *a, sh_tensor *dst) {
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

int sh_stage_out_rows_begin(sh_stage_accum *a, sh_tensor *dst) {
  int rows = dst->ndim > 0 && dst->stride[dst->ndim - 1] == 1 && non_overlapping(dst);
  if (dst->dtype == SH_F32 && rows) {
    a->dst = dst;
    return sh_tensor_alias(&a->buf, dst);
  }
  return sh_stage_out_begin(a, dst);
}

int sh_stage_accum_end(sh_stage_accum *a) {
  int rc = SH_OK;
  if (a->buf && a->buf->storage != a->dst->storage) rc = sh_kernel_copy_(a->dst, a->buf);
  else a->dst->version++;
  sh_tensor_destroy(a->buf);
  a->buf = NULL;
  return rc;
}

void sh_stage_accum_drop(sh_stage_accum *a) {
  sh_tensor_destroy(a->buf);
  a->buf = NULL;
}
