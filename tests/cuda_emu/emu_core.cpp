/* emu_core.cpp: the CUDA emulator's core. Device memory (NaN-filled, guarded, hidden from the
 * host between device work), streams as deferred in-order queues drained in the worst order
 * CUDA allows, events, sticky errors, the runtime API, and the fiber scheduler that runs every
 * CUDA thread of a block as a fiber on one executor thread. Test infrastructure only.
 * Design notes: tests/cuda_emu/README.md. */
#include <cuda_runtime.h>
#include "emu_api.h"
#include "emu_device.h"
#include "emu_test.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <functional>
#include <unordered_map>
#include <vector>

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

/* The built-in variables of the running CUDA thread. */
uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace emu {
namespace {

/* ===================================================================================== */
/* configuration                                                                          */
/* ===================================================================================== */

enum { MAX_DEV = 16, PAGE = 4096, WARP = 32, MAX_THREADS = 1024 };
const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 232448, SMEM_PER_SM = 233472;
const size_t TOTAL_MEM = (size_t)80 << 30;

struct config {
  int devices = 1;
  bool eager = false;              /* run work when queued instead of when the host must wait */
  int block_order = 2;             /* 0 forward, 1 reverse, 2 shuffle */
  unsigned long long seed = 1;
  bool thread_reverse = false;
  bool hide = true;                /* device memory inaccessible to the host outside device work */
  bool verbose = false;
  size_t stack_bytes = 64 * 1024;
  size_t mem_limit = TOTAL_MEM;
  /* A smaller device, so small tests reach the limits that kernels size their grids by: the
   * SM count (grid-stride launches are sized by it) and the grid's y limit (enforced too). */
  int sms = 132;
  int max_grid_y = 65535;
  /* A test knob: cudaStreamWaitEvent becomes a no-op (SHARD_EMU_DROP_EVENT_WAITS=1), so that a
   * test can show it notices every missing cross-stream order. */
  bool drop_event_waits = false;
  /* The order a host wait drains streams in (SHARD_EMU_DRAIN_SEED): 0 newest first, N > 0 the
   * orders drain_order picks from N. */
  unsigned long long drain_seed = 0;
};
config cfg;

void read_config() {
  static bool done = false;
  if (done) return;
  done = true;
  const char *v;
  if ((v = getenv("SHARD_EMU_DEVICES"))) cfg.devices = std::max(1, std::min((int)MAX_DEV, atoi(v)));
  if ((v = getenv("SHARD_EMU_SCHED"))) cfg.eager = !strcmp(v, "eager");
  if ((v = getenv("SHARD_EMU_BLOCK_ORDER"))) {
    if (!strncmp(v, "forward", 7)) cfg.block_order = 0;
    else if (!strncmp(v, "reverse", 7)) cfg.block_order = 1;
    else cfg.block_order = 2;
    const char *c = strchr(v, ':');
    if (c) cfg.seed = strtoull(c + 1, nullptr, 0);
  }
  if ((v = getenv("SHARD_EMU_THREAD_ORDER"))) cfg.thread_reverse = !strcmp(v, "reverse");
  if ((v = getenv("SHARD_EMU_HIDE"))) cfg.hide = atoi(v) != 0;
  if ((v = getenv("SHARD_EMU_VERBOSE"))) cfg.verbose = atoi(v) != 0;
  if ((v = getenv("SHARD_EMU_STACK_KB"))) cfg.stack_bytes = (size_t)std::max(16, atoi(v)) * 1024;
  if ((v = getenv("SHARD_EMU_MEM_MB"))) cfg.mem_limit = (size_t)atoll(v) << 20;
  if ((v = getenv("SHARD_EMU_SMS"))) cfg.sms = std::max(1, std::min(132, atoi(v)));
  if ((v = getenv("SHARD_EMU_MAX_GRID_Y"))) cfg.max_grid_y = std::max(1, std::min(65535, atoi(v)));
  if ((v = getenv("SHARD_EMU_DROP_EVENT_WAITS"))) cfg.drop_event_waits = atoi(v) != 0;
  if ((v = getenv("SHARD_EMU_DRAIN_SEED"))) cfg.drain_seed = strtoull(v, nullptr, 0);
}

/* ===================================================================================== */
/* global state: one recursive lock for everything; device work runs under it             */
/* ===================================================================================== */

std::recursive_mutex g_lock;
typedef std::lock_guard<std::recursive_mutex> guard;

thread_local cudaError_t tl_last = cudaSuccess;
thread_local int tl_device = 0;
cudaError_t g_sticky[MAX_DEV];
counters g_count;
std::string g_report;          /* the last diagnostic, for the self-tests */
long g_reports;

void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_report = buf;
  g_reports++;
  fprintf(stderr, "cuda_emu: %s\n", buf);
  fflush(stderr);
}

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) tl_last = e;
  return e;
}

void make_sticky(int dev, cudaError_t e) {
  if (dev < 0 || dev >= MAX_DEV) dev = 0;
  if (g_sticky[dev] == cudaSuccess) g_sticky[dev] = e;
}

/* ===================================================================================== */
/* memory                                                                                 */
/* ===================================================================================== */

/* Layout of one device allocation: [guard page][front slack | data | tail slack < 256][guard
 * page]; data is 256-byte aligned (as cudaMalloc promises) and ends as close to the rear
 * guard as that allows. The slack holds 0xFF canaries, checked after every piece of device
 * work. */
struct alloc {
  char *map;           /* the whole mapping, guards included */
  size_t map_len;
  char *data;
  size_t size;
  int device;          /* -1 for pinned host memory */
  bool exposed;
};

std::map<uintptr_t, alloc *> g_by_map;   /* keyed by the mapping's start */
std::map<uintptr_t, alloc *> g_by_data;  /* live allocations keyed by their data pointer */
std::deque<alloc *> g_quarantine;        /* freed: inaccessible, address space kept a while */
size_t g_quarantine_bytes;
size_t g_used[MAX_DEV];
const size_t QUARANTINE_MAX = (size_t)64 << 30, QUARANTINE_COUNT = 4096;

char *inner_begin(const alloc *a) { return a->map + PAGE; }
char *inner_end(const alloc *a) { return a->map + a->map_len - PAGE; }
const int CANARY = 0xFF;
const size_t FRONT_CHECK = 256;

alloc *find_mapping(const void *p) {
  uintptr_t u = (uintptr_t)p;
  auto it = g_by_map.upper_bound(u);
  if (it == g_by_map.begin()) return nullptr;
  --it;
  alloc *a = it->second;
  return u < (uintptr_t)a->map + a->map_len ? a : nullptr;
}

/* The live allocation whose data holds p (or whose end p is, when end_ok). */
alloc *find_live(const void *p, bool end_ok = false) {
  uintptr_t u = (uintptr_t)p;
  auto it = g_by_data.upper_bound(u);
  if (it == g_by_data.begin()) return nullptr;
  --it;
  alloc *a = it->second;
  uintptr_t b = (uintptr_t)a->data;
  if (u < b + a->size || (end_ok && u == b + a->size)) return a;
  return nullptr;
}

alloc *new_mapping(size_t size, int device) {
  size_t body = (size + 255) / 256 * 256;
  size_t inner = (body + PAGE - 1) / PAGE * PAGE;
  if (inner == 0) inner = PAGE;
  size_t len = inner + 2 * PAGE;
  void *m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  alloc *a = new alloc;
  a->map = (char *)m;
  a->map_len = len;
  a->size = size;
  a->device = device;
  a->data = inner_end(a) - body;
  a->exposed = true;
  if (mprotect(inner_begin(a), inner, PROT_READ | PROT_WRITE) != 0) {
    munmap(m, len);
    delete a;
    return nullptr;
  }
  memset(inner_begin(a), CANARY, inner);   /* NaN in f32, bf16 and f16 */
  g_by_map[(uintptr_t)a->map] = a;
  g_by_data[(uintptr_t)a->data] = a;
  return a;
}

void retire_mapping(alloc *a) {
  g_by_data.erase((uintptr_t)a->data);
  mprotect(a->map, a->map_len, PROT_NONE);
  madvise(a->map, a->map_len, MADV_DONTNEED);
  a->exposed = false;
  g_quarantine.push_back(a);
  g_quarantine_bytes += a->map_len;
  /* bounded in bytes and in mappings (the kernel allows ~65k mappings per process) */
  while ((g_quarantine_bytes > QUARANTINE_MAX || g_quarantine.size() > QUARANTINE_COUNT) && !g_quarantine.empty()) {
    alloc *o = g_quarantine.front();
    g_quarantine.pop_front();
    g_quarantine_bytes -= o->map_len;
    g_by_map.erase((uintptr_t)o->map);
    munmap(o->map, o->map_len);
    delete o;
  }
}

void set_exposed(alloc *a, bool on) {
  if (a->device < 0 || a->exposed == on) return;
  mprotect(inner_begin(a), inner_end(a) - inner_begin(a), on ? PROT_READ | PROT_WRITE : PROT_NONE);
  a->exposed = on;
}

void expose_all(bool on) {
  if (!cfg.hide && !on) return;
  for (auto &kv : g_by_data) set_exposed(kv.second, on);
}

/* Canary check of every live device allocation; reports and repairs damage. */
bool check_canaries(const char *what) {
  bool ok = true;
  for (auto &kv : g_by_data) {
    alloc *a = kv.second;
    if (a->device < 0 || !a->exposed) continue;
    char *end = a->data + a->size;
    for (char *p = end; p < inner_end(a); p++)
      if ((unsigned char)*p != CANARY) {
        note("%s wrote past the end of a %zu-byte device allocation at %p (byte +%zu after its end, inside the "
             "allocation's alignment slack)", what, a->size, (void *)a->data, (size_t)(p - end));
        memset(end, CANARY, inner_end(a) - end);
        ok = false;
        break;
      }
    char *f0 = std::max(inner_begin(a), a->data - FRONT_CHECK);
    for (char *p = f0; p < a->data; p++)
      if ((unsigned char)*p != CANARY) {
        note("%s wrote before the start of a %zu-byte device allocation at %p (byte -%zu)", what, a->size,
             (void *)a->data, (size_t)(a->data - p));
        memset(f0, CANARY, a->data - f0);
        ok = false;
        break;
      }
  }
  return ok;
}

/* ===================================================================================== */
/* streams, events, queued work                                                           */
/* ===================================================================================== */

struct stream_rec;
struct capture_rec;
struct dep { stream_rec *s; uint64_t seq; };

struct op {
  uint64_t seq = 0, issue = 0;
  std::vector<dep> deps;
  std::string what;
  std::function<void()> body;   /* empty for a pure wait */
  int device = 0;
  bool is_kernel = false;
  bool is_record = false;       /* cudaEventRecord's marker: not device work (no graph node) */
};

struct stream_rec {
  int device;
  unsigned flags;
  bool legacy;
  bool destroyed = false;
  std::deque<op *> q;
  uint64_t enq = 0, done = 0;
  uint64_t last_issue = 0;
  int busy = 0;                 /* > 0 while complete() works on it: run_ready_work leaves it */
  int id = 0;                   /* its place in g_streams: the graph's stream id */
  int created = -1;             /* cudaStreamCreate* order in the process; -1: legacy */
  long last_node = 0;           /* graph: the last node queued here while recording, 0 none */
  std::vector<std::pair<long, const void *>> wait_from;   /* graph: edges to the next node */
  bool lane = false;            /* a graph's own stream (cudaGraphInstantiate), not the program's */
  capture_rec *cap = nullptr;   /* the capture it takes part in, or null */
  std::vector<int> cap_deps;    /* while capturing: the nodes the next captured work follows */
  int cap_lane = 0;             /* while capturing: its place in the capture's streams */
};

struct event_rec {
  int device;
  unsigned flags;
  stream_rec *s = nullptr;
  uint64_t seq = 0;
  double t_ms = 0;
  bool timed = false;
  bool destroyed = false;
  long node = 0;                /* graph: the last node before the record (0: none / not recording) */
  capture_rec *cap = nullptr;   /* last recorded in this capture (a captured event), or null */
  std::vector<int> cap_nodes;   /* the captured nodes it stands for */
};

stream_rec *g_legacy[MAX_DEV];
std::vector<stream_rec *> g_streams;              /* every stream ever made (never freed) */
std::set<stream_rec *> g_live_streams;
std::set<event_rec *> g_live_events;
uint64_t g_issue;
int g_exec_depth;            /* > 0 while device work runs on this process's executor */
int g_exec_device = 0;
std::thread::id g_exec_thread;
int g_created;               /* streams made by cudaStreamCreate* */

/* The dependency graph being recorded (graph_begin .. graph_end), in the order things
 * happened: node, edge, wait and hostwait lines; the stream lines are written at the end. */
struct graph_state {
  bool on = false;
  long nodes = 0;
  std::vector<std::string> lines;
  std::set<int> streams;     /* ids of the streams that appear */
};
graph_state g_graph;

void graph_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void graph_line(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_graph.lines.push_back(buf);
}

/* The host waits for (or polls) the device: counted, and a hostwait line while recording.
 * `sync` also counts it in host_syncs (everything but a query that answered not ready). */
void host_wait(bool sync, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void host_wait(bool sync, const char *kind, const char *fmt, ...) {
  g_count.host_waits++;
  if (sync) g_count.host_syncs++;
  if (!g_graph.on) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  graph_line("hostwait %s %s", kind, buf);
}

/* ===================================================================================== */
/* stream capture (Programming Guide "CUDA Graphs", "Creating a Graph Using Stream Capture") */
/* ===================================================================================== */

/* A node of a captured graph: the work, the lane it runs on at each launch (the capturing
 * stream it came from: consecutive work of one stream stays in order) and the earlier nodes
 * it waits for. Event records and waits are not nodes: they become these edges. */
struct gnode {
  std::string what;
  int lane = 0;
  std::vector<int> deps;
  std::function<void()> body;
  relaunch_fn relaunch;          /* emu_api.h: remakes the work at each launch, or empty */
  bool is_kernel = false;
};

struct graph_rec { std::vector<gnode> nodes; int lanes = 1; int device = 0; };

/* One capture sequence, cudaStreamBeginCapture .. cudaStreamEndCapture. Kept after its end
 * (small): an event last recorded in it still names it. */
struct capture_rec {
  graph_rec *g = nullptr;
  unsigned long long id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  stream_rec *origin = nullptr;
  bool invalid = false, ended = false;
  std::vector<stream_rec *> streams;   /* in joining order: index = lane; the origin is 0 */
};

/* An instantiated graph: its own non-blocking streams, one per lane. */
struct exec_rec {
  graph_rec g;
  std::vector<stream_rec *> lanes;
  dep last_launch = {nullptr, 0};      /* the previous launch's end: launches run one after another */
};

std::set<capture_rec *> g_captures;    /* active ones */
std::set<graph_rec *> g_graphs;
std::set<exec_rec *> g_execs;
unsigned long long g_capture_ids;
thread_local cudaStreamCaptureMode tl_capture_mode = cudaStreamCaptureModeGlobal;

/* An invalid operation during capture invalidates it: EndCapture then returns
 * cudaErrorStreamCaptureInvalidated and no graph. */
void invalidate(capture_rec *c, const char *why) {
  if (!c || c->ended || c->invalid) return;
  c->invalid = true;
  note("stream capture %llu invalidated: %s", c->id, why);
}

/* The capture, if any, that makes the legacy stream of `device` unusable: one of the
 * device's blocking streams is capturing ("the legacy stream handle at all times encompasses
 * these other streams"). */
capture_rec *blocking_capture(int device) {
  for (capture_rec *c : g_captures)
    for (stream_rec *s : c->streams)
      if (s->device == device && !(s->flags & cudaStreamNonBlocking)) return c;
  return nullptr;
}

/* Whether `s` takes work now: cudaErrorStreamCaptureInvalidated while its capture is
 * invalidated; cudaErrorStreamCaptureImplicit (the capture invalidated) for the legacy
 * stream while a blocking stream of its device captures. */
cudaError_t stream_usable(stream_rec *s, const char *what) {
  if (s->cap && s->cap->invalid) return cudaErrorStreamCaptureInvalidated;
  if (s->legacy) {
    if (capture_rec *c = blocking_capture(s->device)) {
      invalidate(c, (std::string(what) + " on the legacy stream while a blocking stream captures").c_str());
      return cudaErrorStreamCaptureImplicit;
    }
  }
  return cudaSuccess;
}

/* "Potentially unsafe" calls (cudaMalloc, cudaFree, ...; cudaThreadExchangeStreamCaptureMode):
 * refused with cudaErrorStreamCaptureUnsupported, the capture that forbids them invalidated,
 * when this thread has a capture not begun relaxed (unless its own mode is relaxed), or
 * another thread has one begun in global mode (when this thread's mode is global). */
cudaError_t unsafe_call(const char *what) {
  if (tl_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  for (capture_rec *c : g_captures) {
    bool mine = c->thread == std::this_thread::get_id();
    if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && c->mode == cudaStreamCaptureModeGlobal && tl_capture_mode == cudaStreamCaptureModeGlobal)) {
      invalidate(c, (std::string(what) + " during capture (a potentially unsafe call in this capture mode)").c_str());
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  return cudaSuccess;
}

/* Adds a node for work captured on s (after s's current dependencies and `extra`); s's
 * next work follows it. Returns its index. */
int capture_node(stream_rec *s, std::string what, std::function<void()> body, bool kernel, const std::vector<int> &extra,
                 relaunch_fn relaunch) {
  graph_rec *g = s->cap->g;
  gnode n;
  n.what = std::move(what);
  n.lane = s->cap_lane;
  n.deps = s->cap_deps;
  for (int d : extra)
    if (std::find(n.deps.begin(), n.deps.end(), d) == n.deps.end()) n.deps.push_back(d);
  n.body = std::move(body);
  n.relaunch = std::move(relaunch);
  n.is_kernel = kernel;
  g->nodes.push_back(std::move(n));
  int id = (int)g->nodes.size() - 1;
  s->cap_deps.assign(1, id);
  return id;
}

/* s joins capture c (it waited on an event recorded in c): lane, dependencies. */
void capture_join(stream_rec *s, capture_rec *c, const std::vector<int> &deps) {
  s->cap = c;
  s->cap_lane = (int)c->streams.size();
  s->cap_deps = deps;
  c->streams.push_back(s);
  c->g->lanes = (int)c->streams.size();
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void init_devices() {
  static bool done = false;
  if (done) return;
  done = true;
  read_config();
  for (int d = 0; d < cfg.devices; d++) {
    stream_rec *s = new stream_rec;
    s->device = d;
    s->flags = 0;
    s->legacy = true;
    s->id = (int)g_streams.size();
    g_legacy[d] = s;
    g_streams.push_back(s);
  }
}

/* The stream a handle names, or null (invalid / destroyed). 0, cudaStreamLegacy and
 * cudaStreamPerThread are the current device's legacy default stream. */
stream_rec *resolve(cudaStream_t h) {
  init_devices();
  if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread) return g_legacy[tl_device];
  stream_rec *s = (stream_rec *)h;
  if (!g_live_streams.count(s)) return nullptr;
  return s;
}

void execute(op *o);

struct exec_scope {
  exec_scope();
  ~exec_scope();
};

int g_requeued;   /* requeue_work's answer for the work running: 0 none, 1 still, 2 moved */

/* Runs the front of s's queue (its waits done); false when it asked to run again later. */
bool run_front(stream_rec *s) {
  op *o = s->q.front();
  s->q.pop_front();
  s->busy++;
  g_requeued = 0;
  execute(o);
  s->busy--;
  if (g_requeued) {
    s->q.push_front(o);
    return false;
  }
  s->done = o->seq;
  delete o;
  return true;
}

/* Runs the work of s up to seq (and, first, whatever it waits for). */
void complete(stream_rec *s, uint64_t seq) {
  exec_scope x;
  s->busy++;   /* also while its front waits for other streams: run_ready_work leaves it */
  while (s->done < seq && !s->q.empty()) {
    for (const dep &d : s->q.front()->deps)
      if (d.s->done < d.seq) complete(d.s, d.seq);
    run_front(s);
  }
  s->busy--;
}

void complete_all(stream_rec *s) { complete(s, s->enq); }

uint64_t splitmix(uint64_t &x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t g_drain_waits;      /* host waits that chose among several streams: the order's index */

/* The streams of `device` (every device when -1) with work queued, in the order a host wait
 * drains them. Seed 0: newest first, the stream whose last work was queued most recently
 * before the others. Seed N > 0: with k <= 3 streams, the ((N + w) mod k!)-th permutation of
 * newest-first (w counts the waits), so seeds 1..k! give every wait every order; with more,
 * a shuffle seeded by N and w. A GPU may have run any of them first: each order is legal. */
std::vector<stream_rec *> drain_order(int device) {
  std::vector<stream_rec *> v;
  for (stream_rec *s : g_streams)
    if ((device < 0 || s->device == device) && s->done < s->enq) v.push_back(s);
  auto newer = [](const stream_rec *a, const stream_rec *b) { return a->last_issue > b->last_issue; };
  std::sort(v.begin(), v.end(), newer);
  if (cfg.drain_seed == 0 || v.size() < 2) return v;
  uint64_t w = ++g_drain_waits;
  if (v.size() <= 3) {
    for (uint64_t i = (cfg.drain_seed + w) % (v.size() == 2 ? 2 : 6); i > 0; i--) std::next_permutation(v.begin(), v.end(), newer);
  } else {
    uint64_t st = cfg.drain_seed * 0x100000001b3ull + w;
    for (size_t i = v.size() - 1; i > 0; i--) std::swap(v[i], v[splitmix(st) % (i + 1)]);
  }
  return v;
}

/* Drains every stream of `device` (or all devices when -1) in drain_order, each as far as
 * its own order and cudaStreamWaitEvent allow. */
void drain(int device) {
  for (std::vector<stream_rec *> v; !(v = drain_order(device)).empty();)
    for (stream_rec *s : v) complete_all(s);
}

/* A host wait for s up to seq. With a drain seed, the streams that the order puts before s
 * run first (a GPU may have run them meanwhile), so a race shows whichever stream was issued
 * last; seed 0 runs only what the wait needs (a host read before its sync shows). */
void host_complete(stream_rec *s, uint64_t seq) {
  if (cfg.drain_seed)
    for (stream_rec *o : drain_order(s->device)) {
      if (o == s) break;
      complete_all(o);
    }
  complete(s, seq);
}

void enqueue_op(stream_rec *s, op *o) {
  if (s->cap) {   /* captured: a node of the graph (records and waits change the edges instead) */
    if (o->body && !o->is_record) capture_node(s, o->what, o->body, o->is_kernel, {}, {});
    delete o;
    return;
  }
  o->seq = ++s->enq;
  o->issue = ++g_issue;
  o->device = s->device;
  /* The legacy default stream and the blocking streams of its device order each other. */
  if (s->legacy) {
    for (stream_rec *b : g_streams)
      if (b != s && b->device == s->device && !(b->flags & cudaStreamNonBlocking) && b->enq > 0) o->deps.push_back({b, b->enq});
  } else if (!(s->flags & cudaStreamNonBlocking)) {
    stream_rec *l = g_legacy[s->device];
    if (l->enq > 0) o->deps.push_back({l, l->enq});
  }
  s->last_issue = o->issue;
  if (g_graph.on && o->body && !o->is_record) {   /* device work: a node, and the edges into it */
    long id = ++g_graph.nodes;
    g_graph.streams.insert(s->id);
    graph_line("node %ld %d %s", id, s->id, o->what.c_str());
    for (auto &w : s->wait_from) graph_line("edge %ld %ld %p", w.first, id, w.second);
    s->wait_from.clear();
    s->last_node = id;
  }
  s->q.push_back(o);
  if (cfg.eager) complete(s, o->seq);
}

void enqueue_fn(stream_rec *s, std::string what, std::function<void()> fn, bool kernel = false) {
  op *o = new op;
  o->what = std::move(what);
  o->body = std::move(fn);
  o->is_kernel = kernel;
  enqueue_op(s, o);
}

/* ===================================================================================== */
/* the executor: faults during device work come back here                                 */
/* ===================================================================================== */

sigjmp_buf g_fault_jmp;
bool g_fault_armed;
std::string g_running;      /* what device work is running, for diagnostics */
thread_local void *tl_altstack;
struct sigaction g_old_segv, g_old_bus;

void on_fault(int sig, siginfo_t *si, void *ucv);

void install_handlers() {
  static bool done = false;
  if (done) return;
  done = true;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
}

void ensure_altstack() {
  if (tl_altstack) return;
  size_t n = 256 * 1024;
  tl_altstack = malloc(n);
  stack_t ss;
  ss.ss_sp = tl_altstack;
  ss.ss_size = n;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
}

exec_scope::exec_scope() {
  if (g_exec_depth++ == 0) {
    install_handlers();
    ensure_altstack();
    g_exec_thread = std::this_thread::get_id();
    expose_all(true);
  }
}

exec_scope::~exec_scope() {
  if (--g_exec_depth == 0) expose_all(false);
}

struct kernel_run;
void run_kernel(kernel_run *k);
void abandon_kernel();

void execute(op *o) {
  if (g_sticky[o->device] != cudaSuccess) {      /* a faulted context runs nothing more */
    if (cfg.verbose) fprintf(stderr, "cuda_emu: skipped %s (sticky error)\n", o->what.c_str());
    return;
  }
  if (!o->body) return;
  if (cfg.verbose) fprintf(stderr, "cuda_emu: run %s\n", o->what.c_str());
  /* Work may run inside other work (run_ready_work): the outer one's state comes back after. */
  int saved_dev = g_exec_device;
  bool saved_armed = g_fault_armed;
  sigjmp_buf saved_jmp;
  memcpy(saved_jmp, g_fault_jmp, sizeof saved_jmp);
  std::string saved_running = g_running;
  g_exec_device = o->device;
  g_running = o->what;
  if (sigsetjmp(g_fault_jmp, 1) == 0) {
    g_fault_armed = true;
    o->body();
    g_fault_armed = false;
  } else {
    g_fault_armed = false;           /* a fault: on_fault reported it and made it sticky */
    abandon_kernel();
  }
  if (!check_canaries(o->what.c_str())) make_sticky(o->device, cudaErrorIllegalAddress);
  g_exec_device = saved_dev;
  g_running = saved_running;
  memcpy(g_fault_jmp, saved_jmp, sizeof saved_jmp);
  g_fault_armed = saved_armed;
}

/* ===================================================================================== */
/* fibers                                                                                 */
/* ===================================================================================== */

struct stack_mem { char *base; size_t len; };   /* base: the guard page; the stack above it */
std::vector<stack_mem> g_stack_pool;
std::vector<stack_mem> g_all_stacks;

stack_mem get_stack() {
  if (!g_stack_pool.empty()) {
    stack_mem s = g_stack_pool.back();
    g_stack_pool.pop_back();
    return s;
  }
  size_t len = cfg.stack_bytes + PAGE;
  void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { fprintf(stderr, "cuda_emu: cannot map a fiber stack\n"); abort(); }
  mprotect(m, PAGE, PROT_NONE);
  stack_mem s{(char *)m, len};
  g_all_stacks.push_back(s);
  return s;
}

bool in_stack_guard(const void *p) {
  for (const stack_mem &s : g_all_stacks)
    if ((const char *)p >= s.base && (const char *)p < s.base + PAGE) return true;
  return false;
}

#if defined(__x86_64__)
extern "C" void emu_switch(void **save_sp, void *to_sp);
extern "C" void emu_fiber_start();
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch,.-emu_switch
  .globl emu_fiber_start
  .type emu_fiber_start,@function
emu_fiber_start:
  call *%r13
  ud2
  .size emu_fiber_start,.-emu_fiber_start
)");

struct fctx { void *sp = nullptr; };
void fctx_init(fctx *c, stack_mem s, void (*fn)()) {
  uintptr_t top = ((uintptr_t)(s.base + s.len)) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = (void *)emu_fiber_start;   /* ret target; after ret rsp == top (16-aligned) */
  *--sp = nullptr;                   /* rbp */
  *--sp = nullptr;                   /* rbx */
  *--sp = nullptr;                   /* r12 */
  *--sp = (void *)fn;                /* r13 */
  *--sp = nullptr;                   /* r14 */
  *--sp = nullptr;                   /* r15 */
  c->sp = sp;
}
inline void fctx_switch(fctx *from, fctx *to) { emu_switch(&from->sp, to->sp); }
#else
struct fctx { ucontext_t uc; };
void fctx_init(fctx *c, stack_mem s, void (*fn)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = s.base + PAGE;
  c->uc.uc_stack.ss_size = s.len - PAGE;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, fn, 0);
}
inline void fctx_switch(fctx *from, fctx *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* ===================================================================================== */
/* the scheduler of one block                                                             */
/* ===================================================================================== */

enum tstate : uint8_t { T_NEW, T_READY, T_WAIT_BLOCK, T_WAIT_WARP, T_DONE };
enum wkind : uint8_t { W_SYNCWARP, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ALL, W_ANY, W_MATCH, W_COLLECTIVE };
const char *WKIND_NAME[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                            "__ballot_sync", "__all_sync", "__any_sync", "__match_any_sync", "warp_collective"};

struct thread_rec {
  fctx ctx;
  stack_mem stack;
  bool has_stack;
  tstate state;
  uint3 idx;
  int linear, lane, warp;
  const char *file;        /* where it waits */
  int line;
  int pred;
  /* warp-op data */
  unsigned char val[16];
  void *out;
  int arg, width;
  const void *uniform;
  size_t ubytes;
  const char *what;
  unsigned result;
};

struct warp_group {
  wkind kind;
  unsigned mask;
  unsigned arrived;
  const char *file;
  int line;
  const char *what;
};

struct warp_rec {
  unsigned exists;      /* lanes present in the block */
  unsigned exited;
  std::vector<warp_group> groups;
};

struct kernel_run {
  launch_config c;
  const void *func;
  void (*run)(void *);
  void *ctx;
  void (*destroy)(void *);
  std::string name;       /* "k (file:line)" */
  size_t dyn;
  size_t smem_limit;      /* static + dynamic allowed */
};

kernel_run *g_k;                  /* the running launch */
thread_rec g_threads[MAX_THREADS];
warp_rec g_warps[MAX_THREADS / WARP];
int g_nthreads, g_live;
thread_rec *g_cur;
fctx g_sched;
std::deque<int> g_runq;
bool g_abort;
int g_bar_count;                  /* threads waiting at __syncthreads */
const char *g_bar_file;
int g_bar_line;
int g_bar_kind;                   /* -1 plain, else syncthreads_reduce op */

/* Shared memory: one arena, static variables from its start, the dynamic part ending at its
 * end (so an overrun of the dynamic part hits the guard page behind it). */
char *g_smem;
size_t g_smem_len;
size_t g_static_used, g_static_hwm;
unsigned long g_block_gen;
char *g_dyn;
alignas(64) char g_scratch[MAX_THREADS / WARP][WARP_SCRATCH_BYTES];
unsigned long g_scratch_gen[MAX_THREADS / WARP];

void ensure_smem() {
  if (g_smem) return;
  g_smem_len = (SMEM_OPTIN + PAGE - 1) / PAGE * PAGE;
  char *m = (char *)mmap(nullptr, g_smem_len + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  mprotect(m + PAGE, g_smem_len, PROT_READ | PROT_WRITE);
  g_smem = m + PAGE;
}

std::string where_thread(const thread_rec *t) {
  char b[160];
  snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z, t->idx.x, t->idx.y,
           t->idx.z);
  return b;
}

[[noreturn]] void abort_block();

/* Fails the launch with a report (from a fiber or the scheduler). */
void fail_launch(cudaError_t err, const std::string &msg) {
  note("kernel %s: %s", g_k ? g_k->name.c_str() : "?", msg.c_str());
  make_sticky(g_exec_device, err);
  g_abort = true;
}

void push_ready(int t) {
  g_threads[t].state = T_READY;
  g_runq.push_back(t);
}

void push_front_ready(int t) {
  g_threads[t].state = T_READY;
  g_runq.push_front(t);
}

/* Called on a fiber: gives control back to the scheduler. */
inline void yield_to_sched(thread_rec *t) { fctx_switch(&t->ctx, &g_sched); }

/* Called on a fiber that waits: runs the next ready thread directly when it has started
 * already (one switch instead of two through the scheduler), else goes to the scheduler.
 * Whoever switches to a fiber sets g_cur and threadIdx for it first. */
inline void wait_here(thread_rec *t) {
  if (!g_abort && !g_runq.empty()) {
    thread_rec *n = &g_threads[g_runq.front()];
    if (n->state != T_NEW && n != t) {
      g_runq.pop_front();
      n->state = T_READY;
      g_cur = n;
      threadIdx = n->idx;
      fctx_switch(&t->ctx, &n->ctx);
      return;
    }
  }
  fctx_switch(&t->ctx, &g_sched);
}

[[noreturn]] void abort_block() {
  thread_rec *t = g_cur;
  g_abort = true;
  for (;;) yield_to_sched(t);
}

void after_exit(thread_rec *t);

void fiber_main() {
  g_k->run(g_k->ctx);
  thread_rec *t = g_cur;
  t->state = T_DONE;
  g_live--;
  after_exit(t);   /* an exited thread no longer holds barriers */
  for (;;) yield_to_sched(t);
}

std::string lanes_str(unsigned m) {
  std::string s;
  for (int i = 0; i < 32;) {
    if (!(m >> i & 1)) { i++; continue; }
    int j = i;
    while (j + 1 < 32 && (m >> (j + 1) & 1)) j++;
    char b[24];
    snprintf(b, sizeof b, j > i ? "%s%d-%d" : "%s%d", s.empty() ? "" : ",", i, j);
    s += b;
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

void release_barrier() {
  int n = 0, first = -1;
  for (int i = 0; i < g_nthreads; i++)
    if (g_threads[i].state == T_WAIT_BLOCK) { n += g_threads[i].pred != 0; if (first < 0) first = i; }
  unsigned res = 0;
  if (g_bar_kind == 0) res = (unsigned)n;
  else if (g_bar_kind == 1) res = n == g_bar_count;
  else if (g_bar_kind == 2) res = n > 0;
  g_bar_count = 0;
  g_bar_file = nullptr;
  if (cfg.thread_reverse) {
    for (int i = g_nthreads - 1; i >= 0; i--)
      if (g_threads[i].state == T_WAIT_BLOCK) { g_threads[i].result = res; push_ready(i); }
  } else {
    for (int i = 0; i < g_nthreads; i++)
      if (g_threads[i].state == T_WAIT_BLOCK) { g_threads[i].result = res; push_ready(i); }
  }
}

bool group_complete(const warp_rec &w, const warp_group &g) {
  unsigned need = g.mask & w.exists & ~w.exited;
  return (need & ~g.arrived) == 0;
}

void finish_group(int wi, size_t gi) {
  warp_rec &w = g_warps[wi];
  warp_group g = w.groups[gi];
  w.groups.erase(w.groups.begin() + gi);
  thread_rec *base = &g_threads[wi * WARP];
  if (g.kind == W_COLLECTIVE) {
    unsigned missing = g.mask & ~g.arrived;
    if (missing) {
      fail_launch(cudaErrorLaunchFailure,
                  "divergence: " + std::string(g.what) + " is warp-collective but lanes " + lanes_str(missing) + " of warp " +
                      std::to_string(wi) + " exited before it (" + g.file + ":" + std::to_string(g.line) + ")");
      return;
    }
    int ref = __builtin_ctz(g.arrived);
    for (int l = 0; l < 32; l++)
      if ((g.arrived >> l & 1) && base[l].ubytes &&
          (base[l].ubytes != base[ref].ubytes || memcmp(base[l].uniform, base[ref].uniform, base[l].ubytes) != 0)) {
        fail_launch(cudaErrorLaunchFailure, std::string(g.what) + ": lane " + std::to_string(l) + " of warp " +
                                                std::to_string(wi) + " passed other arguments than lane " +
                                                std::to_string(ref) + " (they must be the same across the warp)");
        return;
      }
  } else if (g.kind >= W_SHFL_IDX && g.kind <= W_SHFL_XOR) {
    for (int l = 0; l < 32; l++) {
      if (!(g.arrived >> l & 1)) continue;
      thread_rec &t = base[l];
      int width = t.width;
      if (width < 1 || width > 32 || (width & (width - 1))) {
        fail_launch(cudaErrorLaunchFailure, std::string(WKIND_NAME[g.kind]) + ": width " + std::to_string(width) +
                                                " is not a power of two from 1 to 32");
        return;
      }
      int seg = l & ~(width - 1), src;
      switch (g.kind) {
        case W_SHFL_IDX: src = seg + (((t.arg % width) + width) % width); break;
        case W_SHFL_UP: src = (l - seg) >= t.arg ? l - t.arg : l; break;
        case W_SHFL_DOWN: src = (l - seg) + t.arg < width ? l + t.arg : l; break;
        default: src = l ^ t.arg; if (src >= seg + width || src < 0 || src > 31) src = l; break;
      }
      size_t bytes = t.ubytes;
      if (src >= 0 && src < 32 && (g.arrived >> src & 1)) memcpy(t.out, base[src].val, bytes);
      else memset(t.out, 0xFF, bytes);   /* from a lane not taking part: undefined; poison */
    }
  } else if (g.kind == W_BALLOT || g.kind == W_ALL || g.kind == W_ANY) {
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
      if ((g.arrived >> l & 1) && base[l].pred) ballot |= 1u << l;
    unsigned r = g.kind == W_BALLOT ? ballot : g.kind == W_ALL ? (ballot == g.arrived) : (ballot != 0);
    for (int l = 0; l < 32; l++)
      if (g.arrived >> l & 1) base[l].result = r;
  } else if (g.kind == W_MATCH) {
    for (int l = 0; l < 32; l++) {
      if (!(g.arrived >> l & 1)) continue;
      unsigned m = 0;
      for (int o = 0; o < 32; o++)
        if ((g.arrived >> o & 1) && base[o].ubytes == base[l].ubytes && !memcmp(base[o].val, base[l].val, base[l].ubytes))
          m |= 1u << o;
      base[l].result = m;
    }
  }
  /* The released lanes run next: a warp runs ahead as far as it can (to a block barrier or
   * its end) before the other warps move, the most skew between warps CUDA allows, so a
   * missing __syncthreads between warps shows. */
  if (cfg.thread_reverse) {
    for (int l = 0; l < 32; l++)
      if (g.arrived >> l & 1) push_front_ready(wi * WARP + l);
  } else {
    for (int l = 31; l >= 0; l--)
      if (g.arrived >> l & 1) push_front_ready(wi * WARP + l);
  }
}

void check_warp_groups(int wi) {
  warp_rec &w = g_warps[wi];
  for (size_t gi = 0; gi < w.groups.size();) {
    if (group_complete(w, w.groups[gi])) {
      finish_group(wi, gi);
      if (g_abort) return;
    } else {
      gi++;
    }
  }
}

void after_exit(thread_rec *t) {
  warp_rec &w = g_warps[t->warp];
  w.exited |= 1u << t->lane;
  if (g_bar_count > 0 && g_bar_count == g_live) release_barrier();
  check_warp_groups(t->warp);
}

std::string site(const char *file, int line) { return std::string(file ? file : "?") + ":" + std::to_string(line); }

/* A lane arrives at a warp operation; returns when the operation completed. */
void warp_arrive(wkind kind, unsigned mask, const char *file, int line, const char *what) {
  thread_rec *t = g_cur;
  if (!t) return;
  warp_rec &w = g_warps[t->warp];
  unsigned bit = 1u << t->lane;
  const char *name = kind == W_COLLECTIVE ? what : WKIND_NAME[kind];
  if (!(mask & bit)) {
    fail_launch(cudaErrorLaunchFailure, where_thread(t) + ": " + std::string(name) + " at " + site(file, line) + " with mask 0x" +
                                            ([&] { char b[16]; snprintf(b, sizeof b, "%08x", mask); return std::string(b); })() +
                                            " that does not name the calling lane " + std::to_string(t->lane));
    abort_block();
  }
  warp_group *g = nullptr;
  for (warp_group &x : w.groups)
    if (x.mask & bit) { g = &x; break; }
  if (g) {
    bool same = g->kind == kind && g->mask == mask && (kind != W_COLLECTIVE || !strcmp(g->what, what));
    if (!same) {
      char b[512];
      snprintf(b, sizeof b,
               "divergence in warp %d: lane %d reached %s (mask 0x%08x) at %s while lanes %s wait at %s (mask 0x%08x) "
               "at %s",
               t->warp, t->lane, name, mask, site(file, line).c_str(), lanes_str(g->arrived).c_str(),
               g->kind == W_COLLECTIVE ? g->what : WKIND_NAME[g->kind], g->mask, site(g->file, g->line).c_str());
      fail_launch(cudaErrorLaunchFailure, std::string(b) + " [" + where_thread(t) + "]");
      abort_block();
    }
  } else {
    w.groups.push_back(warp_group{kind, mask, 0, file, line, what});
    g = &w.groups.back();
  }
  g->arrived |= bit;
  t->state = T_WAIT_WARP;
  t->file = file;
  t->line = line;
  check_warp_groups(t->warp);
  if (g_abort) abort_block();
  wait_here(t);
  if (g_abort) abort_block();
}

/* Describes where every unfinished thread waits (a barrier nobody can complete). */
std::string deadlock_report() {
  std::map<std::string, std::vector<int>> by;
  for (int i = 0; i < g_nthreads; i++) {
    thread_rec &t = g_threads[i];
    if (t.state == T_WAIT_BLOCK) by["__syncthreads at " + site(t.file, t.line)].push_back(i);
    else if (t.state == T_WAIT_WARP) {
      const warp_rec &w = g_warps[t.warp];
      for (const warp_group &g : w.groups)
        if (g.arrived >> t.lane & 1) {
          char b[256];
          snprintf(b, sizeof b, "%s (mask 0x%08x) at %s", g.kind == W_COLLECTIVE ? g.what : WKIND_NAME[g.kind], g.mask,
                   site(g.file, g.line).c_str());
          by[b].push_back(i);
        }
    }
  }
  std::string s;
  for (auto &kv : by) {
    const std::vector<int> &v = kv.second;
    char b[96];
    snprintf(b, sizeof b, "%zu thread(s) [%d..%d] wait at ", v.size(), v.front(), v.back());
    if (!s.empty()) s += "; ";
    s += b + kv.first;
  }
  int exited = 0;
  for (int i = 0; i < g_nthreads; i++) exited += g_threads[i].state == T_DONE;
  s += "; " + std::to_string(exited) + " thread(s) exited";
  return s;
}

/* Runs one block to completion; false if the launch failed. */
bool run_block(unsigned bx, unsigned by, unsigned bz) {
  kernel_run *k = g_k;
  blockIdx = uint3{bx, by, bz};
  g_block_gen++;
  g_static_used = 0;
  if (g_static_hwm) memset(g_smem, 0xFF, g_static_hwm);
  if (k->dyn) memset(g_dyn, 0xFF, k->dyn);
  unsigned nx = k->c.block.x, ny = k->c.block.y;
  g_nthreads = (int)(nx * ny * k->c.block.z);
  g_live = g_nthreads;
  g_bar_count = 0;
  g_bar_file = nullptr;
  g_abort = false;
  g_runq.clear();
  int nwarps = (g_nthreads + WARP - 1) / WARP;
  for (int wi = 0; wi < nwarps; wi++) {
    int n = std::min((int)WARP, g_nthreads - wi * WARP);
    g_warps[wi].exists = n == 32 ? 0xffffffffu : ((1u << n) - 1);
    g_warps[wi].exited = 0;
    g_warps[wi].groups.clear();
  }
  for (int i = 0; i < g_nthreads; i++) {
    thread_rec &t = g_threads[i];
    t.has_stack = false;
    t.state = T_NEW;
    t.idx = uint3{(unsigned)i % nx, ((unsigned)i / nx) % ny, (unsigned)i / (nx * ny)};
    t.linear = i;
    t.lane = i % WARP;
    t.warp = i / WARP;
  }
  if (cfg.thread_reverse)
    for (int i = g_nthreads - 1; i >= 0; i--) g_runq.push_back(i);
  else
    for (int i = 0; i < g_nthreads; i++) g_runq.push_back(i);
  while (!g_runq.empty() && !g_abort) {
    int i = g_runq.front();
    g_runq.pop_front();
    thread_rec &t = g_threads[i];
    if (t.state == T_NEW) {
      t.stack = get_stack();
      t.has_stack = true;
      fctx_init(&t.ctx, t.stack, fiber_main);
    }
    t.state = T_READY;
    g_cur = &t;
    threadIdx = t.idx;
    fctx_switch(&g_sched, &t.ctx);
    thread_rec *r = g_cur;   /* the fiber that came back (fibers switch among themselves) */
    g_cur = nullptr;
    if (r->state == T_DONE && r->has_stack) {
      g_stack_pool.push_back(r->stack);
      r->has_stack = false;
    }
  }
  if (!g_abort && g_live > 0)
    fail_launch(cudaErrorLaunchFailure, "deadlock in block (" + std::to_string(bx) + "," + std::to_string(by) + "," +
                                            std::to_string(bz) + "): " + deadlock_report() +
                                            " (a barrier that part of the block never reaches: divergence)");
  /* Abandoned fibers (a failure): their stacks go back to the pool. */
  for (int i = 0; i < g_nthreads; i++)
    if (g_threads[i].has_stack) {
      g_stack_pool.push_back(g_threads[i].stack);
      g_threads[i].has_stack = false;
    }
  return !g_abort;
}

uint64_t g_launch_index;

void run_kernel(kernel_run *k) {
  ensure_smem();
  g_k = k;
  gridDim = k->c.grid;
  blockDim = k->c.block;
  g_dyn = k->dyn ? (char *)(((uintptr_t)(g_smem + g_smem_len - k->dyn)) & ~(uintptr_t)127) : g_smem + g_smem_len;
  uint64_t nb = (uint64_t)k->c.grid.x * k->c.grid.y * k->c.grid.z;
  uint64_t li = ++g_launch_index;
  std::vector<uint64_t> order;
  if (cfg.block_order == 2 && nb > 1) {
    order.resize(nb);
    for (uint64_t i = 0; i < nb; i++) order[i] = i;
    uint64_t st = cfg.seed * 0x100000001b3ull + li;
    for (uint64_t i = nb - 1; i > 0; i--) std::swap(order[i], order[splitmix(st) % (i + 1)]);
  }
  uint64_t gx = k->c.grid.x, gy = k->c.grid.y;
  for (uint64_t n = 0; n < nb; n++) {
    uint64_t b = order.empty() ? (cfg.block_order == 1 ? nb - 1 - n : n) : order[n];
    if (!run_block((unsigned)(b % gx), (unsigned)((b / gx) % gy), (unsigned)(b / (gx * gy)))) break;
  }
  g_k = nullptr;
}

/* After a fault inside a kernel: the block's fibers are dropped, their stacks reused. */
void abandon_kernel() {
  for (int i = 0; i < g_nthreads; i++)
    if (g_threads[i].has_stack) {
      g_stack_pool.push_back(g_threads[i].stack);
      g_threads[i].has_stack = false;
    }
  g_cur = nullptr;
  g_k = nullptr;
}

/* ===================================================================================== */
/* the fault handler                                                                      */
/* ===================================================================================== */

void describe_addr(char *buf, size_t n, void *addr) {
  alloc *a = find_mapping(addr);
  if (a) {
    char *p = (char *)addr;
    if (a->device >= 0 && !g_by_data.count((uintptr_t)a->data))
      snprintf(buf, n, "%p inside a freed %zu-byte device allocation (base %p): use after cudaFree", addr, a->size,
               (void *)a->data);
    else if (a->device < 0 && !g_by_data.count((uintptr_t)a->data))
      snprintf(buf, n, "%p inside a freed %zu-byte pinned host allocation (base %p): use after cudaFreeHost", addr,
               a->size, (void *)a->data);
    else if (p >= a->data + a->size)
      snprintf(buf, n, "%p, %zu bytes past the end of a %zu-byte %s allocation (base %p)", addr,
               (size_t)(p - (a->data + a->size)), a->size, a->device >= 0 ? "device" : "pinned host", (void *)a->data);
    else if (p < a->data)
      snprintf(buf, n, "%p, %zu bytes before the start of a %zu-byte %s allocation (base %p)", addr, (size_t)(a->data - p),
               a->size, a->device >= 0 ? "device" : "pinned host", (void *)a->data);
    else
      snprintf(buf, n, "%p inside a %zu-byte allocation of cuda:%d (base %p, offset %zu) that is not accessible here", addr,
               a->size, a->device, (void *)a->data, (size_t)(p - a->data));
    return;
  }
  if (g_smem && (char *)addr >= g_smem + g_smem_len && (char *)addr < g_smem + g_smem_len + PAGE) {
    snprintf(buf, n, "%p, past the end of the block's dynamic shared memory (%zu bytes)", addr, g_k ? g_k->dyn : (size_t)0);
    return;
  }
  if (in_stack_guard(addr)) {
    snprintf(buf, n, "%p: a CUDA thread's stack overflowed (SHARD_EMU_STACK_KB=%zu)", addr, cfg.stack_bytes / 1024);
    return;
  }
  snprintf(buf, n, "%p (not emulated device memory: a host pointer or garbage)", addr);
}

void on_fault(int sig, siginfo_t *si, void *ucv) {
  void *addr = si->si_addr;
  bool write = false;
#if defined(__x86_64__)
  ucontext_t *uc = (ucontext_t *)ucv;
  write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  bool gp = si->si_code == SI_KERNEL;   /* general protection: a misaligned vector access, mostly */
#else
  bool gp = false;
#endif
  char desc[512];
  if (g_fault_armed && g_exec_depth > 0 && std::this_thread::get_id() == g_exec_thread) {
    if (gp) snprintf(desc, sizeof desc, "general protection fault (a misaligned vector load/store, most likely)");
    else describe_addr(desc, sizeof desc, addr);
    std::string who = g_k && g_cur ? "kernel " + g_k->name + " " + where_thread(g_cur) : g_running;
    note("%s: invalid %s at %s", who.c_str(), gp ? "access" : write ? "write" : "read", desc);
    make_sticky(g_exec_device, gp ? cudaErrorMisalignedAddress : cudaErrorIllegalAddress);
    g_fault_armed = false;
    g_abort = true;
    siglongjmp(g_fault_jmp, 1);
  }
  alloc *a = find_mapping(addr);
  if (a && g_exec_depth > 0 && std::this_thread::get_id() != g_exec_thread) {
    /* a helper thread of device work (OpenBLAS under cuBLASLt): cannot unwind it, so stop */
    describe_addr(desc, sizeof desc, addr);
    fprintf(stderr, "cuda_emu: %s (on a helper thread): invalid %s at %s\n", g_running.c_str(), write ? "write" : "read",
            desc);
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  if (a && a->device >= 0) {
    describe_addr(desc, sizeof desc, addr);
    fprintf(stderr, "cuda_emu: host code %s device memory at %s; device memory is only accessible to device work "
            "(kernels, copies, library calls on a stream). Host backtrace:\n", write ? "wrote" : "read", desc);
    void *bt[64];
    int n = backtrace(bt, 64);
    backtrace_symbols_fd(bt, n, 2);
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  /* Not ours: the previous disposition. */
  struct sigaction *old = sig == SIGSEGV ? &g_old_segv : &g_old_bus;
  if (old->sa_flags & SA_SIGINFO) {
    if (old->sa_sigaction) { old->sa_sigaction(sig, si, ucv); return; }
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);   /* returning re-executes the access, which now kills the process */
}

/* ===================================================================================== */
/* helpers for the API                                                                    */
/* ===================================================================================== */

cudaError_t ret(cudaError_t e) { return set_error(e); }

/* The sticky error of the current device, if any (every call returns it from then on). */
cudaError_t sticky_now() {
  init_devices();
  return g_sticky[tl_device];
}

#define API_BEGIN guard g_(g_lock); init_devices(); { cudaError_t s_ = sticky_now(); if (s_ != cudaSuccess) return ret(s_); }

enum where { W_PAGEABLE, W_PINNED, W_DEVICE };
struct ptr_info { where w; alloc *a; };

ptr_info classify(const void *p) {
  alloc *a = find_live(p);
  if (!a) return {W_PAGEABLE, nullptr};
  return {a->device >= 0 ? W_DEVICE : W_PINNED, a};
}

/* [p, p + n) inside one live allocation? */
bool in_range(const alloc *a, const void *p, size_t n) {
  return a && (const char *)p >= a->data && (size_t)((const char *)p - a->data) + n <= a->size;
}

std::map<const void *, int> g_max_dyn;

}  // namespace

/* ===================================================================================== */
/* device-side entry points                                                               */
/* ===================================================================================== */

void syncthreads(const char *file, int line) { (void)syncthreads_reduce(-1, 0, file, line); }

int syncthreads_reduce(int op, int pred, const char *file, int line) {
  thread_rec *t = g_cur;
  if (!t) return 0;
  if (g_bar_count > 0 && (g_bar_line != line || strcmp(g_bar_file, file) != 0 || g_bar_kind != op)) {
    int other = -1;
    for (int i = 0; i < g_nthreads; i++)
      if (g_threads[i].state == T_WAIT_BLOCK) { other = i; break; }
    fail_launch(cudaErrorLaunchFailure, "divergence: " + where_thread(t) + " reached __syncthreads at " + site(file, line) +
                                            " while " + std::to_string(g_bar_count) + " thread(s) (first: " +
                                            std::to_string(other) + ") wait at __syncthreads at " +
                                            site(g_bar_file, g_bar_line));
    abort_block();
  }
  if (g_bar_count == 0) { g_bar_file = file; g_bar_line = line; g_bar_kind = op; }
  t->state = T_WAIT_BLOCK;
  t->file = file;
  t->line = line;
  t->pred = pred;
  g_bar_count++;
  if (g_bar_count == g_live) release_barrier();
  wait_here(t);
  if (g_abort) abort_block();
  return (int)t->result;
}

void syncwarp(unsigned mask, const char *file, int line) { warp_arrive(W_SYNCWARP, mask, file, line, nullptr); }

void shfl(int kind, unsigned mask, const void *val, void *out, size_t bytes, int arg, int width, const char *file, int line) {
  thread_rec *t = g_cur;
  if (!t) { memcpy(out, val, bytes); return; }
  memcpy(t->val, val, bytes);
  t->out = out;
  t->ubytes = bytes;
  t->arg = arg;
  t->width = width;
  warp_arrive((wkind)(W_SHFL_IDX + kind), mask, file, line, nullptr);
}

unsigned vote(int kind, unsigned mask, int pred, const char *file, int line) {
  thread_rec *t = g_cur;
  if (!t) return 0;
  t->pred = pred;
  warp_arrive((wkind)(W_BALLOT + kind), mask, file, line, nullptr);
  return t->result;
}

unsigned match_any(unsigned mask, const void *val, size_t bytes, const char *file, int line) {
  thread_rec *t = g_cur;
  if (!t) return 0;
  memcpy(t->val, val, bytes);
  t->ubytes = bytes;
  warp_arrive(W_MATCH, mask, file, line, nullptr);
  return t->result;
}

void warp_collective_at(const char *what, const void *uniform, size_t bytes, const char *file, int line) {
  thread_rec *t = g_cur;
  if (!t) return;
  t->uniform = uniform;
  t->ubytes = uniform ? bytes : 0;
  warp_arrive(W_COLLECTIVE, g_warps[t->warp].exists, file, line, what);
}

void warp_collective(const char *what, const void *uniform, size_t bytes) {
  warp_collective_at(what, uniform, bytes, "?", 0);
}

bool in_kernel() { return g_cur != nullptr; }
int lane() { return g_cur ? g_cur->lane : -1; }
int warp() { return g_cur ? g_cur->warp : -1; }
unsigned warp_lanes() { return g_cur ? g_warps[g_cur->warp].exists : 0; }
unsigned lane_id_of_current() { return g_cur ? (unsigned)g_cur->lane : 0; }
const char *kernel_name() { return g_k ? g_k->name.c_str() : "host"; }

void device_fail(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (!g_cur) {
    fprintf(stderr, "cuda_emu: %s (called outside a kernel)\n", buf);
    abort();
  }
  fail_launch(cudaErrorLaunchFailure, where_thread(g_cur) + ": " + buf);
  abort_block();
}

void *dynamic_shared() { return g_dyn; }

void *warp_scratch() {
  if (!g_cur) return nullptr;
  int w = g_cur->warp;
  if (g_scratch_gen[w] != g_block_gen) {   /* first use in this block: fresh NaN bytes */
    memset(g_scratch[w], 0xFF, WARP_SCRATCH_BYTES);
    g_scratch_gen[w] = g_block_gen;
  }
  return g_scratch[w];
}

void *static_shared(void **slot, unsigned long *generation, size_t bytes, size_t align) {
  if (*generation == g_block_gen) return *slot;
  size_t off = (g_static_used + align - 1) / align * align;
  if (off + bytes > SMEM_DEFAULT || off + bytes + (g_k ? g_k->dyn : 0) > (g_k ? g_k->smem_limit : SMEM_DEFAULT))
    device_fail("static __shared__ memory (%zu bytes) plus dynamic (%zu bytes) exceeds the limit (48 KiB static, "
                "%zu in all)", off + bytes, g_k ? g_k->dyn : (size_t)0, g_k ? g_k->smem_limit : SMEM_DEFAULT);
  g_static_used = off + bytes;
  if (g_static_used > g_static_hwm) {
    memset(g_smem + g_static_hwm, 0xFF, g_static_used - g_static_hwm);
    g_static_hwm = g_static_used;
  }
  *slot = g_smem + off;
  *generation = g_block_gen;
  return *slot;
}

long long clock64_now() { return (long long)(now_ms() * 1e6); }

void launch_grid(const launch_config &c, const void *func, void (*run)(void *), void *ctx, void (*destroy)(void *)) {
  guard g_(g_lock);
  init_devices();
  auto fail = [&](cudaError_t e, const char *why) {
    if (cfg.verbose) fprintf(stderr, "cuda_emu: launch of %s (%s:%d) refused: %s\n", c.name, c.file, c.line, why);
    destroy(ctx);
    set_error(e);
  };
  if (sticky_now() != cudaSuccess) return fail(sticky_now(), "sticky error");
  stream_rec *s = resolve(c.stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle, "invalid stream");
  if (cudaError_t e = stream_usable(s, "a kernel launch")) return fail(e, "the stream's capture forbids it");
  if (!func) return fail(cudaErrorInvalidDeviceFunction, "null kernel");
  const dim3 &b = c.block, &gd = c.grid;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024)
    return fail(cudaErrorInvalidConfiguration, "block dimensions");
  if (gd.x == 0 || gd.y == 0 || gd.z == 0 || gd.x > 2147483647u || gd.y > (unsigned)cfg.max_grid_y || gd.z > 65535)
    return fail(cudaErrorInvalidConfiguration, "grid dimensions");
  size_t limit = SMEM_DEFAULT;
  auto it = g_max_dyn.find(func);
  if (it != g_max_dyn.end()) limit = (size_t)it->second;
  if (c.smem > limit) return fail(cudaErrorInvalidValue, "dynamic shared memory above the kernel's limit");
  g_count.launches++;
  kernel_run *k = new kernel_run;
  k->c = c;
  k->func = func;
  k->run = run;
  k->ctx = ctx;
  k->destroy = destroy;
  k->dyn = c.smem;
  k->smem_limit = it != g_max_dyn.end() ? SMEM_OPTIN : SMEM_DEFAULT;
  char nm[512];
  snprintf(nm, sizeof nm, "%s (%s:%d)", c.name, c.file, c.line);
  k->name = nm;
  std::shared_ptr<kernel_run> holder(k, [](kernel_run *p) { p->destroy(p->ctx); delete p; });
  enqueue_fn(s, "kernel " + k->name, [holder] { run_kernel(holder.get()); }, true);
}

/* ===================================================================================== */
/* emu_api.h                                                                              */
/* ===================================================================================== */

cudaError_t enqueue(cudaStream_t stream, const char *what, std::function<void()> work) {
  guard g_(g_lock);
  init_devices();
  if (sticky_now() != cudaSuccess) return set_error(sticky_now());
  stream_rec *s = resolve(stream);
  if (!s) return set_error(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = stream_usable(s, what ? what : "library call")) return set_error(e);
  g_count.library_calls++;
  enqueue_fn(s, what ? what : "library call", std::move(work));
  return cudaSuccess;
}

bool run_ready_work() {
  guard g_(g_lock);
  exec_scope x;
  for (stream_rec *s : g_streams) {
    if (s->busy || s->q.empty()) continue;
    bool ready = true;
    for (const dep &d : s->q.front()->deps) ready &= d.s->done >= d.seq;
    if (ready && (run_front(s) || g_requeued == 2)) return true;
  }
  return false;
}

void requeue_work(bool moved) { g_requeued = moved ? 2 : 1; }

/* enqueue_after on a capturing stream: a node after the points of this capture in `after`
 * (a captured point is {the capture, node index + 1}). */
cudaError_t capture_after(stream_rec *s, const char *what, std::function<void()> work, const work_ref *after, int n_after,
                          work_ref *out, relaunch_fn relaunch) {
  std::vector<int> extra;
  for (int i = 0; i < n_after; i++) {
    capture_rec *c = (capture_rec *)after[i].stream;
    if (c != s->cap || after[i].seq == 0 || after[i].seq > c->g->nodes.size()) {
      invalidate(s->cap, "captured work was to run after work outside the capture");
      return set_error(cudaErrorStreamCaptureIsolation);
    }
    extra.push_back((int)after[i].seq - 1);
  }
  g_count.library_calls++;
  int id = capture_node(s, what ? what : "library call", std::move(work), false, extra, std::move(relaunch));
  if (out) *out = work_ref{(cudaStream_t)s->cap, (unsigned long long)id + 1};
  return cudaSuccess;
}

cudaError_t enqueue_after(cudaStream_t stream, const char *what, std::function<void()> work,
                          const work_ref *after, int n_after, work_ref *out, relaunch_fn relaunch) {
  guard g_(g_lock);
  init_devices();
  if (sticky_now() != cudaSuccess) return set_error(sticky_now());
  stream_rec *s = resolve(stream);
  if (!s || n_after < 0 || (n_after > 0 && !after)) return set_error(s ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
  if (cudaError_t e = stream_usable(s, what ? what : "library call")) return set_error(e);
  if (s->cap) return capture_after(s, what, std::move(work), after, n_after, out, std::move(relaunch));
  op *o = new op;
  for (int i = 0; i < n_after; i++) {   /* a point names its stream record (never freed) */
    stream_rec *a = (stream_rec *)after[i].stream;
    if (std::find(g_streams.begin(), g_streams.end(), a) == g_streams.end()) { delete o; return set_error(cudaErrorInvalidResourceHandle); }
    if (a->done < after[i].seq) o->deps.push_back({a, after[i].seq});
  }
  g_count.library_calls++;
  o->what = what ? what : "library call";
  o->body = std::move(work);
  uint64_t seq = s->enq + 1;   /* o's place in s (eager mode runs and frees o inside enqueue_op) */
  enqueue_op(s, o);
  if (out) *out = work_ref{(cudaStream_t)s, seq};
  return cudaSuccess;
}

cudaError_t wait_work(work_ref at) {
  guard g_(g_lock);
  init_devices();
  stream_rec *s = (stream_rec *)at.stream;
  if (std::find(g_streams.begin(), g_streams.end(), s) == g_streams.end()) return set_error(cudaErrorInvalidResourceHandle);
  if (s->done < at.seq) {
    host_wait(true, "work_sync", "stream %d", s->id);
    host_complete(s, at.seq);
  }
  return sticky_now();
}

bool is_capturing(cudaStream_t stream) {
  guard g_(g_lock);
  stream_rec *s = resolve(stream);
  return s && s->cap;
}

bool is_device_range(const void *p, size_t bytes) {
  guard g_(g_lock);
  init_devices();
  alloc *a = find_live(p, bytes == 0);
  int dev = g_exec_depth > 0 ? g_exec_device : tl_device;
  if (!a || a->device != dev) return false;
  return (const char *)p >= a->data && (size_t)((const char *)p - a->data) + bytes <= a->size;
}

bool is_pinned_range(const void *p, size_t bytes) {
  guard g_(g_lock);
  alloc *a = find_live(p, bytes == 0);
  if (!a || a->device >= 0) return false;
  return (const char *)p >= a->data && (size_t)((const char *)p - a->data) + bytes <= a->size;
}

void fail_async(cudaError_t err, const char *what) {
  guard g_(g_lock);
  note("%s: %s", g_running.empty() ? "asynchronous failure" : g_running.c_str(), what ? what : "?");
  make_sticky(g_exec_depth > 0 ? g_exec_device : tl_device, err == cudaSuccess ? cudaErrorLaunchFailure : err);
}

counters get_counters() {
  guard g_(g_lock);
  return g_count;
}

void reset_counters() {
  guard g_(g_lock);
  g_count = counters{};
}

/* ===================================================================================== */
/* emu_test.h                                                                             */
/* ===================================================================================== */

const char *last_report() { return g_report.c_str(); }
long report_count() { return g_reports; }

void test_reset() {
  guard g_(g_lock);
  init_devices();
  for (stream_rec *s : g_streams) {
    for (op *o : s->q) delete o;
    s->q.clear();
    s->done = s->enq;
  }
  for (int d = 0; d < MAX_DEV; d++) g_sticky[d] = cudaSuccess;
  for (capture_rec *c : g_captures) {   /* captures end, unfinished */
    for (stream_rec *s : c->streams) { s->cap = nullptr; s->cap_deps.clear(); }
    c->ended = true;
  }
  g_captures.clear();
  tl_capture_mode = cudaStreamCaptureModeGlobal;
  tl_last = cudaSuccess;
  g_report.clear();
}

void set_block_order(int order, unsigned long long seed) {
  guard g_(g_lock);
  read_config();
  cfg.block_order = order;
  cfg.seed = seed;
}

void set_thread_order(bool reverse) {
  guard g_(g_lock);
  read_config();
  cfg.thread_reverse = reverse;
}

void set_eager(bool eager) {
  guard g_(g_lock);
  read_config();
  cfg.eager = eager;
}

void set_drop_event_waits(bool drop) {
  guard g_(g_lock);
  read_config();
  cfg.drop_event_waits = drop;
}

void set_drain_seed(unsigned long long seed) {
  guard g_(g_lock);
  read_config();
  cfg.drain_seed = seed;
  g_drain_waits = 0;
}

void graph_begin() {
  guard g_(g_lock);
  init_devices();
  g_graph = graph_state{};
  g_graph.on = true;
  for (stream_rec *s : g_streams) {
    s->last_node = 0;
    s->wait_from.clear();
  }
  for (event_rec *e : g_live_events) e->node = 0;
}

int graph_stream_id(cudaStream_t stream) {
  guard g_(g_lock);
  stream_rec *s = resolve(stream);
  return s ? s->id : -1;
}

std::string graph_end() {
  guard g_(g_lock);
  init_devices();
  std::string out = "# cuda_emu graph: stream <id> <creation index|legacy> <flags> <device>; node <id> <stream> <what>; "
                    "edge <from> <to> <event>; wait <stream> <event> <from|->; hostwait <kind> <what>\n";
  std::set<int> ids = g_graph.streams;
  for (stream_rec *s : g_live_streams) ids.insert(s->id);
  char buf[128];
  for (int id : ids) {
    const stream_rec *s = g_streams[id];
    if (s->legacy) snprintf(buf, sizeof buf, "stream %d legacy %u %d\n", id, s->flags, s->device);
    else if (s->lane) snprintf(buf, sizeof buf, "stream %d graph %u %d\n", id, s->flags, s->device);
    else snprintf(buf, sizeof buf, "stream %d %d %u %d\n", id, s->created, s->flags, s->device);
    out += buf;
  }
  for (const std::string &l : g_graph.lines) {
    out += l;
    out += '\n';
  }
  g_graph = graph_state{};
  for (stream_rec *s : g_streams) {
    s->last_node = 0;
    s->wait_from.clear();
  }
  return out;
}

size_t live_device_allocations() {
  guard g_(g_lock);
  size_t n = 0;
  for (auto &kv : g_by_data) n += kv.second->device >= 0;
  return n;
}

}  // namespace emu

using namespace emu;

/* ===================================================================================== */
/* the runtime API                                                                        */
/* ===================================================================================== */

static const struct { cudaError_t e; const char *name, *text; } ERRORS[] = {
  {cudaSuccess, "cudaSuccess", "no error"},
  {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
  {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
  {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
  {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
  {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
  {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
  {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
  {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
  {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
  {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
  {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
  {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
  {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
  {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
  {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
  {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
  {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
  {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
  {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
  {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
  {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
  {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
  {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction was encountered"},
  {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
  {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
  {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
  {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
  {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
  {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
  {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
  {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
  {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
  {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
  {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
  {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
  {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
  {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
  {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t err) {
  for (auto &e : ERRORS) if (e.e == err) return e.name;
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t err) {
  for (auto &e : ERRORS) if (e.e == err) return e.text;
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  guard g_(g_lock);
  cudaError_t s = sticky_now();
  cudaError_t r = tl_last;
  tl_last = cudaSuccess;
  return s != cudaSuccess ? s : r;
}

cudaError_t cudaPeekAtLastError(void) {
  guard g_(g_lock);
  cudaError_t s = sticky_now();
  return s != cudaSuccess ? s : tl_last;
}

cudaError_t cudaGetDeviceCount(int *count) {
  guard g_(g_lock);
  init_devices();
  if (!count) return ret(cudaErrorInvalidValue);
  *count = cfg.devices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  guard g_(g_lock);
  init_devices();
  if (!device) return ret(cudaErrorInvalidValue);
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  guard g_(g_lock);
  init_devices();
  if (device < 0 || device >= cfg.devices) return ret(cudaErrorInvalidDevice);
  tl_device = device;
  return cudaSuccess;
}

static void fill_props(cudaDeviceProp *p, int device) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (shard cuda_emu)");
  p->uuid[0] = (char)device;
  p->totalGlobalMem = cfg.mem_limit;
  p->sharedMemPerBlock = SMEM_DEFAULT;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = 2147483647;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = cfg.max_grid_y; p->maxGridSize[2] = 65535;
  p->clockRate = 1980000;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->deviceOverlap = 1;
  p->multiProcessorCount = cfg.sms;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->ECCEnabled = 1;
  p->pciBusID = 0x18 + device;
  p->asyncEngineCount = 3;
  p->unifiedAddressing = 1;
  p->memoryClockRate = 2619000;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 52428800;
  p->persistingL2CacheMaxSize = 32505856;
  p->maxThreadsPerMultiProcessor = 2048;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->localL1CacheSupported = 1;
  p->sharedMemPerMultiprocessor = SMEM_PER_SM;
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = SMEM_OPTIN;
  p->maxBlocksPerMultiProcessor = 32;
  p->reservedSharedMemPerBlock = 1024;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  guard g_(g_lock);
  init_devices();
  if (!prop) return ret(cudaErrorInvalidValue);
  if (device < 0 || device >= cfg.devices) return ret(cudaErrorInvalidDevice);
  fill_props(prop, device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  guard g_(g_lock);
  init_devices();
  if (!value) return ret(cudaErrorInvalidValue);
  if (device < 0 || device >= cfg.devices) return ret(cudaErrorInvalidDevice);
  cudaDeviceProp p;
  fill_props(&p, device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return ret(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

/* "It is also invalid to ... synchronize a broader handle which encompasses an active stream
 * capture, such as a device": cudaErrorStreamCaptureUnsupported, the device's captures invalidated. */
static cudaError_t device_capturing(int device, const char *what) {
  cudaError_t e = cudaSuccess;
  for (capture_rec *c : std::vector<capture_rec *>(g_captures.begin(), g_captures.end()))
    if (c->origin->device == device) {
      invalidate(c, what);
      e = cudaErrorStreamCaptureUnsupported;
    }
  return e;
}

cudaError_t cudaDeviceSynchronize(void) {
  API_BEGIN
  if (cudaError_t e = device_capturing(tl_device, "cudaDeviceSynchronize during capture")) return ret(e);
  host_wait(true, "device_sync", "device %d", tl_device);
  drain(tl_device);
  return ret(sticky_now());
}

cudaError_t cudaDeviceReset(void) {
  guard g_(g_lock);
  init_devices();
  drain(tl_device);
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  guard g_(g_lock);
  init_devices();
  if (!can) return ret(cudaErrorInvalidValue);
  if (device < 0 || device >= cfg.devices || peer < 0 || peer >= cfg.devices) return ret(cudaErrorInvalidDevice);
  *can = device != peer;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  API_BEGIN
  if (peer < 0 || peer >= cfg.devices || peer == tl_device) return ret(cudaErrorInvalidDevice);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  API_BEGIN
  if (!free_bytes || !total_bytes) return ret(cudaErrorInvalidValue);
  *total_bytes = cfg.mem_limit;
  *free_bytes = cfg.mem_limit - g_used[tl_device];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
  API_BEGIN
  g_count.mallocs++;
  if (!ptr) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = unsafe_call("cudaMalloc")) return ret(e);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  if (size > cfg.mem_limit - g_used[tl_device]) return ret(cudaErrorMemoryAllocation);
  alloc *a = new_mapping(size, tl_device);
  if (!a) return ret(cudaErrorMemoryAllocation);
  g_used[tl_device] += size;
  if (g_exec_depth == 0 && cfg.hide) set_exposed(a, false);
  *ptr = a->data;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  API_BEGIN
  g_count.frees++;
  if (!ptr) return cudaSuccess;
  if (cudaError_t e = unsafe_call("cudaFree")) return ret(e);
  alloc *a = find_live(ptr);
  if (!a || a->data != ptr || a->device < 0) return ret(cudaErrorInvalidValue);
  drain(a->device);   /* cudaFree synchronises the device */
  g_used[a->device] -= a->size;
  retire_mapping(a);
  return ret(sticky_now());
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned flags) {
  API_BEGIN
  if (!ptr) return ret(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (flags & ~0xFu) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = unsafe_call("cudaHostAlloc")) return ret(e);
  if (size == 0) return cudaSuccess;
  alloc *a = new_mapping(size, -1);
  if (!a) return ret(cudaErrorMemoryAllocation);
  *ptr = a->data;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr) {
  API_BEGIN
  if (!ptr) return cudaSuccess;
  if (cudaError_t e = unsafe_call("cudaFreeHost")) return ret(e);
  alloc *a = find_live(ptr);
  if (!a || a->data != ptr || a->device >= 0) return ret(cudaErrorInvalidValue);
  drain(-1);          /* pending copies may still read or write it */
  retire_mapping(a);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *ptr) {
  guard g_(g_lock);
  init_devices();
  if (!attr) return ret(cudaErrorInvalidValue);
  alloc *a = find_live(ptr);
  memset(attr, 0, sizeof *attr);
  attr->device = -2;
  if (!a) {
    attr->type = cudaMemoryTypeUnregistered;   /* pageable host memory: not an error since CUDA 11 */
    return cudaSuccess;
  }
  if (a->device >= 0) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = a->device;
    attr->devicePointer = (void *)ptr;
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->device = tl_device;
    attr->devicePointer = (void *)ptr;
    attr->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

/* The copy rules of the Runtime API's "API synchronization behavior": from pageable host
 * memory the bytes are staged when the call is made; into pageable host memory the call
 * returns only once the copy is done; pinned memory is read and written when the copy runs. */
static cudaError_t memcpy_impl(void *dst, const void *src, size_t n, cudaMemcpyKind kind, stream_rec *s, bool sync,
                               int dst_dev = -1, int src_dev = -1) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return ret(cudaErrorInvalidValue);
  if ((int)kind < 0 || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
  ptr_info d = classify(dst), sr = classify(src);
  if (d.w == W_DEVICE && !in_range(d.a, dst, n)) return ret(cudaErrorInvalidValue);
  if (sr.w == W_DEVICE && !in_range(sr.a, src, n)) return ret(cudaErrorInvalidValue);
  if (d.w == W_PINNED && !in_range(d.a, dst, n)) return ret(cudaErrorInvalidValue);
  if (sr.w == W_PINNED && !in_range(sr.a, src, n)) return ret(cudaErrorInvalidValue);
  if (dst_dev >= 0 && (d.w != W_DEVICE || d.a->device != dst_dev)) return ret(cudaErrorInvalidValue);
  if (src_dev >= 0 && (sr.w != W_DEVICE || sr.a->device != src_dev)) return ret(cudaErrorInvalidValue);
  bool dd = d.w == W_DEVICE, sd = sr.w == W_DEVICE;
  if (cudaError_t e = stream_usable(s, sync ? "a synchronous copy" : "a copy")) return ret(e);
  switch (kind) {
    case cudaMemcpyHostToDevice: if (!dd || sd) return ret(cudaErrorInvalidValue); break;
    case cudaMemcpyDeviceToHost: if (dd || !sd) return ret(cudaErrorInvalidValue); break;
    case cudaMemcpyDeviceToDevice: if (!dd || !sd) return ret(cudaErrorInvalidValue); break;
    case cudaMemcpyHostToHost: if (dd || sd) return ret(cudaErrorInvalidValue); break;
    default: break;
  }
  char what[160];
  snprintf(what, sizeof what, "memcpy %zu bytes %s -> %s", n, sd ? "device" : sr.w == W_PINNED ? "pinned" : "pageable",
           dd ? "device" : d.w == W_PINNED ? "pinned" : "pageable");
  /* Pageable memory is staged at the call or read back before it returns: neither can be
   * replayed, so a capture refuses it (a choice of the emulator; README). */
  if (s->cap && (sr.w == W_PAGEABLE || d.w == W_PAGEABLE)) {
    invalidate(s->cap, (std::string(what) + " on a capturing stream").c_str());
    return ret(cudaErrorStreamCaptureUnsupported);
  }
  if (sr.w == W_PAGEABLE) {
    auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    enqueue_fn(s, what, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
  } else {
    enqueue_fn(s, what, [dst, src, n] { memmove(dst, src, n); });
  }
  if (sync || d.w == W_PAGEABLE) {
    host_wait(true, "memcpy", "stream %d %s", s->id, what);
    host_complete(s, s->enq);
    return ret(sticky_now());
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  API_BEGIN
  return memcpy_impl(dst, src, count, kind, g_legacy[tl_device], true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  return memcpy_impl(dst, src, count, kind, s, false);
}

static cudaError_t peer_impl(void *dst, int dd, const void *src, int sd, size_t n, stream_rec *s, bool sync) {
  if (dd < 0 || dd >= cfg.devices || sd < 0 || sd >= cfg.devices) return ret(cudaErrorInvalidDevice);
  return memcpy_impl(dst, src, n, cudaMemcpyDeviceToDevice, s, sync, dd, sd);
}

cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t count) {
  API_BEGIN
  return peer_impl(dst, dst_device, src, src_device, count, g_legacy[tl_device], true);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t count,
                                cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  return peer_impl(dst, dst_device, src, src_device, count, s, false);
}

static cudaError_t memset_impl(void *ptr, int value, size_t n, stream_rec *s) {
  if (n == 0) return cudaSuccess;
  ptr_info p = classify(ptr);
  if (p.w != W_DEVICE || !in_range(p.a, ptr, n)) return ret(cudaErrorInvalidValue);
  if (cudaError_t e = stream_usable(s, "a memset")) return ret(e);
  char what[64];
  snprintf(what, sizeof what, "memset %zu bytes", n);
  enqueue_fn(s, what, [ptr, value, n] { memset(ptr, value, n); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  API_BEGIN
  return memset_impl(ptr, value, count, g_legacy[tl_device]);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  return memset_impl(ptr, value, count, s);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
  API_BEGIN
  if (!stream || (flags & ~1u)) return ret(cudaErrorInvalidValue);
  stream_rec *s = new stream_rec;
  s->device = tl_device;
  s->flags = flags;
  s->legacy = false;
  s->id = (int)g_streams.size();
  s->created = g_created++;
  g_streams.push_back(s);
  g_live_streams.insert(s);
  *stream = (cudaStream_t)s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

/* Returns at once; work already queued still runs (CUDA: "the resources associated with the
 * stream will be released automatically once the device has completed all work"). */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  guard g_(g_lock);
  init_devices();
  stream_rec *s = resolve(stream);
  if (!s || s->legacy) return ret(cudaErrorInvalidResourceHandle);
  s->destroyed = true;
  g_live_streams.erase(s);
  return cudaSuccess;
}

/* "It is invalid to synchronize or query the execution status of a stream which is being
 * captured": cudaErrorStreamCaptureUnsupported, the capture invalidated; the legacy stream
 * while a blocking stream captures: cudaErrorStreamCaptureImplicit. */
static cudaError_t stream_not_capturing(stream_rec *s, const char *what) {
  if (s->cap) {
    invalidate(s->cap, (std::string(what) + " on a capturing stream").c_str());
    return cudaErrorStreamCaptureUnsupported;
  }
  return stream_usable(s, what);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = stream_not_capturing(s, "cudaStreamSynchronize")) return ret(e);
  host_wait(true, "stream_sync", "stream %d", s->id);
  host_complete(s, s->enq);
  return ret(sticky_now());
}

/* Not done yet answers cudaErrorNotReady, and lets the work run, so that a polling loop ends. */
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = stream_not_capturing(s, "cudaStreamQuery")) return ret(e);
  if (s->done >= s->enq) return cudaSuccess;
  host_wait(false, "stream_query", "stream %d not ready", s->id);
  host_complete(s, s->enq);
  return cudaErrorNotReady;
}

/* cudaStreamWaitEvent where a capture is involved. On an event recorded in an active capture:
 * a stream of that capture adds the event's nodes to its dependencies; a stream outside any
 * capture joins it (cross-stream capture: it must be joined back before EndCapture); a stream
 * of another capture cannot (cudaErrorStreamCaptureMerge). A capturing stream waiting on an
 * event recorded outside its capture: cudaErrorStreamCaptureIsolation ("It is invalid to wait
 * on a non-captured event from a stream which is being captured"). An event whose capture has
 * ended is still a captured event: cudaErrorCapturedEvent. */
static cudaError_t capture_wait(stream_rec *s, event_rec *e) {
  capture_rec *c = e->cap;
  if (!c) {
    if (!e->s) return cudaSuccess;   /* never recorded: an empty set of work */
    invalidate(s->cap, "a capturing stream waited on an event recorded outside the capture");
    return ret(cudaErrorStreamCaptureIsolation);
  }
  if (c->ended) {
    if (s->cap) invalidate(s->cap, "a capturing stream waited on an event of an ended capture");
    return ret(s->cap ? cudaErrorStreamCaptureIsolation : cudaErrorCapturedEvent);
  }
  if (c->invalid) return ret(cudaErrorStreamCaptureInvalidated);
  if (s->cap && s->cap != c) {
    invalidate(c, "cudaStreamWaitEvent would merge two captures");
    invalidate(s->cap, "cudaStreamWaitEvent would merge two captures");
    return ret(cudaErrorStreamCaptureMerge);
  }
  if (!s->cap) {
    capture_join(s, c, e->cap_nodes);
    return cudaSuccess;
  }
  for (int n : e->cap_nodes)
    if (std::find(s->cap_deps.begin(), s->cap_deps.end(), n) == s->cap_deps.end()) s->cap_deps.push_back(n);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  event_rec *e = (event_rec *)event;
  if (!s || !e || !g_live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  if (flags != 0) return ret(cudaErrorInvalidValue);
  if (cudaError_t err = stream_usable(s, "cudaStreamWaitEvent")) return ret(err);
  if (cfg.drop_event_waits) return cudaSuccess;   /* the test knob: no order at all */
  if (e->cap || s->cap) return capture_wait(s, e);
  if (g_graph.on) {
    g_graph.streams.insert(s->id);
    if (e->node) {
      graph_line("wait %d %p %ld", s->id, (void *)e, e->node);
      s->wait_from.push_back({e->node, (const void *)e});
    } else {
      graph_line("wait %d %p -", s->id, (void *)e);
    }
  }
  op *o = new op;
  o->what = "wait event";
  if (e->s && e->s->done < e->seq) o->deps.push_back({e->s, e->seq});
  enqueue_op(s, o);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
  API_BEGIN
  if (!event || (flags & ~7u)) return ret(cudaErrorInvalidValue);
  event_rec *e = new event_rec;
  e->device = tl_device;
  e->flags = flags;
  g_live_events.insert(e);
  *event = (cudaEvent_t)e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

/* Returns at once even while the event's work is pending; the record keeps the (leaked,
 * small) record alive. */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  guard g_(g_lock);
  event_rec *e = (event_rec *)event;
  if (!e || !g_live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  e->destroyed = true;
  g_live_events.erase(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  event_rec *e = (event_rec *)event;
  if (!s || !e || !g_live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  if (e->device != s->device) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = stream_usable(s, "cudaEventRecord")) return ret(err);
  if (s->cap) {   /* a captured event: it stands for the capture's current nodes on s */
    e->cap = s->cap;
    e->cap_nodes = s->cap_deps;
    return cudaSuccess;
  }
  e->cap = nullptr;
  e->cap_nodes.clear();
  bool timing = !(e->flags & cudaEventDisableTiming);
  op *o = new op;
  o->what = "event record";
  o->body = [e, timing] { if (timing) { e->t_ms = now_ms(); e->timed = true; } };
  o->is_record = true;
  e->node = g_graph.on ? s->last_node : 0;
  e->timed = false;
  e->s = s;
  e->seq = s->enq + 1;   /* the record's place in s (enqueue_op numbers it so; eager mode runs it at once) */
  enqueue_op(s, o);
  return cudaSuccess;
}

static bool event_done(const event_rec *e) { return !e->s || e->s->done >= e->seq; }

/* Querying or synchronizing a captured event: cudaErrorCapturedEvent (its capture, while
 * active, invalidated). */
static cudaError_t not_captured(event_rec *e, const char *what) {
  if (!e->cap) return cudaSuccess;
  invalidate(e->cap, (std::string(what) + " on a captured event").c_str());
  return cudaErrorCapturedEvent;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  API_BEGIN
  event_rec *e = (event_rec *)event;
  if (!e || !g_live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = not_captured(e, "cudaEventQuery")) return ret(err);
  if (event_done(e)) return cudaSuccess;
  host_wait(false, "event_query", "event %p stream %d not ready", (void *)e, e->s->id);
  host_complete(e->s, e->seq);   /* not ready now; done by the next query */
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  API_BEGIN
  event_rec *e = (event_rec *)event;
  if (!e || !g_live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = not_captured(e, "cudaEventSynchronize")) return ret(err);
  if (e->s) host_wait(true, "event_sync", "event %p stream %d", (void *)e, e->s->id);
  else host_wait(true, "event_sync", "event %p never recorded", (void *)e);
  if (e->s) host_complete(e->s, e->seq);
  return ret(sticky_now());
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  API_BEGIN
  event_rec *a = (event_rec *)start, *b = (event_rec *)end;
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!a || !b || !g_live_events.count(a) || !g_live_events.count(b)) return ret(cudaErrorInvalidResourceHandle);
  if ((a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming)) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = not_captured(a->cap ? a : b, "cudaEventElapsedTime")) return ret(err);
  if (!a->s || !b->s) return ret(cudaErrorInvalidResourceHandle);
  if (!event_done(a) || !event_done(b)) return ret(cudaErrorNotReady);
  *ms = (float)std::max(0.0, b->t_ms - a->t_ms);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  API_BEGIN
  if (!func) return ret(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || (size_t)value > SMEM_OPTIN) return ret(cudaErrorInvalidValue);
    g_max_dyn[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {
    if (value < -1 || value > 100) return ret(cudaErrorInvalidValue);
    return cudaSuccess;
  }
  return ret(cudaErrorInvalidValue);
}

/* ===================================================================================== */
/* stream capture and graphs: the API                                                     */
/* ===================================================================================== */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  /* "Capture may not be initiated if stream is cudaStreamLegacy" (the emulator's per-thread
   * default stream is the legacy one) */
  if (s->legacy || (unsigned)mode > cudaStreamCaptureModeRelaxed) return ret(cudaErrorInvalidValue);
  if (s->cap) return ret(cudaErrorIllegalState);   /* "only if the stream is not already in capture mode" */
  capture_rec *c = new capture_rec;
  c->g = new graph_rec;
  c->g->device = s->device;
  c->id = ++g_capture_ids;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  g_captures.insert(c);
  capture_join(s, c, {});
  return cudaSuccess;
}

/* The nodes `from` reaches backwards, itself included. */
static std::vector<bool> ancestors(const graph_rec *g, const std::vector<int> &from) {
  std::vector<bool> seen(g->nodes.size(), false);
  std::vector<int> stack = from;
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    for (int d : g->nodes[n].deps) stack.push_back(d);
  }
  return seen;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (!graph) return ret(cudaErrorInvalidValue);
  *graph = nullptr;
  capture_rec *c = s->cap;
  if (!c) return ret(cudaErrorIllegalState);
  if (c->origin != s) {
    invalidate(c, "cudaStreamEndCapture on a stream that joined the capture, not the one that began it");
    return ret(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return ret(cudaErrorStreamCaptureWrongThread);
  /* Every stream that joined must have been joined back: its last work is something the
   * origin's last work waits for. */
  std::vector<bool> joined = ancestors(c->g, s->cap_deps);
  bool unjoined = false;
  for (stream_rec *o : c->streams)
    for (int d : o->cap_deps) unjoined |= !joined[d];
  for (stream_rec *o : c->streams) {
    o->cap = nullptr;
    o->cap_deps.clear();
  }
  c->ended = true;
  g_captures.erase(c);
  if (c->invalid || unjoined) {
    if (unjoined && !c->invalid) note("stream capture %llu: a stream that joined it was not joined back into the origin stream", c->id);
    delete c->g;
    c->g = nullptr;
    return ret(c->invalid ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined);
  }
  g_graphs.insert(c->g);
  *graph = (cudaGraph_t)c->g;
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                     cudaGraph_t *graph) {
  API_BEGIN
  stream_rec *s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (!status) return ret(cudaErrorInvalidValue);
  if (s->legacy && blocking_capture(s->device)) return ret(cudaErrorStreamCaptureImplicit);
  capture_rec *c = s->cap;
  *status = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id && c) *id = c->id;
  if (graph) *graph = c ? (cudaGraph_t)c->g : nullptr;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  return cudaStreamGetCaptureInfo(stream, status);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  guard g_(g_lock);
  if (!mode || (unsigned)*mode > cudaStreamCaptureModeRelaxed) return ret(cudaErrorInvalidValue);
  std::swap(*mode, tl_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
  guard g_(g_lock);
  graph_rec *g = (graph_rec *)graph;
  if (!g || !g_graphs.count(g) || !count) return ret(cudaErrorInvalidValue);
  if (nodes) {   /* handles are the node indices + 1; only the count is meaningful here */
    size_t n = std::min(*count, g->nodes.size());
    for (size_t i = 0; i < n; i++) nodes[i] = (cudaGraphNode_t)(uintptr_t)(i + 1);
    *count = n;
  } else {
    *count = g->nodes.size();
  }
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  API_BEGIN
  graph_rec *g = (graph_rec *)graph;
  if (!exec || !g || !g_graphs.count(g) || flags != 0) return ret(cudaErrorInvalidValue);
  exec_rec *x = new exec_rec;
  x->g = *g;   /* later changes to the graph do not reach the instance */
  for (int i = 0; i < g->lanes; i++) {
    stream_rec *l = new stream_rec;
    l->device = g->device;
    l->flags = cudaStreamNonBlocking;
    l->legacy = false;
    l->lane = true;
    l->id = (int)g_streams.size();
    g_streams.push_back(l);
    x->lanes.push_back(l);
  }
  g_execs.insert(x);
  *exec = (cudaGraphExec_t)x;
  return cudaSuccess;
}

/* Queues every node on its lane in node order (the capture's order, a topological one): a
 * node waits for its dependencies on other lanes, a root for the launching stream's work
 * before the launch and for the previous launch of the instance; the launching stream then
 * waits for every lane. So the nodes run in any order the graph's edges allow, no other. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  API_BEGIN
  exec_rec *x = (exec_rec *)exec;
  stream_rec *s = resolve(stream);
  if (!x || !g_execs.count(x)) return ret(cudaErrorInvalidValue);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = stream_usable(s, "cudaGraphLaunch")) return ret(e);
  if (s->cap) return ret(cudaErrorNotSupported);   /* a graph launch captured as a child graph: not emulated */
  if (s->device != x->g.device) return ret(cudaErrorInvalidValue);
  g_count.graph_launches++;
  dep before = {s, s->enq};
  std::vector<uint64_t> seq_of(x->g.nodes.size());
  for (size_t i = 0; i < x->g.nodes.size(); i++) {
    const gnode &n = x->g.nodes[i];
    stream_rec *l = x->lanes[n.lane];
    op *o = new op;
    o->what = n.what;
    o->is_kernel = n.is_kernel;
    for (int d : n.deps)
      if (x->g.nodes[d].lane != n.lane) o->deps.push_back({x->lanes[x->g.nodes[d].lane], seq_of[d]});
    if (n.deps.empty()) {
      if (before.seq > before.s->done) o->deps.push_back(before);
      if (x->last_launch.s && x->last_launch.seq > x->last_launch.s->done) o->deps.push_back(x->last_launch);
    }
    seq_of[i] = l->enq + 1;
    if (n.relaunch) {
      std::vector<work_ref> after;
      o->body = n.relaunch(after, work_ref{(cudaStream_t)l, seq_of[i]});
      for (const work_ref &a : after) {
        stream_rec *as = (stream_rec *)a.stream;
        if (std::find(g_streams.begin(), g_streams.end(), as) != g_streams.end() && as->done < a.seq) o->deps.push_back({as, a.seq});
      }
    } else {
      o->body = n.body;
    }
    g_count.graph_nodes++;
    enqueue_op(l, o);
  }
  op *j = new op;
  j->what = "graph launch (join)";
  std::vector<stream_rec *> busy;   /* newest first, as a host wait drains */
  for (stream_rec *l : x->lanes)
    if (l->enq > l->done) busy.push_back(l);
  std::sort(busy.begin(), busy.end(), [](const stream_rec *a, const stream_rec *b) { return a->last_issue > b->last_issue; });
  for (stream_rec *l : busy) j->deps.push_back({l, l->enq});
  enqueue_op(s, j);
  x->last_launch = {s, s->enq};
  return cudaSuccess;
}

/* Returns at once; launches already queued still run (their work holds what it needs). */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  guard g_(g_lock);
  exec_rec *x = (exec_rec *)exec;
  if (!x || !g_execs.count(x)) return ret(cudaErrorInvalidValue);
  g_execs.erase(x);
  for (stream_rec *l : x->lanes) l->destroyed = true;
  delete x;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  guard g_(g_lock);
  graph_rec *g = (graph_rec *)graph;
  if (!g || !g_graphs.count(g)) return ret(cudaErrorInvalidValue);
  g_graphs.erase(g);
  delete g;
  return cudaSuccess;
}
