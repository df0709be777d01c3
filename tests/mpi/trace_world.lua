-- shard.trace at the world size mpirun gives: one merged file with a track per rank, where
-- each rank's collectives are the ones its own counters saw (count and bytes per kind), its
-- waits add up to the seconds sh_comm_wait blocked, spans nest, the summary adds up, and each
-- rank's memory timeline PNG has its allocator's peak.
local shard = require("shard")
local T = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/trace_check.lua")
local comm = shard.comm
local env = shard.init{ device = "cpu" }
local rank, world = env.rank, env.world

-- one directory for every rank: rank 0's pid, broadcast
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void);")
local id = shard.tensor({ rank == 0 and ffi.C.getpid() or 0 }, { dtype = "f64" })
comm.broadcast(id, 0)
local dir = ("%s/shard_trace_%d"):format(os.getenv("TMPDIR") or "/tmp", id:item())
if rank == 0 then os.execute("mkdir -p " .. dir) end
comm.barrier()

local run = T.run(shard, dir .. "/t.json", { png = dir .. "/mem.png" })

-- every rank's own figures, gathered on rank 0
local KINDS = comm.kinds
local K = 2 * #KINDS + 2
local mine = shard.zeros({ world * K }, { dtype = "f64" })
for i, k in ipairs(KINDS) do
  mine:set({ rank * K + i }, run.counts[k])
  mine:set({ rank * K + #KINDS + i }, run.bytes[k])
end
mine:set({ rank * K + 2 * #KINDS + 1 }, run.wait)
mine:set({ rank * K + 2 * #KINDS + 2 }, run.peak == run.result.timeline_peak and T.is_png(run.result.png) and 1 or 0)
comm.all_reduce(mine, "sum")
local all = mine:tolist_flat()

local failures = 0
local function check(ok, what)
  if not ok then failures = failures + 1; io.stderr:write(("rank %d of %d: %s\n"):format(rank, world, what)) end
end

if rank == 0 then
  local doc = T.load(dir .. "/t.json")
  check(#T.field_problems(doc) == 0, "bad events: " .. table.concat(T.field_problems(doc), "; "))
  check(#T.nesting_problems(doc) == 0, "spans cross: " .. table.concat(T.nesting_problems(doc), "; "))
  local sum = run.result.summary
  check(#sum == world, ("the summary has %d ranks, expected %d"):format(#sum, world))
  for r = 0, world - 1 do
    local base = r * K
    local counts, bytes, wait = T.collectives(doc, r)
    for i, k in ipairs(KINDS) do
      check((counts[k] or 0) == all[base + i], ("rank %d: %d %s in the trace, the counters saw %d"):format(r, counts[k] or 0, k, all[base + i]))
      check((bytes[k] or 0) == all[base + #KINDS + i], ("rank %d: %s bytes %d in the trace, the counters %d"):format(r, k, bytes[k] or 0, all[base + #KINDS + i]))
    end
    local blocked = all[base + 2 * #KINDS + 1]
    check(math.abs(wait - blocked) < 1e-6 * (1 + #T.names(doc, r, "comm.wait")),
          ("rank %d: waits of %.6f s in the trace, sh_comm_wait counted %.6f s"):format(r, wait, blocked))
    check(all[base + 2 * #KINDS + 2] == 1, ("rank %d: no timeline PNG, or its peak is not the allocator's"):format(r))
    local s = sum[r + 1]
    check(s and s.rank == r, "summary row " .. (r + 1) .. " is not rank " .. r)
    if s then
      check(math.abs(s.step - (s.compute + s.exposed + s.other)) < 1e-9 and s.other >= 0 and s.compute > 0,
            ("rank %d: step %.3f ms is not compute %.3f + exposed %.3f + other %.3f"):format(r, s.step, s.compute, s.exposed, s.other))
      check(math.abs(s.exposed - wait * 1e3) < 1e-3 and s.exposed <= s.comm + 1e-6,
            ("rank %d: exposed %.3f ms, waits %.3f ms, comm %.3f ms"):format(r, s.exposed, wait * 1e3, s.comm))
      local by_unit = 0
      for _, ms in pairs(s.exposed_by_unit) do by_unit = by_unit + ms end
      check(math.abs(by_unit - s.exposed) < 1e-9, ("rank %d: exposed by unit sums to %.6f, not %.6f"):format(r, by_unit, s.exposed))
    end
  end
  os.execute("rm -rf " .. dir)
end
if failures > 0 then error(("trace_world: %d check(s) failed on rank %d"):format(failures, rank), 0) end
