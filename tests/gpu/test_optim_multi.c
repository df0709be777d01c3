/* test_optim_multi.c (make test-gpu; the emulated device in make test): the multi-tensor
 * optimizer fronts of optim.h on CUDA against the CPU backend. sh_adamw_step_multi_ over N
 * parameters of mixed sizes (f32 and bf16 grads, shadows of three dtypes, per-parameter
 * weight decay) equals the CPU's update, in ceil(N / 16) launches and no host wait;
 * sh_grad_norm_part over N gradients equals the CPU's for norms 2, 1 and inf, in
 * ceil(N / 16) + 1 launches, and reading it is the one host wait. Launches and waits are the emulator's counters (tests/cuda_emu/emu_counters.cpp,
 * weak here): on a real GPU those checks are skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops/optim.h"
#include "core/cuda.h"
#include "gpu_test.h"

#define S(...) (int64_t[]){__VA_ARGS__}

extern void sh_emu_counters_get(long out[4]) __attribute__((weak));
extern void sh_emu_counters_reset(void) __attribute__((weak));
enum { EMU_MALLOCS, EMU_FREES, EMU_LAUNCHES, EMU_HOST_SYNCS };

enum { DEV = 0, N = 37, MT_MAX = 16 };

/* Parameter i's size: mostly a few thousand, some over one 8192-element chunk, one empty. */
/* A 1-d host tensor of n normal(mean, std) values. */
static sh_tensor *random_tensor(int64_t n, int dtype, uint64_t seed, double mean, double std) {
  return gpu_random(1, S(n), dtype, seed, mean, std);
}

static int64_t size_of(int i) { return i == 5 ? 0 : i % 9 == 0 ? 20000 + i : (i * 577) % 6000 + 1; }



/* The largest |cuda - cpu| / (1 + |cpu|) over the elements. */
static double max_rel_diff(const sh_tensor *cuda, const sh_tensor *cpu) {
  int64_t n = sh_tensor_numel(cpu);
  sh_tensor *h = NULL;
  double *a = malloc(sizeof(double) * (size_t)(n + 1)), *b = malloc(sizeof(double) * (size_t)(n + 1)), worst = 0;
  if (!a || !b || sh_tensor_to(&h, cuda, SH_F64, -1) || sh_tensor_read_f64(h, a) || sh_tensor_read_f64(cpu, b)) worst = INFINITY;
  for (int64_t i = 0; worst < INFINITY && i < n; i++) {
    double d = fabs(a[i] - b[i]) / (1 + fabs(b[i]));
    if (!(d <= worst)) worst = d;   /* NaN counts as the worst */
  }
  sh_tensor_destroy(h);
  free(a);
  free(b);
  return worst;
}

static int counting(void) { return sh_emu_counters_get != NULL; }

static void counters_reset(void) { if (counting()) sh_emu_counters_reset(); }

/* Checks the launches and host waits since counters_reset (on the emulator only). */
static void check_counts(const char *what, long launches, long host_syncs) {
  if (!counting()) return;
  long c[4];
  sh_emu_counters_get(c);
  CHECK(c[EMU_LAUNCHES] == launches && c[EMU_HOST_SYNCS] == host_syncs,
        "%s: %ld launches and %ld host waits, expected %ld and %ld", what, c[EMU_LAUNCHES], c[EMU_HOST_SYNCS],
        launches, host_syncs);
}

/* One parameter's buffers on the CPU and their copies on the device. */
typedef struct param_set { sh_tensor *p, *g, *m, *v, *shadow; double wd; } param_set;

static const int shadow_dtypes[] = {SH_BF16, -1, SH_F32, SH_F16};

static void make_params(param_set *cpu, param_set *cuda) {
  for (int i = 0; i < N; i++) {
    int64_t n = size_of(i);
    cpu[i].p = random_tensor(n, SH_F32, 100 + i, 0, 1);
    cpu[i].g = random_tensor(n, i % 2 ? SH_BF16 : SH_F32, 200 + i, 0, 0.1);
    cpu[i].m = random_tensor(n, SH_F32, 300 + i, 0, 0.01);
    cpu[i].v = random_tensor(n, SH_F32, 400 + i, 0.01, 0.001);
    int sd = shadow_dtypes[i % 4];
    cpu[i].shadow = NULL;
    if (sd >= 0 && sh_tensor_empty(&cpu[i].shadow, 1, S(n), sd, -1)) exit(2);
    cpu[i].wd = i % 3 ? 0.1 : 0.0;
    cuda[i] = (param_set){gpu_on(cpu[i].p, DEV), gpu_on(cpu[i].g, DEV), gpu_on(cpu[i].m, DEV), gpu_on(cpu[i].v, DEV),
                          gpu_on(cpu[i].shadow, DEV), cpu[i].wd};
  }
}

static void as_group(const param_set *s, sh_adamw_param *group) {
  for (int i = 0; i < N; i++)
    group[i] = (sh_adamw_param){s[i].p, s[i].g, s[i].m, s[i].v, s[i].shadow, s[i].wd, NULL};
}

static void free_params(param_set *s) {
  for (int i = 0; i < N; i++) {
    sh_tensor_destroy(s[i].p); sh_tensor_destroy(s[i].g); sh_tensor_destroy(s[i].m);
    sh_tensor_destroy(s[i].v); sh_tensor_destroy(s[i].shadow);
  }
}

static int nonempty(void) {
  int k = 0;
  for (int i = 0; i < N; i++) k += size_of(i) > 0;
  return k;
}

static void test_adamw_multi(void) {
  param_set cpu[N], cuda[N];
  sh_adamw_param gcpu[N], gcuda[N];
  make_params(cpu, cuda);
  as_group(cpu, gcpu);
  as_group(cuda, gcuda);
  CHECK_OK(sh_cuda_synchronize(DEV));
  long groups = (nonempty() + MT_MAX - 1) / MT_MAX;
  for (int step = 1; step <= 2; step++) {
    CHECK_OK(sh_adamw_step_multi_(N, gcpu, 1e-2, 0.9, 0.95, 1e-8, step, 0.5));
    counters_reset();
    CHECK_OK(sh_adamw_step_multi_(N, gcuda, 1e-2, 0.9, 0.95, 1e-8, step, 0.5));
    check_counts("adamw over 37 parameters", groups, 0);
  }
  double worst = 0, worst_shadow = 0;
  for (int i = 0; i < N; i++) {
    double d[3] = {max_rel_diff(cuda[i].p, cpu[i].p), max_rel_diff(cuda[i].m, cpu[i].m), max_rel_diff(cuda[i].v, cpu[i].v)};
    for (int k = 0; k < 3; k++) if (!(d[k] <= worst)) worst = d[k];
    double ds = cpu[i].shadow ? max_rel_diff(cuda[i].shadow, cpu[i].shadow) : 0;
    if (!(ds <= worst_shadow)) worst_shadow = ds;
  }
  /* f32 arithmetic in the same order, but a GPU may contract into FMAs; a bf16/f16 shadow
   * may then round the other way (one unit in its last place) */
  CHECK(worst <= 1e-5, "adamw over %d parameters: p, m, v equal the CPU's (worst relative diff %g)", N, worst);
  CHECK(worst_shadow <= 1e-2, "adamw over %d parameters: shadows equal the CPU's (worst relative diff %g)", N, worst_shadow);
  free_params(cpu);
  free_params(cuda);
}

/* t's elements as f64 (exact for f32, bf16 and f16), read from any device; NULL on failure. */
static double *values_of(const sh_tensor *t) {
  int64_t n = sh_tensor_numel(t);
  sh_tensor *h = NULL;
  double *a = malloc(sizeof(double) * (size_t)(n + 1));
  if (!a || sh_tensor_to(&h, t, SH_F64, -1) || sh_tensor_read_f64(h, a)) { free(a); a = NULL; }
  sh_tensor_destroy(h);
  return a;
}

/* The number of elements where a and b differ in value (NaN equals NaN); n + 1 when unreadable. */
static int64_t count_unequal(const sh_tensor *a, const sh_tensor *b) {
  int64_t n = sh_tensor_numel(a), bad = 0;
  double *x = values_of(a), *y = values_of(b);
  if (!x || !y || sh_tensor_numel(b) != n) bad = n + 1;
  else
    for (int64_t i = 0; i < n; i++) bad += !(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])));
  free(x);
  free(y);
  return bad;
}

/* A copy of t on `device` viewed at element `offset` of a larger buffer (offset 1: not 16-byte
 * aligned, so the kernel takes its one-element path). */
static sh_tensor *placed(const sh_tensor *t, int device, int64_t offset) {
  int64_t n = sh_tensor_numel(t);
  sh_tensor *buf = NULL, *view = NULL;
  if (sh_tensor_empty(&buf, 1, S(n + offset), t->dtype, device) || sh_tensor_fill_(buf, 0.0) ||
      sh_view_narrow(&view, buf, 0, offset, n) || sh_tensor_copy_(view, t)) {
    printf("placing a tensor: %s\n", sh_last_error());
    exit(2);
  }
  sh_tensor_destroy(buf);   /* the view holds the storage */
  return view;
}

/* The 16-byte path against the one-element path and the CPU: a parameter of 2 chunks and 13
 * elements (not a multiple of 8), each grad dtype and shadow, stepped twice on aligned buffers
 * and on views one element in (unaligned). Both device runs give the same bits (one formula);
 * on the emulator, which compiles the kernel without FMA contraction like the CPU loops, they
 * also equal the CPU's bits (on a GPU, the CPU's to rounding). */
static void test_adamw_wide(void) {
  const int64_t n = 2 * 8192 + 13;
  const int gdts[2] = {SH_F32, SH_BF16}, sdts[4] = {-1, SH_BF16, SH_F16, SH_F32};
  for (int gi = 0; gi < 2; gi++) {
    for (int si = 0; si < 4; si++) {
      sh_tensor *cpu[5], *dev[2][5];
      cpu[0] = random_tensor(n, SH_F32, 700, 0, 1);
      cpu[1] = random_tensor(n, gdts[gi], 701, 0, 0.1);
      cpu[2] = random_tensor(n, SH_F32, 702, 0, 0.01);
      cpu[3] = random_tensor(n, SH_F32, 703, 0.01, 0.001);
      cpu[4] = NULL;
      if (sdts[si] >= 0 && sh_tensor_empty(&cpu[4], 1, S(n), sdts[si], -1)) exit(2);
      if (cpu[4]) CHECK_OK(sh_tensor_fill_(cpu[4], 0.0));
      for (int r = 0; r < 2; r++)
        for (int k = 0; k < 5; k++) dev[r][k] = cpu[k] ? placed(cpu[k], DEV, r) : NULL;
      for (int step = 1; step <= 2; step++) {
        CHECK_OK(sh_adamw_step_(cpu[0], cpu[1], cpu[2], cpu[3], cpu[4], 1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.5));
        for (int r = 0; r < 2; r++)
          CHECK_OK(sh_adamw_step_(dev[r][0], dev[r][1], dev[r][2], dev[r][3], dev[r][4], 1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.5));
      }
      const char *names[5] = {"p", "grad", "m", "v", "shadow"};
      for (int k = 0; k < 5; k++) {
        if (k == 1 || !cpu[k]) continue;
        int64_t paths = count_unequal(dev[0][k], dev[1][k]);
        CHECK(paths == 0, "adamw [%lld] grad %s shadow %s: %s differs between the aligned and unaligned runs in %lld elements",
              (long long)n, sh_dtype_name(gdts[gi]), sdts[si] >= 0 ? sh_dtype_name(sdts[si]) : "none", names[k], (long long)paths);
        if (counting()) {
          int64_t vs_cpu = count_unequal(dev[0][k], cpu[k]);
          CHECK(vs_cpu == 0, "adamw [%lld] grad %s shadow %s: %s differs from the CPU's bits in %lld elements", (long long)n,
                sh_dtype_name(gdts[gi]), sdts[si] >= 0 ? sh_dtype_name(sdts[si]) : "none", names[k], (long long)vs_cpu);
        } else {
          CHECK(max_rel_diff(dev[0][k], cpu[k]) <= (k == 4 ? 1e-2 : 1e-5), "adamw: %s differs from the CPU's", names[k]);
        }
      }
      for (int k = 0; k < 5; k++) {
        sh_tensor_destroy(cpu[k]);
        for (int r = 0; r < 2; r++) sh_tensor_destroy(dev[r][k]);
      }
    }
  }
}

/* Clipping without a host read: the norm part, sh_grad_clip_coef and an AdamW step that folds
 * the coefficient into its gradient scale, on CUDA and on the CPU, against PyTorch's
 * clip_grad_norm_ as a plain reference: the norm in f64 from the gradients' values, the
 * gradients multiplied in place by the f32 coefficient, then a step without clip. The folded
 * steps equal it (the same f32 product; on the emulator bit for bit), in launches alone: no
 * host wait until the norm is read. A max_norm above the norm gives coefficient 1 exactly. */
static double value_of(const sh_tensor *t);

static void test_clip_folded(void) {
  const int64_t n = 3001;
  const double max_norms[2] = {0.5, 1e6};
  for (int c = 0; c < 2; c++) {
    sh_tensor *p_ref = random_tensor(n, SH_F32, 800, 0, 1), *g_ref = random_tensor(n, SH_F32, 801, 0, 0.1);
    sh_tensor *m_ref = random_tensor(n, SH_F32, 802, 0, 0.01), *v_ref = random_tensor(n, SH_F32, 803, 0.01, 0.001);
    double *g = values_of(g_ref), sumsq = 0;
    for (int64_t i = 0; i < n; i++) sumsq += g[i] * g[i];
    free(g);
    double want_norm = sqrt(sumsq);
    double coef_d = max_norms[c] / (want_norm + 1e-6);
    float want_coef = (float)(coef_d > 1 ? 1 : coef_d);
    /* the folded runs: CPU (-1) and CUDA */
    sh_tensor *runs[2][4];
    for (int r = 0; r < 2; r++) {
      int dev = r ? DEV : -1;
      sh_tensor *pt = gpu_on(p_ref, dev), *gt = gpu_on(g_ref, dev), *mt = gpu_on(m_ref, dev), *vt = gpu_on(v_ref, dev);
      sh_tensor *part = NULL, *coef = NULL;
      CHECK_OK(sh_tensor_empty(&part, 1, S(1), SH_F64, dev));
      CHECK_OK(sh_tensor_empty(&coef, 1, S(1), SH_F32, dev));
      if (dev >= 0) CHECK_OK(sh_cuda_synchronize(dev));
      counters_reset();
      const sh_tensor *gs[1] = {gt};
      CHECK_OK(sh_grad_norm_part(part, 1, gs, NULL, 2));
      CHECK_OK(sh_grad_clip_coef(coef, part, part, 2, max_norms[c]));
      sh_adamw_param e = {pt, gt, mt, vt, NULL, 0.1, coef};
      CHECK_OK(sh_adamw_step_multi_(1, &e, 1e-2, 0.9, 0.95, 1e-8, 1, 1.0));
      if (dev >= 0) check_counts("norm part, clip coefficient and a folded adamw step", 2 + 1 + 1, 0);
      double got_norm = value_of(part), got_coef = value_of(coef);
      CHECK(fabs(got_norm - want_norm) <= 1e-12 * want_norm, "%s: norm %.17g, expected %.17g", dev < 0 ? "cpu" : "cuda", got_norm,
            want_norm);
      CHECK(got_coef == (double)want_coef, "%s max_norm %g: coefficient %.9g, expected %.9g", dev < 0 ? "cpu" : "cuda", max_norms[c],
            got_coef, (double)want_coef);
      runs[r][0] = pt; runs[r][1] = mt; runs[r][2] = vt; runs[r][3] = gt;
      sh_tensor_destroy(part);
      sh_tensor_destroy(coef);
    }
    /* the reference: grads scaled in place by the f32 coefficient, then a plain step */
    CHECK_OK(sh_scale_(g_ref, (double)want_coef));
    CHECK_OK(sh_adamw_step_(p_ref, g_ref, m_ref, v_ref, NULL, 1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 1.0));
    sh_tensor *ref[3] = {p_ref, m_ref, v_ref};
    const char *names[3] = {"p", "m", "v"};
    for (int k = 0; k < 3; k++) {
      CHECK(count_unequal(runs[0][k], ref[k]) == 0, "max_norm %g: the cpu's folded clip differs from scaling the grads first in %s",
            max_norms[c], names[k]);
      if (counting())
        CHECK(count_unequal(runs[1][k], ref[k]) == 0, "max_norm %g: the cuda folded clip differs from scaling the grads first in %s",
              max_norms[c], names[k]);
      else
        CHECK(max_rel_diff(runs[1][k], ref[k]) <= 1e-5, "max_norm %g: cuda %s differs from the reference", max_norms[c], names[k]);
    }
    for (int r = 0; r < 2; r++)
      for (int k = 0; k < 4; k++) sh_tensor_destroy(runs[r][k]);
    sh_tensor *all[4] = {p_ref, g_ref, m_ref, v_ref};
    for (int k = 0; k < 4; k++) sh_tensor_destroy(all[k]);
  }
  sh_tensor *x = NULL, *y = NULL;
  CHECK_OK(sh_tensor_empty(&x, 1, S(1), SH_F64, DEV));
  CHECK_OK(sh_tensor_empty(&y, 1, S(1), SH_F32, -1));
  CHECK_FAILS(sh_grad_clip_coef(y, x, x, 2, 1.0), SH_ERR_DEVICE, "coef");
  CHECK_FAILS(sh_grad_clip_coef(x, x, x, 2, 1.0), SH_ERR_ARG, "coef must hold one f32");
  CHECK_FAILS(sh_grad_clip_coef(y, x, x, 3, 1.0), SH_ERR_ARG, "norm_type");
  sh_tensor_destroy(x);
  sh_tensor_destroy(y);
}

static void test_adamw_multi_errors(void) {
  sh_tensor *p = NULL, *g = NULL, *m = NULL, *v = NULL, *pc = NULL;
  CHECK_OK(sh_tensor_empty(&p, 1, S(4), SH_F32, DEV));
  CHECK_OK(sh_tensor_empty(&g, 1, S(4), SH_F32, DEV));
  CHECK_OK(sh_tensor_empty(&m, 1, S(4), SH_F32, DEV));
  CHECK_OK(sh_tensor_empty(&v, 1, S(4), SH_F32, DEV));
  CHECK_OK(sh_tensor_empty(&pc, 1, S(4), SH_F32, -1));
  sh_adamw_param two[2] = {{p, g, m, v, NULL, 0, NULL}, {pc, g, m, v, NULL, 0, NULL}};
  CHECK_FAILS(sh_adamw_step_multi_(2, two, 1e-3, 0.9, 0.99, 1e-8, 1, 1), SH_ERR_DEVICE, "parameter 2 of 2");
  CHECK_FAILS(sh_adamw_step_multi_(-1, two, 1e-3, 0.9, 0.99, 1e-8, 1, 1), SH_ERR_ARG, "-1");
  CHECK_OK(sh_adamw_step_multi_(0, NULL, 1e-3, 0.9, 0.99, 1e-8, 1, 1));
  sh_tensor *all[] = {p, g, m, v, pc};
  for (int i = 0; i < 5; i++) sh_tensor_destroy(all[i]);
}

/* The value of a one-element tensor on any device (one read from a device). */
static double value_of(const sh_tensor *t) {
  sh_tensor *h = NULL;
  double v = NAN;
  if (!sh_tensor_to(&h, t, SH_F64, -1)) sh_tensor_item(h, &v);
  sh_tensor_destroy(h);
  return v;
}

/* The part on the device, then read: one host wait in all. */
static double part_on(int device, int n, const sh_tensor *const *grads, const double *w, double norm_type) {
  sh_tensor *out = NULL;
  if (sh_tensor_empty(&out, 1, S(1), SH_F64, device)) return NAN;
  CHECK_OK(sh_grad_norm_part(out, n, grads, w, norm_type));
  double v = value_of(out);
  sh_tensor_destroy(out);
  return v;
}

static void test_grad_norm_part(void) {
  sh_tensor *cpu[N], *cuda[N];
  double w[N];
  for (int i = 0; i < N; i++) {
    cpu[i] = random_tensor(size_of(i), i % 2 ? SH_BF16 : SH_F32, 500 + i, 0.01, 1);
    cuda[i] = gpu_on(cpu[i], DEV);
    w[i] = i % 4 ? 1.0 : 0.25;
  }
  sh_tensor *out = NULL;
  CHECK_OK(sh_tensor_empty(&out, 1, S(1), SH_F64, DEV));
  CHECK_OK(sh_cuda_synchronize(DEV));
  const double norms[] = {2, 1, INFINITY};
  long groups = (N + MT_MAX - 1) / MT_MAX;
  for (int k = 0; k < 3; k++) {
    double want = part_on(-1, N, (const sh_tensor *const *)cpu, w, norms[k]);
    counters_reset();
    CHECK_OK(sh_grad_norm_part(out, N, (const sh_tensor *const *)cuda, w, norms[k]));
    double got = value_of(out);
    check_counts("grad norm part over 37 tensors, then its read", groups + 1, 1);   /* the groups, the total */
    CHECK(fabs(got - want) <= 1e-12 * fabs(want) && want > 0, "norm %g part: cuda %.17g, cpu %.17g", norms[k], got, want);
  }
  /* a strided gradient, and no weights; no gradients at all */
  sh_tensor *mat = random_tensor(60, SH_F32, 600, 0, 1), *mat2 = NULL, *t = NULL, *tc = NULL;
  CHECK_OK(sh_view_reshape(&mat2, mat, 2, S(6, 10)));
  CHECK_OK(sh_view_transpose(&t, mat2, 0, 1));
  sh_tensor *dmat = gpu_on(mat2, DEV);
  CHECK_OK(sh_view_transpose(&tc, dmat, 0, 1));
  const sh_tensor *two_cpu[2] = {t, cpu[0]}, *two_cuda[2] = {tc, cuda[0]};
  double want = part_on(-1, 2, two_cpu, NULL, 2), got = part_on(DEV, 2, two_cuda, NULL, 2);
  CHECK(fabs(got - want) <= 1e-12 * want && want > 0, "strided: cuda %.17g, cpu %.17g", got, want);
  CHECK(part_on(DEV, 0, NULL, NULL, INFINITY) == 0, "no gradients: 0");
  CHECK_FAILS(sh_grad_norm_part(out, 2, two_cuda, NULL, 3), SH_ERR_ARG, "norm_type");
  const sh_tensor *mixed[2] = {tc, t};
  CHECK_FAILS(sh_grad_norm_part(out, 2, mixed, NULL, 2), SH_ERR_DEVICE, "tensor 2 of 2");
  CHECK_FAILS(sh_grad_norm_part(tc, 2, two_cuda, NULL, 2), SH_ERR_ARG, "one f64");
  sh_tensor *all[] = {mat, mat2, t, tc, dmat, out};
  for (int i = 0; i < 6; i++) sh_tensor_destroy(all[i]);
  for (int i = 0; i < N; i++) { sh_tensor_destroy(cpu[i]); sh_tensor_destroy(cuda[i]); }
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  int rc = cuda_test_start("test_optim_multi", DEV);
  if (rc >= 0) return rc;
  if (!counting()) printf("# not on the emulator: launches and host waits are not counted\n");
  RUN(test_adamw_multi);
  RUN(test_adamw_wide);
  RUN(test_clip_folded);
  RUN(test_adamw_multi_errors);
  RUN(test_grad_norm_part);
  CHECK_OK(sh_cuda_synchronize(DEV));
  return check_summary("test_optim_multi");
}
