/* nccl.cpp: the CUDA emulator's NCCL (tests/cuda_emu/include/nccl.h). Test infrastructure
 * only: never linked into lib/libshard.so or bin/shard. Written from NVIDIA's NCCL
 * documentation (API reference and user guide: communicators, collective operations, data
 * pointers, CUDA stream semantics, group calls); design notes in tests/cuda_emu/README.md, "NCCL".
 *
 * Ranks are processes on one machine. A job (the communicators grown from one ncclUniqueId by
 * ncclCommInitRank and ncclCommSplit) shares one POSIX shared-memory control region: per world
 * rank its pid and what it waits for, and a table of communicators with per-member round
 * counters. Each communicator has a data region with one contribution buffer (`cap` bytes) per
 * member. A collective moves in rounds of at most `cap` bytes per rank: a member posts its
 * chunk (after every peer consumed its previous round), waits until every member posted the
 * round, computes its part of the result from all chunks, and marks the round consumed.
 *
 * Collectives are queued on the caller's stream and run when the emulator drains it, each
 * after the previous collective issued on its communicator; communicators progress
 * independently, as on a GPU: no order between two communicators but the streams' (a
 * collective that waits for its peers lets the emulator run other streams' ready work, other
 * collectives included, meanwhile). A rank blocked in a collective publishes what it waits
 * for; a set of ranks that all wait for each other (stream order makes them run collectives on
 * different communicators in different orders) is diagnosed and their collectives fail with
 * ncclInvalidUsage instead of hanging. A dead peer, a peer's ncclCommAbort and a timeout fail
 * them with ncclRemoteError. A failed collective leaves its output untouched (unless it failed
 * between two rounds of a collective larger than one round) and is reported by
 * ncclCommGetAsyncError, not as a CUDA error. */
#include <nccl.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "emu_api.h"
#include "emu_fpconv.h"

namespace {

/* ===================================================================================== */
/* shared memory layout (every field starts as zero: a fresh region is a valid state)      */
/* ===================================================================================== */

enum { MAX_RANKS = 64, MAX_COMMS = 128, MAX_WAIT = 8, KEY_LEN = 96, REASON_LEN = 1024 };
const char ID_MAGIC[] = "shard-emu-nccl-id";

struct shm_member {
  std::atomic<uint64_t> posted, consumed;   /* rounds */
  std::atomic<int> state;                   /* 0 not attached, 1 attached, 2 left */
  /* what the posted round belongs to, written before `posted` is released */
  int64_t coll_seq;
  int32_t kind, dtype, redop, root;
  uint64_t count;
  /* ncclCommSplit's exchange */
  std::atomic<int64_t> split_posted, split_acked;
  int32_t split_color, split_key;
};

struct shm_comm {
  std::atomic<int> state;                   /* 0 free, 1 live */
  uint32_t gen;                             /* bumped each time the entry is reused */
  char key[KEY_LEN];                        /* "world", "world/split1/color0" */
  int32_t nranks;
  int32_t world[MAX_RANKS];                 /* member -> world rank of the job */
  uint64_t cap;                             /* bytes of each member's contribution buffer */
  std::atomic<int> attached, refs;
  std::atomic<int> reason_lock, error;      /* the first failure: reason, then error */
  char reason[REASON_LEN];
  shm_member m[MAX_RANKS];
};

struct shm_wait {                           /* one collective a blocked rank waits in */
  int32_t comm, phase, kind;                /* phase 0: to post round `round`, 1: to read it */
  uint64_t round;
  int64_t coll_seq;
};

struct shm_proc {
  std::atomic<int> pid;
  std::atomic<uint64_t> epoch;              /* odd while blocked in a collective */
  int32_t nwait;                            /* -1: too many to describe (never diagnosed) */
  shm_wait w[MAX_WAIT];
};

struct shm_job {
  std::atomic<int> nranks;
  std::atomic<int> lock;                    /* the holder's pid; the comm table's lock */
  shm_proc proc[MAX_RANKS];
  shm_comm comm[MAX_COMMS];
};

/* ===================================================================================== */
/* process state                                                                          */
/* ===================================================================================== */

enum kind_t { K_ALL_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_BROADCAST, K_REDUCE, K_SEND_RECV };
const char *const KIND_NAME[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "send_recv"};
const char *const API_NAME[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclReduce",
                                "ncclSend/ncclRecv"};
const char *const DT_NAME[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"};
const size_t DT_SIZE[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
const char *const OP_NAME[] = {"sum", "prod", "max", "min", "avg"};

struct job_t {
  std::string key;      /* hex, names the shm files */
  shm_job *h = nullptr;
  int world_rank = 0, nranks = 0;
  ~job_t() { if (h) munmap(h, sizeof(shm_job)); }
};

struct comm_impl {
  std::shared_ptr<job_t> job;
  shm_comm *e = nullptr;
  int idx = 0;
  uint32_t gen = 0;
  int rank = 0, nranks = 0, device = 0;
  std::string key;
  char *data = nullptr;
  size_t data_len = 0;
  uint64_t cap = 0;
  uint64_t issued = 0;          /* collectives issued on it (their sequence numbers) */
  uint64_t round = 0;           /* rounds run */
  int64_t nsplits = 0;
  ncclResult_t async_err = ncclSuccess;
  bool aborted = false, left = false, finalized = false;
  emu::work_ref last_work{};    /* its latest collective's place in the streams, when issued */
  bool issued_work = false;
  ~comm_impl();
};

}  // namespace

struct ncclComm { std::shared_ptr<comm_impl> p; };

namespace {

std::mutex g_mu;   /* the process's state (one host thread in practice) */
std::set<comm_impl *> g_live;
std::string g_last_error, g_last_report;
long g_inits, g_colls;
int g_group_depth;

struct coll;
std::vector<std::shared_ptr<coll>> g_group;

struct trace_rec { long idx; std::string key; uint64_t seq; int kind; size_t count; int dtype, redop, root; };
std::vector<trace_rec> g_trace;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double timeout_s() {
  static double t = -1;
  if (t < 0) {
    const char *v = getenv("SHARD_EMU_NCCL_TIMEOUT");
    if (!v || !*v) v = getenv("SHARD_COMM_TIMEOUT");
    t = v && *v && atof(v) > 0 ? atof(v) : 600;
  }
  return t;
}

std::string secs(double s) {
  char b[32];
  snprintf(b, sizeof b, "%g", s);
  return b;
}

uint64_t chunk_bytes() {
  const char *v = getenv("SHARD_EMU_NCCL_CHUNK_BYTES");
  long long n = v && *v ? atoll(v) : 4 << 20;
  return (uint64_t)std::max(64LL, n / 16 * 16);
}

void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void report(const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_report = buf;
  g_last_error = buf;
  fprintf(stderr, "cuda_emu: nccl: %s\n", buf);
  fflush(stderr);
}

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  report("%s", buf);
  return r;
}

/* A process that exited (or a zombie its parent has not reaped yet) is dead. */
bool pid_alive(int pid) {
  if (pid <= 0) return false;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return kill(pid, 0) == 0 || errno == EPERM;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  if (!p) return true;
  while (*++p == ' ') {}
  return *p != 'Z' && *p != 'X';
}

/* Backoff for the polling loops: yield at first, then sleep up to 0.5 ms. */
struct backoff {
  int n = 0;
  void pause() {
    if (++n < 200) sched_yield();
    else usleep(std::min(500, 20 + (n - 200) * 5));
  }
};

/* The comm table's lock (a pid; a dead holder's lock is taken over). */
struct job_lock {
  shm_job *h;
  explicit job_lock(shm_job *j) : h(j) {
    int me = getpid();
    backoff b;
    for (;;) {
      int z = 0;
      if (h->lock.compare_exchange_strong(z, me)) return;
      if (z != me && !pid_alive(z) && h->lock.compare_exchange_strong(z, me)) return;
      b.pause();
    }
  }
  ~job_lock() { h->lock.store(0); }
};

/* Records the first failure of a communicator, for every member to see. */
void set_comm_error(shm_comm *e, ncclResult_t r, const std::string &why) {
  int z = 0;
  if (!e->reason_lock.compare_exchange_strong(z, 1)) return;
  snprintf(e->reason, REASON_LEN, "%s", why.c_str());
  e->error.store((int)r);
}

std::string comm_reason(shm_comm *e) { return e->error.load() ? std::string(e->reason) : std::string(); }

void *map_shm(const std::string &name, size_t len) {
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  struct stat st;
  if (fstat(fd, &st) != 0 || ((size_t)st.st_size < len && ftruncate(fd, (off_t)len) != 0)) { close(fd); return nullptr; }
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

std::string data_name(const job_t &j, int idx, uint32_t gen) {
  return "/shard_nccl_" + j.key + "_c" + std::to_string(idx) + "_" + std::to_string(gen);
}

comm_impl::~comm_impl() {
  if (data) munmap(data, data_len);
}

/* Leaves the communicator's entry (the last member out frees it). */
void detach(comm_impl *c) {
  if (c->left || !c->e) return;
  c->left = true;
  c->e->m[c->rank].state.store(2);
  job_lock l(c->job->h);
  if (c->e->refs.fetch_sub(1) == 1) c->e->state.store(0);
}

/* Runs every collective this process has queued (before a blocking host call of the
 * communicator API, so that peers waiting in them are not kept waiting by the emulator's
 * lazy streams; a GPU would run them meanwhile). */
void flush_pending() {
  std::vector<emu::work_ref> last;
  for (comm_impl *c : g_live)
    if (c->issued_work) last.push_back(c->last_work);
  for (const emu::work_ref &w : last) emu::wait_work(w);
}

struct waiter {   /* the checks of a host-blocking wait (init, split) */
  double t0 = now_s();
  backoff b;
};

/* Joins (creating when first) the communicator `key` of the job as member `rank` of
 * `world.size()`, and waits for every member to join. */
ncclResult_t join_comm(const std::shared_ptr<job_t> &job, const std::string &key, const std::vector<int> &world, int rank,
                       const char *api, comm_impl **out) {
  shm_job *h = job->h;
  int idx = -1;
  {
    job_lock l(h);
    for (int i = 0; i < MAX_COMMS && idx < 0; i++)
      if (h->comm[i].state.load() == 1 && !strncmp(h->comm[i].key, key.c_str(), KEY_LEN)) idx = i;
    if (idx < 0) {
      for (int i = 0; i < MAX_COMMS && idx < 0; i++)
        if (h->comm[i].state.load() == 0) idx = i;
      if (idx < 0) return fail(ncclSystemError, "%s: more than %d live communicators in one job", api, MAX_COMMS);
      shm_comm *e = &h->comm[idx];
      uint32_t gen = e->gen + 1;
      memset((void *)e, 0, sizeof *e);
      e->gen = gen;
      snprintf(e->key, KEY_LEN, "%s", key.c_str());
      e->nranks = (int)world.size();
      for (size_t i = 0; i < world.size(); i++) e->world[i] = world[i];
      e->cap = chunk_bytes();
      e->state.store(1);
    }
    h->comm[idx].refs.fetch_add(1);
  }
  shm_comm *e = &h->comm[idx];
  comm_impl *c = new comm_impl;
  c->job = job;
  c->e = e;
  c->idx = idx;
  c->gen = e->gen;
  c->rank = rank;
  c->nranks = (int)world.size();
  c->key = key;
  c->cap = e->cap;
  cudaGetDevice(&c->device);
  c->data_len = (size_t)c->cap * c->nranks;
  std::string dname = data_name(*job, idx, c->gen);
  c->data = (char *)map_shm(dname, c->data_len);
  if (!c->data) {
    detach(c);
    delete c;
    return fail(ncclSystemError, "%s: cannot map shared memory %s: %s", api, dname.c_str(), strerror(errno));
  }
  e->m[rank].state.store(1);
  e->attached.fetch_add(1);
  waiter w;
  while (e->attached.load() < c->nranks) {
    std::string why;
    for (int p = 0; p < c->nranks && why.empty(); p++)
      if (e->m[p].state.load() == 0) {
        int pid = h->proc[e->world[p]].pid.load();
        if (pid && !pid_alive(pid)) why = "rank " + std::to_string(p) + " (pid " + std::to_string(pid) + ") died before joining";
      }
    if (why.empty() && now_s() - w.t0 > timeout_s())
      why = "timed out after " + secs(timeout_s()) + " s: " + std::to_string(e->attached.load()) + " of " +
            std::to_string(c->nranks) + " ranks joined";
    if (!why.empty()) {
      shm_unlink(dname.c_str());
      detach(c);
      delete c;
      return fail(ncclRemoteError, "%s of communicator %s: %s", api, key.c_str(), why.c_str());
    }
    w.b.pause();
  }
  shm_unlink(dname.c_str());   /* every member has it mapped: nothing is left behind */
  *out = c;
  return ncclSuccess;
}

/* ===================================================================================== */
/* reductions                                                                             */
/* ===================================================================================== */

/* Element access in the accumulation type: f32 for f16/bf16/f32 (16-bit sums accumulate in f32
 * and are rounded once), f64 for f64, the type itself for integers (wrapping). */
template <class T> struct acc { using A = T; };
struct f16_tag {};
struct bf16_tag {};
template <> struct acc<f16_tag> { using A = float; };
template <> struct acc<bf16_tag> { using A = float; };

template <class T> typename acc<T>::A load(const char *p, size_t i) {
  if constexpr (std::is_same_v<T, f16_tag>) { uint16_t u; memcpy(&u, p + 2 * i, 2); return emu_fp::half_to_f32(u); }
  else if constexpr (std::is_same_v<T, bf16_tag>) { uint16_t u; memcpy(&u, p + 2 * i, 2); return emu_fp::bf16_to_f32(u); }
  else { T v; memcpy(&v, p + sizeof(T) * i, sizeof(T)); return v; }
}
template <class T> void store(char *p, size_t i, typename acc<T>::A v) {
  if constexpr (std::is_same_v<T, f16_tag>) { uint16_t u = emu_fp::from_f32(v, emu_fp::HALF, emu_fp::RN); memcpy(p + 2 * i, &u, 2); }
  else if constexpr (std::is_same_v<T, bf16_tag>) { uint16_t u = emu_fp::from_f32(v, emu_fp::BF16, emu_fp::RN); memcpy(p + 2 * i, &u, 2); }
  else { T t = v; memcpy(p + sizeof(T) * i, &t, sizeof(T)); }
}

template <class A> A combine(A a, A b, int op) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ncclProd: return (A)(U)((U)a * (U)b);
      case ncclMax: return a > b ? a : b;
      case ncclMin: return a < b ? a : b;
      default: return (A)(U)((U)a + (U)b);
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return (b > a || b != b) && a == a ? b : a;   /* NaN propagates */
      case ncclMin: return (b < a || b != b) && a == a ? b : a;
      default: return a + b;
    }
  }
}

/* out[i] = op over ranks (in rank order) of src[r][first + i], i < n. */
template <class T>
void reduce_t(char *out, const std::vector<const char *> &src, size_t first, size_t n, int op) {
  using A = typename acc<T>::A;
  for (size_t i = 0; i < n; i++) {
    A a = load<T>(src[0], first + i);
    for (size_t r = 1; r < src.size(); r++) a = combine<A>(a, load<T>(src[r], first + i), op);
    if (op == ncclAvg) a = a / (A)src.size();
    store<T>(out, i, a);
  }
}

void reduce_any(int dt, char *out, const std::vector<const char *> &src, size_t first, size_t n, int op) {
  switch (dt) {
    case ncclInt8: return reduce_t<int8_t>(out, src, first, n, op);
    case ncclUint8: return reduce_t<uint8_t>(out, src, first, n, op);
    case ncclInt32: return reduce_t<int32_t>(out, src, first, n, op);
    case ncclUint32: return reduce_t<uint32_t>(out, src, first, n, op);
    case ncclInt64: return reduce_t<int64_t>(out, src, first, n, op);
    case ncclUint64: return reduce_t<uint64_t>(out, src, first, n, op);
    case ncclFloat16: return reduce_t<f16_tag>(out, src, first, n, op);
    case ncclFloat32: return reduce_t<float>(out, src, first, n, op);
    case ncclFloat64: return reduce_t<double>(out, src, first, n, op);
    case ncclBfloat16: return reduce_t<bf16_tag>(out, src, first, n, op);
  }
}

/* ===================================================================================== */
/* collectives                                                                            */
/* ===================================================================================== */

/* One ncclSend or ncclRecv of a K_SEND_RECV collective. */
struct p2p_op {
  bool send;
  int peer;
  char *buf;
  size_t bytes;
};

struct coll {
  std::shared_ptr<comm_impl> c;
  int kind;
  std::vector<p2p_op> p2p;   /* K_SEND_RECV: this rank's sends and receives, one of each per peer at most */
  const char *send;
  char *recv;
  size_t count;          /* NCCL's count argument (recvcount, sendcount: per rank) */
  int dt, op, root;
  uint64_t seq;          /* its number on the communicator, from 1 */
  size_t send_bytes, recv_bytes;
  cudaStream_t stream;
  /* running state */
  size_t es = 0, elems = 0, chunk = 0, nrounds = 0, rounds_done = 0;
  int phase = 0;         /* 0: post the next round, 1: read it */
  bool started = false, finished = false;
  std::string name() const {
    return std::string(KIND_NAME[kind]) + " #" + std::to_string(seq) + " on " + c->key;
  }
};

/* The members (world ranks) that keep round `round`'s phase from going on; true when none. */
bool cond_ready(shm_comm *e, int phase, uint64_t round, std::vector<int> *blockers) {
  bool ok = true;
  for (int p = 0; p < e->nranks; p++) {
    uint64_t v = phase == 0 ? e->m[p].consumed.load() : e->m[p].posted.load();
    if (v < (phase == 0 ? round - 1 : round)) {
      ok = false;
      if (blockers) blockers->push_back(p);
    }
  }
  return ok;
}

void fail_coll(coll *o, ncclResult_t r, const std::string &why, bool tell_peers) {
  if (tell_peers) set_comm_error(o->c->e, r, why);
  if (o->c->async_err == ncclSuccess) o->c->async_err = r;
  report("%s (%s) failed: %s: %s", o->name().c_str(), API_NAME[o->kind], ncclGetErrorString(r), why.c_str());
  o->finished = true;
}

/* K_SEND_RECV moves in rounds like the collectives: each member's contribution buffer holds one
 * segment per peer (`seg` bytes: a header, then up to p2p_payload bytes of what it sends that
 * peer in this round). The header says how many bytes the whole send holds (NO_SEND: none), so
 * the receiver checks that each send matches its receive. Every member takes part in every
 * round until the member that needs the most rounds is done. */
const uint64_t NO_SEND = ~(uint64_t)0;
enum { P2P_HEADER = 16 };
size_t p2p_seg(const comm_impl *c) { return (size_t)(c->cap / (uint64_t)c->nranks) / 16 * 16; }
size_t p2p_payload(const comm_impl *c) { return p2p_seg(c) > P2P_HEADER ? p2p_seg(c) - P2P_HEADER : 0; }

const p2p_op *p2p_find(const coll *o, bool send, int peer) {
  for (const p2p_op &op : o->p2p)
    if (op.send == send && op.peer == peer) return &op;
  return nullptr;
}

void p2p_post(coll *o) {
  comm_impl *c = o->c.get();
  size_t seg = p2p_seg(c), D = p2p_payload(c), off = o->rounds_done * D;
  for (int q = 0; q < c->nranks; q++) {
    char *at = c->data + (size_t)c->rank * c->cap + (size_t)q * seg;
    const p2p_op *op = p2p_find(o, true, q);
    uint64_t total = op ? op->bytes : NO_SEND;
    memcpy(at, &total, sizeof total);
    if (op && off < op->bytes) memcpy(at + P2P_HEADER, op->buf + off, std::min(D, op->bytes - off));
  }
}

/* Reads this round's segments addressed to this rank; the first failure's reason, or "". */
std::string p2p_read(coll *o) {
  comm_impl *c = o->c.get();
  shm_comm *e = c->e;
  if (o->rounds_done == 0)   /* every member posted what it needs: run as many rounds as the most */
    for (int p = 0; p < c->nranks; p++) o->nrounds = std::max<size_t>(o->nrounds, e->m[p].count);
  size_t seg = p2p_seg(c), D = p2p_payload(c), off = o->rounds_done * D;
  for (int p = 0; p < c->nranks; p++) {
    const char *at = c->data + (size_t)p * c->cap + (size_t)c->rank * seg;
    uint64_t total;
    memcpy(&total, at, sizeof total);
    const p2p_op *op = p2p_find(o, false, p);
    uint64_t want = op ? op->bytes : NO_SEND;
    if (total != want) {
      auto say = [](uint64_t b) { return b == NO_SEND ? std::string("nothing") : std::to_string(b) + " bytes"; };
      return "rank " + std::to_string(p) + " sends " + say(total) + " to rank " + std::to_string(c->rank) +
             ", which receives " + say(want) + " from it (sends and receives must match)";
    }
    if (op && off < op->bytes) memcpy(op->buf + off, at + P2P_HEADER, std::min(D, op->bytes - off));
  }
  return "";
}

/* One step (post or read a round) when it can go on now; false when it must wait. */
bool step(coll *o) {
  comm_impl *c = o->c.get();
  shm_comm *e = c->e;
  uint64_t R = c->round + 1;
  shm_member &me = e->m[c->rank];
  if (o->phase == 0) {
    if (!cond_ready(e, 0, R, nullptr)) return false;
    if (o->kind == K_SEND_RECV) p2p_post(o);
    size_t off = o->rounds_done * o->chunk;
    size_t n = std::min(o->chunk, o->elems - std::min(o->elems, off));
    bool contributes = !(o->kind == K_BROADCAST && c->rank != o->root) && o->kind != K_SEND_RECV;
    if (contributes && n) memcpy(c->data + (size_t)c->rank * c->cap, o->send + off * o->es, n * o->es);
    me.coll_seq = (int64_t)o->seq;
    me.kind = o->kind;
    me.dtype = o->dt;
    me.redop = o->op;
    me.root = o->root;
    me.count = o->kind == K_SEND_RECV ? o->nrounds : o->count;
    me.posted.store(R);
    o->phase = 1;
    return true;
  }
  if (!cond_ready(e, 1, R, nullptr)) return false;
  for (int p = 0; p < c->nranks; p++) {   /* every member posted the same collective */
    const shm_member &m = e->m[p];
    bool p2p = o->kind == K_SEND_RECV;   /* its count is the rounds a member needs */
    if ((uint64_t)m.coll_seq != o->seq || m.kind != o->kind || (!p2p && (m.dtype != o->dt || m.count != o->count)) ||
        (o->kind != K_ALL_GATHER && !p2p && o->kind != K_BROADCAST && m.redop != o->op) ||
        ((o->kind == K_BROADCAST || o->kind == K_REDUCE) && m.root != o->root)) {
      char why[512];
      snprintf(why, sizeof why, "rank %d issued %s #%lld (%s, count %llu) where rank %d issued %s #%llu (%s, count %zu): "
               "the ranks disagree on the collectives of %s", p, KIND_NAME[m.kind], (long long)m.coll_seq, DT_NAME[m.dtype],
               (unsigned long long)m.count, c->rank, KIND_NAME[o->kind], (unsigned long long)o->seq, DT_NAME[o->dt],
               o->count, c->key.c_str());
      fail_coll(o, ncclInvalidUsage, why, true);
      return true;
    }
  }
  size_t off = o->rounds_done * o->chunk;
  size_t n = std::min(o->chunk, o->elems - std::min(o->elems, off));
  std::vector<const char *> src(c->nranks);
  for (int p = 0; p < c->nranks; p++) src[p] = c->data + (size_t)p * c->cap;
  size_t es = o->es;
  switch (o->kind) {
    case K_ALL_REDUCE: reduce_any(o->dt, o->recv + off * es, src, 0, n, o->op); break;
    case K_REDUCE:
      if (c->rank == o->root) reduce_any(o->dt, o->recv + off * es, src, 0, n, o->op);
      break;
    case K_REDUCE_SCATTER: {   /* the part of this chunk that falls in this rank's block */
      size_t lo = std::max(off, (size_t)c->rank * o->count), hi = std::min(off + n, (size_t)(c->rank + 1) * o->count);
      if (lo < hi) reduce_any(o->dt, o->recv + (lo - (size_t)c->rank * o->count) * es, src, lo - off, hi - lo, o->op);
      break;
    }
    case K_ALL_GATHER:
      for (int p = 0; p < c->nranks; p++)
        if (n) memmove(o->recv + ((size_t)p * o->count + off) * es, src[p], n * es);
      break;
    case K_BROADCAST:
      if (n) memmove(o->recv + off * es, src[o->root], n * es);
      break;
    case K_SEND_RECV: {
      std::string why = p2p_read(o);
      if (!why.empty()) {
        fail_coll(o, ncclInvalidUsage, why, true);
        return true;
      }
      break;
    }
  }
  me.consumed.store(R);
  c->round = R;
  o->phase = 0;
  if (++o->rounds_done >= o->nrounds) o->finished = true;
  return true;
}

/* The first unfinished collective of each communicator may go on (NCCL requires ops on one
 * communicator to be issued in the same order on every rank). */
std::vector<coll *> runnable(const std::vector<std::shared_ptr<coll>> &ops) {
  std::vector<coll *> out;
  std::set<comm_impl *> seen;
  for (auto &o : ops)
    if (!o->finished && seen.insert(o->c.get()).second) out.push_back(o.get());
  return out;
}

std::string describe_wait(shm_job *h, int wr) {
  const shm_proc &pr = h->proc[wr];
  std::string s = "rank " + std::to_string(wr) + " waits in ";
  for (int i = 0; i < pr.nwait; i++) {
    const shm_wait &w = pr.w[i];
    if (i) s += " and ";
    s += std::string(KIND_NAME[w.kind]) + " #" + std::to_string(w.coll_seq) + " on " + h->comm[w.comm].key;
  }
  return s;
}

/* Called by a blocked rank: true (and every communicator involved marked failed) when it and
 * every rank it waits for, transitively, are blocked and none can go on. Sound without timing:
 * counters only move when their owner is not blocked, and a rank's epoch changes whenever it
 * blocks or unblocks, so equal epochs before and after mean nobody moved in between. */
bool deadlock_check(job_t *job) {
  shm_job *h = job->h;
  std::vector<uint64_t> ep(MAX_RANKS, 0);
  std::vector<bool> seen(MAX_RANKS, false);
  std::vector<int> order, queue{job->world_rank};
  seen[job->world_rank] = true;
  while (!queue.empty()) {
    int i = queue.back();
    queue.pop_back();
    order.push_back(i);
    shm_proc &pr = h->proc[i];
    uint64_t e1 = pr.epoch.load();
    if (!(e1 & 1)) return false;
    int nw = pr.nwait;
    if (nw <= 0 || nw > MAX_WAIT) return false;
    shm_wait w[MAX_WAIT];
    memcpy(w, pr.w, sizeof(shm_wait) * nw);
    if (pr.epoch.load() != e1) return false;
    ep[i] = e1;
    for (int k = 0; k < nw; k++) {
      std::vector<int> blockers;
      if (w[k].comm < 0 || w[k].comm >= MAX_COMMS) return false;
      shm_comm *e = &h->comm[w[k].comm];
      if (cond_ready(e, w[k].phase, w[k].round, &blockers)) return false;
      for (int b : blockers) {
        int wr = e->world[b];
        if (!seen[wr]) { seen[wr] = true; queue.push_back(wr); }
      }
    }
  }
  for (int i : order)
    if (h->proc[i].epoch.load() != ep[i]) return false;
  std::sort(order.begin(), order.end());
  std::string why = "deadlock: the ranks' stream orders run collectives on different communicators in different "
                    "orders (every rank must order them alike); ";
  for (size_t k = 0; k < order.size(); k++) why += (k ? "; " : "") + describe_wait(h, order[k]);
  for (int i : order)
    for (int k = 0; k < h->proc[i].nwait; k++) set_comm_error(&h->comm[h->proc[i].w[k].comm], ncclInvalidUsage, why);
  report("%s", why.c_str());
  return true;
}

/* The collectives this process started and has not finished, in start order: whichever
 * collective waits steps them all, so each communicator progresses on its own. */
std::vector<std::shared_ptr<coll>> g_started;
int g_run_depth;   /* run_colls on the executor's stack */

/* Checks and sizes a collective when its work first runs (its work may run again: below). */
void start_coll(const std::shared_ptr<coll> &o) {
  o->started = true;
  comm_impl *c = o->c.get();
  if (c->aborted || c->left) { o->finished = true; return; }
  if (c->e->error.load()) { fail_coll(o.get(), (ncclResult_t)c->e->error.load(), comm_reason(c->e), false); return; }
  bool freed = (o->send_bytes && !emu::is_device_range(o->send, o->send_bytes)) ||
               (o->recv_bytes && !emu::is_device_range(o->recv, o->recv_bytes));
  for (const p2p_op &op : o->p2p) freed |= op.bytes && !emu::is_device_range(op.buf, op.bytes);
  if (freed) {
    std::string why = std::string(API_NAME[o->kind]) + ": a buffer was freed before the collective ran";
    emu::fail_async(cudaErrorIllegalAddress, why.c_str());
    fail_coll(o.get(), ncclUnhandledCudaError, "rank " + std::to_string(c->rank) + ": " + why, true);
    return;
  }
  if (o->kind == K_SEND_RECV) {   /* its own rounds now; p2p_read takes the most any member needs */
    size_t D = p2p_payload(c);
    if (D == 0) {
      fail_coll(o.get(), ncclInvalidUsage, "SHARD_EMU_NCCL_CHUNK_BYTES " + std::to_string(c->cap) + " leaves no room for " +
                std::to_string(c->nranks) + " peers' sends (the emulator's limit)", true);
      return;
    }
    o->nrounds = 1;
    for (const p2p_op &op : o->p2p) o->nrounds = std::max(o->nrounds, (op.bytes + D - 1) / D);
    g_started.push_back(o);
    return;
  }
  o->es = DT_SIZE[o->dt];
  o->elems = o->kind == K_REDUCE_SCATTER ? o->count * c->nranks : o->count;
  o->chunk = std::max<size_t>(1, c->cap / o->es);
  o->nrounds = std::max<size_t>(1, (o->elems + o->chunk - 1) / o->chunk);
  g_started.push_back(o);
}

/* Runs collectives to completion (one, or a group's), in the emulator's executor. When they
 * wait for peers, other ready work runs meanwhile (emu::run_ready_work), as a GPU runs other
 * streams: a collective started so cannot wait there (the host may need the work below it
 * first), so it goes back to its stream, started, and whichever collective waits next steps
 * it along with its own. */
void run_colls(std::vector<std::shared_ptr<coll>> ops) {
  double t0 = now_s();
  for (auto &o : ops)
    if (!o->started) start_coll(o);
  bool nested = g_run_depth > 0;
  g_run_depth++;
  struct depth_end { ~depth_end() { g_run_depth--; } } depth_end_;
  job_t *job = ops.empty() ? nullptr : ops[0]->c->job.get();
  bool moved = false;
  for (bool any = false; !runnable(ops).empty(); moved |= any, any = false) {
    g_started.erase(std::remove_if(g_started.begin(), g_started.end(), [](auto &o) { return o->finished; }),
                    g_started.end());
    std::vector<coll *> run = runnable(g_started);
    for (coll *o : run)
      while (!o->finished && !o->c->e->error.load() && step(o)) any = true;
    if (nested && !any) return emu::requeue_work(moved);
    if (any || (!nested && emu::run_ready_work())) continue;
    /* Blocked: publish what this rank waits for (for the deadlock diagnosis), then poll. */
    shm_proc &pr = job->h->proc[job->world_rank];
    bool same_job = true;
    for (coll *o : run) same_job &= o->c->job.get() == job;
    pr.nwait = run.size() > MAX_WAIT || !same_job ? -1 : (int)run.size();
    for (int k = 0; k < pr.nwait; k++)
      pr.w[k] = shm_wait{run[k]->c->idx, run[k]->phase, run[k]->kind, run[k]->c->round + 1, (int64_t)run[k]->seq};
    pr.epoch.fetch_add(1);
    backoff b;
    double tb = now_s(), next_check = tb + 0.01;
    for (bool go = false; !go;) {
      for (coll *o : run) {
        comm_impl *c = o->c.get();
        if (c->e->error.load()) { fail_coll(o, (ncclResult_t)c->e->error.load(), comm_reason(c->e), false); go = true; }
        else if (cond_ready(c->e, o->phase, c->round + 1, nullptr)) go = true;
      }
      if (go) break;
      double t = now_s();
      if (t >= next_check) {
        next_check = t + 0.02;
        for (coll *o : run) {   /* the peers it waits for: alive, still members? */
          comm_impl *c = o->c.get();
          std::vector<int> blockers;
          cond_ready(c->e, o->phase, c->round + 1, &blockers);
          for (int p : blockers) {
            int pid = c->job->h->proc[c->e->world[p]].pid.load();
            if (!pid_alive(pid))
              set_comm_error(c->e, ncclRemoteError, "rank " + std::to_string(p) + " (pid " + std::to_string(pid) +
                                                    ") of " + c->key + " died");
            else if (c->e->m[p].state.load() == 2)
              set_comm_error(c->e, ncclRemoteError, "rank " + std::to_string(p) + " of " + c->key +
                                                    " left the communicator (ncclCommDestroy/Finalize) first");
          }
          if (t - t0 > timeout_s())
            set_comm_error(c->e, ncclRemoteError, "timed out after " + secs(timeout_s()) +
                           " s (SHARD_EMU_NCCL_TIMEOUT / SHARD_COMM_TIMEOUT) in " + o->name() + " waiting for rank " +
                           (blockers.empty() ? std::string("?") : std::to_string(blockers[0])));
        }
        if (pr.nwait > 0 && t - tb > 0.02) deadlock_check(job);
        continue;
      }
      b.pause();
    }
    pr.epoch.fetch_add(1);
  }
}

/* Collectives take their numbers on their communicators (and a line in the issue-order
 * record) when they are queued to run: at the call, or at each launch of a graph that
 * captured them. */
void number(const std::vector<std::shared_ptr<coll>> &ops) {
  for (auto &o : ops) {
    comm_impl *c = o->c.get();
    o->seq = ++c->issued;
    g_colls++;
    /* the job's id prefix makes the name one communicator's on every rank and no other's */
    g_trace.push_back(trace_rec{(long)g_trace.size() + 1, c->job->key.substr(0, 8) + ":" + c->key, o->seq, o->kind,
                                o->count, o->dt, o->kind != K_ALL_GATHER && o->kind != K_BROADCAST ? o->op : -1, o->root});
  }
}

/* A graph launch's own copy of captured collectives (unstarted), numbered, each after the
 * previous collective on its communicator; `at` becomes that communicator's latest. */
std::vector<std::shared_ptr<coll>> relaunch_colls(const std::vector<std::shared_ptr<coll>> &ops,
                                                  std::vector<emu::work_ref> &after, emu::work_ref at) {
  std::lock_guard<std::mutex> l(g_mu);
  std::vector<std::shared_ptr<coll>> fresh;
  for (auto &o : ops) {
    auto n = std::make_shared<coll>();
    n->c = o->c;
    n->kind = o->kind;
    n->p2p = o->p2p;
    n->send = o->send;
    n->recv = o->recv;
    n->count = o->count;
    n->dt = o->dt;
    n->op = o->op;
    n->root = o->root;
    n->send_bytes = o->send_bytes;
    n->recv_bytes = o->recv_bytes;
    n->stream = o->stream;
    fresh.push_back(n);
  }
  number(fresh);
  for (auto &o : fresh)
    if (o->c->issued_work) after.push_back(o->c->last_work);
  for (auto &o : fresh) {
    o->c->last_work = at;
    o->c->issued_work = true;
  }
  return fresh;
}

/* Queues collectives (one, or a group's) after the previous one on each of their
 * communicators. Ops of a group on several streams: the work runs on the first op's stream
 * after the others reached that point, and the others wait for it (NCCL joins a group's
 * streams so). On a capturing stream they become a node of the graph, and each launch of
 * the graph runs a fresh copy, numbered and chained then (relaunch_colls). */
ncclResult_t launch(std::vector<std::shared_ptr<coll>> ops, std::vector<cudaStream_t> streams) {
  std::vector<cudaStream_t> uniq;
  for (cudaStream_t s : streams)
    if (std::find(uniq.begin(), uniq.end(), s) == uniq.end()) uniq.push_back(s);
  bool captured = emu::is_capturing(uniq[0]);
  std::vector<emu::work_ref> after;
  if (!captured) {
    number(ops);
    for (auto &o : ops)
      if (o->c->issued_work) after.push_back(o->c->last_work);
  }
  for (size_t i = 1; i < uniq.size(); i++) {
    emu::work_ref r;
    if (emu::enqueue_after(uniq[i], "ncclGroupEnd (join)", [] {}, nullptr, 0, &r) != cudaSuccess)
      return fail(ncclUnhandledCudaError, "ncclGroupEnd: cannot queue on a stream of the group (invalid stream or sticky CUDA error)");
    after.push_back(r);
  }
  const char *what = ops.size() == 1 ? API_NAME[ops[0]->kind] : "ncclGroupEnd";
  emu::work_ref ref;
  emu::relaunch_fn again;
  if (captured)
    again = [ops](std::vector<emu::work_ref> &a, emu::work_ref at) {
      auto fresh = relaunch_colls(ops, a, at);
      return std::function<void()>([fresh] { run_colls(fresh); });
    };
  cudaError_t ce = emu::enqueue_after(uniq[0], what, [ops] { run_colls(ops); }, after.data(), (int)after.size(), &ref, again);
  if (ce != cudaSuccess)
    return fail(ncclUnhandledCudaError, "%s: cannot queue on the stream: %s", what, cudaGetErrorString(ce));
  if (!captured)
    for (auto &o : ops) {
      o->c->last_work = ref;
      o->c->issued_work = true;
    }
  for (size_t i = 1; i < uniq.size(); i++) emu::enqueue_after(uniq[i], "ncclGroupEnd (join)", [] {}, &ref, 1, nullptr);
  return ncclSuccess;
}

bool overlap(const void *a, size_t an, const void *b, size_t bn) {
  return an && bn && (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

ncclResult_t issue(int kind, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                   int root, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  const char *api = API_NAME[kind];
  if (!comm || !comm->p) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  comm_impl *c = comm->p.get();
  if ((unsigned)dt >= ncclNumTypes) return fail(ncclInvalidArgument, "%s: invalid datatype %d", api, (int)dt);
  bool reduces = kind != K_ALL_GATHER && kind != K_BROADCAST;
  if (reduces && (unsigned)op >= ncclNumOps) return fail(ncclInvalidArgument, "%s: invalid reduction op %d", api, (int)op);
  bool rooted = kind == K_BROADCAST || kind == K_REDUCE;
  if (rooted && (root < 0 || root >= c->nranks))
    return fail(ncclInvalidArgument, "%s: root %d is not a rank of %s (%d ranks)", api, root, c->key.c_str(), c->nranks);
  size_t es = DT_SIZE[dt], n = (size_t)c->nranks;
  size_t sb = 0, rb = 0;   /* the bytes each buffer must hold on this rank */
  switch (kind) {
    case K_ALL_REDUCE: sb = rb = count * es; break;
    case K_REDUCE_SCATTER: sb = n * count * es; rb = count * es; break;
    case K_ALL_GATHER: sb = count * es; rb = n * count * es; break;
    case K_BROADCAST: sb = c->rank == root ? count * es : 0; rb = count * es; break;
    case K_REDUCE: sb = count * es; rb = c->rank == root ? count * es : 0; break;
  }
  if (sb && !emu::is_device_range(sendbuff, sb))
    return fail(ncclInvalidArgument, "%s on %s: sendbuff %p does not hold %zu bytes of device memory (count %zu of %s)",
                api, c->key.c_str(), sendbuff, sb, count, DT_NAME[dt]);
  if (rb && !emu::is_device_range(recvbuff, rb))
    return fail(ncclInvalidArgument, "%s on %s: recvbuff %p does not hold %zu bytes of device memory (count %zu of %s)",
                api, c->key.c_str(), recvbuff, rb, count, DT_NAME[dt]);
  /* In place as NCCL defines it, or not overlapping at all (other overlaps are undefined in
   * NCCL; refused here). */
  const char *s = (const char *)sendbuff, *r = (const char *)recvbuff;
  bool in_place = false;
  switch (kind) {
    case K_ALL_REDUCE: case K_BROADCAST: case K_REDUCE: in_place = s == r; break;
    case K_REDUCE_SCATTER: in_place = s + (size_t)c->rank * count * es == r; break;
    case K_ALL_GATHER: in_place = s == r + (size_t)c->rank * count * es; break;
  }
  if (!in_place && overlap(s, sb, r, rb))
    return fail(ncclInvalidArgument, "%s on %s: sendbuff [%p, +%zu) and recvbuff [%p, +%zu) overlap without being the "
                "in-place case (%s)", api, c->key.c_str(), sendbuff, sb, recvbuff, rb,
                kind == K_ALL_GATHER ? "sendbuff == recvbuff + rank * sendcount * size"
                : kind == K_REDUCE_SCATTER ? "recvbuff == sendbuff + rank * recvcount * size" : "sendbuff == recvbuff");
  auto o = std::make_shared<coll>();
  o->c = comm->p;
  o->kind = kind;
  o->send = s;
  o->recv = (char *)recvbuff;
  o->count = count;
  o->dt = dt;
  o->op = reduces ? (int)op : 0;
  o->root = rooted ? root : -1;
  o->send_bytes = sb;
  o->recv_bytes = rb;
  o->stream = stream;
  if (g_group_depth > 0) {
    g_group.push_back(o);
    return ncclSuccess;
  }
  return launch({o}, {stream});
}

/* ncclSend / ncclRecv: one K_SEND_RECV collective of one op (a group merges those of a
 * communicator into one: merge_p2p). */
ncclResult_t issue_p2p(bool send, const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                       cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  const char *api = send ? "ncclSend" : "ncclRecv";
  if (!comm || !comm->p) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  comm_impl *c = comm->p.get();
  if ((unsigned)dt >= ncclNumTypes) return fail(ncclInvalidArgument, "%s: invalid datatype %d", api, (int)dt);
  if (peer < 0 || peer >= c->nranks)
    return fail(ncclInvalidArgument, "%s: peer %d is not a rank of %s (%d ranks)", api, peer, c->key.c_str(), c->nranks);
  size_t bytes = count * DT_SIZE[dt];
  if (bytes && !emu::is_device_range(buf, bytes))
    return fail(ncclInvalidArgument, "%s on %s: buffer %p does not hold %zu bytes of device memory (count %zu of %s)", api,
                c->key.c_str(), buf, bytes, count, DT_NAME[dt]);
  auto o = std::make_shared<coll>();
  o->c = comm->p;
  o->kind = K_SEND_RECV;
  o->p2p.push_back(p2p_op{send, peer, (char *)buf, bytes});
  o->count = 1;
  o->dt = ncclInt8;
  o->root = -1;
  o->stream = stream;
  if (g_group_depth > 0) {
    g_group.push_back(o);
    return ncclSuccess;
  }
  return launch({o}, {stream});
}

/* A group's sends and receives on one communicator become one K_SEND_RECV collective, where
 * the first of them was issued (the emulator takes at most one send and one receive per peer). */
ncclResult_t merge_p2p(std::vector<std::shared_ptr<coll>> &ops) {
  std::vector<std::shared_ptr<coll>> out;
  for (auto &o : ops) {
    std::shared_ptr<coll> into;
    if (o->kind == K_SEND_RECV)
      for (auto &m : out)
        if (m->kind == K_SEND_RECV && m->c == o->c) into = m;
    if (!into) {
      out.push_back(o);
      continue;
    }
    for (const p2p_op &op : o->p2p) {
      if (p2p_find(into.get(), op.send, op.peer))
        return fail(ncclInvalidUsage, "ncclGroupEnd: two %s with peer %d on %s in one group (the emulator takes one send "
                    "and one receive per peer in a group)", op.send ? "ncclSend" : "ncclRecv", op.peer, o->c->key.c_str());
      into->p2p.push_back(op);
      into->count++;
    }
  }
  ops.swap(out);
  return ncclSuccess;
}

void trace_at_exit() {
  const char *dir = getenv("SHARD_EMU_NCCL_TRACE");
  if (!dir || !*dir) return;
  std::string path = std::string(dir) + "/nccl." + std::to_string(getpid()) + ".log";
  shard_emu_nccl_trace_dump(path.c_str());
}

ncclResult_t init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, const char *api) {
  if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  *comm = nullptr;
  if (nranks < 1 || nranks > MAX_RANKS)
    return fail(ncclInvalidArgument, "%s: nranks %d (the emulator supports 1..%d)", api, nranks, MAX_RANKS);
  if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "%s: rank %d of %d", api, rank, nranks);
  if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
    return fail(ncclInvalidArgument, "%s: the unique id was not made by ncclGetUniqueId", api);
  std::lock_guard<std::mutex> l(g_mu);
  static bool registered = false;
  if (!registered) { registered = true; atexit(trace_at_exit); }
  g_inits++;
  flush_pending();
  auto job = std::make_shared<job_t>();
  char key[33];
  memcpy(key, id.internal + sizeof ID_MAGIC, 32);
  key[32] = 0;
  job->key = key;
  job->world_rank = rank;
  job->nranks = nranks;
  std::string jname = "/shard_nccl_" + job->key;
  job->h = (shm_job *)map_shm(jname, sizeof(shm_job));
  if (!job->h) return fail(ncclSystemError, "%s: cannot map shared memory %s: %s", api, jname.c_str(), strerror(errno));
  int z = 0;
  if (!job->h->nranks.compare_exchange_strong(z, nranks) && z != nranks)
    return fail(ncclInvalidArgument, "%s: rank %d says %d ranks, another rank said %d", api, rank, nranks, z);
  int me = getpid(), was = 0;
  if (!job->h->proc[rank].pid.compare_exchange_strong(was, me) && was != me)
    return fail(ncclInvalidArgument, "%s: rank %d joined twice (pid %d and pid %d)", api, rank, was, me);
  std::vector<int> world(nranks);
  for (int i = 0; i < nranks; i++) world[i] = i;
  comm_impl *c = nullptr;
  ncclResult_t r = join_comm(job, "world", world, rank, api, &c);
  shm_unlink(jname.c_str());   /* joined by all (or failed): the mappings keep it */
  if (r != ncclSuccess) return r;
  *comm = new ncclComm{std::shared_ptr<comm_impl>(c)};
  g_live.insert(c);
  return ncclSuccess;
}

void release(ncclComm_t comm) {
  g_live.erase(comm->p.get());
  detach(comm->p.get());
  delete comm;
}

}  // namespace

/* ===================================================================================== */
/* the API                                                                                */
/* ===================================================================================== */

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, ID_MAGIC, sizeof ID_MAGIC);
  unsigned long long rnd = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&rnd, sizeof rnd, 1, f) != 1) rnd = (unsigned long long)(now_s() * 1e9) ^ ((unsigned long long)getpid() << 32);
  if (f) fclose(f);
  snprintf(uniqueId->internal + sizeof ID_MAGIC, 33, "%016llx%08x%08x", rnd, (unsigned)getpid(),
           (unsigned)(now_s() * 1000));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
  (void)config;   /* blocking or not, the emulator's init completes before it returns */
  return init_rank(comm, nranks, commId, rank, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  if (!comm || !comm->p) return fail(ncclInvalidArgument, "ncclCommSplit: comm is NULL");
  if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color %d (a color is >= 0 or NCCL_SPLIT_NOCOLOR)", color);
  std::lock_guard<std::mutex> l(g_mu);
  g_inits++;
  *newcomm = nullptr;
  flush_pending();
  comm_impl *c = comm->p.get();
  shm_comm *e = c->e;
  int64_t s = ++c->nsplits;
  shm_member &me = e->m[c->rank];
  /* Exchange (color, key) over the parent: publish after every member read the previous. */
  waiter w;
  for (int phase = 0; phase < 2; phase++) {
    for (;;) {
      bool ready = true;
      for (int p = 0; p < c->nranks && ready; p++)
        ready = phase == 0 ? e->m[p].split_acked.load() >= s - 1 : e->m[p].split_posted.load() >= s;
      if (ready) break;
      std::string why = comm_reason(e);
      for (int p = 0; p < c->nranks && why.empty(); p++) {
        int pid = c->job->h->proc[e->world[p]].pid.load();
        if (!pid_alive(pid)) why = "rank " + std::to_string(p) + " (pid " + std::to_string(pid) + ") died";
        else if (e->m[p].state.load() == 2) why = "rank " + std::to_string(p) + " left the communicator";
      }
      if (why.empty() && now_s() - w.t0 > timeout_s())
        why = "timed out after " + secs(timeout_s()) + " s waiting for the other ranks";
      if (!why.empty()) return fail(ncclRemoteError, "ncclCommSplit #%lld of %s: %s", (long long)s, c->key.c_str(), why.c_str());
      w.b.pause();
    }
    if (phase == 0) {
      me.split_color = color;
      me.split_key = key;
      me.split_posted.store(s);
    }
  }
  std::vector<std::pair<std::pair<int, int>, int>> members;   /* ((key, parent rank), parent rank) */
  for (int p = 0; p < c->nranks; p++)
    if (color != NCCL_SPLIT_NOCOLOR && e->m[p].split_color == color) members.push_back({{e->m[p].split_key, p}, p});
  me.split_acked.store(s);
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::sort(members.begin(), members.end());
  std::vector<int> world;
  int myrank = -1;
  for (auto &m : members) {
    if (m.second == c->rank) myrank = (int)world.size();
    world.push_back(e->world[m.second]);
  }
  std::string ckey = c->key + "/split" + std::to_string(s) + "/color" + std::to_string(color);
  comm_impl *child = nullptr;
  ncclResult_t r = join_comm(c->job, ckey, world, myrank, "ncclCommSplit", &child);
  if (r != ncclSuccess) return r;
  *newcomm = new ncclComm{std::shared_ptr<comm_impl>(child)};
  g_live.insert(child);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm || !comm->p) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::lock_guard<std::mutex> l(g_mu);
  comm_impl *c = comm->p.get();
  if (c->issued_work && !c->aborted) emu::wait_work(c->last_work);   /* its queued collectives run now */
  c->finalized = true;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (!comm->p->finalized) ncclCommFinalize(comm);
  std::lock_guard<std::mutex> l(g_mu);
  release(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::lock_guard<std::mutex> l(g_mu);
  comm_impl *c = comm->p.get();
  c->aborted = true;   /* its queued collectives do nothing when they run */
  set_comm_error(c->e, ncclRemoteError, "rank " + std::to_string(c->rank) + " of " + c->key + " called ncclCommAbort");
  release(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || !asyncError) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(g_mu);
  comm_impl *c = comm->p.get();
  *asyncError = c->async_err != ncclSuccess ? c->async_err : (ncclResult_t)c->e->error.load();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->p->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->p->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->p->rank;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return g_last_error.c_str();
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(K_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(K_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue_p2p(true, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue_p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

/* Group calls: collectives issued between the outermost ncclGroupStart and its ncclGroupEnd
 * are queued together at the ncclGroupEnd as ONE piece of work that advances all of them
 * (round-robin across communicators; in issue order within one), so their order across
 * communicators cannot deadlock. */
ncclResult_t ncclGroupStart(void) {
  std::lock_guard<std::mutex> l(g_mu);
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_group_depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0 || g_group.empty()) return ncclSuccess;
  std::vector<std::shared_ptr<coll>> ops;
  ops.swap(g_group);
  std::vector<cudaStream_t> streams;
  for (auto &o : ops) streams.push_back(o->stream);
  ncclResult_t r = merge_p2p(ops);
  return r != ncclSuccess ? r : launch(ops, streams);
}

int shard_emu_nccl_trace_dump(const char *path) {
  std::lock_guard<std::mutex> l(g_mu);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  for (const trace_rec &t : g_trace) {
    fprintf(f, "%ld %s #%llu %s count=%zu dtype=%s", t.idx, t.key.c_str(), (unsigned long long)t.seq, KIND_NAME[t.kind],
            t.count, DT_NAME[t.dtype]);
    if (t.redop >= 0) fprintf(f, " op=%s", OP_NAME[t.redop]);
    if (t.root >= 0) fprintf(f, " root=%d", t.root);
    fprintf(f, "\n");
  }
  return fclose(f) == 0 ? 0 : -1;
}

long shard_emu_nccl_comm_inits(void) { return g_inits; }
long shard_emu_nccl_collectives(void) { return g_colls; }
const char *shard_emu_nccl_last_report(void) { return g_last_report.c_str(); }

}  // extern "C"
