-- FSDP on CUDA over NCCL against FSDP on the CPU over MPI, in the same ranks: every strategy
-- that fits the world (hybrid as 2 x 2 at world 4), f32 and bf16 mixed precision, activation
-- checkpointing off and on. 3 AdamW steps of a small GPT on a global batch split across
-- ranks must give the CPU run's losses and final shards (f32 to 1e-5 relative, bf16 mixed
-- precision to 1e-4: both backends round bf16 products the same way).
--
-- On the CUDA run it also checks what makes FSDP worth running on a GPU:
--   * steady state: after the first step no cudaMalloc and no NCCL communicator init, the
--     same memory peak every step, buffers in flight within the schedule's limits;
--   * no host waits inside a step: at most one per step, the loss read at its end;
--   * the order of issue across communicators is the same on every rank (each rank dumps
--     the NCCL stand-in's record into SHARD_TEST_DIR; rank 0 compares them at the end);
--   * the dependency graph of one step (the emulator's): compute waits only on its own
--     gather and on reductions already overtaken by a later one (the in-flight bound), the
--     optimizer on the reductions it reads; communication waits only on compute.
-- The counters, the record and the graph come from the emulator (bin/shard-emu); on a real
-- GPU those checks are skipped and the parity checks remain (run at world 1 there).
-- SHARD_FSDP_CASES="full_shard/f32/ckpt,..." narrows the matrix.
local shard = require("shard")
local ffi = require("ffi")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim
local support = dofile("tests/gpu/support.lua")

local env = shard.init{ device = "cpu" }
local rank, size = env.rank, env.world
local gpus = require("shard.ffi").cuda_device_count()
assert(gpus > 0, "mpi_fsdp_strategies: no CUDA device")
local cuda = "cuda:" .. (env.local_rank % gpus)
shard.C.sh_cuda_init(env.local_rank % gpus)

ffi.cdef [[
long shard_emu_malloc_count(void);
long shard_emu_host_waits(void);
void shard_emu_graph_begin(void);
int shard_emu_graph_dump(const char *path);
long shard_emu_nccl_comm_inits(void);
int shard_emu_nccl_trace_dump(const char *path);
]]
local function emu_fn(name)
  local ok, f = pcall(function() return ffi.C[name] end)
  return ok and f or nil
end
local emu = {
  mallocs = emu_fn("shard_emu_malloc_count"), host_waits = emu_fn("shard_emu_host_waits"),
  graph_begin = emu_fn("shard_emu_graph_begin"), graph_dump = emu_fn("shard_emu_graph_dump"),
  comm_inits = emu_fn("shard_emu_nccl_comm_inits"), trace_dump = emu_fn("shard_emu_nccl_trace_dump"),
}
local dir = os.getenv("SHARD_TEST_DIR") or "/tmp"

local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false, dropout = 0 }
local B_LOCAL, STEPS, LR = 2, tonumber(os.getenv("SHARD_FSDP_STEPS") or 3), 1e-3
local passed, failed = 0, 0
local function check(ok, fmt, ...)
  if ok then passed = passed + 1 return end
  failed = failed + 1
  io.stderr:write(("not ok rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end

local function batch(step, device)   -- this rank's rows of the global batch
  return support.rank_batch(step, device, rank, size, B_LOCAL, CFG.block_size, CFG.vocab_size)
end

local function wrap(case, device)
  require("shard.tensor").default_device = device
  local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end, {
    policy = fsdp.policy.transformer{ nn.Block }, strategy = case.strategy,
    hybrid_group = case.strategy:match("^hybrid") and 2 or nil,
    mixed_precision = case.bf16 and { param = "bf16", reduce = "f32" } or nil,
    checkpoint = case.ckpt and { nn.Block } or nil,
  })
  return model, optim.AdamW(model, { lr = LR, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
end

-- Trains STEPS steps; returns the losses, the shards (host copies) and, on CUDA, what each
-- step cost in device allocations, NCCL inits, host waits and peak memory.
local function train(case, device, graph_path)
  shard.memory.empty_cache(device)   -- cached blocks of an earlier case would round the peak differently
  local model, opt = wrap(case, device)
  local losses, per_step = {}, {}
  for step = 1, STEPS do
    local x, y = batch(step, device)
    -- Lua's collector frees unreferenced temporaries whenever it runs; stopped for the step,
    -- every step holds the same garbage and the peak compares the schedule alone
    collectgarbage()
    collectgarbage("stop")
    shard.memory.reset_peak(device)
    local before = { mallocs = emu.mallocs and emu.mallocs(), inits = emu.comm_inits and emu.comm_inits(),
                     waits = emu.host_waits and emu.host_waits() }
    if graph_path and step == 2 then emu.graph_begin() end
    local loss = model(x, y)
    loss:backward()
    opt:step()
    opt:zero_grad(true)
    local v = loss:item()
    -- an all-ones NaN (the emulator's unwritten memory) reads back as a NaN-boxed non-number
    losses[step] = type(v) == "number" and v or 0 / 0
    if graph_path and step == 2 then emu.graph_dump(graph_path) end
    local stats = shard.memory.stats(device)
    per_step[step] = {
      mallocs = emu.mallocs and emu.mallocs() - before.mallocs,
      inits = emu.comm_inits and emu.comm_inits() - before.inits,
      waits = emu.host_waits and emu.host_waits() - before.waits,
      peak = stats.peak, in_flight = stats.in_flight,
    }
    loss:free(); x:free(); y:free()
    collectgarbage("restart")
  end
  local shards = {}
  for i, u in ipairs(model.all_units) do
    if u.fp then
      local s = u.fp:shard()
      shards[i] = s:to("cpu")
      s:free()
    end
  end
  for _, u in ipairs(model.all_units) do if u.fp then u.fp:free() end end
  return losses, shards, per_step
end

local function compare(case, name)
  local cpu_losses, cpu_shards = train(case, "cpu")
  local graph = emu.graph_dump and size > 1 and case.graph and ("%s/graph.%s.%d"):format(dir, case.strategy, rank) or nil
  local losses, shards, per_step = train(case, cuda, graph)
  -- both backends compute bf16 products in f32 and round once, so they agree far below a bf16 ulp
  local tol_loss, tol_param = case.bf16 and 1e-4 or 1e-5, case.bf16 and 1e-4 or 1e-5
  for step = 1, STEPS do
    local a, b = losses[step], cpu_losses[step]
    check(math.abs(a - b) <= tol_loss * math.abs(b), "%s step %d: loss %.7f on CUDA, %.7f on the CPU", name, step, a, b)
  end
  for i, s in pairs(cpu_shards) do
    local ok, d = pcall(support.rel, shards[i], s)
    if not ok or type(d) ~= "number" then d = 0 / 0 end
    check(d <= tol_param, "%s: unit %d's final shard differs from the CPU's by %.3g (normwise relative)", name, i, d)
    s:free(); shards[i]:free()
  end
  -- what each step costs on the device
  for step = 2, STEPS do
    local st, first = per_step[step], per_step[2]
    if st.mallocs then check(st.mallocs == 0, "%s step %d: %d cudaMalloc calls after the first step", name, step, st.mallocs) end
    if st.inits then check(st.inits == 0, "%s step %d: %d NCCL communicator inits after the first step", name, step, st.inits) end
    check(st.peak == first.peak, "%s step %d: memory peak %d bytes, step 2's was %d", name, step, st.peak, first.peak)
  end
  if per_step[2] and per_step[2].waits and rank == 0 then
    print(("%s: %d host wait(s) in step 2"):format(name, per_step[2].waits))
  end
  for step = 1, STEPS do
    local st = per_step[step]
    if st.waits and step > 1 then
      check(st.waits <= 1, "%s step %d: the host waited %d times (at most 1: the loss read)", name, step, st.waits)
    end
    -- the root stays gathered through the forward and its flat grad lives through the
    -- backward, beside the current unit and the limits (prefetch 1, reduces_in_flight 2)
    local f, f2 = st.in_flight, per_step[math.max(step, 2)].in_flight
    check(f.gathers_peak <= 3 and f.reduces_peak <= 3,
          "%s step %d: %d gathers and %d reductions in flight at the peak (at most 3 and 3)", name, step, f.gathers_peak, f.reduces_peak)
    check(f.gathers_peak == f2.gathers_peak and f.reduces_peak == f2.reduces_peak,
          "%s step %d: in flight at the peak %d gathers, %d reductions; step 2: %d, %d", name, step,
          f.gathers_peak, f.reduces_peak, f2.gathers_peak, f2.reduces_peak)
  end
  return per_step
end

---------------------------------------------------------------------------------------------
-- the dependency graph of one step (emulator text format: tests/cuda_emu/README.md)

local function read_graph(path)
  local g = { streams = {}, nodes = {}, edges = {} }
  for line in io.lines(path) do
    local kind, rest = line:match("^(%S+)%s+(.*)$")
    if kind == "stream" then
      local id, creation = rest:match("^(%d+)%s+(%S+)")
      g.streams[tonumber(id)] = creation
    elseif kind == "node" then
      local id, stream, what = rest:match("^(%d+)%s+(%d+)%s+(.*)$")
      g.nodes[tonumber(id)] = { stream = tonumber(stream), what = what }
    elseif kind == "edge" then
      local from, to = rest:match("^(%d+)%s+(%d+)")
      g.edges[#g.edges + 1] = { from = tonumber(from), to = tonumber(to) }
    end
  end
  return g
end

-- device.cu makes, per device in this order, the compute, all-gather and reduce-scatter
-- streams: creation indices 0, 1, 2 for device 0.
local ROLE = { ["0"] = "compute", ["1"] = "gather", ["2"] = "reduce" }

local function check_graph(path, name)
  local g = read_graph(path)
  local function role(node) return ROLE[g.streams[g.nodes[node].stream]] or "other" end
  local function is_coll(node, op) return g.nodes[node].what:find(op, 1, true) ~= nil end
  -- the collectives in issue order, per stream
  local gathers, reduces, seen_gathers, seen_reduces = {}, {}, {}, {}
  local ids = {}
  for id in pairs(g.nodes) do ids[#ids + 1] = id end
  table.sort(ids)
  local last_coll = {}   -- node -> the last collective at or before it on its stream
  local current = {}
  for _, id in ipairs(ids) do
    local r = role(id)
    if r == "gather" and is_coll(id, "AllGather") then gathers[#gathers + 1] = id; current.gather = #gathers end
    if r == "reduce" and (is_coll(id, "ReduceScatter") or is_coll(id, "AllReduce")) then
      reduces[#reduces + 1] = id; current.reduce = #reduces
    end
    last_coll[id] = current[r]
  end
  local sharded = not name:find("^no_shard")
  check((#gathers > 0) == sharded and #reduces > 0, "%s graph: %d gathers and %d reductions recorded", name, #gathers, #reduces)
  local last_backward = 0   -- the compute node before the optimizer: the last one before the last reduction's issue
  for _, id in ipairs(ids) do if role(id) == "compute" and (#reduces == 0 or id < reduces[#reduces]) then last_backward = id end end
  local gather_waits = 0
  for _, e in ipairs(g.edges) do
    local from, to = role(e.from), role(e.to)
    if to == "compute" then
      local k = last_coll[e.from]
      if from == "gather" then
        gather_waits = gather_waits + 1
        -- waits in issue order, each on its own gather: the k-th wait is on the k-th gather
        check(k ~= nil and gathers[k] <= e.from and not seen_gathers[k],
              "%s graph: compute node %d waits on gather stream node %d (gather #%s) out of order", name, e.to, e.from, tostring(k))
        if k then seen_gathers[k] = true end
      elseif from == "reduce" then
        -- a reduction's buffer reused by compute: only once a later reduction was issued
        -- (the in-flight bound), or the optimizer after the backward
        local issued = 0
        for i, r in ipairs(reduces) do if r < e.to then issued = i end end
        check(k ~= nil and (k < issued or e.to > last_backward),
              "%s graph: compute node %d (%s) waits on reduction #%s, the newest issued (#%d): communication serialised with compute",
              name, e.to, g.nodes[e.to].what, tostring(k), issued)
      else
        check(false, "%s graph: compute node %d waits on %s stream node %d", name, e.to, from, e.from)
      end
    elseif to == "gather" or to == "reduce" then
      -- a collective waits only for the compute that wrote its input: never for the other
      -- communication stream (under hybrid sharding a gather runs while the replicas all-reduce)
      check(from == "compute", "%s graph: %s stream node %d waits on %s stream node %d", name, to, e.to, from, e.from)
    end
  end
  check((gather_waits > 0) == sharded, "%s graph: compute waited on %d gathers through events", name, gather_waits)
end

---------------------------------------------------------------------------------------------
-- the matrix

local STRATEGIES = { "full_shard", "shard_grad_op", "no_shard" }
if size == 4 then STRATEGIES = { "hybrid_shard", "hybrid_shard_zero2" } end
local cases = {}
for _, s in ipairs(STRATEGIES) do
  for _, bf16 in ipairs({ false, true }) do
    for _, ckpt in ipairs({ false, true }) do
      cases[#cases + 1] = { strategy = s, bf16 = bf16, ckpt = ckpt, graph = not bf16 and not ckpt }
    end
  end
end
local only = os.getenv("SHARD_FSDP_CASES")
for _, case in ipairs(cases) do
  local name = ("%s/%s/%s"):format(case.strategy, case.bf16 and "bf16" or "f32", case.ckpt and "ckpt" or "nockpt")
  if not only or only:find(name, 1, true) then
    compare(case, name)
    if case.graph and emu.graph_dump and size > 1 then check_graph(("%s/graph.%s.%d"):format(dir, case.strategy, rank), name) end
  end
end

-- the order of issue across communicators, the same on every rank that shares them
if emu.trace_dump then
  local mine = ("%s/nccl-order.%d"):format(dir, rank)
  check(emu.trace_dump(mine) == 0, "cannot write %s", mine)
  env.barrier()
  if rank == 0 then
    local ok, why = support.same_collective_order(dir, size)
    check(ok, "order of issue across communicators: %s", why or "")
  end
  -- gathers and reductions never share a communicator (NCCL runs one communicator's
  -- collectives one at a time: they could not overlap)
  local used = { gather = {}, reduce = {} }
  for line in io.lines(mine) do
    local comm, op = line:match("^%d+%s+(%S+)%s+#%d+%s+(%S+)")
    if comm then used[op == "all_gather" and "gather" or "reduce"][comm] = true end
  end
  for comm in pairs(used.gather) do
    check(not used.reduce[comm], "communicator %s carries both gathers and reductions", comm)
  end
end

print(("mpi_fsdp_strategies (world %d, %s): %d passed, %d failed"):format(size, cuda, passed, failed))
if failed > 0 then os.exit(1) end
