/* sgemm.c: c = alpha op(a) op(b) + beta c in f32 on the calling thread, with shard's own
 * kernels: AVX-512F in the avx512 kernel sets (cpu.h; 12 x 32 blocks of c in 24 zmm
 * registers) and AVX2 + FMA in the avx2 set (6 x 16 blocks in 12 ymm): the product blas.c
 * gives each thread of a split, and the whole product of a small one. The sets share this
 * driver; their packing and micro-kernels are sgemm_tiles_internal.h, included once per set
 * with its vector ops and its choices below.
 *
 * Why not OpenBLAS for these: on the transformer's shapes (k and n from 65 to a few thousand)
 * OpenBLAS packs both operands on every call and zero-fills c before a beta-0 product. Here
 * op(b) is packed, into panels of NR columns (a row of a panel is NV vectors), and op(a) is
 * read where it lies when it can be: a micro-kernel broadcasts the elements of its MR rows of
 * op(a), from MR stored rows of a, or from MR adjacent elements of one stored row when a is
 * transposed. It keeps an MR x NR block of c in MR NV vector accumulators and writes c once
 * (beta 0 never reads it). Row tiles run outer and panels inner, so a tile of a stays in L1
 * while the packed block of b (at most PACK_FLOATS) stays in L2; k runs in chunks of at most
 * KC. A tail tile of fewer than MR rows is copied into a zero-padded tile first, so the kernel
 * never reads past a; a tail panel of at most one vector's columns runs on one vector per row.
 *
 * What each set does with the operands that stride a page or more from one row of k to the
 * next (dW = dy^T x: a transposed, b a long x), by measurement on an AMD EPYC (Zen 4):
 * - avx512 reads them in place. A transposed a: each row of k gives 12 of a line's 16 floats.
 *   Up to DIRECT_B rows of c (256), b not transposed: the whole panels straight from b's rows,
 *   as packing would cost more than it saves. The hardware's prefetchers stop at those strides,
 *   so the tile that first brings such rows in from memory (a transposed a: a tile's first
 *   panel; b read in place: a panel's first tile) prefetches PF_DIST rows ahead (cold
 *   operands: dW 5-20% faster than without, `bench/sgemm_cpu.c cold`).
 * - avx2 packs both (PACK_TA, DIRECT_B 0). Its 6-row tile would use 24 bytes of each line of a
 *   transposed a, and a tile of a and a panel of b read in place no longer fit L1 together: every
 *   panel pulled the tile's kc lines through L1 again, and b's panels, a page apart, evicted
 *   each other (dW of 128 rows 10-30% slower than OpenBLAS's Haswell kernels). A transposed a is
 *   packed PACK_A_TILES tiles at a time, so each of its rows is read along its length once.
 *
 * Sums: every element of c is its k products summed in order, one FMA after another (chunk
 * by chunk, c carrying the partial sum between chunks of KC), then times alpha, then plus beta
 * c in one FMA: the same operations in every set (packing moves operands, never sums), so the
 * bits depend neither on the split, nor on the number of threads, nor on the kernel set. They
 * differ from OpenBLAS's in the last places where OpenBLAS blocks k differently.
 *
 * sh_sgemm_wanted says when to use it: an avx2 or avx512 kernel set in use (cpu.h), alpha not
 * 0 (BLAS then never reads a or b), and a product of at least MIN_WORK multiply-adds: below
 * that (attention's 64 x 64 blocks) OpenBLAS's small-matrix kernels are faster. */
#include "blas_internal.h"
#include "gemm_pack_internal.h"
#include "cpu_internal.h"
#include <stdint.h>
#include <string.h>

enum {
  KC = 1024,                  /* k per chunk: a tile of a (MR x KC) stays within L1 and L2 */
  PACK_FLOATS = 128 * 1024,   /* packed block of b: 512 KiB, half an L2 */
  MIN_WORK = 1 << 18,
  PF_DIST = 16,               /* rows of k a prefetching tile runs ahead (about a memory latency) */
  PREFETCH_A = 1, PREFETCH_B = 2,
  PACK_ROWS = 8,              /* rows of a b k x n packed into one panel before the next */
  PACK_A_TILES = 8,           /* tiles of a transposed a packed together (PACK_TA) */
};

typedef void tile_fn(int kc, const float *a, size_t ld, const float *panel, size_t ps, float *c, int ldc, int mr,
                     int nr, float alpha, float beta);
typedef void pack_b_fn(float *dst, const float *b, int ldb, int trans, int k0, int kc, int j0, int n);
typedef void pack_a_fn(float *dst, size_t tile_stride, const float *a, int lda, int i0, int mg, int k0, int kc);

/* One kernel set's half of the product (sgemm_tiles_internal.h), beside its tile's size in
 * sh_sgemm_kernel: a vector's lanes, whether a transposed a is packed, up to how many rows of
 * c b is read in place, its packing of op(b) and of a transposed a, and its tile kernels by
 * [a as stored rows][whole panel][what it prefetches]. */
typedef struct sgemm_ops {
  int vw, pack_ta, direct_b;
  pack_b_fn *pack_b;
  pack_a_fn *pack_a;
  tile_fn *tile[2][2][4];
} sgemm_ops;

/* ---- AVX-512F: 12 x 32 tiles, 16 lanes ---------------------------------------------------- */

SH_GEMM_AVX512 static inline void transpose16_ps(const __m512 in[16], __m512 out[16]) {
  __m512i i[16], o[16];
  for (int r = 0; r < 16; r++) i[r] = _mm512_castps_si512(in[r]);
  sh_transpose16(i, o);
  for (int r = 0; r < 16; r++) out[r] = _mm512_castsi512_ps(o[r]);
}

#define SET avx512
#define ISA SH_CPU_AVX512
#define TARGET SH_GEMM_AVX512
#define MR 12
#define VW 16
#define NV 2
#define PACK_TA 0
#define DIRECT_B 256
#define VF __m512
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_STOREU(p, v) _mm512_storeu_ps(p, v)
#define V_LOADN(p, n) _mm512_maskz_loadu_ps(sh_lanes_mask(n), p)
#define V_STOREN(p, v, n) _mm512_mask_storeu_ps(p, sh_lanes_mask(n), v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_TRANSPOSE(in, out) transpose16_ps(in, out)
#include "sgemm_tiles_internal.h"

/* ---- AVX2 + FMA: 6 x 16 tiles, 8 lanes ----------------------------------------------------- */

/* The first n of 8 lanes (0 <= n <= 8), as maskload / maskstore take them. */
static const int32_t lanes8[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
SH_TARGET_AVX2 static inline __m256i mask8(int n) { return _mm256_loadu_si256((const __m256i *)(lanes8 + 8 - n)); }

/* out[c] = column c of the 8 x 8 matrix whose rows are in[0 .. 7]: pairs within each 128-bit
 * lane, then quads, then the two lanes. */
SH_TARGET_AVX2 static inline void transpose8_ps(const __m256 in[8], __m256 out[8]) {
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
#define ISA SH_CPU_AVX2
#define TARGET SH_TARGET_AVX2
#define MR 6
#define VW 8
#define NV 2
#define PACK_TA 1
#define DIRECT_B 0
#define VF __m256
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_STOREU(p, v) _mm256_storeu_ps(p, v)
#define V_LOADN(p, n) _mm256_maskload_ps(p, mask8(n))
#define V_STOREN(p, v, n) _mm256_maskstore_ps(p, mask8(n), v)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_TRANSPOSE(in, out) transpose8_ps(in, out)
#include "sgemm_tiles_internal.h"

/* ---- choosing the path ------------------------------------------------------------------- */

const sh_sgemm_kernel *sh_sgemm_kernel_of(int isa) {
  return isa >= SH_CPU_AVX512 ? &kernel_avx512 : isa == SH_CPU_AVX2 ? &kernel_avx2 : NULL;
}

const sh_sgemm_kernel *sh_sgemm_wanted(int m, int n, int k, float alpha) {
  const sh_sgemm_kernel *kern = sh_sgemm_kernel_of(sh_cpu_isa_fast());
  return kern && alpha != 0.0f && (double)m * n * k >= MIN_WORK ? kern : NULL;
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
static void block(const sh_sgemm_kernel *kern, CBLAS_TRANSPOSE ta, int m, int n, int kc, float alpha, const float *a,
                  int lda, int k0, int j0, const float *direct, int ldb, const float *packed, float *apack,
                  float beta, float *c, int ldc) {
  const sgemm_ops *ops = kern->ops;
  int ta_t = ta != CblasNoTrans, MR = kern->mr, NR = kern->nr, packs_a = ta_t && ops->pack_ta;
  size_t tile_stride = (size_t)MR * kc + ops->vw;   /* of a packed group's tiles */
  for (int i0 = 0; i0 < m; i0 += MR) {
    int mr = m - i0 < MR ? m - i0 : MR;
    const float *at = ta_t ? a + (size_t)k0 * lda + i0 : a + (size_t)i0 * lda + k0;
    size_t ld = lda;
    int rows = !ta_t;
    if (packs_a) {
      int t = i0 / MR % PACK_A_TILES;
      if (t == 0) ops->pack_a(apack, tile_stride, a, lda, i0, m - i0 < PACK_A_TILES * MR ? m - i0 : PACK_A_TILES * MR,
                              k0, kc);
      at = apack + t * tile_stride, ld = MR;
    } else if (mr < MR) {
      copy_tail_tile(apack, MR, a, lda, ta_t, i0, mr, k0, kc);
      at = apack, ld = kc, rows = 1;
    }
    int in_place_a = ta_t && !packs_a && mr == MR;
    for (int jp = 0; jp * NR < n; jp++) {
      int nr = n - jp * NR < NR ? n - jp * NR : NR, w = nr > ops->vw ? NR : ops->vw;
      const float *panel = direct ? packed : packed + (size_t)jp * NR * kc;
      size_t ps = w;
      if (direct && nr == NR) panel = direct + jp * NR, ps = ldb;
      /* the first panel of a tile brings a transposed a's tile in, the first tile a panel
       * read in place: from memory, rows a page or more apart, where the hardware's
       * prefetchers stop */
      int prefetch = (in_place_a && jp == 0 ? PREFETCH_A : 0) | (ps != (size_t)w && i0 == 0 ? PREFETCH_B : 0);
      ops->tile[rows][w == NR][prefetch](kc, at, ld, panel, ps, c + (size_t)i0 * ldc + j0 + jp * NR, ldc, mr, nr,
                                         alpha, beta);
    }
  }
}

int sh_sgemm_run(const sh_sgemm_kernel *kern, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  const sgemm_ops *ops = kern->ops;
  int MR = kern->mr, NR = kern->nr, kc_max = k < KC ? k : KC;
  int nc = PACK_FLOATS / kc_max / NR * NR;
  if (nc < NR) nc = NR;
  size_t a_floats = ops->pack_ta ? PACK_A_TILES * ((size_t)MR * kc_max + ops->vw) : (size_t)MR * kc_max;
  float *packed = sh_gemm_scratch(sizeof(float) * ((size_t)nc * kc_max + a_floats));
  if (!packed) return -1;
  float *apack = packed + (size_t)nc * kc_max;
  /* few rows of c: packing all of b would cost more than reading its rows where they are */
  int direct = tb == CblasNoTrans && m <= ops->direct_b;
  for (int j0 = 0; j0 < n; j0 += nc) {
    int nb = n - j0 < nc ? n - j0 : nc, whole = direct ? nb / NR * NR : 0;
    for (int k0 = 0; k0 < k; k0 += KC) {
      int kc = k - k0 < KC ? k - k0 : KC;
      if (whole < nb) ops->pack_b(packed, b, ldb, tb != CblasNoTrans, k0, kc, j0 + whole, nb - whole);
      block(kern, ta, m, nb, kc, alpha, a, lda, k0, j0, direct ? b + (size_t)k0 * ldb + j0 : NULL, ldb, packed, apack,
            k0 == 0 ? beta : 1.0f, c, ldc);
    }
  }
  return 0;
}
