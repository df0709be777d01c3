/* safetensors.h: a reader that validates the whole header before a byte of data is used, and
 * an atomic writer.
 * File layout: an 8-byte little-endian header length N, N bytes of JSON (an object of
 * name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
 * object of string -> string), then the data section. sh_st_open refuses, as the reference
 * implementation does: N above 100 MB or past the end of the file; anything but one JSON
 * object (strict JSON, UTF-8, trailing spaces allowed); duplicate keys; fields other than
 * those three; dtypes outside F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL; shape dims that are
 * not non-negative integers; a byte size (product of dims * element size, overflow-checked)
 * different from end - begin; tensors that, sorted by offset, do not tile the data section
 * exactly from 0 to its last byte (a gap, an overlap, or trailing bytes are all refused).
 * Errors read "safetensors: FILE: tensor 'NAME': why" (SH_ERR_ARG for a malformed file,
 * SH_ERR_IO when the file cannot be read). Data is read with pread, just the range asked. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include "core/tensor.h"

typedef struct sh_st_file sh_st_file;   /* opaque; one open file descriptor */

typedef struct sh_st_tensor {
  const char *name;        /* NUL-terminated (names holding a NUL are refused) */
  const char *dtype_name;  /* "F32", ... as in the file */
  int32_t dtype;           /* sh_dtype, or -1 for I16 / I8 (valid here, not readable by shard) */
  int32_t elem_size;       /* bytes per element */
  int32_t ndim;
  const int64_t *shape;    /* ndim dims */
  int64_t numel;
  int64_t begin, end;      /* byte range within the data section */
} sh_st_tensor;

int sh_st_open(sh_st_file **out, const char *path);
void sh_st_close(sh_st_file *f);                      /* NULL is fine */
int sh_st_count(const sh_st_file *f);                 /* number of tensors */
const sh_st_tensor *sh_st_at(const sh_st_file *f, int i);   /* i-th by name, 0-based */
int sh_st_find(const sh_st_file *f, const char *name);      /* index by name, -1 if absent */
int sh_st_metadata_count(const sh_st_file *f);
/* i-th __metadata__ entry, sorted by key; lengths because JSON strings may hold NUL */
void sh_st_metadata_at(const sh_st_file *f, int i, const char **key, size_t *key_len,
                       const char **value, size_t *value_len);
int64_t sh_st_data_offset(const sh_st_file *f);       /* 8 + N: where the data section starts */

/* Copies elements [first, first + count) (row-major) of tensor i into dst (count *
 * elem_size bytes) with pread. */
int sh_st_read_bytes(const sh_st_file *f, int i, int64_t first, int64_t count, void *dst);
/* The same into a CPU tensor, contiguous, of the tensor's dtype, with numel == count. */
int sh_st_read(const sh_st_file *f, int i, int64_t first, int64_t count, sh_tensor *dst);

/* Writes n tensors (CPU, contiguous; names unique) and nmeta metadata pairs (NULL keys when
 * none): header keys sorted, padded with spaces to a multiple of 8 bytes, written to a
 * temporary file beside path (PATH.tmp.PID.N), fsynced, renamed over path, the directory
 * fsynced. On failure path is untouched and no temporary is left; temporaries of earlier
 * saves whose process is gone (killed mid-save) are removed. */
int sh_st_save(const char *path, int n, const char *const *names, sh_tensor *const *tensors,
               int nmeta, const char *const *keys, const char *const *values);
/* The first bytes of the file sh_st_save would write (the 8-byte length and the padded
 * header), for a writer that streams the data itself (shard.checkpoint's background writer):
 * the tensors' data must follow in the order data_order gives (n indices into names and
 * tensors: sorted by name). *out is freed with sh_st_free. what names the file in messages. */
int sh_st_header(const char *what, int n, const char *const *names, sh_tensor *const *tensors, int nmeta,
                 const char *const *keys, const char *const *values, char **out, int64_t *len, int32_t *data_order);
void sh_st_free(void *p);
