/* test_parallel.c: the CPU thread team (runtime/core/parallel.c). Every part of a call runs once,
 * each on a thread of its own; nested and concurrent calls run inline with the same split;
 * sh_parallel_for covers its range exactly once; no wake-up is lost over many short calls
 * whether the workers spin, sleep at once or adapt (each wait policy in a forked child,
 * which also checks that a child starts a team of its own); the ranks on the node set the
 * wait; a hang fails by alarm. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "core/parallel.h"

enum { MAX_T = 8 };

typedef struct parts {
  _Atomic int runs[MAX_T];
  pthread_t who[MAX_T];
  _Atomic int bad_nt;
  int want_nt;
} parts;

static void record(void *arg, int t, int nt) {
  parts *p = arg;
  if (nt != p->want_nt || t < 0 || t >= MAX_T) { atomic_fetch_add(&p->bad_nt, 1); return; }
  atomic_fetch_add(&p->runs[t], 1);
  p->who[t] = pthread_self();
}

static void test_each_part_once_on_its_own_thread(void) {
  sh_parallel_set_threads(4);
  for (int nt = 1; nt <= 6; nt++) {
    parts p = { .want_nt = nt < 4 ? nt : 4 };
    sh_parallel(nt, record, &p);
    CHECK(p.bad_nt == 0, "nt %d: fn saw a thread count other than %d", nt, p.want_nt);
    for (int t = 0; t < MAX_T; t++)
      CHECK(p.runs[t] == (t < p.want_nt), "nt %d: part %d ran %d times", nt, t, (int)p.runs[t]);
    CHECK(pthread_equal(p.who[0], pthread_self()), "nt %d: the caller runs part 0", nt);
    for (int a = 0; a < p.want_nt; a++)
      for (int b = a + 1; b < p.want_nt; b++)
        CHECK(!pthread_equal(p.who[a], p.who[b]), "nt %d: parts %d and %d ran on one thread", nt, a, b);
  }
  sh_parallel_set_threads(2);
}

/* A call made from inside a part runs all its parts on that thread, with the same split. */
static void nested(void *arg, int t, int nt) {
  parts *inner = (parts *)arg + 1 + t;
  inner->want_nt = 2;
  sh_parallel(2, record, inner);
  CHECK(sh_parallel_inside(), "inside a part, sh_parallel_inside is 1");
}

static void test_nested_call_runs_inline(void) {
  sh_parallel_set_threads(2);
  parts p[3] = { { .want_nt = 2 } };
  sh_parallel(2, nested, p);
  for (int t = 0; t < 2; t++) {
    parts *in = &p[1 + t];
    CHECK(in->bad_nt == 0 && in->runs[0] == 1 && in->runs[1] == 1, "nested call %d: each part once", t);
    CHECK(pthread_equal(in->who[0], in->who[1]), "nested call %d: both parts on the calling thread", t);
  }
  CHECK(!sh_parallel_inside(), "after the call, sh_parallel_inside is 0 again");
}

typedef struct cover { _Atomic int hits[1000]; _Atomic int calls; } cover;

static void hit(void *arg, int64_t i0, int64_t i1) {
  cover *c = arg;
  atomic_fetch_add(&c->calls, 1);
  for (int64_t i = i0; i < i1; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_parallel_for_covers_the_range_once(void) {
  sh_parallel_set_threads(3);
  static const int64_t sizes[] = { 0, 1, 2, 3, 7, 1000 };
  for (int s = 0; s < 6; s++)
    for (int split = 0; split <= 1; split++) {
      cover c = { 0 };
      sh_parallel_for(sizes[s], split, hit, &c);
      int once = 1;
      for (int64_t i = 0; i < 1000; i++) once &= c.hits[i] == (i < sizes[s]);
      CHECK(once, "n %lld split %d: every index once, none outside", (long long)sizes[s], split);
      int want = sizes[s] == 0 ? 0 : !split ? 1 : sizes[s] < 3 ? (int)sizes[s] : 3;
      CHECK(c.calls == want, "n %lld split %d: %d calls, expected %d", (long long)sizes[s], split, (int)c.calls, want);
    }
  sh_parallel_set_threads(2);
}

/* Two threads calling at once: one has the team, the other runs inline; both complete. */
static void *caller(void *arg) {
  parts *p = arg;
  for (int i = 0; i < 2000; i++) {
    for (int t = 0; t < MAX_T; t++) p->runs[t] = 0;
    sh_parallel(2, record, p);
    if (p->runs[0] != 1 || p->runs[1] != 1) atomic_fetch_add(&p->bad_nt, 1);
  }
  return NULL;
}

static void test_concurrent_callers(void) {
  sh_parallel_set_threads(2);
  parts a = { .want_nt = 2 }, b = { .want_nt = 2 };
  pthread_t th;
  pthread_create(&th, NULL, caller, &a);
  caller(&b);
  pthread_join(th, NULL);
  CHECK(a.bad_nt == 0 && b.bad_nt == 0, "concurrent callers: every call ran each part once (%d, %d bad)",
        (int)a.bad_nt, (int)b.bad_nt);
}

static void count_part(void *arg, int t, int nt) { atomic_fetch_add((_Atomic long *)arg + t, 1); }

/* Many calls with gaps around a worker's spin, in a child with the given wait policy (on 2
 * threads, 1 with a single CPU: "active" spins without end, so more threads than cores would
 * crawl). */
enum { CALLS = 20000 };
static int stress_in_child(const char *policy) {
  pid_t pid = fork();
  if (pid == 0) {
    if (policy) setenv("OMP_WAIT_POLICY", policy, 1);
    else unsetenv("OMP_WAIT_POLICY");
    alarm(60);
    cpu_set_t cpus;
    int nt = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2 ? 1 : 2;
    sh_parallel_set_threads(nt);
    _Atomic long runs[2] = { 0 };
    for (int i = 0; i < CALLS; i++) {
      sh_parallel(nt, count_part, runs);
      if (i % 1000 == 999) usleep(300);   /* longer than the spin: the workers sleep */
    }
    _exit(runs[0] == CALLS && runs[1] == (nt == 2 ? CALLS : 0) ? 0 : 3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void test_no_lost_wakeups(void) {
  const char *policies[] = { "passive", "active", NULL };
  for (int k = 0; k < 3; k++) {
    int rc = stress_in_child(policies[k]);
    CHECK(rc == 0, "wait policy %s: %d calls, each part once (child %s %d)", policies[k] ? policies[k] : "default", CALLS,
          rc >= 100 ? "killed by signal" : "exit", rc >= 100 ? rc - 100 : rc);
  }
}

/* A process that only spins, killed with its parent (even one killed by alarm). */
static void busy_forever(void) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  for (volatile unsigned long i = 0;; i++) {}
}

/* Beside two busy processes on two CPUs the team waits for its cores: it stops spinning (the
 * policy alone would spin, the team fitting the CPUs). */
enum { SKIP = 6 };

static void test_contention_stops_the_spin(void) {
  pid_t pid = fork();
  if (pid == 0) {
    cpu_set_t two;
    CPU_ZERO(&two);
    CPU_SET(0, &two);
    CPU_SET(1, &two);
    if (sched_setaffinity(0, sizeof two, &two) != 0 || sched_getaffinity(0, sizeof two, &two) != 0 || CPU_COUNT(&two) < 2)
      _exit(SKIP);
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("OMP_NUM_THREADS");
    alarm(60);
    sh_parallel_set_threads(2);
    _Atomic long runs[2] = { 0 };
    /* alone, the team spins: soon (up to about half a second of calls and naps), as a moment
     * of someone else's load (a kernel thread, the test run's previous process) stops it for
     * 20 ms */
    long alone = sh_parallel_spin_ns();
    for (int i = 0; i < 20000 && alone == 0; i++) {
      sh_parallel(2, count_part, runs);
      if (i % 64 == 0) { usleep(1000); alone = sh_parallel_spin_ns(); }
    }
    pid_t hog[2];
    for (int h = 0; h < 2; h++)
      if ((hog[h] = fork()) == 0) busy_forever();
    long spin = alone;
    for (int i = 0; i < 200000 && spin != 0; i++) {
      sh_parallel(2, count_part, runs);
      if (i % 64 == 0) spin = sh_parallel_spin_ns();
    }
    for (int h = 0; h < 2; h++) kill(hog[h], SIGKILL);
    _exit(alone > 0 && spin == 0 ? 0 : alone == 0 ? 4 : 5);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  if (rc == SKIP) { printf("# skip contention: fewer than 2 CPUs\n"); return; }
  CHECK(rc == 0, "beside 2 busy processes: the spin stops (child %d: 4 = the policy never spun, 5 = it kept spinning)", rc);
}

/* The wait policy counts the ranks on this node (sh_parallel_set_ranks_per_node, which comm.c
 * calls from the launcher's environment): told before the team starts, the team starts with it;
 * told while it runs, the team changes at once. In a child whose team nobody made yet. */
static void test_ranks_per_node_sets_the_wait(void) {
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("OMP_NUM_THREADS");   /* the team fits the CPUs: alone, it would spin */
    alarm(60);
    sh_parallel_set_ranks_per_node(100000);
    if (sh_parallel_spin_ns() != 0) _exit(3);      /* the team started sharing the node */
    sh_parallel_set_ranks_per_node(1);
    _Atomic long runs[2] = { 0 };
    long alone = sh_parallel_spin_ns();             /* soon, as in the contention test */
    for (int i = 0; i < 20000 && alone == 0; i++) {
      sh_parallel(2, count_part, runs);
      if (i % 64 == 0) { usleep(1000); alone = sh_parallel_spin_ns(); }
    }
    if (alone == 0) _exit(4);
    sh_parallel_set_ranks_per_node(100000);
    _exit(sh_parallel_spin_ns() == 0 ? 0 : 5);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  CHECK(rc == 0, "the ranks on the node set the wait (child %d: 3 = a team started among 100000 ranks spins, "
        "4 = told 1 rank it never spun, 5 = told 100000 ranks while running it still spins)", rc);
}

/* A child forked from a process whose workers run has none of them: it starts its own. */
static void test_child_of_a_running_team(void) {
  sh_parallel_set_threads(2);
  _Atomic long runs[2] = { 0 };
  sh_parallel(2, count_part, runs);
  int rc = stress_in_child(NULL);
  CHECK(rc == 0, "a child of a running team: %d calls, each part once (%d)", CALLS, rc);
}

int main(int argc, char **argv) {
  check_args(argc, argv);
  alarm(120);   /* a lost wake-up hangs: fail instead */
  RUN(test_no_lost_wakeups);   /* first: the children start from a team nobody made yet */
  RUN(test_ranks_per_node_sets_the_wait);   /* so does its child */
  RUN(test_each_part_once_on_its_own_thread);
  RUN(test_nested_call_runs_inline);
  RUN(test_parallel_for_covers_the_range_once);
  RUN(test_concurrent_callers);
  RUN(test_child_of_a_running_team);
  RUN(test_contention_stops_the_spin);
  return check_summary("test_parallel");
}
