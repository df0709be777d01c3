/* cuda.h: CUDA devices, streams, events and pinned host memory, seen from C and Lua.
 * Each device gets three streams owned by the runtime: compute (every op launches on the
 * calling thread's current stream, the compute stream unless set otherwise), all-gather
 * and reduce-scatter (collectives); and a fourth, made when first asked for: the snapshot
 * stream, for shard.snapshot's device-to-host copies of the training state beside compute. Work on different streams is ordered only by events,
 * never by device-wide synchronisation, so FSDP overlaps communication with compute.
 * Memory freed while the current stream is S is reused on another stream only after that
 * stream waits for events recorded at the free on S and on every stream that
 * sh_cuda_record_stream named for it: reuse is safe and deterministic.
 * Nothing that may run in a finalizer (frees, event destroy, pinned free) synchronises.
 * With no GPU, sh_cuda_device_count() is 0 and the rest fail with SH_ERR_DEVICE. A build
 * without nvcc has none of these symbols (Lua asks shard.ffi.cuda_device_count(), which
 * says 0 then); its ops have no CUDA table (backend_internal.h). */
#pragma once
#include <stdint.h>
#include <stddef.h>

typedef struct sh_cuda_stream sh_cuda_stream;   /* opaque; owned by the runtime */
typedef struct sh_cuda_event sh_cuda_event;     /* opaque; created and destroyed by the caller */
typedef struct sh_cuda_graph sh_cuda_graph;     /* opaque; made by sh_cuda_graph_end */

typedef enum sh_stream_kind {
  SH_STREAM_COMPUTE = 0, SH_STREAM_ALL_GATHER = 1, SH_STREAM_REDUCE_SCATTER = 2, SH_STREAM_SNAPSHOT = 3
} sh_stream_kind;

typedef struct sh_cuda_device_info {
  char name[256];
  int32_t major, minor;          /* compute capability */
  int32_t sm_count;
  int64_t total_memory;          /* bytes */
  int64_t l2_bytes;
  int64_t smem_per_block_optin;  /* the most shared memory one block may ask for */
} sh_cuda_device_info;

int sh_cuda_device_count(void);             /* 0 when built without CUDA or no GPU is present */
/* Makes device the calling thread's device, creates its streams and registers the CUDA
 * memory backend (idempotent). Every cuda:N tensor needs sh_cuda_init(N) first. */
int sh_cuda_init(int device);
int sh_cuda_device_info_get(int device, sh_cuda_device_info *out);
int sh_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes);
int sh_cuda_synchronize(int device);        /* waits for all work on the device */

/* streams */
int sh_cuda_stream_get(sh_cuda_stream **out, int device, int kind);
int sh_cuda_set_stream(sh_cuda_stream *s);  /* this thread's current stream on s's device */
int sh_cuda_current_stream(sh_cuda_stream **out, int device);
int sh_cuda_stream_synchronize(sh_cuda_stream *s);
int sh_cuda_stream_wait_event(sh_cuda_stream *s, sh_cuda_event *e);
/* t's memory (a cached device block or a pinned buffer) is used by work queued on s: when it
 * is freed (on whatever stream), its reuse waits for the work s has queued by then too
 * (PyTorch's record_stream). Needed when s's use is not ordered before the freeing stream's
 * work by an event. */
int sh_cuda_record_stream(const sh_tensor *t, sh_cuda_stream *s);

/* events; timing = 1 makes one usable with sh_cuda_event_elapsed */
int sh_cuda_event_create(sh_cuda_event **out, int device, int timing);
void sh_cuda_event_destroy(sh_cuda_event *e);
int sh_cuda_event_record(sh_cuda_event *e, sh_cuda_stream *s);
int sh_cuda_event_query(sh_cuda_event *e, int *done);   /* done = 1 once its work finished */
int sh_cuda_event_synchronize(sh_cuda_event *e);
int sh_cuda_event_elapsed(sh_cuda_event *start, sh_cuda_event *end, double *ms);

/* Pinned (page-locked) host buffers for asynchronous copies. Freed buffers go back to a
 * cache, since cudaFreeHost synchronises; sh_cuda_host_empty_cache returns them. A freed
 * buffer is handed out again only once the work queued at the free on the freeing thread's
 * current stream (and on the streams sh_cuda_record_stream named) has run, so free a buffer
 * with the stream of its copies current, or name that stream. */
int sh_cuda_host_alloc(void **out, size_t nbytes);
void sh_cuda_host_free(void *ptr);
int sh_cuda_host_empty_cache(void);
/* Copies src into dst (same dtype and numel, both contiguous, at least one on CUDA) on the
 * current stream of the CUDA side without waiting; the host side should be pinned. */
int sh_cuda_copy_async(sh_tensor *dst, const sh_tensor *src);

/* CUDA graphs of a device's compute stream (a training step captured once, replayed each
 * step: shard.cuda_graph). sh_cuda_graph_begin synchronises the device, then captures what is
 * queued on its compute stream (which must be current) and on the streams that join it
 * through events (FSDP's collectives); until sh_cuda_graph_end, memory the caching allocator
 * hands out or takes back on the device is the graph's (alloc_internal.h's graph pool: no work
 * outside a graph gets it while a graph of the device lives), a copy between host and device
 * fails naming the capture, and work that CUDA forbids in a capture (a synchronisation, a
 * wait on work outside it) makes sh_cuda_graph_end fail. sh_cuda_graph_launch replays it on
 * the compute stream: one call from the host. sh_cuda_graph_destroy never synchronises. */
int sh_cuda_graph_begin(int device);
int sh_cuda_graph_end(int device, sh_cuda_graph **out);
int sh_cuda_graph_launch(sh_cuda_graph *g);
/* The learning rate of the step g's next launches run (an lr schedule's: shard.cuda_graph sets
 * it before each launch): the optimizer steps captured in g (AdamW, SGD) read it, and what
 * follows from it, from a buffer the host fills before each launch. Until set, each step
 * keeps the lr it was captured with. Fails when those steps were captured with different
 * learning rates (one lr cannot stand for them all) or lr is negative or NaN. */
int sh_cuda_graph_set_lr(sh_cuda_graph *g, double lr);
int64_t sh_cuda_graph_launches(const sh_cuda_graph *g);   /* launches so far */
void sh_cuda_graph_destroy(sh_cuda_graph *g);
