-- Helpers the CUDA Lua scripts (tests/gpu/*.lua) share; not a test itself (tests/run_gpu.sh and
-- tests/cuda_emu/run.sh skip it). Loaded with dofile relative to the script, which works from
-- any directory and under bin/shard as under bin/shard-emu:
--   local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
-- Each dofile gives a fresh tally: support.check(ok, what) counts (printing "not ok what" on a
-- failure), support.finish(name) prints "name: N passed, N failed" and exits 1 if any failed.
local T = { passed = 0, failed = 0 }

function T.check(ok, what)
  if ok then T.passed = T.passed + 1 else T.failed = T.failed + 1; print("not ok " .. what) end
end

function T.finish(name)
  print(("%s: %d passed, %d failed"):format(name, T.passed, T.failed))
  if T.failed > 0 then os.exit(1) end
end

-- This rank's rows of step's global batch of random token ids (seeded by the step, so every
-- rank draws the same global batch): x and y, each [rows, block] on device, from a global
-- [rows * size, block] with ids below vocab.
function T.rank_batch(step, device, rank, size, rows, block, vocab)
  local shard = require("shard")
  shard.manual_seed(1000 + step)
  local function ids()
    local u = shard.rand({ rows * size, block }, { device = "cpu" })
    local s = u * vocab
    local i = s:to("i64")
    local mine = i:narrow(1, rank * rows + 1, rows):contiguous()
    local out = mine:to(device)
    u:free(); s:free(); i:free(); mine:free()
    return out
  end
  local x = ids()
  return x, ids()
end

-- normwise relative error ||a - b|| / ||b||
function T.rel(a, b)
  local x, y = a:tolist_flat(), b:tolist_flat()
  local d, n = 0, 0
  for i = 1, #y do d = d + (x[i] - y[i]) ^ 2; n = n + y[i] ^ 2 end
  return math.sqrt(d / math.max(n, 1e-30))
end

-- The NCCL stand-in's records of issue order (DIR/nccl-order.R, one line per collective:
-- "index communicator #seq op count=N dtype=D ...", tests/cuda_emu/README.md): for every two
-- ranks, the collectives on the communicators both belong to must come in the same order,
-- or a real job may deadlock. Returns true, or false and the first difference.
function T.same_collective_order(dir, size)
  local recs = {}
  for r = 0, size - 1 do
    local path = ("%s/nccl-order.%d"):format(dir, r)
    local f = io.open(path)
    if not f then return false, "no record " .. path end
    local list, comms = {}, {}
    for line in f:lines() do
      local comm, rest = line:match("^%d+%s+(%S+)%s+(.*)$")
      if comm then list[#list + 1] = { comm = comm, text = comm .. " " .. rest }; comms[comm] = true end
    end
    f:close()
    recs[r] = { list = list, comms = comms }
  end
  for a = 0, size - 1 do
    for b = a + 1, size - 1 do
      local function shared(r, other)
        local out = {}
        for _, e in ipairs(recs[r].list) do if recs[other].comms[e.comm] then out[#out + 1] = e.text end end
        return out
      end
      local sa, sb = shared(a, b), shared(b, a)
      for i = 1, math.max(#sa, #sb) do
        if sa[i] ~= sb[i] then
          return false, ("ranks %d and %d differ at their shared collective %d: %s / %s"):format(a, b, i,
            tostring(sa[i]), tostring(sb[i]))
        end
      end
    end
  end
  return true
end

return T
