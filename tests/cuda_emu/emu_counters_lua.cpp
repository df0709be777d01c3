/* emu_counters_lua.cpp: the emulator's counters and its dependency-graph recorder as plain C
 * symbols, so a Lua script run by bin/shard-emu (linked -Wl,-E) reaches them through ffi.C;
 * on a real GPU the symbols are absent and the script skips the check:
 *   ffi.cdef[[long shard_emu_host_waits(void); void shard_emu_graph_begin(void);
 *             int shard_emu_graph_dump(const char *path);]]
 *   local on_emu = pcall(function() return ffi.C.shard_emu_graph_begin end)
 * Test infrastructure only. */
#include <cstdio>
#include <string>
#include "emu_api.h"
#include "emu_test.h"

extern "C" long shard_emu_malloc_count(void) { return emu::get_counters().mallocs; }
extern "C" long shard_emu_frees_count(void) { return emu::get_counters().frees; }
extern "C" long shard_emu_launches(void) { return emu::get_counters().launches; }
/* cudaGraphLaunch calls, and the graph nodes they queued (replayed kernels are not launches). */
extern "C" long shard_emu_graph_launches(void) { return emu::get_counters().graph_launches; }
extern "C" long shard_emu_graph_nodes(void) { return emu::get_counters().graph_nodes; }
/* Host synchronisations (stream/event/device sync, synchronous copies) plus every
 * cudaEventQuery/cudaStreamQuery that answered cudaErrorNotReady (a polling loop counts 1). */
extern "C" long shard_emu_host_waits(void) { return emu::get_counters().host_waits; }
extern "C" void shard_emu_reset_counters(void) { emu::reset_counters(); }

/* Forgets any recording and starts recording the dependency graph of the device work queued
 * from now on (cheap when not recording: one flag). */
extern "C" void shard_emu_graph_begin(void) { emu::graph_begin(); }

/* Stops recording and writes the graph as text to `path` ("-": stdout). Returns 0, or -1 when
 * the file cannot be written. One record per line, space-separated, in this order:
 *   # ...                                  a comment (the first line names the format)
 *   stream <id> <creation> <flags> <dev>   every stream that appears below or is alive: <id> is
 *                                          the emulator's stream number (the legacy streams of
 *                                          devices 0..n-1 are 0..n-1, then streams in creation
 *                                          order), <creation> the 0-based cudaStreamCreate*
 *                                          order in the process or "legacy" for device <dev>'s
 *                                          legacy default stream, <flags> as created (1:
 *                                          cudaStreamNonBlocking)
 * then, in the order they happened:
 *   node <id> <stream> <what>              a piece of device work queued: <id> 1, 2, ... in
 *                                          queue order; <what> the rest of the line: "kernel
 *                                          NAME (FILE:LINE)", "memcpy N bytes SRC -> DST"
 *                                          (device/pinned/pageable), "memset N bytes", or a
 *                                          library call's name (emu::enqueue's `what`).
 *                                          Event records and waits are not nodes.
 *   edge <from> <to> <event>               cudaStreamWaitEvent(s, event): <from> the last node
 *                                          queued on the event's stream when it was recorded,
 *                                          <to> the next node queued on s (written right after
 *                                          that node line); <event> the handle (%p)
 *   wait <stream> <event> <from|->         each cudaStreamWaitEvent call; "-": the event was
 *                                          recorded at an empty point (no node before it on its
 *                                          stream since graph_begin) or not recorded, so no edge
 *   hostwait <kind> <what>                 the host waited: kind device_sync ("device D"),
 *                                          stream_sync ("stream S"), event_sync ("event P stream
 *                                          S"), memcpy (a synchronous copy: "stream S memcpy
 *                                          ..."), stream_query / event_query (answered
 *                                          cudaErrorNotReady: "... not ready"), work_sync
 *                                          ("stream S": the NCCL stand-in waiting for its
 *                                          queued collectives)
 * Not recorded: the legacy default stream's implicit ordering of blocking streams, cudaFree's
 * device synchronisation. With SHARD_EMU_DROP_EVENT_WAITS=1 waits record nothing. */
extern "C" int shard_emu_graph_dump(const char *path) {
  std::string text = emu::graph_end();
  bool to_stdout = !path || !*path || std::string(path) == "-";
  FILE *f = to_stdout ? stdout : fopen(path, "w");
  if (!f) return -1;
  bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
  if (to_stdout) ok = fflush(f) == 0 && ok;
  else ok = fclose(f) == 0 && ok;
  return ok ? 0 : -1;
}
