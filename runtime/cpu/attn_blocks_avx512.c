/* attn_blocks_avx512.c: attention's block products with AVX-512F (attn_blocks_internal.h).
 *
 * Both kernels keep a tile of R result rows by up to 4 zmm in accumulators and walk the
 * reduction one step at a time: a step loads the zmm of one row of the right operand and
 * broadcasts the R elements of the left one that meet it. A tail tile of fewer than R rows
 * repeats its last row (the loads stay inside the operand) and stores only its own rows. */
#include "attn_blocks_internal.h"
#include "gemm_pack_internal.h"
#include "cpu_internal.h"

int sh_attn_blocks_wanted(int64_t D) {
  return D % 16 == 0 && D >= 16 && D <= 64 && sh_cpu_isa_fast() >= SH_CPU_AVX512;
}

SH_GEMM_AVX512 void sh_attn_transpose(float *bt, int ldbt, const float *b, int64_t ldb, int n, int D) {
  for (int j0 = 0; j0 < n; j0 += 16)
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m512i in[16], out[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++)
        in[r] = j0 + r < n ? _mm512_loadu_si512(b + (j0 + r) * ldb + d0) : _mm512_setzero_si512();
      sh_transpose16(in, out);
#pragma GCC unroll 16
      for (int e = 0; e < 16; e++) _mm512_storeu_si512(bt + (size_t)(d0 + e) * ldbt + j0, out[e]);
    }
}

/* Rows 0 .. rows (rows <= R) of s = scale a bt over D, NZ zmm of columns. */
SH_GEMM_AVX512 static inline __attribute__((always_inline)) void scores_tile(
    float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int rows, int D, float scale,
    int R, int NZ) {
  const float *ar[8];
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    ar[r] = a + (r < rows ? r : rows - 1) * lda;
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) acc[r][z] = _mm512_setzero_ps();
  }
  for (int d = 0; d < D; d++) {
    __m512 b[4];
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) b[z] = _mm512_loadu_ps(bt + (size_t)d * ldbt + 16 * z);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 av = _mm512_set1_ps(ar[r][d]);
#pragma GCC unroll 4
      for (int z = 0; z < NZ; z++) acc[r][z] = _mm512_fmadd_ps(av, b[z], acc[r][z]);
    }
  }
  __m512 vs = _mm512_set1_ps(scale);
  for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
    for (int z = 0; z < NZ; z++) _mm512_storeu_ps(s + (size_t)r * lds + 16 * z, _mm512_mul_ps(acc[r][z], vs));
}

/* Rows 0 .. rows of c += a(i, q) b[q] over q0 .. q1, ND zmm of columns (D = 16 ND). */
SH_GEMM_AVX512 static inline __attribute__((always_inline)) void accumulate_tile(
    float *c, int64_t ldc, const float *a, int lda, int trans, const float *b, int64_t ldb, int rows, int q0, int q1,
    int R, int ND) {
  int64_t off[8];
  __m512 acc[8][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    int rr = r < rows ? r : rows - 1;
    off[r] = trans ? rr : (int64_t)rr * lda;
#pragma GCC unroll 4
    for (int v = 0; v < ND; v++) acc[r][v] = _mm512_setzero_ps();
  }
  for (int q = q0; q < q1; q++) {
    __m512 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < ND; v++) bv[v] = _mm512_loadu_ps(b + q * ldb + 16 * v);
    const float *aq = trans ? a + (int64_t)q * lda : a + q;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m512 av = _mm512_set1_ps(aq[off[r]]);
#pragma GCC unroll 4
      for (int v = 0; v < ND; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
    for (int v = 0; v < ND; v++) {
      float *p = c + r * ldc + 16 * v;
      _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), acc[r][v]));
    }
}

/* One function per tile shape, so R, NZ and ND are constants. Rows per tile for V zmm of
 * columns: at most 16 accumulators (8 rows by 2 zmm, 4 by 4), enough independent FMA chains
 * to cover the FMA latency. */
#define TILE_ROWS(V) ((V) <= 2 ? 8 : 4)
typedef void scores_fn(float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int rows, int D,
                       float scale);
#define SCORES_FN(NZ)                                                                                     \
  SH_GEMM_AVX512 static void scores_##NZ(float *s, int lds, const float *a, int64_t lda, const float *bt,      \
                                         int ldbt, int rows, int D, float scale) {                         \
    scores_tile(s, lds, a, lda, bt, ldbt, rows, D, scale, TILE_ROWS(NZ), NZ);                              \
  }
SCORES_FN(1)
SCORES_FN(2)
SCORES_FN(3)
SCORES_FN(4)

typedef void accumulate_fn(float *c, int64_t ldc, const float *a, int lda, const float *b, int64_t ldb, int rows,
                           int q0, int q1);
#define ACCUMULATE_FN(name, TRANS, ND)                                                                     \
  SH_GEMM_AVX512 static void name(float *c, int64_t ldc, const float *a, int lda, const float *b, int64_t ldb, \
                                  int rows, int q0, int q1) {                                             \
    accumulate_tile(c, ldc, a, lda, TRANS, b, ldb, rows, q0, q1, TILE_ROWS(ND), ND);                      \
  }
ACCUMULATE_FN(acc_rows_1, 0, 1)
ACCUMULATE_FN(acc_rows_2, 0, 2)
ACCUMULATE_FN(acc_rows_3, 0, 3)
ACCUMULATE_FN(acc_rows_4, 0, 4)
ACCUMULATE_FN(acc_trans_1, 1, 1)
ACCUMULATE_FN(acc_trans_2, 1, 2)
ACCUMULATE_FN(acc_trans_3, 1, 3)
ACCUMULATE_FN(acc_trans_4, 1, 4)

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* zmm of columns that rows i0 .. i0+rows see */
static int seen_vectors(int i0, int rows, int n, int diag) { return (min_int(n, i0 + rows + diag) + 15) / 16; }

void sh_attn_scores(float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int m, int n, int D,
                    float scale, int diag) {
  static scores_fn *const by_width[4] = {scores_1, scores_2, scores_3, scores_4};
  for (int i0 = 0, rows; i0 < m; i0 += rows) {
    /* the widest tile first; when its rows see more than 2 zmm, the narrower tile's rows */
    int nz = seen_vectors(i0, min_int(TILE_ROWS(1), m - i0), n, diag);
    rows = min_int(TILE_ROWS(nz), m - i0);
    nz = seen_vectors(i0, rows, n, diag);
    if (nz < 1) continue;   /* rows that see no key of the block */
    by_width[nz - 1](s + (size_t)i0 * lds, lds, a + i0 * lda, lda, bt, ldbt, rows, D, scale);
  }
}

void sh_attn_accumulate(float *c, int64_t ldc, const float *a, int lda, int trans, const float *b, int64_t ldb,
                        int m, int k, int D, int diag) {
  static accumulate_fn *const by_width[2][4] = {{acc_rows_1, acc_rows_2, acc_rows_3, acc_rows_4},
                                                {acc_trans_1, acc_trans_2, acc_trans_3, acc_trans_4}};
  accumulate_fn *fn = by_width[trans != 0][D / 16 - 1];
  int R = TILE_ROWS(D / 16);
  for (int i0 = 0; i0 < m; i0 += R) {
    int rows = min_int(R, m - i0);
    /* rows: a query's keys end at i + diag; trans: a key's queries start at i - diag */
    int q0 = trans ? max_int(0, i0 - diag) : 0, q1 = trans ? k : min_int(k, i0 + rows + diag);
    if (q0 < q1)
      fn(c + i0 * ldc, ldc, trans ? a + i0 : a + (int64_t)i0 * lda, lda, b, ldb, rows, q0, q1);
  }
}
