/* attention.c: causal scaled-dot-product attention on the CPU, flash-attention style.
 *
 * Forward, per (batch, head, block of BQ queries): stream the key/value blocks of BK rows
 * that the causal mask lets the queries see, keeping for each query row a running max m,
 * a running sum l of exp(s - m) and an unnormalised output accumulator, rescaled whenever m
 * grows (the online softmax). Only one BK-wide row of scores exists at a time, so memory
 * does not grow with T^2. The row log-sum-exp lse = m + log(l) is saved for backward.
 *
 * Backward, per (batch, head): with D_i = sum_d dout_id out_id, stream the key blocks and
 * for every query row that sees them recompute p_ij = exp(s_ij - lse_i) (exactly the forward
 * probabilities), then
 *   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
 *   dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i.
 * A (batch, head) is one task, so dk/dv/dq of a head are written by one thread only.
 *
 * Grouped-query attention: k and v may have fewer heads (Hkv, dividing H) than q; query head
 * h reads key/value head h / (H / Hkv) in place (no repeated copies). Backward then runs one
 * task per (batch, key/value head) that walks the group's query heads, so a dk/dv row still
 * has one writer.
 *
 * Rotary embeddings (sh_attention_rope_*, every device): the front rotates q and k into
 * scratch with the device's rope kernel (that copy stands in for the staging copy a strided
 * head view gets anyway), runs the attention kernel on them and drops them: rotated tensors
 * are never kept for backward, which rotates them again and rotates dq and dk back (the
 * transpose of the rotation).
 *
 * q, k, v, out and dout may be strided views (e.g. heads split out of a fused qkv
 * projection) as long as their last dim is unit-stride; anything else is copied once.
 * The block products (S = Q K^T, O += P V, and the five of backward) run on the calling
 * thread of the team: through attn_blocks' kernels (AVX-512F or AVX2, the kernel set's) where
 * the head dim allows (attn_blocks_internal.h: D a multiple of 16 up to 64; they skip what the
 * causal mask hides and keep each result tile in registers), else as small sgemm calls. On the benchmark's
 * [12, 4, 64, 32] the kernels, with the row loops below cut to the visible columns, made the
 * forward and backward 27% faster at 1 thread than the sgemm calls (OpenBLAS's small-matrix
 * path), which were themselves ~5x faster than the per-row vectorized loops before them.
 * The fronts are ops/attention.c. */
#include <math.h>
#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include "attn_blocks_internal.h"
#include "blas_internal.h"
#include "staging_internal.h"
#include "core/rules_internal.h"
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

/* BK = 64 is also the row width the hsum/hmax trees below are written for. BQ = 32 splits a
 * 64-row diagonal block in two, and the first half sees only the first 32 keys: a quarter
 * less work in the products where T <= 64 (the forward and backward measured 8% and 12%
 * faster on the benchmark's [12, 4, 64, 32]). */
enum { BQ = 32, BK = 64 };

/* [B, H, T, D] with a unit last stride: row (b, h, t) starts at p + b s0 + h s1 + t s2. */
typedef struct view4 { float *p; int64_t s0, s1, s2; } view4;

static view4 view_of(const sh_tensor *t) {
  return (view4){sh_stage_ptr(t), t->stride[0], t->stride[1], t->stride[2]};
}

static inline float *row_at(const view4 *v, int64_t b, int64_t h, int64_t t) {
  return v->p + b * v->s0 + h * v->s1 + t * v->s2;
}

typedef struct attn_args {
  int64_t B, H, T, D;
  int64_t G;       /* query heads per key/value head (1 without grouped-query attention) */
  float scale;
  view4 q, k, v, out, dout, dq, dk, dv;
  float *lse;      /* [B, H, T] contiguous */
  int fast;        /* the block products through attn_blocks' kernels */
  int failed;      /* set by a thread whose scratch allocation failed */
} attn_args;

static void set_failed(attn_args *a) {
  __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
}

/* The block products: attn_blocks' kernels when a->fast (bt: the key block's rows transposed,
 * BK apart), else sgemm. s[:nq, :nk] = scale x b^T (S = Q K^T, dP = dO V^T), rows BK apart. */
static void block_scores(const attn_args *a, float *s, const float *x, int64_t ldx, const float *bt, const float *b,
                         int64_t ldb, int nq, int nk, float scale, int diag) {
  if (a->fast) sh_attn_scores(s, BK, x, ldx, bt, BK, nq, nk, (int)a->D, scale, diag);
  else sh_sgemm(CblasNoTrans, CblasTrans, nq, nk, (int)a->D, scale, x, (int)ldx, b, (int)ldb, 0.0f, s, BK);
}

/* c[:m, :D] += p b, p [m, k] with rows BK apart (O += P V, dQ += dS K), or with trans
 * c += p^T b, p [k, m] (dV += P^T dO, dK += dS^T Q). */
static void block_accumulate(const attn_args *a, float *c, int64_t ldc, const float *p, int trans, const float *b,
                             int64_t ldb, int m, int k, int diag) {
  if (a->fast) sh_attn_accumulate(c, ldc, p, BK, trans, b, ldb, m, k, (int)a->D, diag);
  else sh_sgemm(trans ? CblasTrans : CblasNoTrans, CblasNoTrans, m, (int)a->D, k, 1.0f, p, BK, b, (int)ldb, 1.0f, c,
                (int)ldc);
}

/* Causal mask of the score block of queries i0.. against keys j0..: key j is visible to
 * query i when j <= i. Returns how many leading columns of row ii can be visible. */
static inline int64_t visible(int64_t i0, int64_t ii, int64_t j0, int64_t nk) {
  int64_t v = i0 + ii + 1 - j0;
  return v < 0 ? 0 : v < nk ? v : nk;
}

/* The row work of a score block runs over W columns, nv (the visible ones) rounded up to a
 * multiple of 16 (one zmm, two ymm): one copy of each row function per W (ROW_WIDTHS
 * dispatches), so every loop has a constant trip count and is whole vectors with masks or
 * blends. Columns W .. BK are zeroed, as the block products read up to nk. */
#define ROW_WIDTHS(call) \
  switch ((nv + 15) / 16) { case 1: call(16); break; case 2: call(32); break; case 3: call(48); break; default: call(64); }

/* Sum and max of a row's W columns as a tree over 16-wide quarters (a quarter past W counts as
 * absent, which leaves the bits as if it held 0s or -infs): gcc's own finish of an
 * `omp simd reduction` is a serial chain of scalar adds that cost as much as the row. */
static inline __attribute__((always_inline)) float hsum_w(const float *x, int W) {
  float t[16];
  for (int k = 0; k < 16; k++) {
    float a = W > 16 ? x[k] + x[k + 16] : x[k];
    t[k] = W > 48 ? a + (x[k + 32] + x[k + 48]) : W > 32 ? a + x[k + 32] : a;
  }
  for (int k = 0; k < 8; k++) t[k] += t[k + 8];
  for (int k = 0; k < 4; k++) t[k] += t[k + 4];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

static inline float max2(float a, float b) { return a > b ? a : b; }

static inline __attribute__((always_inline)) float hmax_w(const float *x, int W) {
  float t[16];
  for (int k = 0; k < 16; k++) {
    float a = W > 16 ? max2(x[k], x[k + 16]) : x[k];
    t[k] = W > 48 ? max2(a, max2(x[k + 32], x[k + 48])) : W > 32 ? max2(a, x[k + 32]) : a;
  }
  for (int k = 0; k < 8; k++) t[k] = max2(t[k], t[k + 8]);
  for (int k = 0; k < 4; k++) t[k] = max2(t[k], t[k + 4]);
  return max2(max2(t[0], t[2]), max2(t[1], t[3]));
}

/* Forward: s[0 .. nv) becomes exp(s - mx) with mx = max(*m, those scores), the rest of the
 * row 0; *m = mx and *l the running sum, rescaled. Returns the rescale exp(old m - mx). */
static inline __attribute__((always_inline)) float online_softmax_row(float *s, int nv, float *m, float *l, int W) {
  float t[BK];
  for (int jj = 0; jj < W; jj++) t[jj] = jj < nv ? s[jj] : -INFINITY;
  float bm = hmax_w(t, W), mx = *m > bm ? *m : bm;
  for (int jj = 0; jj < W; jj++) s[jj] = jj < nv ? sh_expf(s[jj] - mx) : 0.0f;
  for (int jj = W; jj < BK; jj++) s[jj] = 0.0f;
  float alpha = sh_expf(*m - mx);   /* 0 on the first block: m was -inf */
  *l = *l * alpha + hsum_w(s, W);
  *m = mx;
  return alpha;
}

/* Backward: p[0 .. nv) becomes the forward's probabilities exp(p - lse), dp becomes dS
 * pre-scaled, p (dp - D_i) scale; the rest of both rows 0. */
static inline __attribute__((always_inline)) void probs_row(float *p, float *dp, int nv, float lse, float di,
                                                             float scale, int W) {
  for (int jj = 0; jj < W; jj++) {
    float pj = jj < nv ? sh_expf(p[jj] - lse) : 0.0f;
    p[jj] = pj;
    dp[jj] = jj < nv ? pj * (dp[jj] - di) * scale : 0.0f;
  }
  for (int jj = W; jj < BK; jj++) p[jj] = dp[jj] = 0.0f;
}

/* Tasks are (b, h, query block), numbered with the query block fastest. */
SH_CPU_KERNEL(attn_fwd_range, (const void *arg, int64_t t0, int64_t t1), (arg, t0, t1)) {
  attn_args *a = (attn_args *)arg;
  int64_t D = a->D, T = a->T, nqb = (T + BQ - 1) / BQ;
  float *scratch = calloc((size_t)(BQ * BK + BQ * D + 2 * BQ + D * BK) + 16, sizeof(float));
  if (!scratch) { set_failed(a); return; }
  float *S = scratch, *acc = S + BQ * BK, *m = acc + BQ * D, *l = m + BQ, *kt = l + BQ;
  int64_t kt_holds = -1;   /* the key block kt holds transposed, numbered (b H + kv head) T + j0 */
  for (int64_t task = t0; task < t1; task++) {
    int64_t bh = task / nqb, b = bh / a->H, h = bh % a->H;
    int64_t i0 = (task % nqb) * BQ, i1 = i0 + BQ < T ? i0 + BQ : T, nq = i1 - i0;
    memset(acc, 0, sizeof(float) * (size_t)(nq * D));
    for (int64_t ii = 0; ii < nq; ii++) { m[ii] = -INFINITY; l[ii] = 0.0f; }
    for (int64_t j0 = 0; j0 < i1; j0 += BK) {
      int64_t nk = j0 + BK < i1 ? BK : i1 - j0, key_block = (b * a->H + h / a->G) * T + j0;
      const float *kj = row_at(&a->k, b, h / a->G, j0);
      if (a->fast && kt_holds != key_block) {   /* the whole block: the next query block sees more of it */
        sh_attn_transpose(kt, BK, kj, a->k.s2, (int)(j0 + BK < T ? BK : T - j0), (int)D);
        kt_holds = key_block;
      }
      block_scores(a, S, row_at(&a->q, b, h, i0), a->q.s2, kt, kj, a->k.s2, (int)nq, (int)nk, a->scale,
                   (int)(i0 - j0));
      for (int64_t ii = 0; ii < nq; ii++) {
        float *s = S + ii * BK, alpha;
        int nv = (int)visible(i0, ii, j0, nk);    /* >= 1: key blocks start at or before i0 */
#define SOFTMAX_ROW(W) alpha = online_softmax_row(s, nv, &m[ii], &l[ii], W)
        ROW_WIDTHS(SOFTMAX_ROW)
#undef SOFTMAX_ROW
        float *ar = acc + ii * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) ar[d] *= alpha;
      }
      block_accumulate(a, acc, D, S, 0, row_at(&a->v, b, h / a->G, j0), a->v.s2, (int)nq, (int)nk,
                       (int)(i0 - j0));
    }
    for (int64_t ii = 0; ii < nq; ii++) {
      float *o = row_at(&a->out, b, h, i0 + ii), inv = 1.0f / l[ii];
      const float *ar = acc + ii * D;
#pragma omp simd
      for (int64_t d = 0; d < D; d++) o[d] = ar[d] * inv;
      a->lse[bh * T + i0 + ii] = m[ii] + logf(l[ii]);
    }
  }
  free(scratch);
}

/* Zeroes the T rows (b, h, 0..T-1) of a gradient view. */
static void zero_rows(const view4 *g, int64_t b, int64_t h, int64_t T, int64_t D) {
  for (int64_t t = 0; t < T; t++) memset(row_at(g, b, h, t), 0, sizeof(float) * (size_t)D);
}

/* Tasks are (b, key/value head), each walking its G query heads: key blocks outside, query
 * blocks inside, so dk/dv of a key block are finished before the next. dq, dk, dv may be
 * strided (rows of a fused dqkv). A task zeroes the
 * gradient rows it sums into (its dk, dv and its query heads' dq): in parallel, and warm in
 * cache for the products that follow. */
SH_CPU_KERNEL(attn_bwd_range, (const void *arg, int64_t t0, int64_t t1), (arg, t0, t1)) {
  attn_args *a = (attn_args *)arg;
  int64_t D = a->D, T = a->T, Hkv = a->H / a->G;
  float *scratch = calloc((size_t)(2 * BQ * BK + T + 2 * D * BK) + 16, sizeof(float));
  if (!scratch) { set_failed(a); return; }
  float *P = scratch, *dP = P + BQ * BK, *Di = dP + BQ * BK, *kt = Di + T, *vt = kt + D * BK;
  int64_t kv_holds = -1;   /* the key block kt and vt hold transposed: task T + j0 (a group's query heads share it) */
  for (int64_t it = t0 * a->G; it < t1 * a->G; it++) {   /* (task, query head of its group) */
    int64_t task = it / a->G, b = task / Hkv, hk = task % Hkv, h = hk * a->G + it % a->G, bh = b * a->H + h;
    const float *lse = a->lse + bh * T;
    if (it % a->G == 0) { zero_rows(&a->dk, b, hk, T, D); zero_rows(&a->dv, b, hk, T, D); }
    zero_rows(&a->dq, b, h, T, D);
    for (int64_t i = 0; i < T; i++) {
      const float *o = row_at(&a->out, b, h, i), *go = row_at(&a->dout, b, h, i);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D; d++) sum += o[d] * go[d];
      Di[i] = sum;
    }
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
      int64_t nk_block = j0 + BK < T ? BK : T - j0;
      const float *kj = row_at(&a->k, b, hk, j0), *vj = row_at(&a->v, b, hk, j0);
      float *dkj = row_at(&a->dk, b, hk, j0), *dvj = row_at(&a->dv, b, hk, j0);
      if (a->fast && kv_holds != task * T + j0) {
        sh_attn_transpose(kt, BK, kj, a->k.s2, (int)nk_block, (int)D);
        sh_attn_transpose(vt, BK, vj, a->v.s2, (int)nk_block, (int)D);
        kv_holds = task * T + j0;
      }
      for (int64_t i0 = j0 / BQ * BQ; i0 < T; i0 += BQ) {    /* earlier queries see none of it */
        int64_t nq = i0 + BQ < T ? BQ : T - i0;
        int64_t nk = i0 + nq - j0 < nk_block ? i0 + nq - j0 : nk_block;   /* keys these queries see */
        const float *qi = row_at(&a->q, b, h, i0), *goi = row_at(&a->dout, b, h, i0);
        int diag = (int)(i0 - j0);
        block_scores(a, P, qi, a->q.s2, kt, kj, a->k.s2, (int)nq, (int)nk, a->scale, diag);
        block_scores(a, dP, goi, a->dout.s2, vt, vj, a->v.s2, (int)nq, (int)nk, 1.0f, diag);
        for (int64_t ii = 0; ii < nq; ii++) {
          float *p = P + ii * BK, *dp = dP + ii * BK, li = lse[i0 + ii], dii = Di[i0 + ii];
          int nv = (int)visible(i0, ii, j0, nk);
#define PROBS_ROW(W) probs_row(p, dp, nv, li, dii, a->scale, W)
          ROW_WIDTHS(PROBS_ROW)
#undef PROBS_ROW
        }
        block_accumulate(a, dvj, a->dv.s2, P, 1, goi, a->dout.s2, (int)nk, (int)nq, diag);
        block_accumulate(a, row_at(&a->dq, b, h, i0), a->dq.s2, dP, 0, kj, a->k.s2, (int)nq, (int)nk, diag);
        block_accumulate(a, dkj, a->dk.s2, dP, 1, qi, a->q.s2, (int)nk, (int)nq, diag);
      }
    }
  }
  free(scratch);
}

/* A [B, H, T, D] operand as f32 rows that sgemm can read with leading dim stride[2]:
 * kept as a view when its rows are unit-stride and do not overlap, else copied. */
static int stage_rows(sh_tensor **out, const sh_tensor *t, const char *op, const char *name) {
  SH_TRY(sh_stage_f32_rows(out, t, op, name));
  if ((*out)->stride[2] >= t->shape[3] && (*out)->stride[2] < INT32_MAX) return SH_OK;
  sh_tensor *c = NULL;
  int rc = sh_kernel_contiguous_as(&c, *out, (*out)->dtype);
  sh_tensor_destroy(*out);
  *out = c;
  return rc;
}

/* Stages q, k, v (unit last stride, f32) into st[0..2] and sets a's sizes and scale. */
static int stage_qkv(sh_tensor **st, attn_args *a, const char *op, const sh_tensor *q,
                     const sh_tensor *k, const sh_tensor *v, double scale) {
  a->B = q->shape[0]; a->H = q->shape[1]; a->T = q->shape[2]; a->D = q->shape[3];
  a->G = q->shape[1] / k->shape[1];
  a->scale = (float)scale;
  a->fast = sh_attn_blocks_wanted(a->D);
  SH_TRY(stage_rows(&st[0], q, op, "q"));
  SH_TRY(stage_rows(&st[1], k, op, "k"));
  SH_TRY(stage_rows(&st[2], v, op, "v"));
  a->q = view_of(st[0]); a->k = view_of(st[1]); a->v = view_of(st[2]);
  return SH_OK;
}

/* Work (in multiply-adds, roughly) of B*H*T queries against at most BK keys each. */
static int64_t attn_work(const attn_args *a) {
  return a->B * a->H * a->T * (a->T < BK ? a->T : BK) * (a->D + 1);
}

int sh_kcpu_attention_forward(sh_tensor *out, sh_tensor *lse, const sh_tensor *q, const sh_tensor *k,
                              const sh_tensor *v, double scale) {
  const char *op = "attention";
  sh_tensor *st[3] = {0};
  sh_stage_accum o = {0};
  attn_args a = {0};
  int rc = stage_qkv(st, &a, op, q, k, v, scale);
  if (!rc) rc = sh_stage_out_rows_begin(&o, out);
  if (!rc) {
    a.out = view_of(o.buf);
    a.lse = sh_stage_ptr(lse);   /* the front's f32 [B, H, T] */
    sh_stage_parallel_for(a.B * a.H * ((a.T + BQ - 1) / BQ), attn_work(&a), attn_fwd_range, &a);
    if (a.failed) rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for per-thread scratch", op);
  }
  if (!rc) rc = sh_stage_accum_end(&o);
  sh_stage_accum_drop(&o);
  sh_tensors_destroy(st, 3);
  return rc;
}

/* The f32 rows a gradient is summed into (zeroed by the kernel's tasks): dst itself when
 * it is f32 with rows the kernel can write (a strided head view of a fused dqkv included),
 * else scratch that sh_stage_accum_end writes into dst; scratch only when dst is NULL (all
 * three gradients are computed together). */
static int grad_begin(sh_stage_accum *g, sh_tensor *dst, const int64_t *shape) {
  return dst ? sh_stage_out_rows_begin(g, dst) : sh_stage_new_f32(&g->buf, 4, shape);
}

int sh_kcpu_attention_backward(sh_tensor *dq, sh_tensor *dk, sh_tensor *dv, const sh_tensor *dout,
                               const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                               const sh_tensor *out, const sh_tensor *lse, double scale) {
  const char *op = "attention_backward";
  sh_tensor *st[6] = {0}, *dst[3] = {dq, dk, dv};
  sh_stage_accum g[3] = {{0}};
  attn_args a = {0};
  int rc = stage_qkv(st, &a, op, q, k, v, scale);
  if (!rc) rc = stage_rows(&st[3], dout, op, "dout");
  if (!rc) rc = stage_rows(&st[4], out, op, "out");
  if (!rc) rc = sh_stage_f32(&st[5], lse, op, "lse");
  for (int i = 0; i < 3 && !rc; i++) rc = grad_begin(&g[i], dst[i], i ? k->shape : q->shape);
  if (!rc) {
    a.dout = view_of(st[3]); a.out = view_of(st[4]); a.lse = sh_stage_ptr(st[5]);
    a.dq = view_of(g[0].buf); a.dk = view_of(g[1].buf); a.dv = view_of(g[2].buf);
    sh_stage_parallel_for(a.B * (a.H / a.G), attn_work(&a), attn_bwd_range, &a);
    if (a.failed) rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for per-thread scratch", op);
  }
  for (int i = 0; i < 3 && !rc; i++)
    if (dst[i]) rc = sh_stage_accum_end(&g[i]);
  for (int i = 0; i < 3; i++) sh_stage_accum_drop(&g[i]);
  sh_tensors_destroy(st, 6);
  return rc;
}

/* ---- rotary embeddings ----------------------------------------------------------------------- */

typedef struct rope_args {
  view4 x;
  float *y;                   /* contiguous [B, H, T, D] */
  const float *cos, *sin;     /* [T, D/2] */
  int64_t H, T, D;
  float sign;                 /* +1 rotates by the angle, -1 back (the transpose) */
} rope_args;

/* Rows (b, h, t) of the rotation, Hugging Face's rotate_half pairing: element i with i + D/2. */
SH_CPU_KERNEL(rope_range, (const void *arg, int64_t r0, int64_t r1), (arg, r0, r1)) {
  const rope_args *a = (const rope_args *)arg;
  int64_t half = a->D / 2;
  for (int64_t row = r0; row < r1; row++) {
    int64_t t = row % a->T, h = (row / a->T) % a->H, b = row / (a->T * a->H);
    const float *x = row_at(&a->x, b, h, t), *c = a->cos + t * half, *s = a->sin + t * half;
    float *y = a->y + row * a->D;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
      float x1 = x[i], x2 = x[i + half], sn = a->sign * s[i];
      y[i] = x1 * c[i] - x2 * sn;
      y[i + half] = x2 * c[i] + x1 * sn;
    }
  }
}

/* y = x rotated (inverse: rotated back) at positions 0..T-1; y is the front's output. The
 * angles t * theta^(-2i/D) are computed in double, once per (t, i). */
int sh_kcpu_rope(sh_tensor *y, const sh_tensor *x, double theta, int inverse) {
  const char *op = inverse ? "rope_backward" : "rope";
  int64_t T = x->shape[2], D = x->shape[3], half = D / 2;
  float *cs = malloc(sizeof(float) * (size_t)(2 * T * half + 1));
  if (!cs) return sh_fail(SH_ERR_OOM, "%s: out of host memory for the [%lld, %lld] angle table", op,
                          (long long)T, (long long)half);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double ang = (double)t * pow(theta, -2.0 * (double)i / (double)D);
      cs[t * half + i] = (float)cos(ang);
      cs[T * half + t * half + i] = (float)sin(ang);
    }
  sh_tensor *xs = NULL;
  sh_stage_accum o = {0};
  int rc = sh_stage_f32_rows(&xs, x, op, "x");
  if (!rc) rc = sh_stage_out_begin(&o, y);
  if (!rc) {
    rope_args a = {view_of(xs), sh_stage_ptr(o.buf), cs, cs + T * half, x->shape[1], T, D, inverse ? -1.0f : 1.0f};
    int64_t rows = sh_tensor_rows(x);
    sh_stage_parallel_for(rows, rows * D * 4, rope_range, &a);
    rc = sh_stage_accum_end(&o);
  }
  sh_stage_accum_drop(&o);
  sh_tensor_destroy(xs);
  free(cs);
  return rc;
}
