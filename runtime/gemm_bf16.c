/* gemm_bf16.c: c = alpha op(a) op(b) + beta c with a and b in bf16 and c in f32, on the CPU.
 *
 * With AVX-512 BF16 (vdpbf16ps; checked at run time, so the build and the machine may
 * differ) the products are exact in f32 and summed in f32: op(b) is packed once per call
 * (per thread's block of c) into panels of NR columns where each k-pair of a column sits as one 32-bit lane (the
 * layout vdpbf16ps reads), op(a) into tiles of MR rows of k-pairs; a micro-kernel keeps an
 * MR x NR block of c in 24 zmm accumulators. OpenMP splits c into one block per thread (the
 * threads other kernels use, omp_get_max_threads), or the calling thread does it all inside a
 * parallel region. Tails in m, n and odd k are zero-padded in the packs and masked at the
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

/* A block of w lanes (rows of op(a) or columns of op(b)) i0 .. i0+cnt of an operand, packed as
 * kp k-pairs of w 32-bit lanes each: dst[q * w + r] holds (x(i0+r, 2q) low, x(i0+r, 2q+1)
 * high); lanes past cnt and the partner of an odd k's last element are zero. Two layouts:
 * k along the stored rows (a as is, b transposed: a pair is one 32-bit word) or k down the
 * stored columns (a transposed, b as is: a pair interleaves two stored rows). */
static void pack_k_along(uint32_t *dst, int w, const uint16_t *x, int ld, int i0, int cnt, int k) {
  int kp = (k + 1) / 2, whole = k / 2;
  memset(dst, 0, sizeof(uint32_t) * (size_t)kp * w);
  for (int r = 0; r < cnt; r++) {
    const uint16_t *row = x + (size_t)(i0 + r) * ld;
    for (int q = 0; q < whole; q++) memcpy(dst + (size_t)q * w + r, row + 2 * q, sizeof(uint32_t));
    if (k & 1) dst[(size_t)whole * w + r] = row[k - 1];
  }
}

static void pack_k_down(uint32_t *dst, int w, const uint16_t *x, int ld, int i0, int cnt, int k) {
  int kp = (k + 1) / 2;
  for (int q = 0; q < kp; q++) {
    const uint16_t *lo = x + (size_t)(2 * q) * ld + i0, *hi = lo + ld;
    uint32_t *d = dst + (size_t)q * w;
    if (2 * q + 1 < k)
      for (int r = 0; r < cnt; r++) d[r] = (uint32_t)lo[r] | (uint32_t)hi[r] << 16;
    else
      for (int r = 0; r < cnt; r++) d[r] = lo[r];
    for (int r = cnt; r < w; r++) d[r] = 0;
  }
}

/* Row tile it of op(a) (MR lanes) or column panel jp of op(b) (NR lanes). */
static void pack_a_tile(uint32_t *dst, const uint16_t *a, int lda, CBLAS_TRANSPOSE ta, int m, int k, int it) {
  int i0 = it * MR, cnt = m - i0 < MR ? m - i0 : MR;
  if (ta == CblasNoTrans) pack_k_along(dst, MR, a, lda, i0, cnt, k);
  else pack_k_down(dst, MR, a, lda, i0, cnt, k);
}

static void pack_b_panel(uint32_t *dst, const uint16_t *b, int ldb, CBLAS_TRANSPOSE tb, int n, int k, int jp) {
  int j0 = jp * NR, cnt = n - j0 < NR ? n - j0 : NR;
  if (tb == CblasNoTrans) pack_k_down(dst, NR, b, ldb, j0, cnt, k);
  else pack_k_along(dst, NR, b, ldb, j0, cnt, k);
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

/* The calling thread's packing buffer, grown as needed and kept: a fresh allocation of this
 * size per call is an mmap, and its page faults cost as much as a small product. */
static uint32_t *scratch(size_t words) {
  static __thread uint32_t *buf;
  static __thread size_t cap;
  if (words <= cap) return buf;
  free(buf);
  cap = 0;
  buf = aligned_alloc(64, (words * sizeof(uint32_t) + 63) / 64 * 64);
  if (buf) cap = words;
  return buf;
}

/* The product of one thread: packs its operands into the thread's scratch, then runs the
 * (panel, row block) tasks in order. 0, or -1 when the scratch cannot be allocated. */
static int gemm_block(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const uint16_t *a,
                      int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  plan p = {.m = m, .n = n, .k = k, .kp = (k + 1) / 2, .mtiles = (m + MR - 1) / MR,
            .npanels = (n + NR - 1) / NR, .ldc = ldc, .c = c, .alpha = alpha, .beta = beta};
  p.mblocks = (p.mtiles + MB - 1) / MB;
  size_t na = (size_t)p.mtiles * MR * p.kp, nb = (size_t)p.npanels * NR * p.kp;
  uint32_t *ap = scratch(na + nb), *bp = ap + na;
  if (!ap) return -1;
  for (int it = 0; it < p.mtiles; it++) pack_a_tile(ap + (size_t)it * MR * p.kp, a, lda, ta, m, k, it);
  for (int jp = 0; jp < p.npanels; jp++) pack_b_panel(bp + (size_t)jp * NR * p.kp, b, ldb, tb, n, k, jp);
  p.ap = ap;
  p.bp = bp;
  for (int t = 0; t < p.npanels * p.mblocks; t++) run_task(&p, t);
  return 0;
}

/* Split like sh_sgemm: the longer side of c in one block per thread (rows in multiples of MR,
 * columns of NR), each block a product of its own, so the threads meet only at the end
 * (every barrier costs a whole time slice on a shared machine). Each block packs the shared
 * operand again: k x n (or m x k) pairs, small beside its part of the product. */
static int gemm_avx512(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
  int threads = omp_in_parallel() || (double)m * n * k < PAR_MIN_WORK ? 1 : omp_get_max_threads();
  int split_rows = m >= n, len = split_rows ? m : n, unit = split_rows ? MR : NR;
  int chunk = ((len + threads - 1) / threads + unit - 1) / unit * unit;
  int parts = (len + chunk - 1) / chunk, failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static, 1) reduction(| : failed)
  for (int part = 0; part < parts; part++) {
    int s = part * chunk, e = s + chunk < len ? s + chunk : len;
    if (split_rows)
      failed |= gemm_block(ta, tb, e - s, n, k, alpha, ta == CblasNoTrans ? a + (size_t)s * lda : a + s, lda, b, ldb,
                           beta, c + (size_t)s * ldc, ldc);
    else
      failed |= gemm_block(ta, tb, m, e - s, k, alpha, a, lda, tb == CblasNoTrans ? b + s : b + (size_t)s * ldb, ldb,
                           beta, c + s, ldc);
  }
  return failed ? sh_fail(SH_ERR_OOM, "gemm_bf16: no memory to pack [%d,%d] x [%d,%d]", m, k, k, n) : SH_OK;
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
