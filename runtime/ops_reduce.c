/* ops_reduce.c: sum, mean, max, min, argmax, sum_to_shape and sumsq on the CPU.
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
 * propagates through every reduction; argmax points at the first NaN, else the first max. */
#include "backend_internal.h"
#include "ops_internal.h"
#include "ops.h"
#include "cuda_internal.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { ICHUNK = 1024, PAR_MIN = 32768 };
enum { RED_SUMSQ = 100 };  /* internal: sum of squares */

const char *sh_reduce_name(int op) {
  static const char *names[] = {"sum", "mean", "max", "min"};
  if (op == RED_SUMSQ) return "sumsq";
  return op >= 0 && op <= SH_OP_MIN ? names[op] : "reduce";
}

/* ---- kernels: x dense [outer, R, inner] of float or double, acc in double ------------- */

#define NAN_MAX(a, x) (((x) > (a) || (x) != (x)) ? (x) : (a))
#define NAN_MIN(a, x) (((x) < (a) || (x) != (x)) ? (x) : (a))

static double init_of(int op) { return op == SH_OP_MAX ? -INFINITY : op == SH_OP_MIN ? INFINITY : 0.0; }

/* Eight doubles (GCC vector extensions): four SSE2 registers on the baseline, two AVX2 or
 * one AVX-512 register in the clones. */
typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

/* Macros rather than functions: passing v8d by value changes ABI between the clones. */
#define load8_f32(p) ({ v8f f_; memcpy(&f_, (p), sizeof f_); __builtin_convertvector(f_, v8d); })
#define load8_f64(p) ({ v8d d_; memcpy(&d_, (p), sizeof d_); d_; })

/* acc op= x[0..n) for one contiguous run, in double. Two independent accumulators of eight
 * lanes keep the adds from waiting on each other (one accumulator is latency-bound). */
#define DEFINE_ROW(NAME, T, LOAD)                                                          \
  SH_CLONES static double NAME(int op, double acc, const T *x, int64_t n) {                \
    if (n == 0) return acc;                                                                \
    double init = init_of(op);                                                             \
    v8d a0 = {init, init, init, init, init, init, init, init}, a1 = a0;                    \
    int64_t i = 0;                                                                         \
    switch (op) {                                                                          \
      case SH_OP_SUM: case SH_OP_MEAN:                                                     \
        for (; i + 16 <= n; i += 16) { a0 += LOAD(x + i); a1 += LOAD(x + i + 8); }         \
        for (; i < n; i++) acc += x[i];                                                    \
        break;                                                                             \
      case RED_SUMSQ:                                                                      \
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
          return nan ? NAN : NAN_MAX(acc, (double)m);                                      \
        }                                                                                  \
        _Pragma("omp simd reduction(min:m) reduction(|:nan)")                             \
        for (int64_t j = 0; j < n; j++) { m = x[j] < m ? x[j] : m; nan |= x[j] != x[j]; }  \
        return nan ? NAN : NAN_MIN(acc, (double)m);                                        \
      }                                                                                    \
    }                                                                                      \
    a0 += a1;                                                                              \
    return acc + (((a0[0] + a0[1]) + (a0[2] + a0[3])) + ((a0[4] + a0[5]) + (a0[6] + a0[7]))); \
  }

/* acc[0..n) op= x[r * stride + 0..n) for r in [0, rows). Sums take four rows per pass over
 * acc, so acc is loaded and stored a quarter as often. */
#define DEFINE_COLS(NAME, T)                                                               \
  SH_CLONES static void NAME(int op, double *acc, const T *x, int64_t rows, int64_t stride, int64_t n) { \
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
        case RED_SUMSQ:                                                                     \
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
    acc[0] = p->dt == SH_F32 ? row_f32(p->op, acc[0], (const float *)p->x + start, r1 - r0)
                             : row_f64(p->op, acc[0], (const double *)p->x + start, r1 - r0);
  } else if (p->dt == SH_F32) {
    cols_f32(p->op, acc, (const float *)p->x + start, r1 - r0, p->inner, n);
  } else {
    cols_f64(p->op, acc, (const double *)p->x + start, r1 - r0, p->inner, n);
  }
}

/* res[outer * inner] = the reduction over R (sums, not yet divided for a mean). */
static int reduce_core(const red_plan *p, double *res) {
  int64_t chunk = p->inner < ICHUNK ? p->inner : ICHUNK;
  int64_t numel = p->outer * p->R * p->inner, nout = p->outer * p->inner;
  if (nout == 0) return SH_OK;
  int threads = omp_get_max_threads();
  int64_t splits = 1;
  if (numel > PAR_MIN && p->outer < threads) {   /* too few tasks: slice R as well */
    splits = (threads + p->outer - 1) / p->outer;
    if (splits > p->R / 256) splits = p->R / 256 > 1 ? p->R / 256 : 1;
  }
  double *part = splits > 1 ? malloc(sizeof(double) * (size_t)(splits * nout)) : res;
  if (!part) return sh_fail(SH_ERR_OOM, "%s: out of host memory for %lld partial results",
                            sh_reduce_name(p->op), (long long)(splits * nout));
  /* a task is one outer index and one slice of R, all inner chunks in turn */
  int64_t ntasks = p->outer * splits;
  #pragma omp parallel for schedule(static) if (numel > PAR_MIN && ntasks > 1)
  for (int64_t t = 0; t < ntasks; t++) {
    int64_t s = splits > 1 ? t / p->outer : 0, o = splits > 1 ? t % p->outer : t;
    int64_t r0 = splits > 1 ? p->R * s / splits : 0, r1 = splits > 1 ? p->R * (s + 1) / splits : p->R;
    double *dst = part + s * nout + o * p->inner;
    for (int64_t i0 = 0; i0 < p->inner; i0 += chunk)
      reduce_task(p, o, r0, r1, i0, p->inner - i0 < chunk ? p->inner - i0 : chunk, dst + i0);
  }
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

int sh_reduce_result_dtype(int op, int dtype) {
  if (sh_dtype_is_float(dtype) || op == SH_OP_MAX || op == SH_OP_MIN) return dtype;
  return op == SH_OP_MEAN ? SH_F32 : SH_I64;
}

int sh_reduce_dim(const char *op, const sh_tensor *a, int *dim) {
  int d = *dim < 0 ? *dim + a->ndim : *dim;
  if (d < 0 || d >= a->ndim)
    return sh_fail(SH_ERR_ARG, "%s: dim %d out of range for %s", op, *dim, sh_desc(a));
  *dim = d;
  return SH_OK;
}

/* The output shape of reducing dim of a (kept as 1 or dropped). */
int sh_reduced_shape(const sh_tensor *a, int dim, int keepdim, int64_t *shape) {
  int n = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (d != dim) shape[n++] = a->shape[d];
    else if (keepdim) shape[n++] = 1;
  }
  return n;
}

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

/* Reduces the dense version of a as [outer, R, inner] into out (already allocated). */
static int reduce_into(sh_tensor *out, int op, const sh_tensor *a, int64_t outer, int64_t R, int64_t inner) {
  sh_tensor *x = NULL;
  SH_TRY(sh_contiguous_as(&x, a, dense_dtype(a->dtype)));
  double *res = malloc(sizeof(double) * (size_t)(outer * inner > 0 ? outer * inner : 1));
  int rc = res ? SH_OK : sh_fail(SH_ERR_OOM, "%s: out of host memory for the result of %s", sh_reduce_name(op), sh_desc(a));
  red_plan p = {.x = sh_tensor_data(x), .dt = x->dtype, .outer = outer, .R = R, .inner = inner, .op = op};
  if (!rc) rc = reduce_core(&p, res);
  if (!rc) store_result(out, res, op == SH_OP_MEAN ? (double)R : 1.0);
  free(res);
  sh_tensor_destroy(x);
  return rc;
}

static int check_reduce(int op, const sh_tensor *a, int64_t R) {
  if (op < SH_OP_SUM || op > SH_OP_MIN) return sh_fail(SH_ERR_ARG, "reduce: unknown op code %d", op);
  SH_TRY(sh_require_cpu(a, sh_reduce_name(op)));
  if (R == 0 && (op == SH_OP_MAX || op == SH_OP_MIN))
    return sh_fail(SH_ERR_ARG, "%s: the reduced dim of %s is empty", sh_reduce_name(op), sh_desc(a));
  return SH_OK;
}

/* ---- entry points -------------------------------------------------------------------- */

int sh_reduce(sh_tensor **out, int op, const sh_tensor *a, int dim, int keepdim) {
  if (a && a->storage && a->device >= 0) return sh_cuda_reduce(out, op, a, dim, keepdim);
  *out = NULL;
  SH_TRY(check_reduce(op, a, 1));
  SH_TRY(sh_reduce_dim(sh_reduce_name(op), a, &dim));
  SH_TRY(check_reduce(op, a, a->shape[dim]));
  int64_t shape[SH_MAX_DIMS], outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= a->shape[d];
  for (int d = dim + 1; d < a->ndim; d++) inner *= a->shape[d];
  int n = sh_reduced_shape(a, dim, keepdim, shape);
  SH_TRY(sh_new_like_shape(out, n, shape, sh_reduce_result_dtype(op, a->dtype), -1));
  int rc = reduce_into(*out, op, a, outer, a->shape[dim], inner);
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

int sh_reduce_all(sh_tensor **out, int op, const sh_tensor *a) {
  if (a && a->storage && a->device >= 0) return sh_cuda_reduce_all(out, op, a);
  *out = NULL;
  SH_TRY(check_reduce(op, a, 1));
  SH_TRY(check_reduce(op, a, sh_tensor_numel(a)));
  SH_TRY(sh_new_like_shape(out, 0, a->shape, sh_reduce_result_dtype(op, a->dtype), -1));
  int rc = reduce_into(*out, op, a, 1, sh_tensor_numel(a), 1);
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
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

int sh_argmax(sh_tensor **out, const sh_tensor *a, int dim, int keepdim) {
  if (a && a->storage && a->device >= 0) return sh_cuda_argmax(out, a, dim, keepdim);
  *out = NULL;
  SH_TRY(sh_require_cpu(a, "argmax"));
  SH_TRY(sh_reduce_dim("argmax", a, &dim));
  if (a->shape[dim] == 0) return sh_fail(SH_ERR_ARG, "argmax: the reduced dim of %s is empty", sh_desc(a));
  int64_t shape[SH_MAX_DIMS], outer = 1, inner = 1, R = a->shape[dim];
  for (int d = 0; d < dim; d++) outer *= a->shape[d];
  for (int d = dim + 1; d < a->ndim; d++) inner *= a->shape[d];
  int n = sh_reduced_shape(a, dim, keepdim, shape);
  sh_tensor *x = NULL;
  SH_TRY(sh_contiguous_as(&x, a, dense_dtype(a->dtype)));
  int rc = sh_new_like_shape(out, n, shape, SH_I64, -1);
  if (rc) { sh_tensor_destroy(x); return rc; }
  int64_t *idx = sh_tensor_data(*out), nchunks = (inner + ICHUNK - 1) / ICHUNK;
  const void *data = sh_tensor_data(x);
  int f32 = x->dtype == SH_F32;
  #pragma omp parallel for schedule(static) if (outer * R * inner > PAR_MIN)
  for (int64_t t = 0; t < outer * nchunks; t++) {
    int64_t o = t / nchunks, i0 = (t % nchunks) * ICHUNK;
    int64_t cnt = inner - i0 < ICHUNK ? inner - i0 : ICHUNK;
    if (f32) argmax_f32((const float *)data + o * R * inner, R, inner, i0, cnt, idx + o * inner + i0);
    else argmax_f64((const double *)data + o * R * inner, R, inner, i0, cnt, idx + o * inner + i0);
  }
  sh_tensor_destroy(x);
  return SH_OK;
}

/* sum_to_shape: the dims of a that `shape` lacks or has as 1 are summed. a is made dense,
 * its dims are grouped into runs of kept and summed dims (so [B,T,C] -> [C] is one column
 * reduction of [B*T, C]), and each summed run is reduced in turn, in double. */
static int sum_runs(sh_tensor *out, const sh_tensor *a, int nruns, int64_t *size, const int *summed) {
  sh_tensor *x = NULL;
  SH_TRY(sh_contiguous_as(&x, a, dense_dtype(a->dtype)));
  double *buf[2] = {NULL, NULL};
  const void *src = sh_tensor_data(x);
  int dt = x->dtype, cur = 0, rc = SH_OK;
  for (int r = 0; r < nruns && !rc; r++) {
    if (!summed[r]) continue;
    int64_t outer = 1, inner = 1;
    for (int q = 0; q < r; q++) outer *= size[q];
    for (int q = r + 1; q < nruns; q++) inner *= size[q];
    if (!buf[cur]) buf[cur] = malloc(sizeof(double) * (size_t)(outer * inner > 0 ? outer * inner : 1));
    if (!buf[cur]) { rc = sh_fail(SH_ERR_OOM, "sum_to_shape: out of host memory for %s", sh_desc(a)); break; }
    red_plan p = {.x = src, .dt = dt, .outer = outer, .R = size[r], .inner = inner, .op = SH_OP_SUM};
    rc = reduce_core(&p, buf[cur]);
    src = buf[cur];
    dt = SH_F64;
    cur ^= 1;
    size[r] = 1;               /* later runs see this one as gone */
  }
  if (!rc) store_result(out, src, 1.0);
  free(buf[0]);
  free(buf[1]);
  sh_tensor_destroy(x);
  return rc;
}

int sh_sum_to_shape(sh_tensor **out, const sh_tensor *a, int ndim, const int64_t *shape) {
  if (a && a->storage && a->device >= 0) return sh_cuda_sum_to_shape(out, a, ndim, shape);
  *out = NULL;
  SH_TRY(sh_require_cpu(a, "sum_to_shape"));
  int lead = a->ndim - ndim, nb;
  int64_t bshape[SH_MAX_DIMS];
  char want[160];
  if (ndim < 0 || lead < 0 || sh_broadcast_shapes("sum_to_shape", a->ndim, a->shape, ndim, shape, &nb, bshape) ||
      memcmp(bshape, a->shape, sizeof(int64_t) * a->ndim) != 0)
    return sh_fail(SH_ERR_ARG, "sum_to_shape: %s does not broadcast from shape %s", sh_desc(a),
                   sh_shape_str(ndim < 0 ? 0 : ndim, shape, want, sizeof want));
  int64_t size[SH_MAX_DIMS];
  int summed[SH_MAX_DIMS], nruns = 0, any = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->shape[d] == 1) continue;
    int s = d < lead || shape[d - lead] == 1;
    any |= s;
    if (nruns && summed[nruns - 1] == s) size[nruns - 1] *= a->shape[d];
    else { size[nruns] = a->shape[d]; summed[nruns++] = s; }
  }
  SH_TRY(sh_new_like_shape(out, ndim, shape, a->dtype, -1));
  int rc;
  if (any) {
    rc = sum_runs(*out, a, nruns, size, summed);
  } else {                     /* nothing to sum: only size-1 dims differ */
    sh_tensor *v = NULL;
    rc = sh_tensor_reshape(&v, a, ndim, shape);
    if (!rc) rc = sh_tensor_copy_(*out, v);
    sh_tensor_destroy(v);
  }
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

double sh_sumsq(const sh_tensor *a, int *status) {
  if (a && a->storage && a->device >= 0) return sh_cuda_sumsq(a, status);
  int rc = sh_require_cpu(a, "sumsq");
  sh_tensor *x = NULL;
  double res = 0;
  if (!rc) rc = sh_contiguous_as(&x, a, dense_dtype(a->dtype));
  red_plan p = {.x = x ? sh_tensor_data(x) : NULL, .dt = x ? x->dtype : SH_F64, .outer = 1,
                .R = x ? sh_tensor_numel(x) : 0, .inner = 1, .op = RED_SUMSQ};
  if (!rc) rc = reduce_core(&p, &res);
  sh_tensor_destroy(x);
  if (status) *status = rc;
  return rc ? NAN : res;
}

/* TRANSITION: kernels not yet in the table; replaced when this family is converted. */
void sh_reduce_register_cpu(sh_backend *b) { (void)b; }
