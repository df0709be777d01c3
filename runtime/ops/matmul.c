/* matmul.c: the fronts of matmul and gemm_ (ops.h): shapes and dtypes planned, then the
 * kernel of the operands' device (cpu/matmul.c, kernels/matmul.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "ops.h"

/* ---- fronts: checks, the result's shape and dtype, then the kernel of the device ------- */

/* Checks a @ b and plans the result: the promoted dtype, and the broadcast batch dims
 * followed by M (unless a is 1-D) and N (unless b is 1-D). */
static int plan_matmul(const sh_tensor *a, const sh_tensor *b, int *dt, int *ndim, int64_t *shape) {
  SH_TRY(sh_tensor_check(a, "matmul"));
  SH_TRY(sh_tensor_check(b, "matmul"));
  SH_TRY(sh_check_on(b, a->device, "matmul", "b"));
  /* both operands float (as torch): an integer operand is a mistake (token ids), not
   * something to promote silently */
  *dt = sh_promote(a->dtype, b->dtype);
  if (!sh_dtype_is_float(a->dtype) || !sh_dtype_is_float(b->dtype))
    return sh_fail(SH_ERR_ARG, "matmul: needs float tensors, got %s @ %s", sh_desc(a), sh_desc(b));
  if (a->ndim == 0 || b->ndim == 0)
    return sh_fail(SH_ERR_ARG, "matmul: needs at least 1-D tensors, got %s @ %s", sh_desc(a), sh_desc(b));
  /* a 1-D a is one row, a 1-D b one column; the dims before the last two are the batch */
  int64_t a_rows = a->ndim > 1 ? a->shape[a->ndim - 2] : 1, a_cols = a->shape[a->ndim - 1];
  int64_t b_rows = b->ndim > 1 ? b->shape[b->ndim - 2] : b->shape[0], b_cols = b->ndim > 1 ? b->shape[b->ndim - 1] : 1;
  if (a_cols != b_rows)
    return sh_fail(SH_ERR_ARG, "matmul: inner dims differ (%lld vs %lld) in %s @ %s", (long long)a_cols,
                   (long long)b_rows, sh_desc(a), sh_desc(b));
  int a_batch = a->ndim > 2 ? a->ndim - 2 : 0, b_batch = b->ndim > 2 ? b->ndim - 2 : 0;
  SH_TRY(sh_broadcast_shapes("matmul", a_batch, a->shape, b_batch, b->shape, ndim, shape));
  if (a->ndim > 1) shape[(*ndim)++] = a_rows;
  if (b->ndim > 1) shape[(*ndim)++] = b_cols;
  return SH_OK;
}

int sh_matmul(sh_tensor **out, const sh_tensor *a, const sh_tensor *b) {
  *out = NULL;
  int dt, ndim;
  int64_t shape[SH_MAX_DIMS];
  SH_TRY(plan_matmul(a, b, &dt, &ndim, shape));
  SH_TRY(sh_tensor_empty(out, ndim, shape, dt, a->device));
  int rc = SH_KERNEL("matmul", a->device, matmul, *out, a, b);
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

static int check_gemm(const sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b) {
  SH_TRY(sh_tensor_check(c, "gemm_"));
  SH_TRY(sh_tensor_check(a, "gemm_"));
  SH_TRY(sh_tensor_check(b, "gemm_"));
  SH_TRY(sh_check_on(a, c->device, "gemm_", "a"));
  SH_TRY(sh_check_on(b, c->device, "gemm_", "b"));
  if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2)
    return sh_fail(SH_ERR_ARG, "gemm_: needs 2-D tensors, got c %s, a %s, b %s", sh_desc(c), sh_desc(a), sh_desc(b));
  if (!sh_dtype_is_float(a->dtype) || !sh_dtype_is_float(b->dtype) || !sh_dtype_is_float(c->dtype))
    return sh_fail(SH_ERR_ARG, "gemm_: needs float tensors, got c %s, a %s, b %s", sh_desc(c), sh_desc(a), sh_desc(b));
  int64_t ar = a->shape[trans_a != 0], ac = a->shape[trans_a == 0];   /* op(a) = a or a^T */
  int64_t br = b->shape[trans_b != 0], bc = b->shape[trans_b == 0];
  if (ac != br || ar != c->shape[0] || bc != c->shape[1])
    return sh_fail(SH_ERR_ARG, "gemm_: op(a) [%lld,%lld] @ op(b) [%lld,%lld] does not give c %s (a %s%s, b %s%s)",
                   (long long)ar, (long long)ac, (long long)br, (long long)bc, sh_desc(c),
                   sh_desc(a), trans_a ? " transposed" : "", sh_desc(b), trans_b ? " transposed" : "");
  return SH_OK;
}

int sh_gemm_(sh_tensor *c, const sh_tensor *a, const sh_tensor *b, int trans_a, int trans_b,
             double alpha, double beta) {
  SH_TRY(check_gemm(c, a, b, trans_a, trans_b));
  SH_TRY(SH_KERNEL("gemm_", c->device, gemm_, c, a, b, trans_a, trans_b, alpha, beta));
  c->version++;
  return SH_OK;
}
