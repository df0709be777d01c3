/* emu_counters_lua.cpp: the emulator's cudaMalloc counter as a plain C symbol, so a Lua
 * script run by bin/shard-emu (linked -Wl,-E) can read it through ffi.C; on a real GPU the
 * symbol is absent and the script skips the check. Test infrastructure only. */
#include "emu_api.h"

extern "C" long shard_emu_malloc_count(void) { return emu::get_counters().mallocs; }
