/* parallel.c: the CPU thread team (see parallel.h).
 * The workers wait on one 32-bit word, `job`: a generation count above the job's thread count
 * (low 8 bits). The caller writes fn and ctx, sets `pending` to the number of workers taking
 * part, then bumps `job`; each worker that takes part runs fn and counts `pending` down. The
 * caller reuses fn and ctx only once `pending` is 0, so a worker never reads a half-written
 * job. Both words are futexes, woken only when someone sleeps on them. */
#define _GNU_SOURCE
#include "parallel.h"
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { MAX_THREADS = 255, NT_BITS = 8 };

/* How long an idle worker spins when the team has its cores to itself: longer than the gaps
 * between a step's ops (30-60 us of Lua), short enough that a worker left idle (the optimizer's
 * Lua, a data load) soon gives its core back. */
static const long SPIN_WHEN_ALONE_NS = 200 * 1000;

static struct {
  pthread_mutex_t lock;            /* one caller at a time; a second runs its call inline */
  _Atomic uint32_t job;            /* generation << NT_BITS | thread count: workers wait on it */
  _Atomic uint32_t pending;        /* workers still running the current job: the caller waits on it */
  _Atomic int sleeping_workers;
  _Atomic int caller_sleeping;
  sh_parallel_fn fn;
  void *ctx;
  int size;                        /* threads, the caller included */
  int started;                     /* workers running */
  _Atomic long spin_ns;            /* the wait policy's spin (spin_policy) */
} team = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Contention: a thread of the team that waited for a CPU while runnable for more than a
 * third of the last PROBE_NS (the kernel's per-thread run-queue delay, the second figure of
 * /proc/thread-self/schedstat) shares its core with another runnable thread; then nobody in
 * the team spins for QUIET_NS, since a spinner would take the time that thread, of this team
 * or of another process, needs. Short preemptions (a kernel worker) and the wake-up of a
 * sleeping worker stay well below that (measured here: bursts of a third to two thirds while
 * the kernel briefly put both threads of a 2-thread team on one CPU, 50% beside a busy
 * process). */
static const long PROBE_NS = 5 * 1000 * 1000, QUIET_NS = 20 * 1000 * 1000;
static _Atomic long no_spin_until;
static __thread long next_probe, delay_seen;
static __thread int schedstat_fd = -1;
static pthread_key_t schedstat_key;   /* closes a thread's schedstat_fd when it exits */

static pthread_once_t team_once = PTHREAD_ONCE_INIT;
static __thread int inside;

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int count) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

/* This thread's run-queue delay so far in ns, or -1 when the kernel does not say. */
static long run_queue_delay(void) {
  if (schedstat_fd < 0) {
    schedstat_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (schedstat_fd >= 0) pthread_setspecific(schedstat_key, (void *)(intptr_t)(schedstat_fd + 1));
  }
  char buf[96];
  ssize_t n = schedstat_fd < 0 ? -1 : pread(schedstat_fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = 0;
  char *end;
  strtol(buf, &end, 10);   /* time on the CPU */
  return strtol(end, NULL, 10);
}

/* How long this thread may spin now: team.spin_ns unless the team lately met contention. */
static long spin_budget(void) {
  long spin_ns = atomic_load_explicit(&team.spin_ns, memory_order_relaxed);
  if (spin_ns == 0 || spin_ns == LONG_MAX) return spin_ns;
  long t = now_ns();
  if (t >= next_probe) {
    long delay = run_queue_delay();
    if (delay < 0 || (next_probe && delay - delay_seen > (t - next_probe + PROBE_NS) / 3))
      atomic_store_explicit(&no_spin_until, t + QUIET_NS, memory_order_relaxed);
    delay_seen = delay;
    next_probe = t + PROBE_NS;
  }
  return t < atomic_load_explicit(&no_spin_until, memory_order_relaxed) ? 0 : spin_ns;
}

/* 1 once *word differs from `old`, spinning up to ns; 0 when the time ran out first. */
static int spin_until_changed(_Atomic uint32_t *word, uint32_t old, long ns) {
  if (ns <= 0) return atomic_load_explicit(word, memory_order_acquire) != old;
  long start = now_ns();
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (atomic_load_explicit(word, memory_order_acquire) != old) return 1;
      cpu_relax();
    }
    if (now_ns() - start > ns) return 0;
  }
}

/* The next job word after `seen`: spin, then sleep until the caller bumps it. */
static uint32_t wait_for_job(uint32_t seen) {
  if (!spin_until_changed(&team.job, seen, spin_budget())) {
    atomic_fetch_add(&team.sleeping_workers, 1);
    while (atomic_load(&team.job) == seen) futex_wait(&team.job, seen);
    atomic_fetch_sub(&team.sleeping_workers, 1);
  }
  return atomic_load_explicit(&team.job, memory_order_acquire);
}

/* arg: the worker's id (low NT_BITS bits, as ids stay below MAX_THREADS) above the job word
 * when it was made, the last job it need not run (it may start after the caller published
 * the next one). */
static void *worker_main(void *arg) {
  int id = (int)((uintptr_t)arg & ((1u << NT_BITS) - 1));
  uint32_t seen = (uint32_t)((uintptr_t)arg >> NT_BITS);
  inside = 1;
  for (;;) {
    seen = wait_for_job(seen);
    int nt = (int)(seen & ((1u << NT_BITS) - 1));
    if (id >= nt) continue;
    team.fn(team.ctx, id, nt);
    if (atomic_fetch_sub(&team.pending, 1) == 1 && atomic_load(&team.caller_sleeping)) futex_wake(&team.pending, 1);
  }
  return NULL;
}

/* The caller, done with its own part: spin, then sleep until every worker is done. */
static void wait_for_workers(void) {
  uint32_t left = atomic_load_explicit(&team.pending, memory_order_acquire);
  while (left != 0) {
    if (spin_until_changed(&team.pending, left, spin_budget())) {
      left = atomic_load_explicit(&team.pending, memory_order_acquire);
      continue;
    }
    atomic_store(&team.caller_sleeping, 1);
    while ((left = atomic_load(&team.pending)) != 0) futex_wait(&team.pending, left);
    atomic_store(&team.caller_sleeping, 0);
  }
}

static int cpus_available(void) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

static int threads_wanted(int cpus) {
  const char *v = getenv("OMP_NUM_THREADS");
  int n = v ? atoi(v) : 0;   /* "4" or "4,2": the outer level counts */
  n = n > 0 ? n : cpus;
  return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

/* The wait policy's inputs, under policy_lock: the ranks on this node (comm.c tells them), and
 * the team's size and CPUs as team_init found them, once it ran (started). */
static pthread_mutex_t policy_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { int ranks_per_node, threads, cpus, started; } policy = { .ranks_per_node = 1 };

static long spin_policy(int threads, int cpus, int ranks) {
  const char *w = getenv("OMP_WAIT_POLICY");
  if (w && strcasecmp(w, "passive") == 0) return 0;
  if (w && strcasecmp(w, "active") == 0) return LONG_MAX;
  return (long)ranks * threads <= cpus ? SPIN_WHEN_ALONE_NS : 0;
}

void sh_parallel_set_ranks_per_node(int n) {
  pthread_mutex_lock(&policy_lock);
  policy.ranks_per_node = n < 1 ? 1 : n;
  if (policy.started)   /* the team already runs: its policy changes now */
    atomic_store(&team.spin_ns, spin_policy(policy.threads, policy.cpus, policy.ranks_per_node));
  pthread_mutex_unlock(&policy_lock);
}

static void close_schedstat(void *fd_plus_1) { close((int)(intptr_t)fd_plus_1 - 1); }

/* A forked child has none of the parent's workers (it starts its own when it needs them), and
 * its schedstat file is its own; the contention the parent's threads met is not its own. */
static void forget_workers(void) {
  if (schedstat_fd >= 0) close(schedstat_fd);
  schedstat_fd = -1;
  next_probe = 0;
  atomic_store(&no_spin_until, 0);
  pthread_mutex_init(&team.lock, NULL);
  pthread_mutex_init(&policy_lock, NULL);
  team.started = 0;
  atomic_store(&team.sleeping_workers, 0);
  atomic_store(&team.caller_sleeping, 0);
  atomic_store(&team.pending, 0);
  inside = 0;
}

static void team_init(void) {
  int cpus = cpus_available();
  team.size = threads_wanted(cpus);
  pthread_mutex_lock(&policy_lock);
  policy.threads = team.size;
  policy.cpus = cpus;
  policy.started = 1;
  atomic_store(&team.spin_ns, spin_policy(policy.threads, policy.cpus, policy.ranks_per_node));
  pthread_mutex_unlock(&policy_lock);
  pthread_key_create(&schedstat_key, close_schedstat);
  pthread_atfork(NULL, NULL, forget_workers);
}

/* Starts the missing workers (under team.lock); the team shrinks to those that started. A
 * team made smaller keeps its extra workers, idle. */
static void start_workers(void) {
  while (team.started < team.size - 1) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    uintptr_t arg = (uintptr_t)atomic_load(&team.job) << NT_BITS | (uintptr_t)(team.started + 1);
    int rc = pthread_create(&th, &attr, worker_main, (void *)arg);
    pthread_attr_destroy(&attr);
    if (rc != 0) { team.size = team.started + 1; return; }
    team.started++;
  }
}

int sh_parallel_threads(void) {
  pthread_once(&team_once, team_init);
  return team.size;
}

void sh_parallel_set_threads(int n) {
  pthread_once(&team_once, team_init);
  pthread_mutex_lock(&team.lock);
  team.size = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
  pthread_mutex_unlock(&team.lock);
}

long sh_parallel_spin_ns(void) {
  pthread_once(&team_once, team_init);
  return spin_budget();
}

int sh_parallel_inside(void) { return inside; }

static void run_inline(int nt, sh_parallel_fn fn, void *ctx) {
  int was_inside = inside;
  inside = 1;
  for (int t = 0; t < nt; t++) fn(ctx, t, nt);
  inside = was_inside;
}

void sh_parallel(int nt, sh_parallel_fn fn, void *ctx) {
  int size = sh_parallel_threads();
  if (nt > size) nt = size;
  if (nt < 1) nt = 1;
  if (nt == 1 || inside || pthread_mutex_trylock(&team.lock) != 0) { run_inline(nt, fn, ctx); return; }
  start_workers();
  if (nt > team.size) nt = team.size;
  team.fn = fn;
  team.ctx = ctx;
  atomic_store(&team.pending, (uint32_t)(nt - 1));
  uint32_t generation = (atomic_load_explicit(&team.job, memory_order_relaxed) >> NT_BITS) + 1;
  atomic_store(&team.job, generation << NT_BITS | (uint32_t)nt);
  if (atomic_load(&team.sleeping_workers) > 0) futex_wake(&team.job, INT_MAX);
  inside = 1;
  fn(ctx, 0, nt);
  inside = 0;
  wait_for_workers();
  pthread_mutex_unlock(&team.lock);
}

typedef struct range_job { int64_t n; sh_range_fn fn; void *ctx; } range_job;

static void run_range(void *arg, int t, int nt) {
  const range_job *j = arg;
  int64_t i0 = j->n * t / nt, i1 = j->n * (t + 1) / nt;
  if (i1 > i0) j->fn(j->ctx, i0, i1);
}

void sh_parallel_for(int64_t n, int split, sh_range_fn fn, void *ctx) {
  if (n <= 0) return;
  int nt = split ? sh_parallel_threads() : 1;
  if (nt > n) nt = (int)n;
  if (nt <= 1) { fn(ctx, 0, n); return; }
  range_job job = {.n = n, .fn = fn, .ctx = ctx};
  sh_parallel(nt, run_range, &job);
}
