/* adamw_bench.c: shard's CPU AdamW step (optim.h, sh_adamw_step_multi_) over the parameters of
 * GPT-2 124M: the 148 tensors of 12 layers, n_embd 768, vocab 50304, block 1024, tied head
 * (124,475,904 elements; bench/adamw_torch.py builds the same list for PyTorch). Threads:
 * each count of the list THREADS in turn. Two settings: f32 (f32 grads, no shadow: what
 * PyTorch's AdamW does) and bf16 (bf16 grads and a bf16 shadow written in the same pass: the
 * mixed-precision step). For each, after one untimed step, times ITERS steps at each thread
 * count T and prints the best one (the machine may be shared: the best step is the least
 * disturbed):  step_ms_Tt_S, params_per_s_Tt_S, bytes_per_step_S, gb_per_s_Tt_S
 * bytes_per_step is what one pass must move: param, grad, m, v read and param, m, v and the
 * shadow written, at their dtypes' sizes, so gb_per_s sits against the machine's bandwidth
 * (bench/adamw_membw.c).
 *   adamw_bench [ITERS=5] [THREADS=1]      e.g. adamw_bench 5 1,2
 * Built by make bench-adamw against the runtime's objects. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "core/parallel.h"
#include "core/dtype.h"
#include "ops/optim.h"
#include "core/status.h"
#include "core/tensor.h"

enum { LAYERS = 12, EMBD = 768, VOCAB = 50304, BLOCK = 1024, PER_LAYER = 12, NT = 2 + LAYERS * PER_LAYER + 2 };

/* The element counts of GPT-2 124M's tensors in the model's order; returns their total. */
static int64_t gpt2_sizes(int64_t *sizes) {
  const int64_t c = EMBD;
  const int64_t layer[PER_LAYER] = {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c};
  int k = 0;
  sizes[k++] = (int64_t)VOCAB * c;
  sizes[k++] = (int64_t)BLOCK * c;
  for (int l = 0; l < LAYERS; l++)
    for (int j = 0; j < PER_LAYER; j++) sizes[k++] = layer[j];
  sizes[k++] = c;
  sizes[k++] = c;
  int64_t total = 0;
  for (int i = 0; i < k; i++) total += sizes[i];
  return total;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
  fprintf(stderr, "adamw_bench: %s: %s\n", what, sh_last_error());
  exit(1);
}

/* A tensor of n elements of dtype, filled with values in [-scale, scale) from `seed`
 * (written through the runtime, so the pages are touched before the timing). */
static sh_tensor *filled(int64_t n, int dtype, double scale, unsigned seed) {
  sh_tensor *t = NULL;
  if (sh_tensor_empty(&t, 1, &n, dtype, -1)) die("allocating a tensor");
  if (scale == 0) {
    if (sh_tensor_fill_(t, 0)) die("zeroing a tensor");
    return t;
  }
  float *f = malloc((size_t)n * sizeof *f);
  if (!f) { fprintf(stderr, "adamw_bench: out of memory\n"); exit(1); }
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    f[i] = (float)(scale * ((double)(x >> 8) / (1 << 24) * 2 - 1));
  }
  sh_tensor *src = NULL;
  if (sh_tensor_wrap_external(&src, f, n * (int64_t)sizeof *f, 1, &n, SH_F32) || sh_tensor_copy_(t, src))
    die("filling a tensor");
  sh_tensor_destroy(src);
  free(f);
  return t;
}

/* The thread counts of a list "1,2,...": each 1 to 1024, at most 16 of them; returns how many. */
static int thread_list(const char *s, int *out) {
  int k = 0;
  for (const char *c = s; *c;) {
    char *end;
    long t = strtol(c, &end, 10);
    if (end == c || t < 1 || t > 1024 || k == 16 || (*end && *end != ',')) {
      fprintf(stderr, "adamw_bench: THREADS must be a list like 1,2 of counts from 1 to 1024, not '%s'\n", s);
      exit(2);
    }
    out[k++] = (int)t;
    c = *end ? end + 1 : end;
  }
  return k;
}

/* The group's buffers: f32 grads, or bf16 grads and bf16 shadows (mixed precision). */
static void make_params(sh_adamw_param *ps, const int64_t *sizes, int mixed) {
  for (int i = 0; i < NT; i++) {
    ps[i] = (sh_adamw_param){
      .param = filled(sizes[i], SH_F32, 1, 4 * i + 1), .grad = filled(sizes[i], mixed ? SH_BF16 : SH_F32, 1e-2, 4 * i + 2),
      .m = filled(sizes[i], SH_F32, 0, 0), .v = filled(sizes[i], SH_F32, 0, 0),
      .shadow = mixed ? filled(sizes[i], SH_BF16, 0, 0) : NULL, .weight_decay = 0.1,
    };
  }
}

static void free_params(sh_adamw_param *ps) {
  for (int i = 0; i < NT; i++) {
    sh_tensor_destroy(ps[i].param); sh_tensor_destroy((sh_tensor *)ps[i].grad);
    sh_tensor_destroy(ps[i].m); sh_tensor_destroy(ps[i].v); sh_tensor_destroy(ps[i].shadow);
  }
}

/* The best of iters timed steps after one untimed one, in seconds. */
static double best_step(sh_adamw_param *ps, int iters, int64_t *step) {
  double best = 1e30;
  for (int it = -1; it < iters; it++) {
    double t0 = now();
    if (sh_adamw_step_multi_(NT, ps, 6e-4, 0.9, 0.95, 1e-8, ++*step, 1.0)) die("adamw step");
    double dt = now() - t0;
    if (it >= 0 && dt < best) best = dt;
  }
  return best;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 5, threads[16];
  int nthreads = thread_list(argc > 2 ? argv[2] : "1", threads);
  if (iters < 1 || iters > 100000) { fprintf(stderr, "adamw_bench: ITERS must be 1 to 100000\n"); return 2; }
  int64_t sizes[NT], total = gpt2_sizes(sizes);
  printf("params %lld\ntensors %d\n", (long long)total, NT);
  for (int mixed = 0; mixed <= 1; mixed++) {
    sh_adamw_param ps[NT];
    make_params(ps, sizes, mixed);
    int64_t step = 0;
    double bytes = (double)total * (4 * 3 * 2 + (mixed ? 2 + 2 : 4));
    const char *name = mixed ? "bf16" : "f32";
    for (int k = 0; k < nthreads; k++) {
      sh_parallel_set_threads(threads[k]);
      double best = best_step(ps, iters, &step);
      printf("step_ms_%dt_%s %.2f\nparams_per_s_%dt_%s %.4g\nbytes_per_step_%s %.0f\ngb_per_s_%dt_%s %.2f\n", threads[k], name,
             best * 1e3, threads[k], name, total / best, name, bytes, threads[k], name, bytes / best / 1e9);
      fflush(stdout);
    }
    free_params(ps);
  }
  return 0;
}
