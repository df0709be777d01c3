/* elementwise.c: the fronts of the elementwise ops (ops.h) and of copy_ and fill_
 * (tensor.h): dtypes and broadcast shapes planned, outputs on the operands' device, then that
 * device's kernel (cpu/elementwise.c, kernels/elementwise.cu); a copy between devices goes
 * through the memory backend. */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "ops.h"
#include "meta_backend_internal.h"
#include "core/alloc_internal.h"
#include <string.h>

/* ---- dtype rules ------------------------------------------------------------------- */

int sh_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype) {
  if (t->dtype == dtype && sh_tensor_is_contiguous(t)) return sh_tensor_alias(out, t);
  return sh_tensor_to(out, t, dtype, t->device);
}

/* ---- fronts: checks, result dtype and shape, the output on the operands' device ------- */

static int check_op(int op, int lo, int hi, const char *what) {
  if (op < lo || op > hi) return sh_fail(SH_ERR_ARG, "%s: unknown op code %d", what, op);
  return SH_OK;
}

/* A second operand: live, and on the device of the first. */
static int check_operand(const sh_tensor *t, int device, const char *op, const char *name) {
  SH_TRY(sh_tensor_check(t, op));
  return sh_check_on(t, device, op, name);
}

/* Hands the kernel's output to the caller, or frees it when the kernel failed. */
static int hand_over(sh_tensor **out, int rc) {
  if (rc) {
    sh_tensor_destroy(*out);
    *out = NULL;
  }
  return rc;
}

int sh_binary(sh_tensor **out, int op, const sh_tensor *a, const sh_tensor *b) {
  *out = NULL;
  SH_TRY(check_op(op, SH_OP_ADD, SH_OP_GT, "binary"));
  const char *name = sh_binop_name(op);
  SH_TRY(sh_tensor_check(a, name));
  SH_TRY(check_operand(b, a->device, name, "b"));
  int rdt = 0, ndim;
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(sh_binary_result(op, a->dtype, b->dtype, &rdt));
  SH_TRY(sh_broadcast_shapes(name, a->ndim, a->shape, b->ndim, b->shape, &ndim, shape));
  SH_TRY(sh_tensor_empty(out, ndim, shape, rdt, a->device));
  return hand_over(out, SH_KERNEL(name, a->device, binary, *out, op, a, b));
}

/* s is a whole number that an i64 holds (inf and 1e30 are not). */
static int is_int64(double s) { return s == floor(s) && fabs(s) < 9.2e18; }

/* The dtype a scalar takes next to a tensor of dtype dt: it never widens the tensor's
 * kind, but a fraction turns an integer computation into f32. */
static int scalar_dtype(int dt, double s) {
  if (sh_dtype_is_float(dt)) return dt;
  return is_int64(s) ? dt : SH_F32;
}

int sh_binary_scalar(sh_tensor **out, int op, const sh_tensor *a, double s, int scalar_first) {
  *out = NULL;
  SH_TRY(check_op(op, SH_OP_ADD, SH_OP_GT, "binary_scalar"));
  const char *name = sh_binop_name(op);
  SH_TRY(sh_tensor_check(a, name));
  int rdt = 0;
  SH_TRY(sh_binary_result(op, a->dtype, scalar_dtype(a->dtype, s), &rdt));
  SH_TRY(sh_tensor_empty(out, a->ndim, a->shape, rdt, a->device));
  return hand_over(out, SH_KERNEL(name, a->device, binary_scalar, *out, op, a, s, scalar_first));
}

int sh_unary(sh_tensor **out, int op, const sh_tensor *a) {
  *out = NULL;
  SH_TRY(check_op(op, SH_OP_NEG, SH_OP_SIGN, "unary"));
  const char *name = sh_unop_name(op);
  SH_TRY(sh_tensor_check(a, name));
  int rdt = 0;
  SH_TRY(sh_unary_result(op, a->dtype, &rdt));
  SH_TRY(sh_tensor_empty(out, a->ndim, a->shape, rdt, a->device));
  return hand_over(out, SH_KERNEL(name, a->device, unary, *out, op, a));
}

/* dst = dst op b in place: b must broadcast to dst, and the result must fit dst's dtype
 * (no float result into an integer tensor), as in torch. */
static int check_inplace(const sh_tensor *dst, int op, const sh_tensor *b, const char *bname) {
  const char *name = sh_binop_name(op);
  SH_TRY(sh_tensor_check(dst, name));
  SH_TRY(check_operand(b, dst->device, name, bname));
  int rdt = 0, ndim;
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(sh_binary_result(op, dst->dtype, b->dtype, &rdt));
  if (sh_dtype_is_float(rdt) && !sh_dtype_is_float(dst->dtype))
    return sh_fail(SH_ERR_ARG, "%s: result %s cannot be stored in place into %s", name, sh_dtype_name(rdt), sh_desc(dst));
  SH_TRY(sh_broadcast_shapes(name, dst->ndim, dst->shape, b->ndim, b->shape, &ndim, shape));
  if (ndim != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * ndim) != 0)
    return sh_fail(SH_ERR_ARG, "%s: %s does not broadcast to the in-place destination %s", name, sh_desc(b), sh_desc(dst));
  return SH_OK;
}

int sh_binary_(sh_tensor *dst, int op, const sh_tensor *b) {
  SH_TRY(check_op(op, SH_OP_ADD, SH_OP_GT, "binary_"));
  SH_TRY(check_inplace(dst, op, b, "b"));
  dst->version++;
  return SH_KERNEL(sh_binop_name(op), dst->device, binary_, dst, op, b);
}

int sh_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) {
  SH_TRY(check_inplace(dst, SH_OP_AXPY, x, "x"));
  dst->version++;
  return SH_KERNEL("axpy_", dst->device, axpy_, dst, alpha, x);
}

int sh_scale_(sh_tensor *dst, double alpha) {
  SH_TRY(sh_tensor_check(dst, "scale_"));
  if (dst->dtype == SH_BOOL) return sh_fail(SH_ERR_ARG, "scale_: arithmetic on bool tensors is not supported (%s)", sh_desc(dst));
  if (!sh_dtype_is_float(dst->dtype) && !is_int64(alpha))
    return sh_fail(SH_ERR_ARG, "scale_: cannot scale integer tensor %s in place by %g (not a whole number)", sh_desc(dst), alpha);
  dst->version++;
  return SH_KERNEL("scale_", dst->device, scale_, dst, alpha);
}

/* ---- copy_ and fill_ (tensor.h): within a device by its kernel, across by memcpy ------------ */

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
  if (!rc) rc = SH_KERNEL("copy_", -1, copy_, host, src);
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
  if (!rc) rc = SH_KERNEL("copy_", -1, copy_, dst, host);
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

int sh_tensor_fill_(sh_tensor *t, double value) {
  SH_TRY(sh_tensor_check(t, "fill_"));
  t->version++;
  return SH_KERNEL("fill_", t->device, fill_, t, value);
}
