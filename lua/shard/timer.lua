-- shard.timer: wall-clock seconds from clock_gettime(CLOCK_MONOTONIC).
local ffi = require("ffi")
pcall(ffi.cdef, [[
  struct sh_timespec { long tv_sec; long tv_nsec; };
  int clock_gettime(int clk_id, struct sh_timespec *tp);
]])
local ts = ffi.new("struct sh_timespec")
local M = {}
function M.now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
return M
