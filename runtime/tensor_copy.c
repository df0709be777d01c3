/* tensor_copy.c: broadcasting, N-d iteration, and copies between dtypes and devices. */
#include "backend_internal.h"
#include "tensor_internal.h"
#include "alloc_internal.h"
#include "meta_internal.h"
#include "bf16_internal.h"
#include "parallel.h"
#include <math.h>
#include <string.h>

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

void sh_broadcast_strides(const sh_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++)
    strides[d] = (d < lead || (t->shape[d - lead] == 1 && shape[d] != 1)) ? 0 : t->stride[d - lead];
}

int sh_new_like_shape(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device) {
  return sh_tensor_empty(out, ndim, shape, dtype, device);
}

int sh_check_same_device(const char *op, const sh_tensor *a, const sh_tensor *b) {
  if (a->device == b->device) return SH_OK;
  return sh_fail(SH_ERR_DEVICE, "%s: tensors on different devices: %s and %s", op, sh_desc(a), sh_desc(b));
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

/* n elements at element strides ds and ss from dtype st to dt: bf16 <-> f32 (every
 * mixed-precision op's staging) through bf16_vec.c, same dtypes as bits, the rest element by
 * element. */
static void convert_run(char *d, int64_t ds, int dt, const char *s, int64_t ss, int st, int64_t n) {
  if (dt == SH_F32 && st == SH_BF16) { sh_bf16_to_f32_n((float *)d, ds, (const uint16_t *)s, ss, n); return; }
  if (dt == SH_BF16 && st == SH_F32) { sh_f32_to_bf16_n((uint16_t *)d, ds, (const float *)s, ss, n); return; }
  if (dt == st) {
    int size = sh_dtype_size(dt);
    if (ds == 1 && ss == 1) { memcpy(d, s, (size_t)(n * size)); return; }
    switch (size) {
      case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i * ds] = ((const uint32_t *)s)[i * ss]; return;
      case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)d)[i * ds] = ((const uint64_t *)s)[i * ss]; return;
      case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i * ds] = ((const uint16_t *)s)[i * ss]; return;
      default: for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss]; return;
    }
  }
  for (int64_t i = 0; i < n; i++) sh_store(d, dt, i * ds, sh_load(s, st, i * ss));
}

typedef struct convert_job { char *dst; const char *src; int dt, st; int64_t n; } convert_job;

/* Vectors v0 .. v1 of 16 elements; the last one also takes the tail. */
static void convert_task(void *arg, int64_t v0, int64_t v1) {
  const convert_job *j = arg;
  int64_t a = v0 * 16, b = v1 == j->n / 16 ? j->n : v1 * 16;
  convert_run(j->dst + a * sh_dtype_size(j->dt), 1, j->dt, j->src + a * sh_dtype_size(j->st), 1, j->st, b - a);
}

/* A contiguous conversion, split over the threads when large (in whole vectors of 16). */
static void convert_contiguous(void *dst, int dt, const void *src, int st, int64_t n) {
  if (dt == st || n <= (1 << 16)) { convert_run(dst, 1, dt, src, 1, st, n); return; }
  convert_job job = { dst, src, dt, st, n };
  sh_parallel_for(n / 16, 1, convert_task, &job);
}

/* A strided copy seen as rows along the last dim (src strides already broadcast). */
typedef struct copy_plan {
  char *d;
  const char *s;
  int dt, st, dsz, ssz, last;
  const int64_t *shape, *dstride, *sstride;
} copy_plan;

/* Rows r0 .. r1: the first row's index by division, the next ones advanced like an odometer
 * (a division per row cost more than converting a row of 32). */
static void copy_rows(const copy_plan *p, int64_t r0, int64_t r1) {
  int64_t idx[SH_MAX_DIMS], od = 0, os = 0, r = r0, row = p->shape[p->last];
  for (int d = p->last - 1; d >= 0; d--) {
    idx[d] = r % p->shape[d];
    r /= p->shape[d];
    od += idx[d] * p->dstride[d];
    os += idx[d] * p->sstride[d];
  }
  for (int64_t k = r0; k < r1; k++) {
    convert_run(p->d + od * p->dsz, p->dstride[p->last], p->dt, p->s + os * p->ssz, p->sstride[p->last], p->st, row);
    for (int d = p->last - 1; d >= 0; d--) {
      od += p->dstride[d];
      os += p->sstride[d];
      if (++idx[d] < p->shape[d]) break;
      od -= p->dstride[d] * p->shape[d];
      os -= p->sstride[d] * p->shape[d];
      idx[d] = 0;
    }
  }
}

static void copy_task(void *p, int64_t r0, int64_t r1) { copy_rows(p, r0, r1); }

static int cpu_copy_(sh_tensor *dst, const sh_tensor *src) {
  int64_t n = sh_tensor_numel(dst);
  int same_shape = dst->ndim == src->ndim && memcmp(dst->shape, src->shape, sizeof(int64_t) * dst->ndim) == 0;
  if (same_shape && sh_tensor_is_contiguous(dst) && sh_tensor_is_contiguous(src)) {
    convert_contiguous(sh_tensor_data(dst), dst->dtype, sh_tensor_data(src), src->dtype, n);
    return SH_OK;
  }
  if (n == 0) return SH_OK;
  int64_t sstride[SH_MAX_DIMS];
  sh_broadcast_strides(src, dst->ndim, dst->shape, sstride);
  copy_plan p = { sh_tensor_data(dst), sh_tensor_data(src), dst->dtype, src->dtype, sh_dtype_size(dst->dtype),
                  sh_dtype_size(src->dtype), dst->ndim - 1, dst->shape, dst->stride, sstride };
  if (dst->ndim == 0) { convert_run(p.d, 1, p.dt, p.s, 1, p.st, 1); return SH_OK; }
  int64_t rows = n / dst->shape[p.last];
  if (n <= (1 << 16)) { copy_rows(&p, 0, rows); return SH_OK; }
  sh_parallel_for(rows, 1, copy_task, &p);   /* rows spread over the threads when the copy is big */
  return SH_OK;
}

/* Copies a contiguous same-dtype block between devices through the registered backend. */
static int copy_across(sh_tensor *dst, const sh_tensor *src) {
  const sh_mem_backend *cuda = sh_mem_cuda();
  if (!cuda) return sh_fail(SH_ERR_DEVICE, "copy: %s -> %s needs CUDA, which this build or machine lacks", sh_desc(src), sh_desc(dst));
  return cuda->copy(dst->device, sh_tensor_data(dst), src->device, sh_tensor_data(src),
                    (size_t)(sh_tensor_numel(dst) * sh_dtype_size(dst->dtype)));
}

/* A copy within dst's device, by that device's kernel. */
static int copy_within(sh_tensor *dst, const sh_tensor *src) {
  return SH_KERNEL("copy_", dst->device, copy_, dst, src);
}

/* *img = t when it is contiguous, else a contiguous copy of it on its own device (*owned is
 * that copy, for the caller to destroy; NULL when t was used as it is). */
static int contiguous_image(const sh_tensor **img, sh_tensor **owned, const sh_tensor *t) {
  *img = t;
  *owned = NULL;
  if (sh_tensor_is_contiguous(t)) return SH_OK;
  SH_TRY(sh_tensor_empty(owned, t->ndim, t->shape, t->dtype, t->device));
  *img = *owned;
  return copy_within(*owned, t);
}

/* Moves the contiguous image img to dst's device and places it in dst: straight into dst
 * when dst is a contiguous tensor of img's dtype and shape, else through a contiguous buffer
 * that dst's device then copies from (converting, broadcasting, striding). */
static int transfer_into(sh_tensor *dst, const sh_tensor *img) {
  int direct = sh_tensor_is_contiguous(dst) && dst->dtype == img->dtype && dst->ndim == img->ndim &&
               memcmp(dst->shape, img->shape, sizeof(int64_t) * dst->ndim) == 0;
  if (direct) return copy_across(dst, img);
  sh_tensor *buf = NULL;
  int rc = sh_tensor_empty(&buf, img->ndim, img->shape, img->dtype, dst->device);
  if (!rc) rc = copy_across(buf, img);
  if (!rc) rc = copy_within(dst, buf);
  sh_tensor_destroy(buf);
  return rc;
}

/* Host -> device: convert and broadcast on the host into dst's dtype and shape, transfer. */
static int copy_from_host(sh_tensor *dst, const sh_tensor *src) {
  sh_tensor *host = NULL;
  int rc = sh_tensor_empty(&host, dst->ndim, dst->shape, dst->dtype, -1);
  if (!rc) rc = cpu_copy_(host, src);
  if (!rc) rc = transfer_into(dst, host);
  sh_tensor_destroy(host);
  return rc;
}

/* Device -> host: transfer a contiguous image of src, then convert and broadcast on the host. */
static int copy_to_host(sh_tensor *dst, const sh_tensor *src) {
  const sh_tensor *img;
  sh_tensor *dev = NULL, *host = NULL;
  int rc = contiguous_image(&img, &dev, src);
  if (!rc) rc = sh_tensor_empty(&host, src->ndim, src->shape, src->dtype, -1);
  if (!rc) rc = copy_across(host, img);
  if (!rc) rc = cpu_copy_(dst, host);
  sh_tensor_destroy(host);
  sh_tensor_destroy(dev);
  return rc;
}

/* Device -> another device: a contiguous image of src goes over by the peer copy; dst's
 * device converts and broadcasts. */
static int copy_between_devices(sh_tensor *dst, const sh_tensor *src) {
  const sh_tensor *img;
  sh_tensor *dev = NULL;
  int rc = contiguous_image(&img, &dev, src);
  if (!rc) rc = transfer_into(dst, img);
  sh_tensor_destroy(dev);
  return rc;
}

int sh_tensor_copy_(sh_tensor *dst, const sh_tensor *src) {
  SH_TRY(sh_tensor_check(dst, "copy_"));
  SH_TRY(sh_tensor_check(src, "copy_"));
  int nout;
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(sh_broadcast_shapes("copy_", dst->ndim, dst->shape, src->ndim, src->shape, &nout, shape));
  if (nout != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * nout) != 0)
    return sh_fail(SH_ERR_ARG, "copy_: source %s does not broadcast to destination %s", sh_desc(src), sh_desc(dst));
  dst->version++;
  /* Across devices the bytes move between contiguous images of the same dtype and shape;
   * dtype conversion and any striding happen on one side (the host, or a device's copy_). */
  if (dst->device == src->device) return copy_within(dst, src);
  if (sh_is_meta(dst->device) || sh_is_meta(src->device)) return sh_meta_copy_across(dst, src);
  if (src->device < 0) return copy_from_host(dst, src);
  if (dst->device < 0) return copy_to_host(dst, src);
  return copy_between_devices(dst, src);
}

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

static int cpu_fill_(sh_tensor *t, double value) {
  int64_t n = sh_tensor_numel(t);
  if (sh_tensor_is_contiguous(t)) {
    void *d = sh_tensor_data(t);
    if (value == 0 && !signbit(value)) { memset(d, 0, (size_t)(n * sh_dtype_size(t->dtype))); return SH_OK; }  /* +0: all bits 0 in every dtype */
    if (t->dtype == SH_F32) { float v = (float)value; for (int64_t i = 0; i < n; i++) ((float *)d)[i] = v; }
    else if (t->dtype == SH_BF16) {   /* rounded once */
      uint16_t v = sh_f32_to_bf16_inline((float)value);
      for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = v;
    } else for (int64_t i = 0; i < n; i++) sh_store(d, t->dtype, i, value);
    return SH_OK;
  }
  const int64_t *strides[1] = {t->stride};
  sh_nditer it;
  sh_nditer_init(&it, t->ndim, t->shape, 1, strides, &t->offset);
  for (int64_t i = 0; i < n; i++, sh_nditer_next(&it)) sh_store(t->storage->data, t->dtype, it.off[0], value);
  return SH_OK;
}

int sh_tensor_fill_(sh_tensor *t, double value) {
  SH_TRY(sh_tensor_check(t, "fill_"));
  t->version++;
  return SH_KERNEL("fill_", t->device, fill_, t, value);
}

int sh_tensor_item(const sh_tensor *t, double *out) {
  SH_TRY(require_cpu(t, "item"));
  if (sh_tensor_numel(t) != 1)
    return sh_fail(SH_ERR_ARG, "item: needs a tensor with one element, got %s", sh_desc(t));
  *out = sh_load(t->storage->data, t->dtype, t->offset);
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
  *out = sh_load(t->storage->data, t->dtype, off);
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
  for (int64_t i = 0; i < n; i++, sh_nditer_next(&it)) out[i] = sh_load(t->storage->data, t->dtype, it.off[0]);
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

void sh_copy_register_cpu(sh_backend *b) {
  b->copy_ = cpu_copy_;
  b->fill_ = cpu_fill_;
}
