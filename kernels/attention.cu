/* attention.cu: causal scaled-dot-product attention, forward and backward, flash style:
 * q, k, v [B, H, T, D] -> out [B, H, T, D] and lse [B, H, T] (f32, the row log-sum-exp of the
 * scaled scores), as runtime/cpu/attention.c. No T x T matrix ever reaches global memory.
 *
 * bf16 with D a multiple of 16 up to 128 runs FlashAttention-2's way on the tensor cores
 * (mma.sync m16n8k16, f32 accumulation; kernels/mma_sm80.cuh): 64 x 64 tiles, four warps per
 * block, each warp owning 16 rows of its block's tile, the tiles it iterates against streamed
 * through shared memory by cp.async, two deep. Scores, probabilities and accumulators stay in
 * registers: a C fragment of S, rounded to bf16, is the A fragment of P V.
 *   forward, one block per (query tile, b, h): S = Q K^T, online softmax in the exp2 domain
 *     (running max m and sum l per row, O rescaled when m grows), O += P V, out = O / l,
 *     lse = m + log l;
 *   backward, after Dq = rowsum(dout * out), in one pass as FlashAttention-2's: one block per
 *     key tile accumulates dV += P^T dO and dK += dS^T Q in registers over the query tiles that
 *     see it (S^T = K Q^T, so P^T and dS^T are in the A layout), where P = exp(S - lse) and
 *     dS = P (dO V^T - Dq), puts dS^T in shared memory and adds dS K into an f32 dq
 *     accumulator with atomicAdd: 5 products per tile pair; a last kernel scales dq into its
 *     dtype and strides. The key tiles' shares of a dq row are summed in the order the GPU
 *     runs their blocks, so dq's low bits vary from run to run. With sh_deterministic()
 *     (core/determinism.h) the backward runs in two kernels instead: the same dK/dV kernel
 *     without dq, then one per query tile that recomputes S and dP (7 products per tile pair)
 *     and accumulates dQ += dS K over the key tiles it sees, each gradient row with one
 *     writer, so the gradients are identical from run to run (dK and dV are the same bits in
 *     both forms).
 * Blocks of the longest causal rows are scheduled first. q, k, v, out, dout and the
 * gradients may be strided views (heads of a fused qkv projection and of its gradient) with
 * a unit-stride last dim; inputs are read in place when rows are 16-byte aligned, outputs
 * written in place when element pairs are 4-byte aligned, else through a contiguous copy.
 * Other dtypes and head sizes take a simple path (one warp per row, f32 math, D <= 256).
 *
 * Grouped-query attention: k and v have Hkv heads, G = H / Hkv query heads per k/v head.
 * Query head h reads k/v head h / G in place; the dK/dV kernels run one block per (key tile,
 * k/v head) and walk the G query heads of the group, so each dk/dv row still has one writer.
 * Rotary embeddings (rope_kernel): the rotation of runtime/cpu/attention.c, one thread per
 * element pair, angles in double; the nn.h front rotates q and k with it around these kernels. */
#include "common.cuh"
#include "core/backend_internal.h"
extern "C" {
#include "core/determinism.h"
}
#include <mma_sm80.cuh>

/* The flash kernels: 64 x 64 tiles, four warps per block, warp w owning 16 rows of the tile
 * its block iterates against. A head of D columns is padded to DP = 32, 64 or 128 with zeros
 * in shared memory (zeros add nothing to Q K^T, and the padded output columns are not
 * written). Tile rows are padded by 8 elements (16 bytes), so the 8 row addresses of an
 * ldmatrix fall in distinct banks (the one-pass backward's 64 x 64 dS^T tile likewise: DS_LD). */
enum { FT = 64, F_THREADS = 128, SIMPLE_MAX_D = 256, DS_LD = FT + 8 };
#define SH_LOG2E 1.4426950408889634f

/* Element strides of a [B, H, T, D] view (d is unit-stride). */
struct at_view { int64_t sb, sh, st; };

static at_view view_of(const sh_tensor *t) { return at_view{t->stride[0], t->stride[1], t->stride[2]}; }

template <int DP> struct ftile { static constexpr int LD = DP + 8, ELEMS = FT * LD; };

/* Queues the copies of rows [t0, t0 + 64) of one head into a tile, 16 bytes each: zeros for
 * rows at or past T and for the padding columns at or past D. */
template <int DP>
__device__ __forceinline__ void tile_async(__nv_bfloat16 *tile, const __nv_bfloat16 *src, int64_t st, int64_t t0, int64_t T,
                                           int D) {
  constexpr int CH = DP / 8;
  for (int c = threadIdx.x; c < FT * CH; c += blockDim.x) {
    int r = c / CH, col = c % CH * 8;
    bool valid = t0 + r < T && col < D;
    cp_async16(tile + r * ftile<DP>::LD + col, valid ? src + (t0 + r) * st + col : src, valid);
  }
}

/* Warp-level fragment loads from a row-major shared tile (ld elements per row). */
/* A: rows [r0, r0 + 16) x columns [c0, c0 + 16). */
__device__ __forceinline__ void frag_a(uint32_t a[4], const __nv_bfloat16 *tile, int ld, int r0, int c0) {
  int l = threadIdx.x & 31;
  ldsm_x4(a, tile + (r0 + (l & 7) + 8 * ((l >> 3) & 1)) * ld + c0 + 8 * (l >> 4));
}

/* The same A where the tile holds it transposed: A[r][c] = tile[c][r] (the transposing load). */
__device__ __forceinline__ void frag_a_t(uint32_t a[4], const __nv_bfloat16 *tile, int ld, int r0, int c0) {
  int l = threadIdx.x & 31;
  ldsm_x4_trans(a, tile + (c0 + (l & 7) + 8 * (l >> 4)) * ld + r0 + 8 * ((l >> 3) & 1));
}

/* B of the n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16) over k in [k0, k0 + 16), where
 * B[k][n] = M[n][k] (the K of Q K^T: its rows are the product's columns). */
__device__ __forceinline__ void frag_b_nk(uint32_t b[2][2], const __nv_bfloat16 *tile, int ld, int n0, int k0) {
  int l = threadIdx.x & 31;
  uint32_t r[4];
  ldsm_x4(r, tile + (n0 + (l & 7) + 8 * (l >> 4)) * ld + k0 + 8 * ((l >> 3) & 1));
  b[0][0] = r[0]; b[0][1] = r[1]; b[1][0] = r[2]; b[1][1] = r[3];
}

/* The same where B[k][n] = M[k][n] (the V of P V), through the transposing load. */
__device__ __forceinline__ void frag_b_kn(uint32_t b[2][2], const __nv_bfloat16 *tile, int ld, int k0, int n0) {
  int l = threadIdx.x & 31;
  uint32_t r[4];
  ldsm_x4_trans(r, tile + (k0 + (l & 7) + 8 * ((l >> 3) & 1)) * ld + n0 + 8 * (l >> 4));
  b[0][0] = r[0]; b[0][1] = r[1]; b[1][0] = r[2]; b[1][1] = r[3];
}

/* c0 += a b[0] and c1 += a b[1]: the two n-tiles of one 16-column B load. */
__device__ __forceinline__ void mma_pair(float c0[4], float c1[4], const uint32_t a[4], const uint32_t b[2][2]) {
  mma_bf16_16816(c0, a, b[0]);
  mma_bf16_16816(c1, a, b[1]);
}

/* acc[16 x 8 NT] (NT n-tiles) = the sum over KS k-steps of A B, both from shared tiles:
 * load_a(a, kk) the A fragment of k-step kk, load_b(b, kk, np) the B of n-tiles 2 np, 2 np + 1. */
template <int KS, int NT, typename LoadA, typename LoadB>
__device__ __forceinline__ void mm_smem(float acc[NT][4], LoadA load_a, LoadB load_b) {
#pragma unroll
  for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    uint32_t a[4];
    load_a(a, kk);
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t b[2][2];
      load_b(b, kk, np);
      mma_pair(acc[2 * np], acc[2 * np + 1], a, b);
    }
  }
}

/* acc[16 x 8 NT] (NT n-tiles) = X[r0.., :DP] Y[y0 .. y0 + 8 NT, :DP]^T, both shared tiles. */
template <int DP, int NT>
__device__ __forceinline__ void mm_rows_t(float acc[NT][4], const __nv_bfloat16 *X, int r0, const __nv_bfloat16 *Y, int y0) {
  constexpr int LD = ftile<DP>::LD;
  mm_smem<DP / 16, NT>(acc, [&](uint32_t *a, int kk) { frag_a(a, X, LD, r0, 16 * kk); },
                       [&](uint32_t (*b)[2], int kk, int np) { frag_b_nk(b, Y, LD, y0 + 16 * np, 16 * kk); });
}

/* acc[16 x DP] += P[16 x 8 NT] Y[y0 .. y0 + 8 NT, :DP]: P a C tile in registers (rounded to
 * bf16 as the A operand; its n-tiles 2kk and 2kk + 1 are the A fragment of k-step kk), Y a
 * shared tile. */
template <int DP, int NT>
__device__ __forceinline__ void mm_acc_p(float acc[DP / 8][4], const float p[NT][4], const __nv_bfloat16 *Y, int y0) {
  constexpr int LD = ftile<DP>::LD;
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++) {
    const float *c0 = p[2 * kk], *c1 = p[2 * kk + 1];
    uint32_t a[4] = {pack_bf16(c0[0], c0[1]), pack_bf16(c0[2], c0[3]), pack_bf16(c1[0], c1[1]), pack_bf16(c1[2], c1[3])};
#pragma unroll
    for (int dp = 0; dp < DP / 16; dp++) {
      uint32_t b[2][2];
      frag_b_kn(b, Y, LD, y0 + 16 * kk, 16 * dp);
      mma_pair(acc[2 * dp], acc[2 * dp + 1], a, b);
    }
  }
}

/* fn(row, col, x0, x1) for each element pair (columns col, col + 1) of a lane's part of a
 * 16 x 8 NT f32 C tile standing for rows [r0, r0 + 16) and columns [c0, c0 + 8 NT), skipping
 * rows at or past T and columns at or past D (the padding). */
template <int NT, typename Fn>
__device__ __forceinline__ void c_tile_pairs(const float acc[NT][4], int64_t r0, int c0, int64_t T, int D, Fn fn) {
  int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int64_t row = r0 + g + 8 * r;
    if (row >= T) continue;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      int col = c0 + 8 * n + 2 * t;
      if (col < D) fn(row, col, acc[n][2 * r], acc[n][2 * r + 1]);
    }
  }
}

/* Writes a lane's part of rows [r0, r0 + 16) of a 16 x DP f32 C tile, times mul, as bf16 pairs
 * into a [B, H, T, D] view (unit-stride d, even strides), skipping rows at or past T and the
 * padding columns. */
template <int DP>
__device__ __forceinline__ void store_rows(__nv_bfloat16 *dst, int64_t st, int64_t r0, int64_t T, int D, const float acc[DP / 8][4],
                                           float mul) {
  c_tile_pairs<DP / 8>(acc, r0, 0, T, D, [&](int64_t row, int col, float x0, float x1) {
    *reinterpret_cast<__nv_bfloat162 *>(dst + row * st + col) = __floats2bfloat162_rn(x0 * mul, x1 * mul);
  });
}

/* The key tile index blockIdx.x stands for, heaviest first: query tile n - 1 sees the most
 * key tiles, so the grid's tail is short. */
__device__ __forceinline__ int64_t heavy_first(int64_t n_tiles) { return n_tiles - 1 - blockIdx.x; }

/* Key tile jt of a head, K and V, ready in buffer jt & 1 (the return), with tile jt + 1
 * streaming into the other buffer meanwhile when jt < last. Every thread of the block calls
 * it; the caller's loop ends in a barrier before the buffer it read is refilled. */
template <int DP>
__device__ __forceinline__ int kv_tile_ready(__nv_bfloat16 *Ks, __nv_bfloat16 *Vs, const __nv_bfloat16 *kh,
                                             const __nv_bfloat16 *vh, int64_t kst, int64_t vst, int64_t jt, int64_t last,
                                             int64_t T, int D) {
  constexpr int TILE = ftile<DP>::ELEMS;
  int buf = (int)(jt & 1);
  if (jt < last) {
    tile_async<DP>(Ks + (buf ^ 1) * TILE, kh, kst, (jt + 1) * FT, T, D);
    tile_async<DP>(Vs + (buf ^ 1) * TILE, vh, vst, (jt + 1) * FT, T, D);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
  return buf;
}

/* Forward, one block per (query tile, b, h): S = Q K^T over the key tiles at or before the
 * diagonal (K/V double-buffered through cp.async), online softmax in the exp2 domain on the
 * registers of S, O += P V, out = O / l, lse = (m + log2 l) ln 2. */
template <int DP>
__global__ void __launch_bounds__(F_THREADS) attn_fwd_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, at_view qv, at_view kv, at_view vv,
    __nv_bfloat16 *out, at_view ov, float *lse, int H, int G, int64_t T, int D, float scale_log2) {
  constexpr int TILE = ftile<DP>::ELEMS;
  extern __shared__ __align__(128) char smem[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Ks = Qs + TILE, *Vs = Ks + 2 * TILE;
  int bh = blockIdx.y, b = bh / H, h = bh % H, w = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  int64_t it = heavy_first((T + FT - 1) / FT), i0 = it * FT;
  const __nv_bfloat16 *kh = k + b * kv.sb + (h / G) * kv.sh, *vh = v + b * vv.sb + (h / G) * vv.sh;
  tile_async<DP>(Qs, q + b * qv.sb + h * qv.sh, qv.st, i0, T, D);
  tile_async<DP>(Ks, kh, kv.st, 0, T, D);
  tile_async<DP>(Vs, vh, vv.st, 0, T, D);
  cp_async_commit();
  float o[DP / 8][4], m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < DP / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  for (int64_t jt = 0; jt <= it; jt++) {
    int buf = kv_tile_ready<DP>(Ks, Vs, kh, vh, kv.st, vv.st, jt, it, T, D);
    float s[FT / 8][4];
    mm_rows_t<DP, FT / 8>(s, Qs, 16 * w, Ks + buf * TILE, 0);
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int64_t row = i0 + 16 * w + g + 8 * r;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < FT / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          int64_t col = jt * FT + 8 * n + 2 * t + e;
          float x = (jt == it && col > row) ? -INFINITY : s[n][2 * r + e] * scale_log2;
          s[n][2 * r + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float mnew = fmaxf(m[r], mx), alpha = exp2f(m[r] - mnew);   /* mx is finite: column 0 of a tile is <= every row */
      m[r] = mnew;
      lsum[r] *= alpha;
#pragma unroll
      for (int n = 0; n < FT / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float p = exp2f(s[n][2 * r + e] - mnew);
          s[n][2 * r + e] = p;
          lsum[r] += p;
        }
#pragma unroll
      for (int n = 0; n < DP / 8; n++) { o[n][2 * r] *= alpha; o[n][2 * r + 1] *= alpha; }
    }
    mm_acc_p<DP, FT / 8>(o, s, Vs + buf * TILE, 0);
    __syncthreads();   /* every warp is done with this buffer before the next copies refill it */
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
    inv[r] = 1.0f / lsum[r];
    int64_t row = i0 + 16 * w + g + 8 * r;
    if (t == 0 && row < T) lse[(int64_t)bh * T + row] = m[r] / SH_LOG2E + logf(lsum[r]);
  }
  /* rows g and g + 8 have their own 1/l: scale the two halves of each register quad */
#pragma unroll
  for (int n = 0; n < DP / 8; n++) { o[n][0] *= inv[0]; o[n][1] *= inv[0]; o[n][2] *= inv[1]; o[n][3] *= inv[1]; }
  store_rows<DP>(out + b * ov.sb + h * ov.sh, ov.st, i0 + 16 * w, T, D, o, 1.0f);
}

/* Dq[bh, t] = sum_d dout * out (f32), the softmax backward's row term. */
template <typename T>
__global__ void attn_dq_rowdot_kernel(const T *dout, at_view dv, const T *out, at_view ov, int64_t rows, int H, int64_t Tn, int D,
                                      float *Dq) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bh = row / Tn, t = row % Tn;
  int64_t b = bh / H, h = bh % H;
  const T *dr = dout + b * dv.sb + h * dv.sh + t * dv.st, *orow = out + b * ov.sb + h * ov.sh + t * ov.st;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += to_f(dr[d]) * to_f(orow[d]);
  s = warp_sum(s);
  if (lane == 0) Dq[row] = s;
}

/* P = exp2(S scale_log2 - lse2) and dS = P (dP - Dq) of a lane's elements of 16 x 8 NT C
 * tiles, in place in s and dp; the query and key of each element (row r, column c of the
 * tiles) as query_of / key_of give them, masked where the key is past the query or the query
 * past T. */
template <int NT, typename RowFn, typename ColFn, typename LseFn, typename DqFn>
__device__ __forceinline__ void probs_and_grads(float s[NT][4], float dp[NT][4], float scale_log2, int64_t T, RowFn query_of,
                                                ColFn key_of, LseFn lse2_of, DqFn dq_of) {
  int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int rr = g + 8 * (i >> 1), cc = 8 * n + 2 * t + (i & 1);
      int64_t qi = query_of(rr, cc), kj = key_of(rr, cc);
      float p = (kj <= qi && qi < T) ? exp2f(s[n][i] * scale_log2 - lse2_of(rr, cc)) : 0.0f;
      s[n][i] = p;
      dp[n][i] = p * (dp[n][i] - dq_of(rr, cc));
    }
}

/* dq_acc[r0 + i, :D] += sum over the 64 keys of a tile of dS[rt0 + i][key] K[key, :], i < 16:
 * the queries at rows rt0.. of the query tile, which are rows r0.. of the head (dq_acc: one
 * head's f32 rows of D, from its first query); dS^T a shared [key][query] tile (the A operand
 * through the transposing load), K the shared key tile. DC output columns at a time, so that
 * the accumulator stays small beside the caller's dK and dV (at DP 128 64 columns spill, 32 do
 * not); each sum is added to global memory with atomicAdd, skipping rows at or past T and the
 * padding columns. */
template <int DP>
__device__ __forceinline__ void dq_add(float *dq_acc, int64_t r0, int64_t T, int D, const __nv_bfloat16 *dSt, int rt0,
                                       const __nv_bfloat16 *K) {
  constexpr int DC = DP > 64 ? 32 : DP, LD = ftile<DP>::LD;
#pragma unroll
  for (int c0 = 0; c0 < DP; c0 += DC) {
    float acc[DC / 8][4];
    mm_smem<FT / 16, DC / 8>(acc, [&](uint32_t *a, int kk) { frag_a_t(a, dSt, DS_LD, rt0, 16 * kk); },
                             [&](uint32_t (*b)[2], int kk, int np) { frag_b_kn(b, K, LD, 16 * kk, c0 + 16 * np); });
    c_tile_pairs<DC / 8>(acc, r0, c0, T, D, [&](int64_t row, int col, float x0, float x1) {
      atomicAdd(dq_acc + row * D + col, x0);
      atomicAdd(dq_acc + row * D + col + 1, x1);
    });
  }
}

/* Backward by key tile, one block per (key tile, b, k/v head), heaviest first: warp w owns
 * 16 keys and, over the G query heads of the group and the query tiles at or after the key
 * tile (Q, dO and their lse, Dq double-buffered), computes S^T = K Q^T and dP^T = V dO^T,
 * P^T and dS^T in registers, dV += P^T dO and dK += dS^T Q. Each dK/dV row has one writer.
 * With dq_acc (the one-pass backward) each step also leaves dS^T in shared memory, and warp w
 * adds dS K for queries 16 w.. of the step's query tile into dq_acc (dq_add). */
template <int DP, bool DQ>
__device__ __forceinline__ void attn_bwd_by_key_tile(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dov, const float *lse, const float *Dq, __nv_bfloat16 *dk, at_view dkv,
    __nv_bfloat16 *dvout, at_view dvv, float *dq_acc, int H, int G, int64_t T, int D, float scale_log2, float scale) {
  constexpr int TILE = ftile<DP>::ELEMS, QN = DP > 64 || (DQ && DP > 32) ? FT / 2 : FT;
  extern __shared__ __align__(128) char smem[];
  __nv_bfloat16 *Ks = (__nv_bfloat16 *)smem, *Vs = Ks + TILE, *Qs = Vs + TILE, *dOs = Qs + 2 * TILE;
  float *stats = (float *)(dOs + 2 * TILE);   /* [buf][lse2 | Dq][64] */
  __nv_bfloat16 *dSt = (__nv_bfloat16 *)(stats + 4 * FT);   /* one-pass: dS^T [64 keys][DS_LD] */
  int Hkv = H / G, bkv = blockIdx.y, b = bkv / Hkv, hk = bkv % Hkv, w = threadIdx.x >> 5;
  int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  int64_t n_tiles = (T + FT - 1) / FT, jt = blockIdx.x, j0 = jt * FT, per_head = n_tiles - jt;
  tile_async<DP>(Ks, k + b * kv.sb + hk * kv.sh, kv.st, j0, T, D);
  tile_async<DP>(Vs, v + b * vv.sb + hk * vv.sh, vv.st, j0, T, D);
  /* step s of the walk: query head hk G + s / per_head, query tile jt + s % per_head */
  auto issue = [&](int64_t s, int buf) {
    int64_t h = hk * G + s / per_head, i0 = (jt + s % per_head) * FT, bh = (int64_t)b * H + h;
    tile_async<DP>(Qs + buf * TILE, q + b * qv.sb + h * qv.sh, qv.st, i0, T, D);
    tile_async<DP>(dOs + buf * TILE, dout + b * dov.sb + h * dov.sh, dov.st, i0, T, D);
    for (int c = threadIdx.x; c < FT; c += blockDim.x) {
      bool in = i0 + c < T;
      stats[buf * 2 * FT + c] = in ? lse[bh * T + i0 + c] * SH_LOG2E : 0.0f;
      stats[buf * 2 * FT + FT + c] = in ? Dq[bh * T + i0 + c] : 0.0f;
    }
  };
  issue(0, 0);
  cp_async_commit();
  float dK[DP / 8][4], dV[DP / 8][4];
#pragma unroll
  for (int n = 0; n < DP / 8; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) dK[n][i] = dV[n][i] = 0.0f;
  int64_t steps = G * per_head;
  for (int64_t s = 0; s < steps; s++) {
    int buf = (int)(s & 1);
    if (s + 1 < steps) {
      issue(s + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    int64_t i0 = (jt + s % per_head) * FT, kr0 = j0 + 16 * w;
    const __nv_bfloat16 *Q = Qs + buf * TILE, *dO = dOs + buf * TILE;
    const float *lse2 = stats + buf * 2 * FT, *dq = lse2 + FT;
    /* the query tile in column blocks of QN: at DP 128 two halves, so that S^T and dP^T fit
     * in registers beside the dK and dV accumulators; in one pass at DP 64 too (166 registers,
     * 3 blocks per SM, where whole tiles took 186 and 2) */
#pragma unroll 1
    for (int q0 = 0; q0 < FT; q0 += QN) {
      float st[QN / 8][4], dpt[QN / 8][4];
      mm_rows_t<DP, QN / 8>(st, Ks, 16 * w, Q, q0);    /* S^T: rows keys, columns queries */
      mm_rows_t<DP, QN / 8>(dpt, Vs, 16 * w, dO, q0);
      probs_and_grads<QN / 8>(st, dpt, scale_log2, T, [&](int, int c) { return i0 + q0 + c; },
                              [&](int r, int) { return kr0 + r; }, [&](int, int c) { return lse2[q0 + c]; },
                              [&](int, int c) { return dq[q0 + c]; });
      mm_acc_p<DP, QN / 8>(dV, st, dO, q0);
      mm_acc_p<DP, QN / 8>(dK, dpt, Q, q0);
      if constexpr (DQ) {
#pragma unroll
        for (int n = 0; n < QN / 8; n++)
#pragma unroll
          for (int r = 0; r < 2; r++)
            *reinterpret_cast<uint32_t *>(dSt + (16 * w + g + 8 * r) * DS_LD + q0 + 8 * n + 2 * t) =
                pack_bf16(dpt[n][2 * r], dpt[n][2 * r + 1]);
      }
    }
    if constexpr (DQ) {
      __syncthreads();   /* dS^T whole: every warp's keys */
      int64_t bh = (int64_t)b * H + hk * G + s / per_head;
      dq_add<DP>(dq_acc + bh * T * D, i0 + 16 * w, T, D, dSt, 16 * w, Ks);
    }
    __syncthreads();
  }
  store_rows<DP>(dk + b * dkv.sb + hk * dkv.sh, dkv.st, j0 + 16 * w, T, D, dK, scale);
  store_rows<DP>(dvout + b * dvv.sb + hk * dvv.sh, dvv.st, j0 + 16 * w, T, D, dV, 1.0f);
}

/* The deterministic backward's dK/dV kernel: dQ is left to attn_bwd_q_kernel. */
template <int DP>
__global__ void __launch_bounds__(F_THREADS) attn_bwd_kv_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dov, const float *lse, const float *Dq, __nv_bfloat16 *dk, at_view dkv,
    __nv_bfloat16 *dvout, at_view dvv, int H, int G, int64_t T, int D, float scale_log2, float scale) {
  attn_bwd_by_key_tile<DP, false>(q, k, v, dout, qv, kv, vv, dov, lse, Dq, dk, dkv, dvout, dvv, nullptr, H, G, T, D,
                                  scale_log2, scale);
}

/* The one-pass backward: dK and dV, and dS K summed into dq_acc (zeroed before; f32
 * [B, H, T, D], unscaled) with atomics, in whatever order the key tiles' blocks run. */
template <int DP>
__global__ void __launch_bounds__(F_THREADS) attn_bwd_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dov, const float *lse, const float *Dq, __nv_bfloat16 *dk, at_view dkv,
    __nv_bfloat16 *dvout, at_view dvv, float *dq_acc, int H, int G, int64_t T, int D, float scale_log2, float scale) {
  attn_bwd_by_key_tile<DP, true>(q, k, v, dout, qv, kv, vv, dov, lse, Dq, dk, dkv, dvout, dvv, dq_acc, H, G, T, D,
                                 scale_log2, scale);
}

/* dq = dq_acc * scale into dq's [B, H, T, D] view (unit-stride d, even strides), one thread per
 * element pair: the one-pass backward's last step. */
__global__ void attn_dq_store_kernel(const float *dq_acc, __nv_bfloat16 *dq, at_view dqv, int64_t pairs, int H, int64_t T,
                                     int D, float scale) {
  int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  int64_t row = p / (D / 2), t = row % T, bh = row / T;
  int col = (int)(p % (D / 2)) * 2;
  const float *a = dq_acc + row * D + col;
  *reinterpret_cast<__nv_bfloat162 *>(dq + bh / H * dqv.sb + bh % H * dqv.sh + t * dqv.st + col) =
      __floats2bfloat162_rn(a[0] * scale, a[1] * scale);
}

/* Backward for dQ, one block per (query tile, b, h), heaviest first: warp w owns 16 queries
 * and, over the key tiles at or before the diagonal (K/V double-buffered), recomputes S and
 * dP = dO V^T, P and dS in registers, and dQ += dS K. */
template <int DP>
__global__ void __launch_bounds__(F_THREADS) attn_bwd_q_kernel(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const __nv_bfloat16 *dout, at_view qv,
    at_view kv, at_view vv, at_view dov, const float *lse, const float *Dq, __nv_bfloat16 *dq, at_view dqv, int H, int G,
    int64_t T, int D, float scale_log2, float scale) {
  constexpr int TILE = ftile<DP>::ELEMS;
  extern __shared__ __align__(128) char smem[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *dOs = Qs + TILE, *Ks = dOs + TILE, *Vs = Ks + 2 * TILE;
  int bh = blockIdx.y, b = bh / H, h = bh % H, w = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2;
  int64_t it = heavy_first((T + FT - 1) / FT), i0 = it * FT, qr0 = i0 + 16 * w;
  const __nv_bfloat16 *kh = k + b * kv.sb + (h / G) * kv.sh, *vh = v + b * vv.sb + (h / G) * vv.sh;
  tile_async<DP>(Qs, q + b * qv.sb + h * qv.sh, qv.st, i0, T, D);
  tile_async<DP>(dOs, dout + b * dov.sb + h * dov.sh, dov.st, i0, T, D);
  tile_async<DP>(Ks, kh, kv.st, 0, T, D);
  tile_async<DP>(Vs, vh, vv.st, 0, T, D);
  cp_async_commit();
  float lse2[2], dqt[2];   /* this lane's rows qr0 + g and qr0 + g + 8 */
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int64_t row = qr0 + g + 8 * r;
    lse2[r] = row < T ? lse[(int64_t)bh * T + row] * SH_LOG2E : 0.0f;
    dqt[r] = row < T ? Dq[(int64_t)bh * T + row] : 0.0f;
  }
  float dQ[DP / 8][4];
#pragma unroll
  for (int n = 0; n < DP / 8; n++) dQ[n][0] = dQ[n][1] = dQ[n][2] = dQ[n][3] = 0.0f;
  for (int64_t jt = 0; jt <= it; jt++) {
    int buf = kv_tile_ready<DP>(Ks, Vs, kh, vh, kv.st, vv.st, jt, it, T, D);
    const __nv_bfloat16 *K = Ks + buf * TILE;
    float s[FT / 8][4], dp[FT / 8][4];
    mm_rows_t<DP, FT / 8>(s, Qs, 16 * w, K, 0);
    mm_rows_t<DP, FT / 8>(dp, dOs, 16 * w, Vs + buf * TILE, 0);
    int64_t k0 = jt * FT;
    probs_and_grads<FT / 8>(s, dp, scale_log2, T, [&](int r, int) { return qr0 + r; }, [&](int, int c) { return k0 + c; },
                            [&](int r, int) { return lse2[r >= 8]; }, [&](int r, int) { return dqt[r >= 8]; });
    mm_acc_p<DP, FT / 8>(dQ, dp, K, 0);
    __syncthreads();
  }
  store_rows<DP>(dq + b * dqv.sb + h * dqv.sh, dqv.st, qr0, T, D, dQ, scale);
}

/* ---- the simple path: any float dtype, D <= 256, one warp per row, f32 math ------------------ */

/* The contiguous [B, Hkv] index of the k/v head that query head bh = (b, h) of [B, H] reads. */
__device__ __forceinline__ int64_t kv_head(int64_t bh, int H, int G) { return bh / H * (H / G) + bh % H / G; }

enum { SD = SIMPLE_MAX_D / 32 };

/* A warp's share of a row of D values: lane holds element lane + 32 u in f[u] (0 past D). */
template <typename T> __device__ __forceinline__ void warp_row_f32(float (&f)[SD], const T *r, int lane, int D) {
#pragma unroll
  for (int u = 0; u < SD; u++) { int d = lane + 32 * u; f[u] = d < D ? to_f(r[d]) : 0.0f; }
}

/* Forward: warp per query row; lane owns elements lane + 32 u of q and of the accumulator. */
template <typename T>
__global__ void attn_fwd_simple_kernel(const T *q, const T *k, const T *v, T *out, float *lse, int64_t rows, int H, int G,
                                       int64_t Tn, int D, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t bh = row / Tn, qi = row % Tn, bkv = kv_head(bh, H, G);
  const T *kh = k + bkv * Tn * D, *vh = v + bkv * Tn * D, *qr = q + row * D;
  float qf[SD], acc[SD] = {};
  warp_row_f32(qf, qr, lane, D);
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
  float qf[SD], dof[SD], acc[SD] = {};
  warp_row_f32(qf, q + row * D, lane, D);
  warp_row_f32(dof, dout + row * D, lane, D);
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
  float kf[SD], vf[SD], ak[SD] = {}, av[SD] = {};
  warp_row_f32(kf, k + row * D, lane, D);
  warp_row_f32(vf, v + row * D, lane, D);
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

/* The flash kernels read a view in place when its rows are 16-byte aligned. */
static bool tc_readable(const sh_tensor *t) {
  return t->dtype == SH_BF16 && t->stride[3] == 1 && sh_aligned16(sh_tensor_data(t)) && t->stride[0] % 8 == 0 &&
         t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0;
}

/* ... and write one in place when its element pairs are 4-byte aligned. */
static bool tc_writable(const sh_tensor *t) {
  return t->dtype == SH_BF16 && t->stride[3] == 1 && ((uintptr_t)sh_tensor_data(t) & 3) == 0 && t->stride[0] % 2 == 0 &&
         t->stride[1] % 2 == 0 && t->stride[2] % 2 == 0;
}

static bool use_tc(const sh_tensor *q) {
  int64_t D = q->shape[3];
  return q->dtype == SH_BF16 && D % 16 == 0 && D >= 16 && D <= 128;
}

/* *out = t itself when the flash kernels can read it, else a contiguous bf16 copy. */
static int tc_input(sh_tguard &g, const sh_tensor *t, const sh_tensor **out) {
  if (tc_readable(t)) { *out = t; return SH_OK; }
  SH_TRY(sh_cuda_contiguous_as(g.out(), t, SH_BF16));
  *out = g.t;
  return SH_OK;
}

/* The tensor a kernel writes output dst into: dst itself when it can, else contiguous scratch
 * of q's dtype and src's shape copied into dst after (dst NULL: not wanted, scratch all the
 * same). tc: the flash kernels, which write strided views (e.g. the heads of a fused [B, T, 3C]
 * gradient); the simple path writes contiguous tensors only. */
static int output_target(sh_tguard &g, sh_tensor *dst, const sh_tensor *src, const sh_tensor *q, bool tc, sh_tensor **out) {
  *out = dst;
  if (dst && dst->dtype == q->dtype && (tc ? tc_writable(dst) : sh_tensor_is_contiguous(dst))) return SH_OK;
  SH_TRY(sh_tensor_empty(g.out(), 4, src->shape, q->dtype, q->device));
  *out = g.t;
  return SH_OK;
}

/* The flash kernels put (b, h) on grid.y, which the device caps (65535): they are launched on
 * *per_launch whole batches at a time, with every pointer moved to the first one. */
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
static __nv_bfloat16 *bf16_at(const sh_tensor *t, int64_t b0) { return (__nv_bfloat16 *)sh_tensor_data(t) + b0 * t->stride[0]; }

/* The head size the flash kernels pad D (16..128, a multiple of 16) to. */
static int padded_d(int64_t D) { return D <= 32 ? 32 : D <= 64 ? 64 : 128; }

/* Shared memory per block, in 64-row bf16 tiles of DP + 8 columns: forward Q, 2 K, 2 V;
 * backward by key tile: K, V, 2 Q, 2 dO and two buffers of (lse, Dq) rows, and in one pass a
 * 64 x 72 bf16 dS^T tile besides; backward dQ: Q, dO, 2 K, 2 V. */
enum { FLASH_FWD, FLASH_BWD, FLASH_BWD_KV, FLASH_BWD_Q };
static size_t flash_smem(int DP, int kernel) {
  size_t tile = (size_t)FT * (DP + 8) * sizeof(__nv_bfloat16), by_key = 6 * tile + 4 * FT * sizeof(float);
  switch (kernel) {
    case FLASH_FWD: return 5 * tile;
    case FLASH_BWD: return by_key + (size_t)FT * DS_LD * sizeof(__nv_bfloat16);
    case FLASH_BWD_KV: return by_key;
    default: return 6 * tile;
  }
}

/* Checks that the device gives a block the kernel's shared memory, and raises its limit once. */
template <typename Kernel>
static int allow_smem(const char *op, int device, int D, Kernel *kernel, size_t bytes, std::atomic<size_t> &raised) {
  size_t optin = (size_t)sh_cuda_props(device)->sharedMemPerBlockOptin;
  if (bytes > optin)
    return sh_fail(SH_ERR_DEVICE, "%s: head size %d needs %zu bytes of shared memory; the device allows %zu", op, D, bytes, optin);
  CU_TRY(op, sh_cuda_raise_smem(kernel, bytes, raised));
  return SH_OK;
}

template <int DP>
static int flash_forward(const char *op, cudaStream_t st, const sh_tensor *Q, const sh_tensor *K, const sh_tensor *V,
                         sh_tensor *out, float *lse, int G, float scale) {
  static std::atomic<size_t> raised{0};
  int64_t B = Q->shape[0], H = Q->shape[1], T = Q->shape[2], D = Q->shape[3], nb;
  size_t smem = flash_smem(DP, FLASH_FWD);
  SH_TRY(allow_smem(op, Q->device, (int)D, attn_fwd_kernel<DP>, smem, raised));
  SH_TRY(tc_batches(op, Q, &nb));
  for (int64_t b0 = 0; b0 < B; b0 += nb) {
    dim3 grid((unsigned)((T + FT - 1) / FT), (unsigned)(sh_min64(nb, B - b0) * H));
    attn_fwd_kernel<DP><<<grid, F_THREADS, smem, st>>>(bf16_at(Q, b0), bf16_at(K, b0), bf16_at(V, b0), view_of(Q), view_of(K),
                                                       view_of(V), bf16_at(out, b0), view_of(out), lse + b0 * H * T, (int)H, G,
                                                       T, (int)D, scale * SH_LOG2E);
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

/* The deterministic backward (sh_deterministic()): dK/dV by key tile, then dQ by query tile,
 * each gradient row with one writer; dst[3] = dq, dk, dv targets, Dq and lse contiguous
 * [B, H, T]. */
template <int DP>
static int flash_backward_two_pass(const char *op, cudaStream_t st, const sh_tensor *Q, const sh_tensor *K,
                                   const sh_tensor *V, const sh_tensor *dO, const float *lse, const float *Dq,
                                   sh_tensor *const dst[3], int G, float scale) {
  static std::atomic<size_t> raised_kv{0}, raised_q{0};
  int64_t B = Q->shape[0], H = Q->shape[1], T = Q->shape[2], D = Q->shape[3], Hkv = K->shape[1], nb;
  size_t smem_kv = flash_smem(DP, FLASH_BWD_KV), smem_q = flash_smem(DP, FLASH_BWD_Q);
  SH_TRY(allow_smem(op, Q->device, (int)D, attn_bwd_kv_kernel<DP>, smem_kv, raised_kv));
  SH_TRY(allow_smem(op, Q->device, (int)D, attn_bwd_q_kernel<DP>, smem_q, raised_q));
  SH_TRY(tc_batches(op, Q, &nb));
  unsigned tiles = (unsigned)((T + FT - 1) / FT);
  float sl2 = scale * SH_LOG2E;
  for (int64_t b0 = 0; b0 < B; b0 += nb) {
    int64_t n = sh_min64(nb, B - b0), row0 = b0 * H * T;
    attn_bwd_kv_kernel<DP><<<dim3(tiles, (unsigned)(n * Hkv)), F_THREADS, smem_kv, st>>>(
        bf16_at(Q, b0), bf16_at(K, b0), bf16_at(V, b0), bf16_at(dO, b0), view_of(Q), view_of(K), view_of(V), view_of(dO),
        lse + row0, Dq + row0, bf16_at(dst[1], b0), view_of(dst[1]), bf16_at(dst[2], b0), view_of(dst[2]), (int)H, G, T,
        (int)D, sl2, scale);
    CU_LAUNCHED(op);
    attn_bwd_q_kernel<DP><<<dim3(tiles, (unsigned)(n * H)), F_THREADS, smem_q, st>>>(
        bf16_at(Q, b0), bf16_at(K, b0), bf16_at(V, b0), bf16_at(dO, b0), view_of(Q), view_of(K), view_of(V), view_of(dO),
        lse + row0, Dq + row0, bf16_at(dst[0], b0), view_of(dst[0]), (int)H, G, T, (int)D, sl2, scale);
    CU_LAUNCHED(op);
  }
  return SH_OK;
}

/* The one-pass backward: dq_acc (f32 [B, H, T, D]) zeroed, attn_bwd_kernel per key tile (dK,
 * dV, and dS K into dq_acc by atomicAdd), then dq_acc scaled into dq's dtype and strides. */
template <int DP>
static int flash_backward_one_pass(const char *op, cudaStream_t st, const sh_tensor *Q, const sh_tensor *K,
                                   const sh_tensor *V, const sh_tensor *dO, const float *lse, const float *Dq,
                                   sh_tensor *const dst[3], int G, float scale) {
  static std::atomic<size_t> raised{0};
  int64_t B = Q->shape[0], H = Q->shape[1], T = Q->shape[2], D = Q->shape[3], Hkv = K->shape[1], nb;
  int64_t n_acc = B * H * T * D, pairs = n_acc / 2;
  size_t smem = flash_smem(DP, FLASH_BWD);
  SH_TRY(allow_smem(op, Q->device, (int)D, attn_bwd_kernel<DP>, smem, raised));
  SH_TRY(tc_batches(op, Q, &nb));
  sh_tguard acc;
  SH_TRY(sh_tensor_empty(acc.out(), 1, &n_acc, SH_F32, Q->device));
  float *dq_acc = (float *)sh_tensor_data(acc.t);
  CU_TRY(op, cudaMemsetAsync(dq_acc, 0, (size_t)n_acc * sizeof(float), st));
  unsigned tiles = (unsigned)((T + FT - 1) / FT);
  for (int64_t b0 = 0; b0 < B; b0 += nb) {
    int64_t n = sh_min64(nb, B - b0), row0 = b0 * H * T;
    attn_bwd_kernel<DP><<<dim3(tiles, (unsigned)(n * Hkv)), F_THREADS, smem, st>>>(
        bf16_at(Q, b0), bf16_at(K, b0), bf16_at(V, b0), bf16_at(dO, b0), view_of(Q), view_of(K), view_of(V), view_of(dO),
        lse + row0, Dq + row0, bf16_at(dst[1], b0), view_of(dst[1]), bf16_at(dst[2], b0), view_of(dst[2]), dq_acc + row0 * D,
        (int)H, G, T, (int)D, scale * SH_LOG2E, scale);
    CU_LAUNCHED(op);
  }
  attn_dq_store_kernel<<<(unsigned)((pairs + 255) / 256), 256, 0, st>>>(dq_acc, bf16_at(dst[0], 0), view_of(dst[0]), pairs,
                                                                         (int)H, T, (int)D, scale);
  CU_LAUNCHED(op);
  return SH_OK;
}

template <int DP>
static int flash_backward(const char *op, cudaStream_t st, const sh_tensor *Q, const sh_tensor *K, const sh_tensor *V,
                          const sh_tensor *dO, const float *lse, const float *Dq, sh_tensor *const dst[3], int G, float scale) {
  return sh_deterministic() ? flash_backward_two_pass<DP>(op, st, Q, K, V, dO, lse, Dq, dst, G, scale)
                            : flash_backward_one_pass<DP>(op, st, Q, K, V, dO, lse, Dq, dst, G, scale);
}

/* Kernels get the front's outputs and the scale it resolved (> 0). */
extern "C" int sh_kcuda_attention_forward(sh_tensor *dst, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                                          double scale) {
  const char *op = "attention";
  int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3], rows = B * H * T;
  int G = (int)(H / k->shape[1]);
  float sc = (float)scale;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, q->device, &st));
  if (rows == 0) return SH_OK;
  bool tc = use_tc(q);
  sh_tguard qc, kc, vc, oc;
  sh_tensor *out;
  SH_TRY(output_target(oc, dst, q, q, tc, &out));
  float *L = (float *)sh_tensor_data(lse);
  if (tc) {
    const sh_tensor *Q, *K, *V;
    SH_TRY(tc_input(qc, q, &Q));
    SH_TRY(tc_input(kc, k, &K));
    SH_TRY(tc_input(vc, v, &V));
    switch (padded_d(D)) {
      case 32: SH_TRY(flash_forward<32>(op, st, Q, K, V, out, L, G, sc)); break;
      case 64: SH_TRY(flash_forward<64>(op, st, Q, K, V, out, L, G, sc)); break;
      default: SH_TRY(flash_forward<128>(op, st, Q, K, V, out, L, G, sc)); break;
    }
  } else {
    SH_TRY(simple_fits(op, D));
    SH_TRY(sh_cuda_contiguous_as(qc.out(), q, q->dtype));
    SH_TRY(sh_cuda_contiguous_as(kc.out(), k, q->dtype));
    SH_TRY(sh_cuda_contiguous_as(vc.out(), v, q->dtype));
    unsigned blocks = (unsigned)((rows + 7) / 8);
    SH_DISPATCH_FLOAT(q->dtype, Tt, op, {
      attn_fwd_simple_kernel<Tt><<<blocks, 256, 0, st>>>((const Tt *)sh_tensor_data(qc.t), (const Tt *)sh_tensor_data(kc.t),
                                                         (const Tt *)sh_tensor_data(vc.t), (Tt *)sh_tensor_data(out), L, rows,
                                                         (int)H, G, T, (int)D, sc);
    });
    CU_LAUNCHED(op);
  }
  return out == dst ? SH_OK : sh_kernel_copy_(dst, out);
}

extern "C" int sh_kcuda_attention_backward(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout, const sh_tensor *q,
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
  for (int i = 0; i < 3; i++) SH_TRY(output_target(gs[i], dst[i], src[i], q, tc, &Gr[i]));
  const sh_tensor *Q, *K, *V, *dO, *O;
  if (tc) {
    SH_TRY(tc_input(qc, q, &Q));
    SH_TRY(tc_input(kc, k, &K));
    SH_TRY(tc_input(vc, v, &V));
    SH_TRY(tc_input(doc, dout, &dO));
    SH_TRY(tc_input(oc, out, &O));
  } else {
    SH_TRY(sh_cuda_contiguous_as(qc.out(), q, dt)); Q = qc.t;
    SH_TRY(sh_cuda_contiguous_as(kc.out(), k, dt)); K = kc.t;
    SH_TRY(sh_cuda_contiguous_as(vc.out(), v, dt)); V = vc.t;
    SH_TRY(sh_cuda_contiguous_as(doc.out(), dout, dt)); dO = doc.t;
    SH_TRY(sh_cuda_contiguous_as(oc.out(), out, dt)); O = oc.t;
  }
  SH_TRY(sh_cuda_contiguous_as(lc.out(), lse, SH_F32));
  SH_TRY(sh_tensor_empty(dqrow.out(), 1, &rows, SH_F32, q->device));
  float *Dq = (float *)sh_tensor_data(dqrow.t);
  const float *L = (const float *)sh_tensor_data(lc.t);
  SH_DISPATCH_FLOAT(dt, Tt, op, {
    attn_dq_rowdot_kernel<Tt><<<dim3((unsigned)((rows + 7) / 8), 1), 256, 0, st>>>(
        (const Tt *)sh_tensor_data(dO), view_of(dO), (const Tt *)sh_tensor_data(O), view_of(O), rows, (int)H, T, (int)D, Dq);
  });
  CU_LAUNCHED(op);
  if (tc) {
    switch (padded_d(D)) {
      case 32: SH_TRY(flash_backward<32>(op, st, Q, K, V, dO, L, Dq, Gr, G, sc)); break;
      case 64: SH_TRY(flash_backward<64>(op, st, Q, K, V, dO, L, Dq, Gr, G, sc)); break;
      default: SH_TRY(flash_backward<128>(op, st, Q, K, V, dO, L, Dq, Gr, G, sc)); break;
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
    if (dst[i] && dst[i] != Gr[i]) SH_TRY(sh_kernel_copy_(dst[i], Gr[i]));
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

extern "C" int sh_kcuda_rope(sh_tensor *y, const sh_tensor *x, double theta, int inverse) {
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
