/* tensor_internal.h: element access, shape helpers and N-d iteration shared by the CPU ops
 * (not in the FFI). */
#pragma once
#include "tensor.h"
#include "dtype.h"
#include "status_internal.h"
#include "meta.h"

enum { SH_MAX_DIMS = 8 };

double sh_load(const void *base, int dtype, int64_t i);
void sh_store(void *base, int dtype, int64_t i, double v);

/* "cpu", "cuda:N" or "meta" into buf; returns buf. */
const char *sh_device_str(int device, char *buf, int size);
/* "[2,3,4]" into buf; returns buf. */
const char *sh_shape_str(int ndim, const int64_t *shape, char *buf, int size);
/* The English ordinal suffix of n ("st" for 1, "nd" for 2, "th" for 11): messages name a
 * dim the caller did not pass as "the 1st dim", which reads the same to a 0-based C caller
 * and a 1-based Lua one. */
const char *sh_ord(int n);
/* Describes a tensor into a per-thread rotating buffer, for error messages. */
const char *sh_desc(const sh_tensor *t);

/* Broadcasts two shapes (numpy rules); fails naming op and both shapes. */
int sh_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                        int *nout, int64_t *out);

/* Allocates a fresh contiguous tensor tagged with the current tag. */
int sh_new_like_shape(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device);

/* Walks an N-d index space in row-major order, tracking one element offset per operand. */
typedef struct sh_nditer {
  int ndim, nops;
  int64_t shape[8], idx[8];
  int64_t strides[4][8];
  int64_t off[4];
} sh_nditer;
void sh_nditer_init(sh_nditer *it, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *strides, const int64_t *offsets);
void sh_nditer_next(sh_nditer *it);

/* Fails unless t is a live tensor of a float dtype; `name` says which argument. */
int sh_nn_check_float(const sh_tensor *t, const char *op, const char *name);
/* Fails unless t is a live tensor on `device` (-1 cpu), naming op, argument and devices:
 * every front checks its tensors against the device of its first input. */
int sh_check_on(const sh_tensor *t, int device, const char *op, const char *name);
/* Both operands on the same device, else an error naming op and devices. */
int sh_check_same_device(const char *op, const sh_tensor *a, const sh_tensor *b);

/* Destroys t[0..n) (NULL entries are fine) and clears them. */
static inline void sh_tensors_destroy(sh_tensor **t, int n) {
  for (int i = 0; i < n; i++) { sh_tensor_destroy(t[i]); t[i] = NULL; }
}

/* Number of rows of t seen as [rows, last dim]. */
static inline int64_t sh_tensor_rows(const sh_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d + 1 < t->ndim; d++) n *= t->shape[d];
  return n;
}
