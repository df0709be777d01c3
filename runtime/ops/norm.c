/* norm.c: the fronts of layernorm (with its residual fusion) and rmsnorm (nn.h): checks,
 * outputs and statistics planned on x's device, then that device's kernel (cpu/norm.c,
 * kernels/norm.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"

/* A forward's outputs: y and r of x's shape and dtype, mean and rstd f32 [...]. */
typedef struct norm_out { sh_tensor *y, *r, *mean, *rstd; } norm_out;

/* ---- public ops ------------------------------------------------------------------------ */

/* w, b, dw or db: absent, or a float [C] on x's device. */
static int check_row_param(const sh_tensor *p, const sh_tensor *x, const char *op, const char *name) {
  if (!p) return SH_OK;
  SH_TRY(sh_nn_check_float_on(p, x->device, op, name));
  return sh_nn_check_shape(p, op, name, 1, &x->shape[x->ndim - 1]);
}

/* x [..., C] and its optional w, b: what every norm takes. */
static int check_norm_input(const char *op, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  SH_TRY(sh_nn_check_float(x, op, "x"));
  if (x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: x must have at least 1 dim [..., C], got %s", op, sh_desc(x));
  SH_TRY(check_row_param(w, x, op, "w"));
  return check_row_param(b, x, op, "b");
}

/* A saved per-row statistic (mean, rstd): float [...] (x's shape less C) on x's device. */
static int check_stat(const sh_tensor *s, const sh_tensor *x, const char *op, const char *name) {
  SH_TRY(sh_nn_check_float_on(s, x->device, op, name));
  return sh_nn_check_shape(s, op, name, x->ndim - 1, x->shape);
}

/* Clears a forward's out-parameters (r and mean may be NULL) and checks eps, x, w and b. */
static int norm_check(const char *op, sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd,
                      const sh_tensor *x, const sh_tensor *w, const sh_tensor *b, double eps) {
  *y = NULL;
  if (r) *r = NULL;
  if (mean) *mean = NULL;
  *rstd = NULL;
  if (!(eps >= 0)) return sh_fail(SH_ERR_ARG, "%s: eps must be >= 0, got %g", op, eps);
  return check_norm_input(op, x, w, b);
}

/* Allocates y, rstd, and r and mean when asked for, on x's device. */
static int norm_alloc(norm_out *o, const sh_tensor *x, int with_r, int with_mean) {
  SH_TRY(sh_tensor_empty(&o->y, x->ndim, x->shape, x->dtype, x->device));
  if (with_r) SH_TRY(sh_tensor_empty(&o->r, x->ndim, x->shape, x->dtype, x->device));
  if (with_mean) SH_TRY(sh_tensor_empty(&o->mean, x->ndim - 1, x->shape, SH_F32, x->device));
  return sh_tensor_empty(&o->rstd, x->ndim - 1, x->shape, SH_F32, x->device);
}

/* Hands the outputs over when rc is SH_OK, else frees them. */
static int norm_give(int rc, norm_out *o, sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd) {
  sh_nn_give(rc, o->y, y);
  sh_nn_give(rc, o->r, r);
  sh_nn_give(rc, o->mean, mean);
  return sh_nn_give(rc, o->rstd, rstd);
}

int sh_layernorm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x,
                         const sh_tensor *w, const sh_tensor *b, double eps) {
  const char *op = "layernorm";
  norm_out o = {0};
  int rc = norm_check(op, y, NULL, mean, rstd, x, w, b, eps);
  if (!rc) rc = norm_alloc(&o, x, 0, mean != NULL);
  if (!rc) rc = SH_KERNEL(op, x->device, layernorm_forward, o.y, o.mean, o.rstd, x, w, b, eps);
  return norm_give(rc, &o, y, NULL, mean, rstd);
}

/* res is taken in x's dtype; r is computed even when the caller passes r = NULL. */
int sh_layernorm_residual_forward(sh_tensor **y, sh_tensor **r, sh_tensor **mean, sh_tensor **rstd,
                                  const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                  const sh_tensor *b, double eps) {
  const char *op = "layernorm_residual";
  norm_out o = {0};
  int rc = norm_check(op, y, r, mean, rstd, x, w, b, eps);
  if (!rc) rc = sh_nn_check_float_on(res, x->device, op, "res");
  if (!rc) rc = sh_nn_check_same_shape(res, x, op, "res", "x");
  if (!rc) rc = norm_alloc(&o, x, 1, mean != NULL);
  if (!rc) rc = SH_KERNEL(op, x->device, layernorm_residual_forward, o.y, o.r, o.mean, o.rstd, x, res, w, b, eps);
  return norm_give(rc, &o, y, r, mean, rstd);
}

int sh_rmsnorm_forward(sh_tensor **y, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  const char *op = "rmsnorm";
  norm_out o = {0};
  int rc = norm_check(op, y, NULL, NULL, rstd, x, w, NULL, eps);
  if (!rc) rc = norm_alloc(&o, x, 0, 0);
  if (!rc) rc = SH_KERNEL(op, x->device, rmsnorm_forward, o.y, o.rstd, x, w, eps);
  return norm_give(rc, &o, y, NULL, NULL, rstd);
}

/* Clears *dx, checks a backward's arguments (mean only when centered) and allocates dx (x's
 * shape and dtype) into *dxo when the caller asks for it. */
static int norm_bwd_front(const char *op, sh_tensor **dxo, sh_tensor **dx, const sh_tensor *dw, const sh_tensor *db,
                          const sh_tensor *dy, const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                          const sh_tensor *rstd, int centered) {
  if (dx) *dx = NULL;
  SH_TRY(check_norm_input(op, x, w, NULL));
  SH_TRY(sh_nn_check_float_on(dy, x->device, op, "dy"));
  SH_TRY(sh_nn_check_same_shape(dy, x, op, "dy", "x"));
  if (centered) SH_TRY(check_stat(mean, x, op, "mean"));
  SH_TRY(check_stat(rstd, x, op, "rstd"));
  if (dw && !w) return sh_fail(SH_ERR_ARG, "%s: dw was given but w is nil (no affine weight)", op);
  SH_TRY(check_row_param(dw, x, op, "dw"));
  SH_TRY(check_row_param(db, x, op, "db"));
  return dx ? sh_tensor_empty(dxo, x->ndim, x->shape, x->dtype, x->device) : SH_OK;
}

int sh_layernorm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                          const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                          const sh_tensor *rstd) {
  const char *op = "layernorm_backward";
  sh_tensor *dxo = NULL;
  int rc = norm_bwd_front(op, &dxo, dx, dw, db, dy, x, w, mean, rstd, 1);
  if (!rc) rc = SH_KERNEL(op, x->device, layernorm_backward, dxo, dw, db, dy, x, w, mean, rstd);
  return sh_nn_give(rc, dxo, dx);
}

int sh_rmsnorm_backward(sh_tensor **dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                        const sh_tensor *w, const sh_tensor *rstd) {
  const char *op = "rmsnorm_backward";
  sh_tensor *dxo = NULL;
  int rc = norm_bwd_front(op, &dxo, dx, dw, NULL, dy, x, w, NULL, rstd, 0);
  if (!rc) rc = SH_KERNEL(op, x->device, rmsnorm_backward, dxo, dw, dy, x, w, rstd);
  return sh_nn_give(rc, dxo, dx);
}
