/* matmul.c: matmul and gemm_: the fronts (checks, result shape and dtype, for every
 * device) and the CPU kernels, through OpenBLAS (sgemm for f32 and f16; dgemm for f64) and,
 * when both operands are bf16, sh_gemm_bf16 (AVX-512 BF16 with f32 sums, gemm_bf16.c) into
 * an f32 product.
 *
 * A matrix operand is (pointer, rows, cols, row stride, col stride). BLAS reads it in place
 * when one stride is 1: row-major as is, column-major (a transposed view, x:t()) with the
 * transpose flag, so transposes cost no copy; only other layouts (both strides > 1, a
 * broadcast dim) and other dtypes are copied into a dense f32/f64 tensor first. A product
 * into a column-major C is computed as C^T = B^T A^T, again without a copy.
 * Batched products whose right operand is shared ([B,T,C] @ [C,N], a Linear) fold the
 * batch into the rows and make one large gemm. Other batches loop over gemms, each split
 * over the thread team by sh_sgemm (blas.c); when each product is too small for sh_sgemm to
 * split (it runs those on the calling thread), the team spreads the batch instead.
 * The fronts are ops/matmul.c. */
#include "blas_internal.h"
#include "cpu_internal.h"
#include "core/rules_internal.h"
#include "core/parallel.h"
#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

/* Batches of products under SH_SGEMM_SPLIT_MIN_WORK with more multiply-adds than this in all
 * are worth the thread team. */
enum { PAR_MIN = 32768 };

typedef struct mat {
  char *p;              /* element [0, 0] */
  int64_t rows, cols, rs, cs;
  int dt;               /* element dtype */
} mat;

static mat mat_of(const sh_tensor *t, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  int esz = sh_dtype_size(t->dtype);
  return (mat){(char *)t->storage->data + t->offset * esz, rows, cols, rs, cs, t->dtype};
}

static mat transposed(mat m) { return (mat){m.p, m.cols, m.rows, m.cs, m.rs, m.dt}; }

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* How BLAS reads m in place: row-major (trans 0, ld = rs) or column-major (trans 1,
 * ld = cs). 0 when it needs a copy. A single row or column takes any stride on its unit
 * axis. */
static int blas_layout(mat m, int *trans, int64_t *ld) {
  int64_t r1 = m.rows > 1 ? m.rows : 1, c1 = m.cols > 1 ? m.cols : 1;
  if ((m.cs == 1 || m.cols <= 1) && (m.rows <= 1 || m.rs >= c1)) {
    *trans = 0;
    *ld = m.rows <= 1 ? c1 : m.rs;
  } else if ((m.rs == 1 || m.rows <= 1) && (m.cols <= 1 || m.cs >= r1)) {
    *trans = 1;
    *ld = m.cols <= 1 ? r1 : m.cs;
  } else {
    return 0;
  }
  return fits_int(*ld);
}

static int readable(mat m) { int t; int64_t ld; return blas_layout(m, &t, &ld); }

/* c = alpha a @ b + beta c for matrices that BLAS can read (readable()): c f32 or f64, a and
 * b c's dtype or both bf16 (then c is f32). */
static int gemm(mat c, mat a, mat b, double alpha, double beta) {
  int dt = c.dt;
  if (!(c.cs == 1 || c.cols <= 1)) {          /* column-major c: c^T = b^T a^T */
    mat at = transposed(a);
    a = transposed(b);
    b = at;
    c = transposed(c);
  }
  int64_t m = c.rows, n = c.cols, k = a.cols;
  if (m == 0 || n == 0) return SH_OK;
  int ta, tb;
  int64_t lda, ldb, ldc = c.rows <= 1 ? (n > 1 ? n : 1) : c.rs;
  blas_layout(a, &ta, &lda);
  blas_layout(b, &tb, &ldb);
  if (k == 0) {                               /* BLAS may skip c entirely; define it */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        char *e = c.p + (i * c.rs + j * c.cs) * sh_dtype_size(dt);
        if (dt == SH_F32) *(float *)e = beta == 0 ? 0.0f : (float)(beta * *(float *)e);
        else *(double *)e = beta == 0 ? 0.0 : beta * *(double *)e;
      }
    return SH_OK;
  }
  CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
  if (a.dt == SH_BF16)
    return sh_gemm_bf16(tra, trb, (int)m, (int)n, (int)k, (float)alpha, (const uint16_t *)a.p, (int)lda,
                        (const uint16_t *)b.p, (int)ldb, (float)beta, (float *)c.p, (int)ldc);
  if (dt == SH_F32)
    sh_sgemm(tra, trb, (int)m, (int)n, (int)k, (float)alpha, (const float *)a.p, (int)lda,
                (const float *)b.p, (int)ldb, (float)beta, (float *)c.p, (int)ldc);
  else
    cblas_dgemm(CblasRowMajor, tra, trb, (int)m, (int)n, (int)k, alpha, (const double *)a.p, (int)lda,
                (const double *)b.p, (int)ldb, beta, (double *)c.p, (int)ldc);
  return SH_OK;
}

/* The dtype BLAS computes in: f64 for f64, else f32. */
static int blas_dtype(int dtype) { return dtype == SH_F64 ? SH_F64 : SH_F32; }

/* The dtype the operands are read in: bf16 when both are (sh_gemm_bf16), else c's. */
static int input_dtype(const sh_tensor *a, const sh_tensor *b, int dt) {
  return a->dtype == SH_BF16 && b->dtype == SH_BF16 ? SH_BF16 : dt;
}

/* ---- matmul -------------------------------------------------------------------------- */

/* One operand of matmul seen as a batch of matrices. */
typedef struct operand {
  const sh_tensor *t;   /* the tensor read (possibly a converted copy) */
  int64_t rows, cols, rs, cs;
} operand;

/* a as [..., M, K] (1-D: one row) or b as [..., K, N] (1-D: one column). */
static operand operand_of(const sh_tensor *t, int is_b) {
  int n = t->ndim;
  if (n == 1)
    return is_b ? (operand){t, t->shape[0], 1, t->stride[0], 1} : (operand){t, 1, t->shape[0], t->shape[0] * t->stride[0], t->stride[0]};
  return (operand){t, t->shape[n - 2], t->shape[n - 1], t->stride[n - 2], t->stride[n - 1]};
}

/* Every matrix of the batch readable in place by BLAS (they share strides). */
static int operand_readable(const operand *o) { return readable((mat){NULL, o->rows, o->cols, o->rs, o->cs, 0}); }

/* Makes *own a dense copy of t in dtype dt when t is another dtype or BLAS cannot read it. */
static int prepare(operand *o, sh_tensor **own, int dt, int is_b) {
  if (o->t->dtype == dt && operand_readable(o)) return SH_OK;
  SH_TRY(sh_kernel_to(own, o->t, dt));
  *o = operand_of(*own, is_b);
  return SH_OK;
}

static int batch_dims(const sh_tensor *t) { return t->ndim > 2 ? t->ndim - 2 : 0; }

typedef struct batch_plan {
  int nb;                      /* batch dims */
  int64_t shape[SH_MAX_DIMS], sa[SH_MAX_DIMS], sb[SH_MAX_DIMS];
  int64_t count;
} batch_plan;

/* The batch dims of out (those before its matrix dims, which the front broadcast from a's
 * and b's) and each operand's strides along them: 0 where the operand is broadcast. */
static void plan_batch(batch_plan *bp, const sh_tensor *out, const sh_tensor *a, const sh_tensor *b) {
  int na = batch_dims(a), nb = batch_dims(b);
  bp->nb = out->ndim - (a->ndim > 1) - (b->ndim > 1);
  bp->count = 1;
  for (int d = 0; d < bp->nb; d++) {
    int da = d - (bp->nb - na), db = d - (bp->nb - nb);
    bp->shape[d] = out->shape[d];
    bp->sa[d] = da >= 0 && a->shape[da] != 1 ? a->stride[da] : 0;
    bp->sb[d] = db >= 0 && b->shape[db] != 1 ? b->stride[db] : 0;
    bp->count *= bp->shape[d];
  }
}

/* Batches i0 .. i1 of a batched product, each its own gemm (small ones: see run_batches). */
typedef struct batches_job {
  const batch_plan *bp;
  mat ma, mb, mc;
  int64_t ea, eb, ec;
  _Atomic int rc;
} batches_job;

static void batches_task(void *arg, int64_t i0, int64_t i1) {
  batches_job *j = arg;
  const batch_plan *bp = j->bp;
  for (int64_t i = i0; i < i1; i++) {
    int64_t oa = 0, ob = 0, rest = i;
    for (int d = bp->nb - 1; d >= 0; d--) {
      int64_t x = rest % bp->shape[d];
      rest /= bp->shape[d];
      oa += x * bp->sa[d];
      ob += x * bp->sb[d];
    }
    mat xa = j->ma, xb = j->mb, xc = j->mc;
    xa.p += oa * j->ea;
    xb.p += ob * j->eb;
    xc.p += i * j->mc.rows * j->mc.cols * j->ec;
    int rc = gemm(xc, xa, xb, 1.0, 0.0);
    if (rc) atomic_fetch_or(&j->rc, rc);
  }
}

/* Runs the batch of products into the dense tensor c. */
static int run_batches(sh_tensor *c, const operand *a, const operand *b, const batch_plan *bp) {
  int64_t m = a->rows, n = b->cols, k = a->cols;
  int64_t ea = sh_dtype_size(a->t->dtype), eb = sh_dtype_size(b->t->dtype), ec = sh_dtype_size(c->dtype);
  mat ma = mat_of(a->t, m, k, a->rs, a->cs), mb = mat_of(b->t, k, n, b->rs, b->cs);
  mat mc = mat_of(c, m, n, n, 1);
  int b_shared = 1;
  for (int d = 0; d < bp->nb; d++) b_shared &= bp->sb[d] == 0 || bp->shape[d] == 1;
  /* [batch..., M, K] @ shared [K, N]: one gemm over batch*M rows when batch i's matrix
   * starts where row i*M would, i.e. each batch dim's stride spans the dims inside it */
  if (b_shared && bp->count > 1) {
    int64_t expect = m * a->rs;
    int line = 1;
    for (int d = bp->nb - 1; d >= 0 && line; d--) {
      if (bp->shape[d] == 1) continue;
      line = bp->sa[d] == expect;
      expect *= bp->shape[d];
    }
    mat fa = ma, fc = mc;
    fa.rows = fc.rows = bp->count * m;
    if (line && fits_int(fa.rows) && (a->cs == 1 || k <= 1) && readable(fa)) return gemm(fc, fa, mb, 1.0, 0.0);
  }
  int par = bp->count > 1 && m * n * k < SH_SGEMM_SPLIT_MIN_WORK && bp->count * m * n * k > PAR_MIN;
  batches_job job = { bp, ma, mb, mc, ea, eb, ec, SH_OK };
  sh_parallel_for(bp->count, par, batches_task, &job);
  return job.rc;
}

/* out = a @ b; out is dense in the promoted dtype, which BLAS computes in unless it is
 * bf16/f16 (then through an f32 product converted at the end; two bf16 operands are read as
 * they are). */
int sh_kcpu_matmul(sh_tensor *out, const sh_tensor *a, const sh_tensor *b) {
  operand oa = operand_of(a, 0), ob = operand_of(b, 1);
  if (!fits_int(oa.rows) || !fits_int(oa.cols) || !fits_int(ob.cols))
    return sh_fail(SH_ERR_ARG, "matmul: dims beyond 2^31 are not supported (%s @ %s)", sh_desc(a), sh_desc(b));
  int dt = blas_dtype(out->dtype), it = input_dtype(a, b, dt);
  sh_tensor *ca = NULL, *cb = NULL, *c = NULL;
  int rc = prepare(&oa, &ca, it, 0);
  if (!rc) rc = prepare(&ob, &cb, it, 1);
  if (!rc && out->dtype != dt) rc = sh_tensor_empty(&c, out->ndim, out->shape, dt, -1);
  if (!rc) {
    batch_plan bp;
    plan_batch(&bp, out, oa.t, ob.t);   /* the strides of the (possibly copied) operands */
    rc = run_batches(c ? c : out, &oa, &ob, &bp);
    if (c && !rc) rc = sh_kernel_copy_(out, c);
  }
  sh_tensor_destroy(ca);
  sh_tensor_destroy(cb);
  sh_tensor_destroy(c);
  return rc;
}

/* ---- gemm_ ----------------------------------------------------------------------------- */

static mat mat_2d(const sh_tensor *t, int trans) {
  mat m = mat_of(t, t->shape[0], t->shape[1], t->stride[0], t->stride[1]);
  return trans ? transposed(m) : m;
}

/* A dense copy of t in dtype dt when BLAS cannot use t as it is. */
static int blas_input(const sh_tensor *t, int dt, sh_tensor **own, const sh_tensor **use) {
  *use = t;
  if (t->dtype == dt && readable(mat_2d(t, 0))) return SH_OK;
  SH_TRY(sh_kernel_to(own, t, dt));
  *use = *own;
  return SH_OK;
}

int sh_kcpu_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
                  double alpha, double beta) {
  mat la = mat_2d(a, trans_a), lb = mat_2d(b, trans_b);
  if (!fits_int(la.rows) || !fits_int(la.cols) || !fits_int(lb.cols))
    return sh_fail(SH_ERR_ARG, "gemm_: dims beyond 2^31 are not supported (c %s)", sh_desc(c));
  int dt = blas_dtype(c->dtype), it = input_dtype(a, b, dt);
  sh_tensor *ca = NULL, *cb = NULL, *cc = NULL;
  const sh_tensor *ua, *ub;
  int rc = blas_input(a, it, &ca, &ua);
  if (!rc) rc = blas_input(b, it, &cb, &ub);
  /* c itself must be f32/f64 with a unit stride; else compute into a dense copy */
  int direct = c->dtype == dt && (c->stride[1] == 1 || c->shape[1] <= 1 || c->stride[0] == 1 || c->shape[0] <= 1) &&
               readable(mat_2d(c, 0));
  if (!rc && !direct) rc = beta != 0 ? sh_kernel_to(&cc, c, dt) : sh_tensor_empty(&cc, 2, c->shape, dt, -1);
  if (!rc) {
    rc = gemm(mat_2d(direct ? c : cc, 0), mat_2d(ua, trans_a), mat_2d(ub, trans_b), alpha, beta);
    if (!direct && !rc) rc = sh_kernel_copy_(c, cc);
  }
  sh_tensor_destroy(ca);
  sh_tensor_destroy(cb);
  sh_tensor_destroy(cc);
  return rc;
}
