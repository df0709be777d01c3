/* gemm_bf16.c: c = alpha op(a) op(b) + beta c with a and b in bf16 and c in f32 or bf16 (then
 * rounded once from the f32 result), on the CPU.
 *
 * In the avx512bf16 kernel set (vdpbf16ps; cpu.h, so the build and the machine may differ) the products are exact in f32 and summed in f32: op(b) is packed once per call
 * (per thread's block of c) into panels of NR columns where each k-pair of a column sits as
 * one 32-bit lane (the layout vdpbf16ps reads), op(a) into tiles of MR rows of k-pairs (both
 * in the packing scratch each thread keeps between calls, gemm_pack_internal.h; the packs are
 * AVX-512 too: 16x16 word transposes, or two rows interleaved); a micro-kernel keeps an MR x NR
 * block of c in 24 zmm accumulators. The thread team (parallel.h) splits c into one block per
 * thread, or the calling thread does it all inside a parallel call. Tails in
 * m, n and odd k are zero-padded in the packs and masked at the store, which also applies
 * alpha, beta and the rounding of a bf16 c (sh_f32_to_bf16_inline's bits: vcvtneps2bf16
 * would flush denormal results to zero).
 * In the other sets (a CPU without the instructions, or SHARD_CPU_ISA below avx512bf16) a and
 * b are widened to f32 and go through sh_sgemm (the same products, summed in f32 by
 * sh_sgemm's kernel); a one-line notice says so, once. */
#include "blas_internal.h"
#include "core/dtype.h"
#include "core/bf16_internal.h"
#include "core/status_internal.h"
#include "core/parallel.h"
#include "simd_internal.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MR rows x NR columns of c per micro-kernel call, over the whole k (blocking k measured no
 * faster on these shapes, and c in bf16 must see the f32 sum once). */
enum { MR = 12, NR = 32, PAR_MIN_WORK = 1 << 18 };

/* Where c is: f32, or bf16 (the f32 result rounded to nearest even at the store). */
typedef struct out { char *p; int ld, bf16; } out;

static char *out_at(out c, int i, int j) { return c.p + ((size_t)i * c.ld + j) * (c.bf16 ? 2 : 4); }

#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* ---- choosing the path ------------------------------------------------------------------ */

static int use_avx512_bf16(void) {
  static int said;
  int isa = sh_cpu_isa_fast();
  if (isa >= SH_CPU_AVX512BF16) return 1;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "shard: CPU kernel set %s (no vdpbf16ps): bf16 matrix products on the CPU widen to f32\n",
            sh_cpu_isa_name(isa));
  return 0;
}

/* ---- fallback: widen to f32, then sh_sgemm ------------------------------------------------ */

/* The rows x cols matrix stored at p with leading dimension ld, widened into a dense copy. */
static float *widen(const uint16_t *p, int rows, int cols, int ld) {
  float *out = malloc((size_t)rows * cols * sizeof(float) + 1);
  if (!out) return NULL;
  for (int i = 0; i < rows; i++) sh_bf16_to_f32_n(out + (size_t)i * cols, 1, p + (size_t)i * ld, 1, cols);
  return out;
}

/* c = alpha op(a) op(b) + beta c through sh_sgemm on widened copies (and an f32 copy of a
 * bf16 c, rounded back). */
static int gemm_widened(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                        const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, out c) {
  int ar = ta == CblasNoTrans ? m : k, ac = ta == CblasNoTrans ? k : m;
  int br = tb == CblasNoTrans ? k : n, bc = tb == CblasNoTrans ? n : k;
  float *af = widen(a, ar, ac, lda), *bf = widen(b, br, bc, ldb);
  float *cf = c.bf16 ? widen((const uint16_t *)c.p, m, n, c.ld) : (float *)c.p;
  int ok = af && bf && cf;
  if (ok) sh_sgemm(ta, tb, m, n, k, alpha, af, ac > 0 ? ac : 1, bf, bc > 0 ? bc : 1, beta, cf, c.bf16 ? n : c.ld);
  if (ok && c.bf16)
    for (int i = 0; i < m; i++) sh_f32_to_bf16_n((uint16_t *)out_at(c, i, 0), 1, cf + (size_t)i * n, 1, n);
  free(af);
  free(bf);
  if (c.bf16) free(cf);
  return ok ? SH_OK : sh_fail(SH_ERR_OOM, "gemm_bf16: no memory to widen [%d,%d] x [%d,%d] to f32", m, k, k, n);
}

/* ---- packing ------------------------------------------------------------------------------ */

/* An operand packed in blocks of w lanes (rows of op(a), MR a block, or columns of op(b), NR),
 * block t at dst + t * w * kp: kp k-pairs of w 32-bit lanes each, dst[q * w + r] holding
 * (x(t w + r, 2q) low, x(t w + r, 2q+1) high); lanes past the operand's last and the partner of
 * an odd k's last element are zero. Two layouts: k along the stored rows (a as is, b
 * transposed: a pair is one 32-bit word, and a block is a transpose of words) or k down the
 * stored columns (a transposed, b as is: a pair interleaves two stored rows). */

/* Block of lanes i0 .. i0+cnt, k along the rows: 16 rows of 16 words (k masked at its end,
 * rows past cnt zero) transposed into 16 k-pairs of 16 lanes at a time. */
BF16_TARGET static void pack_k_along(uint32_t *dst, int w, const uint16_t *x, int ld, int i0, int cnt, int k) {
  int kp = (k + 1) / 2;
  for (int r0 = 0; r0 < w; r0 += 16)
    for (int q0 = 0; q0 < kp; q0 += 16) {
      int left = k - 2 * q0, nq = kp - q0 < 16 ? kp - q0 : 16;
      __mmask32 mk = left >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
      __m512i in[16], out[16];
#pragma GCC unroll 16
      for (int j = 0; j < 16; j++)
        in[j] = r0 + j < cnt ? _mm512_maskz_loadu_epi16(mk, x + (size_t)(i0 + r0 + j) * ld + 2 * q0) : _mm512_setzero_si512();
      sh_transpose16(in, out);
      for (int q = 0; q < nq; q++) _mm512_mask_storeu_epi32(dst + (size_t)(q0 + q) * w + r0, sh_lanes_mask(w - r0), out[q]);
    }
}

/* Every block, k down the columns: pair by pair, so that the two stored rows of a pair are
 * read once, in order, for all the blocks (16 lanes at a time: lo | hi << 16). */
BF16_TARGET static void pack_k_down(uint32_t *dst, int w, const uint16_t *x, int ld, int lanes, int k) {
  int kp = (k + 1) / 2, blocks = (lanes + w - 1) / w;
  for (int q = 0; q < kp; q++) {
    const uint16_t *lo = x + (size_t)(2 * q) * ld, *hi = lo + ld;
    int pair = 2 * q + 1 < k;
    for (int t = 0; t < blocks; t++) {
      uint32_t *d = dst + ((size_t)t * kp + q) * w;
      for (int r = 0; r < w; r += 16) {
        __mmask16 m = sh_lanes_mask(lanes - t * w - r);
        __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + t * w + r));
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(pair ? m : 0, hi + t * w + r));
        _mm512_mask_storeu_epi32(d + r, sh_lanes_mask(w - r), _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
      }
    }
  }
}

/* All the blocks of w lanes of an operand with `lanes` lanes. */
BF16_TARGET static void pack(uint32_t *dst, int w, const uint16_t *x, int ld, int k_down, int lanes, int k) {
  if (k_down) { pack_k_down(dst, w, x, ld, lanes, k); return; }
  int kp = (k + 1) / 2;
  for (int i0 = 0; i0 < lanes; i0 += w) pack_k_along(dst + (size_t)i0 * kp, w, x, ld, i0, lanes - i0 < w ? lanes - i0 : w, k);
}

/* ---- the micro-kernel --------------------------------------------------------------------- */

/* One row of c's block, 16 columns under mask mk: v (+ beta times what is there), stored. */
BF16_TARGET static inline void store16(char *p, int bf16, __mmask16 mk, __m512 v, float beta) {
  if (!bf16) {
    if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mk, p), v);
    _mm512_mask_storeu_ps(p, mk, v);
    return;
  }
  if (beta != 0.0f) {
    v = _mm512_fmadd_ps(_mm512_set1_ps(beta), sh_bf16_to_f32_x16(_mm256_maskz_loadu_epi16(mk, p)), v);
  }
  _mm256_mask_storeu_epi16(p, mk, sh_f32_to_bf16_x16(v));
}

/* c[0:mr, 0:nr] = alpha * (a tile . b panel over kq pairs) + beta c; beta 0 never reads c. */
BF16_TARGET static void micro_kernel(int kq, const uint32_t *ap, const uint32_t *bp, out c, int mr, int nr,
                                     float alpha, float beta) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int q = 0; q < kq; q++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + (size_t)q * NR);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + (size_t)q * NR + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)q * MR + r]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  __mmask16 m0 = sh_lanes_mask(nr), m1 = sh_lanes_mask(nr - 16);
  __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < mr; r++) {
    store16(out_at(c, r, 0), c.bf16, m0, _mm512_mul_ps(acc[r][0], va), beta);
    store16(out_at(c, r, 16), c.bf16, m1, _mm512_mul_ps(acc[r][1], va), beta);
  }
}

/* ---- the blocked product ------------------------------------------------------------------ */

/* The product of one thread: packs its operands into the thread's scratch, then runs the
 * micro-kernel panel by panel (a panel's pack stays in cache across the row tiles). 0, or -1
 * when the scratch cannot be allocated. */
BF16_TARGET static int gemm_block(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const uint16_t *a,
                      int lda, const uint16_t *b, int ldb, float beta, out c) {
  int kp = (k + 1) / 2, mtiles = (m + MR - 1) / MR, npanels = (n + NR - 1) / NR;
  size_t na = (size_t)mtiles * MR * kp, nb = (size_t)npanels * NR * kp;
  uint32_t *ap = sh_gemm_scratch((na + nb) * sizeof(uint32_t)), *bp = ap + na;
  if (!ap) return -1;
  pack(ap, MR, a, lda, ta != CblasNoTrans, m, k);
  pack(bp, NR, b, ldb, tb == CblasNoTrans, n, k);
  for (int jp = 0; jp < npanels; jp++)
    for (int it = 0; it < mtiles; it++) {
      int mr = m - it * MR < MR ? m - it * MR : MR, nr = n - jp * NR < NR ? n - jp * NR : NR;
      micro_kernel(kp, ap + (size_t)it * MR * kp, bp + (size_t)jp * NR * kp,
                   (out){out_at(c, it * MR, jp * NR), c.ld, c.bf16}, mr, nr, alpha, beta);
    }
  return 0;
}

/* Split like sh_sgemm: the longer side of c in one block per thread (rows in multiples of MR,
 * columns of NR), each block a product of its own, so the threads meet only at the end
 * (every barrier costs a whole time slice on a shared machine). Each block packs the shared
 * operand again: k x n (or m x k) pairs, small beside its part of the product. */
typedef struct bf16_job {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k, lda, ldb, split_rows, len, chunk, parts;
  float alpha, beta;
  const uint16_t *a, *b;
  out c;
  _Atomic int failed;
} bf16_job;

static void bf16_task(void *arg, int t, int nt) {
  bf16_job *j = arg;
  for (int part = t; part < j->parts; part += nt) {
    int s = part * j->chunk, e = s + j->chunk < j->len ? s + j->chunk : j->len;
    int failed = j->split_rows
      ? gemm_block(j->ta, j->tb, e - s, j->n, j->k, j->alpha, j->ta == CblasNoTrans ? j->a + (size_t)s * j->lda : j->a + s,
                   j->lda, j->b, j->ldb, j->beta, (out){out_at(j->c, s, 0), j->c.ld, j->c.bf16})
      : gemm_block(j->ta, j->tb, j->m, e - s, j->k, j->alpha, j->a, j->lda,
                   j->tb == CblasNoTrans ? j->b + s : j->b + (size_t)s * j->ldb, j->ldb, j->beta,
                   (out){out_at(j->c, 0, s), j->c.ld, j->c.bf16});
    if (failed) atomic_store(&j->failed, 1);
  }
}

static int gemm_avx512(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, out c) {
  int threads = sh_parallel_inside() || (double)m * n * k < PAR_MIN_WORK ? 1 : sh_parallel_threads();
  int split_rows = m >= n, len = split_rows ? m : n, unit = split_rows ? MR : NR;
  int chunk = ((len + threads - 1) / threads + unit - 1) / unit * unit;
  int parts = (len + chunk - 1) / chunk;
  bf16_job job = { ta, tb, m, n, k, lda, ldb, split_rows, len, chunk, parts, alpha, beta, a, b, c, 0 };
  sh_parallel(parts, bf16_task, &job);
  return job.failed ? sh_fail(SH_ERR_OOM, "gemm_bf16: no memory to pack [%d,%d] x [%d,%d]", m, k, k, n) : SH_OK;
}

static int gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const uint16_t *a,
                int lda, const uint16_t *b, int ldb, float beta, out c) {
  if (m <= 0 || n <= 0) return SH_OK;
  if (k <= 0) {   /* an empty sum: c = beta c, and beta 0 defines c */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        char *e = out_at(c, i, j);
        float v = beta == 0.0f ? 0.0f : beta * (c.bf16 ? sh_bf16_to_f32(*(uint16_t *)e) : *(float *)e);
        if (c.bf16) *(uint16_t *)e = sh_f32_to_bf16(v);
        else *(float *)e = v;
      }
    return SH_OK;
  }
  if (use_avx512_bf16()) return gemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c);
  return gemm_widened(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c);
}

int sh_gemm_bf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, (out){(char *)c, ldc, 0});
}

int sh_gemm_bf16_out16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, uint16_t *c, int ldc) {
  return gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, (out){(char *)c, ldc, 1});
}
