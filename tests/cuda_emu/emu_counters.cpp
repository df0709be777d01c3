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
 * sh_emu_graph_launches: cudaGraphLaunch calls (the kernels a graph replays are not launches). */
#include "emu_api.h"

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
