/* op_table.h: one table of op cases for every backend (as ggml's test-backend-ops).
 *
 * Each row names a public op (ops.h, nn.h, optim.h, copy_/fill_ of tensor.h), the dtypes it
 * runs in, its shapes (odd and degenerate ones included) and attributes, its tolerance, and
 * a runner. A runner builds its inputs from a seeded generator (ot_in: the same values on
 * every device and pass), calls the public op on the run's device, and hands back what it
 * produced as a list of named tensors (ot_out), parameter gradients accumulated into dw/db
 * included. Two mains include this one table:
 *  - tests/c/test_op_table.c (make test): runs each row in its dtype on the CPU and compares
 *    it to the row's reference (`ref`):
 *      OT_REF_F64   the SAME row run on the CPU in f64 (inputs are the row-dtype values
 *                   converted to f64). Only for ops whose CPU kernels compute f64 in f64:
 *                   elementwise, reductions, matmul/gemm_ (dgemm), arange; the CPU main
 *                   checks that claim op by op before the table.
 *      OT_REF_HOST  a hand-written double reference in the runner's `host` branch, for
 *                   the ops whose CPU kernels stage everything through f32 (all of nn.h,
 *                   optim.h, the random fills) or whose result is a conversion (copy_,
 *                   fill_). The CPU main checks each backward reference against central
 *                   finite differences of its forward reference, so a reference is not the
 *                   kernel's formula written twice.
 *  - tests/gpu/test_op_table.c (make test-gpu): runs each row on cuda:0 and on the CPU in
 *    the same dtype with the same inputs and compares them.
 * The op run (not the reference) runs twice: in between, every tensor the first pass
 * produced is filled with NaN (-7 for integers) and freed, and the inputs are refilled in
 * place (staged outside the caching allocator), so the allocator hands the poisoned blocks
 * to the second pass's outputs and an element a kernel fails to write shows as NaN. (A
 * CPU kernel's own staging buffers are not poisoned: an unwritten element there shows as
 * a wrong value instead.)
 *
 * Comparison: normwise relative error ||got - ref|| / ||ref|| in f64 (absolute when ref is
 * all zeros) against the row's tolerance for its dtype (f64 1e-12, f32 1e-5, bf16 1e-2,
 * f16 5e-3, integers exact unless the row says otherwise); an output may set its own
 * (ot_out_tol) or scale the row's (ot_out_mult). An output that is zero in exact arithmetic
 * (ot_out_zero: attention's dq and dk at T = 1, where softmax over one key is constant)
 * is held to an absolute RMS error instead: its rounding noise has no scale to be relative
 * to, and two correct backends disagree on it by 100%. NaN or Inf anywhere never passes.
 *
 * Shapes are small on purpose (the table also runs under a CUDA emulator): the odd sizes,
 * T = 1, batch 1, empty dims and the vocab sizes 50257 / 50304 (small in the other dims)
 * are where kernels break, not large sizes.
 *
 * Adding a case: a row in ot_table below, with an existing runner and its attributes (each
 * runner's comment says what its s[], k[], a[] and shapes mean), or a new runner: build
 * inputs with ot_in/ot_empty, call the op with OT_CALL, record outputs with ot_out*, and for
 * OT_REF_HOST compute the same outputs in double in an `if (r->host)` branch.
 */
#pragma once
#include <math.h>
#include <time.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops/nn.h"
#include "ops/optim.h"
#include "core/philox_internal.h"   /* the documented random stream: reference of random_ and dropout */

#define OT_S(...) ((int64_t[]){__VA_ARGS__})

enum {
  OT_F64 = 1 << SH_F64, OT_F32 = 1 << SH_F32, OT_BF16 = 1 << SH_BF16, OT_F16 = 1 << SH_F16,
  OT_I64 = 1 << SH_I64, OT_I32 = 1 << SH_I32,
  OT_FLOATS = OT_F32 | OT_BF16 | OT_F16,
  OT_ALL_FLOATS = OT_F32 | OT_BF16 | OT_F16 | OT_F64,
};
enum { OT_REF_F64 = 0, OT_REF_HOST = 1 };
/* A dtype argument of ot_in/ot_empty: OT_ROW is the row's dtype of this case. In a
 * dtype-valued row field (k[]), 0 is the row's dtype and OT_DT(d) is d. */
enum { OT_ROW = -1 };
#define OT_DT(d) ((d) + 1)
/* input distributions (p1, p2): normal (mean, std), uniform (low, high), integers in
 * [p1, p2) with the first and last element at the bounds, multiples of 0.5 in [p1, p2]
 * (ties for comparisons), zeros, class targets in [0, p1) with every p2-th row ignored
 * (-100; p2 = 0 none, 1 all). */
enum { OT_NORMAL, OT_UNIFORM, OT_INT, OT_GRID, OT_ZERO, OT_TARGETS, OT_POISON };
enum { OT_IGNORE = -100 };
enum { OT_MAX_IN = 16, OT_MAX_OUT = 24, OT_MAX_TMP = 48, OT_MAX_BUF = 48 };

typedef struct ot_run ot_run;

typedef struct ot_row {
  const char *op;        /* the public op; the mains' filter matches a substring of it */
  const char *what;      /* the case: shapes and attributes */
  unsigned dtypes;       /* OT_F32 | ...: one case per dtype */
  int ref;               /* OT_REF_F64 or OT_REF_HOST */
  void (*run)(ot_run *r);
  int nd[3];             /* up to three shapes (meaning per runner) */
  int64_t sh[3][5];
  int64_t s[4];          /* sizes */
  int k[4];              /* integer attributes: op codes, flags, dtypes (OT_DT) */
  double a[4];           /* real attributes */
  double tol[8];         /* normwise tolerance by the case's dtype; 0: the default */
} ot_row;

struct ot_run {
  const ot_row *row;
  int dtype;             /* the case's dtype */
  int device;            /* -1 cpu, N cuda:N */
  int ref;               /* reference run: float inputs in f64 (rounded through their dtype) */
  int host;              /* compute with the runner's hand-written double reference */
  int pass;              /* 0: inputs are made; 1: the same inputs are refilled in place */
  uint64_t seed;
  int n_in, in_i;
  sh_tensor *in[OT_MAX_IN];
  int n_out;
  sh_tensor *out[OT_MAX_OUT];
  char out_name[OT_MAX_OUT][40];
  double out_mult[OT_MAX_OUT], out_fixed[OT_MAX_OUT];
  int out_zero[OT_MAX_OUT];
  int n_tmp;
  sh_tensor *tmp[OT_MAX_TMP];
  int n_buf;
  double *buf[OT_MAX_BUF];
  int failed;
  char msg[600];
};

/* ---- generator and bookkeeping ----------------------------------------------------------- */

static uint64_t ot_mix(uint64_t a, uint64_t b) {   /* splitmix64 of a combined with b */
  uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void ot_fail(ot_run *r, const char *fmt, ...) {
  if (r->failed) return;
  r->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
}

/* Runs a runtime call; on failure records it and returns from the runner. */
#define OT_CALL(r, expr) do { \
    if ((r)->failed) return; \
    int ot_rc_ = (expr); \
    if (ot_rc_) { ot_fail((r), "%s returned %d: %s", #expr, ot_rc_, sh_last_error()); return; } \
  } while (0)
#define OT_OK(r) do { if ((r)->failed) return; } while (0)

static int ot_is_float(int dt) { return dt == SH_F64 || dt == SH_F32 || dt == SH_BF16 || dt == SH_F16; }

static int64_t ot_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static void ot_gen(double *v, int64_t n, int dist, double p1, double p2, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i++) {
    s = ot_mix(s, (uint64_t)i);
    double u = ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0);   /* (0, 1) */
    switch (dist) {
      case OT_NORMAL: {
        uint64_t s2 = ot_mix(s, 7);
        double u2 = ((s2 >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        v[i] = p1 + p2 * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * u2);
        break;
      }
      case OT_UNIFORM: v[i] = p1 + (p2 - p1) * u; break;
      case OT_INT: v[i] = floor(p1 + (p2 - p1) * u); if (v[i] >= p2) v[i] = p2 - 1; break;
      case OT_GRID: v[i] = p1 + 0.5 * floor((p2 - p1) * 2.0 * u + 0.5); break;
      case OT_TARGETS: {
        double t = floor(p1 * u);
        if (t >= p1) t = p1 - 1;
        v[i] = p2 > 0 && i % (int64_t)p2 == 0 ? OT_IGNORE : t;
        break;
      }
      default: v[i] = 0; break;
    }
  }
  if (dist == OT_INT && n > 0) { v[0] = p1; v[n - 1] = p2 - 1; }
  if (dist == OT_TARGETS && n > 1 && v[n - 1] != OT_IGNORE) v[n - 1] = p1 - 1;
}

static int ot_dt(const ot_run *r, int dt) { return dt == OT_ROW ? r->dtype : dt; }
static int ot_kdt(const ot_run *r, int code) { return code ? code - 1 : r->dtype; }

/* The dtype an input of dtype dt has in this run: floats (and the row's own dtype, integer
 * rows included) become f64 in a reference run. */
static int ot_run_dt(const ot_run *r, int dt) {
  int d = ot_dt(r, dt);
  return r->ref && (dt == OT_ROW || ot_is_float(d)) ? SH_F64 : d;
}

static double *ot_buf(ot_run *r, int64_t n) {
  double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!p || r->n_buf >= OT_MAX_BUF) { free(p); fprintf(stderr, "op_table: out of buffers\n"); exit(2); }
  r->buf[r->n_buf++] = p;
  return p;
}

static sh_tensor *ot_tmp(ot_run *r, sh_tensor *t) {
  if (!t) return NULL;
  if (r->n_tmp >= OT_MAX_TMP) { fprintf(stderr, "op_table: too many temporaries\n"); exit(2); }
  r->tmp[r->n_tmp++] = t;
  return t;
}

/* A new input (pass 0) or the same input refilled with the same values (pass 1). */
static sh_tensor *ot_in(ot_run *r, int ndim, const int64_t *shape, int dt, int dist, double p1, double p2) {
  if (r->failed) return NULL;
  int k = r->in_i++;
  if (k >= OT_MAX_IN) { ot_fail(r, "op_table: too many inputs"); return NULL; }
  int d0 = ot_dt(r, dt), dr = ot_run_dt(r, dt);
  int64_t n = ot_numel(ndim, shape);
  sh_tensor *h = NULL, *h2 = NULL, *t = NULL;
  /* A refill stages its values outside the caching allocator: a pool block here would be
   * one the first pass poisoned, taken away from the op's outputs. */
  void *ext = NULL;
  int rc;
  if (r->pass == 0) {
    rc = sh_tensor_empty(&h, ndim, shape, d0, -1);
  } else {
    size_t nb = (size_t)(n > 0 ? n : 1) * (size_t)sh_dtype_size(d0);
    ext = malloc(nb);
    rc = ext ? sh_tensor_wrap_external(&h, ext, (int64_t)nb, ndim, shape, d0) : SH_ERR_OOM;
  }
  if (!rc && dist == OT_POISON) {
    rc = sh_tensor_fill_(h, ot_is_float(d0) ? NAN : -7);
  } else if (!rc) {
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    ot_gen(v, n, dist, p1, p2, ot_mix(r->seed, (uint64_t)k));
    rc = sh_tensor_write_f64(h, v);    /* rounds to d0 */
    free(v);
  }
  if (!rc && dr != d0) { rc = sh_tensor_to(&h2, h, dr, -1); sh_tensor_destroy(h); h = h2; }
  if (rc) { sh_tensor_destroy(h); free(ext); ot_fail(r, "making input %d: %s", k, sh_last_error()); return NULL; }
  if (r->pass == 0) {
    if (r->device < 0) t = h;
    else {
      rc = sh_tensor_to(&t, h, dr, r->device);
      sh_tensor_destroy(h);
      if (rc) { ot_fail(r, "moving input %d to cuda:%d: %s", k, r->device, sh_last_error()); return NULL; }
    }
    r->in[k] = t;
    r->n_in = k + 1;
  } else {
    t = r->in[k];
    rc = sh_tensor_copy_(t, h);
    sh_tensor_destroy(h);
    free(ext);
    if (rc) { ot_fail(r, "refilling input %d: %s", k, sh_last_error()); return NULL; }
  }
  return t;
}

/* An output buffer the test allocates (the dst of copy_, the target of a random fill):
 * NaN-filled (-7 for integers) before every pass, so an unwritten element shows. */
static sh_tensor *ot_empty(ot_run *r, int ndim, const int64_t *shape, int dt) {
  return ot_in(r, ndim, shape, dt, OT_POISON, 0, 0);
}

static sh_tensor *ot_transpose(ot_run *r, const sh_tensor *t, int d0, int d1) {
  sh_tensor *v = NULL;
  if (r->failed) return NULL;
  if (sh_view_transpose(&v, t, d0, d1)) { ot_fail(r, "transpose: %s", sh_last_error()); return NULL; }
  return ot_tmp(r, v);
}

static sh_tensor *ot_select(ot_run *r, const sh_tensor *t, int dim, int64_t i) {
  sh_tensor *v = NULL;
  if (r->failed) return NULL;
  if (sh_view_select(&v, t, dim, i)) { ot_fail(r, "select: %s", sh_last_error()); return NULL; }
  return ot_tmp(r, v);
}

/* An input as ot_in makes it, but a view one element into a longer buffer, so its data is
 * only element-aligned (FSDP packs parameters at any element offset of a FlatParameter). */
static sh_tensor *ot_in_offset(ot_run *r, int ndim, const int64_t *shape, int dt, int dist, double p1, double p2) {
  int64_t n = ot_numel(ndim, shape);
  sh_tensor *buf = ot_in(r, 1, OT_S(n + 1), dt, dist, p1, p2), *flat = NULL, *v = NULL;
  if (r->failed) return NULL;
  int rc = sh_view_narrow(&flat, buf, 0, 1, n);
  if (!rc) rc = sh_view_reshape(&v, flat, ndim, shape);
  sh_tensor_destroy(flat);
  if (rc) { ot_fail(r, "offset view: %s", sh_last_error()); return NULL; }
  return ot_tmp(r, v);
}

/* Records an output (taking ownership). mult scales the row's tolerance; fixed >= 0
 * replaces it. */
static void ot_out_full(ot_run *r, const char *name, sh_tensor *t, double mult, double fixed) {
  if (r->failed) { sh_tensor_destroy(t); return; }
  if (!t) { ot_fail(r, "output %s is missing (NULL)", name); return; }
  if (r->n_out >= OT_MAX_OUT) { fprintf(stderr, "op_table: too many outputs\n"); exit(2); }
  snprintf(r->out_name[r->n_out], sizeof r->out_name[0], "%s", name);
  r->out[r->n_out] = t;
  r->out_mult[r->n_out] = mult;
  r->out_fixed[r->n_out] = fixed;
  r->out_zero[r->n_out] = 0;
  r->n_out++;
}
static void ot_out(ot_run *r, const char *name, sh_tensor *t) { ot_out_full(r, name, t, 1, -1); }
static void ot_out_mult(ot_run *r, const char *name, sh_tensor *t, double mult) { ot_out_full(r, name, t, mult, -1); }
static void ot_out_tol(ot_run *r, const char *name, sh_tensor *t, double tol) { ot_out_full(r, name, t, 1, tol); }
/* An output that is exactly zero in exact arithmetic: RMS(got - ref) <= the row's tolerance. */
static void ot_out_zero(ot_run *r, const char *name, sh_tensor *t) {
  ot_out_full(r, name, t, 1, -1);
  if (!r->failed && r->n_out > 0) r->out_zero[r->n_out - 1] = 1;
}
/* An input updated in place (dw += ..., param -= ...) as an output: a new struct of the
 * same view. */
static void ot_out_inplace(ot_run *r, const char *name, const sh_tensor *t, double mult, double fixed) {
  sh_tensor *a = NULL;
  if (r->failed) return;
  if (sh_tensor_alias(&a, t)) { ot_fail(r, "alias: %s", sh_last_error()); return; }
  ot_out_full(r, name, a, mult, fixed);
}

/* ---- host (reference) side ------------------------------------------------------------------ */

/* Every element of t in row-major order as doubles (any view, dtype, device: host only). */
static double *ot_d(ot_run *r, const sh_tensor *t) {
  if (r->failed || !t) return NULL;
  double *v = ot_buf(r, sh_tensor_numel(t));
  if (sh_tensor_read_f64(t, v)) { ot_fail(r, "read_f64: %s", sh_last_error()); return NULL; }
  return v;
}

/* A host output of dtype dt (f64 unless a conversion is the point) holding v. */
static void ot_host_out_full(ot_run *r, const char *name, int ndim, const int64_t *shape, int dt,
                             const double *v, double mult, double fixed) {
  sh_tensor *t = NULL;
  if (r->failed) return;
  if (sh_tensor_empty(&t, ndim, shape, dt, -1) || sh_tensor_write_f64(t, v)) {
    sh_tensor_destroy(t);
    ot_fail(r, "host output %s: %s", name, sh_last_error());
    return;
  }
  ot_out_full(r, name, t, mult, fixed);
}
static void ot_host_out(ot_run *r, const char *name, int ndim, const int64_t *shape, const double *v) {
  ot_host_out_full(r, name, ndim, shape, SH_F64, v, 1, -1);
}
static void ot_host_out_like(ot_run *r, const char *name, const sh_tensor *like, const double *v) {
  ot_host_out_full(r, name, like->ndim, like->shape, SH_F64, v, 1, -1);
}

/* ---- running a case ---------------------------------------------------------------------------- */

static void ot_begin(ot_run *r, const ot_row *row, int dtype, int device, int ref, uint64_t seed) {
  memset(r, 0, sizeof *r);
  r->row = row;
  r->dtype = dtype;
  r->device = device;
  r->ref = ref;
  r->host = ref && row->ref == OT_REF_HOST;
  r->seed = seed;
}

static void ot_free_pass(ot_run *r, int poison) {
  for (int i = 0; i < r->n_out + r->n_tmp; i++) {
    sh_tensor *t = i < r->n_out ? r->out[i] : r->tmp[i - r->n_out];
    if (!t) continue;
    int is_input = 0;
    for (int k = 0; k < r->n_in && t->storage; k++) is_input |= r->in[k] && r->in[k]->storage == t->storage;
    if (poison && !is_input && t->storage && sh_tensor_numel(t) > 0)
      sh_tensor_fill_(t, ot_is_float(t->dtype) ? NAN : -7);
    sh_tensor_destroy(t);
  }
  r->n_out = r->n_tmp = 0;
  for (int i = 0; i < r->n_buf; i++) free(r->buf[i]);
  r->n_buf = 0;
}

/* One pass, or two with the first pass's results poisoned in between. */
static void ot_exec(ot_run *r, int twice) {
  r->pass = 0;
  r->in_i = 0;
  r->row->run(r);
  if (!twice || r->failed) return;
  ot_free_pass(r, 1);
  r->pass = 1;
  r->in_i = 0;
  r->row->run(r);
}

static void ot_end(ot_run *r) {
  ot_free_pass(r, 0);
  for (int k = 0; k < r->n_in; k++) sh_tensor_destroy(r->in[k]);
  r->n_in = 0;
}

/* ---- comparison ----------------------------------------------------------------------------------- */

static double ot_default_tol(int dt) {
  switch (dt) {
    case SH_F64: return 1e-12;
    case SH_F32: return 1e-5;
    case SH_BF16: return 1e-2;
    case SH_F16: return 5e-3;
    default: return 0;
  }
}
static double ot_row_tol(const ot_row *row, int dt) { return row->tol[dt] > 0 ? row->tol[dt] : ot_default_tol(dt); }

static double *ot_read(const sh_tensor *t, int64_t *n) {
  sh_tensor *c = NULL, *h = NULL;
  *n = sh_tensor_numel(t);
  double *v = malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
  int rc = 0;
  if (t->device >= 0) {
    rc = sh_tensor_contiguous(&c, t);
    if (!rc) rc = sh_tensor_to(&h, c, SH_F64, -1);
    if (!rc) rc = sh_tensor_read_f64(h, v);
  } else {
    rc = sh_tensor_read_f64(t, v);
  }
  sh_tensor_destroy(c);
  sh_tensor_destroy(h);
  if (rc) { free(v); return NULL; }
  return v;
}

static const char *ot_shape_str(const sh_tensor *t, char *buf, int size) {
  sh_tensor_describe(t, buf, size);
  return buf;
}

/* Compares every output of got against ref (same names, shapes; same dtypes when
 * same_dtype). Returns the worst error / tolerance ratio seen (for verbose output). */
static double ot_compare(const ot_run *got, const ot_run *ref, int same_dtype, const char *label) {
  const ot_row *row = got->row;
  double worst = 0;
  CHECK(got->n_out == ref->n_out, "%s: %d outputs vs %d in the reference", label, got->n_out, ref->n_out);
  int n = got->n_out < ref->n_out ? got->n_out : ref->n_out;
  for (int i = 0; i < n; i++) {
    const sh_tensor *a = got->out[i], *b = ref->out[i];
    char sa[96], sb[96];
    const char *name = got->out_name[i];
    if (strcmp(name, ref->out_name[i])) { CHECK(0, "%s: output %d is %s vs %s", label, i, name, ref->out_name[i]); continue; }
    int same = a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
    CHECK(same, "%s: %s: shape %s vs reference %s", label, name, ot_shape_str(a, sa, 96), ot_shape_str(b, sb, 96));
    if (!same) continue;
    if (same_dtype)
      CHECK(a->dtype == b->dtype, "%s: %s: dtype %s vs reference %s", label, name, ot_shape_str(a, sa, 96), ot_shape_str(b, sb, 96));
    int64_t na, nb;
    double *x = ot_read(a, &na), *y = ot_read(b, &nb);
    if (!x || !y) {
      CHECK(0, "%s: %s: reading the result: %s", label, name, sh_last_error());
      free(x); free(y);
      continue;
    }
    double num = 0, den = 0;
    int64_t bad_at = -1;
    for (int64_t j = 0; j < na; j++) {
      if (!isfinite(x[j]) || !isfinite(y[j])) {
        if (bad_at < 0) bad_at = j;
        continue;
      }
      num += (x[j] - y[j]) * (x[j] - y[j]);
      den += y[j] * y[j];
    }
    double err = got->out_zero[i] ? sqrt(num / (double)(na > 0 ? na : 1)) : den > 0 ? sqrt(num / den) : sqrt(num);
    double tol = got->out_fixed[i] >= 0 ? got->out_fixed[i] : got->out_mult[i] * ot_row_tol(row, got->dtype);
    CHECK(bad_at < 0, "%s: %s: element %lld is %g, reference %g (NaN or Inf never passes; NaN: unwritten output?)",
          label, name, (long long)bad_at, bad_at >= 0 ? x[bad_at] : 0.0, bad_at >= 0 ? y[bad_at] : 0.0);
    CHECK(err <= tol, "%s: %s: %s error %.3g > %.3g (%s)", label, name, got->out_zero[i] ? "absolute RMS" : "relative", err, tol, ot_shape_str(a, sa, 96));
    double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0);
    if (ratio > worst) worst = ratio;
    if (getenv("SHARD_TEST_VERBOSE")) printf("    %-64s %-12s err %.3g (tol %.3g)\n", label, name, err, tol);
    free(x);
    free(y);
  }
  return worst;
}

/* The label of a case: op, dtype and what. */
static void ot_label(char *buf, int size, const ot_row *row, int dtype) {
  snprintf(buf, (size_t)size, "%s %s %s", row->op, sh_dtype_name(dtype), row->what);
}

/* ---- double references ------------------------------------------------------------------------ */

#define OT_GELU_K 0.7978845608028654   /* sqrt(2 / pi) */
#define OT_GELU_A 0.044715

static double ot_gelu(double x) { return 0.5 * x * (1.0 + tanh(OT_GELU_K * (x + OT_GELU_A * x * x * x))); }
static double ot_gelu_grad(double x) {
  double t = tanh(OT_GELU_K * (x + OT_GELU_A * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * OT_GELU_K * (1.0 + 3.0 * OT_GELU_A * x * x);
}
static double ot_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ot_silu(double x) { return x * ot_sigmoid(x); }
static double ot_silu_grad(double x) { double s = ot_sigmoid(x); return s * (1.0 + x * (1.0 - s)); }

/* y[rows, out] = x[rows, in] w[out, in]^T + b */
static void ref_linear(const double *x, const double *w, const double *b, double *y, int64_t rows, int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t o = 0; o < out; o++) {
      double s = b ? b[o] : 0.0;
      for (int64_t i = 0; i < in; i++) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
}

/* dx = dy w (when dx), dw += dy^T x, db += colsum(dy) (each when given) */
static void ref_linear_bwd(const double *dy, const double *x, const double *w, double *dx, double *dw, double *db,
                           int64_t rows, int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t i = 0; i < in && dx; i++) {
      double s = 0;
      for (int64_t o = 0; o < out; o++) s += dy[r * out + o] * w[o * in + i];
      dx[r * in + i] = s;
    }
    for (int64_t o = 0; o < out; o++) {
      if (db) db[o] += dy[r * out + o];
      for (int64_t i = 0; i < in && dw; i++) dw[o * in + i] += dy[r * out + o] * x[r * in + i];
    }
  }
}

/* layernorm (centered) or rmsnorm over rows of C; w, b may be NULL; mean may be NULL. */
static void ref_norm(const double *x, const double *w, const double *b, double *y, double *mean, double *rstd,
                     int64_t rows, int64_t C, double eps, int centered) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * C;
    double m = 0, v = 0;
    if (centered) {
      for (int64_t i = 0; i < C; i++) m += xr[i];
      m /= (double)C;
    }
    for (int64_t i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
    double rs = 1.0 / sqrt(v / (double)C + eps);
    for (int64_t i = 0; i < C; i++) y[r * C + i] = (xr[i] - m) * rs * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}

/* dx (new), dw += sum dy xhat, db += sum dy */
static void ref_norm_bwd(const double *dy, const double *x, const double *w, double *dx, double *dw, double *db,
                         int64_t rows, int64_t C, double eps, int centered) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * C, *g = dy + r * C;
    double m = 0, v = 0;
    if (centered) {
      for (int64_t i = 0; i < C; i++) m += xr[i];
      m /= (double)C;
    }
    for (int64_t i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
    double rs = 1.0 / sqrt(v / (double)C + eps), s1 = 0, s2 = 0;
    for (int64_t i = 0; i < C; i++) {
      double xh = (xr[i] - m) * rs, gh = g[i] * (w ? w[i] : 1.0);
      s1 += gh;
      s2 += gh * xh;
      if (dw) dw[i] += g[i] * xh;
      if (db) db[i] += g[i];
    }
    s1 /= (double)C;
    s2 /= (double)C;
    for (int64_t i = 0; i < C && dx; i++) {
      double xh = (xr[i] - m) * rs, gh = g[i] * (w ? w[i] : 1.0);
      dx[r * C + i] = rs * (gh - (centered ? s1 : 0.0) - xh * s2);
    }
  }
}

static void ref_softmax(const double *x, double *y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < C; i++) m = fmax(m, x[r * C + i]);
    for (int64_t i = 0; i < C; i++) s += exp(x[r * C + i] - m);
    for (int64_t i = 0; i < C; i++) y[r * C + i] = exp(x[r * C + i] - m) / s;
  }
}

static void ref_softmax_bwd(const double *dy, const double *y, double *dx, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t i = 0; i < C; i++) s += dy[r * C + i] * y[r * C + i];
    for (int64_t i = 0; i < C; i++) dx[r * C + i] = y[r * C + i] * (dy[r * C + i] - s);
  }
}

/* Causal attention over contiguous [BH, T, D] q, k, v: out and lse (each optional). */
static void ref_attention(const double *q, const double *k, const double *v, double *out, double *lse,
                          int64_t BH, int64_t T, int64_t D, double scale) {
  double *s = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
  for (int64_t bh = 0; bh < BH; bh++)
    for (int64_t i = 0; i < T; i++) {
      const double *qi = q + (bh * T + i) * D;
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; j++) {
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += qi[e] * k[(bh * T + j) * D + e];
        s[j] = d * scale;
        m = fmax(m, s[j]);
      }
      for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - m);
      if (out) {
        double *o = out + (bh * T + i) * D;
        for (int64_t e = 0; e < D; e++) o[e] = 0;
        for (int64_t j = 0; j <= i; j++) {
          double p = exp(s[j] - m) / sum;
          for (int64_t e = 0; e < D; e++) o[e] += p * v[(bh * T + j) * D + e];
        }
      }
      if (lse) lse[bh * T + i] = m + log(sum);
    }
  free(s);
}

static void ref_attention_bwd(const double *dout, const double *q, const double *k, const double *v, double *dq,
                              double *dk, double *dv, int64_t BH, int64_t T, int64_t D, double scale) {
  int64_t n = BH * T * D;
  memset(dq, 0, sizeof(double) * (size_t)n);
  memset(dk, 0, sizeof(double) * (size_t)n);
  memset(dv, 0, sizeof(double) * (size_t)n);
  double *p = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1)), *dp = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
  for (int64_t bh = 0; bh < BH; bh++)
    for (int64_t i = 0; i < T; i++) {
      const double *qi = q + (bh * T + i) * D, *go = dout + (bh * T + i) * D;
      double m = -INFINITY, sum = 0, pdp = 0;
      for (int64_t j = 0; j <= i; j++) {
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += qi[e] * k[(bh * T + j) * D + e];
        p[j] = d * scale;
        m = fmax(m, p[j]);
      }
      for (int64_t j = 0; j <= i; j++) sum += exp(p[j] - m);
      for (int64_t j = 0; j <= i; j++) {
        p[j] = exp(p[j] - m) / sum;
        double d = 0;
        for (int64_t e = 0; e < D; e++) d += go[e] * v[(bh * T + j) * D + e];
        dp[j] = d;
        pdp += p[j] * d;
      }
      for (int64_t j = 0; j <= i; j++) {
        double ds = p[j] * (dp[j] - pdp) * scale;
        for (int64_t e = 0; e < D; e++) {
          dv[(bh * T + j) * D + e] += p[j] * go[e];
          dq[(bh * T + i) * D + e] += ds * k[(bh * T + j) * D + e];
          dk[(bh * T + j) * D + e] += ds * qi[e];
        }
      }
    }
  free(p);
  free(dp);
}

/* Mean cross-entropy over the rows whose target is not `ignore` (0 when none is). */
static double ref_cross_entropy(const double *x, const double *t, double *lse, int64_t N, int64_t V, double ignore) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < N; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) m = fmax(m, x[r * V + j]);
    for (int64_t j = 0; j < V; j++) s += exp(x[r * V + j] - m);
    double l = m + log(s);
    if (lse) lse[r] = l;
    if (t[r] == ignore) continue;
    sum += l - x[r * V + (int64_t)t[r]];
    count++;
  }
  return count ? sum / (double)count : 0.0;
}

static void ref_cross_entropy_bwd(const double *x, const double *t, double *dx, int64_t N, int64_t V, double ignore,
                                  double dloss) {
  int64_t count = 0;
  for (int64_t r = 0; r < N; r++) count += t[r] != ignore;
  double g = count ? dloss / (double)count : 0.0;
  for (int64_t r = 0; r < N; r++) {
    if (t[r] == ignore) { memset(dx + r * V, 0, sizeof(double) * (size_t)V); continue; }
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) m = fmax(m, x[r * V + j]);
    for (int64_t j = 0; j < V; j++) s += exp(x[r * V + j] - m);
    for (int64_t j = 0; j < V; j++) dx[r * V + j] = exp(x[r * V + j] - m) / s * g;
    dx[r * V + (int64_t)t[r]] -= g;
  }
}

/* Number i of the stream (seed, offset), in double from the stream's bits (philox_internal.h
 * defines the stream: Philox4x32-10, 24-bit uniforms in (0, 1], Box-Muller on pairs). */
static double ref_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t n = offset + i;
  sh_philox_out o = sh_philox4x32(seed, n >> 2);
  return ((o.v[n & 3] >> 8) + 1) / 16777216.0;
}
static double ref_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t n = offset + i;
  sh_philox_out o = sh_philox4x32(seed, n >> 2);
  int pair = (int)(n & 2);
  double u1 = ((o.v[pair] >> 8) + 1) / 16777216.0, u2 = ((o.v[pair + 1] >> 8) + 1) / 16777216.0;
  double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
  return (n & 1) ? r * sin(th) : r * cos(th);
}

/* ---- runners: elementwise (f64 reference) ----------------------------------------------------- */

/* binary(op): a sh[0] op b sh[1]; k[0] op, k[1] distribution, k[2] b's dtype (OT_DT),
 * a[0..1] a's range, a[2..3] b's range (both 0: a's). */
static void run_binary(ot_run *r) {
  const ot_row *w = r->row;
  double blo = w->a[2] || w->a[3] ? w->a[2] : w->a[0], bhi = w->a[2] || w->a[3] ? w->a[3] : w->a[1];
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, w->k[1], w->a[0], w->a[1]);
  sh_tensor *b = ot_in(r, w->nd[1], w->sh[1], w->k[2] ? w->k[2] - 1 : OT_ROW, w->k[1], blo, bhi);
  sh_tensor *o = NULL;
  OT_CALL(r, sh_binary(&o, w->k[0], a, b));
  ot_out(r, "out", o);
}

/* binary_scalar(op): a sh[0] op a[2] (k[1]: a[2] op a); a[0..1] a's range */
static void run_binary_scalar(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_UNIFORM, w->a[0], w->a[1]), *o = NULL;
  OT_CALL(r, sh_binary_scalar(&o, w->k[0], a, w->a[2], w->k[1]));
  ot_out(r, "out", o);
}

static void run_unary(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_UNIFORM, w->a[0], w->a[1]), *o = NULL;
  OT_CALL(r, sh_unary(&o, w->k[0], a));
  ot_out(r, "out", o);
}

/* binary_(k[0]) / axpy_ / scale_ (k[1] = 0, 1, 2): dst sh[0] (row dtype) updated by x sh[1]
 * of dtype k[2] (OT_DT); alpha a[0]. */
static void run_inplace(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *d = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *x = w->k[1] == 2 ? NULL : ot_in(r, w->nd[1], w->sh[1], w->k[2] ? w->k[2] - 1 : OT_ROW, OT_NORMAL, 0, 1);
  if (w->k[1] == 0) OT_CALL(r, sh_binary_(d, w->k[0], x));
  else if (w->k[1] == 1) OT_CALL(r, sh_axpy_(d, w->a[0], x));
  else OT_CALL(r, sh_scale_(d, w->a[0]));
  ot_out_inplace(r, "dst", d, 1, -1);
}

/* ---- runners: reductions (f64 reference) ----------------------------------------------------- */

/* reduce(k[0]) of a sh[0] over everything and over each dim, keepdim 0 and 1 */
static void run_reduce(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_NORMAL, 0, 1), *o = NULL;
  OT_CALL(r, sh_reduce_all(&o, w->k[0], a));
  ot_out(r, "all", o);
  for (int d = 0; d < w->nd[0]; d++)
    for (int keep = 0; keep < 2; keep++) {
      char name[32];
      snprintf(name, sizeof name, "dim %d%s", d, keep ? " keep" : "");
      OT_CALL(r, sh_reduce(&o, w->k[0], a, d, keep));
      ot_out(r, name, o);
    }
}

static void run_argmax(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, w->k[1] ? w->k[1] : OT_NORMAL, 0, 1), *o = NULL;
  for (int d = 0; d < w->nd[0]; d++) {
    char name[32];
    snprintf(name, sizeof name, "dim %d%s", d, d == 1 ? " keep" : "");
    OT_CALL(r, sh_argmax(&o, a, d, d == 1));
    ot_out_tol(r, name, o, 0);
  }
}

/* sum_to_shape of a sh[0] to sh[1] */
static void run_sum_to_shape(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_NORMAL, 0, 1), *o = NULL;
  OT_CALL(r, sh_sum_to_shape(&o, a, w->nd[1], w->sh[1]));
  ot_out(r, "out", o);
}

/* sumsq accumulates in f64 on every backend: 1e-9 whatever the dtype */
static void run_sumsq(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_NORMAL, 0, 1), *o = NULL;
  OT_OK(r);
  int st = 0;
  double v = sh_sumsq(a, &st);
  if (st) { ot_fail(r, "sumsq returned %d: %s", st, sh_last_error()); return; }
  OT_CALL(r, sh_tensor_empty(&o, 0, NULL, SH_F64, -1));
  sh_tensor_write_f64(o, &v);
  ot_out_tol(r, "sumsq", o, 1e-9);
}

/* ---- runners: products (f64 reference) ------------------------------------------------------- */

static void run_matmul(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *a = ot_in(r, w->nd[0], w->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *b = ot_in(r, w->nd[1], w->sh[1], OT_ROW, OT_NORMAL, 0, 1), *o = NULL;
  OT_CALL(r, sh_matmul(&o, a, b));
  ot_out(r, "out", o);
}

/* gemm_: c [M, N] = a[0] op(a) op(b) + a[1] c; s = M, N, K; k[0] trans_a, k[1] trans_b,
 * k[2] a passed as a transposed view of its transpose (no copy on either side). */
static void run_gemm(ot_run *r) {
  const ot_row *w = r->row;
  int64_t M = w->s[0], N = w->s[1], K = w->s[2];
  int ta = w->k[0], tb = w->k[1];
  sh_tensor *a;
  if (w->k[2]) {   /* a as stored for trans_a, passed as its transposed view with !trans_a */
    sh_tensor *as = ot_in(r, 2, ta ? OT_S(K, M) : OT_S(M, K), OT_ROW, OT_NORMAL, 0, 1);
    a = ot_transpose(r, as, 0, 1);
    ta = !ta;
  } else {
    a = ot_in(r, 2, ta ? OT_S(K, M) : OT_S(M, K), OT_ROW, OT_NORMAL, 0, 1);
  }
  sh_tensor *b = ot_in(r, 2, tb ? OT_S(N, K) : OT_S(K, N), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *c = ot_in(r, 2, OT_S(M, N), OT_ROW, OT_NORMAL, 0, 1);
  OT_CALL(r, sh_gemm_(c, a, b, ta, tb, w->a[0], w->a[1]));
  ot_out_inplace(r, "c", c, 1, -1);
}

/* ---- runners: creation, copies ------------------------------------------------------------------ */

/* arange(a[0], a[1], a[2]) in the case's dtype on the run's device (f64 reference: the CPU
 * forms start + i step in double for every dtype) */
static void run_arange(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *o = NULL;
  OT_CALL(r, sh_arange(&o, w->a[0], w->a[1], w->a[2], ot_run_dt(r, OT_ROW), r->device));
  ot_out(r, "out", o);
}

/* random normal_ (k[0] = 0; mean a[0], std a[1]) or uniform_ (k[0] = 1; [a[0], a[1]]) into
 * t sh[0] from (s[0], s[1]); k[1]: through a transposed view of t */
static void run_random(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *t = ot_empty(r, w->nd[0], w->sh[0], OT_ROW);
  OT_OK(r);
  uint64_t seed = (uint64_t)w->s[0], off = (uint64_t)w->s[1];
  if (r->host) {
    int64_t R = w->sh[0][0], C = w->nd[0] > 1 ? w->sh[0][1] : 1, n = sh_tensor_numel(t);
    double *v = ot_buf(r, n);
    for (int64_t i = 0; i < n; i++) {
      /* element i of the row-major order of the filled view */
      int64_t dst = i;
      if (w->k[1]) { int64_t c = i / R, rr = i % R; dst = rr * C + c; }
      double z = w->k[0] ? ref_uniform(seed, off, (uint64_t)i) : ref_normal(seed, off, (uint64_t)i);
      v[dst] = w->k[0] ? w->a[0] + (w->a[1] - w->a[0]) * z : w->a[0] + w->a[1] * z;
    }
    ot_host_out_like(r, "t", t, v);
    return;
  }
  sh_tensor *view = w->k[1] ? ot_transpose(r, t, 0, 1) : t;
  OT_OK(r);
  if (w->k[0]) OT_CALL(r, sh_random_uniform_(view, seed, off, w->a[0], w->a[1]));
  else OT_CALL(r, sh_random_normal_(view, seed, off, w->a[0], w->a[1]));
  ot_out_inplace(r, "t", t, 1, -1);
}

/* copy_ into a dst of dtype k[0] (OT_DT) from a source of the case's dtype: k[1] = 0: a
 * transposed view of src sh[0] (dims 0 and 2); 1: src sh[0] broadcast to dst sh[1]; 2: src
 * on the CPU into a dst on the run's device. Exact: the reference rounds each value into
 * dst's dtype once. */
static void run_copy(ot_run *r) {
  const ot_row *w = r->row;
  int ddt = ot_kdt(r, w->k[0]);
  int mode = w->k[1];
  int ints = !ot_is_float(r->dtype);
  sh_tensor *src = ot_in(r, w->nd[0], w->sh[0], OT_ROW, ints ? OT_INT : OT_UNIFORM, -50, 50);
  OT_OK(r);
  sh_tensor *view = mode == 0 ? ot_transpose(r, src, 0, 2) : src;
  OT_OK(r);
  int ndim = mode == 1 ? w->nd[1] : view->ndim;
  const int64_t *shape = mode == 1 ? w->sh[1] : view->shape;
  if (r->host) {
    int64_t n = ot_numel(ndim, shape), m = sh_tensor_numel(view);
    double *s = ot_d(r, view), *v = ot_buf(r, n);
    OT_OK(r);
    for (int64_t i = 0; i < n; i++) v[i] = s[i % m];   /* broadcasts are of leading dims here */
    ot_host_out_full(r, "dst", ndim, shape, ddt, v, 1, 0);
    return;
  }
  sh_tensor *dst = NULL, *host_src = NULL;
  if (mode == 2) {   /* a CPU source: copy_ across devices */
    OT_CALL(r, sh_tensor_to(&host_src, src, src->dtype, -1));
    ot_tmp(r, host_src);
  }
  dst = ot_empty(r, ndim, shape, ddt);
  OT_OK(r);
  OT_CALL(r, sh_tensor_copy_(dst, mode == 2 ? host_src : view));
  ot_out_inplace(r, "dst", dst, 1, 0);
}

static void run_fill(ot_run *r) {
  const ot_row *w = r->row;
  sh_tensor *t = ot_empty(r, w->nd[0], w->sh[0], OT_ROW);
  OT_OK(r);
  if (r->host) {
    int64_t n = sh_tensor_numel(t);
    double *v = ot_buf(r, n);
    for (int64_t i = 0; i < n; i++) v[i] = w->a[0];
    ot_host_out_full(r, "t", t->ndim, t->shape, r->dtype, v, 1, 0);
    return;
  }
  OT_CALL(r, sh_tensor_fill_(t, w->a[0]));
  ot_out_inplace(r, "t", t, 1, 0);
}

/* ---- runners: nn.h (hand-written double references) ------------------------------------------ */

/* rows of x seen as [rows, last dim] */
static int64_t ot_rows(int ndim, const int64_t *shape) { return ndim ? ot_numel(ndim - 1, shape) : 1; }

/* linear_forward: x sh[0] [..., in], w [s[0], in], b [s[0]] when k[0]; k[1]: then the same
 * product again with a bias one element into a buffer (ot_in_offset) */
static void run_linear_forward(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0];
  int64_t in = w_->sh[0][nd - 1], out = w_->s[0], rows = ot_rows(nd, w_->sh[0]);
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *w = ot_in(r, 2, OT_S(out, in), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *b = w_->k[0] ? ot_in(r, 1, OT_S(out), OT_ROW, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *b2 = w_->k[1] ? ot_in_offset(r, 1, OT_S(out), OT_ROW, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  int64_t ys[8];
  memcpy(ys, x->shape, sizeof(int64_t) * (size_t)nd);
  ys[nd - 1] = out;
  if (r->host) {
    double *y = ot_buf(r, rows * out), *y2 = ot_buf(r, rows * out), *xv = ot_d(r, x), *wv = ot_d(r, w);
    ref_linear(xv, wv, b ? ot_d(r, b) : NULL, y, rows, in, out);
    ot_host_out(r, "y", nd, ys, y);
    if (!b2) return;
    ref_linear(xv, wv, ot_d(r, b2), y2, rows, in, out);
    ot_host_out(r, "y, bias at +1", nd, ys, y2);
    return;
  }
  sh_tensor *y = NULL, *y2 = NULL;
  OT_CALL(r, sh_linear_forward(&y, x, w, b));
  ot_out(r, "y", y);
  if (!b2) return;
  OT_CALL(r, sh_linear_forward(&y2, x, w, b2));
  ot_out(r, "y, bias at +1", y2);
}

/* linear_backward: dx, and dw, db accumulated into random starting values, in f32 (k[1] = 0)
 * or in the case's dtype (k[1] = 1); k[0]: db given; k[2]: dx not asked for; k[3]: through
 * sh_linear_backward_set, which writes dw and db (the starting values must not show) */
static void run_linear_backward(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0];
  int64_t in = w_->sh[0][nd - 1], out = w_->s[0], rows = ot_rows(nd, w_->sh[0]);
  int64_t ys[8];
  memcpy(ys, w_->sh[0], sizeof(int64_t) * (size_t)nd);
  ys[nd - 1] = out;
  int gdt = w_->k[1] ? OT_ROW : SH_F32;
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *w = ot_in(r, 2, OT_S(out, in), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dy = ot_in(r, nd, ys, OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dw = ot_in(r, 2, OT_S(out, in), gdt, OT_NORMAL, 0, 1);
  sh_tensor *db = w_->k[0] ? ot_in(r, 1, OT_S(out), gdt, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  if (r->host) {
    double *dx = ot_buf(r, rows * in), *dwv = ot_d(r, dw), *dbv = db ? ot_d(r, db) : NULL;
    if (w_->k[3]) {
      memset(dwv, 0, sizeof(double) * (size_t)(out * in));
      if (dbv) memset(dbv, 0, sizeof(double) * (size_t)out);
    }
    ref_linear_bwd(ot_d(r, dy), ot_d(r, x), ot_d(r, w), dx, dwv, dbv, rows, in, out);
    if (!w_->k[2]) ot_host_out(r, "dx", nd, x->shape, dx);
    ot_host_out(r, "dw", 2, dw->shape, dwv);
    if (db) ot_host_out(r, "db", 1, db->shape, dbv);
    return;
  }
  sh_tensor *dx = NULL;
  if (w_->k[3]) OT_CALL(r, sh_linear_backward_set(w_->k[2] ? NULL : &dx, dw, db, dy, x, w, NULL));
  else OT_CALL(r, sh_linear_backward(w_->k[2] ? NULL : &dx, dw, db, dy, x, w));
  if (!w_->k[2]) ot_out(r, "dx", dx);
  ot_out_inplace(r, "dw", dw, 1, -1);
  if (db) ot_out_inplace(r, "db", db, 1, -1);
}

/* linear_gelu_forward: pre = x w^T + b, y = gelu(pre); x sh[0], w [s[0], in] */
static void run_linear_gelu_forward(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0];
  int64_t in = w_->sh[0][nd - 1], out = w_->s[0], rows = ot_rows(nd, w_->sh[0]);
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *w = ot_in(r, 2, OT_S(out, in), OT_ROW, OT_NORMAL, 0, 0.3);
  sh_tensor *b = w_->k[0] ? ot_in(r, 1, OT_S(out), OT_ROW, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  int64_t ys[8];
  memcpy(ys, x->shape, sizeof(int64_t) * (size_t)nd);
  ys[nd - 1] = out;
  if (r->host) {
    double *pre = ot_buf(r, rows * out), *y = ot_buf(r, rows * out);
    ref_linear(ot_d(r, x), ot_d(r, w), b ? ot_d(r, b) : NULL, pre, rows, in, out);
    for (int64_t i = 0; i < rows * out; i++) y[i] = ot_gelu(pre[i]);
    ot_host_out(r, "y", nd, ys, y);
    ot_host_out(r, "pre", nd, ys, pre);
    return;
  }
  sh_tensor *y = NULL, *pre = NULL;
  OT_CALL(r, sh_linear_gelu_forward(&y, &pre, x, w, b));
  ot_out(r, "y", y);
  ot_out(r, "pre", pre);
}

/* linear_backward_dgelu: x [rows, in] (the layer's input, gelu(pre) in a model), pre of x's
 * shape, w [s[0], in], dy [rows, s[0]]: dpre = (dy w) gelu'(pre); dw, db (f32) accumulate
 * when k[0]; k[1]: then dpre again (only) with a pre one element into a buffer (ot_in_offset) */
static void run_linear_backward_dgelu(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0];
  int64_t in = w_->sh[0][nd - 1], out = w_->s[0], rows = ot_rows(nd, w_->sh[0]);
  int64_t ys[8];
  memcpy(ys, w_->sh[0], sizeof(int64_t) * (size_t)nd);
  ys[nd - 1] = out;
  sh_tensor *pre = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1.5);
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0.3, 0.7);
  sh_tensor *w = ot_in(r, 2, OT_S(out, in), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dy = ot_in(r, nd, ys, OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dw = w_->k[0] ? ot_in(r, 2, OT_S(out, in), SH_F32, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *db = w_->k[0] ? ot_in(r, 1, OT_S(out), SH_F32, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *pre2 = w_->k[1] ? ot_in_offset(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1.5) : NULL;
  OT_OK(r);
  if (r->host) {
    double *dh = ot_buf(r, rows * in), *dwv = dw ? ot_d(r, dw) : NULL, *dbv = db ? ot_d(r, db) : NULL;
    double *p = ot_d(r, pre), *p2 = pre2 ? ot_d(r, pre2) : NULL, *dh2 = ot_buf(r, rows * in);
    ref_linear_bwd(ot_d(r, dy), ot_d(r, x), ot_d(r, w), dh, dwv, dbv, rows, in, out);
    OT_OK(r);
    for (int64_t i = 0; i < rows * in; i++) dh2[i] = p2 ? dh[i] * ot_gelu_grad(p2[i]) : 0;
    for (int64_t i = 0; i < rows * in; i++) dh[i] *= ot_gelu_grad(p[i]);
    ot_host_out_full(r, "dpre", nd, pre->shape, SH_F64, dh, 2, -1);
    if (dw) ot_host_out(r, "dw", 2, dw->shape, dwv);
    if (db) ot_host_out(r, "db", 1, db->shape, dbv);
    if (pre2) ot_host_out_full(r, "dpre, pre at +1", nd, pre->shape, SH_F64, dh2, 2, -1);
    return;
  }
  sh_tensor *dpre = NULL, *dpre2 = NULL;
  OT_CALL(r, sh_linear_backward_dgelu(&dpre, dw, db, dy, x, w, pre));
  ot_out_mult(r, "dpre", dpre, 2);
  if (dw) ot_out_inplace(r, "dw", dw, 1, -1);
  if (db) ot_out_inplace(r, "db", db, 1, -1);
  if (!pre2) return;
  OT_CALL(r, sh_linear_backward_dgelu(&dpre2, NULL, NULL, dy, x, w, pre2));
  ot_out_mult(r, "dpre, pre at +1", dpre2, 2);
}

/* layernorm (k[3] = 0) or rmsnorm (k[3] = 1) forward: x sh[0] (k[2]: one element into a
 * buffer, so no row is 16-byte aligned); k[0]: affine (w, and b for layernorm, in f32 like a
 * model's params, or in the case's dtype when k[1]); eps a[0] */
static void run_norm_forward(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0], rms = w_->k[3];
  int64_t C = w_->sh[0][nd - 1], rows = ot_rows(nd, w_->sh[0]);
  int pdt = w_->k[1] ? OT_ROW : SH_F32;
  sh_tensor *x = (w_->k[2] ? ot_in_offset : ot_in)(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0.5, 2);
  sh_tensor *w = w_->k[0] ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 1, 0.5) : NULL;
  sh_tensor *b = w_->k[0] && !rms ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  double eps = w_->a[0];
  if (r->host) {
    double *y = ot_buf(r, rows * C), *m = ot_buf(r, rows), *rs = ot_buf(r, rows);
    ref_norm(ot_d(r, x), w ? ot_d(r, w) : NULL, b ? ot_d(r, b) : NULL, y, m, rs, rows, C, eps, !rms);
    ot_host_out(r, "y", nd, x->shape, y);
    if (!rms) ot_host_out_full(r, "mean", nd - 1, x->shape, SH_F64, m, 1, 1e-5);
    ot_host_out_full(r, "rstd", nd - 1, x->shape, SH_F64, rs, 1, 1e-5);
    return;
  }
  sh_tensor *y = NULL, *m = NULL, *rs = NULL;
  if (rms) OT_CALL(r, sh_rmsnorm_forward(&y, &rs, x, w, eps));
  else OT_CALL(r, sh_layernorm_forward(&y, &m, &rs, x, w, b, eps));
  ot_out(r, "y", y);
  if (!rms) ot_out_tol(r, "mean", m, 1e-5);
  ot_out_tol(r, "rstd", rs, 1e-5);
}

/* the backward of run_norm_forward's case, with that run's own mean and rstd (as training
 * does); dw, db accumulate into random starting values */
static void run_norm_backward(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0], rms = w_->k[3];
  int64_t C = w_->sh[0][nd - 1], rows = ot_rows(nd, w_->sh[0]);
  int pdt = w_->k[1] ? OT_ROW : SH_F32;
  sh_tensor *x = (w_->k[2] ? ot_in_offset : ot_in)(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0.5, 2);
  sh_tensor *w = w_->k[0] ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 1, 0.5) : NULL;
  sh_tensor *b = w_->k[0] && !rms ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *dy = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dw = w_->k[0] ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *db = w_->k[0] && !rms ? ot_in(r, 1, OT_S(C), pdt, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  double eps = w_->a[0];
  if (r->host) {
    double *dx = ot_buf(r, rows * C), *dwv = dw ? ot_d(r, dw) : NULL, *dbv = db ? ot_d(r, db) : NULL;
    ref_norm_bwd(ot_d(r, dy), ot_d(r, x), w ? ot_d(r, w) : NULL, dx, dwv, dbv, rows, C, eps, !rms);
    ot_host_out(r, "dx", nd, x->shape, dx);
    if (dw) ot_host_out(r, "dw", 1, dw->shape, dwv);
    if (db) ot_host_out(r, "db", 1, db->shape, dbv);
    return;
  }
  sh_tensor *y = NULL, *m = NULL, *rs = NULL, *dx = NULL;
  if (rms) OT_CALL(r, sh_rmsnorm_forward(&y, &rs, x, w, eps));
  else OT_CALL(r, sh_layernorm_forward(&y, &m, &rs, x, w, b, eps));
  ot_tmp(r, y); ot_tmp(r, m); ot_tmp(r, rs);
  if (rms) OT_CALL(r, sh_rmsnorm_backward(&dx, dw, dy, x, w, rs));
  else OT_CALL(r, sh_layernorm_backward(&dx, dw, db, dy, x, w, m, rs));
  ot_out(r, "dx", dx);
  if (dw) ot_out_inplace(r, "dw", dw, 1, -1);
  if (db) ot_out_inplace(r, "db", db, 1, -1);
}

/* layernorm_residual_forward: r = x + res, y = layernorm(r); x, res sh[0]; w, b in the
 * case's dtype; eps a[0] */
static void run_layernorm_residual(ot_run *r) {
  const ot_row *w_ = r->row;
  int nd = w_->nd[0];
  int64_t C = w_->sh[0][nd - 1], rows = ot_rows(nd, w_->sh[0]);
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *res = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0.5, 2);
  sh_tensor *w = ot_in(r, 1, OT_S(C), OT_ROW, OT_NORMAL, 1, 0.5);
  sh_tensor *b = ot_in(r, 1, OT_S(C), OT_ROW, OT_NORMAL, 0, 1);
  OT_OK(r);
  double eps = w_->a[0];
  if (r->host) {
    double *xv = ot_d(r, x), *rv = ot_d(r, res);
    OT_OK(r);
    /* the exact sum is normalised (the op may normalise r before or after rounding it) */
    double *sum = ot_buf(r, rows * C), *y = ot_buf(r, rows * C), *m = ot_buf(r, rows), *rs = ot_buf(r, rows);
    for (int64_t i = 0; i < rows * C; i++) sum[i] = xv[i] + rv[i];
    ref_norm(sum, ot_d(r, w), ot_d(r, b), y, m, rs, rows, C, eps, 1);
    ot_host_out(r, "y", nd, x->shape, y);
    ot_host_out(r, "r", nd, x->shape, sum);
    ot_host_out_full(r, "mean", nd - 1, x->shape, SH_F64, m, 1, -1);
    ot_host_out_full(r, "rstd", nd - 1, x->shape, SH_F64, rs, 1, -1);
    return;
  }
  sh_tensor *y = NULL, *sum = NULL, *m = NULL, *rs = NULL;
  OT_CALL(r, sh_layernorm_residual_forward(&y, &sum, &m, &rs, x, res, w, b, eps));
  ot_out(r, "y", y);
  ot_out(r, "r", sum);
  ot_out(r, "mean", m);
  ot_out(r, "rstd", rs);
}

enum { OT_GELU = 0, OT_SILU = 1, OT_SOFTMAX = 2, OT_SWIGLU = 3 };

/* gelu / silu / softmax / swiglu (k[0]), forward (k[1] = 0) or backward (1); x sh[0] with
 * normal(0, a[0]) values. softmax backward takes y from the run's own forward. */
static void run_activation(ot_run *r) {
  const ot_row *w_ = r->row;
  int kind = w_->k[0], bwd = w_->k[1], nd = w_->nd[0];
  int64_t n = ot_numel(nd, w_->sh[0]), C = w_->sh[0][nd - 1], rows = ot_rows(nd, w_->sh[0]);
  double sd = w_->a[0] > 0 ? w_->a[0] : 1;
  sh_tensor *x = ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, sd);
  sh_tensor *b = kind == OT_SWIGLU ? ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *dy = bwd ? ot_in(r, nd, w_->sh[0], OT_ROW, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  if (r->host) {
    double *xv = ot_d(r, x), *bv = b ? ot_d(r, b) : NULL, *g = dy ? ot_d(r, dy) : NULL;
    double *o = ot_buf(r, n), *o2 = ot_buf(r, n);
    OT_OK(r);
    if (kind == OT_SOFTMAX) {
      ref_softmax(xv, o, rows, C);
      if (bwd) { memcpy(o2, o, sizeof(double) * (size_t)n); ref_softmax_bwd(g, o2, o, rows, C); }
    } else {
      for (int64_t i = 0; i < n; i++) {
        double v = xv[i];
        if (kind == OT_GELU) o[i] = bwd ? g[i] * ot_gelu_grad(v) : ot_gelu(v);
        else if (kind == OT_SILU) o[i] = bwd ? g[i] * ot_silu_grad(v) : ot_silu(v);
        else {
          o[i] = bwd ? g[i] * bv[i] * ot_silu_grad(v) : ot_silu(v) * bv[i];
          o2[i] = bwd ? g[i] * ot_silu(v) : 0;
        }
      }
    }
    ot_host_out_like(r, kind == OT_SWIGLU && bwd ? "da" : bwd ? "dx" : "y", x, o);
    if (kind == OT_SWIGLU && bwd) ot_host_out_like(r, "db", x, o2);
    return;
  }
  sh_tensor *o = NULL, *o2 = NULL, *y = NULL;
  switch (kind) {
    case OT_GELU:
      if (bwd) OT_CALL(r, sh_gelu_backward(&o, dy, x)); else OT_CALL(r, sh_gelu_forward(&o, x));
      break;
    case OT_SILU:
      if (bwd) OT_CALL(r, sh_silu_backward(&o, dy, x)); else OT_CALL(r, sh_silu_forward(&o, x));
      break;
    case OT_SOFTMAX:
      OT_CALL(r, sh_softmax_forward(&y, x));
      if (bwd) { ot_tmp(r, y); OT_CALL(r, sh_softmax_backward(&o, dy, y)); }
      else o = y;
      break;
    default:
      if (bwd) OT_CALL(r, sh_swiglu_backward(&o, &o2, dy, x, b)); else OT_CALL(r, sh_swiglu_forward(&o, x, b));
      break;
  }
  ot_out(r, kind == OT_SWIGLU && bwd ? "da" : bwd ? "dx" : "y", o);
  if (kind == OT_SWIGLU && bwd) ot_out(r, "db", o2);
}

/* dropout forward (k[1] = 0) or backward (1) of x sh[0], p a[0], stream (s[0], s[1]) */
static void run_dropout(ot_run *r) {
  const ot_row *w_ = r->row;
  double p = w_->a[0];
  uint64_t seed = (uint64_t)w_->s[0], off = (uint64_t)w_->s[1];
  sh_tensor *x = ot_in(r, w_->nd[0], w_->sh[0], OT_ROW, OT_NORMAL, 0, 1);
  OT_OK(r);
  if (r->host) {
    int64_t n = sh_tensor_numel(x);
    double *xv = ot_d(r, x), *y = ot_buf(r, n);
    OT_OK(r);
    float pf = (float)p;   /* kept when the stream's uniform (a float) exceeds p as a float */
    for (int64_t i = 0; i < n; i++)
      y[i] = p == 0 ? xv[i] : (float)ref_uniform(seed, off, (uint64_t)i) > pf ? xv[i] / (1.0 - p) : 0.0;
    ot_host_out_like(r, w_->k[1] ? "dx" : "y", x, y);
    return;
  }
  sh_tensor *y = NULL;
  if (w_->k[1]) OT_CALL(r, sh_dropout_backward(&y, x, p, seed, off));
  else OT_CALL(r, sh_dropout_forward(&y, x, p, seed, off));
  ot_out(r, w_->k[1] ? "dx" : "y", y);
}

/* Rotary embedding of [BH, T, D] rows in place, straight from its definition: pairs
 * (i, i + D/2) turned by t * theta^(-2i/D); sign -1 turns them back. */
static void ref_rope(double *x, int64_t BH, int64_t T, int64_t D, double theta, double sign) {
  int64_t half = D / 2;
  for (int64_t bh = 0; bh < BH; bh++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < half; i++) {
        double a = (double)t * pow(theta, -2.0 * (double)i / (double)D), c = cos(a), s = sign * sin(a);
        double *r = x + (bh * T + t) * D, x1 = r[i], x2 = r[i + half];
        r[i] = x1 * c - x2 * s;
        r[i + half] = x2 * c + x1 * s;
      }
}

/* k [B, Hkv, T, D] repeated to [B, H, T, D] (query head h reads kv head h / (H / Hkv)):
 * the reference materialises what the kernels share. */
static double *ref_repeat_kv(const double *k, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D) {
  double *o = malloc(sizeof(double) * (size_t)(B * H * T * D + 1));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      memcpy(o + (b * H + h) * T * D, k + (b * Hkv + h / (H / Hkv)) * T * D, sizeof(double) * (size_t)(T * D));
  return o;
}

/* Grouped-query attention with rotary q and k (theta 0: none), contiguous inputs. */
static void ref_gqa_attention(const double *q, const double *k, const double *v, double *out, double *lse,
                              int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D, double scale, double theta) {
  int64_t n = B * H * T * D;
  double *qr = malloc(sizeof(double) * (size_t)(n + 1)), *kr = ref_repeat_kv(k, B, H, Hkv, T, D);
  double *vr = ref_repeat_kv(v, B, H, Hkv, T, D);
  memcpy(qr, q, sizeof(double) * (size_t)n);
  if (theta > 0) { ref_rope(qr, B * H, T, D, theta, 1); ref_rope(kr, B * H, T, D, theta, 1); }
  ref_attention(qr, kr, vr, out, lse, B * H, T, D, scale);
  free(qr); free(kr); free(vr);
}

/* Its backward: the repeated heads' dk, dv summed over each group; dq, dk turned back. */
static void ref_gqa_attention_bwd(const double *dout, const double *q, const double *k, const double *v, double *dq,
                                  double *dk, double *dv, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D,
                                  double scale, double theta) {
  int64_t n = B * H * T * D, nkv = B * Hkv * T * D, G = H / Hkv;
  double *qr = malloc(sizeof(double) * (size_t)(n + 1)), *kr = ref_repeat_kv(k, B, H, Hkv, T, D);
  double *vr = ref_repeat_kv(v, B, H, Hkv, T, D);
  double *dkr = malloc(sizeof(double) * (size_t)(n + 1)), *dvr = malloc(sizeof(double) * (size_t)(n + 1));
  memcpy(qr, q, sizeof(double) * (size_t)n);
  if (theta > 0) { ref_rope(qr, B * H, T, D, theta, 1); ref_rope(kr, B * H, T, D, theta, 1); }
  ref_attention_bwd(dout, qr, kr, vr, dq, dkr, dvr, B * H, T, D, scale);
  memset(dk, 0, sizeof(double) * (size_t)nkv);
  memset(dv, 0, sizeof(double) * (size_t)nkv);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t e = 0; e < T * D; e++) {
        dk[(b * Hkv + h / G) * T * D + e] += dkr[(b * H + h) * T * D + e];
        dv[(b * Hkv + h / G) * T * D + e] += dvr[(b * H + h) * T * D + e];
      }
  if (theta > 0) { ref_rope(dq, B * H, T, D, theta, -1); ref_rope(dk, B * Hkv, T, D, theta, -1); }
  free(qr); free(kr); free(vr); free(dkr); free(dvr);
}

/* Grouped-query attention with rotary embeddings: s = B, H, T, D; k[0] forward (0) or
 * backward (1); k[1] = Hkv; k[2]: q, k, v are head views of [B, T, heads, D] projections (the
 * Llama layout); a[0] = rope theta (0: plain grouped-query attention through
 * sh_attention_forward). Scale 1/sqrt(D). */
static void run_gqa_attention(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t B = w_->s[0], H = w_->s[1], T = w_->s[2], D = w_->s[3], Hkv = w_->k[1];
  int64_t qs[4] = {B, H, T, D}, ks[4] = {B, Hkv, T, D};
  double theta = w_->a[0];
  sh_tensor *q, *k, *v;
  if (w_->k[2]) {
    q = ot_transpose(r, ot_in(r, 4, OT_S(B, T, H, D), OT_ROW, OT_NORMAL, 0, 1), 1, 2);
    k = ot_transpose(r, ot_in(r, 4, OT_S(B, T, Hkv, D), OT_ROW, OT_NORMAL, 0, 1), 1, 2);
    v = ot_transpose(r, ot_in(r, 4, OT_S(B, T, Hkv, D), OT_ROW, OT_NORMAL, 0, 1), 1, 2);
  } else {
    q = ot_in(r, 4, qs, OT_ROW, OT_NORMAL, 0, 1);
    k = ot_in(r, 4, ks, OT_ROW, OT_NORMAL, 0, 1);
    v = ot_in(r, 4, ks, OT_ROW, OT_NORMAL, 0, 1);
  }
  sh_tensor *dout = w_->k[0] ? ot_in(r, 4, qs, OT_ROW, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  double lse_tol = r->dtype == SH_F32 ? 1e-5 : 5e-3, scale = 1.0 / sqrt((double)D);
  if (r->host) {
    double *qv = ot_d(r, q), *kv = ot_d(r, k), *vv = ot_d(r, v);
    OT_OK(r);
    if (!w_->k[0]) {
      double *o = ot_buf(r, B * H * T * D), *l = ot_buf(r, B * H * T);
      ref_gqa_attention(qv, kv, vv, o, l, B, H, Hkv, T, D, scale, theta);
      ot_host_out(r, "out", 4, qs, o);
      ot_host_out_full(r, "lse", 3, qs, SH_F64, l, 1, lse_tol);
    } else {
      double *dq = ot_buf(r, B * H * T * D), *dk = ot_buf(r, B * Hkv * T * D), *dv = ot_buf(r, B * Hkv * T * D);
      double *g = ot_d(r, dout);
      OT_OK(r);
      ref_gqa_attention_bwd(g, qv, kv, vv, dq, dk, dv, B, H, Hkv, T, D, scale, theta);
      ot_host_out_full(r, "dq", 4, qs, SH_F64, dq, 2, -1);
      ot_host_out_full(r, "dk", 4, ks, SH_F64, dk, 2, -1);
      ot_host_out_full(r, "dv", 4, ks, SH_F64, dv, 2, -1);
    }
    return;
  }
  sh_tensor *o = NULL, *l = NULL;
  if (theta > 0) OT_CALL(r, sh_attention_rope_forward(&o, &l, q, k, v, 0, theta));
  else OT_CALL(r, sh_attention_forward(&o, &l, q, k, v, 0));
  if (!w_->k[0]) {
    ot_out(r, "out", o);
    ot_out_tol(r, "lse", l, lse_tol);
    return;
  }
  ot_tmp(r, o);
  ot_tmp(r, l);
  sh_tensor *dq = NULL, *dk = NULL, *dv = NULL;
  if (theta > 0) OT_CALL(r, sh_attention_rope_backward(&dq, &dk, &dv, dout, q, k, v, o, l, 0, theta));
  else OT_CALL(r, sh_attention_backward(&dq, &dk, &dv, dout, q, k, v, o, l, 0));
  if (T == 1) { ot_out_zero(r, "dq", dq); ot_out_zero(r, "dk", dk); }   /* softmax over one key */
  else { ot_out_mult(r, "dq", dq, 2); ot_out_mult(r, "dk", dk, 2); }
  ot_out_mult(r, "dv", dv, 2);
}

/* rope forward (k[0] = 0) or backward (1) of x [B, H, T, D] given as the transposed view of a
 * [B, T, H, D] buffer (s = B, H, T, D); a[0] = theta. */
static void run_rope(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t B = w_->s[0], H = w_->s[1], T = w_->s[2], D = w_->s[3], shape[4] = {B, H, T, D};
  sh_tensor *x = ot_transpose(r, ot_in(r, 4, OT_S(B, T, H, D), OT_ROW, OT_NORMAL, 0, 1), 1, 2);
  OT_OK(r);
  if (r->host) {
    double *v = ot_d(r, x);
    OT_OK(r);
    ref_rope(v, B * H, T, D, w_->a[0], w_->k[0] ? -1 : 1);
    ot_host_out(r, w_->k[0] ? "dx" : "y", 4, shape, v);
    return;
  }
  sh_tensor *y = NULL;
  if (w_->k[0]) OT_CALL(r, sh_rope_backward(&y, x, w_->a[0]));
  else OT_CALL(r, sh_rope_forward(&y, x, w_->a[0]));
  ot_out(r, w_->k[0] ? "dx" : "y", y);
}

/* Attention as F.causal_attention calls it: out into the heads of a [B, T, H, D] buffer and
 * dq, dk, dv into the heads of one fused [B, T, 3, H, D] gradient (strided views, NaN-filled
 * first, so a kernel that writes elsewhere or leaves one unwritten fails). */
static void run_attention_into(ot_run *r, const sh_tensor *q, const sh_tensor *k, const sh_tensor *v, const sh_tensor *dout,
                               double lse_tol) {
  const ot_row *w_ = r->row;
  int64_t B = w_->s[0], H = w_->s[1], T = w_->s[2], D = w_->s[3];
  sh_tensor *o = ot_transpose(r, ot_empty(r, 4, OT_S(B, T, H, D), OT_ROW), 1, 2);
  sh_tensor *l = ot_empty(r, 3, OT_S(B, H, T), SH_F32);
  OT_OK(r);
  OT_CALL(r, sh_attention_forward_into(o, l, q, k, v, w_->a[0]));
  if (!w_->k[0]) {
    ot_out_inplace(r, "out", o, 1, -1);
    ot_out_inplace(r, "lse", l, 1, lse_tol);
    return;
  }
  sh_tensor *grad = ot_empty(r, 5, OT_S(B, T, 3, H, D), OT_ROW), *g[3];
  for (int j = 0; j < 3; j++) g[j] = ot_transpose(r, ot_select(r, grad, 2, j), 1, 2);
  OT_OK(r);
  OT_CALL(r, sh_attention_backward_into(g[0], g[1], g[2], dout, q, k, v, o, l, w_->a[0]));
  ot_out_inplace(r, "dq", g[0], 2, -1);
  ot_out_inplace(r, "dk", g[1], 2, -1);
  ot_out_inplace(r, "dv", g[2], 2, -1);
}

/* attention forward (k[0] = 0) or backward (1): s = B, H, T, D; k[1]: q, k, v are views of
 * one fused [B, T, 3, H, D] buffer (a qkv projection's layout); scale a[0] (0: 1/sqrt(D)).
 * The backward uses the run's own forward out and lse, as training does. */
static void run_attention(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t B = w_->s[0], H = w_->s[1], T = w_->s[2], D = w_->s[3];
  int64_t shape[4] = {B, H, T, D};
  double scale = w_->a[0] > 0 ? w_->a[0] : 1.0 / sqrt((double)D);
  sh_tensor *q, *k, *v;
  if (w_->k[1]) {
    sh_tensor *qkv = ot_in(r, 5, OT_S(B, T, 3, H, D), OT_ROW, OT_NORMAL, 0, 1);
    sh_tensor *part[3];
    for (int j = 0; j < 3; j++) part[j] = ot_transpose(r, ot_select(r, qkv, 2, j), 1, 2);
    q = part[0]; k = part[1]; v = part[2];
  } else {
    q = ot_in(r, 4, shape, OT_ROW, OT_NORMAL, 0, 1);
    k = ot_in(r, 4, shape, OT_ROW, OT_NORMAL, 0, 1);
    v = ot_in(r, 4, shape, OT_ROW, OT_NORMAL, 0, 1);
  }
  sh_tensor *dout = w_->k[0] ? ot_in(r, 4, shape, OT_ROW, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  double lse_tol = r->dtype == SH_F32 ? 1e-5 : 5e-3;
  if (r->host) {
    int64_t n = B * H * T * D;
    double *qv = ot_d(r, q), *kv = ot_d(r, k), *vv = ot_d(r, v);
    OT_OK(r);
    if (!w_->k[0]) {
      double *o = ot_buf(r, n), *l = ot_buf(r, B * H * T);
      ref_attention(qv, kv, vv, o, l, B * H, T, D, scale);
      ot_host_out(r, "out", 4, shape, o);
      ot_host_out_full(r, "lse", 3, shape, SH_F64, l, 1, lse_tol);
    } else {
      double *dq = ot_buf(r, n), *dk = ot_buf(r, n), *dv = ot_buf(r, n), *g = ot_d(r, dout);
      OT_OK(r);
      ref_attention_bwd(g, qv, kv, vv, dq, dk, dv, B * H, T, D, scale);
      ot_host_out_full(r, "dq", 4, shape, SH_F64, dq, 2, -1);
      ot_host_out_full(r, "dk", 4, shape, SH_F64, dk, 2, -1);
      ot_host_out_full(r, "dv", 4, shape, SH_F64, dv, 2, -1);
    }
    return;
  }
  if (w_->k[1]) { run_attention_into(r, q, k, v, dout, lse_tol); return; }
  sh_tensor *o = NULL, *l = NULL;
  OT_CALL(r, sh_attention_forward(&o, &l, q, k, v, w_->a[0]));
  if (!w_->k[0]) {
    ot_out(r, "out", o);
    ot_out_tol(r, "lse", l, lse_tol);
    return;
  }
  ot_tmp(r, o);
  ot_tmp(r, l);
  sh_tensor *dq = NULL, *dk = NULL, *dv = NULL;
  OT_CALL(r, sh_attention_backward(&dq, &dk, &dv, dout, q, k, v, o, l, w_->a[0]));
  int one_key = q->shape[2] == 1;   /* dq = dk = 0: every row's softmax is the constant 1 */
  if (one_key) { ot_out_zero(r, "dq", dq); ot_out_zero(r, "dk", dk); }
  else { ot_out_mult(r, "dq", dq, 2); ot_out_mult(r, "dk", dk, 2); }
  ot_out_mult(r, "dv", dv, 2);
}

/* embedding forward (k[0] = 0) or backward (1): w [s[0] = V, s[1] = C], idx sh[0] of dtype
 * k[1] (OT_DT) with values in [0, a[0] or V) (few distinct: many repeats); backward
 * accumulates into dw (random, or zeros when k[2]) of the case's dtype. */
static void run_embedding(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t V = w_->s[0], C = w_->s[1];
  int nd = w_->nd[0];
  int64_t ys[8];
  memcpy(ys, w_->sh[0], sizeof(int64_t) * (size_t)nd);
  ys[nd] = C;
  sh_tensor *idx = ot_in(r, nd, w_->sh[0], w_->k[1] - 1, OT_INT, 0, w_->a[0] > 0 ? w_->a[0] : (double)V);
  sh_tensor *w = w_->k[0] ? NULL : ot_in(r, 2, OT_S(V, C), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *dy = w_->k[0] ? ot_in(r, nd + 1, ys, OT_ROW, OT_NORMAL, 0, 1) : NULL;
  sh_tensor *dw = w_->k[0] ? ot_in(r, 2, OT_S(V, C), OT_ROW, w_->k[2] ? OT_ZERO : OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  int64_t n = sh_tensor_numel(idx);
  if (r->host) {
    double *iv = ot_d(r, idx);
    OT_OK(r);
    if (!w_->k[0]) {
      double *wv = ot_d(r, w), *y = ot_buf(r, n * C);
      OT_OK(r);
      for (int64_t i = 0; i < n; i++) memcpy(y + i * C, wv + (int64_t)iv[i] * C, sizeof(double) * (size_t)C);
      ot_host_out_full(r, "y", nd + 1, ys, SH_F64, y, 1, 0);
    } else {
      double *g = ot_d(r, dy), *dwv = ot_d(r, dw);
      OT_OK(r);
      for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < C; c++) dwv[(int64_t)iv[i] * C + c] += g[i * C + c];
      ot_host_out(r, "dw", 2, dw->shape, dwv);
    }
    return;
  }
  if (!w_->k[0]) {
    sh_tensor *y = NULL;
    OT_CALL(r, sh_embedding_forward(&y, idx, w));
    ot_out_tol(r, "y", y, 0);
  } else {
    OT_CALL(r, sh_embedding_backward(dw, dy, idx));
    ot_out_inplace(r, "dw", dw, 1, -1);
  }
}

/* cross_entropy forward (k[0] = 0) or backward (1; k[2]: in place over the logits):
 * logits [s[0] = N, s[1] = V] normal(0, a[0]), targets of dtype k[1] (OT_DT) with every
 * s[2]-th ignored (-100), dloss a[1]. The backward uses the run's own forward lse. */
static void run_cross_entropy(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t N = w_->s[0], V = w_->s[1];
  sh_tensor *x = ot_in(r, 2, OT_S(N, V), OT_ROW, OT_NORMAL, 0, w_->a[0] > 0 ? w_->a[0] : 1);
  sh_tensor *t = ot_in(r, 1, OT_S(N), w_->k[1] - 1, OT_TARGETS, (double)V, (double)w_->s[2]);
  OT_OK(r);
  if (r->host) {
    double *xv = ot_d(r, x), *tv = ot_d(r, t);
    OT_OK(r);
    if (!w_->k[0]) {
      double *l = ot_buf(r, N);
      double loss = ref_cross_entropy(xv, tv, l, N, V, OT_IGNORE);
      ot_host_out_full(r, "loss", 0, NULL, SH_F64, &loss, 1, 1e-5);
      ot_host_out_full(r, "lse", 1, OT_S(N), SH_F64, l, 1, 1e-5);
    } else {
      double *dx = ot_buf(r, N * V);
      ref_cross_entropy_bwd(xv, tv, dx, N, V, OT_IGNORE, w_->a[1]);
      ot_host_out(r, "dlogits", 2, OT_S(N, V), dx);
    }
    return;
  }
  sh_tensor *loss = NULL, *lse = NULL;
  OT_CALL(r, sh_cross_entropy_forward(&loss, &lse, x, t, OT_IGNORE));
  if (!w_->k[0]) {
    ot_out_tol(r, "loss", loss, 1e-5);
    ot_out_tol(r, "lse", lse, 1e-5);
    return;
  }
  ot_tmp(r, loss);
  ot_tmp(r, lse);
  if (w_->k[2]) {
    OT_CALL(r, sh_cross_entropy_backward_(x, t, lse, w_->a[1], OT_IGNORE));
    ot_out_inplace(r, "dlogits", x, 1, -1);
    return;
  }
  sh_tensor *dx = NULL;
  OT_CALL(r, sh_cross_entropy_backward(&dx, x, t, lse, w_->a[1], OT_IGNORE));
  ot_out(r, "dlogits", dx);
}

/* ---- runners: optim.h (double references) ------------------------------------------------- */

/* adamw: s[0] elements, f32 param/m/v, grad of the case's dtype, shadow of dtype k[0]
 * (OT_DT; 0: none), s[1] steps from step 1; lr 1e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1,
 * grad_scale 0.5 */
static void run_adamw(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t n = w_->s[0];
  double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, scale = 0.5;
  sh_tensor *p = ot_in(r, 1, OT_S(n), SH_F32, OT_NORMAL, 0, 1);
  sh_tensor *g = ot_in(r, 1, OT_S(n), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *m = ot_in(r, 1, OT_S(n), SH_F32, OT_NORMAL, 0, 0.1);
  sh_tensor *v = ot_in(r, 1, OT_S(n), SH_F32, OT_UNIFORM, 0, 0.1);
  int sdt = w_->k[0] ? w_->k[0] - 1 : -1;
  sh_tensor *sh = sdt >= 0 ? ot_empty(r, 1, OT_S(n), sdt) : NULL;
  OT_OK(r);
  if (r->host) {
    double *pv = ot_d(r, p), *gv = ot_d(r, g), *mv = ot_d(r, m), *vv = ot_d(r, v);
    OT_OK(r);
    for (int64_t step = 1; step <= w_->s[1]; step++) {
      double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
      for (int64_t i = 0; i < n; i++) {
        double gi = gv[i] * scale;
        pv[i] *= 1 - lr * wd;
        mv[i] = b1 * mv[i] + (1 - b1) * gi;
        vv[i] = b2 * vv[i] + (1 - b2) * gi * gi;
        pv[i] -= lr / bc1 * mv[i] / (sqrt(vv[i]) / sqrt(bc2) + eps);
      }
    }
    ot_host_out_full(r, "param", 1, OT_S(n), SH_F64, pv, 1, 1e-6);
    ot_host_out_full(r, "m", 1, OT_S(n), SH_F64, mv, 1, 1e-6);
    ot_host_out_full(r, "v", 1, OT_S(n), SH_F64, vv, 1, 1e-6);
    if (sh) ot_host_out_full(r, "shadow", 1, OT_S(n), sdt, pv, 1, ot_default_tol(sdt));
    return;
  }
  for (int64_t step = 1; step <= w_->s[1]; step++)
    OT_CALL(r, sh_adamw_step_(p, g, m, v, sh, lr, b1, b2, eps, wd, step, scale));
  ot_out_inplace(r, "param", p, 1, 1e-6);
  ot_out_inplace(r, "m", m, 1, 1e-6);
  ot_out_inplace(r, "v", v, 1, 1e-6);
  if (sh) ot_out_inplace(r, "shadow", sh, 1, ot_default_tol(sdt));
}

/* sgd: s[0] elements, s[1] steps (the first with first_step), lr 0.1, momentum a[0],
 * dampening a[1], weight decay a[2], nesterov k[0], grad_scale a[3] (0: 1) */
static void run_sgd(ot_run *r) {
  const ot_row *w_ = r->row;
  int64_t n = w_->s[0];
  double lr = 0.1, mom = w_->a[0], damp = w_->a[1], wd = w_->a[2], scale = w_->a[3] > 0 ? w_->a[3] : 1;
  sh_tensor *p = ot_in(r, 1, OT_S(n), SH_F32, OT_NORMAL, 0, 1);
  sh_tensor *g = ot_in(r, 1, OT_S(n), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *b = mom > 0 ? ot_in(r, 1, OT_S(n), SH_F32, OT_NORMAL, 0, 1) : NULL;
  OT_OK(r);
  if (r->host) {
    double *pv = ot_d(r, p), *gv = ot_d(r, g), *bv = b ? ot_d(r, b) : NULL;
    OT_OK(r);
    for (int64_t step = 0; step < w_->s[1]; step++)
      for (int64_t i = 0; i < n; i++) {
        double gi = gv[i] * scale + wd * pv[i];
        if (bv) {
          bv[i] = step == 0 ? gi : mom * bv[i] + (1 - damp) * gi;
          gi = w_->k[0] ? gi + mom * bv[i] : bv[i];
        }
        pv[i] -= lr * gi;
      }
    ot_host_out_full(r, "param", 1, OT_S(n), SH_F64, pv, 1, 1e-6);
    if (b) ot_host_out_full(r, "momentum", 1, OT_S(n), SH_F64, bv, 1, 1e-6);
    return;
  }
  for (int64_t step = 0; step < w_->s[1]; step++)
    OT_CALL(r, sh_sgd_step_(p, g, b, lr, mom, damp, wd, w_->k[0], step == 0, scale));
  ot_out_inplace(r, "param", p, 1, 1e-6);
  if (b) ot_out_inplace(r, "momentum", b, 1, 1e-6);
}

/* grad_norm_part then grad_clip_coef over two gradients of s[0] and s[1] elements (the case's
 * dtype; the second a strided view, every other element of 2*s[1]) with weights (1, a[1]),
 * norm_type k[0] (0: 2, 1: 1, 2: inf), max_norm a[0] */
static void run_grad_norm_clip(ot_run *r) {
  const ot_row *w_ = r->row;
  double norm_type = w_->k[0] == 0 ? 2 : w_->k[0] == 1 ? 1 : INFINITY, max_norm = w_->a[0];
  double weights[2] = {1, w_->a[1]};
  int64_t n0 = w_->s[0], n1 = w_->s[1], one[1] = {1};
  sh_tensor *g0 = ot_in(r, 1, OT_S(n0), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *wide = ot_in(r, 1, OT_S(2 * n1), OT_ROW, OT_NORMAL, 0, 1);
  sh_tensor *part = ot_empty(r, 1, one, SH_F64), *norm = ot_empty(r, 1, one, SH_F64);
  sh_tensor *coef = ot_empty(r, 1, one, SH_F32);
  OT_OK(r);
  if (r->host) {
    double *a = ot_d(r, g0), *b = ot_d(r, wide);
    OT_OK(r);
    double acc = 0, sb = 0, sa = 0;
    for (int64_t i = 0; i < n0; i++) sa = w_->k[0] == 2 ? fmax(sa, fabs(a[i])) : sa + (w_->k[0] ? fabs(a[i]) : a[i] * a[i]);
    for (int64_t i = 0; i < n1; i++) {
      double x = b[2 * i];
      sb = w_->k[0] == 2 ? fmax(sb, fabs(x)) : sb + (w_->k[0] ? fabs(x) : x * x);
    }
    acc = w_->k[0] == 2 ? fmax(sa, sb) : sa + weights[1] * sb;
    double nrm = w_->k[0] == 0 ? sqrt(acc) : acc, c = fmin(1, max_norm / (nrm + 1e-6));
    ot_host_out_full(r, "part", 1, one, SH_F64, &acc, 1, 1e-9);
    ot_host_out_full(r, "norm", 1, one, SH_F64, &nrm, 1, 1e-9);
    ot_host_out_full(r, "coef", 1, one, SH_F64, &c, 1, 1e-6);
    return;
  }
  sh_tensor *pairs = NULL, *g1 = NULL;
  int64_t shape2[2] = {n1, 2};
  OT_CALL(r, sh_view_reshape(&pairs, wide, 2, shape2));
  ot_tmp(r, pairs);
  OT_CALL(r, sh_view_select(&g1, pairs, 1, 0));
  ot_tmp(r, g1);
  const sh_tensor *grads[2] = {g0, g1};
  OT_CALL(r, sh_grad_norm_part(part, 2, grads, weights, norm_type));
  OT_CALL(r, sh_grad_clip_coef(coef, norm, part, norm_type, max_norm));
  ot_out_inplace(r, "part", part, 1, 1e-9);
  ot_out_inplace(r, "norm", norm, 1, 1e-9);
  ot_out_inplace(r, "coef", coef, 1, 1e-6);
}

/* ---- the table ------------------------------------------------------------------------------ */

/* pow gets twice the default tolerance (powf and the CUDA pow differ from the correctly
 * rounded result by a few ulps) */
#define OT_POW_TOL(opc) {[SH_F32] = (opc) == SH_OP_POW ? 2e-5 : 0, [SH_BF16] = (opc) == SH_OP_POW ? 2e-2 : 0, \
                         [SH_F16] = (opc) == SH_OP_POW ? 1e-2 : 0}
#define BIN(opc, opn, dist, lo, hi)                                                                           \
  {"binary(" opn ")", "[4,33,17] op [33,1]", OT_FLOATS, OT_REF_F64, run_binary, {3, 2}, {{4, 33, 17}, {33, 1}},  \
   .k = {opc, dist}, .a = {lo, hi}, .tol = OT_POW_TOL(opc)},                      \
  {"binary(" opn ")", "[250,37] op [250,37]", OT_FLOATS, OT_REF_F64, run_binary, {2, 2}, {{250, 37}, {250, 37}},  \
   .k = {opc, dist}, .a = {lo, hi}, .tol = OT_POW_TOL(opc)},                      \
  {"binary(" opn ")", "[1,5] op [3,1] (both broadcast)", OT_FLOATS, OT_REF_F64, run_binary, {2, 2}, {{1, 5}, {3, 1}}, \
   .k = {opc, dist}, .a = {lo, hi}},                                                                           \
  {"binary_scalar(" opn ")", "[3,129] op 1.5", OT_FLOATS, OT_REF_F64, run_binary_scalar, {2}, {{3, 129}},       \
   .k = {opc, 0}, .a = {0.5, 2, 1.5}, .tol = OT_POW_TOL(opc)},                                                                          \
  {"binary_scalar(" opn ")", "1.5 op [129]", OT_FLOATS, OT_REF_F64, run_binary_scalar, {1}, {{129}},            \
   .k = {opc, 1}, .a = {0.5, 2, 1.5}, .tol = OT_POW_TOL(opc)},                                                                          \
  {"binary(" opn ")", "i64 [50] op i32 [50]", OT_I64 | OT_I32, OT_REF_F64, run_binary, {1, 1}, {{50}, {50}},    \
   .k = {opc, OT_INT, OT_DT(SH_I32)}, .a = {-20, 20, 1, 5}, .tol = {[SH_I64] = 1e-6, [SH_I32] = 1e-6}}

#define UN(opc, opn, lo, hi)                                                                                   \
  {"unary(" opn ")", "[3,129]", OT_FLOATS, OT_REF_F64, run_unary, {2}, {{3, 129}}, .k = {opc}, .a = {lo, hi}}, \
  {"unary(" opn ")", "[1] (one element)", OT_FLOATS, OT_REF_F64, run_unary, {1}, {{1}}, .k = {opc}, .a = {lo, hi}}

#define RED(opc, opn)                                                                                          \
  {"reduce(" opn ")", "[5,300,7], all dims", OT_ALL_FLOATS, OT_REF_F64, run_reduce, {3}, {{5, 300, 7}}, .k = {opc}}, \
  {"reduce(" opn ")", "[1,1,13] (batch 1)", OT_ALL_FLOATS, OT_REF_F64, run_reduce, {3}, {{1, 1, 13}}, .k = {opc}}, \
  {"reduce(" opn ")", "[100003] (split into chunks)", OT_F32 | OT_BF16 | OT_F64, OT_REF_F64, run_reduce, {1},  \
   {{100003}}, .k = {opc}}

#define COPY(dst, dstn)                                                                                        \
  {"copy_", "transposed [5,9,7] view -> " dstn, OT_ALL_FLOATS | OT_I64 | OT_I32, OT_REF_HOST, run_copy, {3},    \
   {{7, 9, 5}}, .k = {OT_DT(dst), 0}}

#define ACT(kind, name, shape0, shape1, sd)                                                                    \
  {name "_forward", "[" #shape0 "," #shape1 "]", OT_FLOATS, OT_REF_HOST, run_activation, {2}, {{shape0, shape1}}, \
   .k = {kind, 0}, .a = {sd}},                                                                                 \
  {name "_backward", "[" #shape0 "," #shape1 "]", OT_FLOATS, OT_REF_HOST, run_activation, {2}, {{shape0, shape1}}, \
   .k = {kind, 1}, .a = {sd}}

#define ATT(B, H, T, D, strided, why)                                                                         \
  {"attention_forward", "B " #B " H " #H " T " #T " D " #D why, OT_FLOATS, OT_REF_HOST, run_attention, .s = {B, H, T, D}, \
   .k = {0, strided}, .tol = {[SH_BF16] = 2e-2, [SH_F16] = 2e-2}},                                            \
  {"attention_backward", "B " #B " H " #H " T " #T " D " #D why, OT_FLOATS, OT_REF_HOST, run_attention, .s = {B, H, T, D}, \
   .k = {1, strided}, .tol = {[SH_BF16] = 2e-2, [SH_F16] = 2e-2}}

/* GQA(B, H, T, D, Hkv, llama_views, theta, dtypes, why): grouped-query attention (rotary when
 * theta > 0). The bf16 tensor-core kernels put B * H on grid.y, which the emulator's small
 * device caps at 3: rows with more heads leave bf16 out. */
#define GQA(B, H, T, D, Hkv, views, theta, dtypes, why)                                                      \
  {"attention_gqa_forward", "B " #B " H " #H " Hkv " #Hkv " T " #T " D " #D why, dtypes, OT_REF_HOST,         \
   run_gqa_attention, .s = {B, H, T, D}, .k = {0, Hkv, views}, .a = {theta},                                 \
   .tol = {[SH_BF16] = 2e-2, [SH_F16] = 2e-2}},                                                               \
  {"attention_gqa_backward", "B " #B " H " #H " Hkv " #Hkv " T " #T " D " #D why, dtypes, OT_REF_HOST,        \
   run_gqa_attention, .s = {B, H, T, D}, .k = {1, Hkv, views}, .a = {theta},                                 \
   .tol = {[SH_BF16] = 2e-2, [SH_F16] = 2e-2}}

static const ot_row ot_table[] = {
  /* copies and fills: every (source, destination) dtype pair through a transposed view */
  COPY(SH_F32, "f32"), COPY(SH_BF16, "bf16"), COPY(SH_F16, "f16"), COPY(SH_F64, "f64"), COPY(SH_I64, "i64"),
  COPY(SH_I32, "i32"),
  {"copy_", "broadcast [1,13] -> bf16 [6,13]", OT_ALL_FLOATS, OT_REF_HOST, run_copy, {2, 2}, {{1, 13}, {6, 13}},
   .k = {OT_DT(SH_BF16), 1}},
  {"copy_", "broadcast [13] -> [4,3,13]", OT_FLOATS, OT_REF_HOST, run_copy, {1, 3}, {{13}, {4, 3, 13}}, .k = {0, 1}},
  {"copy_", "cpu [37,5] -> run's device", OT_ALL_FLOATS | OT_I64, OT_REF_HOST, run_copy, {2}, {{37, 5}}, .k = {0, 2}},
  {"copy_", "empty [0,5]", OT_FLOATS, OT_REF_HOST, run_copy, {2}, {{0, 5}}, .k = {0, 2}},
  {"fill_", "[6,13] = 2.5", OT_ALL_FLOATS | OT_I64 | OT_I32, OT_REF_HOST, run_fill, {2}, {{6, 13}}, .a = {2.5}},
  {"fill_", "[1001] = -0.1", OT_ALL_FLOATS, OT_REF_HOST, run_fill, {1}, {{1001}}, .a = {-0.1}},

  /* elementwise */
  BIN(SH_OP_ADD, "add", OT_UNIFORM, -2, 2), BIN(SH_OP_SUB, "sub", OT_UNIFORM, -2, 2),
  BIN(SH_OP_MUL, "mul", OT_UNIFORM, -2, 2), BIN(SH_OP_DIV, "div", OT_UNIFORM, 0.5, 2),
  BIN(SH_OP_POW, "pow", OT_UNIFORM, 0.5, 2), BIN(SH_OP_MAXIMUM, "maximum", OT_GRID, -2, 2),
  BIN(SH_OP_MINIMUM, "minimum", OT_GRID, -2, 2), BIN(SH_OP_EQ, "eq", OT_GRID, 0.5, 2),
  BIN(SH_OP_LT, "lt", OT_GRID, 0.5, 2), BIN(SH_OP_GT, "gt", OT_GRID, 0.5, 2),
  {"binary(add)", "bf16 [7,33] + f32 [33] (promotes to f32)", OT_BF16 | OT_F16, OT_REF_F64, run_binary, {2, 1},
   {{7, 33}, {33}}, .k = {SH_OP_ADD, OT_UNIFORM, OT_DT(SH_F32)}, .a = {-2, 2}, .tol = {[SH_BF16] = 1e-5, [SH_F16] = 1e-5}},
  {"binary(mul)", "empty [0,7] * [7]", OT_FLOATS, OT_REF_F64, run_binary, {2, 1}, {{0, 7}, {7}}, .k = {SH_OP_MUL, OT_UNIFORM},
   .a = {-2, 2}},
  UN(SH_OP_NEG, "neg", -3, 3), UN(SH_OP_EXP, "exp", -3, 3), UN(SH_OP_LOG, "log", 0.25, 3),
  UN(SH_OP_SQRT, "sqrt", 0.25, 3), UN(SH_OP_RSQRT, "rsqrt", 0.25, 3), UN(SH_OP_TANH, "tanh", -3, 3),
  UN(SH_OP_ABS, "abs", -3, 3), UN(SH_OP_SQUARE, "square", -3, 3), UN(SH_OP_RECIPROCAL, "reciprocal", 0.25, 3),
  UN(SH_OP_SIGN, "sign", -3, 3),
  {"binary_(mul)", "[64,48] *= f32 [48]", OT_FLOATS, OT_REF_F64, run_inplace, {2, 1}, {{64, 48}, {48}},
   .k = {SH_OP_MUL, 0, OT_DT(SH_F32)}},
  {"binary_(sub)", "[17,3] -= [17,1]", OT_FLOATS, OT_REF_F64, run_inplace, {2, 2}, {{17, 3}, {17, 1}}, .k = {SH_OP_SUB, 0}},
  {"axpy_", "[64,48] += -0.75 f32 [48]", OT_FLOATS, OT_REF_F64, run_inplace, {2, 1}, {{64, 48}, {48}},
   .k = {0, 1, OT_DT(SH_F32)}, .a = {-0.75}},
  {"axpy_", "[1001] += 2 [1001]", OT_ALL_FLOATS, OT_REF_F64, run_inplace, {1, 1}, {{1001}, {1001}}, .k = {0, 1}, .a = {2}},
  {"scale_", "[64,48] *= 3", OT_FLOATS, OT_REF_F64, run_inplace, {2}, {{64, 48}}, .k = {0, 2}, .a = {3}},

  /* reductions */
  RED(SH_OP_SUM, "sum"), RED(SH_OP_MEAN, "mean"), RED(SH_OP_MAX, "max"), RED(SH_OP_MIN, "min"),
  {"reduce(sum)", "[0,3] (empty)", OT_ALL_FLOATS, OT_REF_F64, run_reduce, {2}, .sh = {{0, 3}}, .k = {SH_OP_SUM}},
  {"argmax", "[5,300,7] (dim 1 keepdim)", OT_ALL_FLOATS, OT_REF_F64, run_argmax, {3}, .sh = {{5, 300, 7}}},
  {"argmax", "[4,9,3] of ties (first wins)", OT_ALL_FLOATS, OT_REF_F64, run_argmax, {3}, .sh = {{4, 9, 3}}, .k = {0, OT_GRID}},
  {"sum_to_shape", "[5,300,7] -> [7]", OT_ALL_FLOATS, OT_REF_F64, run_sum_to_shape, {3, 1}, .sh = {{5, 300, 7}, {7}}},
  {"sum_to_shape", "[5,300,7] -> [300,1]", OT_ALL_FLOATS, OT_REF_F64, run_sum_to_shape, {3, 2}, .sh = {{5, 300, 7}, {300, 1}}},
  {"sum_to_shape", "[5,300,7] -> [5,1,7]", OT_ALL_FLOATS, OT_REF_F64, run_sum_to_shape, {3, 3}, .sh = {{5, 300, 7}, {5, 1, 7}}},
  {"sum_to_shape", "[5,300,7] -> [1,300,1]", OT_ALL_FLOATS, OT_REF_F64, run_sum_to_shape, {3, 3}, .sh = {{5, 300, 7}, {1, 300, 1}}},
  {"sumsq", "[5,300,7]", OT_ALL_FLOATS, OT_REF_F64, run_sumsq, {3}, .sh = {{5, 300, 7}}},
  {"sumsq", "[100003]", OT_F32 | OT_BF16, OT_REF_F64, run_sumsq, {1}, .sh = {{100003}}},
  /* Rows of 300 and 9000: every warp of the row kernel holds candidates, so the max is found
   * across warps. 9000 outputs or columns (here and below) are more than one grid of a one-SM
   * device covers (32 blocks of 256 threads: run.sh runs the table with SHARD_EMU_SMS=1), so
   * the grid-stride kernels loop. */
  {"argmax", "[6,300] (rows across warps)", OT_ALL_FLOATS, OT_REF_F64, run_argmax, {2}, .sh = {{6, 300}}},
  {"argmax", "[3,9000] (rows across warps, 9000 columns)", OT_F32 | OT_BF16, OT_REF_F64, run_argmax, {2}, .sh = {{3, 9000}}},
  {"sum_to_shape", "[2,9000] -> [9000]", OT_F32 | OT_BF16, OT_REF_F64, run_sum_to_shape, {2, 1}, .sh = {{2, 9000}, {9000}}},

  /* matrix products */
  {"matmul", "[67,45] @ [45,29]", OT_FLOATS, OT_REF_F64, run_matmul, {2, 2}, .sh = {{67, 45}, {45, 29}}},
  {"matmul", "[3,40,24] @ [24,31]", OT_FLOATS, OT_REF_F64, run_matmul, {3, 2}, .sh = {{3, 40, 24}, {24, 31}}},
  {"matmul", "[4,17,32] @ [4,32,9]", OT_FLOATS, OT_REF_F64, run_matmul, {3, 3}, .sh = {{4, 17, 32}, {4, 32, 9}}},
  {"matmul", "[2,3,8,16] @ [3,16,5]", OT_FLOATS, OT_REF_F64, run_matmul, {4, 3}, .sh = {{2, 3, 8, 16}, {3, 16, 5}}},
  {"matmul", "[33] @ [33,7]", OT_FLOATS, OT_REF_F64, run_matmul, {1, 2}, .sh = {{33}, {33, 7}}},
  {"matmul", "[9,33] @ [33]", OT_FLOATS, OT_REF_F64, run_matmul, {2, 1}, .sh = {{9, 33}, {33}}},
  {"matmul", "[1,6,8] @ [2,3,8,4]", OT_FLOATS, OT_REF_F64, run_matmul, {3, 4}, .sh = {{1, 6, 8}, {2, 3, 8, 4}}},
  {"matmul", "[1,1] @ [1,1]", OT_FLOATS, OT_REF_F64, run_matmul, {2, 2}, .sh = {{1, 1}, {1, 1}}},
  {"matmul", "[2,16] @ [16,50257] (vocab)", OT_FLOATS, OT_REF_F64, run_matmul, {2, 2}, .sh = {{2, 16}, {16, 50257}}},
  {"matmul", "[3,0] @ [0,5] (empty inner dim)", OT_FLOATS, OT_REF_F64, run_matmul, {2, 2}, .sh = {{3, 0}, {0, 5}}},
  {"gemm_", "c[41,19] = 0.5 a b - 1.25 c", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {0, 0}, .a = {0.5, -1.25}},
  {"gemm_", "c[41,19] = 0.5 a^T b - 1.25 c", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {1, 0}, .a = {0.5, -1.25}},
  {"gemm_", "c[41,19] = 0.5 a b^T - 1.25 c", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {0, 1}, .a = {0.5, -1.25}},
  {"gemm_", "c[41,19] = 0.5 a^T b^T - 1.25 c", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {1, 1}, .a = {0.5, -1.25}},
  {"gemm_", "c = a b, a a transposed view", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {0, 0, 1}, .a = {1, 0}},
  {"gemm_", "c = a^T b, a a transposed view", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {1, 0, 1}, .a = {1, 0}},
  {"gemm_", "c = a b^T, a a transposed view", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {0, 1, 1}, .a = {1, 0}},
  {"gemm_", "c = a^T b^T, a a transposed view", OT_FLOATS, OT_REF_F64, run_gemm, .s = {41, 19, 23}, .k = {1, 1, 1}, .a = {1, 0}},
  {"gemm_", "c[1,1] += a[1,7] b[7,1]", OT_FLOATS, OT_REF_F64, run_gemm, .s = {1, 1, 7}, .k = {0, 0}, .a = {1, 1}},

  /* creation */
  {"arange", "(-3, 7.5, 0.25)", OT_ALL_FLOATS, OT_REF_F64, run_arange, .a = {-3, 7.5, 0.25}},
  {"arange", "(5, 1000, 3)", OT_F32 | OT_F64 | OT_I64 | OT_I32, OT_REF_F64, run_arange, .a = {5, 1000, 3}},
  {"random_normal_", "[31,65] (0.5, 2) seed 99 offset 1000", OT_ALL_FLOATS, OT_REF_HOST, run_random, {2}, {{31, 65}},
   .s = {99, 1000}, .k = {0, 0}, .a = {0.5, 2}, .tol = {[SH_F64] = 1e-6}},
  {"random_normal_", "[7] offset 3 (partial blocks)", OT_ALL_FLOATS, OT_REF_HOST, run_random, {1}, {{7}},
   .s = {5, 3}, .k = {0, 0}, .a = {0, 1}, .tol = {[SH_F64] = 1e-6}},
  {"random_uniform_", "[31,65] through a transposed view, (-1, 4) seed 5 offset 3", OT_ALL_FLOATS, OT_REF_HOST, run_random,
   {2}, {{31, 65}}, .s = {5, 3}, .k = {1, 1}, .a = {-1, 4}, .tol = {[SH_F64] = 1e-6}},

  /* linear */
  {"linear_forward", "x [3,21,64] w [48,64]", OT_FLOATS, OT_REF_HOST, run_linear_forward, {3}, {{3, 21, 64}}, .s = {48}},
  {"linear_forward", "x [3,21,64] w [48,64] +b", OT_FLOATS, OT_REF_HOST, run_linear_forward, {3}, {{3, 21, 64}}, .s = {48}, .k = {1}},
  /* the same product with a bias packed at an odd element offset (FSDP): whatever cuBLASLt
   * chose for the aligned bias must not run on the misaligned one */
  {"linear_forward", "x [3,21,64] w [48,64] +b, then b at +1 element", OT_FLOATS, OT_REF_HOST, run_linear_forward, {3},
   {{3, 21, 64}}, .s = {48}, .k = {1, 1}},
  {"linear_forward", "x [1,1,13] w [7,13] +b (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_linear_forward, {3}, {{1, 1, 13}}, .s = {7}, .k = {1}},
  {"linear_forward", "x [2,8] w [50257,8] (vocab)", OT_FLOATS, OT_REF_HOST, run_linear_forward, {2}, {{2, 8}}, .s = {50257}},
  {"linear_forward", "x [0,16] w [5,16] +b (no rows)", OT_FLOATS, OT_REF_HOST, run_linear_forward, {2}, {{0, 16}}, .s = {5}, .k = {1}},
  {"linear_forward", "x [3,0] w [5,0] +b (in 0: y = b)", OT_FLOATS, OT_REF_HOST, run_linear_forward, {2}, {{3, 0}}, .s = {5}, .k = {1}},
  {"linear_backward", "x [3,21,64] w [48,64], f32 dw db", OT_FLOATS, OT_REF_HOST, run_linear_backward, {3}, {{3, 21, 64}},
   .s = {48}, .k = {1}},
  {"linear_backward", "x [3,21,64] w [48,64], f32 dw, no db", OT_FLOATS, OT_REF_HOST, run_linear_backward, {3}, {{3, 21, 64}},
   .s = {48}, .k = {0}},
  {"linear_backward", "x [5,19] w [33,19], dw db in the row's dtype, no dx", OT_FLOATS, OT_REF_HOST, run_linear_backward,
   {2}, {{5, 19}}, .s = {33}, .k = {1, 1, 1}, .tol = {[SH_BF16] = 2e-2}},
  {"linear_backward", "x [3,21,64] w [48,64], f32 dw db written (set)", OT_FLOATS, OT_REF_HOST, run_linear_backward, {3},
   {{3, 21, 64}}, .s = {48}, .k = {1, 0, 0, 1}},
  {"linear_backward", "x [5,19] w [33,19], dw db in the row's dtype written (set), no dx", OT_FLOATS, OT_REF_HOST,
   run_linear_backward, {2}, {{5, 19}}, .s = {33}, .k = {1, 1, 1, 1}, .tol = {[SH_BF16] = 2e-2}},
  {"linear_backward", "x [0,16] w [5,16], dw db written (set) with no rows: zeros", OT_FLOATS, OT_REF_HOST,
   run_linear_backward, {2}, {{0, 16}}, .s = {5}, .k = {1, 0, 0, 1}},
  {"linear_backward", "x [1,1,13] w [7,13] (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_linear_backward, {3}, {{1, 1, 13}},
   .s = {7}, .k = {1}},
  {"linear_backward", "x [2,8] w [50304,8] (vocab)", OT_FLOATS, OT_REF_HOST, run_linear_backward, {2}, {{2, 8}},
   .s = {50304}, .k = {1}},
  /* the fused fronts: matmul epilogues (bias + gelu; dgelu + bias gradient) */
  {"linear_gelu_forward", "x [37,64] w [96,64] +b", OT_FLOATS, OT_REF_HOST, run_linear_gelu_forward, {2}, {{37, 64}},
   .s = {96}, .k = {1}},
  {"linear_gelu_forward", "x [2,3,19] w [33,19] +b", OT_FLOATS, OT_REF_HOST, run_linear_gelu_forward, {3}, {{2, 3, 19}},
   .s = {33}, .k = {1}},
  {"linear_gelu_forward", "x [1,1,8] w [24,8] (no b)", OT_FLOATS, OT_REF_HOST, run_linear_gelu_forward, {3}, {{1, 1, 8}},
   .s = {24}, .k = {0}},
  {"linear_backward_dgelu", "x pre [37,96] w [32,96], f32 dw db", OT_FLOATS, OT_REF_HOST, run_linear_backward_dgelu, {2},
   {{37, 96}}, .s = {32}, .k = {1}},
  {"linear_backward_dgelu", "x pre [37,96] w [32,96], no dw db", OT_FLOATS, OT_REF_HOST, run_linear_backward_dgelu, {2},
   {{37, 96}}, .s = {32}, .k = {0}},
  {"linear_backward_dgelu", "x pre [37,96] w [32,96], then pre at +1 element", OT_FLOATS, OT_REF_HOST,
   run_linear_backward_dgelu, {2}, {{37, 96}}, .s = {32}, .k = {0, 1}},
  {"linear_backward_dgelu", "x pre [2,3,19] w [5,19]", OT_FLOATS, OT_REF_HOST, run_linear_backward_dgelu, {3}, {{2, 3, 19}},
   .s = {5}, .k = {1}},

  /* normalisation */
  {"layernorm_forward", "[6,33,200] f32 w b", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{6, 33, 200}}, .k = {1}, .a = {1e-5}},
  {"layernorm_forward", "[6,33,200] no affine", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{6, 33, 200}}, .k = {0}, .a = {1e-5}},
  {"layernorm_forward", "[1,1,7] w b in the row's dtype (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{1, 1, 7}},
   .k = {1, 1}, .a = {1e-5}},
  {"layernorm_forward", "[3,1] (C 1)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {2}, {{3, 1}}, .k = {1}, .a = {1e-5}},
  {"layernorm_backward", "[6,33,200] f32 w b", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{6, 33, 200}}, .k = {1}, .a = {1e-5}},
  {"layernorm_backward", "[6,33,200] no affine", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{6, 33, 200}}, .k = {0}, .a = {1e-5}},
  {"layernorm_backward", "[1,1,7] w b in the row's dtype", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{1, 1, 7}},
   .k = {1, 1}, .a = {1e-5}, .tol = {[SH_BF16] = 2e-2}},
  {"layernorm_backward", "[2,9000] f32 w b (C 9000)", OT_F32 | OT_BF16, OT_REF_HOST, run_norm_backward, {2}, {{2, 9000}},
   .k = {1}, .a = {1e-5}},
  {"rmsnorm_forward", "[6,33,200] f32 w", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{6, 33, 200}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_forward", "[6,33,200] no w", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{6, 33, 200}}, .k = {0, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_forward", "[1,1,7] (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {3}, {{1, 1, 7}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_backward", "[6,33,200] f32 w", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{6, 33, 200}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_backward", "[6,33,200] no w", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{6, 33, 200}}, .k = {0, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_backward", "[1,1,7] (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_norm_backward, {3}, {{1, 1, 7}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"layernorm_residual_forward", "[17,96]", OT_FLOATS, OT_REF_HOST, run_layernorm_residual, {2}, {{17, 96}}, .a = {1e-5},
   .tol = {[SH_BF16] = 2e-2, [SH_F16] = 1e-2}},
  {"layernorm_residual_forward", "[1,1,13] (B 1, T 1)", OT_FLOATS, OT_REF_HOST, run_layernorm_residual, {3}, {{1, 1, 13}},
   .a = {1e-5}, .tol = {[SH_BF16] = 2e-2, [SH_F16] = 1e-2}},

  /* activations, softmax, dropout */
  ACT(OT_GELU, "gelu", 7, 333, 2), ACT(OT_GELU, "gelu", 1, 3, 1),
  ACT(OT_SILU, "silu", 7, 333, 2), ACT(OT_SILU, "silu", 3, 5, 2),
  ACT(OT_SOFTMAX, "softmax", 7, 1031, 2), ACT(OT_SOFTMAX, "softmax", 2, 50257, 2), ACT(OT_SOFTMAX, "softmax", 5, 1, 2),
  ACT(OT_SOFTMAX, "softmax", 0, 5, 2),
  ACT(OT_SWIGLU, "swiglu", 5, 77, 1), ACT(OT_SWIGLU, "swiglu", 1, 9, 1),
  {"dropout_forward", "[9,1001] p 0.3 seed 1234 offset 77", OT_FLOATS, OT_REF_HOST, run_dropout, {2}, {{9, 1001}},
   .s = {1234, 77}, .a = {0.3}},
  {"dropout_forward", "[5] p 0 (a copy)", OT_FLOATS, OT_REF_HOST, run_dropout, {1}, {{5}}, .s = {1, 0}, .a = {0}},
  {"dropout_backward", "[9,1001] p 0.3 seed 1234 offset 77", OT_FLOATS, OT_REF_HOST, run_dropout, {2}, {{9, 1001}},
   .s = {1234, 77}, .k = {0, 1}, .a = {0.3}},
  {"dropout_backward", "[3,7] p 0.9 seed 7 offset 2", OT_FLOATS, OT_REF_HOST, run_dropout, {2}, {{3, 7}}, .s = {7, 2},
   .k = {0, 1}, .a = {0.9}},

  /* attention: tensor-core tiles (bf16, D % 16 == 0, D <= 128), the simple path, T = 1,
   * T not a multiple of the 64-row tile, heads split out of a fused qkv */
  ATT(2, 3, 130, 64, 0, ""), ATT(1, 2, 128, 128, 1, " (fused qkv views)"), ATT(1, 1, 70, 48, 0, ""),
  ATT(2, 2, 77, 40, 0, ""), ATT(1, 2, 33, 64, 0, ""), ATT(1, 2, 33, 24, 0, " (D not a multiple of 16)"),
  ATT(1, 2, 1, 64, 0, " (T 1)"), ATT(1, 2, 100, 96, 1, " (D 96 padded to 128, fused qkv views)"),
  ATT(2, 1, 200, 32, 1, " (fused qkv views, 4 tiles)"),
  {"attention_forward", "B 1 H 2 T 17 D 8 scale 0.3", OT_FLOATS, OT_REF_HOST, run_attention, .s = {1, 2, 17, 8}, .a = {0.3}},
  {"attention_backward", "B 1 H 2 T 17 D 8 scale 0.3", OT_FLOATS, OT_REF_HOST, run_attention, .s = {1, 2, 17, 8},
   .k = {1}, .a = {0.3}},
  ATT(1, 1, 17, 8, 0, " (small)"),

  /* grouped-query attention (k and v with Hkv heads) and its rotary form, the Llama layout
   * (heads as views of [B, T, heads, D] projections) included; rope alone */
  GQA(1, 2, 37, 16, 1, 0, 0, OT_FLOATS, " (GQA)"), GQA(2, 3, 70, 64, 1, 1, 10000, OT_FLOATS, " (GQA rope, Llama views)"),
  GQA(1, 3, 130, 32, 1, 1, 10000, OT_FLOATS, " (GQA rope, T > 2 tiles)"),
  GQA(1, 2, 17, 24, 2, 0, 500, OT_FLOATS, " (rope, MHA, D 24)"), GQA(1, 3, 1, 16, 3, 0, 10000, OT_FLOATS, " (rope, T 1)"),
  GQA(1, 2, 33, 128, 1, 1, 500000, OT_FLOATS, " (GQA rope, D 128)"),
  GQA(2, 6, 70, 64, 2, 1, 10000, OT_F32 | OT_F16, " (GQA rope, 2 kv heads of 3)"),
  GQA(1, 8, 40, 16, 2, 0, 0, OT_F32 | OT_F16, " (GQA, 2 kv heads of 4)"),
  {"rope_forward", "B 2 H 3 T 19 D 10 theta 10000", OT_FLOATS, OT_REF_HOST, run_rope, .s = {2, 3, 19, 10}, .a = {10000}},
  {"rope_backward", "B 2 H 3 T 19 D 10 theta 10000", OT_FLOATS, OT_REF_HOST, run_rope, .s = {2, 3, 19, 10}, .k = {1},
   .a = {10000}},
  {"rope_forward", "B 1 H 1 T 300 D 64 theta 500000", OT_FLOATS, OT_REF_HOST, run_rope, .s = {1, 1, 300, 64},
   .a = {500000}},

  /* embedding and the loss */
  {"embedding_forward", "w [301,40] idx i64 [4,37] in [0,50)", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{4, 37}},
   .s = {301, 40}, .k = {0, OT_DT(SH_I64)}, .a = {50}},
  {"embedding_forward", "w [301,40] idx i32 [4,37]", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{4, 37}},
   .s = {301, 40}, .k = {0, OT_DT(SH_I32)}, .a = {50}},
  {"embedding_forward", "w [50257,4] idx [1,3] (vocab, B 1)", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{1, 3}},
   .s = {50257, 4}, .k = {0, OT_DT(SH_I64)}},
  {"embedding_backward", "dw [301,40] idx i64 [4,37] in [0,50)", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{4, 37}},
   .s = {301, 40}, .k = {1, OT_DT(SH_I64)}, .a = {50}, .tol = {[SH_BF16] = 2e-2}},
  {"embedding_backward", "dw [301,40] idx i32 [4,37]", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{4, 37}},
   .s = {301, 40}, .k = {1, OT_DT(SH_I32)}, .a = {50}, .tol = {[SH_BF16] = 2e-2}},
  {"embedding_backward", "dw [301,4] idx i32 [45,200] (9000 indices)", OT_F32 | OT_BF16, OT_REF_HOST, run_embedding, {2},
   {{45, 200}}, .s = {301, 4}, .k = {1, OT_DT(SH_I32)}, .tol = {[SH_BF16] = 2e-2}},
  {"embedding_backward", "dw [50304,4] = 0, idx [2,3] (vocab)", OT_FLOATS, OT_REF_HOST, run_embedding, {2}, {{2, 3}},
   .s = {50304, 4}, .k = {1, OT_DT(SH_I64), 1}},
  {"cross_entropy_forward", "[67,1000] every 5th ignored", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {67, 1000, 5}, .k = {0, OT_DT(SH_I64)}, .a = {3, 0.7}},
  {"cross_entropy_forward", "[3,50257] i32 targets (vocab)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {3, 50257, 0}, .k = {0, OT_DT(SH_I32)}, .a = {2, 0.7}},
  {"cross_entropy_forward", "[2,50304] one ignored (vocab)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {2, 50304, 2}, .k = {0, OT_DT(SH_I64)}, .a = {2, 0.7}},
  {"cross_entropy_forward", "[4,7] all ignored (loss 0)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {4, 7, 1}, .k = {0, OT_DT(SH_I64)}, .a = {1, 0.7}},
  {"cross_entropy_forward", "[1,5] (N 1)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {1, 5, 0}, .k = {0, OT_DT(SH_I64)}, .a = {1, 0.7}},
  {"cross_entropy_backward", "[67,1000] every 5th ignored", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {67, 1000, 5}, .k = {1, OT_DT(SH_I64)}, .a = {3, 0.7}},
  {"cross_entropy_backward", "[3,50257] i32 targets (vocab)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {3, 50257, 0}, .k = {1, OT_DT(SH_I32)}, .a = {2, 0.7}},
  {"cross_entropy_backward", "[2,50304] one ignored (vocab)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {2, 50304, 2}, .k = {1, OT_DT(SH_I64)}, .a = {2, 0.7}},
  {"cross_entropy_backward", "[4,7] all ignored (zeros)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {4, 7, 1}, .k = {1, OT_DT(SH_I64)}, .a = {1, 0.7}},

  /* optimizers: grad f32 or bf16 (the contract) */
  {"adamw_step_", "[20011] 3 steps, bf16 shadow", OT_F32 | OT_BF16, OT_REF_HOST, run_adamw, .s = {20011, 3},
   .k = {OT_DT(SH_BF16)}},
  {"adamw_step_", "[1001] 2 steps, f16 shadow", OT_F32, OT_REF_HOST, run_adamw, .s = {1001, 2}, .k = {OT_DT(SH_F16)}},
  {"adamw_step_", "[7] 1 step, no shadow", OT_F32 | OT_BF16, OT_REF_HOST, run_adamw, .s = {7, 1}},
  {"grad_norm", "[1000]+[333] strided, norm 2 weights (1, 0.5), max_norm 1", OT_F32 | OT_BF16, OT_REF_HOST,
   run_grad_norm_clip, .s = {1000, 333}, .a = {1, 0.5}},
  {"grad_norm", "[17]+[5] strided, norm 1, max_norm 1000 (no clip)", OT_F32, OT_REF_HOST, run_grad_norm_clip,
   .s = {17, 5}, .a = {1000, 1}, .k = {1}},
  {"grad_norm", "[4097]+[1] strided, norm inf, max_norm 0.5", OT_F32 | OT_BF16, OT_REF_HOST, run_grad_norm_clip,
   .s = {4097, 1}, .a = {0.5, 1}, .k = {2}},
  {"sgd_step_", "[5000] 3 steps momentum 0.9 wd 0.01", OT_F32 | OT_BF16, OT_REF_HOST, run_sgd, .s = {5000, 3},
   .a = {0.9, 0, 0.01}},
  {"sgd_step_", "[5000] 3 steps nesterov momentum 0.9 wd 0.01", OT_F32 | OT_BF16, OT_REF_HOST, run_sgd, .s = {5000, 3},
   .k = {1}, .a = {0.9, 0, 0.01}},
  {"sgd_step_", "[333] 2 steps momentum 0.5 dampening 0.1 scale 0.25", OT_F32, OT_REF_HOST, run_sgd, .s = {333, 2},
   .a = {0.5, 0.1, 0, 0.25}},
  {"sgd_step_", "[333] 2 steps no momentum", OT_F32 | OT_BF16, OT_REF_HOST, run_sgd, .s = {333, 2}, .a = {0, 0, 0.01}},

  /* Rows added last keep the others' seeds (a case's seed follows its index). The cuda norms
   * hold up to 2048 bf16 (1024 f32, 256 unaligned) elements of a row in registers: longer
   * rows go in segments, misaligned or odd ones element by element. */
  {"layernorm_forward", "[4,9000] f32 w b (segments)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {2}, {{4, 9000}}, .k = {1}, .a = {1e-5}},
  {"layernorm_forward", "[5,1001] f32 w b (odd C, segments)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {2}, {{5, 1001}}, .k = {1}, .a = {1e-5}},
  {"layernorm_forward", "[6,200] f32 w b, x one element into a buffer", OT_FLOATS, OT_REF_HOST, run_norm_forward, {2}, {{6, 200}},
   .k = {1, 0, 1}, .a = {1e-5}},
  {"layernorm_backward", "[5,1001] f32 w b (odd C, segments)", OT_FLOATS, OT_REF_HOST, run_norm_backward, {2}, {{5, 1001}},
   .k = {1}, .a = {1e-5}},
  {"layernorm_backward", "[6,200] f32 w b, x one element into a buffer", OT_FLOATS, OT_REF_HOST, run_norm_backward, {2},
   {{6, 200}}, .k = {1, 0, 1}, .a = {1e-5}},
  {"rmsnorm_forward", "[3,3000] f32 w (segments)", OT_FLOATS, OT_REF_HOST, run_norm_forward, {2}, {{3, 3000}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"rmsnorm_backward", "[3,3000] f32 w (segments)", OT_FLOATS, OT_REF_HOST, run_norm_backward, {2}, {{3, 3000}}, .k = {1, 0, 0, 1}, .a = {1e-6}},
  {"layernorm_residual_forward", "[3,2600] (segments: the sum re-read)", OT_FLOATS, OT_REF_HOST, run_layernorm_residual, {2},
   {{3, 2600}}, .a = {1e-5}, .tol = {[SH_BF16] = 2e-2, [SH_F16] = 1e-2}},
  {"cross_entropy_backward_", "[67,1000] every 5th ignored, in place", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {67, 1000, 5}, .k = {1, OT_DT(SH_I64), 1}, .a = {3, 0.7}},
  {"cross_entropy_backward_", "[3,50257] i32 targets, in place (odd V: element by element)", OT_FLOATS, OT_REF_HOST,
   run_cross_entropy, .s = {3, 50257, 0}, .k = {1, OT_DT(SH_I32), 1}, .a = {2, 0.7}},
  {"cross_entropy_backward_", "[4,7] all ignored, in place (zeros)", OT_FLOATS, OT_REF_HOST, run_cross_entropy,
   .s = {4, 7, 1}, .k = {1, OT_DT(SH_I64), 1}, .a = {1, 0.7}},
};

enum { OT_ROWS = (int)(sizeof ot_table / sizeof ot_table[0]) };

/* Does row i run under the filter (a substring of the op name; NULL: every row)? */
static int ot_selected(const ot_row *row, const char *filter) {
  return !filter || !*filter || strstr(row->op, filter) != NULL;
}

/* Monotonic seconds, for the run's timing lines. */
static double ot_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The seed of every case: SHARD_TEST_SEED, else a fixed one (the table is deterministic). */
static uint64_t ot_base_seed(void) {
  const char *env = getenv("SHARD_TEST_SEED");
  return env ? strtoull(env, NULL, 10) : 20261123ull;
}

static uint64_t ot_case_seed(uint64_t base, int row, int dtype) { return ot_mix(ot_mix(base, (uint64_t)row), (uint64_t)dtype); }

/* One pass over the table, the loop both test mains run (tests/c/test_op_table.c: the CPU
 * against its references; tests/gpu/test_op_table.c: cuda against the CPU): for every row the
 * filter selects, in every dtype it lists, the op on got_device (run twice, poisoned between)
 * against the same case on ref_device, compared with ot_compare(..., on_device, ...). */
typedef struct {
  int got_device, got_ref;     /* ot_begin's device and ref for the case under test */
  int ref_device, ref_ref;     /* ... and for what it is compared against */
  int on_device;               /* ot_compare's third argument */
  int skip_f64_referenced;     /* leave out the f64 case of an f64-referenced row */
  const char *got_where;       /* in failure messages: "label<got_where>: msg" */
  const char *ref_where;
  void (*after_got)(const char *label);  /* NULL, or run after the case under test */
  unsigned dtypes;             /* 0: every dtype a row lists; else only these of them (OT_BF16 | ...) */
} ot_pass;

static void ot_run_pass(const ot_pass *p, const char *filter, uint64_t base, int *rows, int *cases) {
  *rows = *cases = 0;
  for (int i = 0; i < OT_ROWS; i++) {
    const ot_row *row = &ot_table[i];
    if (!ot_selected(row, filter)) continue;
    (*rows)++;
    for (int dt = 0; dt < 8; dt++) {
      if (!(row->dtypes & (1u << dt)) || (p->dtypes && !(p->dtypes & (1u << dt)))) continue;
      if (p->skip_f64_referenced && row->ref == OT_REF_F64 && dt == SH_F64) continue;
      (*cases)++;
      char label[256];
      ot_label(label, sizeof label, row, dt);
      double t1 = ot_now();
      ot_run got, ref;
      ot_begin(&got, row, dt, p->got_device, p->got_ref, ot_case_seed(base, i, dt));
      ot_exec(&got, 1);
      if (p->after_got) p->after_got(label);
      ot_begin(&ref, row, dt, p->ref_device, p->ref_ref, ot_case_seed(base, i, dt));
      ot_exec(&ref, 0);
      CHECK(!got.failed, "%s%s: %s", label, p->got_where, got.msg);
      CHECK(!ref.failed, "%s%s: %s", label, p->ref_where, ref.msg);
      if (!got.failed && !ref.failed) ot_compare(&got, &ref, p->on_device, label);
      ot_end(&got);
      ot_end(&ref);
      if (getenv("SHARD_TEST_VERBOSE")) printf("  %-70s %.3f s\n", label, ot_now() - t1);
    }
  }
}
