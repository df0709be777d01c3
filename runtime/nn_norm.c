/* nn_norm.c: layernorm and rmsnorm over the last dim, forward and backward.
 * Forward saves per-row statistics (mean and rstd = 1/sqrt(var + eps) for layernorm, rstd =
 * 1/sqrt(mean(x^2) + eps) for rmsnorm; f32 [rows]) so backward needs no second reduction
 * over x. The variance is two-pass (mean first), as PyTorch computes it, so rows with a large
 * mean keep their precision. w and b may be NULL (no affine part: weight 1, bias 0).
 * Backward runs rows in parallel; the parameter gradients are summed per thread into
 * private rows, then added to dw/db in thread order. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "backend_internal.h"
#include "nn_internal.h"
#include "nn.h"
#include "cuda_internal.h"

typedef struct norm_args {
  int64_t rows, c;
  const float *x, *w, *b, *dy;   /* w and b never NULL here: ones/zeros stand in */
  float *y, *mean, *rstd, *dx;
  float eps;
} norm_args;

/* Sum over the row of f(i), in SH_LANES lanes plus a scalar tail (see sh_lanes_sum). */
#define ROW_SUM(out, c, EXPR) do { \
    float lanes_[SH_LANES] = {0}, tail_ = 0.0f; \
    int64_t i = 0; \
    for (; i + SH_LANES <= (c); i += SH_LANES) \
      for (int k_ = 0; k_ < SH_LANES; k_++) { int64_t j = i + k_; lanes_[k_] += (EXPR); } \
    for (int64_t j = i; j < (c); j++) tail_ += (EXPR); \
    (out) = sh_lanes_sum(lanes_) + tail_; \
  } while (0)

SH_NN_SIMD static void layernorm_fwd(const void *arg, int64_t r0, int64_t r1) {
  const norm_args *a = arg;
  int64_t c = a->c;
  const float *w = a->w, *b = a->b;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * c;
    float *y = a->y + r * c;
    float s, ss;
    ROW_SUM(s, c, x[j]);
    float m = s / (float)c;
    ROW_SUM(ss, c, (x[j] - m) * (x[j] - m));
    float rs = 1.0f / sqrtf(ss / (float)c + a->eps);
#pragma omp simd
    for (int64_t i = 0; i < c; i++) y[i] = (x[i] - m) * rs * w[i] + b[i];
    a->mean[r] = m;
    a->rstd[r] = rs;
  }
}

SH_NN_SIMD static void rmsnorm_fwd(const void *arg, int64_t r0, int64_t r1) {
  const norm_args *a = arg;
  int64_t c = a->c;
  const float *w = a->w;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * c;
    float *y = a->y + r * c;
    float ss;
    ROW_SUM(ss, c, x[j] * x[j]);
    float rs = 1.0f / sqrtf(ss / (float)c + a->eps);
#pragma omp simd
    for (int64_t i = 0; i < c; i++) y[i] = x[i] * rs * w[i];
    a->rstd[r] = rs;
  }
}

/* With xhat = (x - mean) rstd and g = dy w:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw += dy xhat,  db += dy.
 * rmsnorm is the same with mean = 0 and without the mean(g) term. part_w/part_b are this
 * thread's private accumulators (part_b NULL for rmsnorm). */
SH_NN_SIMD static void norm_bwd_rows(const norm_args *a, int64_t r0, int64_t r1, int centered,
                                     float *part_w, float *part_b) {
  int64_t c = a->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = a->x + r * c, *dy = a->dy + r * c;
    float m = centered ? a->mean[r] : 0.0f, rs = a->rstd[r];
    const float *w = a->w;
    float sg = 0.0f, sgx;
    if (centered) ROW_SUM(sg, c, dy[j] * w[j]);
    ROW_SUM(sgx, c, dy[j] * w[j] * (x[j] - m) * rs);
    float mg = centered ? sg / (float)c : 0.0f, mgx = sgx / (float)c;
    if (a->dx) {
      float *dx = a->dx + r * c;
#pragma omp simd
      for (int64_t i = 0; i < c; i++) dx[i] = rs * (dy[i] * w[i] - mg - (x[i] - m) * rs * mgx);
    }
    if (part_w) {
#pragma omp simd
      for (int64_t i = 0; i < c; i++) part_w[i] += dy[i] * (x[i] - m) * rs;
    }
    if (part_b) {
#pragma omp simd
      for (int64_t i = 0; i < c; i++) part_b[i] += dy[i];
    }
  }
}

/* Runs norm_bwd_rows over all rows on the team and adds the private sums into dw/db. */
static int norm_bwd(const norm_args *a, int centered, float *dw, float *db) {
  int nt = a->rows * a->c >= SH_NN_PAR_MIN ? omp_get_max_threads() : 1;
  if (nt > a->rows) nt = a->rows > 0 ? (int)a->rows : 1;
  float *part = NULL;
  int nacc = (dw != NULL) + (db != NULL);
  if (nacc) {
    part = calloc((size_t)nt * nacc * a->c + 1, sizeof(float));
    if (!part) return sh_fail(SH_ERR_OOM, "norm backward: out of host memory for %d x %lld partial sums", nt, (long long)a->c);
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int64_t r0 = a->rows * t / n, r1 = a->rows * (t + 1) / n;
    float *pw = dw ? part + (size_t)t * nacc * a->c : NULL;
    float *pb = db ? part + (size_t)t * nacc * a->c + (dw ? a->c : 0) : NULL;
    norm_bwd_rows(a, r0, r1, centered, pw, pb);
  }
  for (int t = 0; t < nt && nacc; t++) {
    const float *pw = part + (size_t)t * nacc * a->c;
    for (int64_t i = 0; dw && i < a->c; i++) dw[i] += pw[i];
    const float *pb = pw + (dw ? a->c : 0);
    for (int64_t i = 0; db && i < a->c; i++) db[i] += pb[i];
  }
  free(part);
  return SH_OK;
}

/* Checks x [..., C], w/b [C] (or NULL), stages them in f32, and provides ones/zeros for a
 * missing w/b. Everything staged goes in st[] to be destroyed by the caller. */
typedef struct norm_stage { sh_tensor *x, *w, *b, *ones; } norm_stage;

static int stage_norm(norm_stage *st, norm_args *a, const char *op, const sh_tensor *x,
                      const sh_tensor *w, const sh_tensor *b) {
  SH_TRY(sh_nn_check_float(x, op, "x"));
  if (x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: x must have at least 1 dim [..., C], got %s", op, sh_desc(x));
  int64_t c = x->shape[x->ndim - 1];
  if (w) { SH_TRY(sh_nn_check_float(w, op, "w")); SH_TRY(sh_nn_check_shape(w, op, "w", 1, &c)); }
  if (b) { SH_TRY(sh_nn_check_float(b, op, "b")); SH_TRY(sh_nn_check_shape(b, op, "b", 1, &c)); }
  a->rows = sh_nn_rows(x);
  a->c = c;
  SH_TRY(sh_nn_f32(&st->x, x, op, "x"));
  a->x = sh_nn_ptr(st->x);
  /* one [2, C] buffer: row 0 ones (missing w), row 1 zeros (missing b) */
  if (!w || !b) {
    SH_TRY(sh_nn_zeros_f32(&st->ones, 2, (int64_t[]){2, c}));
    float *o = sh_nn_ptr(st->ones);
    for (int64_t i = 0; i < c; i++) o[i] = 1.0f;
  }
  if (w) SH_TRY(sh_nn_f32(&st->w, w, op, "w"));
  if (b) SH_TRY(sh_nn_f32(&st->b, b, op, "b"));
  a->w = w ? sh_nn_ptr(st->w) : sh_nn_ptr(st->ones);
  a->b = b ? sh_nn_ptr(st->b) : sh_nn_ptr(st->ones) + c;
  return SH_OK;
}

static void unstage_norm(norm_stage *st) {
  sh_tensor_destroy(st->x); sh_tensor_destroy(st->w); sh_tensor_destroy(st->b); sh_tensor_destroy(st->ones);
}

static int norm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x,
                        const sh_tensor *w, const sh_tensor *b, double eps, int centered, const char *op) {
  *y = NULL;
  if (mean) *mean = NULL;
  *rstd = NULL;
  if (!(eps >= 0)) return sh_fail(SH_ERR_ARG, "%s: eps must be >= 0, got %g", op, eps);
  norm_stage st = {0};
  norm_args a = {.eps = (float)eps};
  sh_tensor *yo = NULL, *mo = NULL, *ro = NULL;
  int rc = stage_norm(&st, &a, op, x, w, b);
  if (!rc) rc = sh_nn_new_f32(&yo, x->ndim, x->shape);
  if (!rc) rc = sh_nn_new_f32(&mo, x->ndim - 1, x->shape);
  if (!rc) rc = sh_nn_new_f32(&ro, x->ndim - 1, x->shape);
  if (!rc) {
    a.y = sh_nn_ptr(yo); a.mean = sh_nn_ptr(mo); a.rstd = sh_nn_ptr(ro);
    sh_nn_parallel_for(a.rows, a.rows * a.c, centered ? layernorm_fwd : rmsnorm_fwd, &a);
    rc = sh_nn_finish(&yo, x->dtype);
  }
  unstage_norm(&st);
  if (rc) { sh_tensor_destroy(yo); sh_tensor_destroy(mo); sh_tensor_destroy(ro); return rc; }
  *y = yo;
  *rstd = ro;
  if (mean) *mean = mo;
  else sh_tensor_destroy(mo);
  return SH_OK;
}

int sh_layernorm_forward(sh_tensor **y, sh_tensor **mean, sh_tensor **rstd, const sh_tensor *x,
                         const sh_tensor *w, const sh_tensor *b, double eps) {
  if (x && x->device >= 0) return sh_cuda_layernorm_forward(y, mean, rstd, x, w, b, eps);
  return norm_forward(y, mean, rstd, x, w, b, eps, 1, "layernorm");
}

int sh_rmsnorm_forward(sh_tensor **y, sh_tensor **rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  if (x && x->device >= 0) return sh_cuda_rmsnorm_forward(y, rstd, x, w, eps);
  return norm_forward(y, NULL, rstd, x, w, NULL, eps, 0, "rmsnorm");
}

static int norm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                         const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                         const sh_tensor *rstd, int centered, const char *op) {
  if (dx) *dx = NULL;
  norm_stage st = {0};
  norm_args a = {0};
  sh_tensor *dyc = NULL, *mc = NULL, *rc_ = NULL, *dxo = NULL;
  sh_nn_accum aw = {0}, ab = {0};
  int rc = stage_norm(&st, &a, op, x, w, NULL);
  if (!rc) rc = sh_nn_check_float(dy, op, "dy");
  if (!rc) rc = sh_nn_check_same_shape(dy, x, op, "dy", "x");
  if (!rc && centered) rc = sh_nn_check_float(mean, op, "mean");
  if (!rc && centered) rc = sh_nn_check_shape(mean, op, "mean", x->ndim - 1, x->shape);
  if (!rc) rc = sh_nn_check_float(rstd, op, "rstd");
  if (!rc) rc = sh_nn_check_shape(rstd, op, "rstd", x->ndim - 1, x->shape);
  if (!rc && dw && !w) rc = sh_fail(SH_ERR_ARG, "%s: dw was given but w is nil (no affine weight)", op);
  if (!rc && dw) rc = sh_nn_check_shape(dw, op, "dw", 1, &a.c);
  if (!rc && db) rc = sh_nn_check_shape(db, op, "db", 1, &a.c);
  if (!rc) rc = sh_nn_f32(&dyc, dy, op, "dy");
  if (!rc && centered) rc = sh_nn_f32(&mc, mean, op, "mean");
  if (!rc) rc = sh_nn_f32(&rc_, rstd, op, "rstd");
  if (!rc && dx) rc = sh_nn_new_f32(&dxo, x->ndim, x->shape);
  if (!rc && dw) rc = sh_nn_accum_begin(&aw, dw, op, "dw");
  if (!rc && db) rc = sh_nn_accum_begin(&ab, db, op, "db");
  if (!rc) {
    a.dy = sh_nn_ptr(dyc);
    a.mean = centered ? sh_nn_ptr(mc) : NULL;
    a.rstd = sh_nn_ptr(rc_);
    a.dx = dxo ? sh_nn_ptr(dxo) : NULL;
    rc = norm_bwd(&a, centered, dw ? sh_nn_ptr(aw.buf) : NULL, db ? sh_nn_ptr(ab.buf) : NULL);
  }
  if (!rc && dw) rc = sh_nn_accum_end(&aw);
  if (!rc && db) rc = sh_nn_accum_end(&ab);
  if (!rc && dx) rc = sh_nn_finish(&dxo, x->dtype);
  sh_nn_accum_drop(&aw); sh_nn_accum_drop(&ab);
  unstage_norm(&st);
  sh_tensor_destroy(dyc); sh_tensor_destroy(mc); sh_tensor_destroy(rc_);
  if (rc || !dx) sh_tensor_destroy(dxo);
  else *dx = dxo;
  return rc;
}

int sh_layernorm_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                          const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                          const sh_tensor *rstd) {
  if (x && x->device >= 0) return sh_cuda_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
  return norm_backward(dx, dw, db, dy, x, w, mean, rstd, 1, "layernorm_backward");
}

int sh_rmsnorm_backward(sh_tensor **dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                        const sh_tensor *w, const sh_tensor *rstd) {
  if (x && x->device >= 0) return sh_cuda_rmsnorm_backward(dx, dw, dy, x, w, rstd);
  return norm_backward(dx, dw, NULL, dy, x, w, NULL, rstd, 0, "rmsnorm_backward");
}

/* TRANSITION: kernels not yet in the table; replaced when this family is converted. */
void sh_norm_register_cpu(sh_backend *b) { (void)b; }
