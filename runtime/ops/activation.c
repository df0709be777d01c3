/* activation.c: the fronts of gelu, silu, swiglu and softmax (nn.h): checks, the output on
 * the input's device, then that device's kernel (cpu/activation.c, kernels/activation.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"

/* ---- public ops ------------------------------------------------------------------------ */

/* Clears *out, checks x (named xname: float, at least 1 dim when rows) and dy (when given:
 * float, x's shape, on x's device), and allocates *o of x's shape and dtype on x's device.
 * The caller then runs its kernel into *o and hands it over with sh_nn_give. */
static int unary_front(sh_tensor **o, sh_tensor **out, const char *op, const sh_tensor *x, const char *xname,
                       const sh_tensor *dy, int rows) {
  *out = NULL;
  SH_TRY(sh_nn_check_float(x, op, xname));
  if (dy) {
    SH_TRY(sh_nn_check_float_on(dy, x->device, op, "dy"));
    SH_TRY(sh_nn_check_same_shape(dy, x, op, "dy", xname));
  }
  if (rows && x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: %s must have at least 1 dim, got %s", op, xname, sh_desc(x));
  return sh_tensor_empty(o, x->ndim, x->shape, x->dtype, x->device);
}

/* The fronts of an activation `name` whose backward reads `saved` (x, or softmax's y): the
 * forward y and the backward dx take that tensor's shape and dtype; rows: it works on the
 * last dim, so it needs at least 1. */
#define ACTIVATION_FRONTS(name, saved, rows)                                                     \
  int sh_##name##_forward(sh_tensor **y, const sh_tensor *x) {                                  \
    sh_tensor *o = NULL;                                                                        \
    int rc = unary_front(&o, y, #name, x, "x", NULL, rows);                                     \
    if (!rc) rc = SH_KERNEL(#name, x->device, name##_forward, o, x);                            \
    return sh_nn_give(rc, o, y);                                                                \
  }                                                                                             \
  int sh_##name##_backward(sh_tensor **dx, const sh_tensor *dy, const sh_tensor *saved) {       \
    sh_tensor *o = NULL;                                                                        \
    int rc = unary_front(&o, dx, #name "_backward", saved, #saved, dy, rows);                   \
    if (!rc) rc = SH_KERNEL(#name "_backward", saved->device, name##_backward, o, dy, saved);    \
    return sh_nn_give(rc, o, dx);                                                               \
  }

ACTIVATION_FRONTS(gelu, x, 0)      /* sh_gelu_forward, sh_gelu_backward */
ACTIVATION_FRONTS(silu, x, 0)      /* sh_silu_forward, sh_silu_backward */
ACTIVATION_FRONTS(softmax, y, 1)   /* sh_softmax_forward, sh_softmax_backward */

/* a and b: float tensors of one shape, b on a's device. */
static int check_swiglu(const char *op, const sh_tensor *a, const sh_tensor *b) {
  SH_TRY(sh_nn_check_float(a, op, "a"));
  SH_TRY(sh_nn_check_float_on(b, a->device, op, "b"));
  return sh_nn_check_same_shape(a, b, op, "a", "b");
}

/* y takes a's dtype. */
int sh_swiglu_forward(sh_tensor **y, const sh_tensor *a, const sh_tensor *b) {
  const char *op = "swiglu";
  sh_tensor *o = NULL;
  *y = NULL;
  int rc = check_swiglu(op, a, b);
  if (!rc) rc = sh_tensor_empty(&o, a->ndim, a->shape, a->dtype, a->device);
  if (!rc) rc = SH_KERNEL(op, a->device, swiglu_forward, o, a, b);
  return sh_nn_give(rc, o, y);
}

/* da takes a's dtype, db b's; either may be skipped (NULL). */
int sh_swiglu_backward(sh_tensor **da, sh_tensor **db, const sh_tensor *dy, const sh_tensor *a, const sh_tensor *b) {
  const char *op = "swiglu_backward";
  sh_tensor *dao = NULL, *dbo = NULL;
  if (da) *da = NULL;
  if (db) *db = NULL;
  int rc = sh_nn_check_float(dy, op, "dy");
  if (!rc) rc = check_swiglu(op, a, b);
  if (!rc) rc = sh_check_on(dy, a->device, op, "dy");
  if (!rc) rc = sh_nn_check_same_shape(dy, a, op, "dy", "a");
  if (!rc && da) rc = sh_tensor_empty(&dao, a->ndim, a->shape, a->dtype, a->device);
  if (!rc && db) rc = sh_tensor_empty(&dbo, b->ndim, b->shape, b->dtype, a->device);
  if (!rc) rc = SH_KERNEL(op, a->device, swiglu_backward, dao, dbo, dy, a, b);
  sh_nn_give(rc, dao, da);
  return sh_nn_give(rc, dbo, db);
}

/* x (named xname) is a float tensor and p in [0, 1); *o has x's shape and dtype. */
static int dropout_front(sh_tensor **o, sh_tensor **out, const char *op, const sh_tensor *x, const char *xname, double p) {
  *out = NULL;
  if (!(p >= 0.0 && p < 1.0)) return sh_fail(SH_ERR_ARG, "%s: p must be in [0, 1), got %g", op, p);
  return unary_front(o, out, op, x, xname, NULL, 0);
}

int sh_dropout_forward(sh_tensor **y, const sh_tensor *x, double p, uint64_t seed, uint64_t offset) {
  sh_tensor *o = NULL;
  int rc = dropout_front(&o, y, "dropout", x, "x", p);
  if (!rc) rc = SH_KERNEL("dropout", x->device, dropout_forward, o, x, p, seed, offset);
  return sh_nn_give(rc, o, y);
}

int sh_dropout_backward(sh_tensor **dx, const sh_tensor *dy, double p, uint64_t seed, uint64_t offset) {
  sh_tensor *o = NULL;
  int rc = dropout_front(&o, dx, "dropout_backward", dy, "dy", p);
  if (!rc) rc = SH_KERNEL("dropout_backward", dy->device, dropout_backward, o, dy, p, seed, offset);
  return sh_nn_give(rc, o, dx);
}
