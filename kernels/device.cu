/* device.cu: devices, streams, events, pinned host memory and the CUDA memory backend.
 *
 * The caching allocator itself (size classes, free lists, stats, tags, the OOM report) is
 * runtime/core/alloc.c, shared with the CPU; this file gives it raw device memory (cudaMalloc,
 * called only on a cache miss, so a steady-state step never allocates or frees) and makes
 * reuse stream-aware: the free records an event on the stream current for the freeing thread
 * and on every stream sh_cuda_record_stream named since the block was handed out (work there
 * may still read or write it), and when the cache hands the block out to a thread whose
 * current stream is another one, that stream first waits for those events. The wait is
 * queued on the device, so the host never blocks, and the order is fixed by the program, not
 * by timing. The stream current when the block was handed out is not recorded: the program
 * ordered its writes before the other streams' uses, and an event there at the free would
 * also wait for its later, unrelated work (CPU offload's prefetches). Nothing reachable from a
 * free or a finalizer synchronises.
 * SHARD_CUDA_POISON=1 (a debug option) fills every block the cache hands out, new or reused,
 * with 0xFF bytes (NaN in every float dtype) on the stream that gets it, so an output a kernel
 * leaves partly unwritten shows even in reused memory.
 *
 * CUDA graphs (cuda.h's sh_cuda_graph_*): capture on the compute stream, the allocator's
 * graph pool meanwhile (a cache miss calls cudaMalloc in relaxed capture mode), a host copy
 * refused by name, callbacks that fill a graph's buffers before each launch (common.cuh).
 *
 * Each device has three streams created non-blocking (no implicit sync with the legacy
 * default stream): compute, all-gather and reduce-scatter; and a fourth, made after them,
 * for CPU offload's copies between pinned host memory and the device (the allocator's
 * offload hooks below, used by runtime/dist/flatparam.c). */
#include "common.cuh"
#include "core/backend_internal.h"
#include <map>
#include <mutex>
#include <unordered_map>
#include <functional>
#include <vector>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sh_cuda_stream { cudaStream_t s; int device; int kind; };
struct sh_cuda_event { cudaEvent_t e; int device; };

enum { MAX_DEVICES = 16, N_STREAMS = 3 };   /* made with the device: compute, all-gather, reduce-scatter */

struct device_state {
  bool ready;
  cudaDeviceProp props;
  sh_cuda_stream streams[N_STREAMS + 1];   /* the snapshot stream last, made when first asked for */
  sh_cuda_stream host_copy;   /* CPU offload's copies (alloc_internal.h); not a public kind */
};

static device_state devices[MAX_DEVICES];
static std::mutex init_lock;
static thread_local sh_cuda_stream *current[MAX_DEVICES];

int sh_cuda_fail(const char *op, cudaError_t err, const char *file, int line) {
  return sh_fail(SH_ERR_DEVICE, "%s: cuda error %s (%s) at %s:%d", op, cudaGetErrorName(err),
                 cudaGetErrorString(err), file, line);
}

extern "C" int sh_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();   /* no driver or no GPU: clear the sticky error, report none */
    return 0;
  }
  return n;
}

/* ---- the memory backend ------------------------------------------------------------ */

static std::mutex blocks_lock;

/* Runs with `device` current, then restores the thread's previous device. */
struct device_scope {
  int prev = -1;
  explicit device_scope(int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device) cudaSetDevice(device);
  }
  ~device_scope() { int now; if (prev >= 0 && cudaGetDevice(&now) == cudaSuccess && now != prev) cudaSetDevice(prev); }
};

/* The streams that used a block since it was last handed out, each with the event its free
 * records there. Reuse waits for all of them, not only for the stream current at the free: a
 * block freed on compute after the all-gather stream read it must wait for that read too. */
struct stream_uses {
  struct use { sh_cuda_stream *s; cudaEvent_t freed; bool used, armed; };
  std::vector<use> v;

  /* False when no event could be made for a new stream. */
  bool add(sh_cuda_stream *s) {
    for (use &u : v)
      if (u.s == s) { u.used = true; return true; }
    device_scope scope(s->device);
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) { cudaGetLastError(); return false; }
    v.push_back({s, e, true, false});
    return true;
  }
  /* At the free: an event on every stream that used it. */
  void record() {
    for (use &u : v) {
      if (!u.used) continue;
      u.used = false;
      u.armed = cudaEventRecord(u.freed, u.s->s) == cudaSuccess;
      if (!u.armed) cudaGetLastError();   /* the context is being torn down */
    }
  }
  /* At the reuse on s: s waits on the device for every other stream's use. */
  void wait_on(sh_cuda_stream *s) {
    for (use &u : v) {
      if (u.armed && u.s != s && cudaStreamWaitEvent(s->s, u.freed, 0) != cudaSuccess) cudaGetLastError();
      u.armed = false;
    }
  }
  /* The device was synchronised: every use has finished, nothing to wait for. */
  void settle() {
    for (use &u : v) u.armed = false;
  }
  /* After a capture: an event recorded in it stands for the graph, not for work queued on
   * the stream, so it cannot be waited on outside; the next free records it again. */
  void uncapture() {
    for (use &u : v)
      if (u.armed) { u.armed = false; u.used = true; }
  }
  /* True when every use has finished (a host query, never a wait). */
  bool done() {
    for (use &u : v) {
      if (u.armed && cudaEventQuery(u.freed) != cudaSuccess) { cudaGetLastError(); return false; }
      u.armed = false;
    }
    return true;
  }
  void destroy() {
    for (use &u : v)
      if (u.freed) cudaEventDestroy(u.freed);
    v.clear();
  }
};

/* Each cached block (keyed by its start, ordered to find the block holding a pointer). */
struct block_rec { size_t bytes; stream_uses uses; };
static std::map<void *, block_rec> blocks;

/* The CUDA kernel table, made from SH_KERNELS (core/backend_internal.h): slot X holds
 * sh_kcuda_X (common.cuh declares them all). A slot CUDA lacks is `#define sh_kcuda_X NULL`
 * here, with a comment saying why, and named in .absent (the op-table tests check both). */
#define SH_KERNEL_OF(slot) sh_kcuda_##slot
SH_KERNEL_TABLE(cuda_table, "cuda", NULL);
#undef SH_KERNEL_OF

static void register_kernels(void) { sh_backend_register(SH_BACKEND_CUDA, &cuda_table); }

static int ensure_device(int device);

static sh_cuda_stream *current_stream(int device) {
  sh_cuda_stream *s = current[device];
  return s ? s : &devices[device].streams[SH_STREAM_COMPUTE];
}

static bool poison_on(void) {
  static const bool on = [] { const char *v = getenv("SHARD_CUDA_POISON"); return v && atoi(v) != 0; }();
  return on;
}

/* A graph's own buffer (sh_cuda_graph_buffer) is handed out while capturing: a poison there
 * would be captured and replayed after the host filled it for the launch. */
static thread_local bool poison_skip;

/* Under SHARD_CUDA_POISON=1: the block's bytes become 0xFF, in the order of the stream `s`. */
static void poison(int device, void *ptr, size_t bytes, const sh_cuda_stream *s) {
  if (!poison_on() || poison_skip) return;
  device_scope scope(device);
  if (cudaMemsetAsync(ptr, 0xFF, bytes, s->s) != cudaSuccess) cudaGetLastError();
}

static void *raw_alloc(int device, size_t nbytes) {
  if (ensure_device(device)) return NULL;
  device_scope scope(device);
  void *p = NULL;
  /* A cache miss while a graph is captured (sh_cuda_graph_begin): cudaMalloc is not captured
   * and the block stays the graph's (sh_mem_graph_pool), so this thread may make the call
   * that the capture's global mode forbids (PyTorch's allocator does the same). */
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t err = cudaMalloc(&p, nbytes);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) { cudaGetLastError(); return NULL; }
  poison(device, p, nbytes, current_stream(device));
  block_rec rec;
  rec.bytes = nbytes;
  std::lock_guard<std::mutex> g(blocks_lock);
  blocks[p] = rec;
  return p;
}

/* Only reached from sh_mem_empty_cache and the allocator's retry after a failed cudaMalloc,
 * never from a finalizer: cudaFree synchronises the device. */
static void raw_free(int device, void *ptr) {
  device_scope scope(device);
  {
    std::lock_guard<std::mutex> g(blocks_lock);
    auto it = blocks.find(ptr);
    if (it != blocks.end()) { it->second.uses.destroy(); blocks.erase(it); }
  }
  cudaFree(ptr);
}

/* A stream that cannot get an event (the context is being torn down) goes unrecorded. */
static void on_free(int device, void *ptr) {
  std::lock_guard<std::mutex> g(blocks_lock);
  auto it = blocks.find(ptr);
  if (it == blocks.end()) return;
  it->second.uses.add(current_stream(device));
  it->second.uses.record();
}

static void on_reuse(int device, void *ptr) {
  std::lock_guard<std::mutex> g(blocks_lock);
  auto it = blocks.find(ptr);
  if (it == blocks.end()) return;
  block_rec &r = it->second;
  sh_cuda_stream *s = current_stream(device);
  r.uses.wait_on(s);
  poison(device, ptr, r.bytes, s);
}

/* The cached device block holding ptr, or NULL (blocks_lock held). */
static block_rec *block_of(const void *ptr) {
  auto it = blocks.upper_bound((void *)ptr);
  if (it == blocks.begin()) return NULL;
  --it;
  return (const char *)ptr < (const char *)it->first + it->second.bytes ? &it->second : NULL;
}

static bool is_pinned(const void *p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) { cudaGetLastError(); return false; }
  return a.type == cudaMemoryTypeHost;
}

/* The allocator's synchronous copy (tensor_copy.c): when it returns, the host side may be
 * read or reused. Device-side work stays in stream order. */
static bool graph_capturing(int device);

static int copy(int dst_device, void *dst, int src_device, const void *src, size_t nbytes) {
  const char *op = "copy";
  if (nbytes == 0) return SH_OK;
  if ((dst_device < 0 || src_device < 0) && graph_capturing(dst_device < 0 ? src_device : dst_device))
    return sh_fail(SH_ERR_DEVICE, "%s: %zu bytes %s the host while a CUDA graph is captured on cuda:%d: a captured step "
                   "cannot read to the host (loss:item(), a printed tensor) or take host data (a batch moved inside the "
                   "step); copy the batch into the graph's inputs before the step and read the loss after it", op, nbytes,
                   dst_device < 0 ? "to" : "from", dst_device < 0 ? src_device : dst_device);
  if (dst_device >= 0 && src_device < 0) {
    cudaStream_t st;
    SH_TRY(sh_cuda_enter(op, dst_device, &st));
    CU_TRY(op, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, st));
    /* From pageable memory the driver has staged the bytes before returning; from pinned
     * memory the copy is still in flight, so wait before the caller may reuse it. */
    if (is_pinned(src)) CU_TRY(op, cudaStreamSynchronize(st));
    return SH_OK;
  }
  if (dst_device < 0 && src_device >= 0) {
    cudaStream_t st;
    SH_TRY(sh_cuda_enter(op, src_device, &st));
    CU_TRY(op, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, st));
    /* Into pageable memory the call returns once the copy is done (the Runtime API's
     * synchronization rules), so a read is one wait; into pinned memory it is still in flight. */
    if (is_pinned(dst)) CU_TRY(op, cudaStreamSynchronize(st));
    return SH_OK;
  }
  if (dst_device == src_device) {
    cudaStream_t st;
    SH_TRY(sh_cuda_enter(op, dst_device, &st));
    CU_TRY(op, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, st));
    return SH_OK;
  }
  /* Between two GPUs: both sides' streams must be drained, so this one synchronises. */
  cudaStream_t ss, ds;
  SH_TRY(sh_cuda_enter(op, dst_device, &ds));
  CU_TRY(op, cudaStreamSynchronize(ds));
  SH_TRY(sh_cuda_enter(op, src_device, &ss));
  CU_TRY(op, cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, ss));
  CU_TRY(op, cudaStreamSynchronize(ss));
  return SH_OK;
}

/* ---- CPU offload's hooks (alloc_internal.h) ------------------------------------------ */

static int copy_stream_enter(int device, void **saved) {
  SH_TRY(ensure_device(device));
  *saved = current[device];
  current[device] = &devices[device].host_copy;
  return SH_OK;
}

static int copy_stream_leave(int device, void *saved) {
  if (device < 0 || device >= MAX_DEVICES) return sh_fail(SH_ERR_DEVICE, "offload: no device cuda:%d", device);
  current[device] = (sh_cuda_stream *)saved;
  return SH_OK;
}

static int mark_record(int device, void **mark) {
  const char *op = "offload mark";
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  if (!*mark) {
    cudaEvent_t e;
    CU_TRY(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *mark = e;
  }
  CU_TRY(op, cudaEventRecord((cudaEvent_t)*mark, st));
  return SH_OK;
}

static int mark_order(int device, void *mark) {
  const char *op = "offload order";
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  if (mark) CU_TRY(op, cudaStreamWaitEvent(st, (cudaEvent_t)mark, 0));
  return SH_OK;
}

static int mark_wait(void *mark) {
  if (mark) CU_TRY("offload wait", cudaEventSynchronize((cudaEvent_t)mark));
  return SH_OK;
}

static void mark_free(void *mark) { if (mark) cudaEventDestroy((cudaEvent_t)mark); }

static const sh_mem_backend backend = {
  .raw_alloc = raw_alloc, .raw_free = raw_free, .copy = copy, .on_free = on_free, .on_reuse = on_reuse,
  .host_alloc = sh_cuda_host_alloc, .host_free = sh_cuda_host_free,
  .copy_stream_enter = copy_stream_enter, .copy_stream_leave = copy_stream_leave,
  .copy_async = sh_cuda_copy_async,
  .mark_record = mark_record, .mark_order = mark_order, .mark_wait = mark_wait, .mark_free = mark_free,
};

/* ---- devices ----------------------------------------------------------------------- */

static int ensure_device(int device) {
  const char *op = "cuda_init";
  if (device < 0 || device >= MAX_DEVICES)
    return sh_fail(SH_ERR_DEVICE, "%s: no device cuda:%d", op, device);
  if (devices[device].ready) return SH_OK;
  std::lock_guard<std::mutex> g(init_lock);
  if (devices[device].ready) return SH_OK;
  int n = sh_cuda_device_count();
  if (device >= n)
    return sh_fail(SH_ERR_DEVICE, "%s: cuda:%d requested but %d CUDA device(s) are visible", op, device, n);
  device_scope scope(device);
  device_state *d = &devices[device];
  CU_TRY(op, cudaGetDeviceProperties(&d->props, device));
  for (int k = 0; k < N_STREAMS; k++) {
    d->streams[k].device = device;
    d->streams[k].kind = k;
    CU_TRY(op, cudaStreamCreateWithFlags(&d->streams[k].s, cudaStreamNonBlocking));
  }
  d->host_copy.device = device;
  d->host_copy.kind = SH_STREAM_SNAPSHOT + 1;
  CU_TRY(op, cudaStreamCreateWithFlags(&d->host_copy.s, cudaStreamNonBlocking));
  d->ready = true;
  if (!sh_mem_cuda()) sh_mem_register_cuda(&backend);
  register_kernels();
  return SH_OK;
}

extern "C" int sh_cuda_init(int device) {
  SH_TRY(ensure_device(device));
  CU_TRY("cuda_init", cudaSetDevice(device));
  return SH_OK;
}

int sh_cuda_enter(const char *op, int device, cudaStream_t *stream) {
  if (device < 0 || device >= MAX_DEVICES || !devices[device].ready) {
    int rc = ensure_device(device);
    if (rc) return sh_fail_context("%s: ", op);
  }
  int now = -1;
  CU_TRY(op, cudaGetDevice(&now));
  if (now != device) CU_TRY(op, cudaSetDevice(device));
  *stream = current_stream(device)->s;
  return SH_OK;
}

const cudaDeviceProp *sh_cuda_props(int device) { return &devices[device].props; }

extern "C" int sh_cuda_device_info_get(int device, sh_cuda_device_info *out) {
  SH_TRY(ensure_device(device));
  const cudaDeviceProp *p = &devices[device].props;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", p->name);
  out->major = p->major;
  out->minor = p->minor;
  out->sm_count = p->multiProcessorCount;
  out->total_memory = (int64_t)p->totalGlobalMem;
  out->l2_bytes = p->l2CacheSize;
  out->smem_per_block_optin = (int64_t)p->sharedMemPerBlockOptin;
  return SH_OK;
}

extern "C" int sh_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter("mem_info", device, &st));
  size_t f = 0, t = 0;
  CU_TRY("mem_info", cudaMemGetInfo(&f, &t));
  *free_bytes = (int64_t)f;
  *total_bytes = (int64_t)t;
  return SH_OK;
}

extern "C" int sh_cuda_synchronize(int device) {
  cudaStream_t st;
  SH_TRY(sh_cuda_enter("synchronize", device, &st));
  CU_TRY("synchronize", cudaDeviceSynchronize());
  return SH_OK;
}

/* ---- streams and events -------------------------------------------------------------- */

static int check_stream(const sh_cuda_stream *s, const char *op) {
  if (!s) return sh_fail(SH_ERR_ARG, "%s: expected a stream, got nil", op);
  return SH_OK;
}

extern "C" int sh_cuda_stream_get(sh_cuda_stream **out, int device, int kind) {
  *out = NULL;
  if (kind < 0 || kind > SH_STREAM_SNAPSHOT)
    return sh_fail(SH_ERR_ARG, "stream_get: kind %d is not compute (0), all-gather (1), reduce-scatter (2) or snapshot (3)", kind);
  SH_TRY(ensure_device(device));
  sh_cuda_stream *s = &devices[device].streams[kind];
  if (kind == SH_STREAM_SNAPSHOT && !s->s) {   /* made on first use, so that other runs make the same streams as before */
    std::lock_guard<std::mutex> g(init_lock);
    if (!s->s) {
      device_scope scope(device);
      s->device = device;
      s->kind = kind;
      CU_TRY("stream_get", cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking));
    }
  }
  *out = s;
  return SH_OK;
}

extern "C" int sh_cuda_set_stream(sh_cuda_stream *s) {
  SH_TRY(check_stream(s, "set_stream"));
  current[s->device] = s;
  return SH_OK;
}

extern "C" int sh_cuda_current_stream(sh_cuda_stream **out, int device) {
  *out = NULL;
  SH_TRY(ensure_device(device));
  *out = current_stream(device);
  return SH_OK;
}

extern "C" int sh_cuda_stream_synchronize(sh_cuda_stream *s) {
  SH_TRY(check_stream(s, "stream_synchronize"));
  CU_TRY("stream_synchronize", cudaStreamSynchronize(s->s));
  return SH_OK;
}

extern "C" int sh_cuda_stream_wait_event(sh_cuda_stream *s, sh_cuda_event *e) {
  SH_TRY(check_stream(s, "stream_wait_event"));
  if (!e) return sh_fail(SH_ERR_ARG, "stream_wait_event: expected an event, got nil");
  CU_TRY("stream_wait_event", cudaStreamWaitEvent(s->s, e->e, 0));
  return SH_OK;
}

cudaStream_t sh_cuda_stream_raw(const sh_cuda_stream *s) { return s ? s->s : NULL; }

extern "C" int sh_cuda_event_create(sh_cuda_event **out, int device, int timing) {
  const char *op = "event_create";
  *out = NULL;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  sh_cuda_event *e = (sh_cuda_event *)calloc(1, sizeof *e);
  if (!e) return sh_fail(SH_ERR_OOM, "%s: out of host memory", op);
  cudaError_t err = cudaEventCreateWithFlags(&e->e, timing ? cudaEventDefault : cudaEventDisableTiming);
  if (err != cudaSuccess) { free(e); return sh_cuda_fail(op, err, __FILE__, __LINE__); }
  e->device = device;
  *out = e;
  return SH_OK;
}

/* cudaEventDestroy returns at once even while the event is pending, so finalizers may call it. */
extern "C" void sh_cuda_event_destroy(sh_cuda_event *e) {
  if (!e) return;
  cudaEventDestroy(e->e);
  free(e);
}

extern "C" int sh_cuda_event_record(sh_cuda_event *e, sh_cuda_stream *s) {
  SH_TRY(check_stream(s, "event_record"));
  if (!e) return sh_fail(SH_ERR_ARG, "event_record: expected an event, got nil");
  if (e->device != s->device)
    return sh_fail(SH_ERR_DEVICE, "event_record: event of cuda:%d on a stream of cuda:%d", e->device, s->device);
  CU_TRY("event_record", cudaEventRecord(e->e, s->s));
  return SH_OK;
}

extern "C" int sh_cuda_event_query(sh_cuda_event *e, int *done) {
  if (!e) return sh_fail(SH_ERR_ARG, "event_query: expected an event, got nil");
  cudaError_t err = cudaEventQuery(e->e);
  if (err == cudaErrorNotReady) { cudaGetLastError(); *done = 0; return SH_OK; }
  CU_TRY("event_query", err);
  *done = 1;
  return SH_OK;
}

extern "C" int sh_cuda_event_synchronize(sh_cuda_event *e) {
  if (!e) return sh_fail(SH_ERR_ARG, "event_synchronize: expected an event, got nil");
  CU_TRY("event_synchronize", cudaEventSynchronize(e->e));
  return SH_OK;
}

extern "C" int sh_cuda_event_elapsed(sh_cuda_event *start, sh_cuda_event *end, double *ms) {
  if (!start || !end) return sh_fail(SH_ERR_ARG, "event_elapsed: expected two events");
  float f = 0;
  CU_TRY("event_elapsed", cudaEventElapsedTime(&f, start->e, end->e));
  *ms = f;
  return SH_OK;
}

/* ---- pinned host memory -------------------------------------------------------------- */
/* (Also the allocator's pinned blocks: runtime/core/alloc.c's sh_mem_set_pinned, CPU offload.) */

/* Sizes are rounded to 4 KiB pages; a freed buffer is reused for any request of at least
 * half its size, so a steady state cycles through the same few buffers. An asynchronous copy
 * may still read or write a buffer after its free, so the free records events on the current
 * stream and on those sh_cuda_record_stream named, and a cached buffer is handed out again
 * only once they completed (queried, never waited for: when none is ready, a new buffer is
 * pinned). */
struct pinned_block { void *ptr; size_t bytes; stream_uses uses; };
static std::vector<pinned_block> pinned_free;
static std::unordered_map<void *, pinned_block> pinned_live;
static std::mutex pinned_lock;

static bool pinned_ready(pinned_block &b) { return b.uses.done(); }

/* The best fit among the cached buffers whose work is done; -1 if none. */
static int pinned_fit(size_t bytes) {
  int best = -1;
  for (size_t i = 0; i < pinned_free.size(); i++) {
    size_t b = pinned_free[i].bytes;
    if (b >= bytes && b / 2 <= bytes && (best < 0 || b < pinned_free[best].bytes) && pinned_ready(pinned_free[i]))
      best = (int)i;
  }
  return best;
}

extern "C" int sh_cuda_host_alloc(void **out, size_t nbytes) {
  const char *op = "host_alloc";
  *out = NULL;
  size_t bytes = (nbytes + 4095) / 4096 * 4096;
  if (bytes == 0) bytes = 4096;
  std::lock_guard<std::mutex> g(pinned_lock);
  int best = pinned_fit(bytes);
  pinned_block blk = {NULL, bytes, {}};
  if (best >= 0) {
    blk = pinned_free[best];
    pinned_free.erase(pinned_free.begin() + best);
  } else {
    cudaError_t err = cudaHostAlloc(&blk.ptr, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return sh_fail(SH_ERR_OOM, "%s: cannot pin %zu bytes of host memory (%s)", op, bytes, cudaGetErrorString(err));
    }
  }
  pinned_live[blk.ptr] = blk;
  *out = blk.ptr;
  return SH_OK;
}

/* At the free: b's events on every stream that used it, the calling thread's current one
 * included (when a device is in use). */
static void pinned_record(pinned_block *b) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES || !devices[dev].ready) cudaGetLastError();
  else b->uses.add(current_stream(dev));
  b->uses.record();
}

extern "C" void sh_cuda_host_free(void *ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> g(pinned_lock);
  auto it = pinned_live.find(ptr);
  if (it == pinned_live.end()) return;
  pinned_block b = it->second;
  pinned_live.erase(it);
  pinned_record(&b);
  pinned_free.push_back(b);
}

/* The pinned buffer holding ptr, or NULL (pinned_lock held). */
static pinned_block *pinned_of(const void *ptr) {
  for (auto &kv : pinned_live)
    if ((const char *)ptr >= (const char *)kv.first && (const char *)ptr < (const char *)kv.first + kv.second.bytes)
      return &kv.second;
  return NULL;
}

extern "C" int sh_cuda_record_stream(const sh_tensor *t, sh_cuda_stream *s) {
  const char *op = "record_stream";
  SH_TRY(sh_tensor_check(t, op));
  if (!s) return sh_fail(SH_ERR_ARG, "%s: stream is NULL", op);
  const void *p = sh_tensor_data(t);
  stream_uses *u = NULL;
  if (t->device >= 0) {
    std::lock_guard<std::mutex> g(blocks_lock);
    block_rec *b = block_of(p);
    if (b && b->uses.add(s)) return SH_OK;
    u = b ? &b->uses : NULL;
  } else {
    std::lock_guard<std::mutex> g(pinned_lock);
    pinned_block *b = pinned_of(p);
    if (b && b->uses.add(s)) return SH_OK;
    u = b ? &b->uses : NULL;
  }
  if (!u) return sh_fail(SH_ERR_ARG, "%s: %s is not memory of the CUDA allocator (a cached device block or a pinned buffer)", op, sh_desc(t));
  return sh_fail(SH_ERR_DEVICE, "%s: cannot create an event for %s", op, sh_desc(t));
}

extern "C" int sh_cuda_host_empty_cache(void) {
  std::lock_guard<std::mutex> g(pinned_lock);
  for (pinned_block &b : pinned_free) {
    CU_TRY("host_empty_cache", cudaFreeHost(b.ptr));   /* waits for the device: b's uses are done */
    b.uses.destroy();
  }
  pinned_free.clear();
  return SH_OK;
}

extern "C" int sh_cuda_copy_async(sh_tensor *dst, const sh_tensor *src) {
  const char *op = "copy_async";
  SH_TRY(sh_tensor_check(dst, op));
  SH_TRY(sh_tensor_check(src, op));
  if (dst->dtype != src->dtype || sh_tensor_numel(dst) != sh_tensor_numel(src))
    return sh_fail(SH_ERR_ARG, "%s: needs the same dtype and size, got %s and %s", op, sh_desc(dst), sh_desc(src));
  if (!sh_tensor_is_contiguous(dst) || !sh_tensor_is_contiguous(src))
    return sh_fail(SH_ERR_ARG, "%s: needs contiguous tensors, got %s and %s", op, sh_desc(dst), sh_desc(src));
  if (dst->device < 0 && src->device < 0)
    return sh_fail(SH_ERR_DEVICE, "%s: one side must be on cuda, got %s and %s", op, sh_desc(dst), sh_desc(src));
  int device = dst->device >= 0 ? dst->device : src->device;
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  size_t n = (size_t)sh_tensor_numel(dst) * (size_t)sh_dtype_size(dst->dtype);
  if (n == 0) return SH_OK;
  dst->version++;
  if (dst->device >= 0 && src->device >= 0 && dst->device != src->device)
    CU_TRY(op, cudaMemcpyPeerAsync(sh_tensor_data(dst), dst->device, sh_tensor_data(src), src->device, n, st));
  else
    CU_TRY(op, cudaMemcpyAsync(sh_tensor_data(dst), sh_tensor_data(src), n, cudaMemcpyDefault, st));
  return SH_OK;
}

/* ---- CUDA graphs ------------------------------------------------------------------------- */

/* What runs on the host before each launch (sh_cuda_graph_before_launch) and the lr of the
 * step at the capture it stands for. */
struct before_launch_fn {
  double captured_lr;
  std::function<int(cudaStream_t, int64_t, double)> fn;
};

/* A captured graph of the compute stream, its instance, what runs on the host before each
 * launch, and the lr its next launch runs with (sh_cuda_graph_set_lr; until then each
 * callback's captured one). */
struct sh_cuda_graph {
  int device;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int64_t launches;
  std::vector<before_launch_fn> before_launch;
  std::vector<std::pair<void *, size_t>> owned;   /* device buffers it holds (sh_cuda_graph_buffer) */
  bool lr_set = false;
  double lr = 0;
};

static sh_cuda_graph *capturing[MAX_DEVICES];
static int graphs_alive[MAX_DEVICES];   /* they share the device's graph pool */

static bool graph_capturing(int device) { return device >= 0 && device < MAX_DEVICES && capturing[device]; }

sh_cuda_graph *sh_cuda_graph_capturing(int device) { return graph_capturing(device) ? capturing[device] : NULL; }

int sh_cuda_graph_before_launch(sh_cuda_graph *g, double captured_lr, std::function<int(cudaStream_t, int64_t, double)> fn) {
  g->before_launch.push_back({captured_lr, std::move(fn)});
  return SH_OK;
}

void *sh_cuda_graph_buffer(sh_cuda_graph *g, size_t nbytes) {
  /* Not from the graph pool: a block the captured work used earlier would be overwritten by
   * it after fn filled it. A block from the cache is one no captured work touches. */
  poison_skip = true;
  sh_mem_graph_pool(g->device, 0);
  void *p = sh_mem_alloc(g->device, nbytes, SH_TAG_OTHER);
  sh_mem_graph_pool(g->device, 1);
  poison_skip = false;
  if (p) g->owned.push_back({p, nbytes});
  return p;
}

/* Every cached block's uses, under blocks_lock. */
template <class F> static void each_block_uses(F f) {
  std::lock_guard<std::mutex> g(blocks_lock);
  for (auto &kv : blocks) f(kv.second.uses);
}

extern "C" int sh_cuda_graph_begin(int device) {
  const char *op = "cuda_graph_begin";
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, device, &st));
  if (capturing[device]) return sh_fail(SH_ERR_ARG, "%s: cuda:%d is already capturing a graph", op, device);
  if (current_stream(device) != &devices[device].streams[SH_STREAM_COMPUTE])
    return sh_fail(SH_ERR_ARG, "%s: capture begins on cuda:%d's compute stream, but another stream is current", op, device);
  /* Whatever the blocks' reuse events stand for has run: the capture never waits on work
   * outside it (cudaErrorStreamCaptureIsolation). A step boundary, so the wait costs little. */
  CU_TRY(op, cudaDeviceSynchronize());
  each_block_uses([](stream_uses &u) { u.settle(); });
  CU_TRY(op, cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  sh_cuda_graph *g = new sh_cuda_graph();
  g->device = device;
  capturing[device] = g;
  graphs_alive[device]++;
  return sh_mem_graph_pool(device, 1);
}

/* Ends the capture (its blocks stay the graph's) and makes the instance. */
extern "C" int sh_cuda_graph_end(int device, sh_cuda_graph **out) {
  const char *op = "cuda_graph_end";
  *out = NULL;
  if (!graph_capturing(device)) return sh_fail(SH_ERR_ARG, "%s: cuda:%d is not capturing a graph", op, device);
  sh_cuda_graph *g = capturing[device];
  capturing[device] = NULL;
  SH_TRY(sh_mem_graph_pool(device, 0));
  each_block_uses([](stream_uses &u) { u.uncapture(); });
  cudaError_t err = cudaStreamEndCapture(devices[device].streams[SH_STREAM_COMPUTE].s, &g->graph);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&g->exec, g->graph, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    sh_cuda_graph_destroy(g);
    return sh_fail(SH_ERR_DEVICE, "%s: the capture on cuda:%d failed: %s (%s): an operation in the captured step is not "
                   "allowed in a CUDA graph (a host synchronisation, a stream outside the capture)", op, device,
                   cudaGetErrorName(err), cudaGetErrorString(err));
  }
  *out = g;
  return SH_OK;
}

extern "C" int sh_cuda_graph_launch(sh_cuda_graph *g) {
  const char *op = "cuda_graph_launch";
  if (!g || !g->exec) return sh_fail(SH_ERR_ARG, "%s: expected a graph, got %s", op, g ? "a destroyed one" : "nil");
  cudaStream_t st;
  SH_TRY(sh_cuda_enter(op, g->device, &st));
  cudaStream_t compute = devices[g->device].streams[SH_STREAM_COMPUTE].s;
  for (auto &b : g->before_launch) SH_TRY(b.fn(compute, g->launches, g->lr_set ? g->lr : b.captured_lr));
  CU_TRY(op, cudaGraphLaunch(g->exec, compute));
  g->launches++;
  return SH_OK;
}

/* One lr drives every callback, so the optimizer steps of the capture must have had one. */
extern "C" int sh_cuda_graph_set_lr(sh_cuda_graph *g, double lr) {
  const char *op = "cuda_graph_set_lr";
  if (!g || !g->exec) return sh_fail(SH_ERR_ARG, "%s: expected a graph, got %s", op, g ? "a destroyed one" : "nil");
  if (!(lr >= 0)) return sh_fail(SH_ERR_ARG, "%s: lr must be >= 0, got %g", op, lr);
  for (auto &b : g->before_launch)
    if (b.captured_lr != g->before_launch[0].captured_lr)
      return sh_fail(SH_ERR_ARG, "%s: the graph's optimizer steps were captured with learning rates %g and %g; one lr "
                     "per launch cannot stand for both (capture them in graphs of their own)", op,
                     g->before_launch[0].captured_lr, b.captured_lr);
  g->lr_set = true;
  g->lr = lr;
  return SH_OK;
}

extern "C" int64_t sh_cuda_graph_launches(const sh_cuda_graph *g) { return g ? g->launches : 0; }

/* Returns at once (finalizers call it): launches already queued still run, and, once no graph
 * of the device is left, the pool's blocks go back to the cache as if freed now on the compute
 * stream, so a reuse elsewhere waits for those launches. */
extern "C" void sh_cuda_graph_destroy(sh_cuda_graph *g) {
  if (!g) return;
  device_scope scope(g->device);
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  for (auto &b : g->owned) sh_mem_free(g->device, b.first, b.second, SH_TAG_OTHER);
  if (--graphs_alive[g->device] == 0) {
    sh_cuda_stream *saved = current[g->device];
    current[g->device] = &devices[g->device].streams[SH_STREAM_COMPUTE];
    sh_mem_graph_pool_release(g->device);
    current[g->device] = saved;
  }
  delete g;
}
