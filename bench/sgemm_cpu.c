/* sgemm_cpu.c: the CPU f32 GEMM (sh_sgemm: the thread team's split of runtime/cpu/sgemm.c's
 * kernel of the kernel set in use: SHARD_CPU_ISA=avx2 for its AVX2 one) beside the same split
 * of OpenBLAS (the generic CPU kernel set, cpu.h; OPENBLAS_CORETYPE=Haswell for its AVX2
 * kernels), on the products of a training step of the CPU benchmark's model (GPT: n_embd
 * 128, 12 x 64 tokens; y = x W^T,
 * dx = dy W, dW += dy^T x for c_attn, c_proj, c_fc, the MLP's projection and the head), and a
 * few others. Prints GFLOP/s of each path, the best of 7 rounds of >= 30 ms (the paths
 * alternate within a round), at the team's size (OMP_NUM_THREADS). With the argument `cold`,
 * each timed call runs alone after 96 MiB of other memory has been written, so its operands
 * come from memory (best of 15 calls): the case of a model whose activations outgrow the
 * caches. With `cpu` (one thread), the clock is the thread's CPU time: on a machine shared
 * with other jobs a round is not stretched by the time they take the core from it. Not a test.
 * Build and run (from the repository root): make build/bench/sgemm_cpu && OMP_NUM_THREADS=1 build/bench/sgemm_cpu [cpu] && build/bench/sgemm_cpu [cold] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu/blas_internal.h"
#include "cpu/cpu.h"
#include "core/parallel.h"

static clockid_t clock_id = CLOCK_MONOTONIC;   /* CLOCK_THREAD_CPUTIME_ID with `cpu` */

static double now(void) {
  struct timespec ts;
  clock_gettime(clock_id, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *random_floats(size_t n) {
  float *p = malloc(sizeof(float) * n + 64);
  for (size_t i = 0; i < n; i++) p[i] = (float)rand() / RAND_MAX - 0.5f;
  return p;
}

enum { FLUSH_BYTES = 96 << 20 };
static char *flush_buf;   /* cold: written before each call, pushing the operands out of the caches */
static int own_set;       /* the kernel set in use at the start, whose kernel the shard column runs */

/* Seconds per call of one path: >= 30 ms of back-to-back calls, or one call after a flush. */
static double time_path(int own, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float *a,
                        int lda, const float *b, int ldb, float beta, float *c) {
  sh_cpu_set_isa(own ? own_set : SH_CPU_GENERIC);
  if (flush_buf) {
    for (size_t i = 0; i < FLUSH_BYTES; i += 64) flush_buf[i]++;
    double t0 = now();
    sh_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    return now() - t0;
  }
  int calls = 0;
  double t0 = now(), t;
  do {
    sh_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    calls++;
  } while ((t = now() - t0) < 0.03);
  return t / calls;
}

static void shape(const char *name, int ta, int tb, int m, int n, int k, float beta) {
  CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
  int lda = ta ? m : k, ldb = tb ? k : n;
  float *a = random_floats((size_t)m * k), *b = random_floats((size_t)k * n), *c = random_floats((size_t)m * n);
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < (flush_buf ? 15 : 7); round++)
    for (int own = 0; own < 2; own++) {
      double s = time_path(own, tra, trb, m, n, k, a, lda, b, ldb, beta, c);
      if (s < best[own]) best[own] = s;
    }
  double flop = 2.0 * m * n * k;
  printf("%-22s m %4d n %4d k %4d   OpenBLAS %6.1f   shard %6.1f GFLOP/s   %+5.1f%%\n", name, m, n, k,
         flop / best[0] * 1e-9, flop / best[1] * 1e-9, (best[0] / best[1] - 1) * 100);
  free(a); free(b); free(c);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "cold") == 0) {
    flush_buf = malloc(FLUSH_BYTES);
    memset(flush_buf, 1, FLUSH_BYTES);
  }
  if (argc > 1 && strcmp(argv[1], "cpu") == 0) {
    if (sh_parallel_threads() != 1) {
      fprintf(stderr, "sgemm_cpu cpu: the thread's CPU time times one thread only (OMP_NUM_THREADS=1)\n");
      return 2;
    }
    clock_id = CLOCK_THREAD_CPUTIME_ID;
  }
  own_set = sh_cpu_isa();
  if (!sh_sgemm_kernel_of(own_set))
    printf("kernel set %s has no GEMM of shard's own: both columns are OpenBLAS\n", sh_cpu_isa_name(own_set));
  printf("kernel set %s, threads %d%s%s\n", sh_cpu_isa_name(own_set), sh_parallel_threads(),
         flush_buf ? ", cold operands" : "", clock_id == CLOCK_MONOTONIC ? "" : ", thread CPU time");
  enum { ROWS = 12 * 64 };
  static const struct { const char *name; int in, out; } layers[] = {
    {"c_attn 128->384", 128, 384}, {"c_proj 128->128", 128, 128}, {"c_fc 128->512", 128, 512},
    {"mlp proj 512->128", 512, 128}, {"lm_head 128->65", 128, 65}};
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
    int in = layers[i].in, out = layers[i].out;
    printf("%s\n", layers[i].name);
    shape("  y = x W^T", 0, 1, ROWS, out, in, 0.0f);
    shape("  dx = dy W", 0, 0, ROWS, in, out, 0.0f);
    shape("  dW += dy^T x", 1, 0, out, in, ROWS, 1.0f);
  }
  printf("others\n");
  shape("  GPT-2 c_attn fwd", 0, 1, 1024, 2304, 768, 0.0f);
  shape("  GPT-2 c_fc dW", 1, 0, 3072, 768, 1024, 1.0f);
  shape("  odd sizes", 0, 0, 100, 77, 333, 0.5f);
  return 0;
}
