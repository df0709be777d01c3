/* comm.c: the front of the collectives: bootstrap from the environment, validation with
 * messages naming op, group, rank, shapes and dtypes, dispatch to a backend (local, MPI,
 * NCCL), counters, and the timeout that turns a hang into an error. */
#define _GNU_SOURCE
#include "comm_internal.h"
#include "core/tensor_internal.h"
#include "core/alloc_internal.h"
#include "core/meta_internal.h"
#include "core/parallel.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SHARD_CUDA
#include "core/cuda.h"
/* Weak, so that a build without kernels/comm_nccl.cu still links: the address is then NULL
 * and CUDA tensors get a clean "built without NCCL" error. */
extern const sh_comm_backend sh_comm_nccl_backend __attribute__((weak));
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

static sh_comm *g_world;
static sh_flight_record *g_flight;          /* this rank's flight record, when recording */
static int g_timed_out;   /* a wait of this process timed out (sh_comm_wait) */
static sh_comm *g_live;                     /* every live group, for counters and finalize */
static int64_t g_count[SH_COLL_N], g_bytes[SH_COLL_N];
static double g_wait_seconds;               /* time blocked in sh_comm_wait */

static const char *const KIND_NAME[] = {
  [SH_COLL_ALL_GATHER] = "all_gather", [SH_COLL_REDUCE_SCATTER] = "reduce_scatter",
  [SH_COLL_ALL_REDUCE] = "all_reduce", [SH_COLL_BROADCAST] = "broadcast", [SH_COLL_BARRIER] = "barrier",
  [SH_COLL_ALL_TO_ALL] = "all_to_all",
};
_Static_assert(sizeof KIND_NAME / sizeof KIND_NAME[0] == SH_COLL_N, "a name for every sh_coll_kind");

const char *sh_comm_kind_name(int kind) { return kind >= 0 && kind < SH_COLL_N ? KIND_NAME[kind] : NULL; }
static const char *OP_NAME[4] = { "sum", "avg", "max", "min" };

double sh_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- environment --------------------------------------------------------------------- */

static int env_int(const char *name, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end) return 0;
  *out = (int)x;
  return 1;
}

int sh_comm_read_env(sh_comm_env *out) {
  sh_comm_env e = { .launcher = SH_LAUNCH_NONE, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1,
                    .node = 0, .n_nodes = 1 };
  int r, s;
  if (env_int("OMPI_COMM_WORLD_RANK", &r) && env_int("OMPI_COMM_WORLD_SIZE", &s)) {
    e = (sh_comm_env){ SH_LAUNCH_MPI, r, s, 0, 1, -1, 0 };
    env_int("OMPI_COMM_WORLD_LOCAL_RANK", &e.local_rank);
    env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &e.local_size);
  } else if (env_int("RANK", &r) && env_int("WORLD_SIZE", &s)) {
    /* torchrun numbers ranks node by node: a node is LOCAL_WORLD_SIZE consecutive ranks. */
    e = (sh_comm_env){ SH_LAUNCH_TORCHRUN, r, s, 0, 1, 0, 1 };
    if (!env_int("LOCAL_RANK", &e.local_rank)) e.local_rank = r;
    if (!env_int("LOCAL_WORLD_SIZE", &e.local_size) || e.local_size < 1) e.local_size = s;
    if (!env_int("GROUP_RANK", &e.node)) e.node = r / e.local_size;
    e.n_nodes = (s + e.local_size - 1) / e.local_size;
  } else if (env_int("SLURM_PROCID", &r) && env_int("SLURM_NTASKS", &s)) {
    e = (sh_comm_env){ SH_LAUNCH_SLURM, r, s, 0, 1, -1, 0 };
    env_int("SLURM_LOCALID", &e.local_rank);
    if (!env_int("SLURM_NTASKS_PER_NODE", &e.local_size)) e.local_size = s;
    env_int("SLURM_NODEID", &e.node);
    env_int("SLURM_NNODES", &e.n_nodes);
  } else if (env_int("PMIX_RANK", &r)) {
    e.launcher = SH_LAUNCH_MPI;   /* size comes from MPI itself */
    e.rank = r;
  }
  if (e.size < 1 || e.rank < 0 || e.rank >= e.size)
    return sh_fail(SH_ERR_ARG, "comm: the environment gives rank %d of a world of %d", e.rank, e.size);
  sh_parallel_set_ranks_per_node(e.local_size);   /* the thread team's wait policy (parallel.h) */
  *out = e;
  return SH_OK;
}

/* The thread team learns how many ranks share this node before its first call, however early
 * (a recipe builds its model before shard.init): the environment is read as the library loads. */
__attribute__((constructor)) static void tell_team_ranks_per_node(void) {
  sh_comm_env env;
  if (sh_comm_read_env(&env) != SH_OK) sh_clear_error();
}

/* ---- the flight record (comm.h) ----------------------------------------------------- */

static void flight_open(const sh_comm *world) {
  const char *dir = getenv("SHARD_FLIGHT_DIR");
  if (!dir || !*dir) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.flight", dir, world->rank);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;                       /* a diagnosis aid: never fail the job over it */
  void *p = MAP_FAILED;
  if (ftruncate(fd, sizeof(sh_flight_record)) == 0)
    p = mmap(NULL, sizeof(sh_flight_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return;
  g_flight = p;
  g_flight->rank = world->rank;
  g_flight->size = world->size;
  g_flight->pid = (int32_t)getpid();
  snprintf(g_flight->node_name, sizeof g_flight->node_name, "%s", world->node_name);
  g_flight->node = world->node;
  g_flight->local_rank = world->local_rank;
  memcpy(g_flight->magic, "shflt03", 8);
}

static void flight_issue(sh_comm *c, const sh_comm_work *w) {
  if (!g_flight) return;
  if (c->flight_slot < 0) {
    if (g_flight->n_groups >= (int)(sizeof g_flight->groups / sizeof g_flight->groups[0])) return;
    c->flight_slot = g_flight->n_groups++;
  }
  sh_flight_group *g = &g_flight->groups[c->flight_slot];
  snprintf(g->name, sizeof g->name, "%s", c->name);
  g->size = c->size;
  g->last_kind = w->kind;
  g->last_bytes = w->bytes;
  g->issued = w->seq;
  g_flight->active_at = w->issued;
}

static void flight_wait(const sh_comm_work *w, int state, double since, double waited) {
  if (!g_flight) return;
  snprintf(g_flight->wait_group, sizeof g_flight->wait_group, "%s", w->comm->name);
  g_flight->wait_seq = w->seq;
  g_flight->wait_bytes = w->bytes;
  g_flight->wait_kind = w->kind;
  g_flight->wait_since = since;
  g_flight->wait_for = waited;
  g_flight->wait_state = state;
  g_flight->active_at = since + waited;
}

/* DIR/timeout.flight (comm.h): the first rank to time out writes it, the others find it. */
static void flight_snapshot(const sh_comm *world) {
  const char *dir = getenv("SHARD_FLIGHT_DIR");
  if (!g_flight || !dir || !world) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/timeout.flight", dir);
  int out = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (out < 0) return;
  for (int r = 0; r < world->size; r++) {
    sh_flight_record rec;
    snprintf(path, sizeof path, "%s/rank%d.flight", dir, r);
    int in = open(path, O_RDONLY);
    if (in < 0) continue;
    ssize_t n = read(in, &rec, sizeof rec);
    close(in);
    if (n == (ssize_t)sizeof rec && pwrite(out, &rec, sizeof rec, (off_t)r * (off_t)sizeof rec) < 0) break;
  }
  close(out);
}

/* shard launch passes its pid (SHARD_LAUNCH_PID): a rank whose launcher is gone (SIGKILL)
 * has no one to stop its job, so its next collective fails. Looked at once a second. */
static int launcher_gone(double now) {
  static double checked;
  static int pid = -1;
  if (pid < 0) {
    const char *v = getenv("SHARD_LAUNCH_PID");
    pid = v ? atoi(v) : 0;
  }
  if (pid <= 0 || now - checked < 1.0) return 0;
  checked = now;
  return kill(pid, 0) != 0 && errno == ESRCH ? pid : 0;
}

static int fail_launcher_gone(const sh_comm_work *w, int pid) {
  return sh_fail(SH_ERR_COMM, "comm: %s #%lld on %s on rank %d of %d: shard launch (pid %d) that started this job "
                 "is gone, so this rank ends", w->what, (long long)w->seq, w->comm->name, w->comm->rank, w->comm->size, pid);
}

/* ---- trace events (comm.h) --------------------------------------------------------------- */

static struct {
  pthread_mutex_t lock;
  sh_comm_event *ev;
  int capacity, head, n;     /* the oldest event is ev[head]; n events are held */
  int64_t dropped;
  int label;
} g_trace = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* A CUDA collective's timing events (sh_comm_event.device_events), given back. */
static void destroy_device_events(void **ev) {
#ifdef SHARD_CUDA
  for (int i = 0; i < 3; i++) { sh_cuda_event_destroy(ev[i]); ev[i] = NULL; }
#endif
}

int sh_comm_trace_start(int capacity) {
  if (capacity < 0) return sh_fail(SH_ERR_ARG, "comm trace: capacity %d; expected >= 0 events", capacity);
  sh_comm_event *ev = capacity ? calloc((size_t)capacity, sizeof *ev) : NULL;
  if (capacity && !ev) return sh_fail(SH_ERR_OOM, "comm trace: out of host memory for %d events", capacity);
  pthread_mutex_lock(&g_trace.lock);
  for (int k = 0; k < g_trace.n; k++) destroy_device_events(g_trace.ev[(g_trace.head + k) % g_trace.capacity].device_events);
  free(g_trace.ev);
  g_trace.ev = ev;
  g_trace.capacity = capacity;
  g_trace.head = g_trace.n = 0;
  g_trace.dropped = 0;
  pthread_mutex_unlock(&g_trace.lock);
  return SH_OK;
}

int sh_comm_trace_read(sh_comm_event *out, int max) {
  pthread_mutex_lock(&g_trace.lock);
  int k = 0;
  for (; k < max && g_trace.n > 0; k++) {
    out[k] = g_trace.ev[g_trace.head];
    g_trace.head = (g_trace.head + 1) % g_trace.capacity;
    g_trace.n--;
  }
  pthread_mutex_unlock(&g_trace.lock);
  return k;
}

int64_t sh_comm_trace_dropped(void) { return g_trace.dropped; }

int sh_comm_trace_label(int label) {
  int old = g_trace.label;
  g_trace.label = label;
  return old;
}

/* ---- device times of CUDA collectives (sh_comm_event.device_events) ---- */

/* Before w is queued: events on the caller's stream and on the stream the collective will
 * run on (NCCL's backend: gathers and broadcasts on the all-gather stream, reductions on the
 * reduce-scatter one). Tracing never fails a collective: without events it has no device times. */
static void device_events_before(sh_comm_work *w, const sh_tensor *t) {
#ifdef SHARD_CUDA
  if (!g_trace.ev || !t || t->device < 0) return;
  int gathers = w->kind == SH_COLL_ALL_GATHER || w->kind == SH_COLL_BROADCAST;
  w->stream = gathers ? SH_STREAM_ALL_GATHER : SH_STREAM_REDUCE_SCATTER;
  sh_cuda_stream *caller, *own;
  int ok = !sh_cuda_current_stream(&caller, t->device) && !sh_cuda_stream_get(&own, t->device, w->stream);
  for (int i = 0; ok && i < 3; i++) ok = !sh_cuda_event_create((sh_cuda_event **)&w->device_events[i], t->device, 1);
  ok = ok && !sh_cuda_event_record(w->device_events[0], caller) && !sh_cuda_event_record(w->device_events[1], own);
  if (!ok) { destroy_device_events(w->device_events); sh_clear_error(); }
#endif
}

static void device_events_after(sh_comm_work *w, const sh_tensor *t) {
#ifdef SHARD_CUDA
  sh_cuda_stream *own;
  if (!w->device_events[2]) return;
  if (sh_cuda_stream_get(&own, t->device, w->stream) || sh_cuda_event_record(w->device_events[2], own)) {
    destroy_device_events(w->device_events);
    sh_clear_error();
  }
#endif
}

static void trace_push(sh_comm_work *w, int wait, double t0, double t1) {
  if (!g_trace.ev) return;
  pthread_mutex_lock(&g_trace.lock);
  if (g_trace.ev) {
    if (g_trace.n == g_trace.capacity) {     /* full: the oldest goes */
      destroy_device_events(g_trace.ev[g_trace.head].device_events);
      g_trace.head = (g_trace.head + 1) % g_trace.capacity;
      g_trace.n--;
      g_trace.dropped++;
    }
    sh_comm_event *e = &g_trace.ev[(g_trace.head + g_trace.n++) % g_trace.capacity];
    const sh_tensor *t = w->in ? w->in : w->out;
    *e = (sh_comm_event){ .t0 = t0, .t1 = t1, .bytes = w->bytes, .seq = w->seq, .kind = w->kind, .wait = wait,
                          .device = t ? t->device : -1, .label = w->label, .stream = w->stream };
    snprintf(e->group, sizeof e->group, "%s", w->comm->name);
    if (!wait) {                             /* the ring takes the device events over */
      memcpy(e->device_events, w->device_events, sizeof e->device_events);
      memset(w->device_events, 0, sizeof w->device_events);
    }
  }
  pthread_mutex_unlock(&g_trace.lock);
}

/* The collective's event, once, when the host first sees it complete (or ordered). */
static void trace_done(sh_comm_work *w) {
  if (w->traced || !w->done) return;
  w->traced = 1;
  trace_push(w, 0, w->issued, sh_comm_now());
}

/* ---- the "none" backend: CPU collectives across ranks without MPI ----------------------- */

static int none_start(sh_comm_work *w) {
  return sh_fail(SH_ERR_COMM,
                 "CPU collectives across processes need MPI, and this process was started from "
                 "torchrun-style variables (RANK, WORLD_SIZE) without mpirun; start it with "
                 "`shard launch --nproc N` or mpirun, or use CUDA tensors (NCCL)");
}
static int none_test(sh_comm_work *w, int *done) { *done = 1; return SH_OK; }
static void none_abandon(sh_comm_work *w) {}
static void none_destroy(sh_comm *c) {}
static const sh_comm_backend none_backend = {
  .name = "none", .start = none_start, .test = none_test, .abandon = none_abandon, .destroy = none_destroy,
};

/* ---- groups ---------------------------------------------------------------------------- */

static double default_timeout(void) {
  const char *v = getenv("SHARD_COMM_TIMEOUT");
  double t = v ? atof(v) : 0;
  return t > 0 ? t : 600.0;
}

static sh_comm *new_comm(const char *name) {
  sh_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  snprintf(c->name, sizeof c->name, "%s", name);
  c->timeout = default_timeout();
  c->refs = 1;
  c->flight_slot = -1;
#ifdef SHARD_CUDA
  c->gpu = &sh_comm_nccl_backend;     /* NULL when comm_nccl.cu is not linked */
#endif
  return c;
}

static void link_comm(sh_comm *c) { c->next = g_live; g_live = c; }

static void unlink_comm(sh_comm *c) {
  for (sh_comm **p = &g_live; *p; p = &(*p)->next)
    if (*p == c) { *p = c->next; return; }
}

/* MPI_Finalize waits for every rank, so a rank that exits with an error must skip it: its
 * exit then makes mpirun stop the others at once, instead of it waiting for their timeouts. */
static void finalize_at_exit(int status, void *arg) {
  if (status == 0) sh_comm_finalize();
}

int sh_comm_init_world(sh_comm **out) {
  *out = NULL;
  if (g_world) { g_world->refs++; *out = g_world; return SH_OK; }
  sh_comm_env env;
  SH_TRY(sh_comm_read_env(&env));
  sh_comm *w = new_comm("world");
  if (!w) return sh_fail(SH_ERR_OOM, "comm: out of host memory for the world group");
  w->is_world = 1;
  w->rank = env.rank;
  w->size = env.size;
  w->local_rank = env.local_rank;
  w->local_size = env.local_size;
  w->node = env.node < 0 ? 0 : env.node;
  w->n_nodes = env.n_nodes < 1 ? 1 : env.n_nodes;
  w->nodes_uniform = w->size == w->n_nodes * w->local_size;
  if (gethostname(w->node_name, sizeof w->node_name - 1) != 0) snprintf(w->node_name, sizeof w->node_name, "node%d", w->node);
  if (env.launcher == SH_LAUNCH_MPI || env.launcher == SH_LAUNCH_SLURM) {
    int rc = sh_comm_mpi_init_world(w);
    if (rc) { free(w); return rc; }
    if (env.launcher == SH_LAUNCH_SLURM && w->size != env.size) {
      int size = w->size;
      sh_comm_mpi_backend.destroy(w);
      free(w);
      return sh_fail(SH_ERR_COMM, "comm: SLURM_NTASKS is %d but MPI sees a world of %d; "
                     "start the ranks with srun --mpi=pmix (or mpirun)", env.size, size);
    }
    if (w->size == 1) { sh_comm_mpi_backend.destroy(w); w->cpu = &sh_comm_local_backend; }
  } else {
    w->cpu = env.size > 1 ? &none_backend : &sh_comm_local_backend;
  }
  if (sh_comm_mpi_active()) on_exit(finalize_at_exit, NULL);
  flight_open(w);
  link_comm(w);
  g_world = w;
  *out = w;
  return SH_OK;
}

int sh_comm_init_dry(sh_comm **out, int rank, int size, int local_size) {
  *out = NULL;
  if (g_world) return sh_fail(SH_ERR_COMM, "comm: a dry-run world must be made before the world group exists");
  if (size < 1 || rank < 0 || rank >= size || local_size < 1)
    return sh_fail(SH_ERR_ARG, "comm: a dry-run world of %d ranks (%d per node) has no rank %d", size, local_size, rank);
  sh_comm *w = new_comm("dry world");
  if (!w) return sh_fail(SH_ERR_OOM, "comm: out of host memory for the world group");
  *w = (sh_comm){ .rank = rank, .size = size, .local_rank = rank % local_size, .local_size = local_size,
                  .node = rank / local_size, .n_nodes = (size + local_size - 1) / local_size,
                  .nodes_uniform = size % local_size == 0, .timeout = w->timeout, .refs = 1, .is_world = 1,
                  .cpu = &sh_comm_dry_backend, .flight_slot = -1 };
  snprintf(w->name, sizeof w->name, "dry world");
  snprintf(w->node_name, sizeof w->node_name, "dry-node%d", w->node);
  link_comm(w);
  g_world = w;
  *out = w;
  return SH_OK;
}

static void free_comm(sh_comm *c) {
  if (c->gpu && c->gpu_state) c->gpu->destroy(c);
  if (c->cpu) c->cpu->destroy(c);
  unlink_comm(c);
  free(c);
}

void sh_comm_destroy(sh_comm *c) {
  if (!c || --c->refs > 0) return;
  if (c == g_world) { c->refs = 1; return; }   /* the world lives until sh_comm_finalize */
  free_comm(c);
}

int sh_comm_finalize(void) {
  int stuck = 0;
  for (sh_comm *c = g_live; c; c = c->next) stuck |= c->abandoned;
  while (g_live) free_comm(g_live);
  g_world = NULL;
  /* MPI_Finalize would wait for an abandoned op forever; exiting without it lets mpirun end
   * the job with this rank's error. */
  if (!stuck) sh_comm_mpi_finalize();
  return SH_OK;
}

int sh_comm_split(sh_comm **out, sh_comm *parent, int color, int key) {
  *out = NULL;
  if (!parent) return sh_fail(SH_ERR_ARG, "comm split: expected a group, got nil");
  char name[96];
  snprintf(name, sizeof name, "%.60s color %d", parent->name, color);
  sh_comm *c = new_comm(name);
  if (!c) return sh_fail(SH_ERR_OOM, "comm split: out of host memory");
  c->local_rank = parent->local_rank;
  c->local_size = parent->local_size;
  c->node = parent->node;
  c->n_nodes = parent->n_nodes;
  c->nodes_uniform = parent->nodes_uniform;
  memcpy(c->node_name, parent->node_name, sizeof c->node_name);
  c->timeout = parent->timeout;
  c->parent = parent;
  c->color = color;
  c->key = key;
  /* The CPU side decides membership; without MPI across ranks, NCCL does. */
  const sh_comm_backend *b = parent->cpu != &none_backend ? parent->cpu : parent->gpu;
  int rc = b && b->split ? b->split(parent, color, key, c)
                         : sh_fail(SH_ERR_COMM, "comm split of %s: no backend can split this group "
                                   "(launch through mpirun or `shard launch` for CPU ranks)", parent->name);
  /* A parent that already speaks NCCL splits that communicator too (collective over it). */
  if (!rc && b == parent->cpu && parent->gpu && parent->gpu_state) rc = parent->gpu->split(parent, color, key, c);
  if (rc) {
    if (c->cpu) c->cpu->destroy(c);
    free(c);
    return sh_fail_context("comm split of %s (color %d, rank %d): ", parent->name, color, parent->rank);
  }
  if (c->size == 0) { free(c); return SH_OK; }
  if (b == parent->cpu) {
    if (c->size == 1 && c->cpu == &sh_comm_mpi_backend) { sh_comm_mpi_backend.destroy(c); c->cpu = NULL; }
    if (!c->cpu) c->cpu = &sh_comm_local_backend;
  } else {
    c->cpu = c->size > 1 ? &none_backend : &sh_comm_local_backend;
  }
  link_comm(c);
  *out = c;
  return SH_OK;
}

int sh_comm_rank(const sh_comm *c) { return c ? c->rank : 0; }
int sh_comm_size(const sh_comm *c) { return c ? c->size : 1; }
int sh_comm_local_rank(const sh_comm *c) { return c ? c->local_rank : 0; }
int sh_comm_node(const sh_comm *c) { return c ? c->node : 0; }
int sh_comm_n_nodes(const sh_comm *c) { return c ? c->n_nodes : 1; }
int sh_comm_local_size(const sh_comm *c) { return c ? c->local_size : 1; }
int sh_comm_nodes_uniform(const sh_comm *c) { return c ? c->nodes_uniform : 1; }
const char *sh_comm_node_name(const sh_comm *c) { return c ? c->node_name : ""; }

int sh_comm_split_node(sh_comm **out, sh_comm *c) {
  *out = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "comm split_node: expected a group, got nil");
  c->splitting_node = 1;
  int rc = sh_comm_split(out, c, c->node, c->rank);
  c->splitting_node = 0;
  SH_TRY(rc);
  char name[96];
  snprintf(name, sizeof name, "%.60s node %d", c->name, c->node);
  return sh_comm_set_name(*out, name);
}
const char *sh_comm_name(const sh_comm *c) { return c ? c->name : "nil"; }
const char *sh_comm_backend_name(const sh_comm *c) { return c && c->cpu ? c->cpu->name : "none"; }


int sh_comm_set_name(sh_comm *c, const char *name) {
  if (!c || !name) return sh_fail(SH_ERR_ARG, "comm set_name: expected a group and a name");
  snprintf(c->name, sizeof c->name, "%s", name);
  return SH_OK;
}

int sh_comm_set_counted(sh_comm *c, int counted) {
  if (!c) return sh_fail(SH_ERR_ARG, "comm set_counted: expected a group, got nil");
  c->uncounted = !counted;
  return SH_OK;
}

int sh_comm_set_timeout(sh_comm *c, double seconds) {
  if (!c) return sh_fail(SH_ERR_ARG, "comm set_timeout: expected a group, got nil");
  if (!(seconds > 0) || !isfinite(seconds))
    return sh_fail(SH_ERR_ARG, "comm set_timeout: %g s for %s; expected a positive number of seconds", seconds, c->name);
  c->timeout = seconds;
  return SH_OK;
}
double sh_comm_timeout(const sh_comm *c) { return c ? c->timeout : default_timeout(); }

double sh_comm_wait_seconds(void) { return g_wait_seconds; }

int64_t sh_comm_count(const sh_comm *c, int kind) {
  if (kind < 0 || kind >= SH_COLL_N) return 0;
  return c ? c->count[kind] : g_count[kind];
}
int64_t sh_comm_bytes(const sh_comm *c, int kind) {
  if (kind < 0 || kind >= SH_COLL_N) return 0;
  return c ? c->bytes[kind] : g_bytes[kind];
}
void sh_comm_reset_counts(sh_comm *c) {
  if (c) { memset(c->count, 0, sizeof c->count); memset(c->bytes, 0, sizeof c->bytes); return; }
  memset(g_count, 0, sizeof g_count);
  memset(g_bytes, 0, sizeof g_bytes);
  for (sh_comm *p = g_live; p; p = p->next) sh_comm_reset_counts(p);
}

/* ---- validation ------------------------------------------------------------------------ */

static int check_tensor(const char *op, const sh_comm *c, const sh_tensor *t, const char *role) {
  if (!t) return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): %s tensor is nil", op, c->name, c->rank, role);
  if (!t->storage)
    return sh_fail(SH_ERR_FREED, "%s on %s (rank %d): %s tensor %s was used after :free() or reshard",
                   op, c->name, c->rank, role, sh_desc(t));
  if (!sh_tensor_is_contiguous(t))
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): %s tensor %s must be contiguous (call :contiguous())",
                   op, c->name, c->rank, role, sh_desc(t));
  return SH_OK;
}

static int check_pair(const char *op, const sh_comm *c, const sh_tensor *out, const sh_tensor *in) {
  SH_TRY(check_tensor(op, c, out, "output"));
  SH_TRY(check_tensor(op, c, in, "input"));
  if (out->dtype != in->dtype || out->device != in->device)
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): input %s and output %s must have the same dtype and device",
                   op, c->name, c->rank, sh_desc(in), sh_desc(out));
  return SH_OK;
}

static int check_reduce(const char *op, const sh_comm *c, const sh_tensor *t, int rop, int rd) {
  if (rop < SH_RED_SUM || rop > SH_RED_MIN)
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): unknown reduce op %d (sum 0, avg 1, max 2, min 3)", op, c->name, c->rank, rop);
  if (rd != -1 && !sh_dtype_is_float(rd))
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): reduce dtype %s is not a float dtype", op, c->name, c->rank, sh_dtype_name(rd));
  if (rd != -1 && !sh_dtype_is_float(t->dtype))
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): a reduce dtype only applies to float tensors, got %s", op, c->name, c->rank, sh_desc(t));
  if (rop == SH_RED_AVG && !sh_dtype_is_float(t->dtype))
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): avg needs a float tensor, got %s", op, c->name, c->rank, sh_desc(t));
  if (t->dtype == SH_BOOL && rop == SH_RED_SUM)
    return sh_fail(SH_ERR_ARG, "%s on %s (rank %d): sum of a bool tensor; use max (or) or min (and)", op, c->name, c->rank);
  return SH_OK;
}

/* ---- issuing and waiting --------------------------------------------------------------- */

static int alias_or_null(sh_tensor **out, const sh_tensor *t) {
  *out = NULL;
  return t ? sh_tensor_alias(out, t) : SH_OK;
}

static void work_release(sh_comm_work *w) {
  destroy_device_events(w->device_events);   /* never recorded in the ring */
  sh_tensor_destroy(w->in);
  if (w->out != w->in) sh_tensor_destroy(w->out);
  free(w);
}

static const sh_comm_backend *device_backend(const sh_comm *c) {
  if (c->gpu) return c->gpu;
  return c->size == 1 ? &sh_comm_local_backend : NULL;
}

const char *sh_comm_device_backend_name(const sh_comm *c) {
  const sh_comm_backend *b = c ? device_backend(c) : NULL;
  return b ? b->name : "none";
}

static int issue(sh_comm_work **out, sh_comm *c, int kind, sh_tensor *dst, const sh_tensor *src,
                 int op, int rd, int root) {
  *out = NULL;
  const sh_tensor *any = dst ? dst : src;
  /* CUDA tensors go through NCCL (a group of one without it copies on the device); a barrier
   * through the CPU side unless only NCCL spans the ranks. */
  const sh_comm_backend *b = any ? (any->device >= 0 ? device_backend(c) : c->cpu)
                                 : (c->cpu != &none_backend || !c->gpu ? c->cpu : c->gpu);
  if (any && sh_is_meta(any->device) && b != &sh_comm_dry_backend)
    return sh_fail(SH_ERR_DEVICE, "%s on %s (rank %d): %s is a meta tensor, which only a dry-run world "
                   "(shard estimate --dry-run) can take", KIND_NAME[kind], c->name, c->rank, sh_desc(any));
  if (!b)
    return sh_fail(SH_ERR_DEVICE, "%s on %s (rank %d): %s is a CUDA tensor but shard was built without NCCL",
                   KIND_NAME[kind], c->name, c->rank, sh_desc(any));
  if (c->abandoned)
    return sh_fail(SH_ERR_COMM, "%s on %s (rank %d): the group is unusable since an earlier collective "
                   "timed out and was abandoned", KIND_NAME[kind], c->name, c->rank);
  sh_comm_work *w = calloc(1, sizeof *w);
  if (!w) return sh_fail(SH_ERR_OOM, "%s: out of host memory for a work handle", KIND_NAME[kind]);
  *w = (sh_comm_work){ .comm = c, .backend = b, .kind = kind, .op = op, .reduce_dtype = rd, .root = root };
  if (alias_or_null(&w->in, src) || (dst == src ? (w->out = w->in, 0) : alias_or_null(&w->out, dst))) {
    work_release(w);
    return sh_fail_context("%s on %s: ", KIND_NAME[kind], c->name);
  }
  if (kind == SH_COLL_BARRIER) snprintf(w->what, sizeof w->what, "barrier");
  else if (kind == SH_COLL_ALL_GATHER || kind == SH_COLL_BROADCAST || kind == SH_COLL_ALL_TO_ALL) snprintf(w->what, sizeof w->what, "%s of %s", KIND_NAME[kind], sh_desc(src));
  else snprintf(w->what, sizeof w->what, "%s of %s (%s%s%s)", KIND_NAME[kind], sh_desc(src), OP_NAME[op],
                rd >= 0 ? " in " : "", rd >= 0 ? sh_dtype_name(rd) : "");
  int64_t bytes = src ? sh_tensor_numel(src) * sh_dtype_size(src->dtype) : 0;
  c->count[kind]++;
  c->bytes[kind] += bytes;
  if (!c->uncounted) { g_count[kind]++; g_bytes[kind] += bytes; }
  w->seq = ++c->seq;
  w->bytes = bytes;
  w->issued = sh_comm_now();
  w->label = g_trace.label;
  flight_issue(c, w);
  int gone = launcher_gone(w->issued);
  if (gone) {
    int rc = fail_launcher_gone(w, gone);
    work_release(w);
    return rc;
  }
  if (b == c->gpu) device_events_before(w, any);
  int rc = b->start(w);
  if (!rc) device_events_after(w, any);
  if (rc) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s", w->what);
    work_release(w);
    return sh_fail_context("%s on %s (rank %d of %d): ", msg, c->name, c->rank, c->size);
  }
  trace_done(w);
  *out = w;
  return SH_OK;
}

int sh_comm_test(sh_comm_work *w, int *done) {
  *done = 0;
  if (!w) return sh_fail(SH_ERR_ARG, "comm test: expected a work handle, got nil");
  if (!w->done) {
    int rc = w->backend->test(w, &w->done);
    if (rc) { w->done = 1; w->status = rc; snprintf(w->why, sizeof w->why, "%s", sh_last_error()); }
    if (!rc) trace_done(w);
  }
  *done = w->done;
  if (w->done && w->status)
    return sh_fail(w->status, "%s on %s (rank %d of %d) failed: %s", w->what, w->comm->name, w->comm->rank, w->comm->size, w->why);
  return SH_OK;
}

/* Polls with a growing pause: MPI progresses only inside its calls, and the ranks share
 * few cores, so spinning would starve the peers we wait for. */
int sh_comm_wait(sh_comm_work *w) {
  if (!w) return sh_fail(SH_ERR_ARG, "comm wait: expected a work handle, got nil");
  double t0 = sh_comm_now();
  long pause_ns = 0;
  for (int polls = 0;; polls++) {
    int done = 0;
    int rc = sh_comm_test(w, &done);
    if (rc || done) {
      if (polls > 0) {
        double waited = sh_comm_now() - t0;
        g_wait_seconds += waited;
        flight_wait(w, 0, t0, waited);
        trace_push(w, 1, t0, t0 + waited);
      }
      return rc;
    }
    if (polls == 0) flight_wait(w, 1, t0, 0);
    double now = sh_comm_now(), waited = now - t0;
    if (g_flight) g_flight->active_at = now;
    int gone = launcher_gone(now);
    if (gone) return fail_launcher_gone(w, gone);
    if (waited > w->comm->timeout) {
      g_timed_out = 1;
      flight_wait(w, 2, t0, waited);
      flight_snapshot(g_world);
      /* Across nodes a lost link looks the same from here: every rank waits. */
      char where[160] = "";
      if (w->comm->n_nodes > 1)
        snprintf(where, sizeof where, ", or the network between this node (%s, node %d of %d) and another lost the way",
                 w->comm->node_name, w->comm->node, w->comm->n_nodes);
      return sh_fail(SH_ERR_COMM, "comm: %s #%lld on %s timed out after %.3g s on rank %d of %d "
                     "(another rank did not join: it failed, skipped the collective, or is stuck%s; "
                     "the timeout is %g s: shard launch --timeout=SECONDS or SHARD_COMM_TIMEOUT)",
                     w->what, (long long)w->seq, w->comm->name, waited, w->comm->rank, w->comm->size, where,
                     w->comm->timeout);
    }
    if (polls > 64) pause_ns = pause_ns ? (pause_ns * 2 > 1000000 ? 1000000 : pause_ns * 2) : 1000;
    struct timespec ts = { 0, pause_ns };
    if (pause_ns) nanosleep(&ts, NULL);
  }
}

/* Gives up an op still pending after its timeout: the peers never came. The buffers it would
 * write stay referenced (leaked) so that a late completion cannot touch freed memory. */
static void abandon(sh_comm_work *w) {
  destroy_device_events(w->device_events);
  w->backend->abandon(w);
  w->comm->abandoned = 1;
  free(w);
}

/* Once a collective of this process timed out, the job is ending: work still pending when
 * its handle is freed (a prefetched gather, a reduction in flight, freed on the way out) is
 * given up at once instead of awaited a timeout each. An explicit sh_comm_wait still waits. */
void sh_comm_work_free(sh_comm_work *w) {
  if (!w) return;
  if (w->ordered) { work_release(w); return; }
  int done = 0;
  if (!w->done && g_timed_out) sh_comm_test(w, &done);   /* finished meanwhile: release normally */
  if (!w->done && (g_timed_out || (sh_comm_wait(w) != SH_OK && !w->done))) { abandon(w); return; }
  work_release(w);
}

int sh_comm_work_order(sh_comm_work *w) {
  if (!w) return sh_fail(SH_ERR_ARG, "comm order: expected a work handle, got nil");
  if (w->ordered) return SH_OK;
  if (!w->backend->order || w->done) return sh_comm_wait(w);
  int rc = w->backend->order(w);
  if (rc) {
    w->done = 1;
    w->status = rc;
    return sh_fail_context("%s on %s (rank %d of %d): ", w->what, w->comm->name, w->comm->rank, w->comm->size);
  }
  w->ordered = w->done = 1;
  trace_done(w);
  return SH_OK;
}

int sh_comm_work_then_begin(sh_comm_work *w) {
  if (!w) return sh_fail(SH_ERR_ARG, "comm then: expected a work handle, got nil");
  if (!w->backend->then_begin || w->done) return sh_comm_wait(w);
  return w->backend->then_begin(w);
}

int sh_comm_work_then_end(sh_comm_work *w) {
  if (!w) return sh_fail(SH_ERR_ARG, "comm then: expected a work handle, got nil");
  if (!w->backend->then_end || w->done) return SH_OK;
  return w->backend->then_end(w);
}

/* The blocking forms: a device collective is ordered on the caller's stream, a host one
 * waited for. */
static int run(sh_comm_work *w, int rc) {
  if (rc) return rc;
  rc = sh_comm_work_order(w);
  if (w->done) work_release(w); else abandon(w);
  return rc;
}

/* ---- the collectives ------------------------------------------------------------------- */

int sh_comm_all_gather_into_async(sh_comm_work **work, sh_comm *c, sh_tensor *out, const sh_tensor *in) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "all_gather: expected a group, got nil");
  SH_TRY(check_pair("all_gather", c, out, in));
  if (sh_tensor_numel(out) != sh_tensor_numel(in) * c->size)
    return sh_fail(SH_ERR_ARG, "all_gather on %s (rank %d of %d): output %s must have %d x %lld elements for input %s",
                   c->name, c->rank, c->size, sh_desc(out), c->size, (long long)sh_tensor_numel(in), sh_desc(in));
  return issue(work, c, SH_COLL_ALL_GATHER, out, in, SH_RED_SUM, -1, 0);
}

int sh_comm_reduce_scatter_async(sh_comm_work **work, sh_comm *c, sh_tensor *out, const sh_tensor *in, int op, int rd) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "reduce_scatter: expected a group, got nil");
  SH_TRY(check_pair("reduce_scatter", c, out, in));
  SH_TRY(check_reduce("reduce_scatter", c, in, op, rd));
  if (sh_tensor_numel(in) != sh_tensor_numel(out) * c->size)
    return sh_fail(SH_ERR_ARG, "reduce_scatter on %s (rank %d of %d): input %s must have %d x %lld elements for output %s",
                   c->name, c->rank, c->size, sh_desc(in), c->size, (long long)sh_tensor_numel(out), sh_desc(out));
  return issue(work, c, SH_COLL_REDUCE_SCATTER, out, in, op, rd, 0);
}

int sh_comm_all_reduce_async(sh_comm_work **work, sh_comm *c, sh_tensor *t, int op, int rd) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "all_reduce: expected a group, got nil");
  SH_TRY(check_tensor("all_reduce", c, t, "the"));
  SH_TRY(check_reduce("all_reduce", c, t, op, rd));
  return issue(work, c, SH_COLL_ALL_REDUCE, t, t, op, rd, 0);
}

int sh_comm_broadcast_async(sh_comm_work **work, sh_comm *c, sh_tensor *t, int root) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "broadcast: expected a group, got nil");
  SH_TRY(check_tensor("broadcast", c, t, "the"));
  if (root < 0 || root >= c->size)
    return sh_fail(SH_ERR_ARG, "broadcast on %s (rank %d of %d): root %d is not a rank of the group", c->name, c->rank, c->size, root);
  return issue(work, c, SH_COLL_BROADCAST, t, t, SH_RED_SUM, -1, root);
}

int sh_comm_all_to_all_into_async(sh_comm_work **work, sh_comm *c, sh_tensor *out, const sh_tensor *in) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "all_to_all: expected a group, got nil");
  SH_TRY(check_pair("all_to_all", c, out, in));
  int64_t n = sh_tensor_numel(in);
  if (sh_tensor_numel(out) != n || n % c->size != 0)
    return sh_fail(SH_ERR_ARG, "all_to_all on %s (rank %d of %d): input %s and output %s must have the same "
                   "number of elements, a multiple of %d", c->name, c->rank, c->size, sh_desc(in), sh_desc(out), c->size);
  if (out->storage == in->storage && c->size > 1)
    return sh_fail(SH_ERR_ARG, "all_to_all on %s (rank %d): input %s and output %s share a storage; give them "
                   "distinct memory", c->name, c->rank, sh_desc(in), sh_desc(out));
  return issue(work, c, SH_COLL_ALL_TO_ALL, out, in, SH_RED_SUM, -1, 0);
}

int sh_comm_barrier_async(sh_comm_work **work, sh_comm *c) {
  *work = NULL;
  if (!c) return sh_fail(SH_ERR_ARG, "barrier: expected a group, got nil");
  return issue(work, c, SH_COLL_BARRIER, NULL, NULL, SH_RED_SUM, -1, 0);
}

int sh_comm_all_gather_into(sh_comm *c, sh_tensor *out, const sh_tensor *in) {
  sh_comm_work *w;
  int rc = sh_comm_all_gather_into_async(&w, c, out, in);
  return run(w, rc);
}
int sh_comm_reduce_scatter(sh_comm *c, sh_tensor *out, const sh_tensor *in, int op, int rd) {
  sh_comm_work *w;
  int rc = sh_comm_reduce_scatter_async(&w, c, out, in, op, rd);
  return run(w, rc);
}
int sh_comm_all_to_all_into(sh_comm *c, sh_tensor *out, const sh_tensor *in) {
  sh_comm_work *w;
  int rc = sh_comm_all_to_all_into_async(&w, c, out, in);
  return run(w, rc);
}
int sh_comm_all_reduce(sh_comm *c, sh_tensor *t, int op, int rd) {
  sh_comm_work *w;
  int rc = sh_comm_all_reduce_async(&w, c, t, op, rd);
  return run(w, rc);
}
int sh_comm_broadcast(sh_comm *c, sh_tensor *t, int root) {
  sh_comm_work *w;
  int rc = sh_comm_broadcast_async(&w, c, t, root);
  return run(w, rc);
}
int sh_comm_barrier(sh_comm *c) {
  sh_comm_work *w;
  int rc = sh_comm_barrier_async(&w, c);
  return run(w, rc);
}
