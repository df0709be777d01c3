/* elementwise.c: binary and unary elementwise ops with broadcasting: the fronts (any
 * device) and the CPU kernels.
 *
 * Every op runs through one engine. The operands are seen in the output's shape (strides 0
 * where broadcast), size-1 dims are dropped and adjacent dims that are contiguous for every
 * operand are merged, so the common cases become one long row (same-shape contiguous) or
 * rows of the last dim ([B,T,C] + [C]). Rows are cut into blocks of at most BLOCK elements
 * that the thread team (parallel.h) spreads over the cores once the tensor is large. Within
 * a block, an operand already in the compute dtype with stride 1 (or 0: a broadcast scalar)
 * is used in place; anything else (bf16, a transposed view, an integer input to a float
 * result) is gathered into a small buffer first, so the typed kernels only ever see dense
 * arrays and vectorize.
 *
 * Result dtypes (the contract's promotion, plus):
 *  - EQ, LT, GT return the promoted dtype holding 0 or 1 (f32 masks multiply straight into
 *    f32 math; there is no bool result);
 *  - DIV of integers and the transcendental unary ops of integers give f32 (true division);
 *  - arithmetic (add, sub, mul, div, pow) and unary math on bool are errors; maximum,
 *    minimum and comparisons of bools are allowed;
 *  - a scalar operand does not widen a float tensor (f32 + 0.1 stays f32, computed in f32);
 *    a non-integral scalar with an integer tensor gives f32.
 * Integers compute in i64, so i64 add/sub/mul are exact. Comparisons and maximum/minimum
 * propagate NaN as torch does (maximum(NaN, 1) = NaN; NaN == NaN is 0).
 * The fronts are ops/elementwise.c. */
#include "cpu_internal.h"
#include "fastmath_internal.h"
#include "core/bf16_internal.h"
#include "core/rules_internal.h"
#include "core/parallel.h"
#include <math.h>
#include <string.h>
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

enum { BLOCK = 4096, PAR_MIN = 32768, PAR_MIN_COSTLY = 4096 };

/* ---- typed kernels: dense arrays, sa/sb = 1 (array) or 0 (one broadcast value) -------- */

/* x if it wins or is NaN, else y (which is then NaN if either is): NaN propagates. */
#define NAN_MAX(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))

#define NAN_MIN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))

/* o[i] = EXPR(x, y) with x = a[i] or a[0], y = b[i] or b[0]. */
#define BIN_LOOP(T, EXPR) do {                                                            \
    if (sa && sb) { _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; o[i] = (EXPR); } } \
    else if (sa) { T y = b[0]; _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { T x = a[i]; o[i] = (EXPR); } } \
    else { T x = a[0]; _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { T y = b[i]; o[i] = (EXPR); } } \
  } while (0)

#define DEFINE_FLOAT_BINARY(NAME, T, POW)                                                 \
  SH_CPU_KERNEL(NAME, (int op, T alpha, T *o, const T *a, int sa, const T *b, int sb, int64_t n),            \
                (op, alpha, o, a, sa, b, sb, n)) {                                                  \
    switch (op) {                                                                         \
      case SH_OP_ADD: BIN_LOOP(T, x + y); break;                                          \
      case SH_OP_SUB: BIN_LOOP(T, x - y); break;                                          \
      case SH_OP_MUL: BIN_LOOP(T, x * y); break;                                          \
      case SH_OP_DIV: BIN_LOOP(T, x / y); break;                                          \
      case SH_OP_POW:                                                                     \
        if (!sb && b[0] == 2) { _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = a[i] * a[i]; } \
        else BIN_LOOP(T, POW(x, y));                                                      \
        break;                                                                            \
      case SH_OP_MAXIMUM: BIN_LOOP(T, NAN_MAX(x, y)); break;                              \
      case SH_OP_MINIMUM: BIN_LOOP(T, NAN_MIN(x, y)); break;                              \
      case SH_OP_EQ: BIN_LOOP(T, (T)(x == y)); break;                                     \
      case SH_OP_LT: BIN_LOOP(T, (T)(x < y)); break;                                      \
      case SH_OP_GT: BIN_LOOP(T, (T)(x > y)); break;                                      \
      case SH_OP_AXPY: BIN_LOOP(T, x + alpha * y); break;                                    \
    }                                                                                     \
  }

DEFINE_FLOAT_BINARY(binary_f32, float, powf)
DEFINE_FLOAT_BINARY(binary_f64, double, pow)

/* Integer pow by squaring, wrapping on overflow (unsigned math) like torch. */
static int64_t ipow(int64_t x, int64_t y) {
  if (y < 0) return x == 1 ? 1 : x == -1 ? (y & 1 ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  for (; y; y >>= 1) {
    if (y & 1) r *= b;
    b *= b;
  }
  return (int64_t)r;
}

static void binary_i64(int op, int64_t alpha, int64_t *o, const int64_t *a, int sa, const int64_t *b, int sb, int64_t n) {
  switch (op) {
    case SH_OP_ADD: BIN_LOOP(int64_t, x + y); break;
    case SH_OP_SUB: BIN_LOOP(int64_t, x - y); break;
    case SH_OP_MUL: BIN_LOOP(int64_t, x * y); break;
    case SH_OP_POW: for (int64_t i = 0; i < n; i++) o[i] = ipow(a[sa * i], b[sb * i]); break;
    case SH_OP_MAXIMUM: BIN_LOOP(int64_t, x > y ? x : y); break;
    case SH_OP_MINIMUM: BIN_LOOP(int64_t, x < y ? x : y); break;
    case SH_OP_EQ: BIN_LOOP(int64_t, x == y); break;
    case SH_OP_LT: BIN_LOOP(int64_t, x < y); break;
    case SH_OP_GT: BIN_LOOP(int64_t, x > y); break;
    case SH_OP_AXPY: BIN_LOOP(int64_t, x + alpha * y); break;
  }
}

#define UN_LOOP(EXPR) do { _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { __typeof__(a[0]) x = a[i]; o[i] = (EXPR); } } while (0)

/* The unary ops over n elements of type T, with that type's exp, log, sqrt, tanh and fabs. */
#define UN_SWITCH(T, EXP, LOG, SQRT, TANH, ABS)                                                  \
  switch (op) {                                                                                 \
    case SH_OP_NEG: UN_LOOP(-x); break;                                                         \
    case SH_OP_EXP: UN_LOOP(EXP(x)); break;                                                     \
    case SH_OP_LOG: UN_LOOP(LOG(x)); break;                                                     \
    case SH_OP_SQRT: UN_LOOP(SQRT(x)); break;                                                   \
    case SH_OP_RSQRT: UN_LOOP((T)1 / SQRT(x)); break;                                           \
    case SH_OP_TANH: UN_LOOP(TANH(x)); break;                                                   \
    case SH_OP_ABS: UN_LOOP(ABS(x)); break;                                                     \
    case SH_OP_SQUARE: UN_LOOP(x * x); break;                                                   \
    case SH_OP_RECIPROCAL: UN_LOOP((T)1 / x); break;                                            \
    case SH_OP_SIGN: UN_LOOP((T)((x > 0) - (x < 0))); break;                                    \
  }

SH_CPU_KERNEL(unary_f32, (int op, float *o, const float *a, int64_t n), (op, o, a, n)) {
  UN_SWITCH(float, sh_expf, logf, sqrtf, sh_tanhf, fabsf)
}

SH_CPU_KERNEL(unary_f64, (int op, double *o, const double *a, int64_t n), (op, o, a, n)) {
  UN_SWITCH(double, exp, log, sqrt, tanh, fabs)
}

/* Integer results only come from neg, abs, square and sign (unary_result). */
static void unary_i64(int op, int64_t *o, const int64_t *a, int64_t n) {
  switch (op) {
    case SH_OP_NEG: UN_LOOP(-x); break;
    case SH_OP_ABS: UN_LOOP(x < 0 ? -x : x); break;
    case SH_OP_SQUARE: UN_LOOP(x * x); break;
    case SH_OP_SIGN: UN_LOOP((x > 0) - (x < 0)); break;
  }
}

/* ---- conversions between storage dtypes and the compute dtype ------------------------ */

static int64_t load_i64(const void *base, int dtype, int64_t i) {
  switch (dtype) {
    case SH_I64: return ((const int64_t *)base)[i];
    case SH_I32: return ((const int32_t *)base)[i];
    case SH_U8: return ((const uint8_t *)base)[i];
    case SH_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return (int64_t)sh_load(base, dtype, i);
  }
}

static void store_i64(void *base, int dtype, int64_t i, int64_t v) {
  switch (dtype) {
    case SH_I64: ((int64_t *)base)[i] = v; break;
    case SH_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case SH_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case SH_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: sh_store(base, dtype, i, (double)v);
  }
}

/* buf[i] = element (off + i * stride) of base, converted to the compute dtype ct. */
static void gather(void *buf, int ct, const void *base, int dt, int64_t off, int64_t stride, int64_t n) {
  if (ct == SH_F32 && dt == SH_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = ((const float *)base)[off + i * stride];
  } else if (ct == SH_F32 && dt == SH_BF16) {
    sh_bf16_to_f32_n(buf, 1, (const uint16_t *)base + off, stride, n);
  } else if (ct == SH_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = (float)sh_load(base, dt, off + i * stride);
  } else if (ct == SH_F64) {
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] = sh_load(base, dt, off + i * stride);
  } else {
    for (int64_t i = 0; i < n; i++) ((int64_t *)buf)[i] = load_i64(base, dt, off + i * stride);
  }
}

/* The reverse: element (off + i * stride) of base = buf[i], converted to dt. */
static void scatter(void *base, int dt, int64_t off, int64_t stride, const void *buf, int ct, int64_t n) {
  if (ct == SH_F32 && dt == SH_BF16) {
    sh_f32_to_bf16_n((uint16_t *)base + off, stride, buf, 1, n);
  } else if (ct == SH_F32) {
    for (int64_t i = 0; i < n; i++) sh_store(base, dt, off + i * stride, ((const float *)buf)[i]);
  } else if (ct == SH_F64) {
    for (int64_t i = 0; i < n; i++) sh_store(base, dt, off + i * stride, ((const double *)buf)[i]);
  } else {
    for (int64_t i = 0; i < n; i++) store_i64(base, dt, off + i * stride, ((const int64_t *)buf)[i]);
  }
}

/* ---- the engine ---------------------------------------------------------------------- */

typedef struct ew_arg {
  char *base;           /* storage data */
  int dtype;
  int64_t offset;
  int64_t stride[SH_MAX_DIMS];
} ew_arg;

typedef struct ew_plan {
  int ndim;
  int64_t shape[SH_MAX_DIMS];
  int nin;              /* 1 (unary) or 2 (binary) */
  ew_arg arg[3];        /* [0] output, [1] a, [2] b */
  int ct;               /* compute dtype: SH_F32, SH_F64 or SH_I64 */
  int op, unary;
  double alpha;
} ew_plan;

static void arg_from(ew_arg *g, const sh_tensor *t, int ndim, const int64_t *shape) {
  g->base = t->storage->data;
  g->dtype = t->dtype;
  g->offset = t->offset;
  sh_broadcast_strides(t, ndim, shape, g->stride);
}

/* A scalar seen as a tensor whose strides are all 0. */
static void arg_scalar(ew_arg *g, const double *s) {
  memset(g, 0, sizeof *g);
  g->base = (char *)s;
  g->dtype = SH_F64;
}

static void collapse(ew_plan *p) {
  int64_t *strides[3] = {p->arg[0].stride, p->arg[1].stride, p->arg[2].stride};
  p->ndim = sh_collapse_dims(p->ndim, p->shape, p->nin + 1, strides);
}

static void run_kernel(const ew_plan *p, void *o, const void *a, int sa, const void *b, int sb, int64_t n) {
  if (p->unary) {
    if (p->ct == SH_F32) unary_f32(p->op, o, a, n);
    else if (p->ct == SH_F64) unary_f64(p->op, o, a, n);
    else unary_i64(p->op, o, a, n);
  } else {
    if (p->ct == SH_F32) binary_f32(p->op, (float)p->alpha, o, a, sa, b, sb, n);
    else if (p->ct == SH_F64) binary_f64(p->op, p->alpha, o, a, sa, b, sb, n);
    else binary_i64(p->op, (int64_t)p->alpha, o, a, sa, b, sb, n);
  }
}

/* Element offsets, for every operand, of the start of row `row` (the row being the last
 * collapsed dim); idx (optional) receives the row's multi-index. */
static void row_start(const ew_plan *p, int64_t row, int64_t *idx, int64_t *off) {
  int nargs = p->nin + 1;
  for (int k = 0; k < nargs; k++) off[k] = p->arg[k].offset;
  for (int d = p->ndim - 2; d >= 0; d--) {
    int64_t i = row % p->shape[d];
    row /= p->shape[d];
    if (idx) idx[d] = i;
    for (int k = 0; k < nargs; k++) off[k] += i * p->arg[k].stride[d];
  }
}

/* Gather buffers for one block of each operand (compute dtype, at most 8 bytes). Callers
 * own one per thread: a 96 KiB array in run_block itself would be probed page by page on
 * every call. */
typedef struct ew_bufs { _Alignas(64) char b[3][BLOCK * 8]; } ew_bufs;

/* Runs elements [c0, c0 + n) of the row whose operands start at off[]. */
static void run_block(const ew_plan *p, ew_bufs *eb, const int64_t *row_off, int64_t c0, int64_t n) {
  char (*bufs)[BLOCK * 8] = eb->b;
  int nargs = p->nin + 1, last = p->ndim - 1, csize = sh_dtype_size(p->ct);
  int64_t off[3];
  for (int k = 0; k < nargs; k++) off[k] = row_off[k] + c0 * p->arg[k].stride[last];
  const void *in[2] = {NULL, NULL};
  int unit[2] = {1, 1};
  for (int k = 1; k < nargs; k++) {
    const ew_arg *g = &p->arg[k];
    int64_t s = g->stride[last];
    int other_dense = nargs == 3 && p->arg[3 - k].stride[last] != 0;
    if (s == 0 && other_dense) {                       /* one value broadcast along the row */
      gather(bufs[k], p->ct, g->base, g->dtype, off[k], 0, 1);
      in[k - 1] = bufs[k];
      unit[k - 1] = 0;
    } else if (s == 1 && g->dtype == p->ct) {
      in[k - 1] = g->base + off[k] * csize;
    } else {
      gather(bufs[k], p->ct, g->base, g->dtype, off[k], s, n);
      in[k - 1] = bufs[k];
    }
  }
  const ew_arg *o = &p->arg[0];
  int direct = o->stride[last] == 1 && o->dtype == p->ct;
  void *out = direct ? (void *)(o->base + off[0] * csize) : bufs[0];
  run_kernel(p, out, in[0], unit[0], in[1], unit[1], n);
  if (!direct) scatter(o->base, o->dtype, off[0], o->stride[last], bufs[0], p->ct, n);
}

/* Runs rows [r0, r1). Row starts advance like an odometer: no division per row, which
 * matters for short rows ([B*T, C] + [C]). */
static void run_rows(const ew_plan *p, int64_t r0, int64_t r1) {
  int nargs = p->nin + 1, last = p->ndim - 1;
  int64_t idx[SH_MAX_DIMS], off[3], len = p->shape[last];
  ew_bufs bufs;
  row_start(p, r0, idx, off);
  for (int64_t r = r0; r < r1; r++) {
    for (int64_t c0 = 0; c0 < len; c0 += BLOCK) run_block(p, &bufs, off, c0, len - c0 < BLOCK ? len - c0 : BLOCK);
    for (int d = last - 1; d >= 0; d--) {
      for (int k = 0; k < nargs; k++) off[k] += p->arg[k].stride[d];
      if (++idx[d] < p->shape[d]) break;
      for (int k = 0; k < nargs; k++) off[k] -= p->arg[k].stride[d] * p->shape[d];
      idx[d] = 0;
    }
  }
}

/* exp, log, tanh and pow do tens of flops per element, so threads pay off much sooner. */
static int costly(const ew_plan *p) {
  if (p->unary) return p->op == SH_OP_EXP || p->op == SH_OP_LOG || p->op == SH_OP_TANH;
  return p->op == SH_OP_POW;
}

static void rows_task(void *p, int64_t r0, int64_t r1) { run_rows(p, r0, r1); }

/* Blocks k0 .. k1 of BLOCK elements, counted along the rows (per_row blocks a row). */
typedef struct block_job { const ew_plan *p; int64_t len, per_row; } block_job;

static void blocks_task(void *arg, int64_t k0, int64_t k1) {
  const block_job *j = arg;
  ew_bufs bufs;
  for (int64_t k = k0; k < k1; k++) {
    int64_t off[3], c0 = (k % j->per_row) * BLOCK;
    row_start(j->p, k / j->per_row, NULL, off);
    run_block(j->p, &bufs, off, c0, j->len - c0 < BLOCK ? j->len - c0 : BLOCK);
  }
}

/* Small ops run on the calling thread. Large ones split rows over the threads, or, when
 * rows are long (a same-shape op is one row), blocks of BLOCK elements. */
static void run_plan(ew_plan *p) {
  collapse(p);
  int64_t len = p->shape[p->ndim - 1], rows = 1;
  for (int d = 0; d < p->ndim - 1; d++) rows *= p->shape[d];
  if (len == 0 || rows == 0) return;
  if (rows * len <= (costly(p) ? PAR_MIN_COSTLY : PAR_MIN)) { run_rows(p, 0, rows); return; }
  if (len <= BLOCK) { sh_parallel_for(rows, 1, rows_task, p); return; }
  block_job job = { p, len, (len + BLOCK - 1) / BLOCK };
  sh_parallel_for(rows * job.per_row, 1, blocks_task, &job);
}

/* ---- CPU kernels: outputs planned and allocated by the fronts ---------------------------- */

/* A plan over out's shape computing in ct, with out as operand 0; the caller adds the inputs. */
static ew_plan plan_for(const sh_tensor *out, int nin, int op, int ct) {
  ew_plan p = {.ndim = out->ndim, .nin = nin, .ct = ct, .op = op, .unary = nin == 1};
  memcpy(p.shape, out->shape, sizeof p.shape);
  arg_from(&p.arg[0], out, p.ndim, p.shape);
  return p;
}

static void plan_arg(ew_plan *p, int k, const sh_tensor *t) { arg_from(&p->arg[k], t, p->ndim, p->shape); }

int sh_kcpu_binary(sh_tensor *out, int op, const sh_tensor *a, const sh_tensor *b) {
  ew_plan p = plan_for(out, 2, op, sh_compute_dtype(out->dtype));
  plan_arg(&p, 1, a);
  plan_arg(&p, 2, b);
  run_plan(&p);
  return SH_OK;
}

int sh_kcpu_binary_scalar(sh_tensor *out, int op, const sh_tensor *a, double s, int scalar_first) {
  ew_plan p = plan_for(out, 2, op, sh_compute_dtype(out->dtype));
  plan_arg(&p, scalar_first ? 2 : 1, a);
  arg_scalar(&p.arg[scalar_first ? 1 : 2], &s);
  run_plan(&p);
  return SH_OK;
}

int sh_kcpu_unary(sh_tensor *out, int op, const sh_tensor *a) {
  ew_plan p = plan_for(out, 1, op, sh_compute_dtype(out->dtype));
  plan_arg(&p, 1, a);
  run_plan(&p);
  return SH_OK;
}

/* dst = dst op b, computing in the dtype the two promote to: the front refused every
 * result that differs from it (an integer division cannot be stored in place). */
static int cpu_inplace(sh_tensor *dst, int op, const sh_tensor *b, double alpha) {
  ew_plan p = plan_for(dst, 2, op, sh_compute_dtype(sh_promote(dst->dtype, b->dtype)));
  p.alpha = alpha;
  plan_arg(&p, 1, dst);
  plan_arg(&p, 2, b);
  run_plan(&p);
  return SH_OK;
}

int sh_kcpu_binary_(sh_tensor *dst, int op, const sh_tensor *b) { return cpu_inplace(dst, op, b, 0); }

int sh_kcpu_axpy_(sh_tensor *dst, double alpha, const sh_tensor *x) { return cpu_inplace(dst, SH_OP_AXPY, x, alpha); }

int sh_kcpu_scale_(sh_tensor *dst, double alpha) {
  ew_plan p = plan_for(dst, 2, SH_OP_MUL, sh_compute_dtype(dst->dtype));
  plan_arg(&p, 1, dst);
  arg_scalar(&p.arg[2], &alpha);
  run_plan(&p);
  return SH_OK;
}

/* ---- copy_ and fill_ ---------------------------------------------------------------------- */

/* n elements at element strides ds and ss from dtype st to dt: bf16 <-> f32 (every
 * mixed-precision op's staging) through bf16_vec.c, same dtypes as bits, the rest element by
 * element. */
static void convert_run(char *d, int64_t ds, int dt, const char *s, int64_t ss, int st, int64_t n) {
  if (dt == SH_F32 && st == SH_BF16) { sh_bf16_to_f32_n((float *)d, ds, (const uint16_t *)s, ss, n); return; }
  if (dt == SH_BF16 && st == SH_F32) { sh_f32_to_bf16_n((uint16_t *)d, ds, (const float *)s, ss, n); return; }
  if (dt == st) {
    int size = sh_dtype_size(dt);
    if (ds == 1 && ss == 1) { memcpy(d, s, (size_t)(n * size)); return; }
    switch (size) {
      case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i * ds] = ((const uint32_t *)s)[i * ss]; return;
      case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)d)[i * ds] = ((const uint64_t *)s)[i * ss]; return;
      case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i * ds] = ((const uint16_t *)s)[i * ss]; return;
      default: for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss]; return;
    }
  }
  for (int64_t i = 0; i < n; i++) sh_store(d, dt, i * ds, sh_load(s, st, i * ss));
}

typedef struct convert_job { char *dst; const char *src; int dt, st; int64_t n; } convert_job;

/* Vectors v0 .. v1 of 16 elements; the last one also takes the tail. */
static void convert_task(void *arg, int64_t v0, int64_t v1) {
  const convert_job *j = arg;
  int64_t a = v0 * 16, b = v1 == j->n / 16 ? j->n : v1 * 16;
  convert_run(j->dst + a * sh_dtype_size(j->dt), 1, j->dt, j->src + a * sh_dtype_size(j->st), 1, j->st, b - a);
}

/* A contiguous conversion, split over the threads when large (in whole vectors of 16). */
static void convert_contiguous(void *dst, int dt, const void *src, int st, int64_t n) {
  if (dt == st || n <= (1 << 16)) { convert_run(dst, 1, dt, src, 1, st, n); return; }
  convert_job job = { dst, src, dt, st, n };
  sh_parallel_for(n / 16, 1, convert_task, &job);
}

/* A strided copy seen as rows along the last dim (src strides already broadcast). */
typedef struct copy_plan {
  char *d;
  const char *s;
  int dt, st, dsz, ssz, last;
  const int64_t *shape, *dstride, *sstride;
} copy_plan;

/* Rows r0 .. r1: the first row's index by division, the next ones advanced like an odometer
 * (a division per row cost more than converting a row of 32). */
static void copy_rows(const copy_plan *p, int64_t r0, int64_t r1) {
  int64_t idx[SH_MAX_DIMS], od = 0, os = 0, r = r0, row = p->shape[p->last];
  for (int d = p->last - 1; d >= 0; d--) {
    idx[d] = r % p->shape[d];
    r /= p->shape[d];
    od += idx[d] * p->dstride[d];
    os += idx[d] * p->sstride[d];
  }
  for (int64_t k = r0; k < r1; k++) {
    convert_run(p->d + od * p->dsz, p->dstride[p->last], p->dt, p->s + os * p->ssz, p->sstride[p->last], p->st, row);
    for (int d = p->last - 1; d >= 0; d--) {
      od += p->dstride[d];
      os += p->sstride[d];
      if (++idx[d] < p->shape[d]) break;
      od -= p->dstride[d] * p->shape[d];
      os -= p->sstride[d] * p->shape[d];
      idx[d] = 0;
    }
  }
}

static void copy_task(void *p, int64_t r0, int64_t r1) { copy_rows(p, r0, r1); }

int sh_kcpu_copy_(sh_tensor *dst, const sh_tensor *src) {
  int64_t n = sh_tensor_numel(dst);
  int same_shape = dst->ndim == src->ndim && memcmp(dst->shape, src->shape, sizeof(int64_t) * dst->ndim) == 0;
  if (same_shape && sh_tensor_is_contiguous(dst) && sh_tensor_is_contiguous(src)) {
    convert_contiguous(sh_tensor_data(dst), dst->dtype, sh_tensor_data(src), src->dtype, n);
    return SH_OK;
  }
  if (n == 0) return SH_OK;
  int64_t sstride[SH_MAX_DIMS];
  sh_broadcast_strides(src, dst->ndim, dst->shape, sstride);
  copy_plan p = { sh_tensor_data(dst), sh_tensor_data(src), dst->dtype, src->dtype, sh_dtype_size(dst->dtype),
                  sh_dtype_size(src->dtype), dst->ndim - 1, dst->shape, dst->stride, sstride };
  if (dst->ndim == 0) { convert_run(p.d, 1, p.dt, p.s, 1, p.st, 1); return SH_OK; }
  int64_t rows = n / dst->shape[p.last];
  if (n <= (1 << 16)) { copy_rows(&p, 0, rows); return SH_OK; }
  sh_parallel_for(rows, 1, copy_task, &p);   /* rows spread over the threads when the copy is big */
  return SH_OK;
}

int sh_kcpu_fill_(sh_tensor *t, double value) {
  int64_t n = sh_tensor_numel(t);
  if (sh_tensor_is_contiguous(t)) {
    void *d = sh_tensor_data(t);
    if (value == 0 && !signbit(value)) { memset(d, 0, (size_t)(n * sh_dtype_size(t->dtype))); return SH_OK; }  /* +0: all bits 0 in every dtype */
    if (t->dtype == SH_F32) { float v = (float)value; for (int64_t i = 0; i < n; i++) ((float *)d)[i] = v; }
    else if (t->dtype == SH_BF16) {   /* rounded once */
      uint16_t v = sh_f32_to_bf16_inline((float)value);
      for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = v;
    } else for (int64_t i = 0; i < n; i++) sh_store(d, t->dtype, i, value);
    return SH_OK;
  }
  const int64_t *strides[1] = {t->stride};
  sh_nditer it;
  sh_nditer_init(&it, t->ndim, t->shape, 1, strides, &t->offset);
  for (int64_t i = 0; i < n; i++, sh_nditer_next(&it)) sh_store(t->storage->data, t->dtype, it.off[0], value);
  return SH_OK;
}
