/* emu_counters.cpp: the emulator's counters (emu_api.h) for the C test programs in tests/gpu.
 * A test declares these weakly, so that the same test links on a real GPU, where they are
 * absent (NULL) and the checks that need them are skipped:
 *   extern void sh_emu_counters_get(long out[4]) __attribute__((weak));
 *   extern void sh_emu_counters_reset(void) __attribute__((weak));
 *   extern long sh_emu_host_waits(void) __attribute__((weak));
 *   extern long sh_emu_graph_launches(void) __attribute__((weak));
 * out: cudaMalloc calls, cudaFree calls, kernel launches, host synchronisations.
 * sh_emu_host_waits: the host synchronisations plus the cudaEventQuery/cudaStreamQuery calls
 * that answered cudaErrorNotReady (every time the host blocked on or polled the device).
 * sh_emu_graph_launches: cudaGraphLaunch calls (the kernels a graph replays are not launches).
 *   extern void sh_emu_set_block_order(int order, unsigned long long seed) __attribute__((weak));
 * sets the order the blocks of later launches run in (0 forward, 1 reverse, 2 shuffled by seed:
 * SHARD_EMU_BLOCK_ORDER), so a test can show what a kernel's result owes to the block schedule. */
#include "emu_api.h"
#include "emu_test.h"

extern "C" void sh_emu_counters_get(long out[4]) {
  emu::counters c = emu::get_counters();
  out[0] = c.mallocs;
  out[1] = c.frees;
  out[2] = c.launches;
  out[3] = c.host_syncs;
}

extern "C" void sh_emu_counters_reset(void) { emu::reset_counters(); }

extern "C" long sh_emu_host_waits(void) { return emu::get_counters().host_waits; }

extern "C" long sh_emu_graph_launches(void) { return emu::get_counters().graph_launches; }

extern "C" void sh_emu_set_block_order(int order, unsigned long long seed) { emu::set_block_order(order, seed); }
