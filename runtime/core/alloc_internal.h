/* alloc_internal.h: raw block allocation for storages and backends (not in the FFI). */
#pragma once
#include "alloc.h"
#include "tensor.h"

/* Allocates nbytes (>0) on device with the given tag; on failure sets the error and
 * returns NULL. Zero bytes gives a valid minimal block. */
void *sh_mem_alloc(int device, size_t nbytes, int tag);
void sh_mem_free(int device, void *ptr, size_t nbytes, int tag);
int sh_mem_current_tag(void);
/* On (1), CPU storages this thread allocates come from pinned (page-locked) host memory when
 * a CUDA backend is registered (else plain host memory), counted in the CPU's stats like any
 * host block; returns the old setting. Pinned blocks bypass the size-class cache: the CUDA
 * backend keeps its own, which hands a buffer out again only once its copies have run. */
int sh_mem_set_pinned(int on);

/* The graph pool of a device (CUDA graphs: kernels/device.cu): while on, every block handed
 * out or freed on the device joins it (a captured graph may use it); a member, freed, goes to
 * the pool's own free lists, which only allocations made while the pool is on draw from (first,
 * before the cache), so work outside the graph never gets memory a replay writes.
 * sh_mem_graph_pool_release (the graph is gone) returns the pool's free blocks to the cache
 * and forgets its members. sh_mem_empty_cache leaves the pool's blocks alone. */
int sh_mem_graph_pool(int device, int on);
int sh_mem_graph_pool_release(int device);

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
  /* CPU offload (flatparam.c). Pinned host memory for CPU storages made under
   * sh_mem_set_pinned(1): host_free must not synchronise (finalizers free). */
  int (*host_alloc)(void **out, size_t nbytes);
  void (*host_free)(void *ptr);
  /* Makes the device's host-copy stream the calling thread's current stream (*saved: the
   * one it replaces) and back: what is queued in between runs on that stream. */
  int (*copy_stream_enter)(int device, void **saved);
  int (*copy_stream_leave)(int device, void *saved);
  /* An asynchronous copy between pinned host memory and the device on the current stream
   * (same dtype and numel, contiguous). */
  int (*copy_async)(sh_tensor *dst, const sh_tensor *src);
  /* Marks (events): *mark is made on first use and recorded on the current stream; order
   * makes the current stream wait for it on the device; wait makes the host wait for it. */
  int (*mark_record)(int device, void **mark);
  int (*mark_order)(int device, void *mark);
  int (*mark_wait)(void *mark);
  void (*mark_free)(void *mark);
} sh_mem_backend;
/* The CUDA backend, when one is registered; NULL otherwise. */
const sh_mem_backend *sh_mem_cuda(void);
void sh_mem_register_cuda(const sh_mem_backend *backend);
