/* test_nn.c: the CPU kernels of nn.h and optim.h against straightforward f64 code.
 * For each op: the kernel's forward against an f64 reference forward; the kernel's backward
 * (with dy = r, r random) against an f64 analytic backward; and that analytic backward
 * against central finite differences of L = sum(reference_forward(inputs) * r), so the
 * reference itself is checked and is not just the kernel written twice. Shapes include
 * sizes that are not multiples of the kernels' blocks or vector widths, and sizes large
 * enough to take the multi-threaded paths. Optimizers: several steps against an f64 loop of
 * PyTorch's formulas.
 *
 * Tolerance: f32 kernels against f64 references, max abs error <= 1e-5 of the reference's
 * max abs value (TOL), unless a check says why it needs more. */
#include "check_cpu.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/nn.h"          /* after tensor.h: the FFI headers declare no types of their own */
#include "ops/optim.h"
#include "ops/ops.h"
#include "cpu/attn_blocks_internal.h"
#include "core/philox_internal.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5
#define FD_TOL 1e-6   /* f64 central differences with h = 1e-4: truncation ~h^2 */

/* ---- helpers ------------------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {          /* xorshift64*, uniform in [0, 1) */
  rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
  return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static double *rvec(int64_t n, double lo, double hi) {
  double *v = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * urand();
  return v;
}
static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}
/* A tensor with the given values (zeros when vals is NULL). */
static sh_tensor *mk(int ndim, const int64_t *shape, int dtype, const double *vals) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, ndim, shape, dtype, -1));
  int64_t n = numel_of(ndim, shape);
  double *z = vals ? NULL : calloc((size_t)n + 1, sizeof(double));
  CHECK_OK(sh_tensor_write_f64(t, vals ? vals : z));
  free(z);
  return t;
}
static sh_tensor *mkf(int ndim, const int64_t *shape, const double *vals) { return mk(ndim, shape, SH_F32, vals); }
/* Values rounded to f32, as the kernels will see them; the references use these. */
static void round_f32(double *v, int64_t n) { for (int64_t i = 0; i < n; i++) v[i] = (float)v[i]; }
static double *rd(const sh_tensor *t) {
  int64_t n = sh_tensor_numel(t);
  double *v = malloc(sizeof(double) * (size_t)(n + 1));
  CHECK_OK(sh_tensor_read_f64(t, v));
  return v;
}
/* max |a - ref| / max |ref|; absolute when ref is all zeros (there an FMA may leave a
 * rounding residue where the f64 reference cancels exactly) */
static double rel_err(const double *a, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(a[i] - ref[i]);
    if (!(e <= num)) num = e;          /* NaN propagates as a failure */
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  return num == 0 ? 0 : (den == 0 ? num : num / den);
}
/* Compares t (shape and values) with ref, then destroys t. */
static void check_tensor(const char *what, sh_tensor *t, const double *ref, int ndim, const int64_t *shape, double tol) {
  CHECK(t != NULL, "%s: no tensor", what);
  if (!t) return;
  int same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  CHECK(same, "%s: wrong shape %d dims", what, t->ndim);
  if (same) {
    double *v = rd(t), e = rel_err(v, ref, numel_of(ndim, shape));
    CHECK(e <= tol, "%s: relative error %.3g > %g", what, e, tol);
    free(v);
  }
  sh_tensor_destroy(t);
}
static void check_vals(const char *what, const sh_tensor *t, const double *ref, double tol) {
  double *v = rd(t), e = rel_err(v, ref, sh_tensor_numel(t));
  CHECK(e <= tol, "%s: relative error %.3g > %g", what, e, tol);
  free(v);
}

/* ---- finite differences of the f64 references ---------------------------------------- */

typedef void (*ref_fwd_fn)(const void *ctx, double *const *in, double *out);
typedef struct fd_spec {
  const void *ctx;
  ref_fwd_fn fwd;
  int nin;
  int64_t n_in[4], nout;
  double *in[4];
} fd_spec;

static double ref_loss(const fd_spec *s, const double *r) {
  double *out = malloc(sizeof(double) * (size_t)(s->nout + 1)), L = 0;
  s->fwd(s->ctx, (double *const *)s->in, out);
  for (int64_t i = 0; i < s->nout; i++) L += out[i] * r[i];
  free(out);
  return L;
}

/* The analytic gradients g[k] of L = sum(fwd(in) r) against central differences, on every
 * coordinate of small inputs and 40 random ones of large inputs. g[k] NULL skips input k. */
static void fd_check(const char *what, const fd_spec *s, const double *r, double *const *g) {
  const double h = 1e-4;
  for (int k = 0; k < s->nin; k++) {
    if (!g[k]) continue;
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < s->n_in[k]; i++) if (fabs(g[k][i]) > scale) scale = fabs(g[k][i]);
    int64_t m = s->n_in[k] <= 80 ? s->n_in[k] : 40;
    for (int64_t c = 0; c < m; c++) {
      int64_t i = s->n_in[k] <= 80 ? c : (int64_t)(urand() * s->n_in[k]);
      double keep = s->in[k][i];
      s->in[k][i] = keep + h;
      double lp = ref_loss(s, r);
      s->in[k][i] = keep - h;
      double lm = ref_loss(s, r);
      s->in[k][i] = keep;
      double e = fabs((lp - lm) / (2 * h) - g[k][i]);
      if (!(e <= worst)) worst = e;
    }
    CHECK(worst <= FD_TOL * (scale > 1 ? scale : 1), "%s: input %d: analytic vs finite differences %.3g (scale %.3g)",
          what, k, worst, scale);
  }
}

/* ---- linear --------------------------------------------------------------------------- */

typedef struct lin_ctx { int64_t M, K, N; int has_b; } lin_ctx;

static void lin_ref(const void *c_, double *const *in, double *y) {
  const lin_ctx *c = c_;
  for (int64_t m = 0; m < c->M; m++)
    for (int64_t n = 0; n < c->N; n++) {
      double s = c->has_b ? in[2][n] : 0;
      for (int64_t k = 0; k < c->K; k++) s += in[0][m * c->K + k] * in[1][n * c->K + k];
      y[m * c->N + n] = s;
    }
}

static void lin_ref_bwd(const lin_ctx *c, double *const *in, const double *dy, double *dx, double *dw, double *db) {
  memset(dx, 0, sizeof(double) * (size_t)(c->M * c->K));
  memset(dw, 0, sizeof(double) * (size_t)(c->N * c->K));
  memset(db, 0, sizeof(double) * (size_t)c->N);
  for (int64_t m = 0; m < c->M; m++)
    for (int64_t n = 0; n < c->N; n++) {
      double g = dy[m * c->N + n];
      db[n] += g;
      for (int64_t k = 0; k < c->K; k++) {
        dx[m * c->K + k] += g * in[1][n * c->K + k];
        dw[n * c->K + k] += g * in[0][m * c->K + k];
      }
    }
}

/* x [A, M/A, K] (two leading dims), w [N, K], b [N] or none; dw is accumulated into a
 * strided (transposed) view when strided_dw, so the copy-back path runs too. */
static void test_linear_case(int64_t A, int64_t M, int64_t K, int64_t N, int has_b, int strided_dw, int xdtype) {
  lin_ctx c = {M, K, N, has_b};
  double *x = rvec(M * K, -1, 1), *w = rvec(N * K, -1, 1), *b = rvec(N, -1, 1), *r = rvec(M * N, -1, 1);
  if (xdtype == SH_BF16) for (int64_t i = 0; i < M * K; i++) x[i] = sh_bf16_to_f32(sh_f32_to_bf16((float)x[i]));
  round_f32(x, M * K); round_f32(w, N * K); round_f32(b, N); round_f32(r, M * N);
  int64_t xs[3] = {A, M / A, K}, ws[2] = {N, K}, bs[1] = {N}, ys[3] = {A, M / A, N};
  sh_tensor *tx = mk(3, xs, xdtype, x), *tw = mkf(2, ws, w), *tb = mkf(1, bs, b), *tr = mkf(3, ys, r);
  double *yref = malloc(sizeof(double) * (size_t)(M * N));
  double *in[3] = {x, w, b};
  lin_ref(&c, in, yref);
  char what[120];
  snprintf(what, sizeof what, "linear M=%lld K=%lld N=%lld b=%d", (long long)M, (long long)K, (long long)N, has_b);
  sh_tensor *y = NULL;
  CHECK_OK(sh_linear_forward(&y, tx, tw, has_b ? tb : NULL));
  CHECK(!y || y->dtype == xdtype, "%s: y dtype %d", what, y ? y->dtype : -1);
  /* bf16 output: rounding to 8 bits of mantissa */
  check_tensor(what, y, yref, 3, ys, xdtype == SH_BF16 ? 8e-3 : TOL);

  double *dx = malloc(sizeof(double) * (size_t)(M * K)), *dw = malloc(sizeof(double) * (size_t)(N * K)), *db = malloc(sizeof(double) * (size_t)N);
  lin_ref_bwd(&c, in, r, dx, dw, db);
  fd_spec s = {&c, lin_ref, has_b ? 3 : 2, {M * K, N * K, N}, M * N, {x, w, b}};
  fd_check(what, &s, r, (double *[]){dx, dw, db});

  /* dw and db start at 0 and the backward runs twice: they must hold twice the gradient */
  sh_tensor *dwbuf = mkf(2, (int64_t[]){K, N}, NULL), *dwt = NULL, *tdw = NULL;
  CHECK_OK(sh_view_transpose(&dwt, dwbuf, 0, 1));
  tdw = strided_dw ? dwt : mkf(2, ws, NULL);
  sh_tensor *tdb = mkf(1, bs, NULL), *tdx = NULL;
  for (int rep = 0; rep < 2; rep++) {
    CHECK_OK(sh_linear_backward(&tdx, tdw, has_b ? tdb : NULL, tr, tx, tw));
    if (rep == 0) check_tensor(what, tdx, dx, 3, xs, xdtype == SH_BF16 ? 8e-3 : TOL);
    else sh_tensor_destroy(tdx);
  }
  for (int64_t i = 0; i < N * K; i++) dw[i] *= 2;
  for (int64_t i = 0; i < N; i++) db[i] *= 2;
  check_vals("linear dw accumulated twice", tdw, dw, TOL);
  if (has_b) check_vals("linear db accumulated twice", tdb, db, TOL);
  /* only dx wanted */
  CHECK_OK(sh_linear_backward(&tdx, NULL, NULL, tr, tx, tw));
  sh_tensor_destroy(tdx);

  sh_tensor_destroy(dwbuf); sh_tensor_destroy(dwt);
  if (!strided_dw) sh_tensor_destroy(tdw);
  sh_tensor_destroy(tdb); sh_tensor_destroy(tx); sh_tensor_destroy(tw); sh_tensor_destroy(tb); sh_tensor_destroy(tr);
  free(x); free(w); free(b); free(r); free(yref); free(dx); free(dw); free(db);
}

static void test_linear(void) {
  test_linear_case(2, 6, 5, 4, 1, 0, SH_F32);
  test_linear_case(1, 7, 3, 9, 0, 1, SH_F32);
  test_linear_case(3, 3 * 65, 33, 17, 1, 1, SH_F32);
  test_linear_case(2, 8, 16, 12, 1, 0, SH_BF16);
  /* past sh_sgemm's split threshold: each product is split over the threads */
  test_linear_case(2, 600, 64, 48, 1, 0, SH_F32);

  sh_tensor *x = mkf(2, (int64_t[]){3, 5}, NULL), *w = mkf(2, (int64_t[]){4, 6}, NULL), *y = (sh_tensor *)1;
  CHECK_FAILS(sh_linear_forward(&y, x, w, NULL), SH_ERR_ARG, "f32[4,6]");
  CHECK(y == NULL, "linear: *y must be NULL after an error");
  sh_tensor *xi = mk(2, (int64_t[]){3, 5}, SH_I64, NULL), *w2 = mkf(2, (int64_t[]){4, 5}, NULL), *b3 = mkf(1, (int64_t[]){3}, NULL);
  CHECK_FAILS(sh_linear_forward(&y, xi, w2, NULL), SH_ERR_ARG, "must be a float tensor");
  CHECK_FAILS(sh_linear_forward(&y, x, w2, b3), SH_ERR_ARG, "b must have shape [4]");
  sh_tensor *dy = mkf(2, (int64_t[]){3, 3}, NULL), *dx = NULL;
  CHECK_FAILS(sh_linear_backward(&dx, NULL, NULL, dy, x, w2), SH_ERR_ARG, "dy must have shape [3,4]");
  sh_tensor_destroy(x); sh_tensor_destroy(w); sh_tensor_destroy(xi); sh_tensor_destroy(w2);
  sh_tensor_destroy(b3); sh_tensor_destroy(dy);
}

/* ---- layernorm / rmsnorm -------------------------------------------------------------- */

typedef struct norm_ctx { int64_t rows, C; int centered, has_w, has_b; double eps; } norm_ctx;

static void norm_stats(const norm_ctx *c, const double *x, int64_t r, double *mean, double *rstd) {
  double m = 0, v = 0;
  if (c->centered) { for (int64_t i = 0; i < c->C; i++) m += x[r * c->C + i]; m /= c->C; }
  for (int64_t i = 0; i < c->C; i++) v += (x[r * c->C + i] - m) * (x[r * c->C + i] - m);
  *mean = m;
  *rstd = 1 / sqrt(v / c->C + c->eps);
}

static void norm_ref(const void *c_, double *const *in, double *y) {
  const norm_ctx *c = c_;
  for (int64_t r = 0; r < c->rows; r++) {
    double m, rs;
    norm_stats(c, in[0], r, &m, &rs);
    for (int64_t i = 0; i < c->C; i++)
      y[r * c->C + i] = (in[0][r * c->C + i] - m) * rs * (c->has_w ? in[1][i] : 1) + (c->has_b ? in[2][i] : 0);
  }
}

static void norm_ref_bwd(const norm_ctx *c, double *const *in, const double *dy, double *dx, double *dw, double *db) {
  memset(dw, 0, sizeof(double) * (size_t)c->C);
  memset(db, 0, sizeof(double) * (size_t)c->C);
  for (int64_t r = 0; r < c->rows; r++) {
    double m, rs, sg = 0, sgx = 0;
    norm_stats(c, in[0], r, &m, &rs);
    const double *x = in[0] + r * c->C, *g = dy + r * c->C;
    for (int64_t i = 0; i < c->C; i++) {
      double gi = g[i] * (c->has_w ? in[1][i] : 1), xh = (x[i] - m) * rs;
      sg += gi; sgx += gi * xh;
      dw[i] += g[i] * xh;
      db[i] += g[i];
    }
    for (int64_t i = 0; i < c->C; i++) {
      double gi = g[i] * (c->has_w ? in[1][i] : 1), xh = (x[i] - m) * rs;
      dx[r * c->C + i] = rs * (gi - (c->centered ? sg / c->C : 0) - xh * sgx / c->C);
    }
  }
}

static void test_norm_case(int64_t A, int64_t rows, int64_t C, int centered, int has_w, int has_b) {
  norm_ctx c = {rows, C, centered, has_w, has_b && centered, 1e-5};
  double *x = rvec(rows * C, -2, 3), *w = rvec(C, 0.5, 1.5), *b = rvec(C, -1, 1), *r = rvec(rows * C, -1, 1);
  round_f32(x, rows * C); round_f32(w, C); round_f32(b, C); round_f32(r, rows * C);
  int64_t xs[3] = {A, rows / A, C}, cs[1] = {C};
  sh_tensor *tx = mkf(3, xs, x), *tw = mkf(1, cs, w), *tb = mkf(1, cs, b), *tr = mkf(3, xs, r);
  double *in[3] = {x, w, b}, *yref = malloc(sizeof(double) * (size_t)(rows * C));
  double *mref = malloc(sizeof(double) * (size_t)rows), *rref = malloc(sizeof(double) * (size_t)rows);
  norm_ref(&c, in, yref);
  for (int64_t i = 0; i < rows; i++) norm_stats(&c, x, i, &mref[i], &rref[i]);
  char what[120];
  snprintf(what, sizeof what, "%s rows=%lld C=%lld w=%d b=%d", centered ? "layernorm" : "rmsnorm",
           (long long)rows, (long long)C, has_w, c.has_b);
  sh_tensor *y = NULL, *mean = NULL, *rstd = NULL;
  if (centered) CHECK_OK(sh_layernorm_forward(&y, &mean, &rstd, tx, has_w ? tw : NULL, c.has_b ? tb : NULL, c.eps));
  else CHECK_OK(sh_rmsnorm_forward(&y, &rstd, tx, has_w ? tw : NULL, c.eps));
  check_tensor(what, y, yref, 3, xs, TOL);
  if (centered) check_vals("layernorm mean", mean, mref, TOL);
  check_vals("norm rstd", rstd, rref, TOL);

  double *dx = malloc(sizeof(double) * (size_t)(rows * C)), *dw = malloc(sizeof(double) * (size_t)C), *db = malloc(sizeof(double) * (size_t)C);
  norm_ref_bwd(&c, in, r, dx, dw, db);
  fd_spec s = {&c, norm_ref, 3, {rows * C, C, C}, rows * C, {x, w, b}};
  fd_check(what, &s, r, (double *[]){dx, has_w ? dw : NULL, c.has_b ? db : NULL});

  sh_tensor *tdw = mkf(1, cs, NULL), *tdb = mkf(1, cs, NULL), *tdx = NULL;
  for (int rep = 0; rep < 2; rep++) {
    if (centered)
      CHECK_OK(sh_layernorm_backward(&tdx, has_w ? tdw : NULL, c.has_b ? tdb : NULL, tr, tx, has_w ? tw : NULL, mean, rstd));
    else CHECK_OK(sh_rmsnorm_backward(&tdx, has_w ? tdw : NULL, tr, tx, has_w ? tw : NULL, rstd));
    if (rep == 0) check_tensor(what, tdx, dx, 3, xs, TOL);
    else sh_tensor_destroy(tdx);
  }
  for (int64_t i = 0; i < C; i++) { dw[i] *= 2; db[i] *= 2; }
  if (has_w) check_vals("norm dw accumulated twice", tdw, dw, TOL);
  if (c.has_b) check_vals("norm db accumulated twice", tdb, db, TOL);
  sh_tensor_destroy(mean); sh_tensor_destroy(rstd);
  sh_tensor_destroy(tdw); sh_tensor_destroy(tdb);
  sh_tensor_destroy(tx); sh_tensor_destroy(tw); sh_tensor_destroy(tb); sh_tensor_destroy(tr);
  free(x); free(w); free(b); free(r); free(yref); free(mref); free(rref); free(dx); free(dw); free(db);
}

static void test_norms(void) {
  for (int centered = 0; centered < 2; centered++) {
    test_norm_case(2, 6, 7, centered, 1, 1);
    /* three channels, the fewest that are well conditioned: with one or two, the output is
     * +-1 whatever x is (up to eps), so the true dx is ~0 and the computed one is rounding
     * residue magnified by rstd, in any precision */
    test_norm_case(1, 5, 3, centered, 1, 1);
    test_norm_case(3, 9, 33, centered, 0, 0);
    test_norm_case(1, 4, 16, centered, 1, 0);
    test_norm_case(12, 768, 128, centered, 1, 1);   /* the benchmark's shape: threaded */
  }
  sh_tensor *x = mkf(2, (int64_t[]){3, 5}, NULL), *w = mkf(1, (int64_t[]){4}, NULL), *y = NULL, *m = NULL, *r = NULL;
  CHECK_FAILS(sh_layernorm_forward(&y, &m, &r, x, w, NULL, 1e-5), SH_ERR_ARG, "w must have shape [5], got f32[4]");
  CHECK(y == NULL && m == NULL && r == NULL, "layernorm: outputs must be NULL after an error");
  CHECK_FAILS(sh_rmsnorm_forward(&y, &r, x, NULL, -1), SH_ERR_ARG, "eps");
  sh_tensor_destroy(x); sh_tensor_destroy(w);
}

/* layernorm_residual: r = x + res and y = layernorm(r). Against the composition (an add,
 * then layernorm: the same bits, which is what the CPU kernel is), and against f64: r
 * against x + res, y, mean and rstd against the f64 layernorm of r as stored. res is a
 * transposed view when strided. bf16 outputs are rounded to 8 bits: 8e-3 of their max. */
static void test_layernorm_residual_case(int64_t rows, int64_t C, int dtype, int has_w, int has_b, int strided) {
  norm_ctx c = {rows, C, 1, has_w, has_b, 1e-5};
  int64_t n = rows * C, xs[2] = {rows, C}, ts[2] = {C, rows}, cs[1] = {C};
  double *xv = rvec(n, -2, 3), *resv = rvec(n, -1, 1), *w = rvec(C, 0.5, 1.5), *b = rvec(C, -1, 1);
  round_f32(w, C); round_f32(b, C);
  sh_tensor *tx = mk(2, xs, dtype, xv), *tw = mkf(1, cs, w), *tb = mkf(1, cs, b), *resbuf = NULL, *tres = NULL;
  if (strided) {
    double *resT = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < rows; i++) for (int64_t j = 0; j < C; j++) resT[j * rows + i] = resv[i * C + j];
    resbuf = mk(2, ts, dtype, resT);
    CHECK_OK(sh_view_transpose(&tres, resbuf, 0, 1));
    free(resT);
  } else tres = mk(2, xs, dtype, resv);
  const sh_tensor *pw = has_w ? tw : NULL, *pb = has_b ? tb : NULL;
  char what[120];
  snprintf(what, sizeof what, "layernorm_residual rows=%lld C=%lld %s w=%d b=%d strided=%d", (long long)rows,
           (long long)C, sh_dtype_name(dtype), has_w, has_b, strided);

  sh_tensor *y = NULL, *r = NULL, *mean = NULL, *rstd = NULL, *sum = NULL, *y2 = NULL, *m2 = NULL, *rs2 = NULL;
  CHECK_OK(sh_layernorm_residual_forward(&y, &r, &mean, &rstd, tx, tres, pw, pb, c.eps));
  CHECK_OK(sh_binary(&sum, SH_OP_ADD, tx, tres));
  CHECK_OK(sh_layernorm_forward(&y2, &m2, &rs2, sum, pw, pb, c.eps));
  if (!y || !r || !mean || !rstd || !sum || !y2 || !m2 || !rs2) return;
  CHECK(y->dtype == dtype && r->dtype == dtype && mean->dtype == SH_F32 && rstd->dtype == SH_F32,
        "%s: output dtypes %d %d %d %d", what, y->dtype, r->dtype, mean->dtype, rstd->dtype);
  double *xq = rd(tx), *resq = rd(tres), *rv = rd(r), *sumv = rd(sum), *y2v = rd(y2), *m2v = rd(m2), *rs2v = rd(rs2);
  check_vals("layernorm_residual r = the add", r, sumv, 0);
  check_vals("layernorm_residual y = the composition", y, y2v, 0);
  check_vals("layernorm_residual mean = the composition", mean, m2v, 0);
  check_vals("layernorm_residual rstd = the composition", rstd, rs2v, 0);

  double tol = dtype == SH_BF16 ? 8e-3 : TOL;
  double *exact = malloc(sizeof(double) * (size_t)n), *yref = malloc(sizeof(double) * (size_t)n);
  double *mref = malloc(sizeof(double) * (size_t)rows), *rref = malloc(sizeof(double) * (size_t)rows);
  for (int64_t i = 0; i < n; i++) exact[i] = xq[i] + resq[i];
  check_vals(what, r, exact, tol);
  double *in[3] = {rv, w, b};
  norm_ref(&c, in, yref);
  for (int64_t i = 0; i < rows; i++) norm_stats(&c, rv, i, &mref[i], &rref[i]);
  check_vals(what, y, yref, tol);
  check_vals("layernorm_residual mean", mean, mref, TOL);
  check_vals("layernorm_residual rstd", rstd, rref, TOL);

  sh_tensor *outs[] = {y, r, mean, rstd, sum, y2, m2, rs2, tx, tw, tb, tres, resbuf};
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) sh_tensor_destroy(outs[i]);
  double *bufs[] = {xv, resv, w, b, xq, resq, rv, sumv, y2v, m2v, rs2v, exact, yref, mref, rref};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static void test_layernorm_residual(void) {
  test_layernorm_residual_case(6, 7, SH_F32, 1, 1, 0);
  test_layernorm_residual_case(5, 3, SH_F32, 0, 0, 1);
  test_layernorm_residual_case(9, 33, SH_BF16, 1, 0, 0);
  test_layernorm_residual_case(768, 128, SH_F32, 1, 1, 1);   /* threaded */
  test_layernorm_residual_case(64, 96, SH_BF16, 1, 1, 1);

  sh_tensor *x = mkf(2, (int64_t[]){3, 5}, NULL), *res = mkf(2, (int64_t[]){5, 3}, NULL), *w = mkf(1, (int64_t[]){4}, NULL);
  sh_tensor *y = NULL, *r = NULL, *m = NULL, *s = NULL;
  CHECK_FAILS(sh_layernorm_residual_forward(&y, &r, &m, &s, x, NULL, NULL, NULL, 1e-5), SH_ERR_ARG, "res is missing");
  CHECK_FAILS(sh_layernorm_residual_forward(&y, &r, &m, &s, x, res, NULL, NULL, 1e-5), SH_ERR_ARG,
              "res and x must have the same shape, got f32[5,3]");
  CHECK_FAILS(sh_layernorm_residual_forward(&y, &r, &m, &s, x, x, w, NULL, 1e-5), SH_ERR_ARG, "w must have shape [5], got f32[4]");
  CHECK_FAILS(sh_layernorm_residual_forward(&y, &r, &m, &s, x, x, NULL, NULL, -1), SH_ERR_ARG, "eps");
  CHECK(y == NULL && r == NULL && m == NULL && s == NULL, "layernorm_residual: outputs must be NULL after an error");
  /* r and mean may be skipped */
  CHECK_OK(sh_layernorm_residual_forward(&y, NULL, NULL, &s, x, x, NULL, NULL, 1e-5));
  sh_tensor_destroy(y); sh_tensor_destroy(s);
  sh_tensor_destroy(x); sh_tensor_destroy(res); sh_tensor_destroy(w);
}

/* ---- elementwise activations and softmax ------------------------------------------------ */

typedef struct ew_ctx { int kind; int64_t n, C; } ew_ctx;
enum { GELU, SILU, SWIGLU, SOFTMAX };

static double gelu64(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double silu64(double x) { return x / (1 + exp(-x)); }

static void ew_ref(const void *c_, double *const *in, double *y) {
  const ew_ctx *c = c_;
  if (c->kind == SOFTMAX) {
    for (int64_t r = 0; r < c->n / c->C; r++) {
      const double *x = in[0] + r * c->C;
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < c->C; i++) m = fmax(m, x[i]);
      for (int64_t i = 0; i < c->C; i++) s += exp(x[i] - m);
      for (int64_t i = 0; i < c->C; i++) y[r * c->C + i] = exp(x[i] - m) / s;
    }
    return;
  }
  for (int64_t i = 0; i < c->n; i++) {
    double x = in[0][i];
    y[i] = c->kind == GELU ? gelu64(x) : c->kind == SILU ? silu64(x) : silu64(x) * in[1][i];
  }
}

static void ew_ref_bwd(const ew_ctx *c, double *const *in, const double *dy, double *dx, double *db) {
  if (c->kind == SOFTMAX) {
    double *y = malloc(sizeof(double) * (size_t)c->n);
    ew_ref(c, in, y);
    for (int64_t r = 0; r < c->n / c->C; r++) {
      double s = 0;
      for (int64_t i = 0; i < c->C; i++) s += dy[r * c->C + i] * y[r * c->C + i];
      for (int64_t i = 0; i < c->C; i++) dx[r * c->C + i] = y[r * c->C + i] * (dy[r * c->C + i] - s);
    }
    free(y);
    return;
  }
  for (int64_t i = 0; i < c->n; i++) {
    double x = in[0][i], d;
    if (c->kind == GELU) {
      double k = sqrt(2 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
      d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    } else {
      double s = 1 / (1 + exp(-x));
      d = s * (1 + x * (1 - s));
    }
    dx[i] = dy[i] * d * (c->kind == SWIGLU ? in[1][i] : 1);
    if (c->kind == SWIGLU) db[i] = dy[i] * silu64(x);
  }
}

static void test_ew_case(int kind, int64_t rows, int64_t C, double lo, double hi) {
  static const char *names[] = {"gelu", "silu", "swiglu", "softmax"};
  int64_t n = rows * C, shape[2] = {rows, C};
  ew_ctx c = {kind, n, C};
  double *x = rvec(n, lo, hi), *b = rvec(n, -2, 2), *r = rvec(n, -1, 1);
  round_f32(x, n); round_f32(b, n); round_f32(r, n);
  sh_tensor *tx = mkf(2, shape, x), *tb = mkf(2, shape, b), *tr = mkf(2, shape, r), *y = NULL, *dx = NULL, *db = NULL;
  double *in[2] = {x, b}, *yref = malloc(sizeof(double) * (size_t)n);
  double *dxr = malloc(sizeof(double) * (size_t)n), *dbr = malloc(sizeof(double) * (size_t)n);
  ew_ref(&c, in, yref);
  ew_ref_bwd(&c, in, r, dxr, dbr);
  char what[120];
  snprintf(what, sizeof what, "%s [%lld,%lld] in [%g,%g]", names[kind], (long long)rows, (long long)C, lo, hi);
  if (kind == GELU) CHECK_OK(sh_gelu_forward(&y, tx));
  if (kind == SILU) CHECK_OK(sh_silu_forward(&y, tx));
  if (kind == SWIGLU) CHECK_OK(sh_swiglu_forward(&y, tx, tb));
  if (kind == SOFTMAX) CHECK_OK(sh_softmax_forward(&y, tx));
  sh_tensor *ty = NULL;
  if (kind == SOFTMAX) CHECK_OK(sh_tensor_alias(&ty, y));
  check_tensor(what, y, yref, 2, shape, TOL);
  if (kind == GELU) CHECK_OK(sh_gelu_backward(&dx, tr, tx));
  if (kind == SILU) CHECK_OK(sh_silu_backward(&dx, tr, tx));
  if (kind == SWIGLU) CHECK_OK(sh_swiglu_backward(&dx, &db, tr, tx, tb));
  if (kind == SOFTMAX) CHECK_OK(sh_softmax_backward(&dx, tr, ty));
  check_tensor(what, dx, dxr, 2, shape, TOL);
  if (kind == SWIGLU) check_tensor("swiglu db", db, dbr, 2, shape, TOL);
  fd_spec s = {&c, ew_ref, kind == SWIGLU ? 2 : 1, {n, n}, n, {x, b}};
  fd_check(what, &s, r, (double *[]){dxr, dbr});
  sh_tensor_destroy(ty); sh_tensor_destroy(tx); sh_tensor_destroy(tb); sh_tensor_destroy(tr);
  free(x); free(b); free(r); free(yref); free(dxr); free(dbr);
}

static void test_activations(void) {
  for (int kind = GELU; kind <= SOFTMAX; kind++) {
    test_ew_case(kind, 3, 7, -4, 4);
    test_ew_case(kind, 1, 1, -1, 1);
    test_ew_case(kind, 65, 130, -3, 3);          /* threaded, ragged vector tails */
    test_ew_case(kind, 2, 17, -30, 30);          /* saturated tails of tanh and exp */
  }
  test_ew_case(GELU, 768, 512, -5, 5);           /* the benchmark's MLP activation */
  test_ew_case(SOFTMAX, 4, 65, -100, 100);       /* one large logit dominates each row */

  sh_tensor *a = mkf(2, (int64_t[]){2, 3}, NULL), *b = mkf(2, (int64_t[]){3, 2}, NULL), *y = NULL, *da = NULL;
  CHECK_FAILS(sh_swiglu_forward(&y, a, b), SH_ERR_ARG, "f32[3,2]");
  CHECK_FAILS(sh_gelu_backward(&da, b, a), SH_ERR_ARG, "same shape");
  sh_tensor *i = mk(1, (int64_t[]){3}, SH_I32, NULL);
  CHECK_FAILS(sh_silu_forward(&y, i), SH_ERR_ARG, "i32[3]");
  sh_tensor_destroy(a); sh_tensor_destroy(b); sh_tensor_destroy(i);
}

/* ---- linear fused with gelu ------------------------------------------------------------- */

static double gelu64_grad(double x) {
  double k = sqrt(2 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

/* On the CPU a fusion is its composition: the same values, bit for bit. */
static void check_same(const char *what, const sh_tensor *t, const sh_tensor *ref) {
  int64_t n = sh_tensor_numel(t), bad = t->dtype != ref->dtype || sh_tensor_numel(ref) != n;
  double *v = rd(t), *r = rd(ref);
  for (int64_t i = 0; !bad && i < n; i++) bad = memcmp(&v[i], &r[i], sizeof(double)) != 0;
  CHECK(!bad, "%s: differs from the composition", what);
  free(v); free(r);
}

/* x [A, M/A, K] in xdtype, w [N, K], b [N]: pre = x w^T + b and y = gelu(pre). Then the
 * backward of a projection w2 [P, N] of y (an MLP's second linear): dpre = (dy2 @ w2) *
 * gelu'(pre), dw2 += dy2^T y, db2 += colsum(dy2). Each against its composition and an f64
 * reference computed from the values the kernels saw. */
static void test_linear_gelu_case(int64_t A, int64_t M, int64_t K, int64_t N, int64_t P, int xdtype) {
  double tol = xdtype == SH_BF16 ? 1.6e-2 : TOL;  /* bf16 outputs: 8 bits of mantissa, rounded twice */
  double *x = rvec(M * K, -1, 1), *w = rvec(N * K, -1, 1), *b = rvec(N, -1, 1);
  double *w2 = rvec(P * N, -1, 1), *r = rvec(M * P, -1, 1);
  round_f32(x, M * K); round_f32(w, N * K); round_f32(b, N); round_f32(w2, P * N); round_f32(r, M * P);
  int64_t xs[3] = {A, M / A, K}, hs[3] = {A, M / A, N}, ys[3] = {A, M / A, P};
  sh_tensor *tx = mk(3, xs, xdtype, x), *tw = mkf(2, (int64_t[]){N, K}, w), *tb = mkf(1, (int64_t[]){N}, b);
  sh_tensor *tw2 = mkf(2, (int64_t[]){P, N}, w2), *tr = mkf(3, ys, r);
  char what[120];
  snprintf(what, sizeof what, "linear_gelu M=%lld K=%lld N=%lld P=%lld %s", (long long)M, (long long)K, (long long)N,
           (long long)P, xdtype == SH_BF16 ? "bf16" : "f32");

  /* forward */
  sh_tensor *y = NULL, *pre = NULL, *cpre = NULL, *cy = NULL;
  CHECK_OK(sh_linear_gelu_forward(&y, &pre, tx, tw, tb));
  CHECK_OK(sh_linear_forward(&cpre, tx, tw, tb));
  CHECK_OK(sh_gelu_forward(&cy, cpre));
  if (!y || !pre) return;
  check_same(what, pre, cpre);
  check_same(what, y, cy);
  double *xs64 = rd(tx), *pre64 = malloc(sizeof(double) * (size_t)(M * N)), *y64 = malloc(sizeof(double) * (size_t)(M * N));
  lin_ctx c = {M, K, N, 1};
  lin_ref(&c, (double *[]){xs64, w, b}, pre64);
  for (int64_t i = 0; i < M * N; i++) y64[i] = gelu64(pre64[i]);
  check_vals("linear_gelu pre vs f64", pre, pre64, tol);
  check_vals("linear_gelu y vs f64", y, y64, tol);

  /* backward through the projection of y, dw2 and db2 accumulating from zero */
  sh_tensor *dw2 = mkf(2, (int64_t[]){P, N}, NULL), *db2 = mkf(1, (int64_t[]){P}, NULL);
  sh_tensor *cdw2 = mkf(2, (int64_t[]){P, N}, NULL), *cdb2 = mkf(1, (int64_t[]){P}, NULL);
  sh_tensor *dpre = NULL, *cdh = NULL, *cdpre = NULL;
  CHECK_OK(sh_linear_backward_dgelu(&dpre, dw2, db2, tr, y, tw2, pre));
  CHECK_OK(sh_linear_backward(&cdh, cdw2, cdb2, tr, y, tw2));
  CHECK_OK(sh_gelu_backward(&cdpre, cdh, pre));
  CHECK(!dpre || (dpre->dtype == xdtype && dpre->ndim == 3 && dpre->shape[2] == N), "%s: dpre is x's dtype, pre's shape", what);
  if (dpre) check_same(what, dpre, cdpre);
  check_same(what, dw2, cdw2);
  check_same(what, db2, cdb2);
  double *h = rd(y), *p = rd(pre), *dh = malloc(sizeof(double) * (size_t)(M * N));
  double *dw = malloc(sizeof(double) * (size_t)(P * N)), *db = malloc(sizeof(double) * (size_t)P);
  lin_ctx c2 = {M, N, P, 1};
  lin_ref_bwd(&c2, (double *[]){h, w2, NULL}, r, dh, dw, db);
  for (int64_t i = 0; i < M * N; i++) dh[i] *= gelu64_grad(p[i]);
  if (dpre) check_tensor("linear_backward_dgelu dpre vs f64", dpre, dh, 3, hs, tol);
  check_vals("linear_backward_dgelu dw vs f64", dw2, dw, TOL);
  check_vals("linear_backward_dgelu db vs f64", db2, db, TOL);

  sh_tensor *ts[] = {tx, tw, tb, tw2, tr, y, pre, cpre, cy, dw2, db2, cdw2, cdb2, cdh, cdpre};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) sh_tensor_destroy(ts[i]);
  double *vs[] = {x, w, b, w2, r, xs64, pre64, y64, h, p, dh, dw, db};
  for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) free(vs[i]);
}

static void test_linear_gelu(void) {
  test_linear_gelu_case(2, 6, 5, 4, 3, SH_F32);
  test_linear_gelu_case(3, 3 * 65, 33, 17, 9, SH_F32);   /* threaded, ragged */
  test_linear_gelu_case(2, 2 * 150, 64, 128, 48, SH_F32); /* products split across threads: gelu per row block */
  test_linear_gelu_case(2, 8, 16, 12, 5, SH_BF16);

  sh_tensor *x = mkf(2, (int64_t[]){3, 5}, NULL), *w = mkf(2, (int64_t[]){4, 5}, NULL), *b3 = mkf(1, (int64_t[]){3}, NULL);
  sh_tensor *dy = mkf(2, (int64_t[]){3, 4}, NULL), *pre = mkf(2, (int64_t[]){3, 4}, NULL);
  sh_tensor *y = (sh_tensor *)1, *p = (sh_tensor *)1, *d = (sh_tensor *)1;
  CHECK_FAILS(sh_linear_gelu_forward(&y, &p, x, w, b3), SH_ERR_ARG, "linear_gelu: b must have shape [4]");
  CHECK(y == NULL && p == NULL, "linear_gelu: outputs must be NULL after an error");
  CHECK_FAILS(sh_linear_gelu_forward(&y, NULL, x, w, NULL), SH_ERR_ARG, "linear_gelu: pre is an output");
  CHECK_FAILS(sh_linear_backward_dgelu(NULL, NULL, NULL, dy, x, w, pre), SH_ERR_ARG, "dpre is the point of this op");
  CHECK_FAILS(sh_linear_backward_dgelu(&d, NULL, NULL, dy, x, w, NULL), SH_ERR_ARG, "linear_backward_dgelu: pre is missing");
  CHECK(d == NULL, "linear_backward_dgelu: dpre must be NULL after an error");
  CHECK_FAILS(sh_linear_backward_dgelu(&d, NULL, NULL, dy, x, w, dy), SH_ERR_ARG,
              "linear_backward_dgelu: pre and x must have the same shape, got f32[3,4] cpu and f32[3,5] cpu");
  sh_tensor_destroy(x); sh_tensor_destroy(w); sh_tensor_destroy(b3); sh_tensor_destroy(dy); sh_tensor_destroy(pre);
}

/* ---- dropout --------------------------------------------------------------------------- */

static void test_dropout_case(int64_t n, double p, uint64_t seed, uint64_t offset) {
  double *x = rvec(n, -1, 1), *yref = malloc(sizeof(double) * (size_t)n);
  round_f32(x, n);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    int keep = sh_philox_uniform(seed, offset, (uint64_t)i) > (float)p;
    kept += keep;
    yref[i] = keep ? x[i] * (float)(1 / (1 - p)) : 0;
  }
  sh_tensor *tx = mkf(1, &n, x), *y = NULL, *dx = NULL;
  char what[100];
  snprintf(what, sizeof what, "dropout n=%lld p=%g offset=%llu", (long long)n, p, (unsigned long long)offset);
  CHECK_OK(sh_dropout_forward(&y, tx, p, seed, offset));
  check_tensor(what, y, yref, 1, &n, 1e-7);
  /* backward of y = mask * x / (1-p) is the same map applied to dy */
  CHECK_OK(sh_dropout_backward(&dx, tx, p, seed, offset));
  check_tensor(what, dx, yref, 1, &n, 1e-7);
  if (n >= 100000) {
    double frac = (double)kept / n;
    CHECK(fabs(frac - (1 - p)) < 0.01, "%s: kept fraction %.4f, expected %.4f", what, frac, 1 - p);
  }
  sh_tensor_destroy(tx);
  free(x); free(yref);
}

static void test_dropout(void) {
  test_dropout_case(1, 0.5, 1, 0);
  test_dropout_case(13, 0.3, 7, 3);                 /* offset inside a Philox block */
  test_dropout_case(200003, 0.1, 42, 5);            /* threaded, split mid-block */
  test_dropout_case(100000, 0.0, 42, 0);
  test_dropout_case(100001, 0.9, 3, 1);
  sh_tensor *x = mkf(1, (int64_t[]){4}, NULL), *y = NULL;
  CHECK_FAILS(sh_dropout_forward(&y, x, 1.0, 1, 0), SH_ERR_ARG, "p must be in [0, 1)");
  CHECK_FAILS(sh_dropout_forward(&y, x, -0.1, 1, 0), SH_ERR_ARG, "p must be in [0, 1)");
  CHECK_FAILS(sh_dropout_backward(&y, x, NAN, 1, 0), SH_ERR_ARG, "p must be in [0, 1)");
  sh_tensor_destroy(x);
}

/* ---- attention ------------------------------------------------------------------------- */

/* G query heads share each key/value head (grouped-query attention; 1: plain). */
typedef struct attn_ctx { int64_t B, H, T, D; double scale; int64_t G; } attn_ctx;

/* The key/value head (b, h / G) of query head bh = b H + h, as a row index base. */
static int64_t kv_head(const attn_ctx *c, int64_t bh) { return bh / c->H * (c->H / c->G) + bh % c->H / c->G; }

/* Naive causal attention over the full score rows; lse optional. */
static void attn_ref_full(const attn_ctx *c, double *const *in, double *out, double *lse) {
  int64_t T = c->T, D = c->D;
  double *s = malloc(sizeof(double) * (size_t)T);
  for (int64_t bh = 0; bh < c->B * c->H; bh++)
    for (int64_t i = 0; i < T; i++) {
      const double *q = in[0] + (bh * T + i) * D;
      int64_t kh = kv_head(c, bh);
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; j++) {
        const double *k = in[1] + (kh * T + j) * D;
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += q[e] * k[e];
        s[j] = d * c->scale;
        m = fmax(m, s[j]);
      }
      for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - m);
      double *o = out + (bh * T + i) * D;
      for (int64_t e = 0; e < D; e++) o[e] = 0;
      for (int64_t j = 0; j <= i; j++) {
        double p = exp(s[j] - m) / sum;
        for (int64_t e = 0; e < D; e++) o[e] += p * in[2][(kh * T + j) * D + e];
      }
      if (lse) lse[bh * T + i] = m + log(sum);
    }
  free(s);
}
static void attn_ref(const void *c, double *const *in, double *out) { attn_ref_full(c, in, out, NULL); }

static void attn_ref_bwd(const attn_ctx *c, double *const *in, const double *dout, double *dq, double *dk, double *dv) {
  int64_t T = c->T, D = c->D, n = c->B * c->H * T * D, nkv = n / c->G;
  memset(dq, 0, sizeof(double) * (size_t)n);
  memset(dk, 0, sizeof(double) * (size_t)nkv);
  memset(dv, 0, sizeof(double) * (size_t)nkv);
  double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
  for (int64_t bh = 0; bh < c->B * c->H; bh++)
    for (int64_t i = 0; i < T; i++) {
      const double *q = in[0] + (bh * T + i) * D, *go = dout + (bh * T + i) * D;
      int64_t kh = kv_head(c, bh);
      double m = -INFINITY, sum = 0, pdp = 0;
      for (int64_t j = 0; j <= i; j++) {
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += q[e] * in[1][(kh * T + j) * D + e];
        p[j] = d * c->scale;
        m = fmax(m, p[j]);
      }
      for (int64_t j = 0; j <= i; j++) sum += exp(p[j] - m);
      for (int64_t j = 0; j <= i; j++) {
        p[j] = exp(p[j] - m) / sum;
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += go[e] * in[2][(kh * T + j) * D + e];
        dp[j] = d;
        pdp += p[j] * d;
      }
      for (int64_t j = 0; j <= i; j++) {
        double ds = p[j] * (dp[j] - pdp) * c->scale;
        for (int64_t e = 0; e < D; e++) {
          dv[(kh * T + j) * D + e] += p[j] * go[e];
          dq[(bh * T + i) * D + e] += ds * in[1][(kh * T + j) * D + e];
          dk[(kh * T + j) * D + e] += ds * q[e];
        }
      }
    }
  free(p); free(dp);
}

/* [B, H, T, D] view of slot k of a [B, T, n, H, D] buffer. */
static void head_view(sh_tensor **t, const sh_tensor *buf, int k) {
  sh_tensor *sel = NULL;
  CHECK_OK(sh_view_select(&sel, buf, 2, k));   /* [B, T, H, D] */
  CHECK_OK(sh_view_transpose(t, sel, 1, 2));   /* [B, H, T, D] */
  sh_tensor_destroy(sel);
}

/* q, k, v as contiguous tensors, or as views into one fused [B, T, 3, H, D] buffer (the
 * layout of a qkv projection), permuted to [B, H, T, D]. */
static void attn_inputs(sh_tensor **t, double *const *vals, const attn_ctx *c, int fused, sh_tensor **fused_buf) {
  int64_t B = c->B, H = c->H, T = c->T, D = c->D, shape[4] = {B, H, T, D}, kv_shape[4] = {B, H / c->G, T, D};
  if (!fused) {
    for (int k = 0; k < 3; k++) t[k] = mkf(4, k ? kv_shape : shape, vals[k]);
    *fused_buf = NULL;
    return;
  }
  int64_t fs[5] = {B, T, 3, H, D};
  double *f = malloc(sizeof(double) * (size_t)(B * T * 3 * H * D));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t e = 0; e < D; e++)
          for (int k = 0; k < 3; k++)
            f[(((b * T + i) * 3 + k) * H + h) * D + e] = vals[k][((b * H + h) * T + i) * D + e];
  *fused_buf = mkf(5, fs, f);
  free(f);
  for (int k = 0; k < 3; k++) head_view(&t[k], *fused_buf, k);
}

/* The _into forms write through strided views: out into a [B, T, 1, H, D] buffer (the
 * [B, T, C] layout the next projection reads) and dq, dk, dv into one [B, T, 3, H, D]
 * buffer (a fused dqkv), with the other buffer elements left as they were. */
static void check_attention_into(const attn_ctx *c, sh_tensor *const *t, const sh_tensor *dout, const double *oref,
                                 double *const *gref, double scale) {
  int64_t B = c->B, H = c->H, T = c->T, D = c->D, os[5] = {B, T, 1, H, D}, gs[5] = {B, T, 3, H, D};
  int64_t shape[4] = {B, H, T, D};
  sh_tensor *obuf = mkf(5, os, NULL), *gbuf = mkf(5, gs, NULL), *lse = NULL, *out = NULL, *g[3];
  CHECK_OK(sh_tensor_fill_(gbuf, 7));
  CHECK_OK(sh_tensor_empty(&lse, 3, shape, SH_F32, -1));
  head_view(&out, obuf, 0);
  for (int k = 0; k < 3; k++) head_view(&g[k], gbuf, k);
  CHECK_OK(sh_attention_forward_into(out, lse, t[0], t[1], t[2], scale));
  check_vals("attention_forward_into out", out, oref, TOL);
  CHECK_OK(sh_attention_backward_into(g[0], g[1], g[2], dout, t[0], t[1], t[2], out, lse, scale));
  const char *names[3] = {"backward_into dq", "backward_into dk", "backward_into dv"};
  for (int k = 0; k < 3; k++) check_vals(names[k], g[k], gref[k], TOL);
  /* only dk: dq's and dv's slots keep what they held */
  CHECK_OK(sh_tensor_fill_(gbuf, 7));
  CHECK_OK(sh_attention_backward_into(NULL, g[1], NULL, dout, t[0], t[1], t[2], out, lse, scale));
  check_vals("backward_into dk alone", g[1], gref[1], TOL);
  double *v = rd(g[0]), *w = rd(g[2]);
  int kept = 1;
  for (int64_t i = 0; i < B * H * T * D; i++) kept = kept && v[i] == 7 && w[i] == 7;
  CHECK(kept, "backward_into dk alone wrote into dq's or dv's slots");
  free(v); free(w);
  for (int k = 0; k < 3; k++) sh_tensor_destroy(g[k]);
  sh_tensor_destroy(out); sh_tensor_destroy(lse); sh_tensor_destroy(obuf); sh_tensor_destroy(gbuf);
}

/* G > 1: grouped-query attention (k and v with H / G heads), never fused. */
static void test_attention_case(int64_t B, int64_t H, int64_t T, int64_t D, double scale, int fused, int64_t G) {
  attn_ctx c = {B, H, T, D, scale > 0 ? scale : 1 / sqrt((double)D), G};
  int64_t n = B * H * T * D, nkv = n / G, shape[4] = {B, H, T, D}, kv_shape[4] = {B, H / G, T, D};
  double *q = rvec(n, -1.5, 1.5), *k = rvec(nkv, -1.5, 1.5), *v = rvec(nkv, -1, 1), *r = rvec(n, -1, 1);
  round_f32(q, n); round_f32(k, nkv); round_f32(v, nkv); round_f32(r, n);
  double *in[3] = {q, k, v};
  double *oref = malloc(sizeof(double) * (size_t)n), *lref = malloc(sizeof(double) * (size_t)(B * H * T));
  attn_ref_full(&c, in, oref, lref);
  sh_tensor *t[3], *fb = NULL, *tr = mkf(4, shape, r), *out = NULL, *lse = NULL;
  attn_inputs(t, in, &c, fused, &fb);
  char what[160];
  snprintf(what, sizeof what, "attention [%s] B=%lld H=%lld T=%lld D=%lld G=%lld fused=%d", sh_cpu_isa_name(sh_cpu_isa()),
           (long long)B, (long long)H, (long long)T, (long long)D, (long long)G, fused);
  CHECK_OK(sh_attention_forward(&out, &lse, t[0], t[1], t[2], scale));
  check_vals(what, out, oref, TOL);
  check_vals("attention lse", lse, lref, TOL);

  double *dq = malloc(sizeof(double) * (size_t)n), *dk = malloc(sizeof(double) * (size_t)nkv);
  double *dv = malloc(sizeof(double) * (size_t)nkv);
  attn_ref_bwd(&c, in, r, dq, dk, dv);
  if (n <= 20000) {                   /* finite differences cost 2 forwards per coordinate */
    fd_spec s = {&c, attn_ref, 3, {n, nkv, nkv}, n, {q, k, v}};
    fd_check(what, &s, r, (double *[]){dq, dk, dv});
  }
  sh_tensor *g[3] = {0};
  CHECK_OK(sh_attention_backward(&g[0], &g[1], &g[2], tr, t[0], t[1], t[2], out, lse, scale));
  check_tensor("attention dq", g[0], dq, 4, shape, TOL);
  check_tensor("attention dk", g[1], dk, 4, kv_shape, TOL);
  check_tensor("attention dv", g[2], dv, 4, kv_shape, TOL);
  sh_tensor *only_dv = NULL;
  CHECK_OK(sh_attention_backward(NULL, NULL, &only_dv, tr, t[0], t[1], t[2], out, lse, scale));
  check_tensor("attention dv alone", only_dv, dv, 4, kv_shape, TOL);
  if (G == 1) check_attention_into(&c, t, tr, oref, (double *[]){dq, dk, dv}, scale);

  for (int i = 0; i < 3; i++) sh_tensor_destroy(t[i]);
  sh_tensor_destroy(fb); sh_tensor_destroy(tr); sh_tensor_destroy(out); sh_tensor_destroy(lse);
  free(q); free(k); free(v); free(r); free(oref); free(lref); free(dq); free(dk); free(dv);
}

/* Every case under the kernel set in use, under avx2 and under generic (check_cpu.h):
 * attn_blocks' kernels (head dims 16, 32, 48 and 64; 16 lanes in the avx512 sets, 8 in avx2)
 * and the sgemm block products. T around the query and key blocks (32 and 64) and the
 * kernels' tiles (3 rows at 8 lanes; 4 and 8 at 16), tails of each. */
/* P [m queries, n keys] with the probabilities the causal mask hides at 0, as attention's row
 * loops leave them: query i sees key j when j <= i + diag. */
static void masked_probs(float *pm, const float *p, int m, int n, int diag) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) pm[i * 64 + j] = j <= i + diag ? p[i * 64 + j] : 0.0f;
}

/* attn_blocks' kernels directly, under the set in use and under avx2 (the 16- and 8-lane
 * builds): S = scale A B^T through sh_attn_transpose and sh_attn_scores, and C += P B both
 * ways (rows: P [m, k]; trans: P [k, m]) through sh_attn_accumulate, for every head dim they
 * take, row and column counts around their tiles (3, 4, 8 rows; 8 and 16 lanes; chunks of 4
 * vectors), with the causal mask at two diagonals and without it (diag past the block). Each
 * visible result against float64, and its bits equal across the two builds (each element is its
 * products summed in the same order). */
static void test_attention_blocks(void) {
  enum { BKT = 64 };
  static const int Ds[] = {16, 32, 48, 64}, ms[] = {1, 3, 5, 8, 13, 32}, ns[] = {1, 7, 9, 16, 33, 64};
  static const int diags[] = {0, 5, 1000};
  int sets = check_sets() > 2 ? 2 : check_sets() == 2 ? 1 : 0, bad_bits = 0, cases = 0;
  if (sets == 0) return;   /* generic: no kernels */
  float *a = malloc(sizeof(float) * BKT * 64), *b = malloc(sizeof(float) * BKT * 64), *p = malloc(sizeof(float) * BKT * BKT);
  float *bt = malloc(sizeof(float) * 64 * BKT), *s[2], *c[2][2], *pm = malloc(sizeof(float) * BKT * BKT);
  for (int i = 0; i < 2; i++) {
    s[i] = malloc(sizeof(float) * 32 * BKT);
    c[i][0] = malloc(sizeof(float) * BKT * 64);
    c[i][1] = malloc(sizeof(float) * BKT * 64);
  }
  for (int i = 0; i < BKT * 64; i++) { a[i] = (float)(2 * urand() - 1); b[i] = (float)(2 * urand() - 1); }
  for (int i = 0; i < BKT * BKT; i++) p[i] = (float)urand();
  for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t gi = 0; gi < sizeof diags / sizeof diags[0]; gi++) {
          int D = Ds[di], m = ms[mi], n = ns[ni], diag = diags[gi];
          double err = 0;
          for (int set = 0; set < sets; set++) {
            check_use_set(set);
            for (int i = 0; i < 32 * BKT; i++) s[set][i] = 0;
            sh_attn_transpose(bt, BKT, b, D, n, D);
            sh_attn_scores(s[set], BKT, a, D, bt, BKT, m, n, D, 0.5f, diag);
            masked_probs(pm, p, m, n, diag);
            for (int t = 0; t < 2; t++) {   /* rows: i < m queries over n keys; trans: i < n keys over m queries */
              for (int i = 0; i < BKT * 64; i++) c[set][t][i] = (float)i;
              sh_attn_accumulate(c[set][t], D, pm, BKT, t, b, D, t ? n : m, t ? m : n, D, diag);
            }
            for (int i = 0; i < m; i++)
              for (int j = 0; j < n && j <= i + diag; j++) {
                double ref = 0;
                for (int d = 0; d < D; d++) ref += (double)a[i * D + d] * b[j * D + d];
                err = fmax(err, fabs(s[set][i * BKT + j] - 0.5 * ref));
              }
            for (int t = 0; t < 2; t++)
              for (int i = 0; i < (t ? n : m); i++)
                for (int e = 0; e < D; e++) {
                  double ref = (double)(i * D + e);
                  for (int q = 0; q < (t ? m : n); q++) ref += (double)(t ? pm[q * BKT + i] : pm[i * BKT + q]) * b[q * D + e];
                  err = fmax(err, fabs(c[set][t][i * D + e] - ref) / fmax(1, fabs(ref)));
                }
          }
          cases++;
          CHECK(err < 1e-4, "attention blocks D=%d m=%d n=%d diag=%d: error %.3g against float64", D, m, n, diag, err);
          if (sets < 2) continue;
          for (int i = 0; i < m; i++)
            for (int j = 0; j < n && j <= i + diag; j++) bad_bits += memcmp(&s[0][i * BKT + j], &s[1][i * BKT + j], 4) != 0;
          for (int t = 0; t < 2; t++) bad_bits += memcmp(c[0][t], c[1][t], sizeof(float) * (size_t)((t ? n : m) * D)) != 0;
        }
  check_use_set(0);
  if (sets == 2)
    CHECK(bad_bits == 0, "attention blocks: %d results of %d cases differ in their bits between %s and avx2", bad_bits, cases,
          sh_cpu_isa_name(sh_cpu_isa()));
  free(a); free(b); free(p); free(bt);
  free(pm);
  for (int i = 0; i < 2; i++) { free(s[i]); free(c[i][0]); free(c[i][1]); }
}

static void test_attention(void) {
  for (int s = 0; s < check_sets(); s++) {
    check_use_set(s);
    test_attention_case(1, 1, 1, 4, 0, 0, 1);
    test_attention_case(2, 3, 7, 5, 0, 1, 1);
    test_attention_case(1, 2, 65, 8, 0.3, 0, 1);
    test_attention_case(1, 1, 130, 16, 0, 1, 1);
    test_attention_case(1, 1, 3, 16, 0, 0, 1);
    test_attention_case(2, 2, 130, 32, 0, 0, 1);
    test_attention_case(12, 4, 64, 32, 0, 1, 1);     /* the benchmark's shape */
    test_attention_case(1, 2, 37, 48, 0, 1, 1);
    test_attention_case(2, 4, 97, 32, 0, 0, 2);      /* grouped-query */
    test_attention_case(1, 6, 70, 64, 0.2, 0, 3);
    test_attention_case(1, 2, 257, 64, 0, 0, 1);
  }
  check_use_set(0);
  CHECK(sh_attn_blocks_wanted(32) == (sh_cpu_isa() >= SH_CPU_AVX2), "attention kernels: the kernel set decides");
  CHECK(!sh_attn_blocks_wanted(24) && !sh_attn_blocks_wanted(80), "attention kernels: D = 24 or 80 takes sgemm");

  sh_tensor *q = mkf(4, (int64_t[]){1, 2, 3, 4}, NULL), *k = mkf(4, (int64_t[]){1, 2, 4, 4}, NULL);
  sh_tensor *q3 = mkf(3, (int64_t[]){2, 3, 4}, NULL), *o = NULL, *l = NULL;
  CHECK_FAILS(sh_attention_forward(&o, &l, q, k, q, 0), SH_ERR_ARG, "f32[1,2,4,4]");
  CHECK(o == NULL && l == NULL, "attention: outputs must be NULL after an error");
  CHECK_FAILS(sh_attention_forward(&o, &l, q3, q3, q3, 0), SH_ERR_ARG, "[B, H, T, D]");
  /* grouped-query attention: k's heads must divide q's; rope needs an even D and theta > 0 */
  sh_tensor *q6 = mkf(4, (int64_t[]){1, 6, 3, 4}, NULL), *k4 = mkf(4, (int64_t[]){1, 4, 3, 4}, NULL);
  sh_tensor *k2 = mkf(4, (int64_t[]){1, 2, 3, 4}, NULL), *q5 = mkf(4, (int64_t[]){1, 2, 3, 5}, NULL);
  CHECK_FAILS(sh_attention_forward(&o, &l, q6, k4, k4, 0), SH_ERR_ARG, "Hkv dividing");
  CHECK_FAILS(sh_attention_forward(&o, &l, q6, k2, k4, 0), SH_ERR_ARG, "v");
  CHECK_FAILS(sh_attention_rope_forward(&o, &l, q6, k2, k2, 0, 0), SH_ERR_ARG, "theta");
  CHECK_FAILS(sh_attention_rope_forward(&o, &l, q5, q5, q5, 0, 1e4), SH_ERR_ARG, "even head dim");
  CHECK_FAILS(sh_rope_forward(&o, q3, 1e4), SH_ERR_ARG, "[B, H, T, D]");
  CHECK(o == NULL && l == NULL, "attention_rope: outputs must be NULL after an error");
  /* the _into forms: out of q's shape and dtype, lse contiguous f32 [B, H, T] */
  sh_tensor *l3 = mkf(3, (int64_t[]){1, 2, 3}, NULL), *o4 = mkf(4, (int64_t[]){1, 2, 3, 4}, NULL), *o16 = NULL;
  CHECK_OK(sh_tensor_empty(&o16, 4, q->shape, SH_BF16, -1));
  CHECK_FAILS(sh_attention_forward_into(o4, l3, q, k, q, 0), SH_ERR_ARG, "f32[1,2,4,4]");
  CHECK_FAILS(sh_attention_forward_into(k, l3, q, q, q, 0), SH_ERR_ARG, "out and q must have the same shape");
  CHECK_FAILS(sh_attention_forward_into(o16, l3, q, q, q, 0), SH_ERR_ARG, "out must have q's dtype");
  CHECK_FAILS(sh_attention_forward_into(o4, o4, q, q, q, 0), SH_ERR_ARG, "lse must have shape [1,2,3]");
  CHECK_FAILS(sh_attention_backward_into(NULL, k, NULL, q, q, q, q, q, l3, 0), SH_ERR_ARG, "dk and k must have the same shape");
  sh_tensor_destroy(l3); sh_tensor_destroy(o4); sh_tensor_destroy(o16);
  sh_tensor_destroy(q6); sh_tensor_destroy(k4); sh_tensor_destroy(k2); sh_tensor_destroy(q5);
  sh_tensor_destroy(q); sh_tensor_destroy(k); sh_tensor_destroy(q3);
}

/* ---- embedding ------------------------------------------------------------------------- */

static void test_embedding_case(int64_t A, int64_t n, int64_t V, int64_t C, int dtype) {
  int64_t is[2] = {A, n / A}, ws[2] = {V, C}, ys[3] = {A, n / A, C};
  double *idx = malloc(sizeof(double) * (size_t)n), *w = rvec(V * C, -1, 1), *r = rvec(n * C, -1, 1);
  for (int64_t i = 0; i < n; i++) idx[i] = (double)(int64_t)(urand() * V);   /* repeats when n > V */
  round_f32(w, V * C); round_f32(r, n * C);
  double *yref = malloc(sizeof(double) * (size_t)(n * C)), *dwref = calloc((size_t)(V * C), sizeof(double));
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < C; c++) {
      yref[i * C + c] = w[(int64_t)idx[i] * C + c];
      dwref[(int64_t)idx[i] * C + c] += 2 * r[i * C + c];     /* two backward calls */
    }
  sh_tensor *ti = mk(2, is, dtype, idx), *tw = mkf(2, ws, w), *tr = mkf(3, ys, r), *y = NULL, *dw = mkf(2, ws, NULL);
  CHECK_OK(sh_embedding_forward(&y, ti, tw));
  check_tensor("embedding forward", y, yref, 3, ys, 0);
  CHECK_OK(sh_embedding_backward(dw, tr, ti));
  CHECK_OK(sh_embedding_backward(dw, tr, ti));
  check_vals("embedding dw after two backwards", dw, dwref, TOL);
  sh_tensor_destroy(ti); sh_tensor_destroy(tw); sh_tensor_destroy(tr); sh_tensor_destroy(dw);
  free(idx); free(w); free(r); free(yref); free(dwref);
}

static void test_embedding(void) {
  test_embedding_case(2, 10, 7, 6, SH_I64);
  test_embedding_case(1, 3, 5, 1, SH_I32);
  test_embedding_case(12, 768, 65, 128, SH_I64);   /* the benchmark's token embedding: threaded */
  test_embedding_case(4, 64, 1000, 48, SH_I32);

  double bad[3] = {1, 7, 2};
  sh_tensor *idx = mk(1, (int64_t[]){3}, SH_I64, bad), *w = mkf(2, (int64_t[]){7, 4}, NULL), *y = NULL;
  sh_tensor *dy = mkf(2, (int64_t[]){3, 4}, NULL), *dw = mkf(2, (int64_t[]){7, 4}, NULL);
  CHECK_FAILS(sh_embedding_forward(&y, idx, w), SH_ERR_ARG, "index 7");
  CHECK_FAILS(sh_embedding_forward(&y, idx, w), SH_ERR_ARG, "V = 7");
  CHECK(y == NULL, "embedding: *y must be NULL after an error");
  CHECK_FAILS(sh_embedding_backward(dw, dy, idx), SH_ERR_ARG, "index 7");
  double neg[3] = {0, -1, 2};
  sh_tensor *idxn = mk(1, (int64_t[]){3}, SH_I32, neg), *idxf = mkf(1, (int64_t[]){3}, neg);
  CHECK_FAILS(sh_embedding_forward(&y, idxn, w), SH_ERR_ARG, "index -1");
  CHECK_FAILS(sh_embedding_forward(&y, idxf, w), SH_ERR_ARG, "i64 or i32");
  sh_tensor *dy5 = mkf(2, (int64_t[]){3, 5}, NULL);
  CHECK_FAILS(sh_embedding_backward(dw, dy5, idxn), SH_ERR_ARG, "f32[3,5]");
  sh_tensor_destroy(idx); sh_tensor_destroy(w); sh_tensor_destroy(dy); sh_tensor_destroy(dw);
  sh_tensor_destroy(idxn); sh_tensor_destroy(idxf); sh_tensor_destroy(dy5);
}

/* ---- cross-entropy --------------------------------------------------------------------- */

typedef struct ce_ctx { int64_t N, V, ignore; const double *t; } ce_ctx;

static void ce_ref(const void *c_, double *const *in, double *loss) {
  const ce_ctx *c = c_;
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < c->N; r++) {
    if ((int64_t)c->t[r] == c->ignore) continue;
    const double *x = in[0] + r * c->V;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c->V; j++) m = fmax(m, x[j]);
    for (int64_t j = 0; j < c->V; j++) s += exp(x[j] - m);
    sum += m + log(s) - x[(int64_t)c->t[r]];
    count++;
  }
  loss[0] = count ? sum / count : 0;
}

static void ce_ref_bwd(const ce_ctx *c, const double *x, double dloss, double *dx) {
  int64_t count = 0;
  for (int64_t r = 0; r < c->N; r++) count += (int64_t)c->t[r] != c->ignore;
  for (int64_t r = 0; r < c->N; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c->V; j++) m = fmax(m, x[r * c->V + j]);
    for (int64_t j = 0; j < c->V; j++) s += exp(x[r * c->V + j] - m);
    for (int64_t j = 0; j < c->V; j++) {
      int ign = (int64_t)c->t[r] == c->ignore;
      double p = exp(x[r * c->V + j] - m) / s - (j == (int64_t)c->t[r]);
      dx[r * c->V + j] = ign ? 0 : p * dloss / count;
    }
  }
}

static void test_ce_case(int64_t A, int64_t N, int64_t V, double ignored_frac, int dtype) {
  int64_t xs[3] = {A, N / A, V}, ts[2] = {A, N / A};
  double *x = rvec(N * V, -4, 4), *t = malloc(sizeof(double) * (size_t)N), dloss = 0.7;
  round_f32(x, N * V);
  for (int64_t r = 0; r < N; r++) t[r] = urand() < ignored_frac ? -100 : (double)(int64_t)(urand() * V);
  ce_ctx c = {N, V, -100, t};
  double loss_ref, *dxr = malloc(sizeof(double) * (size_t)(N * V)), *lref = malloc(sizeof(double) * (size_t)N);
  ce_ref(&c, (double *[]){x}, &loss_ref);
  ce_ref_bwd(&c, x, dloss, dxr);
  for (int64_t r = 0; r < N; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) m = fmax(m, x[r * V + j]);
    for (int64_t j = 0; j < V; j++) s += exp(x[r * V + j] - m);
    lref[r] = m + log(s);
  }
  fd_spec s = {&c, ce_ref, 1, {N * V}, 1, {x}};
  fd_check("cross_entropy", &s, &dloss, (double *[]){dxr});

  sh_tensor *tx = mkf(3, xs, x), *tt = mk(2, ts, dtype, t), *loss = NULL, *lse = NULL, *dx = NULL;
  char what[100];
  snprintf(what, sizeof what, "cross_entropy N=%lld V=%lld ignored=%g", (long long)N, (long long)V, ignored_frac);
  CHECK_OK(sh_cross_entropy_forward(&loss, &lse, tx, tt, -100));
  CHECK(loss && loss->ndim == 0, "%s: loss must be 0-dim", what);
  check_vals(what, loss, &loss_ref, TOL);
  check_tensor("cross_entropy lse", lse, lref, 2, ts, TOL);
  sh_tensor_destroy(loss);
  CHECK_OK(sh_cross_entropy_forward(&loss, &lse, tx, tt, -100));
  CHECK_OK(sh_cross_entropy_backward(&dx, tx, tt, lse, dloss, -100));
  check_tensor(what, dx, dxr, 3, xs, TOL);
  sh_tensor_destroy(loss); sh_tensor_destroy(lse); sh_tensor_destroy(tx); sh_tensor_destroy(tt);
  free(x); free(t); free(dxr); free(lref);
}

static void test_cross_entropy(void) {
  test_ce_case(1, 5, 3, 0.0, SH_I64);
  test_ce_case(2, 14, 65, 0.3, SH_I32);
  test_ce_case(12, 768, 65, 0.05, SH_I64);   /* the benchmark's loss: threaded */
  test_ce_case(1, 9, 1000, 0.2, SH_I64);
  test_ce_case(1, 4, 7, 1.0, SH_I64);        /* every target ignored: loss 0, dlogits 0 */

  double t[2] = {1, 5};
  sh_tensor *x = mkf(2, (int64_t[]){2, 5}, NULL), *tt = mk(1, (int64_t[]){2}, SH_I64, t), *loss = NULL, *lse = NULL;
  CHECK_FAILS(sh_cross_entropy_forward(&loss, &lse, x, tt, -100), SH_ERR_ARG, "target 5");
  CHECK(loss == NULL && lse == NULL, "cross_entropy: outputs must be NULL after an error");
  CHECK_OK(sh_cross_entropy_forward(&loss, &lse, x, tt, 5));          /* 5 is now ignored */
  sh_tensor_destroy(loss); sh_tensor_destroy(lse);
  sh_tensor *t3 = mk(1, (int64_t[]){3}, SH_I64, NULL), *dx = NULL;
  CHECK_FAILS(sh_cross_entropy_forward(&loss, &lse, x, t3, -100), SH_ERR_ARG, "i64[3]");
  CHECK_FAILS(sh_cross_entropy_backward(&dx, x, tt, x, 1.0, 5), SH_ERR_ARG, "lse must have shape [2]");
  sh_tensor_destroy(x); sh_tensor_destroy(tt); sh_tensor_destroy(t3);
}

/* ---- optimizers ------------------------------------------------------------------------ */

static void test_adamw_case(int64_t n, int grad_dtype, int shadow_dtype) {
  double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1, gs = 0.5;
  double *p = rvec(n, -1, 1), *m = calloc((size_t)n, sizeof(double)), *v = calloc((size_t)n, sizeof(double));
  round_f32(p, n);
  sh_tensor *tp = mkf(1, &n, p), *tm = mkf(1, &n, NULL), *tv = mkf(1, &n, NULL);
  sh_tensor *sh = shadow_dtype >= 0 ? mk(1, &n, shadow_dtype, NULL) : NULL;
  for (int64_t step = 1; step <= 5; step++) {
    double *g = rvec(n, -1, 1);
    sh_tensor *tg = mk(1, &n, grad_dtype, g);
    double *gq = rd(tg);                              /* the grad as stored (bf16-rounded) */
    CHECK_OK(sh_adamw_step_(tp, tg, tm, tv, sh, lr, b1, b2, eps, wd, step, gs));
    for (int64_t i = 0; i < n; i++) {                 /* torch.optim.AdamW, in f64 */
      double gi = gq[i] * gs;
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
      p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
    }
    sh_tensor_destroy(tg);
    free(g); free(gq);
  }
  check_vals("adamw param", tp, p, TOL);
  check_vals("adamw m", tm, m, TOL);
  check_vals("adamw v", tv, v, TOL);
  if (sh) {
    double *pf = rd(tp), *sv = rd(sh);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
      float f = (float)pf[i];
      double want = shadow_dtype == SH_BF16 ? sh_bf16_to_f32(sh_f32_to_bf16(f))
                  : shadow_dtype == SH_F16 ? sh_f16_to_f32(sh_f32_to_f16(f)) : f;
      bad += sv[i] != want;
    }
    CHECK(bad == 0, "adamw shadow: %lld elements differ from the rounded param", (long long)bad);
    free(pf); free(sv);
  }
  sh_tensor_destroy(tp); sh_tensor_destroy(tm); sh_tensor_destroy(tv); sh_tensor_destroy(sh);
  free(p); free(m); free(v);
}

static void test_sgd_case(int64_t n, double momentum, double dampening, double wd, int nesterov, int grad_dtype) {
  double lr = 0.05, gs = 2.0;
  double *p = rvec(n, -1, 1), *buf = calloc((size_t)n, sizeof(double));
  round_f32(p, n);
  sh_tensor *tp = mkf(1, &n, p), *tb = momentum != 0 ? mkf(1, &n, NULL) : NULL;
  for (int step = 1; step <= 4; step++) {
    double *g = rvec(n, -1, 1);
    sh_tensor *tg = mk(1, &n, grad_dtype, g);
    double *gq = rd(tg);
    CHECK_OK(sh_sgd_step_(tp, tg, tb, lr, momentum, dampening, wd, nesterov, step == 1, gs));
    for (int64_t i = 0; i < n; i++) {                 /* torch.optim.SGD, in f64 */
      double d = gq[i] * gs + wd * p[i];
      if (momentum != 0) {
        buf[i] = step == 1 ? d : momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
    sh_tensor_destroy(tg);
    free(g); free(gq);
  }
  check_vals("sgd param", tp, p, TOL);
  if (tb) check_vals("sgd momentum", tb, buf, TOL);
  sh_tensor_destroy(tp); sh_tensor_destroy(tb);
  free(p); free(buf);
}

static void test_optim(void) {
  test_adamw_case(1, SH_F32, -1);
  test_adamw_case(37, SH_BF16, SH_BF16);
  test_adamw_case(100003, SH_F32, SH_BF16);       /* threaded */
  test_adamw_case(1000, SH_BF16, SH_F16);
  test_adamw_case(999, SH_F32, SH_F32);
  test_sgd_case(17, 0, 0, 0, 0, SH_F32);
  test_sgd_case(100003, 0.9, 0.1, 0.01, 0, SH_F32);
  test_sgd_case(33, 0.9, 0, 0.01, 1, SH_BF16);

  int64_t n = 4, n5 = 5;
  sh_tensor *p = mkf(1, &n, NULL), *g = mkf(1, &n, NULL), *g5 = mkf(1, &n5, NULL), *gi = mk(1, &n, SH_I32, NULL);
  sh_tensor *pd = mk(1, &n, SH_F64, NULL), *m = mkf(1, &n, NULL), *v = mkf(1, &n, NULL);
  CHECK_FAILS(sh_adamw_step_(p, g5, m, v, NULL, 1e-3, 0.9, 0.99, 1e-8, 0, 1, 1), SH_ERR_ARG, "grad has 5 elements");
  CHECK_FAILS(sh_adamw_step_(p, gi, m, v, NULL, 1e-3, 0.9, 0.99, 1e-8, 0, 1, 1), SH_ERR_ARG, "i32[4]");
  CHECK_FAILS(sh_adamw_step_(pd, g, m, v, NULL, 1e-3, 0.9, 0.99, 1e-8, 0, 1, 1), SH_ERR_ARG, "param must be f32");
  CHECK_FAILS(sh_adamw_step_(p, g, m, v, NULL, 1e-3, 0.9, 0.99, 1e-8, 0, 0, 1), SH_ERR_ARG, "1-based");
  CHECK_FAILS(sh_adamw_step_(p, g, m, v, NULL, 1e-3, 1.0, 0.99, 1e-8, 0, 1, 1), SH_ERR_ARG, "betas");
  CHECK_FAILS(sh_sgd_step_(p, g, NULL, 0.1, 0.9, 0, 0, 0, 1, 1), SH_ERR_ARG, "momentum_buf");
  CHECK_FAILS(sh_sgd_step_(p, g, m, 0.1, 0.9, 0.1, 0, 1, 1, 1), SH_ERR_ARG, "nesterov");
  sh_tensor_destroy(p); sh_tensor_destroy(g); sh_tensor_destroy(g5); sh_tensor_destroy(gi);
  sh_tensor_destroy(pd); sh_tensor_destroy(m); sh_tensor_destroy(v);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_linear);
  RUN(test_norms);
  RUN(test_layernorm_residual);
  RUN(test_activations);
  RUN(test_linear_gelu);
  RUN(test_dropout);
  RUN(test_attention_blocks);
  RUN(test_attention);
  RUN(test_embedding);
  RUN(test_cross_entropy);
  RUN(test_optim);
  return check_summary("test_nn");
}
