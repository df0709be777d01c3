/* alloc_internal.h: raw block allocation for storages and backends (not in the FFI). */
#pragma once
#include "alloc.h"

/* Allocates nbytes (>0) on device with the given tag; on failure sets the error and
 * returns NULL. Zero bytes gives a valid minimal block. */
void *sh_mem_alloc(int device, size_t nbytes, int tag);
void sh_mem_free(int device, void *ptr, size_t nbytes, int tag);
int sh_mem_current_tag(void);

/* A backend that owns raw device memory (CUDA) registers it here; the cache, the size
 * classes and the stats are shared with the CPU. */
typedef struct sh_mem_backend {
  void *(*raw_alloc)(int device, size_t nbytes);
  void (*raw_free)(int device, void *ptr);
  /* Copies nbytes between any two devices (-1 = host); returns a status. */
  int (*copy)(int dst_device, void *dst, int src_device, const void *src, size_t nbytes);
  /* Stream-aware reuse (optional): on_free runs when a block enters the cache, on_reuse
   * when the cache hands it out again, both under the allocator's lock. They must never
   * synchronise: frees happen in finalizers. */
  void (*on_free)(int device, void *ptr);
  void (*on_reuse)(int device, void *ptr);
} sh_mem_backend;
/* The CUDA backend, when one is registered; NULL otherwise. */
const sh_mem_backend *sh_mem_cuda(void);
void sh_mem_register_cuda(const sh_mem_backend *backend);
