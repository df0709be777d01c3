/* comm_local.c: the backend of a group of one: every collective is a copy, done at once.
 * A reduce dtype still rounds the values, so a run at world 1 matches the numerics of a
 * bigger world's reduction in that dtype. CUDA tensors are copied by the device's copy_
 * kernel on the current stream (it is also their backend in a build without NCCL). */
#include "comm_internal.h"
#include "core/tensor_internal.h"
#include "core/bf16_internal.h"
#include <string.h>

static void copy_rounded(sh_tensor *dst, const sh_tensor *src, int rd) {
  int64_t n = sh_tensor_numel(src);
  void *d = sh_tensor_data(dst);
  const void *s = sh_tensor_data(src);
  if (rd < 0 || rd == src->dtype) {
    if (d != s) memmove(d, s, (size_t)(n * sh_dtype_size(src->dtype)));
    return;
  }
  if (src->dtype == SH_F32 && rd == SH_BF16) {   /* an f32 reduction rounded in bf16: inline, vectorizable */
    float *df = d;
    const float *sf = s;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) df[i] = sh_bf16_to_f32_inline(sh_f32_to_bf16_inline(sf[i]));
    return;
  }
  for (int64_t i = 0; i < n; i++) sh_store(d, dst->dtype, i, sh_comm_round(sh_load(s, src->dtype, i), rd));
}

/* The same on a device: through a tensor of the reduce dtype when it rounds. */
static int copy_rounded_device(sh_tensor *dst, const sh_tensor *src, int rd) {
  if (dst->storage == src->storage && dst->offset == src->offset && (rd < 0 || rd == src->dtype)) return SH_OK;
  if (rd < 0 || rd == src->dtype || !sh_dtype_is_float(rd)) return sh_tensor_copy_(dst, src);
  sh_tensor *r = NULL;
  int rc = sh_tensor_to(&r, src, rd, src->device);
  if (!rc) rc = sh_tensor_copy_(dst, r);
  sh_tensor_destroy(r);
  return rc;
}

static int local_start(sh_comm_work *w) {
  if (w->kind != SH_COLL_BARRIER) {
    int rd = w->kind == SH_COLL_ALL_GATHER || w->kind == SH_COLL_BROADCAST || w->kind == SH_COLL_ALL_TO_ALL
             ? -1 : w->reduce_dtype;
    if (w->in->device >= 0) SH_TRY(copy_rounded_device(w->out, w->in, rd));
    else copy_rounded(w->out, w->in, rd);
  }
  w->done = 1;
  return SH_OK;
}

static int local_test(sh_comm_work *w, int *done) { *done = 1; return SH_OK; }
static void local_abandon(sh_comm_work *w) {}

static int local_split(sh_comm *parent, int color, int key, sh_comm *child) {
  child->rank = 0;
  child->size = color < 0 ? 0 : 1;
  return SH_OK;
}

static void local_destroy(sh_comm *c) {}

const sh_comm_backend sh_comm_local_backend = {
  .name = "local", .start = local_start, .test = local_test, .abandon = local_abandon, .split = local_split,
  .destroy = local_destroy,
};
