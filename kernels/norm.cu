/* layernorm.cu: layernorm (optionally fused with the residual add before it) and rmsnorm
 * over the last dim, forward and backward, as runtime/cpu/norm.c computes them: per-row
 * statistics in f32 (mean and rstd = 1/sqrt(var + eps), two-pass variance; rmsnorm's
 * rstd = 1/sqrt(mean(x^2) + eps)), saved as f32 [rows] for backward; w and b may be NULL.
 *
 * One warp per row: rows are a few hundred to a few thousand wide, so a warp streams a row
 * with no block-wide barrier. A lane owns the chunks lane, lane + 32, ... of W elements
 * (W = 16 bytes of T when the row length and the pointers allow, so each access is one
 * 16-byte load; else W = 1). The forward holds up to LN_SLOTS chunks in registers: a row of
 * up to 32 LN_SLOTS W elements (2048 in bf16, 1024 in f32) is read from memory once, a
 * longer one in segments of that size, once per pass. Backward's parameter gradients are summed
 * deterministically: each warp keeps its own f32 row of dw/db partials in shared memory
 * (only its lanes touch it, each its own chunks) over a fixed set of rows, a block adds its
 * warps' rows in order into one partial row per block, and a second kernel adds the
 * blocks' rows in order into dw/db (dw += ...). */
#include "common.cuh"
#include "core/backend_internal.h"

enum { LN_WARPS = 8, LN_SLOTS = 8 };

/* One lane's part of a forward row segment: slot k holds chunk (seg LN_SLOTS + k) 32 + lane. */
template <typename T, int W> struct ln_seg {
  sh_vec<T, W> v[LN_SLOTS];
};

__device__ __forceinline__ int ln_chunk(int seg, int k, int lane) { return (seg * LN_SLOTS + k) * 32 + lane; }

/* f(k, c) for each slot k of segment `seg` whose chunk c lies in the row (k a constant once
 * unrolled, so the slots stay in registers). */
template <typename F> __device__ __forceinline__ void seg_each(int seg, int lane, int chunks, F f) {
#pragma unroll
  for (int k = 0; k < LN_SLOTS; k++) {
    int c = ln_chunk(seg, k, lane);
    if (c < chunks) f(k, c);
  }
}

template <typename T, int W> __device__ __forceinline__ void seg_load(ln_seg<T, W> &s, const T *row, int seg, int lane, int chunks) {
  seg_each(seg, lane, chunks, [&](int k, int c) { s.v[k] = load_vec<T, W>(row + (int64_t)c * W); });
}

/* seg_load of r = x + res, each element rounded to T (as a separate add would), stored in r. */
template <typename T, int W>
__device__ __forceinline__ void seg_load_sum(ln_seg<T, W> &s, const T *x, const T *res, T *r, int seg, int lane, int chunks) {
  seg_each(seg, lane, chunks, [&](int k, int c) {
    sh_vec<T, W> a = load_vec<T, W>(x + (int64_t)c * W), b = load_vec<T, W>(res + (int64_t)c * W);
#pragma unroll
    for (int i = 0; i < W; i++) s.v[k].v[i] = from_f<T>(to_f(a.v[i]) + to_f(b.v[i]));
    store_vec(r + (int64_t)c * W, s.v[k]);
  });
}

/* This lane's sum of f(element) over the segment. */
template <typename T, int W, typename F>
__device__ __forceinline__ float seg_sum(const ln_seg<T, W> &s, int seg, int lane, int chunks, F f) {
  float acc = 0;
  seg_each(seg, lane, chunks, [&](int k, int) {
#pragma unroll
    for (int i = 0; i < W; i++) acc += f(to_f(s.v[k].v[i]));
  });
  return acc;
}

template <int W> __device__ __forceinline__ sh_vec<float, W> vec_fill(float v) {
  sh_vec<float, W> r;
#pragma unroll
  for (int i = 0; i < W; i++) r.v[i] = v;
  return r;
}

/* W f32 parameters at chunk c, or `dflt` where p is NULL. */
template <int W> __device__ __forceinline__ sh_vec<float, W> param_at(const float *p, int c, float dflt) {
  return p ? load_vec<float, W>(p + (int64_t)c * W) : vec_fill<W>(dflt);
}

/* Forward. res != NULL: r = x + res is formed (rounded to T), stored in r_out, and
 * normalised. rms: no centring and no bias. W divides C. The launch bound asks for 3 blocks
 * of 8 warps per SM: at most 85 registers, the row cache (32 in bf16) among them. */
template <typename T, int W>
__global__ void __launch_bounds__(LN_WARPS * 32, 3) norm_fwd_kernel(const T *x, const T *res, T *r_out, const float *w, const float *b, T *y, float *mean_out,
                                float *rstd_out, int64_t rows, int C, float eps, int rms) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int chunks = C / W, nseg = (chunks + 32 * LN_SLOTS - 1) / (32 * LN_SLOTS);
  const T *xr = x + row * C, *src = res ? r_out + row * C : xr;   /* where later passes re-read the row */
  ln_seg<T, W> s;
  float sum = 0;
  for (int g = 0; g < nseg; g++) {
    if (res) seg_load_sum(s, xr, res + row * C, r_out + row * C, g, lane, chunks);
    else seg_load(s, xr, g, lane, chunks);
    sum += seg_sum(s, g, lane, chunks, [](float e) { return e; });
  }
  float m = rms ? 0.0f : warp_sum(sum) / (float)C, ss = 0;
  for (int g = 0; g < nseg; g++) {
    if (nseg > 1) seg_load(s, src, g, lane, chunks);
    ss += seg_sum(s, g, lane, chunks, [m](float e) { return (e - m) * (e - m); });
  }
  float rstd = rsqrtf(warp_sum(ss) / (float)C + eps);
  T *yr = y + row * C;
  for (int g = 0; g < nseg; g++) {
    if (nseg > 1) seg_load(s, src, g, lane, chunks);
    seg_each(g, lane, chunks, [&](int k, int c) {
      sh_vec<float, W> pw = param_at<W>(w, c, 1.0f), pb = param_at<W>(b, c, 0.0f);
      sh_vec<T, W> o;
#pragma unroll
      for (int i = 0; i < W; i++) o.v[i] = from_f<T>((to_f(s.v[k].v[i]) - m) * rstd * pw.v[i] + pb.v[i]);
      store_vec(yr + (int64_t)c * W, o);
    });
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
 *   dw += dy xhat, db += dy. W divides C. Two passes over dy and x, the second mostly from
 * L1: holding both rows in registers as the forward holds x took 200 registers in bf16. */
template <typename T, int W>
__global__ void norm_bwd_kernel(const T *dy, const T *x, const float *w, const float *mean, const float *rstd, T *dx,
                                float *part_w, float *part_b, int64_t rows, int64_t rows_per_block, int C, int rms) {
  extern __shared__ float acc[];   /* [warps][2][C] */
  int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = C / W;
  float *aw = acc + (size_t)warp * 2 * C, *ab = aw + C;
  sh_vec<float, W> zero = vec_fill<W>(0.0f);
  for (int c = lane; c < chunks; c += 32) { store_vec(aw + c * W, zero); store_vec(ab + c * W, zero); }
  int64_t r0 = blockIdx.x * rows_per_block, r1 = min(rows, r0 + rows_per_block);
  for (int64_t row = r0 + warp; row < r1; row += nw) {
    const T *dyr = dy + row * C, *xr = x + row * C;
    float m = rms ? 0.0f : mean[row], rs = rstd[row], sg = 0, sgx = 0;
    for (int c = lane; c < chunks; c += 32) {
      sh_vec<T, W> d = load_vec<T, W>(dyr + (int64_t)c * W), xv = load_vec<T, W>(xr + (int64_t)c * W);
      sh_vec<float, W> pw = param_at<W>(w, c, 1.0f);
#pragma unroll
      for (int i = 0; i < W; i++) {
        float e = to_f(d.v[i]) * pw.v[i];
        sg += e;
        sgx += e * (to_f(xv.v[i]) - m) * rs;
      }
    }
    sg = rms ? 0.0f : warp_sum(sg) / (float)C;
    sgx = warp_sum(sgx) / (float)C;
    T *dxr = dx ? dx + row * C : nullptr;
    for (int c = lane; c < chunks; c += 32) {
      sh_vec<T, W> d = load_vec<T, W>(dyr + (int64_t)c * W), xv = load_vec<T, W>(xr + (int64_t)c * W), o;
      sh_vec<float, W> pw = param_at<W>(w, c, 1.0f), a = load_vec<float, W>(aw + c * W), bsum = load_vec<float, W>(ab + c * W);
#pragma unroll
      for (int i = 0; i < W; i++) {
        float e = to_f(d.v[i]), xh = (to_f(xv.v[i]) - m) * rs;
        o.v[i] = from_f<T>(rs * (e * pw.v[i] - sg - xh * sgx));
        a.v[i] += e * xh;
        bsum.v[i] += e;
      }
      store_vec(aw + c * W, a);
      store_vec(ab + c * W, bsum);
      if (dxr) store_vec(dxr + (int64_t)c * W, o);
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

/* ---- host side: the table's kernels (runtime/cpu/norm.c checked the arguments and
 * allocated the outputs: y and r of x's dtype, mean and rstd f32, all contiguous) -------- */

static const void *data_or_null(const sh_tensor *t) { return t ? sh_tensor_data(t) : nullptr; }

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
    const float *pw = (const float *)data_or_null(wc.t), *pb = (const float *)data_or_null(bc.t);
    bool wide = sh_rows_wide(C, sh_dtype_size(x->dtype), {sh_tensor_data(xc.t), data_or_null(rc_.t), data_or_null(r), pw, pb, sh_tensor_data(y)});
    SH_DISPATCH_FLOAT(x->dtype, T, op, {
      with_width<T>(wide, [&](auto width) {
        constexpr int W = decltype(width)::value;
        norm_fwd_kernel<T, W><<<blocks, LN_WARPS * 32, 0, st>>>(
            (const T *)sh_tensor_data(xc.t), (const T *)data_or_null(rc_.t), (T *)data_or_null(r), pw, pb,
            (T *)sh_tensor_data(y), (float *)data_or_null(mean), (float *)sh_tensor_data(rstd), rows, (int)C, (float)eps, rms);
      });
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
    bool wide = sh_rows_wide(C, sh_dtype_size(x->dtype), {sh_tensor_data(dyc.t), sh_tensor_data(xc.t), data_or_null(wc.t), data_or_null(dx)});
    cudaError_t attr = cudaSuccess;
    SH_DISPATCH_FLOAT(x->dtype, T, op, {
      with_width<T>(wide, [&](auto width) {
        constexpr int W = decltype(width)::value;
        static std::atomic<size_t> raised{0};   /* one per kernel instantiation */
        attr = sh_cuda_raise_smem(norm_bwd_kernel<T, W>, smem, raised);
        if (attr == cudaSuccess)
          norm_bwd_kernel<T, W><<<(unsigned)nblocks, warps * 32, smem, st>>>(
              (const T *)sh_tensor_data(dyc.t), (const T *)sh_tensor_data(xc.t), (const float *)data_or_null(wc.t),
              (const float *)data_or_null(mc.t), (const float *)sh_tensor_data(sc.t), (T *)data_or_null(dx),
              (float *)sh_tensor_data(pw.t), (float *)sh_tensor_data(pb.t), rows, per, (int)C, rms);
      });
    });
    CU_TRY(op, attr);
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
      if (!direct) SH_TRY(sh_kernel_copy_(grads[k], g));
      grads[k]->version++;
    }
  }
  return SH_OK;
}

extern "C" int sh_kcuda_layernorm_forward(sh_tensor *y, sh_tensor *mean, sh_tensor *rstd, const sh_tensor *x,
                                          const sh_tensor *w, const sh_tensor *b, double eps) {
  return norm_forward("layernorm", y, NULL, mean, rstd, x, NULL, w, b, eps, 0);
}

extern "C" int sh_kcuda_layernorm_residual_forward(sh_tensor *y, sh_tensor *r, sh_tensor *mean, sh_tensor *rstd,
                                                   const sh_tensor *x, const sh_tensor *res, const sh_tensor *w,
                                                   const sh_tensor *b, double eps) {
  return norm_forward("layernorm_residual", y, r, mean, rstd, x, res, w, b, eps, 0);
}

extern "C" int sh_kcuda_layernorm_backward(sh_tensor *dx, sh_tensor *dw, sh_tensor *db, const sh_tensor *dy,
                                           const sh_tensor *x, const sh_tensor *w, const sh_tensor *mean,
                                           const sh_tensor *rstd) {
  return norm_backward("layernorm_backward", dx, dw, db, dy, x, w, mean, rstd, 0);
}

extern "C" int sh_kcuda_rmsnorm_forward(sh_tensor *y, sh_tensor *rstd, const sh_tensor *x, const sh_tensor *w, double eps) {
  return norm_forward("rmsnorm", y, NULL, NULL, rstd, x, NULL, w, NULL, eps, 1);
}

extern "C" int sh_kcuda_rmsnorm_backward(sh_tensor *dx, sh_tensor *dw, const sh_tensor *dy, const sh_tensor *x,
                                         const sh_tensor *w, const sh_tensor *rstd) {
  return norm_backward("rmsnorm_backward", dx, dw, NULL, dy, x, w, NULL, rstd, 1);
}
