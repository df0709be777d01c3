/* sgemm.c: c = alpha op(a) op(b) + beta c in f32 on the calling thread, with AVX-512F
 * (the avx512 kernel sets, cpu.h): the product blas.c gives each thread of a split, and the whole
 * product of a small one.
 *
 * Why not OpenBLAS for these: on the transformer's shapes (k and n from 65 to a few thousand)
 * OpenBLAS packs both operands on every call and zero-fills c before a beta-0 product. Here
 * only op(b) is packed, into panels of NR columns (a row of a panel is two zmm loads); op(a)
 * is read where it lies: a micro-kernel broadcasts the elements of its MR rows of op(a), from
 * MR stored rows of a, or from MR adjacent elements of one stored row when a is transposed.
 * It keeps an MR x NR block of c in 24 zmm accumulators and writes c once (beta 0 never
 * reads it). Row tiles run outer and panels inner, so a tile of a stays in L1 while the
 * packed block of b (at most PACK_FLOATS) stays in L2; k runs in chunks of at most KC.
 * A tail tile of fewer than MR rows is copied into a zero-padded tile first, so the kernel
 * never reads past a; a tail panel of at most 16 columns runs on one zmm per row. When c has
 * few rows (DIRECT_B_MAX_ROWS: dW = dy^T x, whose b is a long x) and b is not transposed, the
 * whole panels are read straight from b's rows instead: packing would cost more than it saves.
 * Both of those reads stride a page or more from one row of k to the next, where the
 * hardware's prefetchers stop, so the tile that first brings such rows in from memory (a
 * transposed a: a tile's first panel; b read in place: a panel's first tile) prefetches
 * PF_DIST rows ahead (cold operands: dW 5-20% faster than without, `bench/sgemm_cpu.c cold`).
 *
 * Sums: every element of c is its k products summed in order, one FMA after another (chunk
 * by chunk, c carrying the partial sum between chunks), so the bits do not depend on the
 * split or on the number of threads. They differ from OpenBLAS's in the last places where
 * OpenBLAS blocks k differently.
 *
 * sh_sgemm_avx512_wanted says when to use it: an avx512 kernel set in use (cpu.h), alpha not 0 (BLAS then never reads a or b),
 * and a product of at least MIN_WORK multiply-adds: below that (attention's 64 x 64 blocks)
 * OpenBLAS's small-matrix kernels are faster. */
#include "blas_internal.h"
#include "gemm_pack_internal.h"
#include "cpu_internal.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum {
  MR = 12, NR = 32,
  KC = 1024,                  /* k per chunk: a tile of a (MR x KC) stays within L1 and L2 */
  PACK_FLOATS = 128 * 1024,   /* packed block of b: 512 KiB, half an L2 */
  MIN_WORK = 1 << 18,
  DIRECT_B_MAX_ROWS = 256,
  PF_DIST = 16,               /* rows of k a prefetching tile runs ahead (about a memory latency) */
  PREFETCH_A = 1, PREFETCH_B = 2,    /* up to this many rows of c, op(b) not transposed is read in place */
};

/* ---- choosing the path ------------------------------------------------------------------- */

int sh_sgemm_avx512_wanted(int m, int n, int k, float alpha) {
  return sh_cpu_isa_fast() >= SH_CPU_AVX512 && alpha != 0.0f && (double)m * n * k >= MIN_WORK;
}

/* ---- packing op(b) ----------------------------------------------------------------------- */

/* Width of panel jp of a block of n columns: NR, or 16 for a tail of at most 16. */
static int panel_width(int n, int jp) { return n - jp * NR > 16 ? NR : 16; }

/* op(b)[k0 .. k0+kc, j0 .. j0+n] into panels: panel jp at dst + jp NR kc, row q of it at
 * + q width; columns past n are zero. b as stored: k x n (tb none) or n x k (transposed). */
SH_GEMM_AVX512 static void pack_b(float *dst, const float *b, int ldb, int trans, int k0, int kc, int j0, int n) {
  for (int jp = 0; jp * NR < n; jp++) {
    float *panel = dst + (size_t)jp * NR * kc;
    int w = panel_width(n, jp), cols = n - jp * NR;
    if (!trans) {
      const float *src = b + (size_t)k0 * ldb + j0 + jp * NR;
      for (int q = 0; q < kc; q++)
        for (int h = 0; h < w; h += 16)
          _mm512_storeu_ps(panel + q * w + h, _mm512_maskz_loadu_ps(sh_lanes_mask(cols - h), src + (size_t)q * ldb + h));
      continue;
    }
    /* 16 columns x 16 k at a time: rows of the stored b, transposed */
    for (int h = 0; h < w; h += 16)
      for (int q0 = 0; q0 < kc; q0 += 16) {
        __mmask16 mk = sh_lanes_mask(kc - q0);
        __m512i in[16], out[16];
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++)
          in[r] = h + r < cols ? _mm512_castps_si512(_mm512_maskz_loadu_ps(
                                     mk, b + (size_t)(j0 + jp * NR + h + r) * ldb + k0 + q0))
                               : _mm512_setzero_si512();
        sh_transpose16(in, out);
        for (int q = 0; q < 16 && q0 + q < kc; q++) _mm512_storeu_si512(panel + (q0 + q) * w + h, out[q]);
      }
  }
}

/* ---- the micro-kernel -------------------------------------------------------------------- */

/* c[0:mr, 0:nr] = alpha (a tile . panel) + beta c over kc, the tile's element (r, q) at
 * a[r rs + q cs]; a panel row is V zmm (NR or 16 columns), rows ps floats apart. Inlined into
 * one function per tile layout and width, so rs, cs and V are constants where it matters. */
SH_GEMM_AVX512 static inline __attribute__((always_inline)) void tile(
    int kc, const float *a, size_t rs, size_t cs, const float *panel, size_t ps, int V, int PF, float *c, int ldc,
    int mr, int nr, float alpha, float beta) {
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int q = 0; q < kc; q++) {
    if (PF & PREFETCH_A) {   /* both lines the tile's row q + PF_DIST may touch */
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs), _MM_HINT_T0);
      _mm_prefetch((const char *)(a + (q + PF_DIST) * cs + (MR - 1) * rs), _MM_HINT_T0);
    }
    if (PF & PREFETCH_B) {   /* the panel's row q + PF_DIST */
      _mm_prefetch((const char *)(panel + (q + PF_DIST) * ps), _MM_HINT_T0);
      _mm_prefetch((const char *)(panel + (q + PF_DIST) * ps + 16), _MM_HINT_T0);
    }
    __m512 b0 = _mm512_loadu_ps(panel + q * ps);
    __m512 b1 = V == 2 ? _mm512_loadu_ps(panel + q * ps + 16) : b0;
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      __m512 av = _mm512_set1_ps(a[r * rs + q * cs]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      if (V == 2) acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < mr; r++)
    for (int v = 0; v < V; v++) {
      float *p = c + (size_t)r * ldc + 16 * v;
      __mmask16 mk = sh_lanes_mask(nr - 16 * v);
      __m512 x = _mm512_mul_ps(acc[r][v], va);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, p), x);
      _mm512_mask_storeu_ps(p, mk, x);
    }
}

typedef void tile_fn(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, int ldc, int mr,
                     int nr, float alpha, float beta);

/* a's tile as MR stored rows (ld apart), or as MR adjacent elements of stored rows ld apart */
#define TILE_FN(name, RS, CS, V, PF)                                                                     \
  SH_GEMM_AVX512 static void name(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, \
                                  int ldc, int mr, int nr, float alpha, float beta) {                  \
    tile(kc, a, RS, CS, panel, ps, V, PF, c, ldc, mr, nr, alpha, beta);                              \
  }
TILE_FN(tile_rows2, ld, 1, 2, 0)
TILE_FN(tile_rows2_b, ld, 1, 2, PREFETCH_B)
TILE_FN(tile_rows1, ld, 1, 1, 0)
TILE_FN(tile_cols2, 1, ld, 2, 0)
TILE_FN(tile_cols2_a, 1, ld, 2, PREFETCH_A)
TILE_FN(tile_cols2_b, 1, ld, 2, PREFETCH_B)
TILE_FN(tile_cols2_ab, 1, ld, 2, PREFETCH_A | PREFETCH_B)
TILE_FN(tile_cols1, 1, ld, 1, 0)
TILE_FN(tile_cols1_a, 1, ld, 1, PREFETCH_A)

/* The kernel for a tile: a's layout (rows, or transposed), the panel's width, and what it
 * prefetches (only a panel read in place, which is never a tail, prefetches b). */
static tile_fn *tile_kernel(int rows, int wide, int prefetch) {
  if (rows) return !wide ? tile_rows1 : prefetch & PREFETCH_B ? tile_rows2_b : tile_rows2;
  if (!wide) return prefetch & PREFETCH_A ? tile_cols1_a : tile_cols1;
  static tile_fn *const cols2[4] = { tile_cols2, tile_cols2_a, tile_cols2_b, tile_cols2_ab };
  return cols2[prefetch];
}

/* ---- the blocked product ------------------------------------------------------------------ */

/* op(a)'s rows i0 .. i0+mr over k0 .. k0+kc into a dense MR x kc tile, rows past mr zero. */
static void copy_tail_tile(float *dst, const float *a, int lda, int trans, int i0, int mr, int k0, int kc) {
  memset(dst, 0, sizeof(float) * MR * kc);
  for (int r = 0; r < mr; r++)
    for (int q = 0; q < kc; q++)
      dst[(size_t)r * kc + q] = trans ? a[(size_t)(k0 + q) * lda + i0 + r] : a[(size_t)(i0 + r) * lda + k0 + q];
}

/* Columns j0 .. j0+n of c over k0 .. k0+kc (beta: what c's value counts for). Panels come
 * from `packed`, or, when `direct` (op(b) as stored, at row k0 and column j0), the whole ones
 * straight from b's rows, ldb apart, and only the tail panel from `packed`. */
static void block(CBLAS_TRANSPOSE ta, int m, int n, int kc, float alpha, const float *a, int lda, int k0, int j0,
                  const float *direct, int ldb, const float *packed, float *tail, float beta, float *c, int ldc) {
  int ta_t = ta != CblasNoTrans;
  for (int i0 = 0; i0 < m; i0 += MR) {
    int mr = m - i0 < MR ? m - i0 : MR;
    const float *at = ta_t ? a + (size_t)k0 * lda + i0 : a + (size_t)i0 * lda + k0;
    size_t ld = lda;
    int rows = !ta_t;
    if (mr < MR) {
      copy_tail_tile(tail, a, lda, ta_t, i0, mr, k0, kc);
      at = tail, ld = kc, rows = 1;
    }
    for (int jp = 0; jp * NR < n; jp++) {
      int nr = n - jp * NR < NR ? n - jp * NR : NR, w = panel_width(n, jp);
      const float *panel = direct ? packed : packed + (size_t)jp * NR * kc;
      size_t ps = w;
      if (direct && nr == NR) panel = direct + jp * NR, ps = ldb;
      /* the first panel of a tile brings a transposed a's tile in, the first tile a panel
       * read in place: from memory, rows a page or more apart, where the hardware's
       * prefetchers stop */
      int prefetch = (!rows && jp == 0 ? PREFETCH_A : 0) | (ps != (size_t)w && i0 == 0 ? PREFETCH_B : 0);
      tile_fn *fn = tile_kernel(rows, w == NR, prefetch);
      fn(kc, at, ld, panel, ps, c + (size_t)i0 * ldc + j0 + jp * NR, ldc, mr, nr, alpha, beta);
    }
  }
}

int sh_sgemm_avx512(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a,
                    int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  int kc_max = k < KC ? k : KC;
  int nc = PACK_FLOATS / kc_max / NR * NR;
  if (nc < NR) nc = NR;
  float *packed = sh_gemm_scratch(sizeof(float) * ((size_t)nc * kc_max + (size_t)MR * kc_max));
  if (!packed) return -1;
  float *tail = packed + (size_t)nc * kc_max;
  /* few rows of c: packing all of b would cost more than reading its rows where they are */
  int direct = tb == CblasNoTrans && m <= DIRECT_B_MAX_ROWS;
  for (int j0 = 0; j0 < n; j0 += nc) {
    int nb = n - j0 < nc ? n - j0 : nc, whole = direct ? nb / NR * NR : 0;
    for (int k0 = 0; k0 < k; k0 += KC) {
      int kc = k - k0 < KC ? k - k0 : KC;
      if (whole < nb) pack_b(packed, b, ldb, tb != CblasNoTrans, k0, kc, j0 + whole, nb - whole);
      block(ta, m, nb, kc, alpha, a, lda, k0, j0, direct ? b + (size_t)k0 * ldb + j0 : NULL, ldb, packed, tail,
            k0 == 0 ? beta : 1.0f, c, ldc);
    }
  }
  return 0;
}
