/* comm_local.c: the backend of a group of one: every collective is a copy, done at once.
 * A reduce dtype still rounds the values, so a run at world 1 matches the numerics of a
 * bigger world's reduction in that dtype. */
#include "comm_internal.h"
#include "tensor_internal.h"
#include <string.h>

static void copy_rounded(sh_tensor *dst, const sh_tensor *src, int rd) {
  int64_t n = sh_tensor_numel(src);
  void *d = sh_tensor_data(dst);
  const void *s = sh_tensor_data(src);
  if (rd < 0 || rd == src->dtype) {
    if (d != s) memmove(d, s, (size_t)(n * sh_dtype_size(src->dtype)));
    return;
  }
  for (int64_t i = 0; i < n; i++) sh_store(d, dst->dtype, i, sh_comm_round(sh_load(s, src->dtype, i), rd));
}

static int local_start(sh_comm_work *w) {
  if (w->kind != SH_COLL_BARRIER) {
    if (w->in->device >= 0 || w->out->device >= 0)
      return sh_fail(SH_ERR_DEVICE, "the local backend handles CPU tensors only, got %s", sh_desc(w->in));
    copy_rounded(w->out, w->in, w->kind == SH_COLL_ALL_GATHER || w->kind == SH_COLL_BROADCAST ? -1 : w->reduce_dtype);
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
  "local", local_start, local_test, local_abandon, local_split, local_destroy
};
