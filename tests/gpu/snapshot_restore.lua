-- In-memory snapshots of CUDA training state (shard.snapshot; make test runs it on the emulated
-- device, and again under SHARD_EMU_DRAIN_SEED's stream orders): a snapshot of step 3, taken
-- while training goes on through step 5, restored into a fresh model and optimizer, continues
-- bit for bit as the uninterrupted run does: a plain model, FSDP full_shard and FSDP with bf16
-- mixed precision (f32 master shards), at world 1. The copy thread is held back
-- (SHARD_SNAPSHOT_COPY_DELAY_MS) until step 4's optimizer is queued, so that the device copies
-- run after it unless its stream waits for them: a missing wait restores step 4's state.
-- On the emulator the dependency graph shows how (tests/cuda_emu/README.md): the device state
-- goes to pinned memory on a stream of its own (not the compute stream, no synchronous copy),
-- that stream waits for the compute stream's step 3, step 4's optimizer waits for the copies
-- on the device, and the only host wait for them is the copy thread's event wait.
-- Prints "N passed, N failed".
local ffi = require("ffi")
local shard = require("shard")
local nn, fsdp = shard.nn, shard.fsdp
local snapshot = require("shard.snapshot")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check = support.check

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
pcall(ffi.cdef, "void shard_emu_graph_begin(void); int shard_emu_graph_dump(const char *path); int getpid(void);")
local function emu_fn(name)
  local ok, f = pcall(function() return ffi.C[name] end)
  return ok and f or nil
end
local graph_begin, graph_dump = emu_fn("shard_emu_graph_begin"), emu_fn("shard_emu_graph_dump")

local DELAY_MS = 500
ffi.C.setenv("SHARD_SNAPSHOT_COPY_DELAY_MS", tostring(DELAY_MS), 1)
local env = shard.init{ device = "cuda" }
local CFG = { n_layer = 2, n_head = 4, n_embd = 32, vocab_size = 50, block_size = 16, bias = true }

local function build(mode)
  local make = function() shard.manual_seed(11); return nn.GPT(CFG) end
  if mode == "plain" then return make() end
  return fsdp.wrap(make, { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                           mixed_precision = mode == "bf16" and { param = "bf16" } or nil })
end

-- Steps from + 1 .. to on each step's own batch; snaps, when given, as train.lua drives it.
local function train(model, opt, from, to, snaps)
  for s = from + 1, to do
    local x, y = support.rank_batch(s, env.device, 0, 1, 2, CFG.block_size, CFG.vocab_size)
    local loss = model(x, y)
    loss:backward()
    if snaps then snaps:before_update() end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free(); y:free()
    if snaps then snaps:after_step(s) end
  end
end

local function values(model)
  local out = {}
  for name, t in pairs(fsdp.gather_full(model)) do out[name] = t:tolist_flat(); t:free() end
  return out
end

local function graph_lines(path)
  local lines, creation = {}, {}
  for line in io.lines(path) do
    lines[#lines + 1] = line
    local id, c = line:match("^stream (%d+) (%S+)")
    if id then creation[tonumber(id)] = c end
  end
  os.remove(path)
  return lines, creation
end

-- The dependency graph of steps 1-5 (the snapshot of step 3 among them); returns the
-- snapshot stream's id.
local function check_steps(path, mode)
  local lines, creation = graph_lines(path)
  local node_stream, copies, snap, bad, into, out_of, waits = {}, 0, nil, {}, false, false, 0
  for _, line in ipairs(lines) do
    local kind, rest = line:match("^(%S+)%s+(.*)$")
    if kind == "node" then
      local id, s, what = rest:match("^(%d+)%s+(%d+)%s+(.*)$")
      node_stream[tonumber(id)] = tonumber(s)
      if what:find("device -> pinned", 1, true) then
        copies = copies + 1
        snap = snap or tonumber(s)
        if tonumber(s) ~= snap then bad[#bad + 1] = "copies on streams " .. snap .. " and " .. s end
      elseif what:find("device -> pageable", 1, true) then
        bad[#bad + 1] = "a synchronous copy to pageable memory"
      end
    elseif kind == "edge" then
      local from, to = rest:match("^(%d+)%s+(%d+)")
      local a, b = node_stream[tonumber(from)], node_stream[tonumber(to)]
      if snap and b == snap and creation[a] == "0" then into = true end
      if snap and a == snap and creation[b] == "0" then out_of = true end
    elseif kind == "hostwait" and snap and tonumber(rest:match("stream (%d+)")) == snap then
      waits = waits + 1
    end
  end
  check(copies > 0 and #bad == 0, ("%s: %d copies to pinned memory; %s"):format(mode, copies, table.concat(bad, "; ")))
  check(snap and creation[snap] ~= "0", ("%s: the copies are not on the compute stream (stream %s)"):format(mode, tostring(snap)))
  check(into, mode .. ": the snapshot stream waits for the compute stream's step 3 on the device")
  check(out_of, mode .. ": the compute stream (step 4's optimizer) waits for the copies on the device")
  check(waits == 0, ("%s: the host waited %d times for the snapshot stream while it trained"):format(mode, waits))
  return snap
end

-- What came after: the copy thread's one wait for the copies' event.
local function check_thread_wait(path, mode, snap)
  local lines = graph_lines(path)
  local waits = {}
  for _, line in ipairs(lines) do
    local rest = line:match("^hostwait (.*)$")
    if rest and snap and tonumber(rest:match("stream (%d+)")) == snap then waits[#waits + 1] = rest end
  end
  check(#waits == 1 and waits[1]:match("^event_sync "), ("%s: the host's waits for the snapshot stream: %s (the copy thread's event wait only)"):format(
    mode, table.concat(waits, "; ")))
end

local scratch = ("/tmp/shard_snapshot_restore.%d"):format(ffi.C.getpid())
for _, mode in ipairs { "plain", "full_shard", "bf16" } do
  local a = build(mode)
  local oa = shard.optim.AdamW(a, { lr = 1e-2 })
  local snaps = snapshot.new{ model = a, optim = oa, env = env, interval = 3 }
  if graph_begin then graph_begin() end
  train(a, oa, 0, 5, snaps)                     -- one snapshot: step 3's, its copy held back past step 4's optimizer
  local snap = graph_dump and graph_dump(scratch) == 0 and check_steps(scratch, mode)
  if graph_begin then graph_begin() end
  local want = values(a)                        -- the host runs steps 4 and 5 before the copy thread's wait
  snaps:settle_copy()                           -- the copy of step 3 done; its files stay
  if graph_dump then check(graph_dump(scratch) == 0, "graph dump to " .. scratch); check_thread_wait(scratch, mode, snap) end
  local b = build(mode)
  local ob = shard.optim.AdamW(b, { lr = 1e-2 })
  local step, how = snapshot.restore{ model = b, optim = ob, env = env }
  check(step == 3 and how.source == "memory", ("%s: restored step %d from %s, expected step 3 from memory"):format(mode, step, how.source))
  train(b, ob, 3, 5)
  local got, bad = values(b), 0
  for name, w in pairs(want) do
    for i = 1, #w do if got[name][i] ~= w[i] then bad = bad + 1 end end
  end
  check(bad == 0, ("%s: %d parameter values differ from the uninterrupted run after the restore"):format(mode, bad))
  snaps:close()
end
support.finish("snapshot_restore")
