#include "tensor_internal.h"
#include "alloc_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- element access ---------------------------------------------------------------- */

double sh_load(const void *base, int dtype, int64_t i) {
  switch (dtype) {
    case SH_F64: return ((const double *)base)[i];
    case SH_F32: return ((const float *)base)[i];
    case SH_BF16: return sh_bf16_to_f32(((const uint16_t *)base)[i]);
    case SH_F16: return sh_f16_to_f32(((const uint16_t *)base)[i]);
    case SH_I64: return (double)((const int64_t *)base)[i];
    case SH_I32: return ((const int32_t *)base)[i];
    case SH_U8: return ((const uint8_t *)base)[i];
    case SH_BOOL: return ((const uint8_t *)base)[i] != 0;
  }
  return 0;
}

void sh_store(void *base, int dtype, int64_t i, double v) {
  switch (dtype) {
    case SH_F64: ((double *)base)[i] = v; break;
    case SH_F32: ((float *)base)[i] = (float)v; break;
    case SH_BF16: ((uint16_t *)base)[i] = sh_f32_to_bf16((float)v); break;
    case SH_F16: ((uint16_t *)base)[i] = sh_f32_to_f16((float)v); break;
    case SH_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case SH_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case SH_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case SH_BOOL: ((uint8_t *)base)[i] = v != 0; break;
  }
}

/* ---- descriptions ------------------------------------------------------------------ */

const char *sh_ord(int n) {
  if (n % 100 >= 11 && n % 100 <= 13) return "th";
  switch (n % 10) { case 1: return "st"; case 2: return "nd"; case 3: return "rd"; default: return "th"; }
}

const char *sh_shape_str(int ndim, const int64_t *shape, char *buf, int size) {
  int n = snprintf(buf, size, "[");
  for (int d = 0; d < ndim && n < size; d++)
    n += snprintf(buf + n, size - n, d ? ",%lld" : "%lld", (long long)shape[d]);
  if (n < size) snprintf(buf + n, size - n, "]");
  return buf;
}

const char *sh_device_str(int device, char *buf, int size) {
  if (device == SH_DEVICE_META) snprintf(buf, size, "meta");
  else if (device == SH_DEVICE_META_HOST) snprintf(buf, size, "meta:host");
  else if (device < 0) snprintf(buf, size, "cpu");
  else snprintf(buf, size, "cuda:%d", device);
  return buf;
}

int sh_tensor_describe(const sh_tensor *t, char *buf, int size) {
  char shape[160], dev[16];
  if (!t) return snprintf(buf, size, "nil");
  sh_shape_str(t->ndim, t->shape, shape, sizeof shape);
  return snprintf(buf, size, "%s%s %s%s", sh_dtype_name(t->dtype), shape, sh_device_str(t->device, dev, sizeof dev),
                  t->storage ? "" : " (freed)");
}

const char *sh_desc(const sh_tensor *t) {
  static _Thread_local char bufs[4][200];
  static _Thread_local int next;
  char *b = bufs[next++ & 3];
  sh_tensor_describe(t, b, sizeof bufs[0]);
  return b;
}

/* ---- lifetime ---------------------------------------------------------------------- */

static int64_t shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) { stride[d] = s; s *= shape[d] > 0 ? shape[d] : 1; }
}

#define SH_MAX_NUMEL ((int64_t)1 << 50)

static int check_shape(const char *op, int ndim, const int64_t *shape) {
  char buf[160];
  if (ndim < 0 || ndim > SH_MAX_DIMS)
    return sh_fail(SH_ERR_ARG, "%s: %d dims requested; tensors have 0 to 8", op, ndim);
  /* The product of the sizes, with 0 counted as 1 (the contiguous strides multiply them so),
   * must stay below SH_MAX_NUMEL: element counts, strides and byte counts then never overflow. */
  int64_t span = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return sh_fail(SH_ERR_ARG, "%s: negative size in shape %s", op, sh_shape_str(ndim, shape, buf, sizeof buf));
    if (__builtin_mul_overflow(span, shape[d] > 0 ? shape[d] : 1, &span) || span > SH_MAX_NUMEL)
      return sh_fail(SH_ERR_ARG, "%s: shape %s spans more than 2^50 elements", op, sh_shape_str(ndim, shape, buf, sizeof buf));
  }
  return SH_OK;
}

static sh_tensor *new_struct(void) { return calloc(1, sizeof(sh_tensor)); }

int sh_tensor_empty(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  *out = NULL;
  SH_TRY(check_shape("empty", ndim, shape));
  if (sh_dtype_size(dtype) == 0) return sh_fail(SH_ERR_ARG, "empty: unknown dtype %d", dtype);
  int64_t numel = shape_numel(ndim, shape);
  if (numel > ((int64_t)1 << 46)) return sh_fail(SH_ERR_OOM, "empty: %lld elements is too many", (long long)numel);
  int64_t nbytes = numel * sh_dtype_size(dtype);
  int tag = sh_mem_current_tag();
  sh_storage *s = calloc(1, sizeof *s);
  sh_tensor *t = new_struct();
  void *data = s && t ? sh_mem_alloc(device, (size_t)nbytes, tag) : NULL;
  if (!data) {
    free(s); free(t);
    if (!s || !t) return sh_fail(SH_ERR_OOM, "empty: out of host memory for a tensor header");
    char buf[160];
    return sh_fail_context("empty %s%s: ", sh_dtype_name(dtype), sh_shape_str(ndim, shape, buf, sizeof buf));
  }
  *s = (sh_storage){.data = data, .nbytes = nbytes, .refcount = 1, .device = device, .tag = tag};
  t->storage = s;
  t->ndim = ndim;
  t->dtype = dtype;
  t->device = device;
  if (ndim > 0) memcpy(t->shape, shape, sizeof(int64_t) * ndim);   /* shape may be NULL for 0-dim */
  contiguous_strides(ndim, shape, t->stride);
  *out = t;
  return SH_OK;
}

int sh_tensor_meta(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  *out = NULL;
  SH_TRY(check_shape("meta", ndim, shape));
  if (sh_dtype_size(dtype) == 0) return sh_fail(SH_ERR_ARG, "meta: unknown dtype %d", dtype);
  sh_tensor *t = new_struct();
  if (!t) return sh_fail(SH_ERR_OOM, "meta: out of host memory for a tensor header");
  *t = (sh_tensor){.ndim = ndim, .dtype = dtype, .device = device};
  if (ndim > 0) memcpy(t->shape, shape, sizeof(int64_t) * ndim);   /* shape may be NULL for 0-dim */
  contiguous_strides(ndim, shape, t->stride);
  *out = t;
  return SH_OK;
}

int sh_tensor_wrap_external(sh_tensor **out, void *data, int64_t nbytes, int ndim,
                            const int64_t *shape, int dtype) {
  *out = NULL;
  SH_TRY(check_shape("wrap_external", ndim, shape));
  if (sh_dtype_size(dtype) == 0) return sh_fail(SH_ERR_ARG, "wrap_external: unknown dtype %d", dtype);
  if (shape_numel(ndim, shape) * sh_dtype_size(dtype) > nbytes)
    return sh_fail(SH_ERR_ARG, "wrap_external: %lld bytes cannot hold the requested %s tensor",
                   (long long)nbytes, sh_dtype_name(dtype));
  sh_storage *s = calloc(1, sizeof *s);
  sh_tensor *t = new_struct();
  if (!s || !t) { free(s); free(t); return sh_fail(SH_ERR_OOM, "wrap_external: out of host memory"); }
  *s = (sh_storage){.data = data, .nbytes = nbytes, .refcount = 1, .device = -1, .external = 1};
  *t = (sh_tensor){.storage = s, .ndim = ndim, .dtype = dtype, .device = -1};
  if (ndim > 0) memcpy(t->shape, shape, sizeof(int64_t) * ndim);   /* shape may be NULL for 0-dim */
  contiguous_strides(ndim, shape, t->stride);
  *out = t;
  return SH_OK;
}

static void storage_unref(sh_storage *s) {
  if (!s || --s->refcount > 0) return;
  if (!s->external) sh_mem_free(s->device, s->data, (size_t)s->nbytes, s->tag);
  free(s);
}

void sh_tensor_release(sh_tensor *t) {
  if (!t) return;
  storage_unref(t->storage);
  t->storage = NULL;
  if (t->grad) { sh_tensor_destroy(t->grad); t->grad = NULL; }
}

void sh_tensor_destroy(sh_tensor *t) {
  if (!t) return;
  sh_tensor_release(t);
  free(t);
}

int sh_tensor_check(const sh_tensor *t, const char *op) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: expected a tensor, got nil", op);
  if (!t->storage) return sh_fail(SH_ERR_FREED, "%s: tensor %s was used after :free()", op, sh_desc(t));
  return SH_OK;
}

/* A new struct viewing t's storage; the caller then sets its shape, strides and offset. */
static int new_view(sh_tensor **out, const sh_tensor *t, const char *op) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, op));
  sh_tensor *v = new_struct();
  if (!v) return sh_fail(SH_ERR_OOM, "%s: out of host memory for a view", op);
  *v = *t;
  v->grad = NULL;
  v->requires_grad = 0;
  v->storage->refcount++;
  *out = v;
  return SH_OK;
}

int sh_tensor_alias(sh_tensor **out, const sh_tensor *t) { return new_view(out, t, "alias"); }

int sh_tensor_set_grad(sh_tensor *t, const sh_tensor *grad) {
  SH_TRY(sh_tensor_check(t, "set_grad"));
  sh_tensor *g = NULL;
  if (grad) {
    SH_TRY(new_view(&g, grad, "set_grad"));
    if (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * t->ndim) != 0 || g->device != t->device) {
      char a[200];
      snprintf(a, sizeof a, "%s", sh_desc(grad));
      sh_tensor_destroy(g);
      return sh_fail(SH_ERR_ARG, "set_grad: grad %s does not match tensor %s", a, sh_desc(t));
    }
  }
  if (t->grad) sh_tensor_destroy(t->grad);
  t->grad = g;
  return SH_OK;
}

/* ---- queries ----------------------------------------------------------------------- */

int64_t sh_tensor_numel(const sh_tensor *t) { return shape_numel(t->ndim, t->shape); }

int sh_tensor_is_contiguous(const sh_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return 0;
    s *= t->shape[d];
  }
  return 1;
}

void *sh_tensor_data(const sh_tensor *t) {
  if (!t->storage) return NULL;
  return (char *)t->storage->data + t->offset * sh_dtype_size(t->dtype);
}

/* ---- views ------------------------------------------------------------------------- */

static int norm_dim(const char *op, const sh_tensor *t, int *dim, int extra) {
  int n = t->ndim + extra;
  int d = *dim < 0 ? *dim + n : *dim;
  if (d < 0 || d >= n || n == 0)
    return sh_fail(SH_ERR_ARG, "%s: dim %d out of range for %s", op, *dim, sh_desc(t));
  *dim = d;
  return SH_OK;
}

int sh_view_narrow(sh_tensor **out, const sh_tensor *t, int dim, int64_t start, int64_t length) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "narrow"));
  SH_TRY(norm_dim("narrow", t, &dim, 0));
  if (start < 0 || length < 0 || start + length > t->shape[dim])
    return sh_fail(SH_ERR_ARG, "narrow: [%lld, %lld) is out of range for dim %d of size %lld in %s",
                   (long long)start, (long long)(start + length), dim, (long long)t->shape[dim], sh_desc(t));
  SH_TRY(new_view(out, t, "narrow"));
  (*out)->offset += start * t->stride[dim];
  (*out)->shape[dim] = length;
  return SH_OK;
}

int sh_view_select(sh_tensor **out, const sh_tensor *t, int dim, int64_t index) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "select"));
  SH_TRY(norm_dim("select", t, &dim, 0));
  int64_t i = index < 0 ? index + t->shape[dim] : index;
  if (i < 0 || i >= t->shape[dim])
    return sh_fail(SH_ERR_ARG, "select: index %lld is out of range for dim %d of size %lld in %s",
                   (long long)index, dim, (long long)t->shape[dim], sh_desc(t));
  SH_TRY(new_view(out, t, "select"));
  sh_tensor *v = *out;
  v->offset += i * t->stride[dim];
  for (int d = dim; d < t->ndim - 1; d++) { v->shape[d] = t->shape[d + 1]; v->stride[d] = t->stride[d + 1]; }
  v->ndim--;
  return SH_OK;
}

/* Resolves a -1 in a requested shape and checks the element count. */
static int resolve_shape(const char *op, const sh_tensor *t, int ndim, const int64_t *shape, int64_t *resolved) {
  char a[160];
  if (ndim < 0 || ndim > SH_MAX_DIMS) return sh_fail(SH_ERR_ARG, "%s: %d dims requested; tensors have 0 to 8", op, ndim);
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < ndim; d++) {
    resolved[d] = shape[d];
    if (shape[d] == -1) {
      if (infer >= 0) return sh_fail(SH_ERR_ARG, "%s: only one dim can be -1 in %s", op, sh_shape_str(ndim, shape, a, sizeof a));
      infer = d;
    } else if (shape[d] < 0) {
      return sh_fail(SH_ERR_ARG, "%s: negative size in %s", op, sh_shape_str(ndim, shape, a, sizeof a));
    } else if (__builtin_mul_overflow(known, shape[d], &known)) {
      return sh_fail(SH_ERR_ARG, "%s: shape %s spans more than 2^50 elements", op, sh_shape_str(ndim, shape, a, sizeof a));
    }
  }
  int64_t numel = sh_tensor_numel(t);
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return sh_fail(SH_ERR_ARG, "%s: cannot infer -1 in %s for %s", op, sh_shape_str(ndim, shape, a, sizeof a), sh_desc(t));
    resolved[infer] = numel / known;
    known *= resolved[infer];
  }
  if (known != numel)
    return sh_fail(SH_ERR_ARG, "%s: shape %s has %lld elements but %s has %lld", op,
                   sh_shape_str(ndim, shape, a, sizeof a), (long long)known, sh_desc(t), (long long)numel);
  return check_shape(op, ndim, resolved);
}

/* Strides for viewing t with a new shape without copying, when the memory allows it.
 * The rule is torch's: walk old dims from the innermost, cut them into chunks that are
 * contiguous among themselves, and require each chunk to be covered exactly by new dims. */
static int view_strides(const sh_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  if (sh_tensor_numel(t) == 0 || t->ndim == 0) { contiguous_strides(ndim, shape, stride); return 1; }
  int view_d = ndim - 1;
  int64_t base = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tensor_numel *= t->shape[d];
    if (d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != tensor_numel * base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        stride[view_d] = view_numel * base;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return 0;
      if (d > 0) { base = t->stride[d - 1]; tensor_numel = 1; view_numel = 1; }
    }
  }
  return view_d == -1;
}

int sh_view_reshape(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  int64_t resolved[SH_MAX_DIMS], stride[SH_MAX_DIMS];
  SH_TRY(sh_tensor_check(t, "view"));
  SH_TRY(resolve_shape("view", t, ndim, shape, resolved));
  if (!view_strides(t, ndim, resolved, stride)) {
    char a[160];
    return sh_fail(SH_ERR_ARG, "view: %s cannot be viewed as %s without a copy (non-contiguous); use reshape",
                   sh_desc(t), sh_shape_str(ndim, resolved, a, sizeof a));
  }
  SH_TRY(new_view(out, t, "view"));
  (*out)->ndim = ndim;
  memcpy((*out)->shape, resolved, sizeof(int64_t) * ndim);
  memcpy((*out)->stride, stride, sizeof(int64_t) * ndim);
  return SH_OK;
}

int sh_view_transpose(sh_tensor **out, const sh_tensor *t, int dim0, int dim1) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "transpose"));
  SH_TRY(norm_dim("transpose", t, &dim0, 0));
  SH_TRY(norm_dim("transpose", t, &dim1, 0));
  SH_TRY(new_view(out, t, "transpose"));
  sh_tensor *v = *out;
  v->shape[dim0] = t->shape[dim1]; v->shape[dim1] = t->shape[dim0];
  v->stride[dim0] = t->stride[dim1]; v->stride[dim1] = t->stride[dim0];
  return SH_OK;
}

int sh_view_permute(sh_tensor **out, const sh_tensor *t, const int *perm) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "permute"));
  int seen[SH_MAX_DIMS] = {0};
  for (int d = 0; d < t->ndim; d++) {
    int p = perm[d] < 0 ? perm[d] + t->ndim : perm[d];
    if (p < 0 || p >= t->ndim || seen[p]++)
      return sh_fail(SH_ERR_ARG, "permute: the order is not a permutation of the %d dims of %s", t->ndim, sh_desc(t));
  }
  SH_TRY(new_view(out, t, "permute"));
  for (int d = 0; d < t->ndim; d++) {
    int p = perm[d] < 0 ? perm[d] + t->ndim : perm[d];
    (*out)->shape[d] = t->shape[p];
    (*out)->stride[d] = t->stride[p];
  }
  return SH_OK;
}

int sh_view_expand(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "expand"));
  char a[160];
  if (ndim < t->ndim || ndim > SH_MAX_DIMS)
    return sh_fail(SH_ERR_ARG, "expand: cannot expand %s to %s", sh_desc(t), sh_shape_str(ndim, shape, a, sizeof a));
  int64_t stride[SH_MAX_DIMS], resolved[SH_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    int64_t size = d < lead ? 1 : t->shape[d - lead];
    int64_t want = shape[d] == -1 && d >= lead ? size : shape[d];
    if (want < 0 || (size != want && size != 1))
      return sh_fail(SH_ERR_ARG, "expand: cannot expand %s to %s (the %d%s dim: %lld vs %lld)", sh_desc(t),
                     sh_shape_str(ndim, shape, a, sizeof a), d + 1, sh_ord(d + 1), (long long)size, (long long)want);
    resolved[d] = want;
    stride[d] = (d < lead || size != want) ? 0 : t->stride[d - lead];
  }
  SH_TRY(new_view(out, t, "expand"));
  (*out)->ndim = ndim;
  memcpy((*out)->shape, resolved, sizeof(int64_t) * ndim);
  memcpy((*out)->stride, stride, sizeof(int64_t) * ndim);
  return SH_OK;
}

int sh_view_unsqueeze(sh_tensor **out, const sh_tensor *t, int dim) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "unsqueeze"));
  if (t->ndim >= SH_MAX_DIMS) return sh_fail(SH_ERR_ARG, "unsqueeze: %s already has 8 dims", sh_desc(t));
  SH_TRY(norm_dim("unsqueeze", t, &dim, 1));
  SH_TRY(new_view(out, t, "unsqueeze"));
  sh_tensor *v = *out;
  for (int d = t->ndim; d > dim; d--) { v->shape[d] = t->shape[d - 1]; v->stride[d] = t->stride[d - 1]; }
  v->shape[dim] = 1;
  v->stride[dim] = dim < t->ndim ? t->stride[dim] * t->shape[dim] : 1;
  v->ndim++;
  return SH_OK;
}

int sh_view_squeeze(sh_tensor **out, const sh_tensor *t, int dim) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "squeeze"));
  SH_TRY(norm_dim("squeeze", t, &dim, 0));
  if (t->shape[dim] != 1)
    return sh_fail(SH_ERR_ARG, "squeeze: the %d%s dim of %s has size %lld, not 1", dim + 1, sh_ord(dim + 1), sh_desc(t),
                   (long long)t->shape[dim]);
  return sh_view_select(out, t, dim, 0);
}

int sh_view_strided(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape,
                    const int64_t *stride, int64_t offset) {
  *out = NULL;
  SH_TRY(sh_tensor_check(t, "as_strided"));
  SH_TRY(check_shape("as_strided", ndim, shape));
  int64_t lo = offset, hi = offset;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) { lo = hi = offset; break; }
    int64_t span = (shape[d] - 1) * stride[d];
    if (span < 0) lo += span; else hi += span;
  }
  int64_t cap = t->storage->nbytes / sh_dtype_size(t->dtype);
  if (lo < 0 || hi >= cap)
    return sh_fail(SH_ERR_ARG, "as_strided: elements [%lld, %lld] fall outside the storage of %lld elements of %s",
                   (long long)lo, (long long)hi, (long long)cap, sh_desc(t));
  SH_TRY(new_view(out, t, "as_strided"));
  sh_tensor *v = *out;
  v->ndim = ndim;
  v->offset = offset;
  memcpy(v->shape, shape, sizeof(int64_t) * ndim);
  memcpy(v->stride, stride, sizeof(int64_t) * ndim);
  return SH_OK;
}

/* ---- shapes, iteration and checks every layer above uses ------------------------------- */

int sh_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                        int *nout, int64_t *out) {
  int n = na > nb ? na : nb;
  for (int d = 0; d < n; d++) {
    int64_t x = d < n - na ? 1 : a[d - (n - na)];
    int64_t y = d < n - nb ? 1 : b[d - (n - nb)];
    if (x != y && x != 1 && y != 1) {
      char sa[160], sb[160];
      return sh_fail(SH_ERR_ARG, "%s: shapes %s and %s do not broadcast (the %d%s dim of the result: %lld vs %lld)", op,
                     sh_shape_str(na, a, sa, sizeof sa), sh_shape_str(nb, b, sb, sizeof sb), d + 1, sh_ord(d + 1),
                     (long long)x, (long long)y);
    }
    out[d] = x == 1 ? y : x;
  }
  *nout = n;
  return SH_OK;
}

void sh_nditer_init(sh_nditer *it, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *strides, const int64_t *offsets) {
  it->ndim = ndim;
  it->nops = nops;
  for (int d = 0; d < ndim; d++) { it->shape[d] = shape[d]; it->idx[d] = 0; }
  for (int k = 0; k < nops; k++) {
    it->off[k] = offsets ? offsets[k] : 0;
    for (int d = 0; d < ndim; d++) it->strides[k][d] = strides[k][d];
  }
}

void sh_nditer_next(sh_nditer *it) {
  for (int d = it->ndim - 1; d >= 0; d--) {
    for (int k = 0; k < it->nops; k++) it->off[k] += it->strides[k][d];
    if (++it->idx[d] < it->shape[d]) return;
    for (int k = 0; k < it->nops; k++) it->off[k] -= it->strides[k][d] * it->shape[d];
    it->idx[d] = 0;
  }
}

int sh_new_like_shape(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  return sh_tensor_empty(out, ndim, shape, dtype, device);
}

int sh_check_same_device(const char *op, const sh_tensor *a, const sh_tensor *b) {
  if (a->device == b->device) return SH_OK;
  return sh_fail(SH_ERR_DEVICE, "%s: tensors on different devices: %s and %s", op, sh_desc(a), sh_desc(b));
}

int sh_check_on(const sh_tensor *t, int device, const char *op, const char *name) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  if (!t->storage) return sh_fail(SH_ERR_FREED, "%s: %s %s was used after :free()", op, name, sh_desc(t));
  if (t->device == device) return SH_OK;
  char want[16];
  return sh_fail(SH_ERR_DEVICE, "%s: %s is %s but the op runs on %s: move it first", op, name, sh_desc(t),
                 sh_device_str(device, want, sizeof want));
}

int sh_nn_check_float(const sh_tensor *t, const char *op, const char *name) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s: %s is missing (got nil)", op, name);
  if (!t->storage) return sh_fail(SH_ERR_FREED, "%s: %s %s was used after :free()", op, name, sh_desc(t));
  if (!sh_dtype_is_float(t->dtype))
    return sh_fail(SH_ERR_ARG, "%s: %s must be a float tensor (f32, bf16, f16, f64), got %s", op, name, sh_desc(t));
  return SH_OK;
}
