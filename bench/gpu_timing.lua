-- bench/gpu_timing.lua: device-side timing for the GPU benchmarks. Kernels are queued
-- asynchronously, so a region is timed by two events recorded on the compute stream around
-- it, then one synchronisation. Loaded with dofile("bench/gpu_timing.lua") from the root.
local ffi = require("ffi")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

local M = {}

local function event()
  local e = ffi.new("sh_cuda_event *[1]")
  check(C.sh_cuda_event_create(e, 0, 1))
  return ffi.gc(e[0], C.sh_cuda_event_destroy)
end

local function compute_stream()
  local s = ffi.new("sh_cuda_stream *[1]")
  check(C.sh_cuda_current_stream(s, 0))
  return s[0]
end

-- Milliseconds the device spent on what fn() queued.
function M.elapsed_ms(fn)
  local s, t0, t1 = compute_stream(), event(), event()
  check(C.sh_cuda_event_record(t0, s))
  fn()
  check(C.sh_cuda_event_record(t1, s))
  check(C.sh_cuda_event_synchronize(t1))
  local ms = ffi.new("double[1]")
  check(C.sh_cuda_event_elapsed(t0, t1, ms))
  return ms[0]
end

-- The median of `n` timings of fn after `warmup` untimed calls.
function M.median_ms(fn, n, warmup)
  for _ = 1, warmup do fn() end
  local times = {}
  for i = 1, n do times[i] = M.elapsed_ms(fn) end
  table.sort(times)
  return times[math.floor((n + 1) / 2)]
end

return M
