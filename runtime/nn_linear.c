/* nn_linear.c: y = x @ w^T + b as one sgemm over all rows of x (x seen as [rows, in]).
 * w keeps PyTorch's [out, in] layout so checkpoints load as they are; sgemm reads it
 * transposed for free. Backward: dx = dy @ w (new), dw += dy^T @ x through sgemm's beta = 1,
 * db += column sums of dy. y and dx take x's dtype; math is f32. */
#include <cblas.h>
#include "backend_internal.h"
#include "blas_internal.h"
#include "nn_internal.h"
#include "nn.h"
#include "cuda_internal.h"

static int check_linear(const char *op, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  SH_TRY(sh_nn_check_float(x, op, "x"));
  SH_TRY(sh_nn_check_float(w, op, "w"));
  if (x->ndim < 1) return sh_fail(SH_ERR_ARG, "%s: x must have at least 1 dim [..., in], got %s", op, sh_desc(x));
  int64_t in = x->shape[x->ndim - 1];
  SH_TRY(sh_nn_check_shape(w, op, "w", 2, (int64_t[]){-1, in}));
  if (b) {
    SH_TRY(sh_nn_check_float(b, op, "b"));
    SH_TRY(sh_nn_check_shape(b, op, "b", 1, (int64_t[]){w->shape[0]}));
  }
  return SH_OK;
}

/* y[r, :] = b for every row, so that sgemm can add x w^T with beta = 1. */
static void fill_bias(float *y, const float *b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++) memcpy(y + r * n, b, (size_t)n * sizeof(float));
}

int sh_linear_forward(sh_tensor **y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  if (x && x->device >= 0) return sh_cuda_linear_forward(y, x, w, b);
  const char *op = "linear";
  *y = NULL;
  SH_TRY(check_linear(op, x, w, b));
  sh_tensor *xc = NULL, *wc = NULL, *bc = NULL, *out = NULL;
  int64_t in = x->shape[x->ndim - 1], nout = w->shape[0], rows = sh_nn_rows(x);
  int64_t shape[8];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = nout;
  int rc = sh_nn_f32(&xc, x, op, "x");
  if (!rc) rc = sh_nn_f32(&wc, w, op, "w");
  if (!rc && b) rc = sh_nn_f32(&bc, b, op, "b");
  if (!rc) rc = sh_nn_new_f32(&out, x->ndim, shape);
  if (rc) goto done;
  float *yp = sh_nn_ptr(out);
  if (rows > 0 && nout > 0) {
    if (bc) fill_bias(yp, sh_nn_ptr(bc), rows, nout);
    else if (in == 0) memset(yp, 0, (size_t)(rows * nout) * sizeof(float));
    if (in > 0)
      sh_sgemm(CblasNoTrans, CblasTrans, (int)rows, (int)nout, (int)in, 1.0f,
                  sh_nn_ptr(xc), (int)in, sh_nn_ptr(wc), (int)in, bc ? 1.0f : 0.0f, yp, (int)nout);
  }
  rc = sh_nn_finish(&out, x->dtype);
done:
  sh_tensor_destroy(xc); sh_tensor_destroy(wc); sh_tensor_destroy(bc);
  if (rc) sh_tensor_destroy(out);
  else *y = out;
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

int sh_linear_backward(sh_tensor **dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                       const sh_tensor *x, const sh_tensor *w) {
  if (x && x->device >= 0) return sh_cuda_linear_backward(dx, dw, db, dy, x, w);
  const char *op = "linear_backward";
  if (dx) *dx = NULL;
  SH_TRY(check_linear(op, x, w, NULL));
  SH_TRY(sh_nn_check_float(dy, op, "dy"));
  int64_t in = x->shape[x->ndim - 1], nout = w->shape[0], rows = sh_nn_rows(x);
  int64_t shape[8];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = nout;
  SH_TRY(sh_nn_check_shape(dy, op, "dy", x->ndim, shape));
  if (dw) SH_TRY(sh_nn_check_shape(dw, op, "dw", 2, w->shape));
  if (db) SH_TRY(sh_nn_check_shape(db, op, "db", 1, (int64_t[]){nout}));

  sh_tensor *dyc = NULL, *xc = NULL, *wc = NULL, *dxo = NULL;
  sh_nn_accum aw = {0}, ab = {0};
  int rc = sh_nn_f32(&dyc, dy, op, "dy");
  if (!rc && dw) rc = sh_nn_f32(&xc, x, op, "x");
  if (!rc && dx) rc = sh_nn_f32(&wc, w, op, "w");
  /* the dx product writes every element (beta 0) unless a dim is empty */
  if (!rc && dx) rc = rows > 0 && in > 0 && nout > 0 ? sh_nn_new_f32(&dxo, x->ndim, x->shape)
                                                     : sh_nn_zeros_f32(&dxo, x->ndim, x->shape);
  if (!rc && dw) rc = sh_nn_accum_begin(&aw, dw, op, "dw");
  if (!rc && db) rc = sh_nn_accum_begin(&ab, db, op, "db");
  if (rc) goto done;
  const float *dyp = sh_nn_ptr(dyc);
  if (dx && rows > 0 && in > 0 && nout > 0)
    sh_sgemm(CblasNoTrans, CblasNoTrans, (int)rows, (int)in, (int)nout, 1.0f,
                dyp, (int)nout, sh_nn_ptr(wc), (int)in, 0.0f, sh_nn_ptr(dxo), (int)in);
  if (dw && rows > 0 && in > 0 && nout > 0)
    sh_sgemm(CblasTrans, CblasNoTrans, (int)nout, (int)in, (int)rows, 1.0f,
                dyp, (int)nout, sh_nn_ptr(xc), (int)in, 1.0f, sh_nn_ptr(aw.buf), (int)in);
  if (db) column_sums(sh_nn_ptr(ab.buf), dyp, rows, nout);
  if (dw) rc = sh_nn_accum_end(&aw);
  if (!rc && db) rc = sh_nn_accum_end(&ab);
  if (!rc && dx) rc = sh_nn_finish(&dxo, x->dtype);
done:
  sh_nn_accum_drop(&aw); sh_nn_accum_drop(&ab);
  sh_tensor_destroy(dyc); sh_tensor_destroy(xc); sh_tensor_destroy(wc);
  if (rc || !dx) sh_tensor_destroy(dxo);
  else *dx = dxo;
  return rc;
}

/* TRANSITION: kernels not yet in the table; replaced when this family is converted. */
void sh_linear_register_cpu(sh_backend *b) { (void)b; }
