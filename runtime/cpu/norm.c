/* norm.c: layernorm and rmsnorm over the last dim, forward and backward.
 * Forward saves per-row statistics (mean and rstd = 1/sqrt(var + eps) for layernorm, rstd =
 * 1/sqrt(mean(x^2) + eps) for rmsnorm; f32 [rows]) so backward needs no second reduction
 * over x. The variance is two-pass (mean first), as PyTorch computes it, so rows with a large
 * mean keep their precision. w and b may be NULL (no affine part: weight 1, bias 0).
 * Backward runs rows in parallel; the parameter gradients are summed per thread into
 * private rows, then added to dw/db in thread order.
 * The public ops at the end check, allocate on x's device and dispatch (backend_internal.h);
 * the sh_kcpu_ kernels above them stage through f32 (staging_internal.h).
 * The fronts are ops/norm.c. */
#include <math.h>
#include <stdlib.h>
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "core/parallel.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

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

SH_CPU_KERNEL(layernorm_fwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
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
    if (a->mean) a->mean[r] = m;   /* NULL when the caller does not keep it */
    a->rstd[r] = rs;
  }
}

SH_CPU_KERNEL(rmsnorm_fwd, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
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
SH_CPU_KERNEL(norm_bwd_rows, (const norm_args *a, int64_t r0, int64_t r1, int centered, float *part_w, float *part_b),
              (a, r0, r1, centered, part_w, part_b)) {
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

typedef struct norm_bwd_job { const norm_args *a; int centered, nacc; float *part, *dw, *db; } norm_bwd_job;

/* Thread t's share of the rows, its partial dw/db sums in its own slice of part. */
static void norm_bwd_task(void *arg, int t, int n) {
  const norm_bwd_job *j = arg;
  const norm_args *a = j->a;
  int64_t r0 = a->rows * t / n, r1 = a->rows * (t + 1) / n;
  float *pw = j->dw ? j->part + (size_t)t * j->nacc * a->c : NULL;
  float *pb = j->db ? j->part + (size_t)t * j->nacc * a->c + (j->dw ? a->c : 0) : NULL;
  norm_bwd_rows(a, r0, r1, j->centered, pw, pb);
}

/* Runs norm_bwd_rows over all rows on the team and adds the private sums into dw/db. */
static int norm_bwd(const norm_args *a, int centered, float *dw, float *db) {
  int nt = a->rows * a->c >= SH_STAGE_PAR_MIN ? sh_parallel_threads() : 1;
  if (nt > a->rows) nt = a->rows > 0 ? (int)a->rows : 1;
  float *part = NULL;
  int nacc = (dw != NULL) + (db != NULL);
  if (nacc) {
    part = calloc((size_t)nt * nacc * a->c + 1, sizeof(float));
    if (!part) return sh_fail(SH_ERR_OOM, "norm backward: out of host memory for %d x %lld partial sums", nt, (long long)a->c);
  }
  norm_bwd_job job = { a, centered, nacc, part, dw, db };
  sh_parallel(nt, norm_bwd_task, &job);
  for (int t = 0; t < nt && nacc; t++) {
    const float *pw = part + (size_t)t * nacc * a->c;
    for (int64_t i = 0; dw && i < a->c; i++) dw[i] += pw[i];
    const float *pb = pw + (dw ? a->c : 0);
    for (int64_t i = 0; db && i < a->c; i++) db[i] += pb[i];
  }
  free(part);
  return SH_OK;
}

/* ---- CPU kernels ---------------------------------------------------------------------- */

/* x, w and b in f32 for the row functions, with ones/zeros standing in for a missing w/b.
 * Everything staged goes in st, destroyed by unstage_norm. */
typedef struct norm_stage { sh_tensor *x, *w, *b, *ones; } norm_stage;

static int stage_norm(norm_stage *st, norm_args *a, const char *op, const sh_tensor *x,
                      const sh_tensor *w, const sh_tensor *b) {
  int64_t c = x->shape[x->ndim - 1];
  a->rows = sh_tensor_rows(x);
  a->c = c;
  SH_TRY(sh_stage_f32(&st->x, x, op, "x"));
  a->x = sh_stage_ptr(st->x);
  /* one [2, C] buffer: row 0 ones (missing w), row 1 zeros (missing b) */
  if (!w || !b) {
    SH_TRY(sh_stage_zeros_f32(&st->ones, 2, (int64_t[]){2, c}));
    float *o = sh_stage_ptr(st->ones);
    for (int64_t i = 0; i < c; i++) o[i] = 1.0f;
  }
  if (w) SH_TRY(sh_stage_f32(&st->w, w, op, "w"));
  if (b) SH_TRY(sh_stage_f32(&st->b, b, op, "b"));
  a->w = w ? sh_stage_ptr(st->w) : sh_stage_ptr(st->ones);
  a->b = b ? sh_stage_ptr(st->b) : sh_stage_ptr(st->ones) + c;
  return SH_OK;
}

static void unstage_norm(norm_stage *st) {
  sh_tensor_destroy(st->x); sh_tensor_destroy(st->w); sh_tensor_destroy(st->b); sh_tensor_destroy(st->ones);
}

/* fn (layernorm_fwd or rmsnorm_fwd) over the rows into y, mean (NULL: not kept) and rstd. */
static int cpu_norm_forward(const char *op, sh_stage_range_fn fn, sh_tensor *y, sh_tensor *mean, sh_tensor *rstd,
                            const sh_tensor *x, const sh_tensor *w, const sh_tensor *b, double eps) {
  norm_stage st = {0};
  norm_args a = {.eps = (float)eps};
  sh_stage_accum oy = {0}, om = {0}, os = {0};
  int rc = stage_norm(&st, &a, op, x, w, b);
  if (!rc) rc = sh_stage_out_begin(&oy, y);
  if (!rc && mean) rc = sh_stage_out_begin(&om, mean);
  if (!rc) rc = sh_stage_out_begin(&os, rstd);
  if (!rc) {
    a.y = sh_stage_ptr(oy.buf); a.mean = mean ? sh_stage_ptr(om.buf) : NULL; a.rstd = sh_stage_ptr(os.buf);
    sh_stage_parallel_for(a.rows, a.rows * a.c, fn, &a);
    rc = sh_stage_accum_end(&oy);
  }
  if (!rc && mean) rc = sh_stage_accum_end(&om);
  if (!rc) rc = sh_stage_accum_end(&os);
  sh_stage_accum_drop(&oy); sh_stage_accum_drop(&om); sh_stage_accum_drop(&os);
  unstage_norm(&st);
  return rc;
}

int sh_kcpu_layernorm_forward(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                              const sh_tensor *w, const sh_tensor *b, double eps) {
  return cpu_norm_forward("layernorm", layernorm_fwd, y, mean, rstd, x, w, b, eps);
}

int sh_kcpu_rmsnorm_forward(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  return cpu_norm_forward("rmsnorm", rmsnorm_fwd, y, NULL, rstd, x, w, NULL, eps);
}

/* The composition: r = x + res rounded to r's dtype (res first taken in that dtype, as the
 * fused CUDA kernel reads it), then layernorm(r). */
int sh_kcpu_layernorm_residual_forward(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                       const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                       const sh_tensor *b, double eps) {
  SH_TRY(sh_kernel_copy_(r, res));
  SH_TRY(sh_kcpu_binary_(r, SH_OP_ADD, x));
  return sh_kcpu_layernorm_forward(y, mean, rstd, r, w, b, eps);
}

/* mean is NULL for rmsnorm (no centring); dx, dw and db may each be NULL. */
static int cpu_norm_backward(const char *op, sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                             const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean, const sh_tensor *rstd) {
  norm_stage st = {0};
  norm_args a = {0};
  sh_tensor *dyc = NULL, *mc = NULL, *rsc = NULL;
  sh_stage_accum odx = {0}, aw = {0}, ab = {0};
  int rc = stage_norm(&st, &a, op, x, w, NULL);
  if (!rc) rc = sh_stage_f32(&dyc, dy, op, "dy");
  if (!rc && mean) rc = sh_stage_f32(&mc, mean, op, "mean");
  if (!rc) rc = sh_stage_f32(&rsc, rstd, op, "rstd");
  if (!rc && dx) rc = sh_stage_out_begin(&odx, dx);
  if (!rc && dw) rc = sh_stage_accum_begin(&aw, dw, op, "dw");
  if (!rc && db) rc = sh_stage_accum_begin(&ab, db, op, "db");
  if (!rc) {
    a.dy = sh_stage_ptr(dyc);
    a.mean = mc ? sh_stage_ptr(mc) : NULL;
    a.rstd = sh_stage_ptr(rsc);
    a.dx = dx ? sh_stage_ptr(odx.buf) : NULL;
    rc = norm_bwd(&a, mean != NULL, dw ? sh_stage_ptr(aw.buf) : NULL, db ? sh_stage_ptr(ab.buf) : NULL);
  }
  if (!rc && dx) rc = sh_stage_accum_end(&odx);
  if (!rc && dw) rc = sh_stage_accum_end(&aw);
  if (!rc && db) rc = sh_stage_accum_end(&ab);
  sh_stage_accum_drop(&odx); sh_stage_accum_drop(&aw); sh_stage_accum_drop(&ab);
  unstage_norm(&st);
  sh_tensor_destroy(dyc); sh_tensor_destroy(mc); sh_tensor_destroy(rsc);
  return rc;
}

int sh_kcpu_layernorm_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                               const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                               const sh_tensor *rstd) {
  return cpu_norm_backward("layernorm_backward", dx, dw, db, dy, x, w, mean, rstd);
}

int sh_kcpu_rmsnorm_backward(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                             const sh_tensor *w, const sh_tensor *rstd) {
  return cpu_norm_backward("rmsnorm_backward", dx, dw, NULL, dy, x, w, NULL, rstd);
}
