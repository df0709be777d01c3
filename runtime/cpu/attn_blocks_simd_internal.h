/* attn_blocks_simd_internal.h: attention's block products (attn_blocks_internal.h) at
 * SH_SIMD_W lanes, built per width by attn_blocks.c (simd_internal.h), which defines for each
 * TILE_ROWS(V), the rows of a tile V vectors wide (at most MAX_V).
 *
 * Both kernels keep a tile of R result rows by V vectors in accumulators and walk the
 * reduction one step at a time: a step loads the V vectors of one row of the right operand and
 * broadcasts the R elements of the left one that meet it. A tail tile of fewer than R rows
 * repeats its last row (the loads stay inside the operand) and stores only its own rows. Each
 * result element is its products summed in order, one FMA after another from 0, whatever the
 * width and the tile, so the two widths give the same bits. */

SH_V_TARGET static void SH_W_NAME(transpose)(float *bt, int ldbt, const float *b, int64_t ldb, int n, int D) {
  for (int j0 = 0; j0 < n; j0 += SH_SIMD_W)
    for (int d0 = 0; d0 < D; d0 += SH_SIMD_W) {
      SH_VI in[SH_SIMD_W], out[SH_SIMD_W];
#pragma GCC unroll 16
      for (int r = 0; r < SH_SIMD_W; r++)
        in[r] = j0 + r < n ? SH_V(loadu_i32)(b + (j0 + r) * ldb + d0) : SH_V(zero_i32)();
      SH_V(transpose)(in, out);
#pragma GCC unroll 16
      for (int e = 0; e < SH_SIMD_W; e++) SH_V(storeu_i32)(bt + (size_t)(d0 + e) * ldbt + j0, out[e]);
    }
}

/* Rows 0 .. rows (rows <= R) of s = scale a bt over D, V vectors of columns. */
SH_V_TARGET static inline __attribute__((always_inline)) void SH_W_NAME(scores_tile)(
    float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int rows, int D, float scale,
    int R, int V) {
  const float *ar[8];
  SH_VF acc[8][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    ar[r] = a + (r < rows ? r : rows - 1) * lda;
#pragma GCC unroll 4
    for (int z = 0; z < V; z++) acc[r][z] = SH_V(zero)();
  }
  for (int d = 0; d < D; d++) {
    SH_VF b[4];
#pragma GCC unroll 4
    for (int z = 0; z < V; z++) b[z] = SH_V(loadu)(bt + (size_t)d * ldbt + SH_SIMD_W * z);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      SH_VF av = SH_V(set1)(ar[r][d]);
#pragma GCC unroll 4
      for (int z = 0; z < V; z++) acc[r][z] = SH_V(fmadd)(av, b[z], acc[r][z]);
    }
  }
  SH_VF vs = SH_V(set1)(scale);
  for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
    for (int z = 0; z < V; z++) SH_V(storeu)(s + (size_t)r * lds + SH_SIMD_W * z, SH_V(mul)(acc[r][z], vs));
}

/* Rows 0 .. rows of c += a(i, q) b[q] over q0 .. q1, V vectors of columns. */
SH_V_TARGET static inline __attribute__((always_inline)) void SH_W_NAME(accumulate_tile)(
    float *c, int64_t ldc, const float *a, int lda, int trans, const float *b, int64_t ldb, int rows, int q0, int q1,
    int R, int V) {
  int64_t off[8];
  SH_VF acc[8][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    int rr = r < rows ? r : rows - 1;
    off[r] = trans ? rr : (int64_t)rr * lda;
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) acc[r][v] = SH_V(zero)();
  }
  for (int q = q0; q < q1; q++) {
    SH_VF bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) bv[v] = SH_V(loadu)(b + q * ldb + SH_SIMD_W * v);
    const float *aq = trans ? a + (int64_t)q * lda : a + q;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      SH_VF av = SH_V(set1)(aq[off[r]]);
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[r][v] = SH_V(fmadd)(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) {
      float *p = c + r * ldc + SH_SIMD_W * v;
      SH_V(storeu)(p, SH_V(add)(SH_V(loadu)(p), acc[r][v]));
    }
}

/* One function per tile width, so that R and V are constants. */
#define SCORES_FN(V)                                                                                    \
  SH_V_TARGET static void SH_W_NAME(scores_##V)(float *s, int lds, const float *a, int64_t lda,              \
                                               const float *bt, int ldbt, int rows, int D, float scale) { \
    SH_W_NAME(scores_tile)(s, lds, a, lda, bt, ldbt, rows, D, scale, TILE_ROWS(V), V);                    \
  }
#define ACCUMULATE_FN(name, TRANS, V)                                                                   \
  SH_V_TARGET static void SH_W_NAME(name##_##V)(float *c, int64_t ldc, const float *a, int lda, const float *b, \
                                               int64_t ldb, int rows, int q0, int q1) {                  \
    SH_W_NAME(accumulate_tile)(c, ldc, a, lda, TRANS, b, ldb, rows, q0, q1, TILE_ROWS(V), V);             \
  }
SCORES_FN(1) SCORES_FN(2) SCORES_FN(3) SCORES_FN(4)
ACCUMULATE_FN(acc_rows, 0, 1) ACCUMULATE_FN(acc_rows, 0, 2) ACCUMULATE_FN(acc_rows, 0, 3) ACCUMULATE_FN(acc_rows, 0, 4)
ACCUMULATE_FN(acc_trans, 1, 1) ACCUMULATE_FN(acc_trans, 1, 2) ACCUMULATE_FN(acc_trans, 1, 3)
ACCUMULATE_FN(acc_trans, 1, 4)
#undef SCORES_FN
#undef ACCUMULATE_FN

/* The kernels at this width, for attn_blocks.c's loops over tiles. */
static const attn_kernels SH_W_NAME(attn_kernels) = {
  SH_SIMD_W, MAX_V, {TILE_ROWS(1), TILE_ROWS(2), TILE_ROWS(3), TILE_ROWS(4)}, SH_W_NAME(transpose),
  {SH_W_NAME(scores_1), SH_W_NAME(scores_2), SH_W_NAME(scores_3), SH_W_NAME(scores_4)},
  {{SH_W_NAME(acc_rows_1), SH_W_NAME(acc_rows_2), SH_W_NAME(acc_rows_3), SH_W_NAME(acc_rows_4)},
   {SH_W_NAME(acc_trans_1), SH_W_NAME(acc_trans_2), SH_W_NAME(acc_trans_3), SH_W_NAME(acc_trans_4)}},
};
