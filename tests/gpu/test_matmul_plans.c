/* test_matmul_plans.c (make test-gpu; the emulated device in make test): kernels/matmul.cu's
 * cuBLASLt plans. A product's descriptor, layouts and algorithm are made on its first call and
 * reused: a second identical call creates no descriptor, layout or preference and queries no
 * heuristic; products that differ in shape, layout, dtype, transposes or epilogue get plans of
 * their own, each giving the CPU backend's result; a plan whose epilogue the library refused
 * at run time keeps falling back; and the cache stays bounded over a sweep of shapes. The
 * counts are the emulated cuBLASLt's (tests/cuda_emu/cublaslt.cpp, weak here): on a real GPU
 * only the results are checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/status_internal.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops/nn.h"
#include "core/cuda.h"
#include "gpu_test.h"

#define S(...) (int64_t[]){__VA_ARGS__}

extern void sh_emu_lt_counts(long out[6]) __attribute__((weak));
extern void sh_emu_lt_counts_reset(void) __attribute__((weak));
enum { LT_DESCS, LT_LAYOUTS, LT_PREFS, LT_HEURISTICS, LT_DESTROYED, LT_MATMULS };

enum { DEV = 0, PLAN_CAP = 128 };

static int counting(void) { return sh_emu_lt_counts != NULL; }

static long made_since_reset(void) {
  long c[6];
  sh_emu_lt_counts(c);
  return c[LT_DESCS] + c[LT_LAYOUTS] + c[LT_PREFS] + c[LT_HEURISTICS];
}

/* The largest |cuda - cpu| / (1 + |cpu|); NaN counts as the worst. */
static double max_rel_diff(const sh_tensor *cuda, const sh_tensor *cpu) {
  int64_t n = sh_tensor_numel(cpu);
  sh_tensor *h = NULL, *c = NULL;
  double *a = malloc(sizeof(double) * (size_t)(n + 1)), *b = malloc(sizeof(double) * (size_t)(n + 1)), worst = 0;
  if (!a || !b || sh_tensor_to(&h, cuda, SH_F64, -1) || sh_tensor_to(&c, cpu, SH_F64, -1) || sh_tensor_read_f64(h, a) ||
      sh_tensor_read_f64(c, b) || sh_tensor_numel(cuda) != n)
    worst = INFINITY;
  for (int64_t i = 0; worst < INFINITY && i < n; i++) {
    double d = fabs(a[i] - b[i]) / (1 + fabs(b[i]));
    if (!(d <= worst)) worst = d;
  }
  sh_tensor_destroy(h);
  sh_tensor_destroy(c);
  free(a);
  free(b);
  return worst;
}

/* One kind of product: run(dev, in, out) computes out[0..nout) from in[0..nin) on dev. */
typedef struct product {
  const char *name;
  int nin, nout;
  int64_t shapes[4][4];
  int ndims[4];
  int dtype;
  double tol;
  int (*run)(sh_tensor **in, sh_tensor **out);
} product;

static int run_linear_bias(sh_tensor **in, sh_tensor **out) { return sh_linear_forward(&out[0], in[0], in[1], in[2]); }
static int run_linear_plain(sh_tensor **in, sh_tensor **out) { return sh_linear_forward(&out[0], in[0], in[1], NULL); }
static int run_linear_gelu(sh_tensor **in, sh_tensor **out) { return sh_linear_gelu_forward(&out[0], &out[1], in[0], in[1], in[2]); }
static int run_matmul(sh_tensor **in, sh_tensor **out) { return sh_matmul(&out[0], in[0], in[1]); }

/* dx, dw and db of y = x w^T + b (dw and db made here, set by the product: BGRADB). */
static int run_linear_backward(sh_tensor **in, sh_tensor **out) {
  const sh_tensor *x = in[0], *w = in[1], *dy = in[2];
  SH_TRY(sh_tensor_empty(&out[1], 2, w->shape, w->dtype, w->device));
  SH_TRY(sh_tensor_fill_(out[1], 0.0));
  SH_TRY(sh_tensor_empty(&out[2], 1, S(w->shape[0]), w->dtype, w->device));
  SH_TRY(sh_tensor_fill_(out[2], 0.0));
  return sh_linear_backward(&out[0], out[1], out[2], dy, x, w);
}

/* c = 0.5 a^T b + 0.25 c: transposed operand, beta != 0 (c made here from in[2]). */
static int run_gemm_t(sh_tensor **in, sh_tensor **out) {
  SH_TRY(sh_tensor_empty(&out[0], in[2]->ndim, in[2]->shape, in[2]->dtype, in[2]->device));
  SH_TRY(sh_tensor_copy_(out[0], in[2]));
  return sh_gemm_(out[0], in[0], in[1], 1, 0, 0.5, 0.25);
}

static const product products[] = {
  {"linear + bias (BIAS)", 3, 1, {{5, 16}, {24, 16}, {24}}, {2, 2, 1}, SH_F32, 1e-5, run_linear_bias},
  {"linear, other shape", 3, 1, {{3, 7, 16}, {40, 16}, {40}}, {3, 2, 1}, SH_F32, 1e-5, run_linear_bias},
  {"linear without bias", 2, 1, {{5, 16}, {20, 16}}, {2, 2}, SH_F32, 1e-5, run_linear_plain},
  {"linear + bias in bf16", 3, 1, {{5, 16}, {24, 16}, {24}}, {2, 2, 1}, SH_BF16, 2e-2, run_linear_bias},
  {"linear + gelu (GELU_AUX_BIAS)", 3, 2, {{6, 16}, {32, 16}, {32}}, {2, 2, 1}, SH_F32, 1e-5, run_linear_gelu},
  {"linear backward (plain dx, BGRADB dw)", 3, 3, {{6, 16}, {24, 16}, {6, 24}}, {2, 2, 2}, SH_F32, 1e-5, run_linear_backward},
  {"batched matmul", 2, 1, {{3, 4, 8}, {3, 8, 5}}, {3, 3}, SH_F32, 1e-5, run_matmul},
  {"matmul, shared right operand", 2, 1, {{3, 4, 8}, {8, 5}}, {3, 2}, SH_F32, 1e-5, run_matmul},
  {"gemm_ a^T b, beta 0.25", 3, 1, {{8, 4}, {8, 5}, {4, 5}}, {2, 2, 2}, SH_F32, 1e-5, run_gemm_t},
};
enum { N_PRODUCTS = sizeof products / sizeof products[0] };

/* Runs p on the CPU and on the device with inputs from `seed`; returns the worst difference. */
static double run_both(const product *p, uint64_t seed) {
  sh_tensor *cpu_in[4] = {0}, *dev_in[4] = {0}, *cpu_out[3] = {0}, *dev_out[3] = {0};
  for (int i = 0; i < p->nin; i++) {
    cpu_in[i] = gpu_random(p->ndims[i], p->shapes[i], p->dtype, seed + (uint64_t)i, 0, 1);
    dev_in[i] = gpu_on(cpu_in[i], DEV);
  }
  double worst = INFINITY;
  if (p->run(cpu_in, cpu_out) == SH_OK && p->run(dev_in, dev_out) == SH_OK) {
    worst = 0;
    for (int i = 0; i < p->nout; i++) {
      double d = max_rel_diff(dev_out[i], cpu_out[i]);
      if (!(d <= worst)) worst = d;
    }
  } else {
    printf("# %s: %s\n", p->name, sh_last_error());
  }
  for (int i = 0; i < 4; i++) { sh_tensor_destroy(cpu_in[i]); sh_tensor_destroy(dev_in[i]); }
  for (int i = 0; i < 3; i++) { sh_tensor_destroy(cpu_out[i]); sh_tensor_destroy(dev_out[i]); }
  return worst;
}

/* Every product twice over: its first call makes a plan of its own (even where an earlier
 * product differs only in shape, dtype or epilogue), its later calls make nothing, and each
 * call equals the CPU's. */
static void test_plans_reused(void) {
  for (int round = 0; round < 2; round++) {
    for (int k = 0; k < N_PRODUCTS; k++) {
      const product *p = &products[k];
      if (counting()) sh_emu_lt_counts_reset();
      double d = run_both(p, 100 * (uint64_t)k + (uint64_t)round);
      CHECK(d <= p->tol, "%s, call %d: cuda differs from the cpu by %g (tol %g)", p->name, round + 1, d, p->tol);
      if (!counting()) continue;
      long made = made_since_reset();
      if (round == 0) CHECK(made > 0, "%s: the first call made no plan (another product's was taken)", p->name);
      else CHECK(made == 0, "%s: the repeated call created %ld descriptors, layouts, preferences or queries", p->name, made);
    }
  }
}

/* The library refusing an epilogue at run time (after its heuristic offered it): the call
 * falls back, and later calls of that plan go straight to the plain product: one
 * cublasLtMatmul each, nothing created. */
static void test_refused_epilogue(void) {
  const product p = {"linear + bias, refused", 3, 1, {{9, 16}, {8, 16}, {8}}, {2, 2, 1}, SH_F32, 1e-5, run_linear_bias};
  setenv("SHARD_EMU_LT_REFUSE_EPILOGUE", "1", 1);
  double d = run_both(&p, 7);
  CHECK(d <= p.tol, "refused epilogue: cuda differs from the cpu by %g", d);
  if (counting()) sh_emu_lt_counts_reset();
  d = run_both(&p, 8);
  unsetenv("SHARD_EMU_LT_REFUSE_EPILOGUE");
  CHECK(d <= p.tol, "after the refusal: cuda differs from the cpu by %g", d);
  if (!counting()) return;
  long c[6];
  sh_emu_lt_counts(c);
  CHECK(made_since_reset() == 0 && c[LT_MATMULS] == 1,
        "after the refusal: %ld new objects or queries and %ld cublasLtMatmul calls, expected 0 and 1", made_since_reset(),
        c[LT_MATMULS]);
}

/* A sweep of 2 * PLAN_CAP shapes: the live descriptors and layouts stay within the cap, and a
 * shape whose plan was evicted is planned again and still right. */
static void test_plans_bounded(void) {
  if (counting()) sh_emu_lt_counts_reset();
  for (int k = 1; k <= 2 * PLAN_CAP; k++) {
    product p = {"matmul sweep", 2, 1, {{2, k}, {k, 3}}, {2, 2}, SH_F32, 1e-5, run_matmul};
    double d = run_both(&p, (uint64_t)k);
    if (!(d <= p.tol)) { CHECK(0, "sweep [2 x %d] @ [%d x 3]: cuda differs from the cpu by %g", k, k, d); return; }
  }
  CHECK(1, "a sweep of %d shapes equals the cpu", 2 * PLAN_CAP);
  if (!counting()) return;
  long c[6];
  sh_emu_lt_counts(c);
  long live = c[LT_DESCS] + c[LT_LAYOUTS] + c[LT_PREFS] - c[LT_DESTROYED];
  CHECK(c[LT_DESCS] >= 2 * PLAN_CAP, "the sweep made %ld descriptors for %d shapes", c[LT_DESCS], 2 * PLAN_CAP);
  CHECK(live <= 4 * PLAN_CAP, "after the sweep %ld descriptors and layouts live; the cache holds at most %d plans of 4", live,
        PLAN_CAP);
  sh_emu_lt_counts_reset();
  product first = {"matmul sweep, evicted", 2, 1, {{2, 1}, {1, 3}}, {2, 2}, SH_F32, 1e-5, run_matmul};
  CHECK(run_both(&first, 1) <= first.tol, "an evicted shape differs from the cpu");
  CHECK(made_since_reset() > 0, "the first shape of the sweep was still cached after %d more", 2 * PLAN_CAP - 1);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  int rc = cuda_test_start("test_matmul_plans", DEV);
  if (rc >= 0) return rc;
  if (!counting()) printf("# not on the emulator: cuBLASLt's objects are not counted\n");
  RUN(test_plans_reused);
  RUN(test_refused_epilogue);
  RUN(test_plans_bounded);
  return check_summary("test_matmul_plans");
}
