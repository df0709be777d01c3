/* reduce.c: sum, mean, max, min, argmax, sum_to_shape and sumsq: the fronts, which
 * check, plan and allocate for every device, and the CPU kernels.
 *
 * Every reduction is seen as a dense array [outer, R, inner] reduced over R: a row
 * reduction (inner == 1, the last dim) or a column reduction (inner > 1, vectorized across
 * inner). Non-contiguous, bf16/f16 and integer inputs are first made dense f32 or f64 (ints
 * as f64: exact to 2^53). Sums accumulate in double, so an f32 sum matches an f64 reference
 * to the final rounding whatever the length. The work is cut into tasks of (outer index,
 * inner chunk, slice of R); R is sliced only when there are too few of the others to keep
 * every core busy (a reduce over everything, or [B*T, C] -> [C]), and the slices' partial
 * results are combined at the end.
 *
 * Result dtypes: sum keeps a float dtype and gives i64 for integers and bool (as torch);
 * mean keeps a float dtype and gives f32 for integers; max and min keep the dtype. NaN
 * propagates through every reduction; argmax points at the first NaN, else the first max.
 * The fronts are ops/reduce.c. */
#include "cpu_internal.h"
#include "core/rules_internal.h"
#include "core/parallel.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/backend_internal.h"
#include "backend_cpu_internal.h"

enum { ICHUNK = 1024, PAR_MIN = 32768 };

/* ---- kernels: x dense [outer, R, inner] of float or double, acc in double ------------- */

#define NAN_MAX(a, x) (((x) > (a) || (x) != (x)) ? (x) : (a))

#define NAN_MIN(a, x) (((x) < (a) || (x) != (x)) ? (x) : (a))

static double init_of(int op) { return op == SH_OP_MAX ? -INFINITY : op == SH_OP_MIN ? INFINITY : 0.0; }

/* Eight doubles (GCC vector extensions): four SSE2 registers on the baseline, two AVX2 or
 * one AVX-512 register in the other kernel sets' builds. */
typedef double v8d __attribute__((vector_size(64)));

typedef float v8f __attribute__((vector_size(32)));

/* Macros rather than functions: passing v8d by value changes ABI between the kernel sets' builds. */
#define load8_f32(p) ({ v8f f_; memcpy(&f_, (p), sizeof f_); __builtin_convertvector(f_, v8d); })

#define load8_f64(p) ({ v8d d_; memcpy(&d_, (p), sizeof d_); d_; })

/* *out op= x[0..n) for one contiguous run, in double. Two independent accumulators of eight
 * lanes keep the adds from waiting on each other (one accumulator is latency-bound). */
#define DEFINE_ROW(NAME, T, LOAD)                                                          \
  SH_CPU_KERNEL(NAME, (int op, double *out, const T *x, int64_t n), (op, out, x, n)) {     \
    double acc = *out;                                                                     \
    if (n == 0) return;                                                                    \
    double init = init_of(op);                                                             \
    v8d a0 = {init, init, init, init, init, init, init, init}, a1 = a0;                    \
    int64_t i = 0;                                                                         \
    switch (op) {                                                                          \
      case SH_OP_SUM: case SH_OP_MEAN:                                                     \
        for (; i + 16 <= n; i += 16) { a0 += LOAD(x + i); a1 += LOAD(x + i + 8); }         \
        for (; i < n; i++) acc += x[i];                                                    \
        break;                                                                             \
      case SH_OP_SUMSQ:                                                                      \
        for (; i + 16 <= n; i += 16) {                                                     \
          v8d b0 = LOAD(x + i), b1 = LOAD(x + i + 8);                                      \
          a0 += b0 * b0; a1 += b1 * b1;                                                    \
        }                                                                                  \
        for (; i < n; i++) acc += (double)x[i] * x[i];                                     \
        break;                                                                             \
      case SH_OP_MAX: case SH_OP_MIN: {                                                    \
        /* max/min lanes in T (exact); NaN is tracked apart so the lanes can use maxps */    \
        T m = x[0];                                                                        \
        int nan = 0;                                                                       \
        if (op == SH_OP_MAX) {                                                             \
          _Pragma("omp simd reduction(max:m) reduction(|:nan)")                           \
          for (int64_t j = 0; j < n; j++) { m = x[j] > m ? x[j] : m; nan |= x[j] != x[j]; } \
          *out = nan ? NAN : NAN_MAX(acc, (double)m);                                      \
          return;                                                                          \
        }                                                                                  \
        _Pragma("omp simd reduction(min:m) reduction(|:nan)")                             \
        for (int64_t j = 0; j < n; j++) { m = x[j] < m ? x[j] : m; nan |= x[j] != x[j]; }  \
        *out = nan ? NAN : NAN_MIN(acc, (double)m);                                        \
        return;                                                                            \
      }                                                                                    \
    }                                                                                      \
    a0 += a1;                                                                              \
    *out = acc + (((a0[0] + a0[1]) + (a0[2] + a0[3])) + ((a0[4] + a0[5]) + (a0[6] + a0[7]))); \
  }

/* acc[0..n) op= x[r * stride + 0..n) for r in [0, rows). Sums take four rows per pass over
 * acc, so acc is loaded and stored a quarter as often. */
#define DEFINE_COLS(NAME, T)                                                               \
  SH_CPU_KERNEL(NAME, (int op, double *acc, const T *x, int64_t rows, int64_t stride, int64_t n),            \
                (op, acc, x, rows, stride, n)) {                                                         \
    int64_t r = 0;                                                                          \
    if (op == SH_OP_SUM || op == SH_OP_MEAN)                                                \
      for (; r + 4 <= rows; r += 4) {                                                       \
        const T *x0 = x + r * stride, *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride; \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                 \
          acc[i] += ((double)x0[i] + x1[i]) + ((double)x2[i] + x3[i]);                      \
      }                                                                                     \
    for (; r < rows; r++) {                                                                 \
      const T *xr = x + r * stride;                                                         \
      switch (op) {                                                                         \
        case SH_OP_SUM: case SH_OP_MEAN:                                                    \
          _Pragma("omp simd") for (int64_t i = 0; i < n; i++) acc[i] += xr[i];             \
          break;                                                                            \
        case SH_OP_SUMSQ:                                                                     \
          _Pragma("omp simd") for (int64_t i = 0; i < n; i++) acc[i] += (double)xr[i] * xr[i]; \
          break;                                                                            \
        case SH_OP_MAX:                                                                     \
          _Pragma("omp simd") for (int64_t i = 0; i < n; i++) acc[i] = NAN_MAX(acc[i], (double)xr[i]); \
          break;                                                                            \
        default:                                                                            \
          _Pragma("omp simd") for (int64_t i = 0; i < n; i++) acc[i] = NAN_MIN(acc[i], (double)xr[i]); \
      }                                                                                     \
    }                                                                                       \
  }

DEFINE_ROW(row_f32, float, load8_f32)
DEFINE_ROW(row_f64, double, load8_f64)
DEFINE_COLS(cols_f32, float)
DEFINE_COLS(cols_f64, double)

static double combine(int op, double a, double b) {
  if (op == SH_OP_MAX) return NAN_MAX(a, b);
  if (op == SH_OP_MIN) return NAN_MIN(a, b);
  return a + b;
}

/* A dense [outer, R, inner] problem. */
typedef struct red_plan {
  const void *x;
  int dt;                /* SH_F32 or SH_F64 */
  int64_t outer, R, inner;
  int op;
} red_plan;

/* Reduces rows [r0, r1) for outer index o and inner columns [i0, i0 + n) into acc[0..n). */
static void reduce_task(const red_plan *p, int64_t o, int64_t r0, int64_t r1, int64_t i0, int64_t n, double *acc) {
  for (int64_t i = 0; i < n; i++) acc[i] = init_of(p->op);
  int64_t start = (o * p->R + r0) * p->inner + i0;
  if (p->inner == 1) {
    if (p->dt == SH_F32) row_f32(p->op, acc, (const float *)p->x + start, r1 - r0);
    else row_f64(p->op, acc, (const double *)p->x + start, r1 - r0);
  } else if (p->dt == SH_F32) {
    cols_f32(p->op, acc, (const float *)p->x + start, r1 - r0, p->inner, n);
  } else {
    cols_f64(p->op, acc, (const double *)p->x + start, r1 - r0, p->inner, n);
  }
}

/* Tasks t0 .. t1: a task is one outer index and one of `splits` slices of R, all inner
 * chunks in turn, into its own part of `part`. */
typedef struct reduce_job { const red_plan *p; double *part; int64_t splits, chunk; } reduce_job;

static void reduce_tasks(void *arg, int64_t t0, int64_t t1) {
  const reduce_job *j = arg;
  const red_plan *p = j->p;
  int64_t splits = j->splits, nout = p->outer * p->inner;
  for (int64_t t = t0; t < t1; t++) {
    int64_t s = splits > 1 ? t / p->outer : 0, o = splits > 1 ? t % p->outer : t;
    int64_t r0 = splits > 1 ? p->R * s / splits : 0, r1 = splits > 1 ? p->R * (s + 1) / splits : p->R;
    double *dst = j->part + s * nout + o * p->inner;
    for (int64_t i0 = 0; i0 < p->inner; i0 += j->chunk)
      reduce_task(p, o, r0, r1, i0, p->inner - i0 < j->chunk ? p->inner - i0 : j->chunk, dst + i0);
  }
}

/* res[outer * inner] = the reduction over R (sums, not yet divided for a mean). */
static int reduce_core(const red_plan *p, double *res) {
  int64_t chunk = p->inner < ICHUNK ? p->inner : ICHUNK;
  int64_t numel = p->outer * p->R * p->inner, nout = p->outer * p->inner;
  if (nout == 0) return SH_OK;
  int threads = sh_parallel_threads();
  int64_t splits = 1;
  if (numel > PAR_MIN && p->outer < threads) {   /* too few tasks: slice R as well */
    splits = (threads + p->outer - 1) / p->outer;
    if (splits > p->R / 256) splits = p->R / 256 > 1 ? p->R / 256 : 1;
  }
  double *part = splits > 1 ? malloc(sizeof(double) * (size_t)(splits * nout)) : res;
  if (!part) return sh_fail(SH_ERR_OOM, "%s: out of host memory for %lld partial results",
                            sh_reduce_name(p->op), (long long)(splits * nout));
  reduce_job job = { p, part, splits, chunk };
  sh_parallel_for(p->outer * splits, numel > PAR_MIN, reduce_tasks, &job);
  if (splits > 1) {
    for (int64_t j = 0; j < nout; j++) {
      double v = part[j];
      for (int64_t s = 1; s < splits; s++) v = combine(p->op, v, part[s * nout + j]);
      res[j] = v;
    }
    free(part);
  }
  return SH_OK;
}

/* ---- shapes and dtypes --------------------------------------------------------------- */

static int dense_dtype(int dtype) { return dtype == SH_F32 || dtype == SH_BF16 || dtype == SH_F16 ? SH_F32 : SH_F64; }

/* Stores res (double) into the contiguous tensor out, dividing by div (a mean's count). */
static void store_result(sh_tensor *out, const double *res, double div) {
  int64_t n = sh_tensor_numel(out);
  void *d = sh_tensor_data(out);
  if (out->dtype == SH_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)d)[i] = (float)(res[i] / div);
  } else {
    for (int64_t i = 0; i < n; i++) sh_store(d, out->dtype, i, res[i] / div);
  }
}

/* ---- CPU kernels: arguments checked and outputs allocated by the fronts below ---------- */

/* A shape seen as [outer, shape[dim], inner]. */
static void split_at(int ndim, const int64_t *shape, int dim, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= shape[d];
  for (int d = dim + 1; d < ndim; d++) *inner *= shape[d];
}

/* Reduces the dense version of a as [outer, R, inner] into out (contiguous). */
static int reduce_into(sh_tensor *out, int op, const sh_tensor *a, int64_t outer, int64_t R, int64_t inner) {
  sh_tensor *x = NULL;
  SH_TRY(sh_kernel_contiguous_as(&x, a, dense_dtype(a->dtype)));
  double *res = malloc(sizeof(double) * (size_t)(outer * inner > 0 ? outer * inner : 1));
  int rc = res ? SH_OK : sh_fail(SH_ERR_OOM, "%s: out of host memory for the result of %s", sh_reduce_name(op), sh_desc(a));
  red_plan p = {.x = sh_tensor_data(x), .dt = x->dtype, .outer = outer, .R = R, .inner = inner, .op = op};
  if (!rc) rc = reduce_core(&p, res);
  if (!rc) store_result(out, res, op == SH_OP_MEAN ? (double)R : 1.0);
  free(res);
  sh_tensor_destroy(x);
  return rc;
}

int sh_kcpu_reduce(sh_tensor *out, int op, const sh_tensor *a, int dim) {
  int64_t outer, inner;
  split_at(a->ndim, a->shape, dim, &outer, &inner);
  return reduce_into(out, op, a, outer, a->shape[dim], inner);
}

int sh_kcpu_reduce_all(sh_tensor *out, int op, const sh_tensor *a) {
  return reduce_into(out, op, a, 1, sh_tensor_numel(a), 1);
}

/* First index of the max over R for each (o, i), NaN counting as the max. */
#define DEFINE_ARGMAX(NAME, T)                                                             \
  static void NAME(const T *x, int64_t R, int64_t inner, int64_t i0, int64_t n, int64_t *idx) { \
    T best[ICHUNK];                                                                         \
    for (int64_t i = 0; i < n; i++) { best[i] = x[i0 + i]; idx[i] = 0; }                   \
    for (int64_t r = 1; r < R; r++) {                                                       \
      const T *xr = x + r * inner + i0;                                                     \
      for (int64_t i = 0; i < n; i++)                                                       \
        if (best[i] == best[i] && (xr[i] > best[i] || xr[i] != xr[i])) { best[i] = xr[i]; idx[i] = r; } \
    }                                                                                       \
  }

DEFINE_ARGMAX(argmax_f32, float)
DEFINE_ARGMAX(argmax_f64, double)

/* Tasks t0 .. t1: one outer index and one chunk of ICHUNK inner columns each. */
typedef struct argmax_job { const void *data; int64_t *idx; int f32; int64_t R, inner, nchunks; } argmax_job;

static void argmax_tasks(void *arg, int64_t t0, int64_t t1) {
  const argmax_job *j = arg;
  int64_t R = j->R, inner = j->inner;
  for (int64_t t = t0; t < t1; t++) {
    int64_t o = t / j->nchunks, i0 = (t % j->nchunks) * ICHUNK;
    int64_t cnt = inner - i0 < ICHUNK ? inner - i0 : ICHUNK;
    if (j->f32) argmax_f32((const float *)j->data + o * R * inner, R, inner, i0, cnt, j->idx + o * inner + i0);
    else argmax_f64((const double *)j->data + o * R * inner, R, inner, i0, cnt, j->idx + o * inner + i0);
  }
}

int sh_kcpu_argmax(sh_tensor *out, const sh_tensor *a, int dim) {
  int64_t outer, inner, R = a->shape[dim];
  split_at(a->ndim, a->shape, dim, &outer, &inner);
  sh_tensor *x = NULL;
  SH_TRY(sh_kernel_contiguous_as(&x, a, dense_dtype(a->dtype)));
  int64_t *idx = sh_tensor_data(out), nchunks = (inner + ICHUNK - 1) / ICHUNK;
  const void *data = sh_tensor_data(x);
  argmax_job job = { data, idx, x->dtype == SH_F32, R, inner, nchunks };
  sh_parallel_for(outer * nchunks, outer * R * inner > PAR_MIN, argmax_tasks, &job);
  sh_tensor_destroy(x);
  return SH_OK;
}

/* out and a have the same dims; each dim where out is 1 and a is not is summed in turn
 * (the front merged neighbouring dims into runs, so [B,T,C] -> [C] is one column reduction
 * of [B*T, C]), into double buffers, and the last pass writes out. */
int sh_kcpu_sum_to_shape(sh_tensor *out, const sh_tensor *a) {
  sh_tensor *x = NULL;
  SH_TRY(sh_kernel_contiguous_as(&x, a, dense_dtype(a->dtype)));
  int64_t size[SH_MAX_DIMS];
  memcpy(size, a->shape, sizeof(int64_t) * a->ndim);
  double *buf[2] = {NULL, NULL};
  const void *src = sh_tensor_data(x);
  int dt = x->dtype, cur = 0, rc = SH_OK;
  for (int r = 0; r < a->ndim && !rc; r++) {
    if (out->shape[r] == size[r]) continue;
    int64_t outer, inner;
    split_at(a->ndim, size, r, &outer, &inner);
    if (!buf[cur]) buf[cur] = malloc(sizeof(double) * (size_t)(outer * inner > 0 ? outer * inner : 1));
    if (!buf[cur]) { rc = sh_fail(SH_ERR_OOM, "sum_to_shape: out of host memory for %s", sh_desc(a)); break; }
    red_plan p = {.x = src, .dt = dt, .outer = outer, .R = size[r], .inner = inner, .op = SH_OP_SUM};
    rc = reduce_core(&p, buf[cur]);
    src = buf[cur];
    dt = SH_F64;
    cur ^= 1;
    size[r] = 1;               /* later dims see this one as gone */
  }
  if (!rc) store_result(out, src, 1.0);
  free(buf[0]);
  free(buf[1]);
  sh_tensor_destroy(x);
  return rc;
}

int sh_kcpu_sumsq(const sh_tensor *a, double *out) {
  sh_tensor *x = NULL;
  SH_TRY(sh_kernel_contiguous_as(&x, a, dense_dtype(a->dtype)));
  red_plan p = {.x = sh_tensor_data(x), .dt = x->dtype, .outer = 1, .R = sh_tensor_numel(x), .inner = 1, .op = SH_OP_SUMSQ};
  int rc = reduce_core(&p, out);
  sh_tensor_destroy(x);
  return rc;
}
