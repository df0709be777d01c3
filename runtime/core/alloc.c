#include "alloc_internal.h"
#include "status_internal.h"
#include "meta_internal.h"
#include "tensor_internal.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_DEVICES = 17, N_CLASSES = 256, ALIGN = 64 };

typedef struct free_block { struct free_block *next; void *ptr; } free_block;

/* The blocks a CUDA graph may use (sh_mem_graph_pool): every block handed out or freed while
 * the pool is on joins it; a freed member goes to the pool's own lists, which only
 * allocations made while the pool is on draw from, until the pool is released. */
typedef struct graph_pool {
  int on;
  free_block *free_lists[N_CLASSES];
  void **members;                 /* open addressing on the pointer; NULL: empty slot */
  int cap, n;
  int64_t cached;                 /* bytes in its free lists */
} graph_pool;

typedef struct device_pool {
  sh_mem_stats stats;
  free_block *free_lists[N_CLASSES];
  free_block *spare_nodes;        /* recycled list nodes, so caching never mallocs twice */
  int64_t cached;
  graph_pool graph;
} device_pool;

static device_pool pools[MAX_DEVICES]; /* [0] is the CPU, [1 + N] is cuda:N */
static device_pool meta_pool;           /* the meta device (meta.h): accounted, never backed */
static device_pool meta_host_pool;      /* its host side (SH_DEVICE_META_HOST), likewise */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int current_tag = SH_TAG_OTHER;
static _Thread_local int pinned_mode;
static sh_mem_backend cuda_backend;

/* Pinned host blocks alive (sh_mem_set_pinned): frees look their pointers up here. */
static void **pinned_live;
static int n_pinned, cap_pinned;

static const char *tag_names[SH_N_TAGS] = {"other", "param", "grad", "optim", "activation", "comm"};
const char *sh_mem_tag_name(int tag) { return tag >= 0 && tag < SH_N_TAGS ? tag_names[tag] : "?"; }

void sh_mem_register_cuda(const sh_mem_backend *backend) { cuda_backend = *backend; }
const sh_mem_backend *sh_mem_cuda(void) { return cuda_backend.raw_alloc ? &cuda_backend : NULL; }

static device_pool *slot(int device) {
  if (device == SH_DEVICE_META) return &meta_pool;
  return device == SH_DEVICE_META_HOST ? &meta_host_pool : &pools[device + 1];
}

static device_pool *pool_for(int device) {
  if (sh_is_meta(device)) return slot(device);
  if (device < -1 || device >= MAX_DEVICES - 1) {
    sh_fail(SH_ERR_DEVICE, "memory: no device %d", device);
    return NULL;
  }
  if (device >= 0 && !cuda_backend.raw_alloc) {
    sh_fail(SH_ERR_DEVICE, "memory: cuda:%d requested but shard was built without CUDA or no GPU is present", device);
    return NULL;
  }
  return slot(device);
}

/* ---- allocation events (alloc.h), kept under `lock` ------------------------------------- */

static struct { sh_mem_event *ev; int capacity, head, n; int64_t dropped; } ring;

int sh_mem_trace_start(int capacity) {
  if (capacity < 0) return sh_fail(SH_ERR_ARG, "memory trace: capacity %d; expected >= 0 events", capacity);
  sh_mem_event *ev = capacity ? calloc((size_t)capacity, sizeof *ev) : NULL;
  if (capacity && !ev) return sh_fail(SH_ERR_OOM, "memory trace: out of host memory for %d events", capacity);
  pthread_mutex_lock(&lock);
  free(ring.ev);
  ring.ev = ev;
  ring.capacity = capacity;
  ring.head = ring.n = 0;
  ring.dropped = 0;
  pthread_mutex_unlock(&lock);
  return SH_OK;
}

int sh_mem_trace_read(sh_mem_event *out, int max) {
  pthread_mutex_lock(&lock);
  int k = 0;
  for (; k < max && ring.n > 0; k++) {
    out[k] = ring.ev[ring.head];
    ring.head = (ring.head + 1) % ring.capacity;
    ring.n--;
  }
  pthread_mutex_unlock(&lock);
  return k;
}

int64_t sh_mem_trace_dropped(void) { return ring.dropped; }

static void ring_push(int device, int tag, int64_t bytes) {
  if (!ring.ev) return;
  if (ring.n == ring.capacity) {          /* full: the oldest goes */
    ring.head = (ring.head + 1) % ring.capacity;
    ring.n--;
    ring.dropped++;
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ring.ev[(ring.head + ring.n++) % ring.capacity] =
    (sh_mem_event){ .t = ts.tv_sec + ts.tv_nsec * 1e-9, .bytes = bytes, .tag = tag, .device = device };
}

/* Size classes: 64-byte steps up to 1 KiB, then four classes per power of two. */
static int size_class(size_t n, size_t *class_bytes) {
  if (n <= 1024) {
    size_t b = n < ALIGN ? ALIGN : (n + ALIGN - 1) / ALIGN * ALIGN;
    *class_bytes = b;
    return (int)(b / ALIGN) - 1;                       /* 0..15 */
  }
  int p = 63 - __builtin_clzll((unsigned long long)(n - 1));   /* 2^p < n <= 2^(p+1) */
  size_t quarter = (size_t)1 << (p - 2);
  size_t k = (n - ((size_t)1 << p) + quarter - 1) / quarter;   /* 1..4 */
  *class_bytes = ((size_t)1 << p) + k * quarter;
  int cls = 16 + (p - 10) * 4 + (int)k - 1;
  return cls < N_CLASSES ? cls : -1;
}

static void *system_alloc(int device, size_t bytes) {
  if (sh_is_meta(device)) return sh_meta_address(bytes);
  if (device < 0) return aligned_alloc(ALIGN, bytes);
  return cuda_backend.raw_alloc(device, bytes);
}

static void system_free(int device, void *ptr) {
  if (sh_is_meta(device)) return;
  if (device < 0) free(ptr); else cuda_backend.raw_free(device, ptr);
}

/* `allocated` counts what was asked for (64-byte aligned), so per-tag figures match the
 * tensors' sizes; `reserved` counts whole size-class blocks. */
static int64_t used_bytes(size_t nbytes) { return (int64_t)((nbytes + ALIGN - 1) / ALIGN * ALIGN); }

static void account(sh_mem_stats *s, int tag, int64_t delta) {
  s->allocated += delta;
  s->by_tag[tag] += delta;
  if (s->allocated > s->peak) {
    s->peak = s->allocated;
    memcpy(s->peak_by_tag, s->by_tag, sizeof s->by_tag);
  }
}

/* ---- the graph pool ---------------------------------------------------------------------- */

static size_t member_slot(const graph_pool *g, const void *ptr) {
  return (size_t)(((uintptr_t)ptr >> 6) * 0x9e3779b97f4a7c15ull) & (size_t)(g->cap - 1);
}

static int is_member(const graph_pool *g, const void *ptr) {
  if (!g->n) return 0;
  for (size_t i = member_slot(g, ptr);; i = (i + 1) & (size_t)(g->cap - 1)) {
    if (g->members[i] == ptr) return 1;
    if (!g->members[i]) return 0;
  }
}

/* False when the table cannot grow (host memory): the block then stays out of the pool. */
static int add_member(graph_pool *g, void *ptr) {
  if (is_member(g, ptr)) return 1;
  if (2 * (g->n + 1) > g->cap) {
    int cap = g->cap ? 2 * g->cap : 256;
    void **old = g->members, **m = calloc((size_t)cap, sizeof *m);
    if (!m) return 0;
    int old_cap = g->cap;
    g->members = m;
    g->cap = cap;
    g->n = 0;
    for (int i = 0; i < old_cap; i++)
      if (old[i]) add_member(g, old[i]);
    free(old);
  }
  size_t i = member_slot(g, ptr);
  while (g->members[i]) i = (i + 1) & (size_t)(g->cap - 1);
  g->members[i] = ptr;
  g->n++;
  return 1;
}

int sh_mem_graph_pool(int device, int on) {
  if (device < 0 || device >= MAX_DEVICES - 1) return sh_fail(SH_ERR_DEVICE, "memory: graph pool on no device %d", device);
  pthread_mutex_lock(&lock);
  slot(device)->graph.on = on != 0;
  pthread_mutex_unlock(&lock);
  return SH_OK;
}

/* The members still in use leave the pool too: their frees go to the cache. */
int sh_mem_graph_pool_release(int device) {
  if (device < 0 || device >= MAX_DEVICES - 1) return sh_fail(SH_ERR_DEVICE, "memory: graph pool on no device %d", device);
  pthread_mutex_lock(&lock);
  device_pool *p = slot(device);
  graph_pool *g = &p->graph;
  for (int c = 0; c < N_CLASSES; c++)
    while (g->free_lists[c]) {   /* freed again now: reuse waits for the graph's last launch */
      free_block *b = g->free_lists[c];
      g->free_lists[c] = b->next;
      b->next = p->free_lists[c];
      p->free_lists[c] = b;
      if (cuda_backend.on_free) cuda_backend.on_free(device, b->ptr);
    }
  p->cached += g->cached;
  free(g->members);
  *g = (graph_pool){0};
  pthread_mutex_unlock(&lock);
  return SH_OK;
}

static void release_cache(int device, device_pool *p) {
  for (int c = 0; c < N_CLASSES; c++) {
    while (p->free_lists[c]) {
      free_block *b = p->free_lists[c];
      p->free_lists[c] = b->next;
      system_free(device, b->ptr);
      b->next = p->spare_nodes;
      p->spare_nodes = b;
    }
  }
  p->stats.reserved -= p->cached;
  p->cached = 0;
}

/* Bytes as shard.units.bytes prints them (lua/shard/units.lua), so that an out-of-memory error
   reads like every other memory figure: whole bytes under 1 KiB, else one decimal in the
   largest binary unit that leaves at least 1 (1023.95 KiB and up is "1.0 MiB"). */
typedef struct { char s[24]; } bytes_text;
static bytes_text human_bytes(int64_t n) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  bytes_text t;
  if (n > -1024 && n < 1024) { snprintf(t.s, sizeof t.s, "%lld B", (long long)n); return t; }
  double v = (double)n;
  int u = 0;
  while (u < 5 && (v >= 1023.95 || v <= -1023.95)) { v /= 1024; u++; }
  snprintf(t.s, sizeof t.s, "%.1f %s", v, unit[u]);
  return t;
}

static int oom(int device, device_pool *p, size_t bytes, int tag, const char *why) {
  const sh_mem_stats *s = &p->stats;
  char dev[16];
  sh_device_str(device, dev, sizeof dev);
  return sh_fail(SH_ERR_OOM,
    "out of memory on %s: %s allocating %s (tag %s); allocated %s, reserved %s, "
    "limit %s; by tag: param %s, grad %s, optim %s, activation %s, comm %s, other %s",
    dev, why, human_bytes((int64_t)bytes).s, tag_names[tag],
    human_bytes(s->allocated).s, human_bytes(s->reserved).s,
    s->limit ? human_bytes(s->limit).s : "none",
    human_bytes(s->by_tag[SH_TAG_PARAM]).s, human_bytes(s->by_tag[SH_TAG_GRAD]).s,
    human_bytes(s->by_tag[SH_TAG_OPTIM]).s, human_bytes(s->by_tag[SH_TAG_ACTIVATION]).s,
    human_bytes(s->by_tag[SH_TAG_COMM]).s, human_bytes(s->by_tag[SH_TAG_OTHER]).s);
}

/* ---- pinned host memory (CPU offload) ------------------------------------------------- */

static int pinned_index(const void *ptr) {
  for (int i = 0; i < n_pinned; i++) if (pinned_live[i] == ptr) return i;
  return -1;
}

/* Under the lock: a pinned block from the CUDA backend, counted in the CPU pool. */
static void *pinned_alloc(device_pool *p, size_t nbytes, int tag) {
  int64_t used = used_bytes(nbytes);
  if (p->stats.limit && p->stats.allocated + used > p->stats.limit) {
    oom(-1, p, nbytes, tag, "memory limit reached (pinned)");
    return NULL;
  }
  if (n_pinned == cap_pinned) {
    int cap = cap_pinned ? 2 * cap_pinned : 64;
    void **grown = realloc(pinned_live, (size_t)cap * sizeof *grown);
    if (!grown) { sh_fail(SH_ERR_OOM, "memory: out of host memory for the pinned block list"); return NULL; }
    pinned_live = grown;
    cap_pinned = cap;
  }
  void *ptr = NULL;
  if (cuda_backend.host_alloc(&ptr, nbytes)) return NULL;
  pinned_live[n_pinned++] = ptr;
  p->stats.reserved += used;
  p->stats.n_alloc++;
  p->stats.n_system_alloc++;
  account(&p->stats, tag, used);
  return ptr;
}

/* Under the lock: 1 when ptr was a pinned block (now handed back), else 0. */
static int pinned_free(device_pool *p, void *ptr, size_t nbytes, int tag) {
  int i = n_pinned ? pinned_index(ptr) : -1;
  if (i < 0) return 0;
  pinned_live[i] = pinned_live[--n_pinned];
  cuda_backend.host_free(ptr);
  p->stats.reserved -= used_bytes(nbytes);
  account(&p->stats, tag, -used_bytes(nbytes));
  return 1;
}

int sh_mem_set_pinned(int on) {
  int old = pinned_mode;
  pinned_mode = on != 0;
  return old;
}

void *sh_mem_alloc(int device, size_t nbytes, int tag) {
  if (tag < 0 || tag >= SH_N_TAGS) tag = SH_TAG_OTHER;
  pthread_mutex_lock(&lock);
  if (device == -1 && pinned_mode && cuda_backend.host_alloc) {
    void *ptr = pinned_alloc(&pools[0], nbytes ? nbytes : 1, tag);
    if (ptr) ring_push(device, tag, used_bytes(nbytes ? nbytes : 1));
    pthread_mutex_unlock(&lock);
    return ptr;
  }
  device_pool *p = pool_for(device);
  void *ptr = NULL;
  size_t bytes = 0;
  int cls = p ? size_class(nbytes, &bytes) : -1;
  if (!p) goto out;
  if (cls < 0) { oom(device, p, nbytes, tag, "size beyond the largest size class"); goto out; }
  if (p->stats.limit && p->stats.allocated + (int64_t)bytes > p->stats.limit) {
    oom(device, p, bytes, tag, "memory limit reached");
    goto out;
  }
  graph_pool *g = device >= 0 && p->graph.on ? &p->graph : NULL;
  free_block **list = g && g->free_lists[cls] ? &g->free_lists[cls] : &p->free_lists[cls];
  free_block *b = *list;
  if (b) {
    *list = b->next;
    ptr = b->ptr;
    b->next = p->spare_nodes;
    p->spare_nodes = b;
    *(list == &p->free_lists[cls] ? &p->cached : &g->cached) -= (int64_t)bytes;
    if (device >= 0 && cuda_backend.on_reuse) cuda_backend.on_reuse(device, ptr);
  } else {
    ptr = system_alloc(device, bytes);
    if (!ptr) {                       /* give the cache back and try once more */
      release_cache(device, p);
      ptr = system_alloc(device, bytes);
    }
    if (!ptr) { oom(device, p, bytes, tag, "the system refused"); goto out; }
    p->stats.reserved += (int64_t)bytes;
    p->stats.n_system_alloc++;
  }
  if (g) add_member(g, ptr);
  p->stats.n_alloc++;
  account(&p->stats, tag, used_bytes(nbytes));
  ring_push(device, tag, used_bytes(nbytes));
out:
  pthread_mutex_unlock(&lock);
  return ptr;
}

void sh_mem_free(int device, void *ptr, size_t nbytes, int tag) {
  if (!ptr) return;
  if (tag < 0 || tag >= SH_N_TAGS) tag = SH_TAG_OTHER;
  pthread_mutex_lock(&lock);
  device_pool *p = slot(device);
  if (device == -1 && pinned_free(p, ptr, nbytes ? nbytes : 1, tag)) {
    ring_push(device, tag, -used_bytes(nbytes ? nbytes : 1));
    pthread_mutex_unlock(&lock);
    return;
  }
  size_t bytes;
  int cls = size_class(nbytes, &bytes);
  free_block *b = p->spare_nodes;
  if (b) p->spare_nodes = b->next; else b = malloc(sizeof *b);
  graph_pool *g = &p->graph;
  int to_graph = device >= 0 && ((g->on && add_member(g, ptr)) || is_member(g, ptr));
  if (b) {
    b->ptr = ptr;
    b->next = to_graph ? g->free_lists[cls] : p->free_lists[cls];
    *(to_graph ? &g->free_lists[cls] : &p->free_lists[cls]) = b;
    *(to_graph ? &g->cached : &p->cached) += (int64_t)bytes;
    if (device >= 0 && cuda_backend.on_free) cuda_backend.on_free(device, ptr);
  } else {                            /* cannot even cache: hand it back */
    system_free(device, ptr);
    p->stats.reserved -= (int64_t)bytes;
  }
  account(&p->stats, tag, -used_bytes(nbytes));
  ring_push(device, tag, -used_bytes(nbytes));
  pthread_mutex_unlock(&lock);
}

int sh_mem_stats_get(int device, sh_mem_stats *out) {
  pthread_mutex_lock(&lock);
  device_pool *p = pool_for(device);
  if (p) *out = p->stats;
  pthread_mutex_unlock(&lock);
  return p ? SH_OK : SH_ERR_DEVICE;
}

int sh_mem_reset_peak(int device) {
  pthread_mutex_lock(&lock);
  device_pool *p = pool_for(device);
  if (p) {
    p->stats.peak = p->stats.allocated;
    memcpy(p->stats.peak_by_tag, p->stats.by_tag, sizeof p->stats.by_tag);
  }
  pthread_mutex_unlock(&lock);
  return p ? SH_OK : SH_ERR_DEVICE;
}

int sh_mem_empty_cache(int device) {
  pthread_mutex_lock(&lock);
  device_pool *p = pool_for(device);
  if (p) release_cache(device, p);
  pthread_mutex_unlock(&lock);
  return p ? SH_OK : SH_ERR_DEVICE;
}

int sh_mem_set_limit(int device, int64_t bytes) {
  if (bytes < 0) return sh_fail(SH_ERR_ARG, "memory: limit must be >= 0, got %lld", (long long)bytes);
  pthread_mutex_lock(&lock);
  device_pool *p = pool_for(device);
  if (p) p->stats.limit = bytes;
  pthread_mutex_unlock(&lock);
  return p ? SH_OK : SH_ERR_DEVICE;
}

int sh_mem_set_tag(int tag) {
  int old = current_tag;
  if (tag >= 0 && tag < SH_N_TAGS) current_tag = tag;
  return old;
}

int sh_mem_current_tag(void) { return current_tag; }
