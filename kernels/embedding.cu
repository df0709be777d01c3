/* embedding.cu: y[r, :] = w[idx[r], :] and its backward dw[idx[r], :] += dy[r, :].
 *
 * Backward is deterministic without atomics: the (index, row) pairs are sorted by index
 * with CUB's radix sort (stable, so the rows of one index stay in order), and each run of
 * equal indices is summed in f32 by one block, row by row, then added into dw once. The
 * same index therefore always sums in the same order, whatever the scheduling.
 *
 * Indices are not range-checked on the device (that would need a host sync per call): an
 * index outside [0, V) gives a zero row forward and is skipped backward, never read or
 * written out of bounds. The front (runtime/cpu/embedding.c) checks cpu indices and fails. */
#include "common.cuh"
#include "core/backend_internal.h"
#include <cub/cub.cuh>

enum { EMB_THREADS = 128 };

template <typename I, typename T>
__global__ void embedding_fwd_kernel(const I *idx, const T *w, T *y, int64_t V, int64_t C) {
  int64_t r = blockIdx.x;
  int64_t v = (int64_t)idx[r];
  T *yr = y + r * C;
  if (v < 0 || v >= V) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = from_f<T>(0.0f);
    return;
  }
  const T *wr = w + v * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = wr[c];
}

template <typename I>
__global__ void embedding_keys_kernel(const I *idx, int32_t *keys, int32_t *rows, int64_t n, int64_t V) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t v = (int64_t)idx[i];
    keys[i] = (int32_t)(v >= 0 && v < V ? v : V);   /* out of range: the key V, skipped below */
    rows[i] = (int32_t)i;
  }
}

/* Block i handles position i of the sorted keys if it starts a run; it walks the run. */
template <typename T>
__global__ void embedding_bwd_kernel(const int32_t *keys, const int32_t *rows, int64_t n, const T *dy, char *dw, int dw_dt,
                                     int64_t V, int64_t C) {
  int64_t i = blockIdx.x;
  int32_t v = keys[i];
  if ((i > 0 && keys[i - 1] == v) || v < 0 || v >= V) return;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0;
    for (int64_t j = i; j < n && keys[j] == v; j++) s += to_f(dy[(int64_t)rows[j] * C + c]);
    int64_t o = (int64_t)v * C + c;
    ew_store<float>(dw, dw_dt, o, ew_load<float>(dw, dw_dt, o) + s);
  }
}

/* Outputs come from runtime/cpu/embedding.c's front, which checked shapes and dtypes. */
extern "C" int sh_kcuda_embedding_forward(sh_tensor *y, const sh_tensor *idx, const sh_tensor *w) {
  const char *op = "embedding";
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, w->device, &st));
  int64_t V = w->shape[0], C = w->shape[1], n = sh_tensor_numel(idx);
  if (n == 0 || C == 0) return SH_OK;
  sh_tguard ic, wc;
  SH_TRY(sh_cuda_contiguous_as(ic.out(), idx, idx->dtype));
  SH_TRY(sh_cuda_contiguous_as(wc.out(), w, w->dtype));
  for (int64_t r0 = 0; r0 < n; r0 += 2147483647LL) {
    unsigned nb = (unsigned)sh_min64(2147483647LL, n - r0);
    SH_DISPATCH_FLOAT(w->dtype, T, op, {
      T *yp = (T *)sh_tensor_data(y) + r0 * C;
      if (idx->dtype == SH_I64)
        embedding_fwd_kernel<int64_t, T><<<nb, EMB_THREADS, 0, st>>>((const int64_t *)sh_tensor_data(ic.t) + r0, (const T *)sh_tensor_data(wc.t), yp, V, C);
      else
        embedding_fwd_kernel<int32_t, T><<<nb, EMB_THREADS, 0, st>>>((const int32_t *)sh_tensor_data(ic.t) + r0, (const T *)sh_tensor_data(wc.t), yp, V, C);
    });
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

extern "C" int sh_kcuda_embedding_backward(sh_tensor *dw, const sh_tensor *dy, const sh_tensor *idx) {
  const char *op = "embedding_backward";
  int64_t V = dw->shape[0], C = dw->shape[1], n = sh_tensor_numel(idx);
  if (n > INT32_MAX || V > INT32_MAX) return sh_fail(SH_ERR_ARG, "%s: %s is too large for the cuda kernel", op, sh_desc(idx));
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, dw->device, &st));
  if (n == 0 || C == 0) { dw->version++; return SH_OK; }
  sh_tguard ic, dyc, keys, rows, keys2, rows2, temp, dwc;
  SH_TRY(sh_cuda_contiguous_as(ic.out(), idx, idx->dtype));
  SH_TRY(sh_cuda_contiguous_as(dyc.out(), dy, dy->dtype));
  SH_TRY(sh_tensor_empty(keys.out(), 1, &n, SH_I32, dw->device));
  SH_TRY(sh_tensor_empty(rows.out(), 1, &n, SH_I32, dw->device));
  SH_TRY(sh_tensor_empty(keys2.out(), 1, &n, SH_I32, dw->device));
  SH_TRY(sh_tensor_empty(rows2.out(), 1, &n, SH_I32, dw->device));
  int32_t *k1 = (int32_t *)sh_tensor_data(keys.t), *r1 = (int32_t *)sh_tensor_data(rows.t);
  int32_t *k2 = (int32_t *)sh_tensor_data(keys2.t), *r2 = (int32_t *)sh_tensor_data(rows2.t);
  if (idx->dtype == SH_I64)
    embedding_keys_kernel<int64_t><<<sh_blocks(n, 256), 256, 0, st>>>((const int64_t *)sh_tensor_data(ic.t), k1, r1, n, V);
  else
    embedding_keys_kernel<int32_t><<<sh_blocks(n, 256), 256, 0, st>>>((const int32_t *)sh_tensor_data(ic.t), k1, r1, n, V);
  CU_LAUNCHED(op);
  /* Sort on the bits that can differ: keys lie in [0, V]. */
  int bits = 1;
  while (bits < 32 && ((int64_t)1 << bits) <= V) bits++;
  size_t temp_bytes = 0;
  CU_TRY(op, cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k1, k2, r1, r2, (int)n, 0, bits, st));
  int64_t tb = (int64_t)temp_bytes;
  SH_TRY(sh_tensor_empty(temp.out(), 1, &tb, SH_U8, dw->device));
  CU_TRY(op, cub::DeviceRadixSort::SortPairs(sh_tensor_data(temp.t), temp_bytes, k1, k2, r1, r2, (int)n, 0, bits, st));
  bool direct = sh_tensor_is_contiguous(dw);
  if (!direct) SH_TRY(sh_cuda_contiguous_as(dwc.out(), dw, dw->dtype));
  sh_tensor *g = direct ? dw : dwc.t;
  SH_DISPATCH_FLOAT(dy->dtype, T, op, {
    embedding_bwd_kernel<T><<<(unsigned)n, EMB_THREADS, 0, st>>>(k2, r2, n, (const T *)sh_tensor_data(dyc.t),
                                                                 (char *)sh_tensor_data(g), g->dtype, V, C);
  });
  CU_LAUNCHED(op);
  if (direct) dw->version++;
  else SH_TRY(sh_kernel_copy_(dw, g));   /* which counts dw's version */
  return SH_OK;
}
