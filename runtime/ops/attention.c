/* attention.c: the fronts of causal attention and rotary embeddings (nn.h): q, k, v and
 * their gradients checked, outputs planned (or given: the _into forms) on q's device, then
 * that device's kernel (cpu/attention.c, kernels/attention.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "nn.h"

/* ---- the fronts: checks and output planning for every device ------------------------------ */

/* Checks q [B, H, T, D] and k, v [B, Hkv, T, D] (float, on q's device, Hkv dividing H, D >= 1).
 * *sc is the scale every kernel receives: the given one, or 1/sqrt(D) when it is <= 0. */
static int check_qkv(const char *op, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                     double scale, double *sc) {
  SH_TRY(sh_nn_check_float(q, op, "q"));
  SH_TRY(sh_nn_check_float_on(k, q->device, op, "k"));
  SH_TRY(sh_nn_check_float_on(v, q->device, op, "v"));
  if (q->ndim != 4) return sh_fail(SH_ERR_ARG, "%s: q must be [B, H, T, D], got %s", op, sh_desc(q));
  if (k->ndim != 4 || k->shape[0] != q->shape[0] || k->shape[2] != q->shape[2] || k->shape[3] != q->shape[3] ||
      k->shape[1] < 1 || q->shape[1] % k->shape[1] != 0)
    return sh_fail(SH_ERR_ARG, "%s: k must be [B, Hkv, T, D] with Hkv dividing q's H, got k %s and q %s", op,
                   sh_desc(k), sh_desc(q));
  SH_TRY(sh_nn_check_same_shape(v, k, op, "v", "k"));
  if (!(scale == scale)) return sh_fail(SH_ERR_ARG, "%s: scale is NaN", op);
  if (q->shape[3] < 1) return sh_fail(SH_ERR_ARG, "%s: head dim D must be >= 1, got %s", op, sh_desc(q));
  *sc = scale > 0 ? scale : 1.0 / sqrt((double)q->shape[3]);
  return SH_OK;
}

/* Rotary embeddings need an even head size and a base theta > 0. */
static int check_rope(const char *op, const sh_tensor *x, double theta) {
  if (!(theta > 0) || isinf(theta)) return sh_fail(SH_ERR_ARG, "%s: rope theta must be a finite number > 0, got %g", op, theta);
  if (x->shape[3] % 2) return sh_fail(SH_ERR_ARG, "%s: rotary embeddings need an even head dim D, got %s", op, sh_desc(x));
  return SH_OK;
}

/* out, lse = attention(q, k, v) on checked inputs. */
static int attention_fwd(const char *op, sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                         const sh_tensor *v, double sc) {
  sh_tensor *res[2] = {0};
  int rc = sh_tensor_empty(&res[0], 4, q->shape, q->dtype, q->device);
  if (!rc) rc = sh_tensor_empty(&res[1], 3, q->shape, SH_F32, q->device);
  if (!rc) rc = SH_KERNEL(op, q->device, attention_forward, res[0], res[1], q, k, v, sc);
  if (rc) { sh_tensors_destroy(res, 2); return rc; }
  *out = res[0];
  *lse = res[1];
  return SH_OK;
}

int sh_attention_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                         const sh_tensor *v, double scale) {
  const char *op = "attention";
  *out = NULL;
  *lse = NULL;
  double sc;
  SH_TRY(check_qkv(op, q, k, v, scale, &sc));
  return attention_fwd(op, out, lse, q, k, v, sc);
}

/* A caller's output: a float tensor of src's shape and dtype on its device (any strides). */
static int check_dest(const char *op, const sh_tensor *t, const sh_tensor *src, const char *name, const char *src_name) {
  SH_TRY(sh_nn_check_float_on(t, src->device, op, name));
  SH_TRY(sh_nn_check_same_shape(t, src, op, name, src_name));
  if (t->dtype != src->dtype)
    return sh_fail(SH_ERR_ARG, "%s: %s must have %s's dtype, got %s for %s", op, name, src_name, sh_desc(t), sh_desc(src));
  return SH_OK;
}

int sh_attention_forward_into(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale) {
  const char *op = "attention";
  double sc;
  SH_TRY(check_qkv(op, q, k, v, scale, &sc));
  SH_TRY(check_dest(op, out, q, "out", "q"));
  SH_TRY(sh_check_on(lse, q->device, op, "lse"));
  if (lse->dtype != SH_F32 || !sh_tensor_is_contiguous(lse))
    return sh_fail(SH_ERR_ARG, "%s: lse must be a contiguous f32 tensor, got %s", op, sh_desc(lse));
  SH_TRY(sh_nn_check_shape(lse, op, "lse", 3, q->shape));
  return SH_KERNEL(op, q->device, attention_forward, out, lse, q, k, v, sc);
}

/* Checks what backward gets beyond q, k, v: dout and out of q's shape, lse [B, H, T]. */
static int check_bwd(const char *op, const sh_tensor *dout, const sh_tensor *q, const sh_tensor *out,
                     const sh_tensor *lse) {
  int dev = q->device;
  SH_TRY(sh_nn_check_float_on(dout, dev, op, "dout"));
  SH_TRY(sh_nn_check_same_shape(dout, q, op, "dout", "q"));
  SH_TRY(sh_nn_check_float_on(out, dev, op, "out"));
  SH_TRY(sh_nn_check_same_shape(out, q, op, "out", "q"));
  SH_TRY(sh_nn_check_float_on(lse, dev, op, "lse"));
  return sh_nn_check_shape(lse, op, "lse", 3, q->shape);
}

/* A backward's start: the outputs asked for (dst[i] non-NULL) cleared, q, k, v and scale
 * checked (*sc the scale resolved), then dout, out and lse. */
static int bwd_begin(const char *op, sh_tensor **const *dst, const sh_tensor *dout, const sh_tensor *q,
                     const sh_tensor *k, const sh_tensor *v, const sh_tensor *out, const sh_tensor *lse, double scale,
                     double *sc) {
  for (int i = 0; i < 3; i++)
    if (dst[i]) *dst[i] = NULL;
  SH_TRY(check_qkv(op, q, k, v, scale, sc));
  return check_bwd(op, dout, q, out, lse);
}

/* The gradients asked for (dst[i] non-NULL) of checked inputs, each in its input's dtype
 * and shape; g[i] is NULL for the others. */
static int attention_bwd(const char *op, sh_tensor **g, sh_tensor **const *dst, const sh_tensor *dout,
                         const sh_tensor *q, const sh_tensor *k, const sh_tensor *v, const sh_tensor *out,
                         const sh_tensor *lse, double sc) {
  const sh_tensor *src[3] = {q, k, v};
  int rc = SH_OK;
  for (int i = 0; i < 3 && !rc; i++)
    if (dst[i]) rc = sh_tensor_empty(&g[i], 4, src[i]->shape, src[i]->dtype, q->device);
  if (!rc) rc = SH_KERNEL(op, q->device, attention_backward, g[0], g[1], g[2], dout, q, k, v, out, lse, sc);
  if (rc) sh_tensors_destroy(g, 3);
  return rc;
}

int sh_attention_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                          const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                          const sh_tensor *out, const sh_tensor *lse, double scale) {
  const char *op = "attention_backward";
  sh_tensor **dst[3] = {dq, dk, dv};
  double sc;
  SH_TRY(bwd_begin(op, dst, dout, q, k, v, out, lse, scale, &sc));
  sh_tensor *g[3] = {0};
  SH_TRY(attention_bwd(op, g, dst, dout, q, k, v, out, lse, sc));
  for (int i = 0; i < 3; i++)
    if (dst[i]) *dst[i] = g[i];
  return SH_OK;
}

int sh_attention_backward_into(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale) {
  const char *op = "attention_backward";
  double sc;
  SH_TRY(check_qkv(op, q, k, v, scale, &sc));
  SH_TRY(check_bwd(op, dout, q, out, lse));
  if (dq) SH_TRY(check_dest(op, dq, q, "dq", "q"));
  if (dk) SH_TRY(check_dest(op, dk, k, "dk", "k"));
  if (dv) SH_TRY(check_dest(op, dv, v, "dv", "v"));
  return SH_KERNEL(op, q->device, attention_backward, dq, dk, dv, dout, q, k, v, out, lse, sc);
}

/* *y = x rotated (inverse: back) by the device's rope kernel, x float [B, H, T, D], checked. */
static int rope_into(const char *op, sh_tensor **y, const sh_tensor *x, double theta, int inverse) {
  sh_tensor *t = NULL;
  int rc = sh_tensor_empty(&t, 4, x->shape, x->dtype, x->device);
  if (!rc) rc = SH_KERNEL(op, x->device, rope, t, x, theta, inverse);
  return sh_nn_give(rc, t, y);
}

static int rope_front(const char *op, sh_tensor **y, const sh_tensor *x, double theta, int inverse) {
  *y = NULL;
  SH_TRY(sh_nn_check_float(x, op, "x"));
  if (x->ndim != 4) return sh_fail(SH_ERR_ARG, "%s: x must be [B, H, T, D], got %s", op, sh_desc(x));
  SH_TRY(check_rope(op, x, theta));
  return rope_into(op, y, x, theta, inverse);
}

int sh_rope_forward(sh_tensor **y, const sh_tensor *x, double theta) { return rope_front("rope", y, x, theta, 0); }

int sh_rope_backward(sh_tensor **dx, const sh_tensor *dy, double theta) {
  return rope_front("rope_backward", dx, dy, theta, 1);
}

int sh_attention_rope_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale, double theta) {
  const char *op = "attention_rope";
  *out = NULL;
  *lse = NULL;
  double sc;
  SH_TRY(check_qkv(op, q, k, v, scale, &sc));
  SH_TRY(check_rope(op, q, theta));
  sh_tensor *r[2] = {0};
  int rc = rope_into(op, &r[0], q, theta, 0);
  if (!rc) rc = rope_into(op, &r[1], k, theta, 0);
  if (!rc) rc = attention_fwd(op, out, lse, r[0], r[1], v, sc);
  sh_tensors_destroy(r, 2);
  return rc;
}

int sh_attention_rope_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale, double theta) {
  const char *op = "attention_rope_backward";
  sh_tensor **dst[3] = {dq, dk, dv};
  double sc;
  SH_TRY(bwd_begin(op, dst, dout, q, k, v, out, lse, scale, &sc));
  SH_TRY(check_rope(op, q, theta));
  sh_tensor *r[2] = {0}, *g[3] = {0}, *back[2] = {0};
  int rc = rope_into(op, &r[0], q, theta, 0);
  if (!rc) rc = rope_into(op, &r[1], k, theta, 0);
  if (!rc) rc = attention_bwd(op, g, dst, dout, r[0], r[1], v, out, lse, sc);
  for (int i = 0; i < 2 && !rc; i++)   /* the gradients of the rotated q and k, rotated back */
    if (g[i]) rc = rope_into(op, &back[i], g[i], theta, 1);
  sh_tensors_destroy(r, 2);
  if (rc) { sh_tensors_destroy(g, 3); sh_tensors_destroy(back, 2); return rc; }
  for (int i = 0; i < 2; i++) { sh_tensor_destroy(g[i]); g[i] = back[i]; }
  for (int i = 0; i < 3; i++)
    if (dst[i]) *dst[i] = g[i];
  return SH_OK;
}
