/* test_optim.c: the CPU AdamW kernel (optim.c's portable loop, its vector loop at 16 and 8
 * lanes from optim_simd_internal.h, the multi-tensor split across threads) against a float64
 * reference of torch.optim.AdamW's formula, over sizes that hit every tail and thread split
 * (1, 7, 8, 9, 15, 16, 17, 1000003 elements, and groups of parameters whose thread boundaries
 * fall inside a tensor), f32 and bf16 grads, shadows of every float dtype; at 1, 2 and 3
 * threads, under the CPU kernel set in use (16 lanes of AVX-512F in the avx512 sets), under
 * avx2 (8 lanes of AVX2) and under generic (check_cpu.h). The shadow must be exactly the param
 * rounded by dtype.c's conversions, special values (ties, NaN, Inf, -0, subnormals) included;
 * every loop must give the same bits (all are plain IEEE f32 operations in the same order). */
#include <math.h>
#include "core/parallel.h"
#include <stdlib.h>
#include "check_cpu.h"
#include "core/dtype.h"
#include "ops/optim.h"
#include "core/status.h"
#include "core/tensor.h"

enum { STEPS = 4 };
static const double LR = 1e-2, B1 = 0.9, B2 = 0.99, EPS = 1e-8, GS = 0.5;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {          /* xorshift64*, uniform in [0, 1) */
  rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
  return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static sh_tensor *mk(int64_t n, int dtype, const double *vals) {
  sh_tensor *t = NULL;
  CHECK_OK(sh_tensor_empty(&t, 1, &n, dtype, -1));
  double *z = vals ? NULL : calloc((size_t)n, sizeof(double));
  CHECK_OK(sh_tensor_write_f64(t, vals ? vals : z));
  free(z);
  return t;
}
static double *rd(const sh_tensor *t) {
  double *v = malloc(sizeof(double) * (size_t)sh_tensor_numel(t));
  CHECK_OK(sh_tensor_read_f64(t, v));
  return v;
}

/* One parameter under test: its tensors and its float64 reference state. */
typedef struct param {
  int64_t n;
  double wd, *p, *m, *v;
  sh_tensor *tp, *tm, *tv, *ts, *tg;
} param;

static void param_init(param *x, int64_t n, double wd, int shadow_dtype) {
  x->n = n; x->wd = wd;
  x->p = malloc(sizeof(double) * (size_t)n);
  x->m = calloc((size_t)n, sizeof(double)); x->v = calloc((size_t)n, sizeof(double));
  for (int64_t i = 0; i < n; i++) x->p[i] = (float)(2 * urand() - 1);
  x->tp = mk(n, SH_F32, x->p); x->tm = mk(n, SH_F32, NULL); x->tv = mk(n, SH_F32, NULL);
  x->ts = shadow_dtype >= 0 ? mk(n, shadow_dtype, NULL) : NULL;
  x->tg = NULL;
}

static void param_free(param *x) {
  free(x->p); free(x->m); free(x->v);
  sh_tensor_destroy(x->tp); sh_tensor_destroy(x->tm); sh_tensor_destroy(x->tv);
  sh_tensor_destroy(x->ts); sh_tensor_destroy(x->tg);
}

/* A fresh random grad of grad_dtype; returns it as stored (bf16-rounded), for the reference. */
static double *new_grad(param *x, int grad_dtype) {
  double *g = malloc(sizeof(double) * (size_t)x->n);
  for (int64_t i = 0; i < x->n; i++) g[i] = 2 * urand() - 1;
  sh_tensor_destroy(x->tg);
  x->tg = mk(x->n, grad_dtype, g);
  CHECK_OK(sh_tensor_read_f64(x->tg, g));
  return g;
}

/* torch.optim.AdamW's step (single-tensor formula) in float64. */
static void ref_step(param *x, const double *g, int64_t step) {
  double bc1 = 1 - pow(B1, (double)step), bc2 = 1 - pow(B2, (double)step);
  for (int64_t i = 0; i < x->n; i++) {
    double gi = g[i] * GS;
    x->p[i] *= 1 - LR * x->wd;
    x->m[i] = B1 * x->m[i] + (1 - B1) * gi;
    x->v[i] = B2 * x->v[i] + (1 - B2) * gi * gi;
    x->p[i] -= LR / bc1 * x->m[i] / (sqrt(x->v[i]) / sqrt(bc2) + EPS);
  }
}

/* max |got - ref| / max(1, max |ref|) */
static double err_of(const sh_tensor *t, const double *ref, int64_t n) {
  double *got = rd(t), e = 0, den = 1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(got[i] - ref[i]);
    if (!(d <= e)) e = d;
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  free(got);
  return e / den;
}

/* The number of elements of the shadow that differ from the param rounded by dtype.c. */
static int64_t shadow_misses(const param *x) {
  int dt = x->ts->dtype;
  float *p = sh_tensor_data(x->tp);
  int64_t bad = 0;
  for (int64_t i = 0; i < x->n; i++) {
    if (dt == SH_BF16) bad += ((uint16_t *)sh_tensor_data(x->ts))[i] != sh_f32_to_bf16(p[i]);
    else if (dt == SH_F16) bad += ((uint16_t *)sh_tensor_data(x->ts))[i] != sh_f32_to_f16(p[i]);
    else if (dt == SH_F32) bad += memcmp((float *)sh_tensor_data(x->ts) + i, p + i, 4) != 0;
    else bad += ((double *)sh_tensor_data(x->ts))[i] != (double)p[i];
  }
  return bad;
}

/* STEPS AdamW steps of a group of n parameters of these sizes in one multi call, checked
 * against the reference after the last; *bits (when not NULL) gets the f32 params' bits, for
 * comparing two runs. The rng is reseeded so that every run sees the same values. */
static void run_group(const char *what, int n, const int64_t *sizes, int grad_dtype, int shadow_dtype, uint32_t **bits) {
  rng = 0x9E3779B97F4A7C15ull;
  param *x = calloc((size_t)n, sizeof *x);
  sh_adamw_param *ps = calloc((size_t)n, sizeof *ps);
  for (int k = 0; k < n; k++) param_init(&x[k], sizes[k], k % 2 ? 0.1 : 0, shadow_dtype);
  for (int64_t step = 1; step <= STEPS; step++) {
    for (int k = 0; k < n; k++) {
      double *g = new_grad(&x[k], grad_dtype);
      ref_step(&x[k], g, step);
      free(g);
      ps[k] = (sh_adamw_param){x[k].tp, x[k].tg, x[k].tm, x[k].tv, x[k].ts, x[k].wd, NULL};
    }
    CHECK_OK(sh_adamw_step_multi_(n, ps, LR, B1, B2, EPS, step, GS));
  }
  int64_t total = 0;
  for (int k = 0; k < n; k++) total += sizes[k];
  if (bits) *bits = malloc(sizeof(uint32_t) * (size_t)total);
  for (int k = 0, at = 0; k < n; k++) {
    double ep = err_of(x[k].tp, x[k].p, x[k].n), em = err_of(x[k].tm, x[k].m, x[k].n), ev = err_of(x[k].tv, x[k].v, x[k].n);
    CHECK(ep <= 1e-5 && em <= 1e-6 && ev <= 1e-6, "%s: tensor %d of %lld elements: error param %.3g, m %.3g, v %.3g",
          what, k, (long long)x[k].n, ep, em, ev);
    if (x[k].ts) {
      int64_t bad = shadow_misses(&x[k]);
      CHECK(bad == 0, "%s: tensor %d: %lld shadow elements are not the rounded param", what, k, (long long)bad);
    }
    if (bits) memcpy(*bits + at, sh_tensor_data(x[k].tp), sizeof(uint32_t) * (size_t)x[k].n);
    at += (int)x[k].n;
    param_free(&x[k]);
  }
  free(x); free(ps);
}

/* A group at every thread count, with the vector loop on and off: each run against the
 * reference, and every run's bits equal to the first's. */
static void run_everywhere(const char *name, int n, const int64_t *sizes, int grad_dtype, int shadow_dtype) {
  int64_t total = 0;
  for (int k = 0; k < n; k++) total += sizes[k];
  uint32_t *first = NULL;
  for (int threads = 1; threads <= 3; threads++) {
    for (int s = 0; s < check_sets(); s++) {
      char what[160];
      const char *set = check_use_set(s);
      snprintf(what, sizeof what, "%s grad %s shadow %s, %d thread(s), kernel set %s", name, sh_dtype_name(grad_dtype),
               shadow_dtype >= 0 ? sh_dtype_name(shadow_dtype) : "none", threads, set);
      sh_parallel_set_threads(threads);
      uint32_t *bits = NULL;
      run_group(what, n, sizes, grad_dtype, shadow_dtype, &bits);
      if (!first) first = bits;
      else {
        int64_t diff = 0;
        for (int64_t i = 0; i < total; i++) diff += bits[i] != first[i];
        CHECK(diff == 0, "%s: %lld params differ in their bits from the first run's", what, (long long)diff);
        free(bits);
      }
    }
  }
  free(first);
  check_use_set(0);
  sh_parallel_set_threads(2);
}

static void test_adamw_sizes(void) {
  static const int64_t one[] = {1}, n7[] = {7}, n8[] = {8}, n9[] = {9}, n15[] = {15}, n16[] = {16}, n17[] = {17};
  static const int64_t big[] = {1000003};
  const int64_t *single[] = {one, n7, n8, n9, n15, n16, n17};
  int dts[][2] = {{SH_F32, -1}, {SH_BF16, SH_BF16}, {SH_F32, SH_BF16}, {SH_BF16, SH_F32}, {SH_F32, SH_F16}, {SH_BF16, SH_F64}};
  for (size_t s = 0; s < sizeof single / sizeof single[0]; s++)
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) run_everywhere("adamw", 1, single[s], dts[d][0], dts[d][1]);
  run_everywhere("adamw 1000003", 1, big, SH_BF16, SH_BF16);
  run_everywhere("adamw 1000003", 1, big, SH_F32, -1);
}

/* The threads split the concatenation of a group at blocks of 65536 elements: here block
 * boundaries fall inside a tensor off the vector grid (65536 - 52431 = 13105 = 16 * 819 + 1),
 * exactly at tensors' starts, next to one-element tensors, and inside a tensor on the grid. */
static void test_adamw_group(void) {
  static const int64_t mixed[] = {1, 15, 16, 17, 40000, 3, 12345, 1, 33, 20001};
  static const int64_t edges[] = {65535, 1, 65536, 70000};
  run_everywhere("adamw group", 10, mixed, SH_F32, SH_BF16);
  run_everywhere("adamw group", 10, mixed, SH_BF16, -1);
  run_everywhere("adamw group at block edges", 4, edges, SH_BF16, SH_BF16);
}

/* With lr 0 the param keeps its value, so the shadow must round chosen bit patterns exactly:
 * ties to even both ways, values that round up to Inf, NaN, Inf, -0 and subnormals, in every
 * lane of two vectors and the tail. */
static void test_adamw_shadow_rounding(void) {
  static const uint32_t pats[] = {
    0x3F808000u, 0x3F818000u, 0x3F80C000u, 0x3F807FFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u, 0x7F800000u,
    0xFF800000u, 0x7FC00001u, 0xFF812345u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00008000u, 0x3F800000u,
  };
  enum { N = 37 };
  int np = (int)(sizeof pats / sizeof pats[0]);
  for (int set = 0; set < check_sets(); set++) {
    const char *name = check_use_set(set);
    for (int sd = 0; sd < 2; sd++) {
      int64_t n = N;
      sh_tensor *p = mk(n, SH_F32, NULL), *g = mk(n, SH_F32, NULL), *m = mk(n, SH_F32, NULL), *v = mk(n, SH_F32, NULL);
      sh_tensor *s = mk(n, sd ? SH_F16 : SH_BF16, NULL);
      uint32_t *pb = sh_tensor_data(p);
      for (int i = 0; i < N; i++) pb[i] = pats[(i * 7) % np];
      CHECK_OK(sh_adamw_step_(p, g, m, v, s, 0.0, B1, B2, EPS, 0.0, 1, 1.0));
      param x = {.n = n, .tp = p, .ts = s};
      int64_t bad = shadow_misses(&x);
      int64_t moved = 0;
      for (int i = 0; i < N; i++) moved += pb[i] != pats[(i * 7) % np] && !(isnan(((float *)pb)[i]));
      CHECK(bad == 0 && moved == 0, "adamw shadow %s (kernel set %s): %lld elements misrounded, %lld params moved with lr 0",
            sd ? "f16" : "bf16", name, (long long)bad, (long long)moved);
      sh_tensor_destroy(p); sh_tensor_destroy(g); sh_tensor_destroy(m); sh_tensor_destroy(v); sh_tensor_destroy(s);
    }
  }
  check_use_set(0);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  RUN(test_adamw_sizes);
  RUN(test_adamw_group);
  RUN(test_adamw_shadow_rounding);
  return check_summary("test_optim");
}
