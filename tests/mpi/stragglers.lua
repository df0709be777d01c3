-- Stragglers named before the timeout (issue 19, item 5). Each step every rank does its own
-- work (a sleep: deterministic on a shared machine) and then an all-reduce, as a data-parallel
-- step does. For 3 windows every rank works 4 ms a step: nobody is named. Then the last rank
-- works 24 ms a step: the others now wait ~20 ms in the all-reduce, so every rank's step takes
-- as long; shard.straggler must name the last rank, and only it, after exactly `windows`
-- windows, on every rank, with how much slower its own work was.
local shard = require("shard")
local ffi = require("ffi")
ffi.cdef "int usleep(unsigned int usec);"
local timer, straggler = require("shard.timer"), require("shard.straggler")
local env = shard.init()
local rank, world = env.rank, env.world
local STEPS, WINDOWS = 4, 3
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, world) .. fmt:format(...) .. "\n")
end

local watch = straggler.new{ group = env.group, margin = 0.25, windows = WINDOWS }
local grad = shard.zeros({ 1024 })
local function window(slow_rank)
  local t0, w0 = timer.now(), shard.comm.wait_seconds()
  for _ = 1, STEPS do
    ffi.C.usleep(rank == slow_rank and 24000 or 4000)
    env.group:all_reduce(grad, "sum")
  end
  return watch:observe(STEPS, timer.now() - t0, shard.comm.wait_seconds() - w0)
end

for w = 1, WINDOWS do
  local warnings = window(-1)
  if #warnings > 0 then fail("balanced window %d named a straggler: %s", w, warnings[1]) end
end
local slow = world - 1
local named_at
for w = 1, WINDOWS + 1 do
  local warnings = window(world > 1 and slow or -1)
  if #warnings > 0 and not named_at then
    named_at = w
    if #warnings ~= 1 then fail("%d warnings, expected one: %s", #warnings, table.concat(warnings, "; ")) end
    local r, pct, steps = warnings[1]:match("^rank (%d+) is (%d+)%% slower than the median of the other ranks over the last (%d+) steps")
    if tonumber(r) ~= slow then fail("named %s, expected rank %d: %s", tostring(r), slow, warnings[1]) end
    if not pct or tonumber(pct) < 100 then fail("slower by %s%%, expected several times the median: %s", tostring(pct), warnings[1]) end
    if tonumber(steps) ~= WINDOWS * STEPS then fail("over %s steps, expected %d: %s", tostring(steps), WINDOWS * STEPS, warnings[1]) end
    if rank == 0 then print(warnings[1]) end
  elseif #warnings > 0 then
    fail("named again in window %d while still slow: %s", w, warnings[1])
  end
end
if world > 1 and named_at ~= WINDOWS then fail("straggler named in window %s, expected %d", tostring(named_at), WINDOWS) end
if world == 1 and named_at then fail("a world of one named a straggler") end
grad:free()
env.barrier()
if failures > 0 then os.exit(1) end
