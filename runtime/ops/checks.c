/* checks.c: the argument checks the fronts share (ops/ops_internal.h): a float tensor, a shape,
 * two equal shapes, each failing with op, argument and what was given. */
#include "ops_internal.h"
#include <stdio.h>

int sh_nn_check_shape(const sh_tensor *t, const char *op, const char *name, int ndim, const int64_t *shape) {
  int ok = t->ndim == ndim;
  for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || t->shape[d] == shape[d];
  if (ok) return SH_OK;
  char want[200];
  int n = snprintf(want, sizeof want, "[");
  for (int d = 0; d < ndim && n < (int)sizeof want; d++)
    n += shape[d] < 0 ? snprintf(want + n, sizeof want - n, "%s*", d ? "," : "")
                      : snprintf(want + n, sizeof want - n, "%s%lld", d ? "," : "", (long long)shape[d]);
  if (n < (int)sizeof want) snprintf(want + n, sizeof want - n, "]");
  return sh_fail(SH_ERR_ARG, "%s: %s must have shape %s, got %s", op, name, want, sh_desc(t));
}

int sh_nn_check_same_shape(const sh_tensor *a, const sh_tensor *b, const char *op, const char *an, const char *bn) {
  int ok = a->ndim == b->ndim;
  for (int d = 0; ok && d < a->ndim; d++) ok = a->shape[d] == b->shape[d];
  if (ok) return SH_OK;
  return sh_fail(SH_ERR_ARG, "%s: %s and %s must have the same shape, got %s and %s", op, an, bn, sh_desc(a), sh_desc(b));
}
