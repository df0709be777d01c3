/* tensor.h: strided tensors over refcounted storage.
 * A tensor is a view (dtype, shape, strides in elements, offset) of a storage; views share
 * the storage and keep it alive through its refcount. Each sh_tensor struct has exactly one
 * owner (the Lua object that wraps it, or the tensor it is the .grad of), which ends it with
 * sh_tensor_destroy. sh_tensor_release drops the storage at once (Lua's :free()); a later use
 * of that tensor fails with SH_ERR_FREED instead of touching freed memory. */
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef struct sh_storage {
  void *data;
  int64_t nbytes;
  int32_t refcount;
  int32_t device;       /* -1 cpu, N cuda:N */
  int32_t tag;          /* sh_mem_tag the bytes are counted under */
  int32_t external;     /* 1: data belongs to someone else (a mapped file); never freed here */
} sh_storage;

typedef struct sh_tensor {
  sh_storage *storage;  /* NULL once released */
  int64_t offset;       /* in elements */
  int64_t shape[8];
  int64_t stride[8];    /* in elements */
  int32_t ndim;
  int32_t dtype;        /* sh_dtype */
  int32_t device;       /* -1 cpu, N cuda:N */
  int32_t requires_grad;
  struct sh_tensor *grad; /* owned by this tensor; NULL when none */
  int64_t version;      /* bumped by in-place writes through the runtime */
} sh_tensor;

/* creation and lifetime */
int sh_tensor_empty(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
int sh_tensor_wrap_external(sh_tensor **out, void *data, int64_t nbytes, int ndim,
                            const int64_t *shape, int dtype);   /* CPU memory owned elsewhere */
int sh_tensor_alias(sh_tensor **out, const sh_tensor *t);      /* a new struct, same view */
/* A tensor with a shape and no storage yet (deferred init: FSDP fills only its shard). */
int sh_tensor_meta(sh_tensor **out, int ndim, const int64_t *shape, int dtype, int device);
void sh_tensor_release(sh_tensor *t);   /* drop the storage and the grad now */
void sh_tensor_destroy(sh_tensor *t);   /* release, then free the struct itself */
int sh_tensor_set_grad(sh_tensor *t, const sh_tensor *grad); /* grad may be NULL to clear */

/* queries */
int64_t sh_tensor_numel(const sh_tensor *t);
int sh_tensor_is_contiguous(const sh_tensor *t);
void *sh_tensor_data(const sh_tensor *t);      /* address of element 0 of the view */
int sh_tensor_describe(const sh_tensor *t, char *buf, int size); /* "f32[2,3] cpu" */
int sh_tensor_check(const sh_tensor *t, const char *op);          /* not NULL, not freed */

/* views */
int sh_view_narrow(sh_tensor **out, const sh_tensor *t, int dim, int64_t start, int64_t length);
int sh_view_select(sh_tensor **out, const sh_tensor *t, int dim, int64_t index);
int sh_view_reshape(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape); /* -1 infers one dim; no copy */
int sh_view_transpose(sh_tensor **out, const sh_tensor *t, int dim0, int dim1);
int sh_view_permute(sh_tensor **out, const sh_tensor *t, const int *perm);
int sh_view_expand(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape);
int sh_view_unsqueeze(sh_tensor **out, const sh_tensor *t, int dim);
int sh_view_squeeze(sh_tensor **out, const sh_tensor *t, int dim);
int sh_view_strided(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape,
                    const int64_t *stride, int64_t offset);  /* bounds-checked as_strided */

/* copies and conversions */
int sh_tensor_contiguous(sh_tensor **out, const sh_tensor *t);  /* alias when already contiguous */
int sh_tensor_reshape(sh_tensor **out, const sh_tensor *t, int ndim, const int64_t *shape); /* copies if needed */
int sh_tensor_to(sh_tensor **out, const sh_tensor *t, int dtype, int device); /* always a new storage */
int sh_tensor_copy_(sh_tensor *dst, const sh_tensor *src); /* src broadcast to dst, any dtypes */
int sh_tensor_fill_(sh_tensor *t, double value);
int sh_tensor_item(const sh_tensor *t, double *out);       /* one-element tensors */
int sh_tensor_get(const sh_tensor *t, const int64_t *index, double *out);
int sh_tensor_set(sh_tensor *t, const int64_t *index, double value);
int sh_tensor_read_f64(const sh_tensor *t, double *out);   /* every element in row-major order */
int sh_tensor_write_f64(sh_tensor *t, const double *in);   /* the reverse */
