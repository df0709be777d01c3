/* attn_blocks.c: attention's block products (attn_blocks_internal.h) in the avx512 and avx2
 * kernel sets: attn_blocks_simd_internal.h's register tiles built at 16 lanes (AVX-512F) and 8
 * (AVX2 + FMA), and the loops over tiles that call the build of the set in use.
 *
 * A tile holds R rows by V vectors of results in accumulators: at 16 lanes up to 16 of the 32
 * zmm (8 rows by 1 or 2 vectors, 4 by 3 or 4; a 64-column block is at most 4 vectors); at 8
 * lanes 12 of the 16 ymm (3 rows by up to 4 vectors), so that the right operand's vectors and
 * a broadcast fit beside them, and a row wider than 4 vectors goes in 2 chunks of columns.
 * Enough independent FMA chains either way to cover the FMA latency. */
#include "attn_blocks_internal.h"
#include "simd_internal.h"

typedef void scores_fn(float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int rows, int D,
                       float scale);
typedef void accumulate_fn(float *c, int64_t ldc, const float *a, int lda, const float *b, int64_t ldb, int rows,
                           int q0, int q1);

/* The kernels of one width: tile functions by V - 1 (accumulate by [trans][V - 1]; at 8 lanes
 * its 1-vector tiles go unused, D being a multiple of 16). */
typedef struct attn_kernels {
  int lanes, max_v, rows[4];
  void (*transpose)(float *bt, int ldbt, const float *b, int64_t ldb, int n, int D);
  scores_fn *scores[4];
  accumulate_fn *accumulate[2][4];
} attn_kernels;

#define SH_SIMD_W 16
#define MAX_V 4
#define TILE_ROWS(V) ((V) <= 2 ? 8 : 4)
#include "attn_blocks_simd_internal.h"
#undef SH_SIMD_W
#undef MAX_V
#undef TILE_ROWS
#define SH_SIMD_W 8
#define MAX_V 4
#define TILE_ROWS(V) 3
#include "attn_blocks_simd_internal.h"
#undef SH_SIMD_W
#undef MAX_V
#undef TILE_ROWS

/* The build of the set in use (the kernels are wanted only from avx2 up). */
static const attn_kernels *kernels(void) {
  return sh_cpu_isa_fast() >= SH_CPU_AVX512 ? &attn_kernels_x16 : &attn_kernels_x8;
}

int sh_attn_blocks_wanted(int64_t D) {
  return D % 16 == 0 && D >= 16 && D <= 64 && sh_cpu_isa_fast() >= SH_CPU_AVX2;
}

void sh_attn_transpose(float *bt, int ldbt, const float *b, int64_t ldb, int n, int D) {
  kernels()->transpose(bt, ldbt, b, ldb, n, D);
}

static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* nv vectors of columns in chunks of at most max_v, as even as they can be: how many chunks,
 * and the widest. */
static int chunks(const attn_kernels *k, int nv) { return (nv + k->max_v - 1) / k->max_v; }
static int widest(const attn_kernels *k, int nv) { return nv < 1 ? 1 : (nv + chunks(k, nv) - 1) / chunks(k, nv); }

/* Vectors of columns that rows i0 .. i0+rows see */
static int seen_vectors(const attn_kernels *k, int i0, int rows, int n, int diag) {
  return (min_int(n, i0 + rows + diag) + k->lanes - 1) / k->lanes;
}

void sh_attn_scores(float *s, int lds, const float *a, int64_t lda, const float *bt, int ldbt, int m, int n, int D,
                    float scale, int diag) {
  const attn_kernels *k = kernels();
  for (int i0 = 0, rows; i0 < m; i0 += rows) {
    /* the tallest tile first; when its rows see more vectors, the rows of the wider tile (which
     * every chunk's tile holds: at 16 lanes there is one chunk, no wider than the first guess,
     * and rows[] only falls as V grows; at 8 lanes every tile has 3 rows) */
    int nv = seen_vectors(k, i0, min_int(k->rows[0], m - i0), n, diag);
    rows = min_int(k->rows[widest(k, nv) - 1], m - i0);
    nv = seen_vectors(k, i0, rows, n, diag);
    for (int c = 0, z0 = 0, nc = chunks(k, nv); c < nc; c++) {   /* none for rows that see no key */
      int v = nv / nc + (c < nv % nc);
      k->scores[v - 1](s + (size_t)i0 * lds + z0 * k->lanes, lds, a + i0 * lda, lda, bt + z0 * k->lanes, ldbt, rows,
                       D, scale);
      z0 += v;
    }
  }
}

void sh_attn_accumulate(float *c, int64_t ldc, const float *a, int lda, int trans, const float *b, int64_t ldb,
                        int m, int k, int D, int diag) {
  const attn_kernels *kn = kernels();
  int nv = D / kn->lanes, nc = chunks(kn, nv), R = kn->rows[widest(kn, nv) - 1];
  for (int i0 = 0; i0 < m; i0 += R) {
    int rows = min_int(R, m - i0);
    /* rows: a query's keys end at i + diag; trans: a key's queries start at i - diag */
    int q0 = trans ? max_int(0, i0 - diag) : 0, q1 = trans ? k : min_int(k, i0 + rows + diag);
    if (q0 >= q1) continue;
    for (int ch = 0, z0 = 0; ch < nc; ch++) {
      int v = nv / nc + (ch < nv % nc);
      kn->accumulate[trans != 0][v - 1](c + i0 * ldc + z0 * kn->lanes, ldc, trans ? a + i0 : a + (int64_t)i0 * lda, lda,
                                        b + z0 * kn->lanes, ldb, rows, q0, q1);
      z0 += v;
    }
  }
}
