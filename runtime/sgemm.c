/* sgemm.c: c = alpha op(a) op(b) + beta c in f32 on the calling thread, with shard's own
 * kernels: AVX-512F in the avx512 kernel sets (cpu.h; 12 x 32 blocks of c in 24 zmm
 * registers) and AVX2 + FMA in the avx2 set (6 x 16 blocks in 12 ymm): the product blas.c
 * gives each thread of a split, and the whole product of a small one. The two sets share this
 * driver; their packing and micro-kernels are sgemm_tiles_internal.h, included once per set.
 *
 * Why not OpenBLAS for these: on the transformer's shapes (k and n from 65 to a few thousand)
 * OpenBLAS packs both operands on every call and zero-fills c before a beta-0 product. Here
 * only op(b) is packed, into panels of NR columns (a row of a panel is two vectors); op(a)
 * is read where it lies: a micro-kernel broadcasts the elements of its MR rows of op(a), from
 * MR stored rows of a, or from MR adjacent elements of one stored row when a is transposed.
 * It keeps an MR x NR block of c in 2 MR vector accumulators and writes c once (beta 0 never
 * reads it). Row tiles run outer and panels inner, so a tile of a stays in L1 while the
 * packed block of b (at most PACK_FLOATS) stays in L2; k runs in chunks of at most KC.
 * A tail tile of fewer than MR rows is copied into a zero-padded tile first, so the kernel
 * never reads past a; a tail panel of at most NR / 2 columns runs on one vector per row. When
 * c has few rows (DIRECT_B_MAX_ROWS: dW = dy^T x, whose b is a long x) and b is not
 * transposed, the whole panels are read straight from b's rows instead: packing would cost
 * more than it saves. Both of those reads stride a page or more from one row of k to the
 * next, where the hardware's prefetchers stop, so the tile that first brings such rows in
 * from memory (a transposed a: a tile's first panel; b read in place: a panel's first tile)
 * prefetches PF_DIST rows ahead (cold operands: dW 5-20% faster than without,
 * `bench/sgemm_cpu.c cold`).
 *
 * Sums: every element of c is its k products summed in order, one FMA after another (chunk
 * by chunk, c carrying the partial sum between chunks), then times alpha, then plus beta c
 * in one FMA: the same operations in both sets, so the bits depend neither on the split, nor
 * on the number of threads, nor on the kernel set. They differ from OpenBLAS's in the last
 * places where OpenBLAS blocks k differently.
 *
 * sh_sgemm_own_wanted says when to use it: an avx2 or avx512 kernel set in use (cpu.h), alpha
 * not 0 (BLAS then never reads a or b), and a product of at least MIN_WORK multiply-adds:
 * below that (attention's 64 x 64 blocks) OpenBLAS's small-matrix kernels are faster. */
#include "blas_internal.h"
#include "gemm_pack_internal.h"
#include "cpu_internal.h"
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

enum {
  KC = 1024,                  /* k per chunk: a tile of a (MR x KC) stays within L1 and L2 */
  PACK_FLOATS = 128 * 1024,   /* packed block of b: 512 KiB, half an L2 */
  MIN_WORK = 1 << 18,
  DIRECT_B_MAX_ROWS = 256,    /* up to this many rows of c, op(b) not transposed is read in place */
  PF_DIST = 16,               /* rows of k a prefetching tile runs ahead (about a memory latency) */
  PREFETCH_A = 1, PREFETCH_B = 2,
};

typedef void tile_fn(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, int ldc, int mr,
                     int nr, float alpha, float beta);
typedef void pack_fn(float *dst, const float *b, int ldb, int trans, int k0, int kc, int j0, int n);

/* One kernel set's half of the product (sgemm_tiles_internal.h): the rows and columns of c a tile
 * holds, its packing of op(b), and its tile kernels by [a as stored rows][whole panel]
 * [what it prefetches]. */
typedef struct sgemm_set {
  int mr, nr;
  pack_fn *pack_b;
  tile_fn *tile[2][2][4];
} sgemm_set;

/* ---- AVX-512F: 12 x 32 tiles, 16 lanes -------------------------------------------------- */

SH_GEMM_AVX512 static inline void transpose_avx512(const __m512 in[16], __m512 out[16]) {
  __m512i i[16], o[16];
  for (int r = 0; r < 16; r++) i[r] = _mm512_castps_si512(in[r]);
  sh_transpose16(i, o);
  for (int r = 0; r < 16; r++) out[r] = _mm512_castsi512_ps(o[r]);
}

#define SET avx512
#define TARGET SH_GEMM_AVX512
#define MR 12
#define VW 16
#define VF __m512
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_LOADN(p, n) _mm512_maskz_loadu_ps(sh_lanes_mask(n), p)
#define V_STOREN(p, v, n) _mm512_mask_storeu_ps(p, sh_lanes_mask(n), v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_TRANSPOSE(in, out) transpose_avx512(in, out)
#include "sgemm_tiles_internal.h"
#undef SET
#undef TARGET
#undef MR
#undef VW
#undef VF
#undef V_ZERO
#undef V_SET1
#undef V_LOADU
#undef V_STOREU
#undef V_LOADN
#undef V_STOREN
#undef V_FMA
#undef V_MUL
#undef V_TRANSPOSE

/* ---- AVX2 + FMA: 6 x 16 tiles, 8 lanes --------------------------------------------------- */

/* The first min(max(n, 0), 8) of 8 lanes, as maskload / maskstore take them. */
static const int32_t lanes8[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
SH_TARGET_AVX2 static inline __m256i mask8(int n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_loadu_si256((const __m256i *)(lanes8 + 8 - n));
}

/* out[c] = column c of the 8 x 8 matrix whose rows are in[0 .. 7]: pairs within each 128-bit
 * lane, then quads, then the two lanes. */
SH_TARGET_AVX2 static inline void transpose_avx2(const __m256 in[8], __m256 out[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(in[2 * i], in[2 * i + 1]);
  }
  for (int h = 0; h < 2; h++) {   /* s[4h + e]: rows 4h .. 4h+3 of columns e and 4 + e */
    s[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int e = 0; e < 4; e++) {
    out[e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x20);
    out[4 + e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x31);
  }
}

#define SET avx2
#define TARGET SH_TARGET_AVX2
#define MR 6
#define VW 8
#define VF __m256
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps(p, v)
#define V_LOADN(p, n) _mm256_maskload_ps(p, mask8(n))
#define V_STOREN(p, v, n) _mm256_maskstore_ps(p, mask8(n), v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_TRANSPOSE(in, out) transpose_avx2(in, out)
#include "sgemm_tiles_internal.h"
#undef SET
#undef TARGET
#undef MR
#undef VW
#undef VF
#undef V_ZERO
#undef V_SET1
#undef V_LOADU
#undef V_STOREU
#undef V_LOADN
#undef V_STOREN
#undef V_FMA
#undef V_MUL
#undef V_TRANSPOSE

/* ---- choosing the path ------------------------------------------------------------------- */

/* The set in use's kernels, or NULL (generic: OpenBLAS). */
static const sgemm_set *own_set(void) {
  int isa = sh_cpu_isa_fast();
  return isa >= SH_CPU_AVX512 ? &sgemm_avx512 : isa >= SH_CPU_AVX2 ? &sgemm_avx2 : NULL;
}

int sh_sgemm_own_wanted(int m, int n, int k, float alpha) {
  return own_set() != NULL && alpha != 0.0f && (double)m * n * k >= MIN_WORK;
}

void sh_sgemm_own_tile(int *rows, int *cols) {
  const sgemm_set *s = own_set();
  *rows = s ? s->mr : 0;
  *cols = s ? s->nr : 0;
}

/* ---- the blocked product ------------------------------------------------------------------ */

/* op(a)'s rows i0 .. i0+mr over k0 .. k0+kc into a dense MR x kc tile, rows past mr zero. */
static void copy_tail_tile(float *dst, int MR, const float *a, int lda, int trans, int i0, int mr, int k0, int kc) {
  memset(dst, 0, sizeof(float) * MR * kc);
  for (int r = 0; r < mr; r++)
    for (int q = 0; q < kc; q++)
      dst[(size_t)r * kc + q] = trans ? a[(size_t)(k0 + q) * lda + i0 + r] : a[(size_t)(i0 + r) * lda + k0 + q];
}

/* Columns j0 .. j0+n of c over k0 .. k0+kc (beta: what c's value counts for). Panels come
 * from `packed`, or, when `direct` (op(b) as stored, at row k0 and column j0), the whole ones
 * straight from b's rows, ldb apart, and only the tail panel from `packed`. */
static void block(const sgemm_set *set, CBLAS_TRANSPOSE ta, int m, int n, int kc, float alpha, const float *a, int lda,
                  int k0, int j0, const float *direct, int ldb, const float *packed, float *tail, float beta, float *c,
                  int ldc) {
  int ta_t = ta != CblasNoTrans, MR = set->mr, NR = set->nr;
  for (int i0 = 0; i0 < m; i0 += MR) {
    int mr = m - i0 < MR ? m - i0 : MR;
    const float *at = ta_t ? a + (size_t)k0 * lda + i0 : a + (size_t)i0 * lda + k0;
    size_t ld = lda;
    int rows = !ta_t;
    if (mr < MR) {
      copy_tail_tile(tail, MR, a, lda, ta_t, i0, mr, k0, kc);
      at = tail, ld = kc, rows = 1;
    }
    for (int jp = 0; jp * NR < n; jp++) {
      int nr = n - jp * NR < NR ? n - jp * NR : NR, w = nr > NR / 2 ? NR : NR / 2;
      const float *panel = direct ? packed : packed + (size_t)jp * NR * kc;
      size_t ps = w;
      if (direct && nr == NR) panel = direct + jp * NR, ps = ldb;
      /* the first panel of a tile brings a transposed a's tile in, the first tile a panel
       * read in place: from memory, rows a page or more apart, where the hardware's
       * prefetchers stop */
      int prefetch = (!rows && jp == 0 ? PREFETCH_A : 0) | (ps != (size_t)w && i0 == 0 ? PREFETCH_B : 0);
      set->tile[rows][w == NR][prefetch](kc, at, ld, panel, ps, c + (size_t)i0 * ldc + j0 + jp * NR, ldc, mr, nr, alpha, beta);
    }
  }
}

int sh_sgemm_own(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  const sgemm_set *set = own_set();
  if (!set) return -1;
  int MR = set->mr, NR = set->nr, kc_max = k < KC ? k : KC;
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
      if (whole < nb) set->pack_b(packed, b, ldb, tb != CblasNoTrans, k0, kc, j0 + whole, nb - whole);
      block(set, ta, m, nb, kc, alpha, a, lda, k0, j0, direct ? b + (size_t)k0 * ldb + j0 : NULL, ldb, packed, tail,
            k0 == 0 ? beta : 1.0f, c, ldc);
    }
  }
  return 0;
}
