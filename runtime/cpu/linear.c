/* linear.c: the CPU kernels of y = x @ w^T + b, its backward, and their fusions with gelu
 * (the fronts are ops/linear.c).
 * The CPU runs one sgemm over all rows of x (x seen as [rows, in]). w keeps PyTorch's
 * [out, in] layout so checkpoints load as they are; sgemm reads it transposed for free.
 * Backward: dx = dy @ w (new), dw += dy^T @ x through sgemm's beta = 1, db += column sums of
 * dy. y and dx take x's dtype; math is f32, and a product whose two operands are bf16 (mixed
 * precision) reads them as they are through sh_gemm_bf16 (AVX-512 BF16, f32 sums) and writes
 * a bf16 y, dx or dw in place, rounded once. The
 * fusions are their compositions on the CPU: linear then gelu, and linear backward then gelu
 * backward (what CUDA's epilogues equal).
 * The fronts are ops/linear.c. */
#include <cblas.h>
#include "blas_internal.h"
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

/* ---- CPU kernels: arguments checked and outputs allocated by the fronts below ---------- */

static int dense_bf16(const sh_tensor *t) { return t->dtype == SH_BF16 && sh_tensor_is_contiguous(t); }

/* Both operands of a product dense bf16 (mixed precision's parameters and activations):
 * the product reads them as they are through sh_gemm_bf16 (f32 sums). Otherwise its
 * operands are staged in f32 for sgemm. */
static int bf16_pair(const sh_tensor *a, const sh_tensor *b) { return dense_bf16(a) && dense_bf16(b); }

static const uint16_t *bf16_ptr(const sh_tensor *t) { return (const uint16_t *)sh_tensor_data(t); }

/* One operand of a product: t as it is (bf16) or its f32 staging. */
typedef struct operand { const sh_tensor *src; sh_tensor *f32; } operand;

static int operand_stage(operand *o, const sh_tensor *t, int bf16, const char *op, const char *name) {
  o->src = t;
  o->f32 = NULL;
  return bf16 ? SH_OK : sh_stage_f32(&o->f32, t, op, name);
}

/* Where a product lands: in place when the product runs in bf16 and the output is dense
 * bf16 (rounded once, at the kernel's store), else an f32 buffer copied back at the end
 * (sh_stage_accum; accumulate: it starts as the output's values). */
typedef struct dest { sh_tensor *direct; sh_stage_accum acc; } dest;

static int dest_begin(dest *d, sh_tensor *t, int low, int accumulate, const char *op, const char *name) {
  d->direct = NULL;
  d->acc = (sh_stage_accum){0};
  if (low && dense_bf16(t)) { d->direct = t; return SH_OK; }
  return accumulate ? sh_stage_accum_begin(&d->acc, t, op, name) : sh_stage_out_begin(&d->acc, t);
}

static sh_tensor *dest_tensor(const dest *d) { return d->direct ? d->direct : d->acc.buf; }

static int dest_end(dest *d) {
  if (!d->direct) return sh_stage_accum_end(&d->acc);
  d->direct->version++;
  return SH_OK;
}

/* c = op(a) op(b) + beta c (lda, ldb: the operands' row lengths as stored; c dense f32, or
 * bf16 for a bf16 product), then `rows` over c's rows (f32 products only; may be NULL). */
static int product(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const operand *a,
                   int64_t lda, const operand *b, int64_t ldb, float beta, sh_tensor *c, const sh_sgemm_rows *rows) {
  if (a->f32) {
    sh_sgemm_then(ta, tb, (int)m, (int)n, (int)k, 1.0f, sh_stage_ptr(a->f32), (int)lda, sh_stage_ptr(b->f32), (int)ldb, beta,
                  sh_stage_ptr(c), (int)n, rows);
    return SH_OK;
  }
  const uint16_t *ap = bf16_ptr(a->src), *bp = bf16_ptr(b->src);
  if (c->dtype == SH_BF16)
    return sh_gemm_bf16_out16(ta, tb, (int)m, (int)n, (int)k, 1.0f, ap, (int)lda, bp, (int)ldb, beta,
                              (uint16_t *)sh_tensor_data(c), (int)n);
  return sh_gemm_bf16(ta, tb, (int)m, (int)n, (int)k, 1.0f, ap, (int)lda, bp, (int)ldb, beta, sh_stage_ptr(c), (int)n);
}

/* y[r, :] = b for every row, so that the product can add x w^T with beta = 1: in y's dtype,
 * f32 or (a bf16 y written in place, whose b is then bf16 too) bf16. */
static void fill_bias(sh_tensor *y, const void *b, int64_t rows, int64_t n) {
  size_t row = (size_t)n * sh_dtype_size(y->dtype);
  for (int64_t r = 0; r < rows; r++) memcpy((char *)sh_tensor_data(y) + r * row, b, row);
}

/* y = x w^T + b, then `rows` over y's rows when given (an f32 product into a dense f32 y). */
static int linear_forward(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b,
                          const sh_sgemm_rows *epilogue) {
  const char *op = "linear";
  int64_t in = x->shape[x->ndim - 1], nout = w->shape[0], rows = sh_tensor_rows(x);
  int low = bf16_pair(x, w);
  operand ox = {0}, ow = {0};
  sh_tensor *bc = NULL;
  dest dy = {0};
  int rc = operand_stage(&ox, x, low, op, "x");
  if (!rc) rc = operand_stage(&ow, w, low, op, "w");
  /* y in place needs b on its grid already: a bf16 b */
  if (!rc) rc = dest_begin(&dy, y, low && (!b || dense_bf16(b)), 0, op, "y");
  if (!rc && b && !dy.direct) rc = sh_stage_f32(&bc, b, op, "b");
  if (!rc) {
    sh_tensor *c = dest_tensor(&dy);
    if (rows > 0 && nout > 0) {
      if (b) fill_bias(c, bc ? sh_tensor_data(bc) : sh_tensor_data(b), rows, nout);
      else if (in == 0) memset(sh_tensor_data(c), 0, (size_t)(rows * nout) * sh_dtype_size(c->dtype));
      if (in > 0) rc = product(CblasNoTrans, CblasTrans, rows, nout, in, &ox, in, &ow, in, b ? 1.0f : 0.0f, c, epilogue);
    }
    if (!rc) rc = dest_end(&dy);
  }
  sh_stage_accum_drop(&dy.acc);
  sh_tensor_destroy(ox.f32); sh_tensor_destroy(ow.f32); sh_tensor_destroy(bc);
  return rc;
}

/* db[j] += sum over rows of dy[r, j]; rows run in order so the sum is deterministic. */
static void column_sums(float *db, const float *dy, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++) {
    const float *row = dy + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) db[j] += row[j];
  }
}

int sh_kcpu_linear_forward(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  return linear_forward(y, x, w, b, NULL);
}

/* The backward, with `epilogue` (NULL, or when the dx product is f32 into a dense f32 dx) run
 * over dx's rows; set_dw: the dw product writes dw (beta 0) instead of adding into it. */
static int linear_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                           const sh_tensor *w, const sh_sgemm_rows *epilogue, int set_dw) {
  const char *op = "linear_backward";
  int64_t in = x->shape[x->ndim - 1], nout = w->shape[0], rows = sh_tensor_rows(x);
  int full = rows > 0 && in > 0 && nout > 0;
  /* dx = dy w and dw += dy^T x each run in bf16 when both their operands are bf16; dy is
   * staged in f32 for a product that is not, and for db */
  int lowx = dx && bf16_pair(dy, w), loww = dw && bf16_pair(dy, x);
  int dy32 = (dx && !lowx) || (dw && !loww) || db;
  operand ody = {0}, ody16 = {dy, NULL}, ox = {0}, ow = {0};
  dest dx_ = {0}, dw_ = {0};
  sh_stage_accum ab = {0};
  int rc = operand_stage(&ody, dy, !dy32, op, "dy");
  if (!rc && dw) rc = operand_stage(&ox, x, loww, op, "x");
  if (!rc && dx) rc = operand_stage(&ow, w, lowx, op, "w");
  if (!rc && dx) rc = dest_begin(&dx_, dx, lowx, 0, op, "dx");
  if (!rc && dw) rc = dest_begin(&dw_, dw, loww, !set_dw, op, "dw");
  if (!rc && db) rc = sh_stage_accum_begin(&ab, db, op, "db");
  if (rc) goto done;
  /* the dx product writes every element (beta 0) unless a dim is empty */
  if (dx && full)
    rc = product(CblasNoTrans, CblasNoTrans, rows, in, nout, lowx ? &ody16 : &ody, nout, &ow, in, 0.0f,
                 dest_tensor(&dx_), epilogue);
  else if (dx)
    memset(sh_tensor_data(dest_tensor(&dx_)), 0, (size_t)sh_tensor_numel(dx) * sh_dtype_size(dest_tensor(&dx_)->dtype));
  if (!rc && dw && full)
    rc = product(CblasTrans, CblasNoTrans, nout, in, rows, loww ? &ody16 : &ody, nout, &ox, in, set_dw ? 0.0f : 1.0f,
                 dest_tensor(&dw_), NULL);
  if (rc) goto done;
  if (db) column_sums(sh_stage_ptr(ab.buf), sh_stage_ptr(ody.f32), rows, nout);
  if (dx) rc = dest_end(&dx_);
  if (!rc && dw) rc = dest_end(&dw_);
  if (!rc && db) rc = sh_stage_accum_end(&ab);
done:
  sh_stage_accum_drop(&dx_.acc); sh_stage_accum_drop(&dw_.acc); sh_stage_accum_drop(&ab);
  sh_tensor_destroy(ody.f32); sh_tensor_destroy(ox.f32); sh_tensor_destroy(ow.f32);
  return rc;
}

int sh_kcpu_linear_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                            const sh_tensor *x, const sh_tensor *w, int set_dw) {
  return linear_backward(dx, dw, db, dy, x, w, NULL, set_dw);
}

/* The gelu fusions' epilogue: rows of a [rows, n] product (pre, or dpre holding dy @ w) go
 * through gelu into out (the forward's y; dpre itself, in place, for backward). */
typedef struct gelu_rows { const float *pre; float *out; int64_t n; } gelu_rows;

static void gelu_fwd_rows(const void *ctx, int r0, int r1) {
  const gelu_rows *g = ctx;
  sh_stage_gelu_f32(g->pre + r0 * g->n, g->out + r0 * g->n, (r1 - r0) * g->n);
}

static void gelu_bwd_rows(const void *ctx, int r0, int r1) {
  const gelu_rows *g = ctx;
  float *d = g->out + r0 * g->n;
  sh_stage_gelu_backward_f32(d, g->pre + r0 * g->n, d, (r1 - r0) * g->n);
}

/* An f32 product whose [rows, n] output is dense f32 (so the product writes it in place)
 * and whose epilogue reads and writes dense f32 rows: the fusions then run gelu on each
 * thread's rows inside the product's parallel region. */
static int fusable(const sh_tensor *a, const sh_tensor *b, const sh_tensor *out, const sh_tensor *pre) {
  int f32 = !bf16_pair(a, b) && out->dtype == SH_F32 && pre->dtype == SH_F32;
  return f32 && sh_tensor_is_contiguous(out) && sh_tensor_is_contiguous(pre) && sh_tensor_numel(out) > 0 &&
         a->shape[a->ndim - 1] > 0;
}

int sh_kcpu_linear_gelu_forward(sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                                const sh_tensor *b) {
  if (fusable(x, w, pre, y)) {
    gelu_rows g = {sh_stage_ptr(pre), sh_stage_ptr(y), w->shape[0]};
    return linear_forward(pre, x, w, b, &(sh_sgemm_rows){gelu_fwd_rows, &g});
  }
  SH_TRY(sh_kcpu_linear_forward(pre, x, w, b));
  return sh_kcpu_gelu_forward(y, pre);
}

/* The gelu backward runs in place on dpre: it is elementwise, each element read then written. */
int sh_kcpu_linear_backward_dgelu(sh_tensor *dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                  const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set_dw) {
  if (dpre && fusable(dy, w, dpre, pre)) {
    gelu_rows g = {sh_stage_ptr(pre), sh_stage_ptr(dpre), w->shape[1]};
    return linear_backward(dpre, dw, db, dy, x, w, &(sh_sgemm_rows){gelu_bwd_rows, &g}, set_dw);
  }
  SH_TRY(sh_kcpu_linear_backward(dpre, dw, db, dy, x, w, set_dw));   /* dpre holds dy @ w */
  return sh_kcpu_gelu_backward(dpre, dpre, pre);
}
