/* linear.c: the fronts of linear and its GELU fusions (nn.h): checks, y planned on x's
 * device, then that device's kernel (cpu/linear.c, kernels/linear.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"
#include <string.h>

/* ---- fronts: checks and outputs, then the kernel of x's device ------------------------- */

/* x [..., in], w [out, in] and b [out] (or NULL), all on x's device. */
static int check_linear(const char *op, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  SH_TRY(sh_nn_check_float(x, op, "x"));
  SH_TRY(sh_nn_check_float_on(w, x->device, op, "w"));
  if (x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: x must have at least 1 dim [..., in], got %s", op, sh_desc(x));
  int64_t in = x->shape[x->ndim - 1];
  SH_TRY(sh_nn_check_shape(w, op, "w", 2, (int64_t[]){-1, in}));
  if (b) {
    SH_TRY(sh_nn_check_float_on(b, x->device, op, "b"));
    SH_TRY(sh_nn_check_shape(b, op, "b", 1, (int64_t[]){w->shape[0]}));
  }
  return SH_OK;
}

/* The shape of y (and dy): x's with the last dim w's out. */
static void linear_shape(const sh_tensor *x, const sh_tensor *w, int64_t *shape) {
  memcpy(shape, x->shape, sizeof(int64_t) * x->ndim);
  shape[x->ndim - 1] = w->shape[0];
}

/* y, and pre for the gelu fusion, in x's dtype on x's device. */
static int forward_front(const char *op, sh_tensor **y, sh_tensor **pre, const sh_tensor *x, const sh_tensor *w,
                         const sh_tensor *b) {
  *y = NULL;
  if (pre) *pre = NULL;
  SH_TRY(check_linear(op, x, w, b));
  int64_t shape[SH_MAX_DIMS];
  linear_shape(x, w, shape);
  sh_tensor *yo = NULL, *po = NULL;
  int rc = sh_tensor_empty(&yo, x->ndim, shape, x->dtype, x->device);
  if (!rc && pre) rc = sh_tensor_empty(&po, x->ndim, shape, x->dtype, x->device);
  if (!rc) rc = pre ? SH_KERNEL(op, x->device, linear_gelu_forward, yo, po, x, w, b)
                    : SH_KERNEL(op, x->device, linear_forward, yo, x, w, b);
  if (rc) { sh_tensor_destroy(yo); sh_tensor_destroy(po); return rc; }
  *y = yo;
  if (pre) *pre = po;
  return SH_OK;
}

int sh_linear_forward(sh_tensor **y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  return forward_front("linear", y, NULL, x, w, b);
}

int sh_linear_gelu_forward(sh_tensor **y, sh_tensor **pre, const sh_tensor *x, const sh_tensor *w,
                           const sh_tensor *b) {
  if (!pre) return sh_fail(SH_ERR_ARG, "linear_gelu: pre is an output of this op (backward needs it); got NULL");
  return forward_front("linear_gelu", y, pre, x, w, b);
}

/* dy has y's shape, dw w's, db [out], pre (the dgelu fusion) x's; all on x's device. */
static int check_backward(const char *op, const sh_tensor *dw, const sh_tensor *db, const sh_tensor *dy,
                          const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre) {
  SH_TRY(check_linear(op, x, w, NULL));
  SH_TRY(sh_nn_check_float_on(dy, x->device, op, "dy"));
  int64_t shape[SH_MAX_DIMS];
  linear_shape(x, w, shape);
  SH_TRY(sh_nn_check_shape(dy, op, "dy", x->ndim, shape));
  if (dw) {
    SH_TRY(sh_nn_check_float_on(dw, x->device, op, "dw"));
    SH_TRY(sh_nn_check_shape(dw, op, "dw", 2, w->shape));
  }
  if (db) {
    SH_TRY(sh_nn_check_float_on(db, x->device, op, "db"));
    SH_TRY(sh_nn_check_shape(db, op, "db", 1, (int64_t[]){w->shape[0]}));
  }
  if (pre) {
    SH_TRY(sh_nn_check_float_on(pre, x->device, op, "pre"));
    SH_TRY(sh_nn_check_same_shape(pre, x, op, "pre", "x"));
  }
  return SH_OK;
}

/* dx (dpre for the dgelu fusion, which pre selects) in x's dtype on x's device, when asked.
 * set: dw and db are written, not summed into; the kernels write dw when there are rows to
 * sum (else it is zeroed here), db is zeroed first (out elements) and summed into. */
static int backward_front(const char *op, sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                          const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set) {
  if (dx) *dx = NULL;
  SH_TRY(check_backward(op, dw, db, dy, x, w, pre));
  int set_dw = set && sh_tensor_rows(x) > 0;
  if (set && db) SH_TRY(sh_tensor_fill_(db, 0.0));
  if (set && dw && !set_dw) SH_TRY(sh_tensor_fill_(dw, 0.0));
  sh_tensor *d = NULL;
  if (dx) SH_TRY(sh_tensor_empty(&d, x->ndim, x->shape, x->dtype, x->device));
  int rc = pre ? SH_KERNEL(op, x->device, linear_backward_dgelu, d, dw, db, dy, x, w, pre, set_dw)
               : SH_KERNEL(op, x->device, linear_backward, d, dw, db, dy, x, w, set_dw);
  if (rc) { sh_tensor_destroy(d); return rc; }
  if (dx) *dx = d;
  return SH_OK;
}

int sh_linear_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                       const sh_tensor *x, const sh_tensor *w) {
  return backward_front("linear_backward", dx, dw, db, dy, x, w, NULL, 0);
}

int sh_linear_backward_set(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                           const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre) {
  const char *op = pre ? "linear_backward_dgelu" : "linear_backward";
  if (pre && !dx) return sh_fail(SH_ERR_ARG, "%s: dpre is the point of this op; got NULL", op);
  return backward_front(op, dx, dw, db, dy, x, w, pre, 1);
}

int sh_linear_backward_dgelu(sh_tensor **dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                             const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre) {
  const char *op = "linear_backward_dgelu";
  if (!dpre) return sh_fail(SH_ERR_ARG, "%s: dpre is the point of this op; got NULL", op);
  *dpre = NULL;
  if (!pre) return sh_fail(SH_ERR_ARG, "%s: pre is missing (got nil)", op);
  return backward_front(op, dpre, dw, db, dy, x, w, pre, 0);
}
