/* random.c: the fronts of arange, the random fills and dropout (ops.h, nn.h): checks, the
 * output on the device asked for, then that device's kernel (cpu/random.c, kernels/random.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "ops.h"

int sh_arange(sh_tensor **out, double start, double end, double step, int dtype, int device) {
  *out = NULL;
  if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
    return sh_fail(SH_ERR_ARG, "arange: needs finite start, end and a non-zero step, got (%g, %g, %g)", start, end, step);
  if ((end - start) * step < 0)
    return sh_fail(SH_ERR_ARG, "arange: step %g never reaches %g from %g", step, end, start);
  if (sh_dtype_size(dtype) == 0) return sh_fail(SH_ERR_ARG, "arange: unknown dtype %d", dtype);
  int64_t n = (int64_t)ceil((end - start) / step);
  SH_TRY(sh_tensor_empty(out, 1, &n, dtype, device));
  int rc = SH_KERNEL("arange", device, arange, *out, start, step);
  if (rc) {
    sh_tensor_destroy(*out);
    *out = NULL;
  }
  return rc;
}

static int check_random(const sh_tensor *t, const char *op) {
  SH_TRY(sh_tensor_check(t, op));
  if (!sh_dtype_is_float(t->dtype)) return sh_fail(SH_ERR_ARG, "%s: needs a float tensor, got %s", op, sh_desc(t));
  return SH_OK;
}

int sh_random_normal_(sh_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  SH_TRY(check_random(t, "normal_"));
  if (!(std >= 0)) return sh_fail(SH_ERR_ARG, "normal_: std must be >= 0, got %g", std);
  t->version++;
  return SH_KERNEL("normal_", t->device, random_normal_, t, seed, offset, mean, std);
}

int sh_random_uniform_(sh_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  SH_TRY(check_random(t, "uniform_"));
  if (!(low <= high)) return sh_fail(SH_ERR_ARG, "uniform_: needs low <= high, got [%g, %g)", low, high);
  t->version++;
  return SH_KERNEL("uniform_", t->device, random_uniform_, t, seed, offset, low, high);
}
