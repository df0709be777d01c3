/* ops_create.c: arange and the random fills on the CPU.
 * Random element i (in row-major order of the target's shape, whatever its strides) takes
 * counter offset + i of the Philox stream (philox_internal.h), so a strided view, a
 * contiguous tensor and a CUDA tensor of the same shape get the same numbers, and drawing
 * n then m numbers equals drawing n + m. Every element is independent, so rows split over
 * OpenMP threads without changing a single value. Uniform numbers lie in (low, high]
 * (philox's unit interval is (0, 1]), so a log of one is always finite. */
#include "ops_internal.h"
#include "ops.h"
#include "philox_internal.h"
#include <math.h>
#include "cuda_internal.h"

int sh_arange(sh_tensor **out, double start, double end, double step, int dtype, int device) {
  *out = NULL;
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
    return sh_fail(SH_ERR_ARG, "arange: needs finite start, end and a non-zero step, got (%g, %g, %g)", start, end, step);
  if ((end - start) * step < 0)
    return sh_fail(SH_ERR_ARG, "arange: step %g never reaches %g from %g", step, end, start);
  if (sh_dtype_size(dtype) == 0) return sh_fail(SH_ERR_ARG, "arange: unknown dtype %d", dtype);
  int64_t n = (int64_t)ceil((end - start) / step);
  sh_tensor *t = NULL;
  SH_TRY(sh_new_like_shape(&t, 1, &n, dtype, -1));
  void *d = sh_tensor_data(t);
  for (int64_t i = 0; i < n; i++) sh_store(d, dtype, i, start + (double)i * step);
  if (device < 0) { *out = t; return SH_OK; }
  int rc = sh_tensor_to(out, t, dtype, device);
  sh_tensor_destroy(t);
  return rc;
}

/* Element offset of the start of row r (the row being the last dim) of t. */
static int64_t row_offset(const sh_tensor *t, int64_t r) {
  int64_t off = t->offset;
  for (int d = t->ndim - 2; d >= 0; d--) { off += (r % t->shape[d]) * t->stride[d]; r /= t->shape[d]; }
  return off;
}

/* Writes DRAW (of the counter i) into every element of the CPU tensor t, element i being
 * the i-th in row-major order. Chunks of CHUNK elements are the unit of parallel work, so a
 * single long row splits as well as many short ones. */
enum { CHUNK = 4096 };
#define DEFINE_FILL(NAME, DRAW)                                                            \
  static void NAME(sh_tensor *t, uint64_t seed, uint64_t offset, double a, double b) {     \
    int64_t n = sh_tensor_numel(t);                                                        \
    if (n == 0) return;                                                                    \
    int64_t len = t->ndim ? t->shape[t->ndim - 1] : 1, inner = t->ndim ? t->stride[t->ndim - 1] : 0; \
    char *base = t->storage->data;                                                         \
    int dt = t->dtype;                                                                     \
    float fa = (float)a, fb = (float)b;                                                    \
    _Pragma("omp parallel for schedule(static) if (n > 2 * CHUNK)")                        \
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++) {                                \
      int64_t i0 = c * CHUNK, i1 = i0 + CHUNK < n ? i0 + CHUNK : n;                        \
      int64_t r = i0 / len, j = i0 % len, off = row_offset(t, r);                          \
      for (int64_t k = i0; k < i1; k++) {                                                  \
        uint64_t i = (uint64_t)k;                                                          \
        if (dt == SH_F32) ((float *)base)[off + j * inner] = DRAW;                         \
        else sh_store(base, dt, off + j * inner, DRAW);                                    \
        if (++j == len) { j = 0; off = row_offset(t, ++r); }                               \
      }                                                                                    \
    }                                                                                      \
  }

/* f32 math as on the GPU, so both backends agree bit for bit in f32. */
DEFINE_FILL(fill_normal, fa + fb * sh_philox_normal(seed, offset, i))
DEFINE_FILL(fill_uniform, fa + (fb - fa) * sh_philox_uniform(seed, offset, i))

static int check_random(sh_tensor *t, const char *op) {
  SH_TRY(sh_require_cpu(t, op));
  if (!sh_dtype_is_float(t->dtype)) return sh_fail(SH_ERR_ARG, "%s: needs a float tensor, got %s", op, sh_desc(t));
  return SH_OK;
}

int sh_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  if (t && t->device >= 0) return sh_cuda_random_normal_(t, seed, offset, mean, std);
  SH_TRY(check_random(t, "normal_"));
  if (!(std >= 0)) return sh_fail(SH_ERR_ARG, "normal_: std must be >= 0, got %g", std);
  fill_normal(t, seed, offset, mean, std);
  t->version++;
  return SH_OK;
}

int sh_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  if (t && t->device >= 0) return sh_cuda_random_uniform_(t, seed, offset, low, high);
  SH_TRY(check_random(t, "uniform_"));
  if (!(low <= high)) return sh_fail(SH_ERR_ARG, "uniform_: needs low <= high, got [%g, %g)", low, high);
  fill_uniform(t, seed, offset, low, high);
  t->version++;
  return SH_OK;
}
