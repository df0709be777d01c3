/* reduce.cu: the CUDA kernels of sum, mean, max, min, argmax, sum_to_shape and sumsq. The
 * fronts in runtime/cpu/reduce.c check the arguments and allocate the outputs in the result
 * dtypes (sum of integers -> i64, mean of integers -> f32, max/min keep the dtype); NaN
 * propagates; argmax points at the first NaN, else the first max.
 *
 * Every reduction is a dense [outer, R, inner] array reduced over R, accumulated in double
 * like the CPU, in two deterministic passes: pass 1 cuts R into chunks so that even a
 * reduction to one number fills the GPU, each block writing one partial per (outer, chunk,
 * inner); pass 2 combines the chunks of each output in order and converts to the result
 * dtype. No atomics, so results are the same from run to run. */
#include "common.cuh"
#include "core/backend_internal.h"
extern "C" {
#include "core/rules_internal.h"
}

enum { RED_THREADS = 256, MAX_CHUNKS = 512 };

__device__ __forceinline__ double red_init(int op) {
  return op == SH_OP_MAX ? -INFINITY : op == SH_OP_MIN ? INFINITY : 0.0;
}
__device__ __forceinline__ double red_combine(int op, double acc, double x) {
  switch (op) {
    case SH_OP_MAX: return (x > acc || x != x) ? x : acc;
    case SH_OP_MIN: return (x < acc || x != x) ? x : acc;
    default: return acc + x;
  }
}
__device__ __forceinline__ double red_elem(int op, double x) { return op == SH_OP_SUMSQ ? x * x : x; }

/* Pass 1, rows (inner == 1): block (o, c) reduces x[o, chunk c of R] into part[o, c]. */
template <typename T>
__global__ void reduce_rows_kernel(const T *x, int64_t R, int64_t chunk, int op, double *part, int nchunks) {
  __shared__ double sh[32];
  int64_t o = blockIdx.y, c = blockIdx.x;
  int64_t r0 = c * chunk, r1 = min(R, r0 + chunk);
  const T *row = x + o * R;
  double acc = red_init(op);
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc = red_combine(op, acc, red_elem(op, (double)row[r]));
  /* warp then block combine, keeping the op (sum or max/min) */
  for (int off = 16; off > 0; off >>= 1) acc = red_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, off));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)(blockDim.x >> 5) ? sh[lane] : red_init(op);
    for (int off = 16; off > 0; off >>= 1) acc = red_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (lane == 0) part[o * nchunks + c] = acc;
  }
}

/* Pass 1, columns (inner > 1): thread (o, c, i) walks chunk c of R for column i. */
template <typename T>
__global__ void reduce_cols_kernel(const T *x, int64_t R, int64_t inner, int64_t chunk, int op, double *part, int nchunks) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= inner) return;
  int64_t o = blockIdx.z, c = blockIdx.y;
  int64_t r0 = c * chunk, r1 = min(R, r0 + chunk);
  const T *base = x + o * R * inner + i;
  double acc = red_init(op);
  for (int64_t r = r0; r < r1; r++) acc = red_combine(op, acc, red_elem(op, (double)base[r * inner]));
  part[(o * nchunks + c) * inner + i] = acc;
}

/* Pass 2: out[o, i] = combine over chunks of part[o, :, i], divided by div, in out's dtype. */
__global__ void reduce_finish_kernel(const double *part, int64_t outer, int64_t inner, int nchunks, int op,
                                     double div, char *out, int out_dt) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < outer * inner; j += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = j / inner, i = j % inner;
    double acc = red_init(op);
    for (int c = 0; c < nchunks; c++) acc = red_combine(op, acc, part[(o * nchunks + c) * inner + i]);
    ew_store<double>(out, out_dt, j, acc / div);
  }
}

/* Reduces dense x [outer, R, inner] (f32 or f64) into out (outer*inner elements of out_dt). */
static int reduce_core(const char *name, cudaStream_t st, const sh_tensor *x, int64_t outer, int64_t R,
                       int64_t inner, int op, double div, char *out, int out_dt) {
  int device = x->device;
  int64_t nout = outer * inner;
  if (nout == 0) return SH_OK;
  /* Enough chunks that outer * chunks * (threads per chunk) covers the GPU a few times. */
  const cudaDeviceProp *props = sh_cuda_props(device);
  int64_t grid_y = props->maxGridSize[1], grid_z = props->maxGridSize[2];
  int64_t target = (int64_t)props->multiProcessorCount * 4 * (inner == 1 ? 1 : RED_THREADS);
  int64_t have = inner == 1 ? outer : outer * inner;
  int64_t nch = have >= target ? 1 : (target + have - 1) / have;
  int64_t min_chunk = inner == 1 ? 4 * RED_THREADS : 64;
  if (nch > (R + min_chunk - 1) / min_chunk) nch = (R + min_chunk - 1) / min_chunk;
  if (nch > MAX_CHUNKS) nch = MAX_CHUNKS;
  if (inner > 1 && nch > grid_y) nch = grid_y;   /* the columns' chunks are grid.y */
  if (nch < 1) nch = 1;
  if (outer > grid_z && inner > 1) nch = 1;
  int64_t chunk = (R + nch - 1) / nch;
  if (R == 0) { nch = 1; chunk = 0; }
  sh_tguard part;
  int64_t pshape[1] = {nout * nch};
  SH_TRY(sh_tensor_empty(part.out(), 1, pshape, SH_F64, device));
  double *pp = (double *)sh_tensor_data(part.t);
  bool f64 = x->dtype == SH_F64;
  if (inner == 1) {
    for (int64_t o0 = 0; o0 < outer; o0 += grid_y) {   /* rows on grid.y, in slices the device allows */
      dim3 grid((unsigned)nch, (unsigned)sh_min64(grid_y, outer - o0));
      if (f64) reduce_rows_kernel<double><<<grid, RED_THREADS, 0, st>>>((const double *)sh_tensor_data(x) + o0 * R, R, chunk, op, pp + o0 * nch, (int)nch);
      else reduce_rows_kernel<float><<<grid, RED_THREADS, 0, st>>>((const float *)sh_tensor_data(x) + o0 * R, R, chunk, op, pp + o0 * nch, (int)nch);
      CU_LAUNCHED(name);
    }
  } else {
    for (int64_t o0 = 0; o0 < outer; o0 += grid_z) {   /* outer on grid.z, in slices */
      dim3 grid((unsigned)((inner + RED_THREADS - 1) / RED_THREADS), (unsigned)nch, (unsigned)sh_min64(grid_z, outer - o0));
      if (f64) reduce_cols_kernel<double><<<grid, RED_THREADS, 0, st>>>((const double *)sh_tensor_data(x) + o0 * R * inner, R, inner, chunk, op, pp + o0 * nch * inner, (int)nch);
      else reduce_cols_kernel<float><<<grid, RED_THREADS, 0, st>>>((const float *)sh_tensor_data(x) + o0 * R * inner, R, inner, chunk, op, pp + o0 * nch * inner, (int)nch);
      CU_LAUNCHED(name);
    }
  }
  reduce_finish_kernel<<<sh_blocks(nout, RED_THREADS), RED_THREADS, 0, st>>>(pp, outer, inner, (int)nch,
                                                                               op == SH_OP_SUMSQ ? SH_OP_SUM : op, div, out, out_dt);
  CU_LAUNCHED(name);
  return SH_OK;
}

static int dense_dtype(int dt) { return (dt == SH_F32 || dt == SH_BF16 || dt == SH_F16) ? SH_F32 : SH_F64; }

/* A shape seen as [outer, shape[dim], inner]. */
static void split_at(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= shape[d];
  for (int d = dim + 1; d < ndim; d++) *inner *= shape[d];
}

static int reduce_into(const char *name, sh_tensor *out, int op, const sh_tensor *a, int64_t outer, int64_t R, int64_t inner) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(name, a->device, &st));
  sh_tguard x;
  SH_TRY(sh_cuda_contiguous_as(x.out(), a, dense_dtype(a->dtype)));
  return reduce_core(name, st, x.t, outer, R, inner, op, op == SH_OP_MEAN ? (double)R : 1.0,
                     (char *)sh_tensor_data(out), out->dtype);
}

extern "C" int sh_kcuda_reduce(sh_tensor *out, int op, const sh_tensor *a, int dim) {
  int64_t outer, inner;
  split_at(a->ndim, a->shape, dim, &outer, &inner);
  return reduce_into(sh_reduce_name(op), out, op, a, outer, a->shape[dim], inner);
}

extern "C" int sh_kcuda_reduce_all(sh_tensor *out, int op, const sh_tensor *a) {
  return reduce_into(sh_reduce_name(op), out, op, a, 1, sh_tensor_numel(a), 1);
}

/* ---- argmax -------------------------------------------------------------------------------- */

/* b beats a when a is not NaN and b is NaN or larger; ties keep the lower index. */
__device__ __forceinline__ void am_take(double &v, int64_t &i, double bv, int64_t bi) {
  bool a_nan = v != v, b_nan = bv != bv;
  bool better = a_nan ? (b_nan && bi < i) : (b_nan || bv > v || (bv == v && bi < i));
  if (i < 0 || (bi >= 0 && better)) { v = bv; i = bi; }
}

template <typename T>
__global__ void argmax_rows_kernel(const T *x, int64_t R, int64_t *out) {
  __shared__ double sv[32];
  __shared__ int64_t si[32];
  const T *row = x + blockIdx.x * R;
  double v = 0;
  int64_t i = -1;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) am_take(v, i, (double)row[r], r);
  for (int off = 16; off > 0; off >>= 1) {
    double ov = __shfl_xor_sync(0xffffffffu, v, off);
    int64_t oi = __shfl_xor_sync(0xffffffffu, i, off);
    am_take(v, i, ov, oi);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sv[warp] = v; si[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = 0; i = -1;
    if (lane < (int)(blockDim.x >> 5)) { v = sv[lane]; i = si[lane]; }
    for (int off = 16; off > 0; off >>= 1) {
      double ov = __shfl_xor_sync(0xffffffffu, v, off);
      int64_t oi = __shfl_xor_sync(0xffffffffu, i, off);
      am_take(v, i, ov, oi);
    }
    if (lane == 0) out[blockIdx.x] = i;
  }
}

template <typename T>
__global__ void argmax_cols_kernel(const T *x, int64_t outer, int64_t R, int64_t inner, int64_t *out) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < outer * inner; j += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = j / inner, in = j % inner;
    const T *base = x + o * R * inner + in;
    double v = 0;
    int64_t i = -1;
    for (int64_t r = 0; r < R; r++) am_take(v, i, (double)base[r * inner], r);
    out[j] = i;
  }
}

extern "C" int sh_kcuda_argmax(sh_tensor *out, const sh_tensor *a, int dim) {
  const char *name = "argmax";
  int64_t outer, inner, R = a->shape[dim];
  split_at(a->ndim, a->shape, dim, &outer, &inner);
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(name, a->device, &st));
  sh_tguard x;
  SH_TRY(sh_cuda_contiguous_as(x.out(), a, dense_dtype(a->dtype)));
  int64_t *idx = (int64_t *)sh_tensor_data(out);
  bool f64 = x.t->dtype == SH_F64;
  if (outer * inner > 0) {
    if (inner == 1) {
      for (int64_t o0 = 0; o0 < outer; o0 += 2147483647LL) {
        unsigned nb = (unsigned)sh_min64(2147483647LL, outer - o0);
        if (f64) argmax_rows_kernel<double><<<nb, RED_THREADS, 0, st>>>((const double *)sh_tensor_data(x.t) + o0 * R, R, idx + o0);
        else argmax_rows_kernel<float><<<nb, RED_THREADS, 0, st>>>((const float *)sh_tensor_data(x.t) + o0 * R, R, idx + o0);
        CU_LAUNCHED(name);
      }
    } else {
      unsigned nb = sh_blocks(outer * inner, RED_THREADS);
      if (f64) argmax_cols_kernel<double><<<nb, RED_THREADS, 0, st>>>((const double *)sh_tensor_data(x.t), outer, R, inner, idx);
      else argmax_cols_kernel<float><<<nb, RED_THREADS, 0, st>>>((const float *)sh_tensor_data(x.t), outer, R, inner, idx);
      CU_LAUNCHED(name);
    }
  }
  return SH_OK;
}

/* ---- sum_to_shape ---------------------------------------------------------------------- */

/* out and a have the same dims (the front's runs of kept and summed dims, so [B,T,C] -> [C]
 * is one column reduction of [B*T, C]); each dim where out is 1 and a is not is reduced in
 * turn into a double buffer, and the last pass writes out. */
extern "C" int sh_kcuda_sum_to_shape(sh_tensor *out, const sh_tensor *a) {
  const char *name = "sum_to_shape";
  int64_t size[SH_MAX_DIMS];
  int nsummed = 0;
  for (int d = 0; d < a->ndim; d++) { size[d] = a->shape[d]; nsummed += out->shape[d] != size[d]; }
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(name, a->device, &st));
  sh_tguard x;
  SH_TRY(sh_cuda_contiguous_as(x.out(), a, dense_dtype(a->dtype)));
  int done = 0;
  for (int r = 0; r < a->ndim; r++) {
    if (out->shape[r] == size[r]) continue;
    int64_t outer, inner;
    split_at(a->ndim, size, r, &outer, &inner);
    bool last = ++done == nsummed;
    sh_tguard next;
    if (!last) {
      int64_t n1[1] = {outer * inner};
      SH_TRY(sh_tensor_empty(next.out(), 1, n1, SH_F64, a->device));
    }
    sh_tensor *dst = last ? out : next.t;
    SH_TRY(reduce_core(name, st, x.t, outer, size[r], inner, SH_OP_SUM, 1.0, (char *)sh_tensor_data(dst), dst->dtype));
    size[r] = 1;
    if (!last) { sh_tensor_destroy(x.t); x.t = next.take(); }
  }
  return SH_OK;
}

/* ---- sumsq (global gradient norm) ---------------------------------------------------------- */

extern "C" int sh_kcuda_sumsq(const sh_tensor *a, double *out) {
  const char *name = "sumsq";
  cudaStream_t st;
  sh_tguard x, o;
  SH_TRY(sh_cuda_enter(name, a->device, &st));
  SH_TRY(sh_cuda_contiguous_as(x.out(), a, dense_dtype(a->dtype)));
  SH_TRY(sh_tensor_empty(o.out(), 0, NULL, SH_F64, a->device));
  SH_TRY(reduce_core(name, st, x.t, 1, sh_tensor_numel(a), 1, SH_OP_SUMSQ, 1.0, (char *)sh_tensor_data(o.t), SH_F64));
  CU_TRY(name, cudaMemcpyAsync(out, sh_tensor_data(o.t), sizeof *out, cudaMemcpyDeviceToHost, st));
  CU_TRY(name, cudaStreamSynchronize(st));
  return SH_OK;
}
