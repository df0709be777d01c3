/* layernorm.cu: layernorm (optionally fused with the residual add before it) and rmsnorm
 * over the last dim, forward and backward, as runtime/nn_norm.c computes them: per-row
 * statistics in f32 (mean and rstd = 1/sqrt(var + eps), two-pass variance; rmsnorm's
 * rstd = 1/sqrt(mean(x^2) + eps)), saved as f32 [rows] for backward; w and b may be NULL.
 *
 * One warp per row: rows are a few hundred to a few thousand wide, so a warp streams a row
 * twice from L1 with no block-wide barrier. Backward's parameter gradients are summed
 * deterministically: each warp keeps its own f32 row of dw/db partials in shared memory
 * over a fixed set of rows, a block adds its warps' rows in order into one partial row per
 * block, and a second kernel adds the blocks' rows in order into dw/db (dw += ...). */
#include "common.cuh"
#include "backend_internal.h"

enum { LN_WARPS = 8 };

/* Forward. res != NULL: r = x + res is formed (rounded to T, as a separate add would be),
 * stored in r_out, and normalised. rms: no centring and no bias. */
template <typename T>
__global__ void norm_fwd_kernel(const T *x, const T *res, T *r_out, const float *w, const float *b, T *y, float *mean_out,
                                float *rstd_out, int64_t rows, int C, float eps, int rms) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T *xr = x + row * C;
  if (res) {
    const T *rr = res + row * C;
    T *ro = r_out + row * C;
    for (int i = lane; i < C; i += 32) ro[i] = from_f<T>(to_f(xr[i]) + to_f(rr[i]));
    __syncwarp();
    xr = ro;
  }
  float m = 0;
  if (!rms) {
    float s = 0;
    for (int i = lane; i < C; i += 32) s += to_f(xr[i]);
    m = warp_sum(s) / (float)C;
  }
  float ss = 0;
  for (int i = lane; i < C; i += 32) { float d = to_f(xr[i]) - m; ss += d * d; }
  float rstd = rsqrtf(warp_sum(ss) / (float)C + eps);
  T *yr = y + row * C;
  for (int i = lane; i < C; i += 32) {
    float v = (to_f(xr[i]) - m) * rstd;
    if (w) v *= w[i];
    if (b) v += b[i];
    yr[i] = from_f<T>(v);
  }
  if (lane == 0) {
    if (mean_out) mean_out[row] = m;
    rstd_out[row] = rstd;
  }
}

/* Backward for a block's rows [r0, r1): dx, and partial dw/db rows for this block.
 * xhat = (x - mean) rstd, g = dy w:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat))    (layernorm)
 *   dx = rstd (g - xhat mean(g xhat))              (rmsnorm)
 *   dw += dy xhat, db += dy. */
template <typename T>
__global__ void norm_bwd_kernel(const T *dy, const T *x, const float *w, const float *mean, const float *rstd, T *dx,
                                float *part_w, float *part_b, int64_t rows, int64_t rows_per_block, int C, int rms) {
  extern __shared__ float acc[];   /* [warps][2][C] */
  int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float *aw = acc + (size_t)warp * 2 * C, *ab = aw + C;
  for (int i = lane; i < C; i += 32) { aw[i] = 0; ab[i] = 0; }
  int64_t r0 = blockIdx.x * rows_per_block, r1 = min(rows, r0 + rows_per_block);
  for (int64_t row = r0 + warp; row < r1; row += nw) {
    const T *dyr = dy + row * C, *xr = x + row * C;
    float m = rms ? 0.0f : mean[row], rs = rstd[row];
    float sg = 0, sgx = 0;
    for (int i = lane; i < C; i += 32) {
      float xh = (to_f(xr[i]) - m) * rs, g = to_f(dyr[i]) * (w ? w[i] : 1.0f);
      sg += g;
      sgx += g * xh;
    }
    sg = warp_sum(sg) / (float)C;
    sgx = warp_sum(sgx) / (float)C;
    T *dxr = dx ? dx + row * C : nullptr;
    for (int i = lane; i < C; i += 32) {
      float d = to_f(dyr[i]), xh = (to_f(xr[i]) - m) * rs, g = d * (w ? w[i] : 1.0f);
      if (dxr) dxr[i] = from_f<T>(rs * (g - (rms ? 0.0f : sg) - xh * sgx));
      aw[i] += d * xh;
      ab[i] += d;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float sw = 0, sb = 0;
    for (int k = 0; k < nw; k++) { sw += acc[(size_t)k * 2 * C + i]; sb += acc[(size_t)k * 2 * C + C + i]; }
    part_w[blockIdx.x * (int64_t)C + i] = sw;
    if (part_b) part_b[blockIdx.x * (int64_t)C + i] = sb;
  }
}

/* dst[i] += sum over blocks of part[block, i], blocks in order; dst is contiguous of any float dtype. */
__global__ void norm_param_finish_kernel(const float *part, int nblocks, int C, char *dst, int dt) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < C; i += (int64_t)gridDim.x * blockDim.x) {
    float s = 0;
    for (int k = 0; k < nblocks; k++) s += part[(int64_t)k * C + i];
    ew_store<float>(dst, dt, i, ew_load<float>(dst, dt, i) + s);
  }
}

/* ---- host side: the table's kernels (runtime/nn_norm.c checked the arguments and
 * allocated the outputs: y and r of x's dtype, mean and rstd f32, all contiguous) -------- */

/* res != NULL: the fused residual add; mean == NULL: not kept; rms: no centring, no b. */
static int norm_forward(const char *op, sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                        const sh_tensor *x, const sh_tensor *res, const sh_tensor *w, const sh_tensor *b, double eps, int rms) {
  int64_t C = x->shape[x->ndim - 1], rows = C ? sh_tensor_numel(x) / C : 0;
  if (C > INT32_MAX) return sh_fail(SH_ERR_ARG, "%s: rows of %lld elements are too long", op, (long long)C);
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, x->device, &st));
  sh_tguard xc, rc_, wc, bc;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), x, x->dtype));
  if (res) SH_TRY(sh_cuda_contiguous_as(rc_.out(), res, x->dtype));
  if (w) SH_TRY(sh_cuda_contiguous_as(wc.out(), w, SH_F32));
  if (b) SH_TRY(sh_cuda_contiguous_as(bc.out(), b, SH_F32));
  if (rows > 0 && C > 0) {
    unsigned blocks = (unsigned)((rows + LN_WARPS - 1) / LN_WARPS);
    const float *pw = wc.t ? (const float *)sh_tensor_data(wc.t) : nullptr, *pb = bc.t ? (const float *)sh_tensor_data(bc.t) : nullptr;
    float *pm = mean ? (float *)sh_tensor_data(mean) : nullptr;
    SH_DISPATCH_FLOAT(x->dtype, T, op, {
      norm_fwd_kernel<T><<<blocks, LN_WARPS * 32, 0, st>>>(
          (const T *)sh_tensor_data(xc.t), rc_.t ? (const T *)sh_tensor_data(rc_.t) : nullptr,
          r ? (T *)sh_tensor_data(r) : nullptr, pw, pb, (T *)sh_tensor_data(y), pm,
          (float *)sh_tensor_data(rstd), rows, (int)C, (float)eps, rms);
    });
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

/* dx may be NULL; dw and db (NULL: skipped) are accumulated into, in any float dtype. */
static int norm_backward(const char *op, sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                         const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean, const sh_tensor *rstd, int rms) {
  int64_t C = x->shape[x->ndim - 1], rows = C ? sh_tensor_numel(x) / C : 0;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, x->device, &st));
  sh_tguard xc, dyc, wc, mc, sc, pw, pb;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), x, x->dtype));
  SH_TRY(sh_cuda_contiguous_as(dyc.out(), dy, x->dtype));
  if (w) SH_TRY(sh_cuda_contiguous_as(wc.out(), w, SH_F32));
  if (!rms) SH_TRY(sh_cuda_contiguous_as(mc.out(), mean, SH_F32));
  SH_TRY(sh_cuda_contiguous_as(sc.out(), rstd, SH_F32));
  if (rows > 0 && C > 0) {
    /* Shared memory holds 2 f32 rows per warp: fewer warps for wide rows. */
    int warps = LN_WARPS;
    size_t limit = 96 * 1024;
    while (warps > 1 && (size_t)warps * 2 * C * sizeof(float) > limit) warps >>= 1;
    size_t smem = (size_t)warps * 2 * C * sizeof(float);
    if (smem > (size_t)sh_cuda_props(x->device)->sharedMemPerBlockOptin)
      return sh_fail(SH_ERR_ARG, "%s: rows of %lld are too wide for the cuda kernel", op, (long long)C);
    int sms = sh_cuda_props(x->device)->multiProcessorCount;
    int64_t nblocks = sh_min64((rows + warps - 1) / warps, (int64_t)sms * 4);
    int64_t per = (rows + nblocks - 1) / nblocks;
    nblocks = (rows + per - 1) / per;
    int64_t pshape[2] = {nblocks, C};
    SH_TRY(sh_tensor_empty(pw.out(), 2, pshape, SH_F32, x->device));
    SH_TRY(sh_tensor_empty(pb.out(), 2, pshape, SH_F32, x->device));
    SH_DISPATCH_FLOAT(x->dtype, T, op, {
      CU_TRY(op, cudaFuncSetAttribute(norm_bwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      norm_bwd_kernel<T><<<(unsigned)nblocks, warps * 32, smem, st>>>(
          (const T *)sh_tensor_data(dyc.t), (const T *)sh_tensor_data(xc.t), wc.t ? (const float *)sh_tensor_data(wc.t) : nullptr,
          mc.t ? (const float *)sh_tensor_data(mc.t) : nullptr, (const float *)sh_tensor_data(sc.t),
          dx ? (T *)sh_tensor_data(dx) : nullptr, (float *)sh_tensor_data(pw.t), (float *)sh_tensor_data(pb.t),
          rows, per, (int)C, rms);
    });
    CU_LAUNCHED(op);
    sh_tensor *grads[2] = {dw, db};
    const sh_tensor *parts[2] = {pw.t, pb.t};
    for (int k = 0; k < 2; k++) {
      if (!grads[k]) continue;
      sh_tguard gc;
      bool direct = sh_tensor_is_contiguous(grads[k]);
      if (!direct) SH_TRY(sh_cuda_contiguous_as(gc.out(), grads[k], grads[k]->dtype));
      sh_tensor *g = direct ? grads[k] : gc.t;
      norm_param_finish_kernel<<<sh_blocks(C, 256), 256, 0, st>>>((const float *)sh_tensor_data(parts[k]), (int)nblocks,
                                                                  (int)C, (char *)sh_tensor_data(g), g->dtype);
      CU_LAUNCHED(op);
      if (!direct) SH_TRY(sh_tensor_copy_(grads[k], g));
      grads[k]->version++;
    }
  }
  return SH_OK;
}

static int cuda_layernorm_forward(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                                  const sh_tensor *w, const sh_tensor *b, double eps) {
  return norm_forward("layernorm", y, NULL, mean, rstd, x, NULL, w, b, eps, 0);
}

static int cuda_layernorm_residual_forward(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                           const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                           const sh_tensor *b, double eps) {
  return norm_forward("layernorm_residual", y, r, mean, rstd, x, res, w, b, eps, 0);
}

static int cuda_layernorm_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                   const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                                   const sh_tensor *rstd) {
  return norm_backward("layernorm_backward", dx, dw, db, dy, x, w, mean, rstd, 0);
}

static int cuda_rmsnorm_forward(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  return norm_forward("rmsnorm", y, NULL, NULL, rstd, x, NULL, w, NULL, eps, 1);
}

static int cuda_rmsnorm_backward(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                                 const sh_tensor *w, const sh_tensor *rstd) {
  return norm_backward("rmsnorm_backward", dx, dw, NULL, dy, x, w, NULL, rstd, 1);
}

extern "C" void sh_norm_register_cuda(sh_backend *b) {
  b->layernorm_forward = cuda_layernorm_forward;
  b->layernorm_residual_forward = cuda_layernorm_residual_forward;
  b->layernorm_backward = cuda_layernorm_backward;
  b->rmsnorm_forward = cuda_rmsnorm_forward;
  b->rmsnorm_backward = cuda_rmsnorm_backward;
}
