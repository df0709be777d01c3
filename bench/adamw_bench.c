/* adamw_bench.c: shard's CPU AdamW step (optim.h, sh_adamw_step_multi_) over the parameters of
 * GPT-2 124M: the 148 tensors of 12 layers, n_embd 768, vocab 50304, block 1024, tied head
 * (124,475,904 elements; bench/adamw_torch.py builds the same list for PyTorch). Threads:
 * OMP_NUM_THREADS. After two untimed steps, times ITERS steps and prints the best one (the
 * machine may be shared: the best step is the least disturbed):
 *   step_ms T, params_per_s N, bytes_per_step B, gb_per_s G
 * bytes_per_step is what one pass must move: param, grad, m, v read and param, m, v written
 * (grad and shadow at their dtype's size), so gb_per_s sits against the machine's bandwidth
 * (bench/adamw_membw.c).
 *   adamw_bench [ITERS=10] [GRAD=f32|bf16] [SHADOW=none|bf16]
 * Built by make bench-adamw against the runtime's objects. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtype.h"
#include "optim.h"
#include "status.h"
#include "tensor.h"

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

static int dtype_arg(const char *s, const char *name, int none_ok) {
  if (!strcmp(s, "f32")) return SH_F32;
  if (!strcmp(s, "bf16")) return SH_BF16;
  if (none_ok && !strcmp(s, "none")) return -1;
  fprintf(stderr, "adamw_bench: %s must be f32%s or bf16, not '%s'\n", name, none_ok ? ", none" : "", s);
  exit(2);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 10;
  int grad_dtype = dtype_arg(argc > 2 ? argv[2] : "f32", "GRAD", 0);
  int shadow_dtype = dtype_arg(argc > 3 ? argv[3] : "none", "SHADOW", 1);
  if (iters < 1 || iters > 100000) { fprintf(stderr, "adamw_bench: ITERS must be 1 to 100000\n"); return 2; }
  int64_t sizes[NT], total = gpt2_sizes(sizes);
  sh_adamw_param ps[NT];
  for (int i = 0; i < NT; i++) {
    ps[i] = (sh_adamw_param){
      .param = filled(sizes[i], SH_F32, 1, 4 * i + 1), .grad = filled(sizes[i], grad_dtype, 1e-2, 4 * i + 2),
      .m = filled(sizes[i], SH_F32, 0, 0), .v = filled(sizes[i], SH_F32, 0, 0),
      .shadow = shadow_dtype < 0 ? NULL : filled(sizes[i], shadow_dtype, 0, 0), .weight_decay = 0.1,
    };
  }
  double best = 1e30;
  for (int it = -2; it < iters; it++) {   /* two untimed steps: pages, threads, state */
    double t0 = now();
    if (sh_adamw_step_multi_(NT, ps, 6e-4, 0.9, 0.95, 1e-8, it + 3, 1.0)) die("adamw step");
    double dt = now() - t0;
    if (it >= 0 && dt < best) best = dt;
  }
  int64_t gsize = grad_dtype == SH_F32 ? 4 : 2, ssize = shadow_dtype < 0 ? 0 : 2;
  double bytes = (double)total * (4 * 3 * 2 + gsize + ssize);
  printf("params %lld\ntensors %d\nstep_ms %.2f\nparams_per_s %.4g\nbytes_per_step %.0f\ngb_per_s %.2f\n",
         (long long)total, NT, best * 1e3, total / best, bytes, bytes / best / 1e9);
  for (int i = 0; i < NT; i++) {
    sh_tensor_destroy(ps[i].param); sh_tensor_destroy((sh_tensor *)ps[i].grad);
    sh_tensor_destroy(ps[i].m); sh_tensor_destroy(ps[i].v); sh_tensor_destroy(ps[i].shadow);
  }
  return 0;
}
