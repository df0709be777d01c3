/* emu_test.h: what the emulator's own self-tests (tests/cuda_emu/tests) need beyond CUDA:
 * the last diagnostic, a reset after a detected (sticky) fault, and the scheduling knobs
 * that the environment variables also set. Test infrastructure only. C++17. */
#pragma once
#include <cstddef>
#include <string>
#include <cuda_runtime.h>

namespace emu {

/* The last diagnostic the emulator printed ("kernel k (file:line): divergence ..."), "" when
 * none since the last test_reset; report_count() counts them. */
const char *last_report();
long report_count();

/* Forgets queued work, sticky errors, the thread's last error and the last report: a fresh
 * context, which real CUDA only gets from a new process. */
void test_reset();

/* Block order: 0 forward, 1 reverse, 2 shuffled with `seed` (SHARD_EMU_BLOCK_ORDER). */
void set_block_order(int order, unsigned long long seed);
/* Threads of a block run in reverse order between barriers (SHARD_EMU_THREAD_ORDER). */
void set_thread_order(bool reverse);
/* Eager: work runs when it is queued (SHARD_EMU_SCHED=eager); else as late as possible. */
void set_eager(bool eager);

/* cudaStreamWaitEvent does nothing and returns cudaSuccess (SHARD_EMU_DROP_EVENT_WAITS=1):
 * with the newest-first schedule every cross-stream order a program relies on is then
 * missing, so a test can show that it notices. */
void set_drop_event_waits(bool drop);

/* The order host waits drain streams in (SHARD_EMU_DRAIN_SEED): 0 newest first; N > 0 a
 * seeded order per wait, seeds 1..6 giving every wait every order of up to 3 streams. Restarts
 * the count of waits, so a seed picks the same orders again. */
void set_drain_seed(unsigned long long seed);

/* The dependency graph of the device work queued between graph_begin and graph_end (which
 * stops recording and returns it as text; format: README "Instrumentation", or
 * emu_counters_lua.cpp's shard_emu_graph_dump). */
void graph_begin();
std::string graph_end();
/* The id a stream has in the graph's lines (the legacy stream for 0), -1 for an invalid one. */
int graph_stream_id(cudaStream_t stream);

/* Device allocations not yet freed. */
size_t live_device_allocations();

}  // namespace emu
