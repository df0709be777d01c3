/* gemm_bf16.c: c = alpha op(a) op(b) + beta c with a and b in bf16 and c in f32, on the CPU.
 *
 * With AVX-512 BF16 (vdpbf16ps; checked at run time, so the build and the machine may
 * differ) the products are exact in f32 and summed in f32: op(b) is packed once per call
 * into panels of NR columns where each k-pair of a column sits as one 32-bit lane (the
 * layout vdpbf16ps reads), op(a) into tiles of MR rows of k-pairs; a micro-kernel keeps an
 * MR x NR block of c in 24 zmm accumulators. OpenMP spreads (panel, row block) tasks over
 * the threads other kernels use (omp_get_max_threads), or runs on the calling thread inside
 * a parallel region. Tails in m, n and odd k are zero-padded in the packs and masked at the
 * store.
 * Without the instructions, or with SHARD_CPU_BF16=0 in the environment, a and b are
 * widened to f32 and go through sh_sgemm (the same products, summed by OpenBLAS); a
 * one-line notice says so, once. */
#include "blas_internal.h"
#include "dtype.h"
#include "status_internal.h"
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MR rows x NR columns of c per micro-kernel call; KB k-pairs per pass over a panel (its
 * packed slice, KB * NR * 4 bytes = 16 KiB, stays in L1 across MB row tiles). */
enum { MR = 12, NR = 32, KB = 128, MB = 8, PAR_MIN_WORK = 1 << 18 };

#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* ---- choosing the path ------------------------------------------------------------------ */

static int cpu_has_bf16;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static void detect(void) {
  __builtin_cpu_init();
  cpu_has_bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
}

static void notice_once(int *said, const char *why) {
  if (__atomic_exchange_n(said, 1, __ATOMIC_RELAXED)) return;
  fprintf(stderr, "shard: %s: bf16 matrix products on the CPU widen to f32 and run through OpenBLAS\n", why);
}

int sh_cpu_bf16_available(void) {
  pthread_once(&detect_once, detect);
  return cpu_has_bf16;
}

/* The environment is read on every call (a few hundred ns beside a GEMM) so that a test can
 * run both paths in one process. */
static int use_avx512_bf16(void) {
  static int said_env, said_cpu;
  const char *env = getenv("SHARD_CPU_BF16");
  if (env && strcmp(env, "0") == 0) { notice_once(&said_env, "SHARD_CPU_BF16=0"); return 0; }
  if (sh_cpu_bf16_available()) return 1;
  notice_once(&said_cpu, "this CPU has no AVX-512 BF16 (vdpbf16ps)");
  return 0;
}

/* ---- fallback: widen to f32, then sh_sgemm ------------------------------------------------ */

/* The rows x cols matrix stored at p with leading dimension ld, widened into a dense copy. */
static float *widen(const uint16_t *p, int rows, int cols, int ld) {
  float *out = malloc((size_t)rows * cols * sizeof(float) + 1);
  if (!out) return NULL;
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) out[(size_t)i * cols + j] = sh_bf16_to_f32(p[(size_t)i * ld + j]);
  return out;
}

static int gemm_widened(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                        const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  int ar = ta == CblasNoTrans ? m : k, ac = ta == CblasNoTrans ? k : m;
  int br = tb == CblasNoTrans ? k : n, bc = tb == CblasNoTrans ? n : k;
  float *af = widen(a, ar, ac, lda), *bf = widen(b, br, bc, ldb);
  int ok = af && bf;
  if (ok) sh_sgemm(ta, tb, m, n, k, alpha, af, ac > 0 ? ac : 1, bf, bc > 0 ? bc : 1, beta, c, ldc);
  free(af);
  free(bf);
  return ok ? SH_OK : sh_fail(SH_ERR_OOM, "gemm_bf16: no memory to widen [%d,%d] x [%d,%d] to f32", m, k, k, n);
}

/* ---- packing ------------------------------------------------------------------------------ */

/* element (i, p) of op(x) */
static inline uint16_t at(const uint16_t *x, int ld, CBLAS_TRANSPOSE t, int i, int p) {
  return t == CblasNoTrans ? x[(size_t)i * ld + p] : x[(size_t)p * ld + i];
}

/* Row tile it of op(a): for each k-pair q, MR lanes (a[r][2q] low, a[r][2q+1] high); rows
 * past m and the odd k's partner are zero. */
static void pack_a_tile(uint32_t *dst, const uint16_t *a, int lda, CBLAS_TRANSPOSE ta, int m, int k, int it) {
  int kp = (k + 1) / 2;
  for (int r = 0; r < MR; r++) {
    int i = it * MR + r;
    for (int q = 0; q < kp; q++) {
      uint32_t lo = 0, hi = 0;
      if (i < m) {
        lo = at(a, lda, ta, i, 2 * q);
        if (2 * q + 1 < k) hi = at(a, lda, ta, i, 2 * q + 1);
      }
      dst[(size_t)q * MR + r] = lo | hi << 16;
    }
  }
}

/* Column panel jp of op(b): for each k-pair q, NR lanes (b[2q][j] low, b[2q+1][j] high). */
static void pack_b_panel(uint32_t *dst, const uint16_t *b, int ldb, CBLAS_TRANSPOSE tb, int n, int k, int jp) {
  int kp = (k + 1) / 2;
  for (int q = 0; q < kp; q++)
    for (int jj = 0; jj < NR; jj++) {
      int j = jp * NR + jj;
      uint32_t lo = 0, hi = 0;
      if (j < n) {
        lo = at(b, ldb, tb, 2 * q, j);
        if (2 * q + 1 < k) hi = at(b, ldb, tb, 2 * q + 1, j);
      }
      dst[(size_t)q * NR + jj] = lo | hi << 16;
    }
}

/* ---- the micro-kernel --------------------------------------------------------------------- */

static inline __mmask16 cols_mask(int cols) {
  return cols >= 16 ? (__mmask16)0xFFFF : cols <= 0 ? 0 : (__mmask16)((1u << cols) - 1);
}

/* c[0:mr, 0:nr] = alpha * (a tile . b panel over kq pairs) + beta c; beta 0 never reads c. */
BF16_TARGET static void micro_kernel(int kq, const uint32_t *ap, const uint32_t *bp, float *c, int ldc, int mr,
                                     int nr, float alpha, float beta) {
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
  __mmask16 m0 = cols_mask(nr), m1 = cols_mask(nr - 16);
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < mr; r++) {
    float *row = c + (size_t)r * ldc;
    __m512 v0 = _mm512_mul_ps(acc[r][0], va), v1 = _mm512_mul_ps(acc[r][1], va);
    if (beta != 0.0f) {
      v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), v0);
      v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), v1);
    }
    _mm512_mask_storeu_ps(row, m0, v0);
    _mm512_mask_storeu_ps(row + 16, m1, v1);
  }
}

/* ---- the blocked product ------------------------------------------------------------------ */

typedef struct plan {
  int m, n, k, kp, mtiles, npanels, mblocks, ldc;
  const uint32_t *ap, *bp;
  float *c, alpha, beta;
} plan;

/* Task t: panel t % npanels, row block t / npanels (MB row tiles); over k in KB-pair slices,
 * the first applying beta and the rest adding. */
static void run_task(const plan *p, int t) {
  int jp = t % p->npanels, ib = t / p->npanels;
  int it0 = ib * MB, it1 = it0 + MB < p->mtiles ? it0 + MB : p->mtiles;
  int nr = p->n - jp * NR < NR ? p->n - jp * NR : NR;
  for (int q0 = 0; q0 < p->kp; q0 += KB) {
    int kq = p->kp - q0 < KB ? p->kp - q0 : KB;
    float beta = q0 == 0 ? p->beta : 1.0f;
    const uint32_t *bp = p->bp + ((size_t)jp * p->kp + q0) * NR;
    for (int it = it0; it < it1; it++) {
      int mr = p->m - it * MR < MR ? p->m - it * MR : MR;
      const uint32_t *ap = p->ap + ((size_t)it * p->kp + q0) * MR;
      micro_kernel(kq, ap, bp, p->c + (size_t)it * MR * p->ldc + (size_t)jp * NR, p->ldc, mr, nr, p->alpha, beta);
    }
  }
}

static int gemm_avx512(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  plan p = {.m = m, .n = n, .k = k, .kp = (k + 1) / 2, .mtiles = (m + MR - 1) / MR,
            .npanels = (n + NR - 1) / NR, .ldc = ldc, .c = c, .alpha = alpha, .beta = beta};
  p.mblocks = (p.mtiles + MB - 1) / MB;
  uint32_t *ap = malloc((size_t)p.mtiles * MR * p.kp * sizeof(uint32_t));
  uint32_t *bp = malloc((size_t)p.npanels * NR * p.kp * sizeof(uint32_t));
  if (!ap || !bp) {
    free(ap);
    free(bp);
    return sh_fail(SH_ERR_OOM, "gemm_bf16: no memory to pack [%d,%d] x [%d,%d]", m, k, k, n);
  }
  p.ap = ap;
  p.bp = bp;
  int threads = omp_in_parallel() || (double)m * n * k < PAR_MIN_WORK ? 1 : omp_get_max_threads();
  int tasks = p.npanels * p.mblocks;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int it = 0; it < p.mtiles; it++) pack_a_tile(ap + (size_t)it * MR * p.kp, a, lda, ta, m, k, it);
#pragma omp for schedule(static)
    for (int jp = 0; jp < p.npanels; jp++) pack_b_panel(bp + (size_t)jp * NR * p.kp, b, ldb, tb, n, k, jp);
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < tasks; t++) run_task(&p, t);
  }
  free(ap);
  free(bp);
  return SH_OK;
}

int sh_gemm_bf16(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return SH_OK;
  if (k <= 0) {   /* an empty sum: c = beta c, and beta 0 defines c */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
    return SH_OK;
  }
  if (use_avx512_bf16()) return gemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return gemm_widened(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
