/* ops_internal.h: what the fronts share beyond core/rules_internal.h (not in the FFI). */
#pragma once
#include "core/tensor_internal.h"
#include "core/rules_internal.h"

/* Copies t into a new contiguous tensor of dtype unless it already is one (then an alias),
 * so kernels can assume a dense row-major array of a known type. */
int sh_contiguous_as(sh_tensor **out, const sh_tensor *t, int dtype);

/* A reduction's dim (negative from the end; out of range fails naming op and tensor) and its
 * output shape (the dim kept as 1 or dropped; returns the number of dims). */
int sh_reduce_dim(const char *op, const sh_tensor *a, int *dim);
int sh_reduced_shape(const sh_tensor *a, int dim, int keepdim, int64_t *shape);

/* Fails unless t has exactly `ndim` dims with these sizes (-1 = any size). */
int sh_nn_check_shape(const sh_tensor *t, const char *op, const char *name, int ndim, const int64_t *shape);
/* Fails unless a and b have the same shape. */
int sh_nn_check_same_shape(const sh_tensor *a, const sh_tensor *b, const char *op, const char *an, const char *bn);

/* A live float tensor on `device`: sh_nn_check_float, then sh_check_on. */
static inline int sh_nn_check_float_on(const sh_tensor *t, int device, const char *op, const char *name) {
  int rc = sh_nn_check_float(t, op, name);
  return rc ? rc : sh_check_on(t, device, op, name);
}

/* Hands the front-allocated output t to the caller's *out when rc is SH_OK and out is
 * given, else frees it; returns rc. */
static inline int sh_nn_give(int rc, sh_tensor *t, sh_tensor **out) {
  if (rc || !out) sh_tensor_destroy(t);
  else *out = t;
  return rc;
}
