/* classifier.cu: cross-entropy of logits [..., V] against integer targets [...], fused
 * with the log-softmax, as runtime/cpu/loss.c: forward reads each row once (an online max
 * and sum give the row log-sum-exp lse, f32, targets' shape) and never stores
 * probabilities; backward rebuilds softmax = exp(x - lse) while writing
 * dlogits = (softmax - onehot(target)) * dloss / count in the logits' dtype.
 * The loss is the mean over rows whose target is not ignore_index, 0 when there are none
 * (and the gradient then is 0). Row losses are summed in f64 by one block in a fixed order,
 * so the loss is the same from run to run. A target outside [0, V) that is not
 * ignore_index makes its row loss NaN (the front, runtime/cpu/loss.c, reports it as an
 * error for cpu targets; checking here would need a host sync). */
#include "common.cuh"
#include "core/backend_internal.h"

enum { CE_THREADS = 512 };

/* Online (max, sum of exp) pair: merging keeps sum relative to the larger max. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float om, float os) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) { m = om; s = os; return; }
  if (om > m) { s = s * __expf(m - om) + os; m = om; }
  else s += os * __expf(om - m);
}

/* The row's log-sum-exp in one read: each thread keeps an online (max, sum) over its chunks
 * of W elements (one exp per element, one rescale per chunk), then the block merges them. */
template <typename T, int W>
__device__ __forceinline__ float row_lse(const T *x, int64_t V) {
  __shared__ float sm[32], ss[32];
  float m = -INFINITY, s = 0;
  for (int64_t c = threadIdx.x; c < V / W; c += blockDim.x) {
    sh_vec<T, W> v = load_vec<T, W>(x + c * W);
    float cm = -INFINITY, cs = 0;
#pragma unroll
    for (int i = 0; i < W; i++) cm = fmaxf(cm, to_f(v.v[i]));
#pragma unroll
    for (int i = 0; i < W; i++) cs += __expf(to_f(v.v[i]) - cm);
    lse_merge(m, s, cm, cs);
  }
  for (int o = 16; o > 0; o >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, om, os);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = lane < (int)(blockDim.x >> 5) ? sm[lane] : -INFINITY;
    s = lane < (int)(blockDim.x >> 5) ? ss[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
      lse_merge(m, s, om, os);
    }
    if (lane == 0) { sm[0] = m; ss[0] = s; }
  }
  __syncthreads();
  return sm[0] + logf(ss[0]);
}

template <typename I>
__device__ __forceinline__ int64_t target_at(const I *t, int64_t r) { return (int64_t)t[r]; }

template <typename T, int W, typename I>
__global__ void ce_fwd_kernel(const T *x, const I *targets, int64_t V, int64_t ignore, float *lse_out, double *row_loss) {
  int64_t r = blockIdx.x;
  const T *xr = x + r * V;
  float lse = row_lse<T, W>(xr, V);
  if (threadIdx.x == 0) {
    lse_out[r] = lse;
    int64_t t = target_at(targets, r);
    row_loss[r] = t == ignore ? 0.0 : (t < 0 || t >= V) ? (double)NAN : (double)lse - (double)to_f(xr[t]);
  }
}

/* One block: loss = sum(row_loss) / count (0 when count is 0), and count itself. */
template <typename I>
__global__ void ce_finish_kernel(const double *row_loss, const I *targets, int64_t n, int64_t ignore, float *loss,
                                 int64_t *count_out) {
  __shared__ double sh[32];
  double s = 0, c = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    if (row_loss) s += row_loss[r];
    c += target_at(targets, r) != ignore ? 1.0 : 0.0;
  }
  s = block_sum_d(s, sh);
  c = block_sum_d(c, sh);
  if (threadIdx.x == 0) {
    if (loss) *loss = c > 0 ? (float)(s / c) : 0.0f;
    if (count_out) *count_out = (int64_t)c;
  }
}

/* dx may be x itself (the gradient in place over the logits): each thread reads a chunk
 * before it writes it, and no thread reads another's. */
template <typename T, int W, typename I>
__global__ void ce_bwd_kernel(const T *x, const I *targets, const float *lse, const int64_t *count, double dloss,
                              int64_t V, int64_t ignore, T *dx) {
  int64_t r = blockIdx.x;
  const T *xr = x + r * V;
  T *dr = dx + r * V;
  int64_t t = target_at(targets, r), c = *count;
  float g = (c > 0 && t != ignore) ? (float)(dloss / (double)c) : 0.0f;
  float l = lse[r];
  for (int64_t k = threadIdx.x; k < V / W; k += blockDim.x) {
    sh_vec<T, W> v = load_vec<T, W>(xr + k * W);
#pragma unroll
    for (int i = 0; i < W; i++) {
      float p = g == 0.0f ? 0.0f : __expf(to_f(v.v[i]) - l) * g;
      v.v[i] = from_f<T>(k * W + i == t ? p - g : p);
    }
    store_vec(dr + k * W, v);
  }
}

/* One block per row: grid.x takes up to 2^31 - 1 of them. */
static int check_rows(const char *op, int64_t n) {
  if (n > 2147483647LL) return sh_fail(SH_ERR_ARG, "%s: %lld rows are too many for the cuda kernel", op, (long long)n);
  return SH_OK;
}

/* Outputs come from runtime/cpu/loss.c's front, which checked shapes and dtypes (and that
 * logits has classes when there are rows). */
extern "C" int sh_kcuda_cross_entropy_forward(sh_tensor *loss, sh_tensor *lse, const sh_tensor *logits, const sh_tensor *targets,
                                              int64_t ignore_index) {
  const char *op = "cross_entropy";
  int64_t V = logits->shape[logits->ndim - 1], n = sh_tensor_numel(targets);
  SH_TRY(check_rows(op, n));
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, logits->device, &st));
  sh_tguard xc, tc, rl;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), logits, logits->dtype));
  SH_TRY(sh_cuda_contiguous_as(tc.out(), targets, targets->dtype));
  int64_t n1 = n > 0 ? n : 1;
  SH_TRY(sh_tensor_empty(rl.out(), 1, &n1, SH_F64, logits->device));
  double *rlp = (double *)sh_tensor_data(rl.t);
  bool i64 = targets->dtype == SH_I64;
  if (n > 0) {
    SH_DISPATCH_FLOAT(logits->dtype, T, op, {
      const T *xp = (const T *)sh_tensor_data(xc.t);
      float *lp = (float *)sh_tensor_data(lse);
      with_width<T>(sh_rows_wide(V, sizeof(T), {xp}), [&](auto width) {
        constexpr int W = decltype(width)::value;
        if (i64) ce_fwd_kernel<T, W, int64_t><<<(unsigned)n, CE_THREADS, 0, st>>>(xp, (const int64_t *)sh_tensor_data(tc.t), V, ignore_index, lp, rlp);
        else ce_fwd_kernel<T, W, int32_t><<<(unsigned)n, CE_THREADS, 0, st>>>(xp, (const int32_t *)sh_tensor_data(tc.t), V, ignore_index, lp, rlp);
      });
    });
    CU_LAUNCHED(op);
  }
  float *lossp = (float *)sh_tensor_data(loss);
  if (i64) ce_finish_kernel<int64_t><<<1, 1024, 0, st>>>(rlp, (const int64_t *)sh_tensor_data(tc.t), n, ignore_index, lossp, nullptr);
  else ce_finish_kernel<int32_t><<<1, 1024, 0, st>>>(rlp, (const int32_t *)sh_tensor_data(tc.t), n, ignore_index, lossp, nullptr);
  CU_LAUNCHED(op);
  return SH_OK;
}

extern "C" int sh_kcuda_cross_entropy_backward(sh_tensor *dlogits, const sh_tensor *logits, const sh_tensor *targets,
                                               const sh_tensor *lse, double dloss, int64_t ignore_index) {
  const char *op = "cross_entropy_backward";
  int64_t V = logits->shape[logits->ndim - 1], n = sh_tensor_numel(targets);
  SH_TRY(check_rows(op, n));
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, logits->device, &st));
  if (n == 0) return SH_OK;
  sh_tguard xc, tc, lc, cnt;
  SH_TRY(sh_cuda_contiguous_as(xc.out(), logits, logits->dtype));
  SH_TRY(sh_cuda_contiguous_as(tc.out(), targets, targets->dtype));
  SH_TRY(sh_cuda_contiguous_as(lc.out(), lse, SH_F32));
  SH_TRY(sh_tensor_empty(cnt.out(), 0, NULL, SH_I64, logits->device));
  int64_t *cp = (int64_t *)sh_tensor_data(cnt.t);
  bool i64 = targets->dtype == SH_I64;
  if (i64) ce_finish_kernel<int64_t><<<1, 1024, 0, st>>>(nullptr, (const int64_t *)sh_tensor_data(tc.t), n, ignore_index, nullptr, cp);
  else ce_finish_kernel<int32_t><<<1, 1024, 0, st>>>(nullptr, (const int32_t *)sh_tensor_data(tc.t), n, ignore_index, nullptr, cp);
  CU_LAUNCHED(op);
  SH_DISPATCH_FLOAT(logits->dtype, T, op, {
    const T *xp = (const T *)sh_tensor_data(xc.t);
    const float *lp = (const float *)sh_tensor_data(lc.t);
    T *dp = (T *)sh_tensor_data(dlogits);
    with_width<T>(sh_rows_wide(V, sizeof(T), {xp, dp}), [&](auto width) {
      constexpr int W = decltype(width)::value;
      if (i64) ce_bwd_kernel<T, W, int64_t><<<(unsigned)n, CE_THREADS, 0, st>>>(xp, (const int64_t *)sh_tensor_data(tc.t), lp, cp, dloss, V, ignore_index, dp);
      else ce_bwd_kernel<T, W, int32_t><<<(unsigned)n, CE_THREADS, 0, st>>>(xp, (const int32_t *)sh_tensor_data(tc.t), lp, cp, dloss, V, ignore_index, dp);
    });
  });
  CU_LAUNCHED(op);
  return SH_OK;
}
