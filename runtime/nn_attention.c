/* nn_attention.c: causal scaled-dot-product attention on the CPU, flash-attention style.
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
 * q, k, v, out and dout may be strided views (e.g. heads split out of a fused qkv
 * projection) as long as their last dim is unit-stride; anything else is copied once.
 * Inner loops run over keys (the transposed key/value block) or over the head dim, both
 * unit-stride, so they vectorize for D = 32..128 without small-sgemm call overhead. */
#include <math.h>
#include <stdlib.h>
#include "nn_internal.h"
#include "nn.h"

enum { BQ = 64, BK = 64 };

/* [B, H, T, D] with a unit last stride: row (b, h, t) starts at p + b s0 + h s1 + t s2. */
typedef struct view4 { float *p; int64_t s0, s1, s2; } view4;

static view4 view_of(const sh_tensor *t) {
  return (view4){sh_nn_ptr(t), t->stride[0], t->stride[1], t->stride[2]};
}

static inline float *row_at(const view4 *v, int64_t b, int64_t h, int64_t t) {
  return v->p + b * v->s0 + h * v->s1 + t * v->s2;
}

typedef struct attn_args {
  int64_t B, H, T, D;
  float scale;
  view4 q, k, v, out, dout, dq, dk, dv;
  float *lse;      /* [B, H, T] contiguous */
  int failed;      /* set by a thread whose scratch allocation failed */
} attn_args;

/* kt[d * BK + jj] = k row (j0 + jj), element d: the key block transposed, so that the
 * scores of one query against the block are BK-wide axpys over d. */
static inline void transpose_block(float *kt, const attn_args *a, const view4 *k, int64_t b, int64_t h,
                                   int64_t j0, int64_t nk) {
  for (int64_t jj = 0; jj < nk; jj++) {
    const float *kr = row_at(k, b, h, j0 + jj);
    for (int64_t d = 0; d < a->D; d++) kt[d * BK + jj] = kr[d];
  }
}

/* s[0:nk] = sum_d x[d] kt[d, 0:nk] */
static inline void row_scores(float *restrict s, const float *restrict x, const float *restrict kt,
                              int64_t D, int64_t nk) {
  for (int64_t jj = 0; jj < nk; jj++) s[jj] = 0.0f;
  for (int64_t d = 0; d < D; d++) {
    float xd = x[d];
    const float *kd = kt + d * BK;
#pragma omp simd
    for (int64_t jj = 0; jj < nk; jj++) s[jj] += xd * kd[jj];
  }
}

static void set_failed(attn_args *a) {
#pragma omp atomic write
  a->failed = 1;
}

/* Tasks are (b, h, query block), numbered with the query block fastest. */
SH_NN_SIMD static void attn_fwd_range(const void *arg, int64_t t0, int64_t t1) {
  attn_args *a = (attn_args *)arg;
  int64_t D = a->D, T = a->T, nqb = (T + BQ - 1) / BQ;
  float *scratch = malloc(sizeof(float) * (size_t)(D * BK + BK + BQ * D + 2 * BQ) + 64);
  if (!scratch) { set_failed(a); return; }
  float *kt = scratch, *s = kt + D * BK, *acc = s + BK, *m = acc + BQ * D, *l = m + BQ;
  for (int64_t task = t0; task < t1; task++) {
    int64_t bh = task / nqb, b = bh / a->H, h = bh % a->H;
    int64_t i0 = (task % nqb) * BQ, i1 = i0 + BQ < T ? i0 + BQ : T, nq = i1 - i0;
    for (int64_t x = 0; x < nq * D; x++) acc[x] = 0.0f;
    for (int64_t ii = 0; ii < nq; ii++) { m[ii] = -INFINITY; l[ii] = 0.0f; }
    for (int64_t j0 = 0; j0 < i1; j0 += BK) {
      int64_t nk = j0 + BK < i1 ? BK : i1 - j0;
      transpose_block(kt, a, &a->k, b, h, j0, nk);
      for (int64_t ii = 0; ii < nq; ii++) {
        int64_t i = i0 + ii, nvis = i + 1 - j0 < nk ? i + 1 - j0 : nk;   /* causal */
        if (nvis <= 0) continue;
        row_scores(s, row_at(&a->q, b, h, i), kt, D, nvis);
        float mx = m[ii];
        for (int64_t jj = 0; jj < nvis; jj++) {
          s[jj] *= a->scale;
          mx = s[jj] > mx ? s[jj] : mx;
        }
        float alpha = sh_expf(m[ii] - mx), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t jj = 0; jj < nvis; jj++) { s[jj] = sh_expf(s[jj] - mx); sum += s[jj]; }
        l[ii] = l[ii] * alpha + sum;
        m[ii] = mx;
        float *ar = acc + ii * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) ar[d] *= alpha;
        for (int64_t jj = 0; jj < nvis; jj++) {
          const float *vr = row_at(&a->v, b, h, j0 + jj);
          float p = s[jj];
#pragma omp simd
          for (int64_t d = 0; d < D; d++) ar[d] += p * vr[d];
        }
      }
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

/* Tasks are (b, h). dq, dk, dv are contiguous and zeroed by the caller. */
SH_NN_SIMD static void attn_bwd_range(const void *arg, int64_t t0, int64_t t1) {
  attn_args *a = (attn_args *)arg;
  int64_t D = a->D, T = a->T;
  float *scratch = malloc(sizeof(float) * (size_t)(2 * D * BK + 3 * BK + T) + 64);
  if (!scratch) { set_failed(a); return; }
  float *kt = scratch, *vt = kt + D * BK, *p = vt + D * BK, *dp = p + BK, *ds = dp + BK, *Di = ds + BK;
  for (int64_t bh = t0; bh < t1; bh++) {
    int64_t b = bh / a->H, h = bh % a->H;
    const float *lse = a->lse + bh * T;
    for (int64_t i = 0; i < T; i++) {
      const float *o = row_at(&a->out, b, h, i), *go = row_at(&a->dout, b, h, i);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D; d++) sum += o[d] * go[d];
      Di[i] = sum;
    }
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
      int64_t nk = j0 + BK < T ? BK : T - j0;
      transpose_block(kt, a, &a->k, b, h, j0, nk);
      transpose_block(vt, a, &a->v, b, h, j0, nk);
      for (int64_t i = j0; i < T; i++) {       /* queries before j0 see none of this block */
        int64_t nvis = i + 1 - j0 < nk ? i + 1 - j0 : nk;
        const float *qi = row_at(&a->q, b, h, i), *goi = row_at(&a->dout, b, h, i);
        row_scores(p, qi, kt, D, nvis);
        row_scores(dp, goi, vt, D, nvis);
        float li = lse[i], dii = Di[i];
#pragma omp simd
        for (int64_t jj = 0; jj < nvis; jj++) {
          p[jj] = sh_expf(p[jj] * a->scale - li);
          ds[jj] = p[jj] * (dp[jj] - dii) * a->scale;
        }
        float *dqi = row_at(&a->dq, b, h, i);
        for (int64_t jj = 0; jj < nvis; jj++) {
          float *dvj = row_at(&a->dv, b, h, j0 + jj), *dkj = row_at(&a->dk, b, h, j0 + jj);
          const float *kj = row_at(&a->k, b, h, j0 + jj);
          float pj = p[jj], dsj = ds[jj];
#pragma omp simd
          for (int64_t d = 0; d < D; d++) {
            dvj[d] += pj * goi[d];
            dkj[d] += dsj * qi[d];
            dqi[d] += dsj * kj[d];
          }
        }
      }
    }
  }
  free(scratch);
}

/* Checks q, k, v [B, H, T, D] of one shape and stages them (unit last stride, f32). */
static int stage_qkv(sh_tensor **st, attn_args *a, const char *op, const sh_tensor *q,
                     const sh_tensor *k, const sh_tensor *v, double scale) {
  SH_TRY(sh_nn_check_float(q, op, "q"));
  SH_TRY(sh_nn_check_float(k, op, "k"));
  SH_TRY(sh_nn_check_float(v, op, "v"));
  if (q->ndim != 4) return sh_fail(SH_ERR_ARG, "%s: q must be [B, H, T, D], got %s", op, sh_desc(q));
  SH_TRY(sh_nn_check_same_shape(k, q, op, "k", "q"));
  SH_TRY(sh_nn_check_same_shape(v, q, op, "v", "q"));
  if (!(scale == scale)) return sh_fail(SH_ERR_ARG, "%s: scale is NaN", op);
  a->B = q->shape[0]; a->H = q->shape[1]; a->T = q->shape[2]; a->D = q->shape[3];
  a->scale = (float)(scale > 0 ? scale : 1.0 / sqrt((double)(a->D > 0 ? a->D : 1)));
  SH_TRY(sh_nn_f32_rows(&st[0], q, op, "q"));
  SH_TRY(sh_nn_f32_rows(&st[1], k, op, "k"));
  SH_TRY(sh_nn_f32_rows(&st[2], v, op, "v"));
  a->q = view_of(st[0]); a->k = view_of(st[1]); a->v = view_of(st[2]);
  return SH_OK;
}

static void destroy_all(sh_tensor **t, int n) {
  for (int i = 0; i < n; i++) { sh_tensor_destroy(t[i]); t[i] = NULL; }
}

int sh_attention_forward(sh_tensor **out, sh_tensor **lse, const sh_tensor *q, const sh_tensor *k,
                         const sh_tensor *v, double scale) {
  const char *op = "attention";
  *out = NULL;
  *lse = NULL;
  sh_tensor *st[3] = {0}, *o = NULL, *l = NULL;
  attn_args a = {0};
  int rc = stage_qkv(st, &a, op, q, k, v, scale);
  if (!rc) rc = sh_nn_new_f32(&o, 4, q->shape);
  if (!rc) rc = sh_nn_new_f32(&l, 3, q->shape);
  if (!rc) {
    a.out = view_of(o);
    a.lse = sh_nn_ptr(l);
    int64_t tasks = a.B * a.H * ((a.T + BQ - 1) / BQ);
    sh_nn_parallel_for(tasks, a.B * a.H * a.T * (a.T < BK ? a.T : BK) * (a.D + 1), attn_fwd_range, &a);
    if (a.failed) rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for per-thread scratch", op);
  }
  if (!rc) rc = sh_nn_finish(&o, q->dtype);
  destroy_all(st, 3);
  if (rc) { sh_tensor_destroy(o); sh_tensor_destroy(l); return rc; }
  *out = o;
  *lse = l;
  return SH_OK;
}

int sh_attention_backward(sh_tensor **dq, sh_tensor **dk, sh_tensor **dv, const sh_tensor *dout,
                          const sh_tensor *q, const sh_tensor *k, const sh_tensor *v,
                          const sh_tensor *out, const sh_tensor *lse, double scale) {
  const char *op = "attention_backward";
  if (dq) *dq = NULL;
  if (dk) *dk = NULL;
  if (dv) *dv = NULL;
  sh_tensor *st[6] = {0}, *g[3] = {0};
  attn_args a = {0};
  int rc = stage_qkv(st, &a, op, q, k, v, scale);
  if (!rc) rc = sh_nn_check_float(dout, op, "dout");
  if (!rc) rc = sh_nn_check_same_shape(dout, q, op, "dout", "q");
  if (!rc) rc = sh_nn_check_float(out, op, "out");
  if (!rc) rc = sh_nn_check_same_shape(out, q, op, "out", "q");
  if (!rc) rc = sh_nn_check_float(lse, op, "lse");
  if (!rc) rc = sh_nn_check_shape(lse, op, "lse", 3, q->shape);
  if (!rc) rc = sh_nn_f32_rows(&st[3], dout, op, "dout");
  if (!rc) rc = sh_nn_f32_rows(&st[4], out, op, "out");
  if (!rc) rc = sh_nn_f32(&st[5], lse, op, "lse");
  /* all three are computed together; the ones not asked for are dropped at the end */
  for (int i = 0; i < 3 && !rc; i++) rc = sh_nn_zeros_f32(&g[i], 4, q->shape);
  if (!rc) {
    a.dout = view_of(st[3]); a.out = view_of(st[4]); a.lse = sh_nn_ptr(st[5]);
    a.dq = view_of(g[0]); a.dk = view_of(g[1]); a.dv = view_of(g[2]);
    sh_nn_parallel_for(a.B * a.H, a.B * a.H * a.T * (a.T < BK ? a.T : BK) * (a.D + 1), attn_bwd_range, &a);
    if (a.failed) rc = sh_fail(SH_ERR_OOM, "%s: out of host memory for per-thread scratch", op);
  }
  const sh_tensor *src[3] = {q, k, v};
  sh_tensor **dst[3] = {dq, dk, dv};
  for (int i = 0; i < 3 && !rc; i++)
    if (dst[i]) rc = sh_nn_finish(&g[i], src[i]->dtype);
  destroy_all(st, 6);
  if (rc) { destroy_all(g, 3); return rc; }
  for (int i = 0; i < 3; i++) {
    if (dst[i]) *dst[i] = g[i];
    else sh_tensor_destroy(g[i]);
  }
  return SH_OK;
}
