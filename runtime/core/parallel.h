/* parallel.h: the CPU thread team every runtime kernel splits its work over.
 * One team per process: the calling thread plus (threads - 1) workers, started at the first
 * parallel call. A call hands the workers a function and waits for them (fork-join), like an
 * OpenMP parallel region, but the idle workers wait the way a training step needs: between a
 * step's ops the Lua front spends 30-60 us, and a worker that went to sleep there costs
 * 26-41 us to wake on a VM (an inter-processor interrupt through the hypervisor), more than
 * many ops take. So a worker first spins for a while (sh_parallel_spin_ns), then sleeps on a
 * futex. It spins only while the node's ranks (sh_parallel_set_ranks_per_node) times their
 * threads fit the CPUs this process may use; where they do not, a spinner would take the core
 * another rank's thread needs, and workers sleep at once.
 * Team size: OMP_NUM_THREADS (its first number) when set, else the CPUs this process may use.
 * OMP_WAIT_POLICY=passive makes workers sleep at once, =active spin without a limit. */
#pragma once
#include <stdint.h>

/* fn(ctx, t, nt) for every t in [0, nt), each on its own thread; the caller runs t = 0. */
typedef void (*sh_parallel_fn)(void *ctx, int t, int nt);

/* The team's size (>= 1). */
int sh_parallel_threads(void);
/* Sets the team's size (clamped to [1, 255]); workers start when a call needs them. */
void sh_parallel_set_threads(int n);
/* How many ranks of the job run on this node (>= 1; 1 until told). The wait policy counts
 * their threads against the CPUs; runtime/dist/comm.c tells it from the launcher's
 * environment as the library loads and whenever it reads that environment, and a team already
 * started takes the new count at once. */
void sh_parallel_set_ranks_per_node(int n);
/* How long an idle thread of the team would spin now before it sleeps, in ns: the wait
 * policy's time (0: at once), or 0 while the team lately waited for its CPUs (contention). */
long sh_parallel_spin_ns(void);
/* Runs fn on min(nt, team size) threads and returns when all are done. Called from inside a
 * parallel call, or while another thread has the team, it runs every t in turn on the calling
 * thread (the same split, so results do not depend on who ran them). */
void sh_parallel(int nt, sh_parallel_fn fn, void *ctx);
/* 1 on a thread that is running a parallel call's fn (a nested sh_parallel runs inline). */
int sh_parallel_inside(void);

/* fn(ctx, i0, i1) over [0, n) in one contiguous range per thread (OpenMP's static schedule),
 * or in one call on the calling thread when `split` is 0. */
typedef void (*sh_range_fn)(void *ctx, int64_t i0, int64_t i1);
void sh_parallel_for(int64_t n, int split, sh_range_fn fn, void *ctx);
