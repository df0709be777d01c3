-- shard.trace on a CUDA device (make test-gpu; the emulator in tests/cuda_emu runs it too):
-- two traced FSDP steps give one track per stream, where every op the host launched has its
-- device span on the stream it ran on, and every collective the counters saw has its device
-- span, with its bytes, on the all-gather or reduce-scatter stream; spans nest on every
-- track, and the summary (from the device tracks) adds up. Prints "N passed, N failed".
-- Under mpirun (tests/cuda_emu/run.sh runs it at 2 ranks, SHARD_TEST_DIR shared) each rank
-- checks its own tracks in the merged file.
local shard = require("shard")
local here = debug.getinfo(1, "S").source:match("^@(.*[/\\])") or ""
local support = dofile(here .. "support.lua")
local T = dofile(here .. "../spec/trace_check.lua")
local check = support.check

local env = shard.init{ device = "cuda" }
local rank = env.rank
local dir = os.getenv("SHARD_TEST_DIR")
local own_dir = not dir
if own_dir then dir = os.tmpname(); os.remove(dir); os.execute("mkdir -p " .. dir) end
-- The timeline's PNG needs gnuplot, which make deps installs; a GPU node may lack it.
local draw = require("shard.ffi").have_command("gnuplot")
if not draw then print("# no gnuplot here: the memory timeline is checked, its PNG not drawn") end
local run = T.run(shard, dir .. "/t.json", { device = env.device, png = draw and dir .. "/mem.png" or nil })
env.barrier()     -- rank 0 has merged the file
local doc = T.load(dir .. "/t.json")

check(#T.field_problems(doc) == 0, "trace events: " .. table.concat(T.field_problems(doc), "; "))
check(#T.nesting_problems(doc) == 0, "spans nest: " .. table.concat(T.nesting_problems(doc), "; "))

local threads, by_tid = {}, {}
for _, e in ipairs(doc.traceEvents) do
  if e.ph == "M" and e.name == "thread_name" and e.pid == rank then threads[e.tid] = e.args.name end
  if e.ph == "X" and e.pid == rank then
    by_tid[e.tid] = by_tid[e.tid] or {}
    table.insert(by_tid[e.tid], e)
  end
end
check(threads[30] == "cuda: compute stream" and threads[31] == "cuda: all-gather stream"
      and threads[32] == "cuda: reduce-scatter stream", "a track per stream")

-- every op: one host span and one device span (ops launch on the compute stream here)
local host_ops = #T.names(doc, rank, "op") + #T.names(doc, rank, "op.bwd")
local dev_ops = #T.names(doc, rank, "device") + #T.names(doc, rank, "device.bwd")
check(host_ops > 0 and host_ops == dev_ops, ("%d host op spans, %d device op spans"):format(host_ops, dev_ops))
for _, e in ipairs(by_tid[30] or {}) do
  if e.cat == "device.comm" then check(false, "a collective on the compute stream: " .. e.name) break end
end

-- every collective the counters saw: a device span with its bytes on its stream
local counts, bytes = {}, {}
for tid, list in pairs(by_tid) do
  for _, e in ipairs(list) do
    if e.cat == "device.comm" then
      local k = e.name:match("^(%S+)")
      local want = (k == "all_gather" or k == "broadcast") and 31 or 32
      check(tid == want, ("%s on track %d, expected %d"):format(e.name, tid, want))
      counts[k] = (counts[k] or 0) + 1
      bytes[k] = (bytes[k] or 0) + e.args.bytes
    end
  end
end
local seen = 0
for k, n in pairs(run.counts) do
  if k ~= "barrier" then
    check((counts[k] or 0) == n, ("%s: %d device spans, the counters saw %d"):format(k, counts[k] or 0, n))
    check((bytes[k] or 0) == run.bytes[k], ("%s: %d bytes on the device tracks, the counters %d"):format(k, bytes[k] or 0, run.bytes[k]))
    seen = seen + n
  end
end
check(seen >= 2 * 3 * 2, ("%d collectives: a gather and a reduction per unit and step"):format(seen))

for _, sum in ipairs(rank == 0 and run.result.summary or {}) do
  check(sum.clock == "device", "the summary is the device's")
  check(math.abs(sum.step - (sum.compute + sum.exposed + sum.other)) < 1e-6,
        ("rank %d: window %.4f ms = compute %.4f + exposed %.4f + idle %.4f"):format(sum.rank, sum.step, sum.compute, sum.exposed, sum.other))
  check(sum.compute > 0 and sum.exposed <= sum.comm + 1e-9 and sum.overlap >= 0 and sum.overlap <= 1, "summary ranges")
  local by_unit = 0
  for _, ms in pairs(sum.exposed_by_unit) do by_unit = by_unit + ms end
  check(math.abs(by_unit - sum.exposed) < 1e-6, ("rank %d: exposed by unit %.6f, total %.6f"):format(sum.rank, by_unit, sum.exposed))
end
check(rank ~= 0 or #run.result.summary == env.world, "a summary row per rank")
check(run.peak == run.result.timeline_peak, ("the memory timeline's peak %s is the allocator's %s"):format(
  tostring(run.result.timeline_peak), tostring(run.peak)))
check(not draw or T.is_png(run.result.png), "the memory timeline is drawn as a PNG")

env.barrier()
if own_dir then os.execute("rm -rf " .. dir) end
support.finish(("gpu/trace_streams (rank %d of %d)"):format(rank, env.world))
