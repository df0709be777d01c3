/* linear.cu: linear forward and backward on CUDA and their cuBLASLt-epilogue fusions
 * (linear_gelu_forward, linear_backward_dgelu), each one product through matmul.cuh's
 * lt_gemm_epi with the epilogue fused when the library has it, and the composition it equals
 * (gelu, column sums) run after the plain product when not; the front (runtime/ops/linear.c)
 * checked the arguments and allocated the outputs. */
#include "matmul.cuh"
#include <string.h>

static int64_t rows_of(const sh_tensor *t) { int64_t n = 1; for (int d = 0; d + 1 < t->ndim; d++) n *= t->shape[d]; return n; }

/* y = gelu(pre) by the CUDA table's kernel: the composition the fused epilogue equals. */
static int gelu_into(sh_tensor *y, const sh_tensor *pre) {
  y->version++;
  return sh_kcuda_gelu_forward(y, pre);
}

/* y = x w^T + b, or with pre: pre = x w^T + b and y = gelu(pre); y and pre are x's dtype. */
static int linear_fwd(const char *op, sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                      const sh_tensor *b) {
  int dt = x->dtype, dev = x->device;
  int64_t in = x->shape[x->ndim - 1], out = w->shape[0], rows = rows_of(x);
  if (rows == 0 || out == 0) return SH_OK;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dev, &st));
  sh_tguard xc, wc, bc;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), x, dt));
  SH_TRY(sh_cuda_contiguous_as(wc.out(), w, dt));
  if (b) SH_TRY(sh_cuda_contiguous_as(bc.out(), b, dt));
  if (in == 0) {             /* an empty product: the bias alone (then gelu) */
    sh_tensor *dst = pre ? pre : y;
    SH_TRY(sh_kernel_fill_(dst, 0.0));
    if (b) SH_TRY(sh_cuda_accumulate(op, dst, bc.t));
    return pre ? gelu_into(y, pre) : SH_OK;
  }
  lt_gemm g;
  memset(&g, 0, sizeof g);
  g.M = rows; g.N = out; g.K = in;
  g.A = sh_tensor_data(xc.t); g.lda = in; g.ta = 0;
  g.B = sh_tensor_data(wc.t); g.ldb = in; g.tb = 1;
  g.D = sh_tensor_data(pre ? pre : y); g.ldd = out;
  g.in_dt = dt; g.out_dt = dt; g.alpha = 1; g.beta = 0; g.batch = 1;
  g.bias = bc.t ? sh_tensor_data(bc.t) : NULL;
  if (pre && b && (out % 8) == 0) {
    g.epi = EPI_GELU_AUX_BIAS;
    g.D = sh_tensor_data(y);
    g.aux = sh_tensor_data(pre);
  } else {
    g.epi = b ? EPI_BIAS : EPI_NONE;
  }
  int fused = 0;
  SH_TRY(lt_gemm_epi(op, dev, st, g, &fused));
  sh_tensor *dst = g.D == sh_tensor_data(y) ? y : pre;
  /* Without the fused epilogue the plain product landed in D: add the bias there, and
   * when D was y but pre was wanted, move it to pre. */
  if (!fused && b) SH_TRY(sh_cuda_accumulate(op, dst, bc.t));
  if (pre && g.epi == EPI_GELU_AUX_BIAS && !fused) SH_TRY(sh_kernel_copy_(pre, y));
  if (pre && !(g.epi == EPI_GELU_AUX_BIAS && fused)) SH_TRY(gelu_into(y, pre));
  return SH_OK;
}

extern "C" int sh_kcuda_linear_forward(sh_tensor *y, const sh_tensor *x, const sh_tensor *w, const sh_tensor *b) {
  return linear_fwd("linear", y, NULL, x, w, b);
}

extern "C" int sh_kcuda_linear_gelu_forward(sh_tensor *y, sh_tensor *pre, const sh_tensor *x, const sh_tensor *w,
                                            const sh_tensor *b) {
  return linear_fwd("linear_gelu", y, pre, x, w, b);
}

/* dw += dy^T x (set_dw: dw = dy^T x) and db += colsum(dy): one product with beta = 1 (0)
 * straight into dw when its dtype allows, BGRADB for db when the library offers it. */
static int linear_param_grads(const char *op, cudaStream_t st, sh_tensor *dw, sh_tensor *db, const sh_tensor *dyc,
                              const sh_tensor *xc, int64_t rows, int64_t in, int64_t out, int set_dw) {
  int dt = dyc->dtype, dev = dyc->device;
  bool db_done = false;
  if (dw && rows > 0) {
    /* bf16/f16 products may write f32 (gradient accumulation in f32) or their own dtype. */
    bool direct = sh_tensor_is_contiguous(dw) && (dw->dtype == dt || (dw->dtype == SH_F32 && dt != SH_F64));
    sh_tguard acc, bgrad;
    sh_tensor *target = dw;
    if (!direct) {
      int64_t s2[2] = {out, in};
      SH_TRY(sh_tensor_empty(acc.out(), 2, s2, dt == SH_F64 ? SH_F64 : SH_F32, dev));
      target = acc.t;
    }
    lt_gemm g;
    memset(&g, 0, sizeof g);
    g.M = out; g.N = in; g.K = rows;
    g.A = sh_tensor_data(dyc); g.lda = out; g.ta = 1;     /* dy stored [rows, out] = [K, M] */
    g.B = sh_tensor_data(xc); g.ldb = in; g.tb = 0;       /* x [rows, in] = [K, N] */
    g.D = sh_tensor_data(target); g.ldd = in;
    g.in_dt = dt; g.out_dt = target->dtype; g.alpha = 1; g.beta = direct && !set_dw ? 1.0 : 0.0; g.batch = 1;
    if (db) {
      int64_t s1[1] = {out};
      SH_TRY(sh_tensor_empty(bgrad.out(), 1, s1, target->dtype, dev));
      g.epi = EPI_BGRADB;
      g.bias = sh_tensor_data(bgrad.t);
    }
    /* BGRADB's bias length is D's column count in cuBLASLt's view, which is our M = out. */
    int fused = 0;
    SH_TRY(lt_gemm_epi(op, dev, st, g, &fused));
    if (!direct) SH_TRY(set_dw ? sh_kernel_copy_(dw, acc.t) : sh_cuda_accumulate(op, dw, acc.t));
    else dw->version++;
    if (db && fused) { SH_TRY(sh_cuda_accumulate(op, db, bgrad.t)); db_done = true; }
  }
  if (db && !db_done && rows > 0) {
    /* db += the column sums of dy seen as [rows, out], by the table's sum_to_shape (which
     * sums every dim where its output is 1 and its input is not: here rows > 1) */
    sh_tguard v, s, s1v;
    int64_t s2[2] = {rows, out}, s2o[2] = {1, out}, s1[1] = {out};
    SH_TRY(sh_view_reshape(v.out(), dyc, 2, s2));
    const sh_tensor *sums = v.t;
    if (rows > 1) {
      SH_TRY(sh_tensor_empty(s.out(), 2, s2o, sh_reduce_result_dtype(SH_OP_SUM, v.t->dtype), v.t->device));
      SH_TRY(sh_kcuda_sum_to_shape(s.t, v.t));
      sums = s.t;
    }
    SH_TRY(sh_view_reshape(s1v.out(), sums, 1, s1));
    SH_TRY(sh_cuda_accumulate(op, db, s1v.t));
  }
  return SH_OK;
}

/* Shared by linear_backward (dx = dy w) and linear_backward_dgelu (dx is dpre = (dy w) gelu'(pre)). */
static int linear_bwd(const char *op, sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy, const sh_tensor *x,
                      const sh_tensor *w, const sh_tensor *pre, int set_dw) {
  int dt = x->dtype, dev = x->device;
  int64_t in = x->shape[x->ndim - 1], out = w->shape[0], rows = rows_of(x);
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dev, &st));
  sh_tguard dyc, xc, wc, pc;
  SH_TRY(sh_cuda_contiguous_as(dyc.out(), dy, dt));
  if (dw) SH_TRY(sh_cuda_contiguous_as(xc.out(), x, dt));
  if (dx && rows > 0 && in > 0) {
    if (out == 0) {
      SH_TRY(sh_kernel_fill_(dx, 0.0));
    } else {
      SH_TRY(sh_cuda_contiguous_as(wc.out(), w, dt));
      if (pre) SH_TRY(sh_cuda_contiguous_as(pc.out(), pre, dt));
      lt_gemm g;
      memset(&g, 0, sizeof g);
      g.M = rows; g.N = in; g.K = out;
      g.A = sh_tensor_data(dyc.t); g.lda = out; g.ta = 0;
      g.B = sh_tensor_data(wc.t); g.ldb = in; g.tb = 0;   /* w [out, in] = [K, N] */
      g.D = sh_tensor_data(dx); g.ldd = in;
      g.in_dt = dt; g.out_dt = dt; g.alpha = 1; g.beta = 0; g.batch = 1;
      if (pre && (in % 8) == 0) { g.epi = EPI_DGELU; g.aux = sh_tensor_data(pc.t); }
      int fused = 0;
      SH_TRY(lt_gemm_epi(op, dev, st, g, &fused));
      if (pre && !fused) {
        dx->version++;
        SH_TRY(sh_kcuda_gelu_backward(dx, dx, pc.t));
      }
    }
  }
  if (dw || db) SH_TRY(linear_param_grads(op, st, dw, db, dyc.t, dw ? xc.t : NULL, rows, in, out, set_dw));
  return SH_OK;
}

extern "C" int sh_kcuda_linear_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                        const sh_tensor *x, const sh_tensor *w, int set_dw) {
  return linear_bwd("linear_backward", dx, dw, db, dy, x, w, NULL, set_dw);
}

extern "C" int sh_kcuda_linear_backward_dgelu(sh_tensor *dpre, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                              const sh_tensor *x, const sh_tensor *w, const sh_tensor *pre, int set_dw) {
  return linear_bwd("linear_backward_dgelu", dpre, dw, db, dy, x, w, pre, set_dw);
}
