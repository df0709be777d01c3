/* test_op_table.c: the op table (tests/ops/op_table.h) on the CPU, against its references.
 * Each row runs in each of its dtypes on the CPU (twice, the first pass's results poisoned)
 * and is compared with its reference: the same row run in f64 (OT_REF_F64) or the row's
 * hand-written double reference (OT_REF_HOST). Before the table, the references themselves
 * are checked: each backward reference against central finite differences of its forward
 * reference; the Philox stream that the random references read against Random123's known
 * answer; and every op family that OT_REF_F64 rows rely on against double arithmetic on
 * values f32 cannot hold, so an f64 reference that quietly computed in f32 would fail.
 *   build/tests/test_op_table            every row
 *   build/tests/test_op_table linear     the rows whose op name contains "linear"
 * The attention rows run once more under the avx2 kernel set when the set in use is above it.
 * SHARD_TEST_SEED=N changes the inputs; SHARD_TEST_VERBOSE=1 prints every error. */
#include "../ops/op_table.h"
#include <stddef.h>
#include "ops/dispatch_internal.h"
#include "core/meta.h"
#include "cpu/cpu.h"
#include <string.h>

/* ---- the references' own checks ----------------------------------------------------------- */

enum { FD_LINEAR, FD_NORM, FD_RMSNORM, FD_GELU, FD_SILU, FD_SWIGLU, FD_SOFTMAX, FD_ATTENTION, FD_CE, FD_GQA };

typedef struct fd_ctx {
  int kind;
  int64_t a, b, c;       /* sizes: rows/in/out, rows/C, BH/T/D, N/V */
  double eps;            /* norm eps; attention scale; cross-entropy dloss */
  const double *dy;      /* the weights of L = sum(dy * f(inputs)) */
  const double *t;       /* cross-entropy targets; grouped-query attention's {B, H, Hkv, rope theta}
                          * (its a, b are T, D and eps the scale) */
} fd_ctx;

static uint64_t fd_rng = 0x5EED;
static double fd_rand(void) {
  fd_rng = ot_mix(fd_rng, 1);
  return ((fd_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}
static double *fd_vec(int64_t n) {
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = fd_rand();
  return v;
}
static double *fd_zeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static double fd_dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* L(inputs) = sum(dy * forward(inputs)) by the forward reference */
static double fd_loss(const fd_ctx *c, double *const *in) {
  int64_t n = c->kind == FD_LINEAR ? c->a * c->c : c->kind == FD_ATTENTION ? c->a * c->b * c->c
            : c->kind == FD_GQA ? (int64_t)(c->t[0] * c->t[1]) * c->a * c->b : c->a * c->b;
  double *y = fd_zeros(n), L;
  switch (c->kind) {
    case FD_LINEAR: ref_linear(in[0], in[1], in[2], y, c->a, c->b, c->c); break;
    case FD_NORM: ref_norm(in[0], in[1], in[2], y, NULL, NULL, c->a, c->b, c->eps, 1); break;
    case FD_RMSNORM: ref_norm(in[0], in[1], NULL, y, NULL, NULL, c->a, c->b, c->eps, 0); break;
    case FD_GELU: for (int64_t i = 0; i < n; i++) y[i] = ot_gelu(in[0][i]); break;
    case FD_SILU: for (int64_t i = 0; i < n; i++) y[i] = ot_silu(in[0][i]); break;
    case FD_SWIGLU: for (int64_t i = 0; i < n; i++) y[i] = ot_silu(in[0][i]) * in[1][i]; break;
    case FD_SOFTMAX: ref_softmax(in[0], y, c->a, c->b); break;
    case FD_ATTENTION: ref_attention(in[0], in[1], in[2], y, NULL, c->a, c->b, c->c, c->eps); break;
    case FD_GQA:
      ref_gqa_attention(in[0], in[1], in[2], y, NULL, (int64_t)c->t[0], (int64_t)c->t[1], (int64_t)c->t[2], c->a, c->b,
                        c->eps, c->t[3]);
      break;
    case FD_CE: L = c->eps * ref_cross_entropy(in[0], c->t, NULL, c->a, c->b, OT_IGNORE); free(y); return L;
  }
  L = fd_dot(c->dy, y, n);
  free(y);
  return L;
}

/* <grad[k], u> against (L(in + h u) - L(in - h u)) / 2h along a random u, per input k */
static void fd_check(const char *what, const fd_ctx *c, int n_in, double **in, const int64_t *sizes, double **grad) {
  const double h = 1e-5;
  for (int k = 0; k < n_in; k++) {
    if (!grad[k]) continue;
    double *u = fd_vec(sizes[k]), *save = malloc(sizeof(double) * (size_t)(sizes[k] > 0 ? sizes[k] : 1));
    memcpy(save, in[k], sizeof(double) * (size_t)sizes[k]);
    for (int64_t i = 0; i < sizes[k]; i++) in[k][i] = save[i] + h * u[i];
    double lp = fd_loss(c, in);
    for (int64_t i = 0; i < sizes[k]; i++) in[k][i] = save[i] - h * u[i];
    double lm = fd_loss(c, in);
    memcpy(in[k], save, sizeof(double) * (size_t)sizes[k]);
    double fd = (lp - lm) / (2 * h), an = fd_dot(grad[k], u, sizes[k]);
    double scale = sqrt(fd_dot(grad[k], grad[k], sizes[k]) * fd_dot(u, u, sizes[k]));
    CHECK(fabs(fd - an) <= 1e-6 * fmax(fabs(an), 1e-3 * scale) + 1e-12,
          "reference %s: gradient %d along a random direction %.12g, finite differences %.12g", what, k, an, fd);
    free(u);
    free(save);
  }
}

static void check_references(void) {
  { /* linear: dx, dw, db */
    int64_t R = 5, I = 7, O = 3;
    fd_ctx c = {FD_LINEAR, R, I, O, 0, fd_vec(R * O), NULL};
    double *in[3] = {fd_vec(R * I), fd_vec(O * I), fd_vec(O)};
    double *g[3] = {fd_zeros(R * I), fd_zeros(O * I), fd_zeros(O)};
    ref_linear_bwd(c.dy, in[0], in[1], g[0], g[1], g[2], R, I, O);
    fd_check("linear", &c, 3, in, (int64_t[]){R * I, O * I, O}, g);
    for (int i = 0; i < 3; i++) { free(in[i]); free(g[i]); }
    free((void *)c.dy);
  }
  for (int rms = 0; rms < 2; rms++) { /* layernorm: dx, dw, db; rmsnorm: dx, dw */
    int64_t R = 4, C = 9;
    fd_ctx c = {rms ? FD_RMSNORM : FD_NORM, R, C, 0, 1e-5, fd_vec(R * C), NULL};
    double *in[3] = {fd_vec(R * C), fd_vec(C), rms ? NULL : fd_vec(C)};
    double *g[3] = {fd_zeros(R * C), fd_zeros(C), rms ? NULL : fd_zeros(C)};
    ref_norm_bwd(c.dy, in[0], in[1], g[0], g[1], g[2], R, C, 1e-5, !rms);
    fd_check(rms ? "rmsnorm" : "layernorm", &c, 3, in, (int64_t[]){R * C, C, C}, g);
    for (int i = 0; i < 3; i++) { free(in[i]); free(g[i]); }
    free((void *)c.dy);
  }
  for (int kind = FD_GELU; kind <= FD_SOFTMAX; kind++) { /* the activations and softmax */
    int64_t R = 3, C = 11, n = R * C;
    fd_ctx c = {kind, R, C, 0, 0, fd_vec(n), NULL};
    double *in[2] = {fd_vec(n), fd_vec(n)}, *g[2] = {fd_zeros(n), kind == FD_SWIGLU ? fd_zeros(n) : NULL};
    for (int64_t i = 0; i < n; i++) in[0][i] *= 3;
    if (kind == FD_SOFTMAX) {
      double *y = fd_zeros(n);
      ref_softmax(in[0], y, R, C);
      ref_softmax_bwd(c.dy, y, g[0], R, C);
      free(y);
    }
    for (int64_t i = 0; i < n && kind != FD_SOFTMAX; i++) {
      double x = in[0][i];
      g[0][i] = c.dy[i] * (kind == FD_GELU ? ot_gelu_grad(x) : kind == FD_SILU ? ot_silu_grad(x) : in[1][i] * ot_silu_grad(x));
      if (g[1]) g[1][i] = c.dy[i] * ot_silu(x);
    }
    const char *names[] = {"gelu", "silu", "swiglu", "softmax"};
    fd_check(names[kind - FD_GELU], &c, 2, in, (int64_t[]){n, n}, g);
    for (int i = 0; i < 2; i++) { free(in[i]); free(g[i]); }
    free((void *)c.dy);
  }
  { /* attention: dq, dk, dv */
    int64_t BH = 2, T = 5, D = 3, n = BH * T * D;
    fd_ctx c = {FD_ATTENTION, BH, T, D, 0.7, fd_vec(n), NULL};
    double *in[3] = {fd_vec(n), fd_vec(n), fd_vec(n)}, *g[3] = {fd_zeros(n), fd_zeros(n), fd_zeros(n)};
    ref_attention_bwd(c.dy, in[0], in[1], in[2], g[0], g[1], g[2], BH, T, D, 0.7);
    fd_check("attention", &c, 3, in, (int64_t[]){n, n, n}, g);
    for (int i = 0; i < 3; i++) { free(in[i]); free(g[i]); }
    free((void *)c.dy);
  }
  for (int rope = 0; rope < 2; rope++) { /* grouped-query attention, plain and rotary: dq, dk, dv */
    int64_t B = 2, H = 4, Hkv = 2, T = 5, D = 4, nq = B * H * T * D, nk = B * Hkv * T * D;
    double shape[4] = {(double)B, (double)H, (double)Hkv, rope ? 100.0 : 0.0};
    fd_ctx c = {FD_GQA, T, D, 0, 0.6, fd_vec(nq), shape};
    double *in[3] = {fd_vec(nq), fd_vec(nk), fd_vec(nk)}, *g[3] = {fd_zeros(nq), fd_zeros(nk), fd_zeros(nk)};
    ref_gqa_attention_bwd(c.dy, in[0], in[1], in[2], g[0], g[1], g[2], B, H, Hkv, T, D, 0.6, shape[3]);
    fd_check(rope ? "rope gqa attention" : "gqa attention", &c, 3, in, (int64_t[]){nq, nk, nk}, g);
    for (int i = 0; i < 3; i++) { free(in[i]); free(g[i]); }
    free((void *)c.dy);
  }
  { /* cross-entropy: dlogits, one target ignored */
    int64_t N = 4, V = 6;
    double t[4] = {2, OT_IGNORE, 0, 5};
    fd_ctx c = {FD_CE, N, V, 0, 0.7, NULL, t};
    double *in[1] = {fd_vec(N * V)}, *g[1] = {fd_zeros(N * V)};
    ref_cross_entropy_bwd(in[0], t, g[0], N, V, OT_IGNORE, 0.7);
    fd_check("cross_entropy", &c, 1, in, (int64_t[]){N * V}, g);
    free(in[0]);
    free(g[0]);
  }
  /* the stream the random references read: Philox4x32-10 of counter 0, key 0 against
   * Random123's known-answer vector */
  sh_philox_out o = sh_philox4x32(0, 0);
  CHECK(o.v[0] == 0x6627e8d5u && o.v[1] == 0xe169c58du && o.v[2] == 0xbc57ac4cu && o.v[3] == 0x9b00dbd8u,
        "philox4x32-10(counter 0, key 0) = %08x %08x %08x %08x, Random123 says 6627e8d5 e169c58d bc57ac4c 9b00dbd8",
        o.v[0], o.v[1], o.v[2], o.v[3]);
}

/* The claim behind OT_REF_F64: those ops compute f64 in f64 on the CPU. Each is run on f64
 * values that f32 cannot hold and must match the double result to 1e-14, which an f32 (or
 * f32-staged) kernel misses by ~1e-8. */
static sh_tensor *f64_vec(int ndim, const int64_t *shape, double base, double step) {
  sh_tensor *t = NULL;
  int64_t n = ot_numel(ndim, shape);
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = base + step * (double)i + 1e-10 / 3.0;
  if (sh_tensor_empty(&t, ndim, shape, SH_F64, -1) || sh_tensor_write_f64(t, v)) { printf("f64_vec: %s\n", sh_last_error()); exit(2); }
  free(v);
  return t;
}

static void f64_expect(const char *what, int rc, sh_tensor *t, const double *want, int64_t n) {
  CHECK(rc == 0, "f64 path of %s: %s", what, sh_last_error());
  if (rc || !t) return;
  char desc[96];
  CHECK(t->dtype == SH_F64 && sh_tensor_numel(t) == n, "f64 path of %s: got %s", what, ot_shape_str(t, desc, 96));
  double *v = malloc(sizeof(double) * (size_t)n);
  sh_tensor_read_f64(t, v);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(v[i] - want[i]) / fmax(fabs(want[i]), 1e-300));
  CHECK(worst <= 1e-14, "f64 path of %s: relative error %.3g: not computed in f64", what, worst);
  free(v);
}

static void check_f64_paths(void) {
  const int64_t n = 5;
  sh_tensor *a = f64_vec(1, OT_S(n), 1.0 / 3.0, 0.25), *b = f64_vec(1, OT_S(n), 0.7, 0.125), *o = NULL;
  double av[5], bv[5], want[25];
  sh_tensor_read_f64(a, av);
  sh_tensor_read_f64(b, bv);
  const char *bn[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
  for (int op = SH_OP_ADD; op <= SH_OP_MINIMUM; op++) {
    for (int i = 0; i < n; i++) {
      double x = av[i], y = bv[i];
      want[i] = op == SH_OP_ADD ? x + y : op == SH_OP_SUB ? x - y : op == SH_OP_MUL ? x * y : op == SH_OP_DIV ? x / y
              : op == SH_OP_POW ? pow(x, y) : op == SH_OP_MAXIMUM ? fmax(x, y) : fmin(x, y);
    }
    f64_expect(bn[op], sh_binary(&o, op, a, b), o, want, n);
    sh_tensor_destroy(o);
    o = NULL;
    for (int i = 0; i < n; i++) {
      double x = av[i], y = 1.0 / 7.0;
      want[i] = op == SH_OP_ADD ? x + y : op == SH_OP_SUB ? x - y : op == SH_OP_MUL ? x * y : op == SH_OP_DIV ? x / y
              : op == SH_OP_POW ? pow(x, y) : op == SH_OP_MAXIMUM ? fmax(x, y) : fmin(x, y);
    }
    f64_expect("binary_scalar", sh_binary_scalar(&o, op, a, 1.0 / 7.0, 0), o, want, n);
    sh_tensor_destroy(o);
    o = NULL;
  }
  const char *un[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "abs", "square", "reciprocal"};
  for (int op = SH_OP_NEG; op <= SH_OP_RECIPROCAL; op++) {
    for (int i = 0; i < n; i++) {
      double x = av[i];
      double f[] = {-x, exp(x), log(x), sqrt(x), 1 / sqrt(x), tanh(x), fabs(x), x * x, 1 / x};
      want[i] = f[op];
    }
    f64_expect(un[op], sh_unary(&o, op, a), o, want, n);
    sh_tensor_destroy(o);
    o = NULL;
  }
  /* in place */
  sh_tensor *d = f64_vec(1, OT_S(n), 1.0 / 3.0, 0.25);
  for (int i = 0; i < n; i++) want[i] = (av[i] * bv[i] + 0.3 * bv[i]) * (1.0 / 3.0);
  int rc = sh_binary_(d, SH_OP_MUL, b);
  if (!rc) rc = sh_axpy_(d, 0.3, b);
  if (!rc) rc = sh_scale_(d, 1.0 / 3.0);
  f64_expect("binary_, axpy_, scale_", rc, d, want, n);
  sh_tensor_destroy(d);
  /* reductions */
  double s = 0, ss = 0, mx = -INFINITY;
  for (int i = 0; i < n; i++) { s += av[i]; ss += av[i] * av[i]; mx = fmax(mx, av[i]); }
  want[0] = s;
  f64_expect("reduce_all(sum)", sh_reduce_all(&o, SH_OP_SUM, a), o, want, 1);
  sh_tensor_destroy(o);
  o = NULL;
  want[0] = s / n;
  f64_expect("reduce(mean)", sh_reduce(&o, SH_OP_MEAN, a, 0, 0), o, want, 1);
  sh_tensor_destroy(o);
  o = NULL;
  want[0] = mx;
  f64_expect("reduce(max)", sh_reduce(&o, SH_OP_MAX, a, 0, 0), o, want, 1);
  sh_tensor_destroy(o);
  o = NULL;
  int st = 0;
  want[0] = ss;
  double got = sh_sumsq(a, &st);
  CHECK(st == 0 && fabs(got - ss) <= 1e-14 * ss, "f64 path of sumsq: %.17g vs %.17g", got, ss);
  sh_tensor *a2 = f64_vec(2, OT_S(3, n), 1.0 / 3.0, 0.25);
  double a2v[15];
  sh_tensor_read_f64(a2, a2v);
  for (int j = 0; j < n; j++) want[j] = a2v[j] + a2v[n + j] + a2v[2 * n + j];
  f64_expect("sum_to_shape", sh_sum_to_shape(&o, a2, 1, OT_S(n)), o, want, n);
  sh_tensor_destroy(o);
  o = NULL;
  /* products: [3,5] @ [5,1] and gemm_ into [3,1] */
  sh_tensor *bcol = NULL;
  sh_view_reshape(&bcol, b, 2, OT_S(n, 1));
  for (int r = 0; r < 3; r++) {
    double acc = 0;
    for (int j = 0; j < n; j++) acc += a2v[r * n + j] * bv[j];
    want[r] = acc;
  }
  f64_expect("matmul", sh_matmul(&o, a2, bcol), o, want, 3);
  sh_tensor_destroy(o);
  o = NULL;
  sh_tensor *c = f64_vec(2, OT_S(3, 1), 0.1, 0.01);
  double cv[3];
  sh_tensor_read_f64(c, cv);
  for (int r = 0; r < 3; r++) want[r] = 0.3 * want[r] - cv[r] / 3.0;
  f64_expect("gemm_", sh_gemm_(c, a2, bcol, 0, 0, 0.3, -1.0 / 3.0), c, want, 3);
  /* arange forms start + i step in double */
  for (int i = 0; i < 4; i++) want[i] = 0.1 + (double)i / 3.0;
  f64_expect("arange", sh_arange(&o, 0.1, 0.1 + 4.0 / 3.0 - 1e-9, 1.0 / 3.0, SH_F64, -1), o, want, 4);
  sh_tensor_destroy(o);
  sh_tensor_destroy(a); sh_tensor_destroy(b); sh_tensor_destroy(a2); sh_tensor_destroy(bcol); sh_tensor_destroy(c);
}

/* ---- the kernel table's list: every backend fills every slot, every slot has a row ------------ */

/* SH_KERNELS (core/backend_internal.h) is the one list of kernel slots. The CPU table and the
 * meta device's (shard estimate --dry-run runs the real ops with kernels that only count) must
 * fill each slot or name it in their `absent` list; a slot one of them leaves NULL unnamed
 * would fail a model using it there. */
static void check_tables_filled(void) {
  const sh_backend *tables[2] = {NULL, NULL};
  CHECK(sh_backend_for(&tables[0], -1, "test") == SH_OK && sh_backend_for(&tables[1], SH_DEVICE_META, "test") == SH_OK,
        "backend tables: %s", sh_last_error());
  for (int k = 0; k < 2; k++) {
    if (!tables[k]) continue;
    const char *gap = sh_backend_unfilled(tables[k]);
    CHECK(!gap, "the %s backend leaves kernel slot %s empty without naming it in its absent list", tables[k]->name, gap);
  }
}

/* After the whole table ran: every slot of SH_KERNELS was reached on the CPU by some row
 * (through its front, which counts the dispatch), so a kernel added to the list without a row
 * fails here (tests/gpu/test_op_table.c checks the same on cuda). */
static void check_slots_covered(void) {
  for (int s = 0; s < SH_SLOT_COUNT; s++)
    CHECK(sh_kernel_calls(SH_BACKEND_CPU, s) > 0,
          "no row of tests/ops/op_table.h reaches kernel slot %s on the cpu (add a row for its op)",
          sh_backend_slot_name(s));
}

/* ---- the table ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  uint64_t base = ot_base_seed();
  double t0 = ot_now();
  if (!filter) {
    check_references();
    check_f64_paths();
    check_tables_filled();
  }
  /* the f64 case of an f64-referenced row is its own reference: test-gpu runs it */
  static const ot_pass cpu = { -1, 0, -1, 1, 0, 1, "", " (reference)", NULL, 0 };
  int rows, cases;
  ot_run_pass(&cpu, filter, base, &rows, &cases);
  /* the attention rows again under avx2 when the set in use is above it: the 8-lane build of
   * the block kernels (attn_blocks.c), which tests/run.sh's rerun under avx2 reaches too */
  int isa = sh_cpu_isa();
  if (isa > SH_CPU_AVX2 && (!filter || strstr("attention", filter) || strstr(filter, "attention"))) {
    static const ot_pass avx2 = { -1, 0, -1, 1, 0, 1, " [avx2]", " (reference)", NULL, 0 };
    int arows, acases;
    CHECK_OK(sh_cpu_set_isa(SH_CPU_AVX2));
    ot_run_pass(&avx2, filter ? filter : "attention", base, &arows, &acases);
    CHECK_OK(sh_cpu_set_isa(isa));
    cases += acases;
  }
  if (!filter) check_slots_covered();
  printf("test_op_table: %d rows, %d cases on the cpu in %.2f s (seed %llu%s%s)\n", rows, cases, ot_now() - t0,
         (unsigned long long)base, filter ? ", filter " : "", filter ? filter : "");
  return check_summary("test_op_table");
}
