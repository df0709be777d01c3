/* access.c: tensor.h's conversions and element access built on copy_: to, contiguous,
 * reshape (a view when the strides allow, else a copy), and the host's reads and writes of
 * single elements and whole cpu tensors in f64. */
#include "ops_internal.h"
#include "core/alloc_internal.h"
#include <math.h>

int sh_tensor_contiguous(sh_tensor **out, const sh_tensor *t) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "contiguous"));
  if (sh_tensor_is_contiguous(t)) return sh_tensor_alias(out, t);
  return sh_tensor_to(out, t, t->dtype, t->device);
}

int sh_tensor_to(sh_tensor **out, const sh_tensor *t, int dtype, int device) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "to"));
  SH_TRY(sh_tensor_empty(out, t->ndim, t->shape, dtype, device));
  int rc = sh_tensor_copy_(*out, t);
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

int sh_tensor_reshape(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "reshape"));
  if (sh_view_reshape(out, t, ndim, shape) == SH_OK) return SH_OK;
  if (sh_last_status() != SH_ERR_ARG || sh_tensor_is_contiguous(t)) return sh_last_status();
  sh_tensor *c = NULL;
  SH_TRY(sh_tensor_contiguous(&c, t));
  int rc = sh_view_reshape(out, c, ndim, shape);
  sh_tensor_destroy(c);
  return rc;
}

static int require_cpu(const sh_tensor *t, const char *op) {
  SH_TRY(sh_tensor_check(t, op));
  if (t->device != -1) return sh_fail(SH_ERR_DEVICE, "%s: needs a cpu tensor, got %s (use :to('cpu'))", op, sh_desc(t));
  return SH_OK;
}

/* An element as the host reads it. A NaN comes back as the plain quiet NaN: LuaJIT keeps its own
 * values in NaN payloads, so a NaN with a payload (an f32 0xffffffff widened to a double has
 * one) reads back in Lua as another type (nil, a table), not as a number. */
static double host_value(const void *data, int dtype, int64_t off) {
  double v = sh_load(data, dtype, off);
  return isnan(v) ? (double)NAN : v;
}

int sh_tensor_item(const sh_tensor *t, double *out) {
  SH_TRY(require_cpu(t, "item"));
  if (sh_tensor_numel(t) != 1)
    return sh_fail(SH_ERR_ARG, "item: needs a tensor with one element, got %s", sh_desc(t));
  *out = host_value(t->storage->data, t->dtype, t->offset);
  return SH_OK;
}

static int element_offset(const sh_tensor *t, const int64_t *index, const char *op, int64_t *off) {
  *off = t->offset;
  for (int d = 0; d < t->ndim; d++) {
    int64_t i = index[d] < 0 ? index[d] + t->shape[d] : index[d];
    if (i < 0 || i >= t->shape[d])
      return sh_fail(SH_ERR_ARG, "%s: index %lld out of range for dim %d of %s", op, (long long)index[d], d, sh_desc(t));
    *off += i * t->stride[d];
  }
  return SH_OK;
}

int sh_tensor_get(const sh_tensor *t, const int64_t *index, double *out) {
  int64_t off;
  SH_TRY(require_cpu(t, "get"));
  SH_TRY(element_offset(t, index, "get", &off));
  *out = host_value(t->storage->data, t->dtype, off);
  return SH_OK;
}

int sh_tensor_set(sh_tensor *t, const int64_t *index, double value) {
  int64_t off;
  SH_TRY(require_cpu(t, "set"));
  SH_TRY(element_offset(t, index, "set", &off));
  sh_store(t->storage->data, t->dtype, off, value);
  t->version++;
  return SH_OK;
}

int sh_tensor_read_f64(const sh_tensor *t, double *out) {
  SH_TRY(require_cpu(t, "read"));
  const int64_t *strides[1] = {t->stride};
  int64_t n = sh_tensor_numel(t);
  sh_nditer it;
  sh_nditer_init(&it, t->ndim, t->shape, 1, strides, &t->offset);
  for (int64_t i = 0; i < n; i++, sh_nditer_next(&it)) out[i] = host_value(t->storage->data, t->dtype, it.off[0]);
  return SH_OK;
}

int sh_tensor_write_f64(sh_tensor *t, const double *in) {
  SH_TRY(require_cpu(t, "write"));
  const int64_t *strides[1] = {t->stride};
  int64_t n = sh_tensor_numel(t);
  sh_nditer it;
  sh_nditer_init(&it, t->ndim, t->shape, 1, strides, &t->offset);
  for (int64_t i = 0; i < n; i++, sh_nditer_next(&it)) sh_store(t->storage->data, t->dtype, it.off[0], in[i]);
  t->version++;
  return SH_OK;
}
