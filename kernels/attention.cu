/* attention.cu: causal scaled-dot-product attention, forward and backward, flash style:
 * q, k, v [B, H, T, D] -> out [B, H, T, D] and lse [B, H, T] (f32, the row log-sum-exp of the
 * scaled scores), as runtime/nn_attention.c. No T x T matrix ever reaches global memory.
 *
 * bf16 with D a multiple of 16 up to 128 runs on the tensor cores (WMMA 16x16x16, f32
 * accumulation) over 64 x 64 tiles in shared memory, four warps per block, each warp owning
 * 16 rows of every tile so most steps need only warp-level synchronisation:
 *   forward, one block per (b, h, query tile): S = Q K^T, online softmax (running max m and
 *     sum l per row, O rescaled when m grows), O += P V, out = O / l, lse = m + log l;
 *   backward, after Dq = rowsum(dout * out): one kernel per key tile accumulates
 *     dV += P^T dO and dK += dS^T Q over the query tiles that see it, and one kernel per
 *     query tile accumulates dQ += dS K over the key tiles it sees, where P = exp(S - lse)
 *     and dS = P (dO V^T - Dq). Splitting dQ from dK/dV recomputes S and dP once more but needs
 *     no atomics, so gradients are identical from run to run.
 * q, k, v, out and dout may be strided views (heads split from a fused qkv projection) as
 * long as the last dim is unit-stride and rows are 16-byte aligned.
 * Other dtypes and head sizes take a simple path (one warp per row, f32 math, D <= 256).
 *
 * Grouped-query attention: k and v have Hkv heads, G = H / Hkv query heads per k/v head.
 * Query head h reads k/v head h / G in place; the dK/dV kernels run one block per (key tile,
 * k/v head) and walk the G query heads of the group, so each dk/dv row still has one writer.
 * Rotary embeddings (rope_kernel): the rotation of runtime/nn_attention.c, one thread per
 * element pair, angles in double; the nn.h front rotates q and k with it around these kernels. */
#include "common.cuh"
#include "backend_internal.h"
#include <mma.h>

using namespace nvcuda;

/* Tile rows are padded by 8 elements past their 64 or D (consecutive rows then start in
 * different shared-memory banks). The PTX ISA requires every row a wmma load or store touches
 * to start aligned to the fragment size: 32 bytes for the f32 accumulators (so their rows grow
 * by multiples of 8 floats), 16 bytes for the bf16 operands. */
enum { AT = 64, AT_WARPS = 4, AT_THREADS = AT_WARPS * 32, SLD = AT + 8, PLD = AT + 8, SIMPLE_MAX_D = 256 };

/* Element strides of a [B, H, T, D] view (d is unit-stride). */
struct at_view { int64_t sb, sh, st; };

static at_view view_of(const sh_tensor *t) { return at_view{t->stride[0], t->stride[1], t->stride[2]}; }

/* Offsets (in bytes) of the shared-memory regions for head size D; every region starts on a
 * 128-byte boundary and every row length keeps WMMA's 32-byte pointer alignment. */
struct at_smem {
  int ld;                       /* bf16 tile row length: D + 8 */
  int ldo;                      /* f32 accumulator row length: D + 8 */
  size_t q, k, v, d, s, dp, p, ds, acc0, acc1, stats, total;
};

__host__ __device__ static inline size_t up128(size_t x) { return (x + 127) / 128 * 128; }

__host__ __device__ static inline at_smem at_layout(int D) {
  at_smem L;
  L.ld = D + 8;
  L.ldo = D + 8;
  size_t tile = (size_t)AT * L.ld * 2, f32t = (size_t)AT * SLD * 4, b16t = (size_t)AT * PLD * 2, acc = (size_t)AT * L.ldo * 4;
  size_t o = 0;
  L.q = o; o += up128(tile);
  L.k = o; o += up128(tile);
  L.v = o; o += up128(tile);
  L.d = o; o += up128(tile);
  L.s = o; o += up128(f32t);
  L.dp = o; o += up128(f32t);
  L.p = o; o += up128(b16t);
  L.ds = o; o += up128(b16t);
  L.acc0 = o; o += up128(acc);
  L.acc1 = o; o += up128(acc);
  L.stats = o; o += 4 * AT * sizeof(float);
  L.total = o;
  return L;
}

/* Copies rows [t0, t0 + 64) of one head into a tile (zeros past T), 16 bytes at a time. */
__device__ __forceinline__ void load_tile(__nv_bfloat16 *tile, int ld, const __nv_bfloat16 *src, int64_t st, int64_t t0,
                                          int64_t T, int D) {
  int per_row = D / 8;
  for (int c = threadIdx.x; c < AT * per_row; c += blockDim.x) {
    int r = c / per_row, col = (c % per_row) * 8;
    int4 val = make_int4(0, 0, 0, 0);
    if (t0 + r < T) val = *reinterpret_cast<const int4 *>(src + (t0 + r) * st + col);
    *reinterpret_cast<int4 *>(tile + r * ld + col) = val;
  }
}

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_at;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Warp w: out[16w.., 0..64) = X[16w.., :D] Y[0..64, :D]^T (f32, ld SLD). */
__device__ __forceinline__ void mm_xyT(float *out, const __nv_bfloat16 *X, const __nv_bfloat16 *Y, int ld, int D, int w) {
  for (int n = 0; n < AT / 16; n++) {
    frag_c c;
    wmma::fill_fragment(c, 0.0f);
    for (int k = 0; k < D / 16; k++) {
      frag_a a;
      frag_bt b;
      wmma::load_matrix_sync(a, X + 16 * w * ld + 16 * k, ld);
      wmma::load_matrix_sync(b, Y + 16 * n * ld + 16 * k, ld);
      wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(out + 16 * w * SLD + 16 * n, c, SLD, wmma::mem_row_major);
  }
}

/* Warp w: acc[16w.., :D] += A[16w.., 0..64) Y[0..64, :D], A row-major bf16 (ld PLD), or with
 * transA the transpose of A (A^T[16w.., q] = A[q, 16w..]). */
__device__ __forceinline__ void mm_acc(float *acc, int ldo, const __nv_bfloat16 *A, int transA, const __nv_bfloat16 *Y,
                                       int ld, int D, int w) {
  for (int n = 0; n < D / 16; n++) {
    frag_c c;
    wmma::load_matrix_sync(c, acc + 16 * w * ldo + 16 * n, ldo, wmma::mem_row_major);
    for (int k = 0; k < AT / 16; k++) {
      frag_b b;
      wmma::load_matrix_sync(b, Y + 16 * k * ld + 16 * n, ld);
      if (transA) {
        frag_at a;
        wmma::load_matrix_sync(a, A + 16 * k * PLD + 16 * w, PLD);
        wmma::mma_sync(c, a, b, c);
      } else {
        frag_a a;
        wmma::load_matrix_sync(a, A + 16 * w * PLD + 16 * k, PLD);
        wmma::mma_sync(c, a, b, c);
      }
    }
    wmma::store_matrix_sync(acc + 16 * w * ldo + 16 * n, c, ldo, wmma::mem_row_major);
  }
}

__global__ void __launch_bounds__(AT_THREADS) attn_fwd_tc_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, at_view qv, at_view kv, at_view vv,
    __nv_bfloat16 *out, float *lse, int H, int G, int64_t T, int D, float scale) {
  extern __shared__ __align__(128) char smem[];
  at_smem L = at_layout(D);
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)(smem + L.q), *Ks = (__nv_bfloat16 *)(smem + L.k), *Vs = (__nv_bfloat16 *)(smem + L.v);
  float *S = (float *)(smem + L.s), *O = (float *)(smem + L.acc0), *mrow = (float *)(smem + L.stats), *lrow = mrow + AT;
  __nv_bfloat16 *P = (__nv_bfloat16 *)(smem + L.p);
  int bh = blockIdx.y, b = bh / H, h = bh % H, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t i0 = (int64_t)blockIdx.x * AT;
  const __nv_bfloat16 *qh = q + b * qv.sb + h * qv.sh, *kh = k + b * kv.sb + (h / G) * kv.sh, *vh = v + b * vv.sb + (h / G) * vv.sh;
  load_tile(Qs, L.ld, qh, qv.st, i0, T, D);
  for (int c = threadIdx.x; c < AT * L.ldo; c += blockDim.x) O[c] = 0.0f;
  if (threadIdx.x < AT) { mrow[threadIdx.x] = -INFINITY; lrow[threadIdx.x] = 0.0f; }
  for (int64_t j0 = 0; j0 <= i0; j0 += AT) {
    __syncthreads();   /* the previous tile's K/V are no longer read */
    load_tile(Ks, L.ld, kh, kv.st, j0, T, D);
    load_tile(Vs, L.ld, vh, vv.st, j0, T, D);
    __syncthreads();
    mm_xyT(S, Qs, Ks, L.ld, D, w);
    __syncwarp();
    for (int rr = 0; rr < 16; rr++) {
      int r = 16 * w + rr;
      int64_t qi = i0 + r;
      float s[2], mx = -INFINITY;
      for (int h2 = 0; h2 < 2; h2++) {
        int c = lane + 32 * h2;
        int64_t kj = j0 + c;
        s[h2] = (kj <= qi && kj < T) ? S[r * SLD + c] * scale : -INFINITY;
        mx = fmaxf(mx, s[h2]);
      }
      mx = warp_max(mx);
      float mold = mrow[r], mnew = fmaxf(mold, mx);
      float alpha = mnew == -INFINITY ? 1.0f : __expf(mold - mnew);
      float sum = 0;
      for (int h2 = 0; h2 < 2; h2++) {
        float p = s[h2] == -INFINITY ? 0.0f : __expf(s[h2] - mnew);
        P[r * PLD + lane + 32 * h2] = __float2bfloat16_rn(p);
        sum += p;
      }
      sum = warp_sum(sum);
      for (int d = lane; d < D; d += 32) O[r * L.ldo + d] *= alpha;
      __syncwarp();
      if (lane == 0) { mrow[r] = mnew; lrow[r] = lrow[r] * alpha + sum; }
      __syncwarp();
    }
    mm_acc(O, L.ldo, P, 0, Vs, L.ld, D, w);
    __syncwarp();
  }
  for (int rr = 0; rr < 16; rr++) {
    int r = 16 * w + rr;
    int64_t qi = i0 + r;
    if (qi >= T) break;
    float l = lrow[r], inv = 1.0f / l;
    __nv_bfloat16 *orow = out + ((int64_t)bh * T + qi) * D;
    for (int d = lane; d < D; d += 32) orow[d] = __float2bfloat16_rn(O[r * L.ldo + d] * inv);
    if (lane == 0) lse[(int64_t)bh * T + qi] = mrow[r] + logf(l);
  }
}

/* Dq[bh, t] = sum_d dout * out (f32), the softmax backward's row term. */
template <typename T>
__global__ void attn_dq_rowdot_kernel(const T *dout, at_view dv, const T *out, int64_t rows, int H, int64_t Tn, int D, float *Dq) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bh = row / Tn, t = row % Tn;
  int64_t b = bh / H, h = bh % H;
  const T *dr = dout + b * dv.sb + h * dv.sh + t * dv.st, *orow = out + row * D;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += to_f(dr[d]) * to_f(orow[d]);
  s = warp_sum(s);
  if (lane == 0) Dq[row] = s;
}

/* Backward tile step shared by both kernels: with Q_i, dO_i, K_j, V_j in shared memory, warp
 * w fills its 16 rows of P = exp(scale S - lse) and dS = P (dP - Dq) as bf16 tiles. */
__device__ __forceinline__ void bwd_tile(const at_smem &L, char *smem, const float *lse_h, const float *dq_h, int64_t i0,
                                         int64_t j0, int64_t T, int D, float scale, int w, int lane) {
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)(smem + L.q), *Ks = (__nv_bfloat16 *)(smem + L.k), *Vs = (__nv_bfloat16 *)(smem + L.v);
  __nv_bfloat16 *dOs = (__nv_bfloat16 *)(smem + L.d), *P = (__nv_bfloat16 *)(smem + L.p), *dS = (__nv_bfloat16 *)(smem + L.ds);
  float *S = (float *)(smem + L.s), *dP = (float *)(smem + L.dp);
  mm_xyT(S, Qs, Ks, L.ld, D, w);
  mm_xyT(dP, dOs, Vs, L.ld, D, w);
  __syncwarp();
  for (int rr = 0; rr < 16; rr++) {
    int r = 16 * w + rr;
    int64_t qi = i0 + r;
    float l = qi < T ? lse_h[qi] : 0.0f, dd = qi < T ? dq_h[qi] : 0.0f;
    for (int h2 = 0; h2 < 2; h2++) {
      int c = lane + 32 * h2;
      int64_t kj = j0 + c;
      float p = (qi < T && kj <= qi) ? __expf(S[r * SLD + c] * scale - l) : 0.0f;
      P[r * PLD + c] = __float2bfloat16_rn(p);
      dS[r * PLD + c] = __float2bfloat16_rn(p * (dP[r * SLD + c] - dd));
    }
  }
  __syncwarp();
}

__global__ void __launch_bounds__(AT_THREADS) attn_bwd_kv_tc_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dv, const float *lse, const float *Dq, __nv_bfloat16 *dk, __nv_bfloat16 *dvout, int H,
    int G, int64_t T, int D, float scale) {
  extern __shared__ __align__(128) char smem[];
  at_smem L = at_layout(D);
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)(smem + L.q), *Ks = (__nv_bfloat16 *)(smem + L.k), *Vs = (__nv_bfloat16 *)(smem + L.v);
  __nv_bfloat16 *dOs = (__nv_bfloat16 *)(smem + L.d), *P = (__nv_bfloat16 *)(smem + L.p), *dS = (__nv_bfloat16 *)(smem + L.ds);
  float *dK = (float *)(smem + L.acc0), *dV = (float *)(smem + L.acc1);
  int Hkv = H / G, bkv = blockIdx.y, b = bkv / Hkv, hk = bkv % Hkv, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t j0 = (int64_t)blockIdx.x * AT;
  load_tile(Ks, L.ld, k + b * kv.sb + hk * kv.sh, kv.st, j0, T, D);
  load_tile(Vs, L.ld, v + b * vv.sb + hk * vv.sh, vv.st, j0, T, D);
  for (int c = threadIdx.x; c < AT * L.ldo; c += blockDim.x) { dK[c] = 0.0f; dV[c] = 0.0f; }
  int64_t ntiles = (T - j0 + AT - 1) / AT;   /* the query tiles that see this key tile */
  for (int64_t it = 0; it < G * ntiles; it++) {   /* (query head of the group, query tile) */
    int64_t h = hk * G + it / ntiles, i0 = j0 + it % ntiles * AT, bh = b * H + h;
    const float *lse_h = lse + bh * T, *dq_h = Dq + bh * T;
    __syncthreads();   /* the previous Q/dO tiles and P/dS are no longer read */
    load_tile(Qs, L.ld, q + b * qv.sb + h * qv.sh, qv.st, i0, T, D);
    load_tile(dOs, L.ld, dout + b * dv.sb + h * dv.sh, dv.st, i0, T, D);
    __syncthreads();
    bwd_tile(L, smem, lse_h, dq_h, i0, j0, T, D, scale, w, lane);
    __syncthreads();   /* P^T and dS^T mix every warp's rows */
    mm_acc(dV, L.ldo, P, 1, dOs, L.ld, D, w);
    mm_acc(dK, L.ldo, dS, 1, Qs, L.ld, D, w);
  }
  __syncwarp();
  for (int rr = 0; rr < 16; rr++) {
    int r = 16 * w + rr;
    int64_t kj = j0 + r;
    if (kj >= T) break;
    __nv_bfloat16 *dkr = dk + ((int64_t)bkv * T + kj) * D, *dvr = dvout + ((int64_t)bkv * T + kj) * D;
    for (int d = lane; d < D; d += 32) {
      dkr[d] = __float2bfloat16_rn(dK[r * L.ldo + d] * scale);
      dvr[d] = __float2bfloat16_rn(dV[r * L.ldo + d]);
    }
  }
}

__global__ void __launch_bounds__(AT_THREADS) attn_bwd_q_tc_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dv, const float *lse, const float *Dq, __nv_bfloat16 *dq, int H, int G, int64_t T, int D,
    float scale) {
  extern __shared__ __align__(128) char smem[];
  at_smem L = at_layout(D);
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)(smem + L.q), *Ks = (__nv_bfloat16 *)(smem + L.k), *Vs = (__nv_bfloat16 *)(smem + L.v);
  __nv_bfloat16 *dOs = (__nv_bfloat16 *)(smem + L.d), *dS = (__nv_bfloat16 *)(smem + L.ds);
  float *dQ = (float *)(smem + L.acc0);
  int bh = blockIdx.y, b = bh / H, h = bh % H, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t i0 = (int64_t)blockIdx.x * AT;
  load_tile(Qs, L.ld, q + b * qv.sb + h * qv.sh, qv.st, i0, T, D);
  load_tile(dOs, L.ld, dout + b * dv.sb + h * dv.sh, dv.st, i0, T, D);
  for (int c = threadIdx.x; c < AT * L.ldo; c += blockDim.x) dQ[c] = 0.0f;
  const float *lse_h = lse + (int64_t)bh * T, *dq_h = Dq + (int64_t)bh * T;
  for (int64_t j0 = 0; j0 <= i0; j0 += AT) {
    __syncthreads();
    load_tile(Ks, L.ld, k + b * kv.sb + (h / G) * kv.sh, kv.st, j0, T, D);
    load_tile(Vs, L.ld, v + b * vv.sb + (h / G) * vv.sh, vv.st, j0, T, D);
    __syncthreads();
    bwd_tile(L, smem, lse_h, dq_h, i0, j0, T, D, scale, w, lane);
    mm_acc(dQ, L.ldo, dS, 0, Ks, L.ld, D, w);   /* warp w reads only its own dS rows */
  }
  __syncwarp();
  for (int rr = 0; rr < 16; rr++) {
    int r = 16 * w + rr;
    int64_t qi = i0 + r;
    if (qi >= T) break;
    __nv_bfloat16 *dqr = dq + ((int64_t)bh * T + qi) * D;
    for (int d = lane; d < D; d += 32) dqr[d] = __float2bfloat16_rn(dQ[r * L.ldo + d] * scale);
  }
}

/* ---- the simple path: any float dtype, D <= 256, one warp per row, f32 math ------------------ */

/* The contiguous [B, Hkv] index of the k/v head that query head bh = (b, h) of [B, H] reads. */
__device__ __forceinline__ int64_t kv_head(int64_t bh, int H, int G) { return bh / H * (H / G) + bh % H / G; }

enum { SD = SIMPLE_MAX_D / 32 };

/* Forward: warp per query row; lane owns elements lane + 32 u of q and of the accumulator. */
template <typename T>
__global__ void attn_fwd_simple_kernel(const T *q, const T *k, const T *v, T *out, float *lse, int64_t rows, int H, int G,
                                       int64_t Tn, int D, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bh = row / Tn, qi = row % Tn, bkv = kv_head(bh, H, G);
  const T *kh = k + bkv * Tn * D, *vh = v + bkv * Tn * D, *qr = q + row * D;
  float qf[SD], acc[SD];
#pragma unroll
  for (int u = 0; u < SD; u++) { int d = lane + 32 * u; qf[u] = d < D ? to_f(qr[d]) : 0.0f; acc[u] = 0.0f; }
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j <= qi; j++) {
    const T *kr = kh + j * D, *vr = vh + j * D;
    float s = 0;
#pragma unroll
    for (int u = 0; u < SD; u++) { int d = lane + 32 * u; if (d < D) s += qf[u] * to_f(kr[d]); }
    s = warp_sum(s) * scale;
    float mnew = fmaxf(m, s), alpha = __expf(m - mnew), p = __expf(s - mnew);
    l = l * alpha + p;
#pragma unroll
    for (int u = 0; u < SD; u++) { int d = lane + 32 * u; if (d < D) acc[u] = acc[u] * alpha + p * to_f(vr[d]); }
    m = mnew;
  }
  T *orow = out + row * D;
#pragma unroll
  for (int u = 0; u < SD; u++) { int d = lane + 32 * u; if (d < D) orow[d] = from_f<T>(acc[u] / l); }
  if (lane == 0) lse[row] = m + logf(l);
}

/* Backward for dq: warp per query row i, over keys j <= i. */
template <typename T>
__global__ void attn_bwd_q_simple_kernel(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *Dq,
                                         T *dq, int64_t rows, int H, int G, int64_t Tn, int D, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bh = row / Tn, qi = row % Tn, bkv = kv_head(bh, H, G);
  const T *kh = k + bkv * Tn * D, *vh = v + bkv * Tn * D;
  float qf[SD], dof[SD], acc[SD];
#pragma unroll
  for (int u = 0; u < SD; u++) {
    int d = lane + 32 * u;
    qf[u] = d < D ? to_f(q[row * D + d]) : 0.0f;
    dof[u] = d < D ? to_f(dout[row * D + d]) : 0.0f;
    acc[u] = 0.0f;
  }
  float l = lse[row], dd = Dq[row];
  for (int64_t j = 0; j <= qi; j++) {
    float s = 0, dp = 0;
#pragma unroll
    for (int u = 0; u < SD; u++) {
      int d = lane + 32 * u;
      if (d < D) { s += qf[u] * to_f(kh[j * D + d]); dp += dof[u] * to_f(vh[j * D + d]); }
    }
    s = warp_sum(s);
    dp = warp_sum(dp);
    float p = __expf(s * scale - l), ds = p * (dp - dd);
#pragma unroll
    for (int u = 0; u < SD; u++) { int d = lane + 32 * u; if (d < D) acc[u] += ds * to_f(kh[j * D + d]); }
  }
#pragma unroll
  for (int u = 0; u < SD; u++) { int d = lane + 32 * u; if (d < D) dq[row * D + d] = from_f<T>(acc[u] * scale); }
}

/* Backward for dk and dv: warp per key row j of [B, Hkv, T], over queries i >= j of the G
 * query heads that read it. */
template <typename T>
__global__ void attn_bwd_kv_simple_kernel(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *Dq,
                                          T *dk, T *dv, int64_t rows, int H, int G, int64_t Tn, int D, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bkv = row / Tn, kj = row % Tn, Hkv = H / G;
  float kf[SD], vf[SD], ak[SD], av[SD];
#pragma unroll
  for (int u = 0; u < SD; u++) {
    int d = lane + 32 * u;
    kf[u] = d < D ? to_f(k[row * D + d]) : 0.0f;
    vf[u] = d < D ? to_f(v[row * D + d]) : 0.0f;
    ak[u] = 0.0f;
    av[u] = 0.0f;
  }
  for (int64_t bh = bkv / Hkv * H + bkv % Hkv * G; bh < bkv / Hkv * H + (bkv % Hkv + 1) * G; bh++) {
    const T *qh = q + bh * Tn * D, *doh = dout + bh * Tn * D;
    for (int64_t i = kj; i < Tn; i++) {
      float s = 0, dp = 0;
#pragma unroll
      for (int u = 0; u < SD; u++) {
        int d = lane + 32 * u;
        if (d < D) { s += to_f(qh[i * D + d]) * kf[u]; dp += to_f(doh[i * D + d]) * vf[u]; }
      }
      s = warp_sum(s);
      dp = warp_sum(dp);
      float p = __expf(s * scale - lse[bh * Tn + i]), ds = p * (dp - Dq[bh * Tn + i]);
#pragma unroll
      for (int u = 0; u < SD; u++) {
        int d = lane + 32 * u;
        if (d < D) { av[u] += p * to_f(doh[i * D + d]); ak[u] += ds * to_f(qh[i * D + d]); }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < SD; u++) {
    int d = lane + 32 * u;
    if (d < D) { dk[row * D + d] = from_f<T>(ak[u] * scale); dv[row * D + d] = from_f<T>(av[u]); }
  }
}

/* ---- host side ----------------------------------------------------------------------------- */

/* The tensor-core path reads a view in place when its rows are 16-byte aligned. */
static bool tc_readable(const sh_tensor *t) {
  return t->dtype == SH_BF16 && t->stride[3] == 1 && sh_aligned16(sh_tensor_data(t)) && t->stride[0] % 8 == 0 &&
         t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0;
}

static bool use_tc(const sh_tensor *q) {
  int64_t D = q->shape[3];
  return q->dtype == SH_BF16 && D % 16 == 0 && D >= 16 && D <= 128;
}

/* *out = t itself when the tensor-core kernels can read it, else a contiguous bf16 copy. */
static int tc_input(sh_tguard &g, const sh_tensor *t, const sh_tensor **out) {
  if (tc_readable(t)) { *out = t; return SH_OK; }
  SH_TRY(sh_cuda_contiguous_as(g.out(), t, SH_BF16));
  *out = g.t;
  return SH_OK;
}

static int tc_smem(const char *op, int device, int D, size_t *bytes) {
  *bytes = at_layout(D).total;
  if (*bytes > (size_t)sh_cuda_props(device)->sharedMemPerBlockOptin)
    return sh_fail(SH_ERR_DEVICE, "%s: head size %d needs %zu bytes of shared memory; the device allows %zu", op, D, *bytes,
                   (size_t)sh_cuda_props(device)->sharedMemPerBlockOptin);
  return SH_OK;
}

/* The tensor-core kernels put (b, h) on grid.y, which the device caps (65535): they are
 * launched on *per_launch whole batches at a time, with every pointer moved to the first one. */
static int tc_batches(const char *op, const sh_tensor *q, int64_t *per_launch) {
  int64_t grid_y = sh_cuda_props(q->device)->maxGridSize[1];
  *per_launch = grid_y / q->shape[1];
  if (*per_launch == 0)
    return sh_fail(SH_ERR_ARG, "%s: q %s has more heads than the cuda kernel's grid allows (%lld)", op, sh_desc(q), (long long)grid_y);
  return SH_OK;
}

static int simple_fits(const char *op, int64_t D) {
  if (D > SIMPLE_MAX_D) return sh_fail(SH_ERR_ARG, "%s: head size %lld is above the cuda kernel's %d", op, (long long)D, SIMPLE_MAX_D);
  return SH_OK;
}

/* A bf16 tensor's data moved to batch b0 of its [B, H, T, D] view. */
static const __nv_bfloat16 *bf16_at(const sh_tensor *t, int64_t b0) {
  return (const __nv_bfloat16 *)sh_tensor_data(t) + b0 * t->stride[0];
}

/* The contiguous tensor of q's dtype and src's shape a kernel writes output dst into: dst
 * itself when it is contiguous with that dtype, else scratch copied into dst after (a strided
 * view of the caller's, e.g. heads of a fused [B, T, 3C] gradient; a gradient of another
 * dtype; dst may be NULL, not asked for). */
static int dense_target(sh_tguard &g, sh_tensor *dst, const sh_tensor *src, const sh_tensor *q, sh_tensor **out) {
  *out = dst;
  if (dst && dst->dtype == q->dtype && sh_tensor_is_contiguous(dst)) return SH_OK;
  SH_TRY(sh_tensor_empty(g.out(), 4, src->shape, q->dtype, q->device));
  *out = g.t;
  return SH_OK;
}

/* Kernels get the front's outputs and the scale it resolved (> 0). */
static int cuda_attention_forward(sh_tensor *dst, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                                  double scale) {
  const char *op = "attention";
  int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], rows = B * H * T;
  int G = (int)(H / k->shape[1]);
  float sc = (float)scale;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, q->device, &st));
  if (rows == 0) return SH_OK;
  sh_tguard qc, kc, vc, oc;
  sh_tensor *out;
  SH_TRY(dense_target(oc, dst, q, q, &out));
  if (use_tc(q)) {
    const sh_tensor *Q, *K, *V;
    SH_TRY(tc_input(qc, q, &Q));
    SH_TRY(tc_input(kc, k, &K));
    SH_TRY(tc_input(vc, v, &V));
    size_t smem;
    int64_t nb;
    SH_TRY(tc_smem(op, q->device, (int)D, &smem));
    SH_TRY(tc_batches(op, q, &nb));
    CU_TRY(op, cudaFuncSetAttribute(attn_fwd_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      dim3 grid((unsigned)((T + AT - 1) / AT), (unsigned)(sh_min64(nb, B - b0) * H));
      attn_fwd_tc_kernel<<<grid, AT_THREADS, smem, st>>>(
          bf16_at(Q, b0), bf16_at(K, b0), bf16_at(V, b0), view_of(Q), view_of(K), view_of(V),
          (__nv_bfloat16 *)sh_tensor_data(out) + b0 * H * T * D, (float *)sh_tensor_data(lse) + b0 * H * T, (int)H, G, T, (int)D, sc);
      CU_LAUNCHED(op);
    }
  } else {
    SH_TRY(simple_fits(op, D));
    SH_TRY(sh_cuda_contiguous_as(qc.out(), q, q->dtype));
    SH_TRY(sh_cuda_contiguous_as(kc.out(), k, q->dtype));
    SH_TRY(sh_cuda_contiguous_as(vc.out(), v, q->dtype));
    unsigned blocks = (unsigned)((rows + 7) / 8);
    SH_DISPATCH_FLOAT(q->dtype, Tt, op, {
      attn_fwd_simple_kernel<Tt><<<blocks, 256, 0, st>>>((const Tt *)sh_tensor_data(qc.t), (const Tt *)sh_tensor_data(kc.t),
                                                         (const Tt *)sh_tensor_data(vc.t), (Tt *)sh_tensor_data(out),
                                                         (float *)sh_tensor_data(lse), rows, (int)H, G, T, (int)D, sc);
    });
    CU_LAUNCHED(op);
  }
  return out == dst ? SH_OK : sh_tensor_copy_(dst, out);
}

static int cuda_attention_backward(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout, const sh_tensor *q,
                                   const sh_tensor *k, const sh_tensor *v, const sh_tensor *out, const sh_tensor *lse,
                                   double scale) {
  const char *op = "attention_backward";
  int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], rows = B * H * T;
  int64_t Hkv = k->shape[1], kv_rows = B * Hkv * T;
  int G = (int)(H / Hkv);
  float sc = (float)scale;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, q->device, &st));
  if (rows == 0) return SH_OK;
  bool tc = use_tc(q);
  if (!tc) SH_TRY(simple_fits(op, D));
  int dt = tc ? SH_BF16 : q->dtype;
  sh_tensor *dst[3] = {dq, dk, dv}, *Gr[3];
  const sh_tensor *src[3] = {q, k, v};
  sh_tguard gs[3], lc, oc, dqrow, qc, kc, vc, doc;
  for (int i = 0; i < 3; i++) SH_TRY(dense_target(gs[i], dst[i], src[i], q, &Gr[i]));
  const sh_tensor *Q, *K, *V, *dO;
  if (tc) {
    SH_TRY(tc_input(qc, q, &Q));
    SH_TRY(tc_input(kc, k, &K));
    SH_TRY(tc_input(vc, v, &V));
    SH_TRY(tc_input(doc, dout, &dO));
  } else {
    SH_TRY(sh_cuda_contiguous_as(qc.out(), q, dt)); Q = qc.t;
    SH_TRY(sh_cuda_contiguous_as(kc.out(), k, dt)); K = kc.t;
    SH_TRY(sh_cuda_contiguous_as(vc.out(), v, dt)); V = vc.t;
    SH_TRY(sh_cuda_contiguous_as(doc.out(), dout, dt)); dO = doc.t;
  }
  SH_TRY(sh_cuda_contiguous_as(lc.out(), lse, SH_F32));
  SH_TRY(sh_cuda_contiguous_as(oc.out(), out, dt));
  SH_TRY(sh_tensor_empty(dqrow.out(), 1, &rows, SH_F32, q->device));
  float *Dq = (float *)sh_tensor_data(dqrow.t);
  const float *L = (const float *)sh_tensor_data(lc.t);
  SH_DISPATCH_FLOAT(dt, Tt, op, {
    attn_dq_rowdot_kernel<Tt><<<dim3((unsigned)((rows + 7) / 8), 1), 256, 0, st>>>(
        (const Tt *)sh_tensor_data(dO), view_of(dO), (const Tt *)sh_tensor_data(oc.t), rows, (int)H, T, (int)D, Dq);
  });
  CU_LAUNCHED(op);
  if (tc) {
    size_t smem;
    int64_t nb;
    SH_TRY(tc_smem(op, q->device, (int)D, &smem));
    SH_TRY(tc_batches(op, q, &nb));
    CU_TRY(op, cudaFuncSetAttribute(attn_bwd_kv_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CU_TRY(op, cudaFuncSetAttribute(attn_bwd_q_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      unsigned tiles = (unsigned)((T + AT - 1) / AT);
      dim3 grid(tiles, (unsigned)(sh_min64(nb, B - b0) * H)), kv_grid(tiles, (unsigned)(sh_min64(nb, B - b0) * Hkv));
      const __nv_bfloat16 *qp = bf16_at(Q, b0), *kp = bf16_at(K, b0), *vp = bf16_at(V, b0), *dop = bf16_at(dO, b0);
      int64_t row0 = b0 * H * T, kv_row0 = b0 * Hkv * T;   /* lse, Dq and the (contiguous) gradients */
      __nv_bfloat16 *dqp = (__nv_bfloat16 *)sh_tensor_data(Gr[0]) + row0 * D;
      __nv_bfloat16 *dkp = (__nv_bfloat16 *)sh_tensor_data(Gr[1]) + kv_row0 * D;
      __nv_bfloat16 *dvp = (__nv_bfloat16 *)sh_tensor_data(Gr[2]) + kv_row0 * D;
      attn_bwd_kv_tc_kernel<<<kv_grid, AT_THREADS, smem, st>>>(qp, kp, vp, dop, view_of(Q), view_of(K), view_of(V),
                                                               view_of(dO), L + row0, Dq + row0, dkp, dvp, (int)H, G, T,
                                                               (int)D, sc);
      CU_LAUNCHED(op);
      attn_bwd_q_tc_kernel<<<grid, AT_THREADS, smem, st>>>(qp, kp, vp, dop, view_of(Q), view_of(K), view_of(V), view_of(dO),
                                                           L + row0, Dq + row0, dqp, (int)H, G, T, (int)D, sc);
      CU_LAUNCHED(op);
    }
  } else {
    unsigned blocks = (unsigned)((rows + 7) / 8);
    SH_DISPATCH_FLOAT(dt, Tt, op, {
      const Tt *qp = (const Tt *)sh_tensor_data(Q), *kp = (const Tt *)sh_tensor_data(K);
      const Tt *vp = (const Tt *)sh_tensor_data(V), *dop = (const Tt *)sh_tensor_data(dO);
      attn_bwd_q_simple_kernel<Tt><<<blocks, 256, 0, st>>>(qp, kp, vp, dop, L, Dq, (Tt *)sh_tensor_data(Gr[0]), rows, (int)H,
                                                           G, T, (int)D, sc);
      attn_bwd_kv_simple_kernel<Tt><<<(unsigned)((kv_rows + 7) / 8), 256, 0, st>>>(
          qp, kp, vp, dop, L, Dq, (Tt *)sh_tensor_data(Gr[1]), (Tt *)sh_tensor_data(Gr[2]), kv_rows, (int)H, G, T, (int)D, sc);
    });
    CU_LAUNCHED(op);
  }
  for (int i = 0; i < 3; i++)
    if (dst[i] && dst[i] != Gr[i]) SH_TRY(sh_tensor_copy_(dst[i], Gr[i]));
  return SH_OK;
}

/* ---- rotary embeddings ---------------------------------------------------------------------- */

/* y (contiguous [B, H, T, D]) = x rotated by t * theta^(-2i/D), pairs (i, i + D/2); sign -1
 * rotates back. One thread per pair; the angle in double as on the CPU. */
template <typename T>
__global__ void rope_kernel(const T *x, at_view xv, T *y, int64_t pairs, int H, int64_t Tn, int D, double theta, float sign) {
  int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  int half = D / 2, i = (int)(p % half);
  int64_t row = p / half, t = row % Tn, h = row / Tn % H, b = row / Tn / H;
  double sn, cs;
  sincos((double)t * pow(theta, -2.0 * i / D), &sn, &cs);
  const T *xr = x + b * xv.sb + h * xv.sh + t * xv.st;
  float x1 = to_f(xr[i]), x2 = to_f(xr[i + half]), c = (float)cs, s = sign * (float)sn;
  y[row * D + i] = from_f<T>(x1 * c - x2 * s);
  y[row * D + i + half] = from_f<T>(x2 * c + x1 * s);
}

static int cuda_rope(sh_tensor *y, const sh_tensor *x, double theta, int inverse) {
  const char *op = inverse ? "rope_backward" : "rope";
  int64_t H = x->shape[1], T = x->shape[2], D = x->shape[3], pairs = sh_tensor_numel(x) / 2;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, x->device, &st));
  if (pairs == 0) return SH_OK;
  sh_tguard xc;
  const sh_tensor *X = x;
  if (x->stride[3] != 1) { SH_TRY(sh_cuda_contiguous_as(xc.out(), x, x->dtype)); X = xc.t; }
  SH_DISPATCH_FLOAT(x->dtype, Tt, op, {
    rope_kernel<Tt><<<(unsigned)((pairs + 255) / 256), 256, 0, st>>>((const Tt *)sh_tensor_data(X), view_of(X),
                                                                      (Tt *)sh_tensor_data(y), pairs, (int)H, T, (int)D,
                                                                      theta, inverse ? -1.0f : 1.0f);
  });
  CU_LAUNCHED(op);
  return SH_OK;
}

extern "C" void sh_attention_register_cuda(sh_backend *b) {
  b->attention_forward = cuda_attention_forward;
  b->attention_backward = cuda_attention_backward;
  b->rope = cuda_rope;
}
