/* reduce.c: the fronts of sum, mean, max, min, argmax, sum_to_shape and sumsq (ops.h): the
 * dim and the output shape and dtype planned, then the kernel of a's device (cpu/reduce.c,
 * kernels/reduce.cu). */
#include "dispatch_internal.h"
#include "ops_internal.h"
#include "ops.h"
#include <string.h>

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

/* ---- fronts: checks, output shapes and dtypes, then the kernel of a's device ------------ */

static int check_reduce(int op, const sh_tensor *a) {
  if (op < SH_OP_SUM || op > SH_OP_MIN) return sh_fail(SH_ERR_ARG, "reduce: unknown op code %d", op);
  return sh_tensor_check(a, sh_reduce_name(op));
}

/* max, min and argmax have no value over nothing. */
static int check_extent(const char *name, int needs_one, const sh_tensor *a, int64_t R) {
  if (R == 0 && needs_one) return sh_fail(SH_ERR_ARG, "%s: the reduced dim of %s is empty", name, sh_desc(a));
  return SH_OK;
}

/* A front's exit after its kernel: on failure the output it allocated goes. */
static int finish(sh_tensor **out, int rc) {
  if (rc) { sh_tensor_destroy(*out); *out = NULL; }
  return rc;
}

int sh_reduce(sh_tensor **out, int op, const sh_tensor *a, int dim, int keepdim) {
  *out = NULL;
  SH_TRY(check_reduce(op, a));
  const char *name = sh_reduce_name(op);
  SH_TRY(sh_reduce_dim(name, a, &dim));
  SH_TRY(check_extent(name, op == SH_OP_MAX || op == SH_OP_MIN, a, a->shape[dim]));
  int64_t shape[SH_MAX_DIMS];
  int n = sh_reduced_shape(a, dim, keepdim, shape);
  SH_TRY(sh_tensor_empty(out, n, shape, sh_reduce_result_dtype(op, a->dtype), a->device));
  return finish(out, SH_KERNEL(name, a->device, reduce, *out, op, a, dim));
}

int sh_reduce_all(sh_tensor **out, int op, const sh_tensor *a) {
  *out = NULL;
  SH_TRY(check_reduce(op, a));
  const char *name = sh_reduce_name(op);
  SH_TRY(check_extent(name, op == SH_OP_MAX || op == SH_OP_MIN, a, sh_tensor_numel(a)));
  SH_TRY(sh_tensor_empty(out, 0, NULL, sh_reduce_result_dtype(op, a->dtype), a->device));
  return finish(out, SH_KERNEL(name, a->device, reduce_all, *out, op, a));
}

int sh_argmax(sh_tensor **out, const sh_tensor *a, int dim, int keepdim) {
  *out = NULL;
  SH_TRY(sh_tensor_check(a, "argmax"));
  SH_TRY(sh_reduce_dim("argmax", a, &dim));
  SH_TRY(check_extent("argmax", 1, a, a->shape[dim]));
  int64_t shape[SH_MAX_DIMS];
  int n = sh_reduced_shape(a, dim, keepdim, shape);
  SH_TRY(sh_tensor_empty(out, n, shape, SH_I64, a->device));
  return finish(out, SH_KERNEL("argmax", a->device, argmax, *out, a, dim));
}

/* The dims of a that `shape` lacks or has as 1 are summed. Size-1 dims of a are dropped and
 * neighbours that are both summed or both kept merge into one run: size[r] is the run's
 * extent in a, kept[r] its extent in the result (1 when summed). Returns the number of
 * runs; *any says whether a run is summed. */
static int plan_runs(const sh_tensor *a, int ndim, const int64_t *shape, int64_t *size, int64_t *kept, int *any) {
  int lead = a->ndim - ndim, nruns = 0, prev = -1;
  *any = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->shape[d] == 1) continue;
    int s = d < lead || shape[d - lead] == 1;
    *any |= s;
    if (s == prev) size[nruns - 1] *= a->shape[d];
    else size[nruns++] = a->shape[d];
    kept[nruns - 1] = s ? 1 : size[nruns - 1];
    prev = s;
  }
  return nruns;
}

/* The kernel sees a and out as the runs: same dims, out 1 where summed. */
static int sum_runs(sh_tensor *out, const sh_tensor *a, int nruns, const int64_t *size, const int64_t *kept) {
  sh_tensor *av = NULL, *ov = NULL;
  int rc = sh_tensor_reshape(&av, a, nruns, size);
  if (!rc) rc = sh_view_reshape(&ov, out, nruns, kept);
  if (!rc) rc = SH_KERNEL("sum_to_shape", a->device, sum_to_shape, ov, av);
  sh_tensor_destroy(av);
  sh_tensor_destroy(ov);
  return rc;
}

int sh_sum_to_shape(sh_tensor **out, const sh_tensor *a, int ndim, const int64_t *shape) {
  *out = NULL;
  SH_TRY(sh_tensor_check(a, "sum_to_shape"));
  int lead = a->ndim - ndim, nb;
  int64_t bshape[SH_MAX_DIMS];
  char want[160];
  if (ndim < 0 || lead < 0 || sh_broadcast_shapes("sum_to_shape", a->ndim, a->shape, ndim, shape, &nb, bshape) ||
      memcmp(bshape, a->shape, sizeof(int64_t) * a->ndim) != 0)
    return sh_fail(SH_ERR_ARG, "sum_to_shape: %s does not broadcast from shape %s", sh_desc(a),
                   sh_shape_str(ndim < 0 ? 0 : ndim, shape, want, sizeof want));
  int64_t size[SH_MAX_DIMS], kept[SH_MAX_DIMS];
  int any, nruns = plan_runs(a, ndim, shape, size, kept, &any);
  SH_TRY(sh_tensor_empty(out, ndim, shape, a->dtype, a->device));
  if (any) return finish(out, sum_runs(*out, a, nruns, size, kept));
  /* nothing to sum: only size-1 dims differ */
  sh_tensor *v = NULL;
  int rc = sh_tensor_reshape(&v, a, ndim, shape);
  if (!rc) rc = sh_tensor_copy_(*out, v);
  sh_tensor_destroy(v);
  return finish(out, rc);
}

double sh_sumsq(const sh_tensor *a, int *status) {
  double res = NAN;
  int rc = sh_tensor_check(a, "sumsq");
  if (!rc) rc = SH_KERNEL("sumsq", a->device, sumsq, a, &res);
  if (status) *status = rc;
  return rc ? NAN : res;
}
