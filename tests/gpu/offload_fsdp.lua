-- FSDP with CPU offload (fsdp.wrap's offload = { params = true }) on the emulated GPU, at the
-- world this runs in (tests/cuda_emu/run.sh runs it alone and as 2 ranks under mpirun):
-- full_shard and shard_grad_op, f32 and bf16 mixed precision (and hybrid_shard over shard
-- groups of one rank, with more than one). 3 AdamW steps of a small GPT
-- with offload must equal the same training without it (the path mpi_fsdp_strategies.lua
-- checks against the CPU, itself checked against one process): the gradients before the
-- first update, every loss and gradient norm (f32: clipped to 0.05) and the final shards to
-- 1e-6 relative. And offload must do what
-- it is for:
--   * the device's peak (its memory stats) falls by at least the optimizer state and the
--     sharded grads that moved to the host (printed with both peaks);
--   * the shards, grads and AdamW state are host tensors, in the CPU's memory stats, as many
--     bytes as `shard estimate --offload` says;
--   * no host wait in a steady-state step beyond one per unit (the CPU optimizer reading that
--     unit's grad) and those of the same step without offload (the loss read, and the norm's
--     when clipping; the emulator's counter);
--   * the next step's copies start during the optimizer step: after it, the root is gathering;
--   * in the emulator's graph of a step, the shards' copies run on the host-copy stream and the
--     grads' on the reduction stream, and the host waits only for the grads' copies and reads.
-- SGD with momentum over host shards equals SGD without offload.
-- A checkpoint saved and loaded with offload resumes the same training, the optimizer's
-- prefetch notwithstanding. Then the options: no_shard refuses offload naming the unit, a malformed option is named, and
-- on the CPU offload is accepted, does nothing (the same losses) and says so once.
local shard = require("shard")
local ffi = require("ffi")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim
local estimate = require("shard.tools.estimate")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")

local env = shard.init{ device = "cpu" }
local rank, size = env.rank, env.world
local gpus = require("shard.ffi").cuda_device_count()
assert(gpus > 0, "offload_fsdp: no CUDA device")
local cuda = "cuda:" .. (env.local_rank % gpus)
shard.C.sh_cuda_init(env.local_rank % gpus)

ffi.cdef [[
long shard_emu_host_waits(void);
void shard_emu_graph_begin(void);
int shard_emu_graph_dump(const char *path);
int getpid(void);
]]
local function emu_fn(name)
  local ok, f = pcall(function() return ffi.C[name] end)
  return ok and f or nil
end
local host_waits = emu_fn("shard_emu_host_waits")
local emu_graph = { begin = emu_fn("shard_emu_graph_begin"), dump = emu_fn("shard_emu_graph_dump") }
local scratch = ("/tmp/shard_offload.%s.%d"):format(os.getenv("PMIX_NAMESPACE") or tostring(ffi.C.getpid()), rank)

local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false, dropout = 0 }
local B_LOCAL, STEPS, LR = 2, 3, 1e-3
local TOL = 1e-6
local function check(ok, fmt, ...)
  support.check(ok, ("rank %d of %d: "):format(rank, size) .. fmt:format(...))
end

local function batch(step, device)   -- this rank's rows of the global batch
  return support.rank_batch(step, device, rank, size, B_LOCAL, CFG.block_size, CFG.vocab_size)
end

local function host_copy(t)
  local c = t:to("cpu")
  t:free()
  return c
end

local function free_all(model, opt)
  for _, e in ipairs(opt.entries) do
    if e.m then e.m:free() end
    if e.v then e.v:free() end
    e.tensor:free()
  end
  for _, u in ipairs(model.all_units) do if u.fp then u.fp:free() end end
  collectgarbage()
  collectgarbage()
end

-- Trains STEPS steps; returns what the comparisons need (host copies) and what each step cost.
local function train(case, device, offload, graph)
  shard.memory.empty_cache(device)
  require("shard.tensor").default_device = device
  local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end, {
    policy = fsdp.policy.transformer{ nn.Block }, strategy = case.strategy, hybrid_group = case.hybrid_group,
    mixed_precision = case.bf16 and { param = "bf16", reduce = "f32" } or nil,
    offload = offload and { params = true } or nil,
  })
  local opt = optim.AdamW(model, { lr = LR, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
  local r = { losses = {}, norms = {}, steps = {}, grads = {}, shards = {}, units = 0, moved = 0, on_host = true }
  for _, u in ipairs(model.all_units) do
    if u.fp then
      r.units = r.units + 1
      local n = u.fp:info().shard_numel
      r.moved = r.moved + 12 * n                      -- AdamW's m and v and the sharded grad, f32
      local s = u.fp:shard()
      r.on_host = r.on_host and s:device() == "cpu"
      s:free()
    end
  end
  for _, e in ipairs(opt.entries) do r.on_host = r.on_host and e.m:device() == "cpu" end
  r.blocks = 2 * r.units + 2 * #opt.entries           -- shards, grads, AdamW's m and v
  for step = 1, STEPS do
    local x, y = batch(step, device)
    collectgarbage()
    collectgarbage("stop")
    shard.memory.reset_peak(device)
    local waits = host_waits and host_waits()
    if graph and step == 2 then emu_graph.begin() end
    local loss = model(x, y)
    loss:backward()
    if step == 1 then    -- the gradients before the first update (this read waits: step 1 only)
      for i, u in ipairs(model.all_units) do
        local g = u.fp and u.fp:grad_shard()
        if g then r.grads[i] = host_copy(g) end
      end
    end
    -- f32: clipped (the norm of host grads); bf16 not, so the optimizer's views alone write the shards
    if not case.bf16 then r.norms[step] = model:clip_grad_norm(0.05):item() end
    opt:step()
    local root_state = model.all_units[1].fp:state()
    opt:zero_grad(true)
    local v = loss:item()
    r.losses[step] = type(v) == "number" and v or 0 / 0
    if graph and step == 2 then emu_graph.dump(graph) end
    r.steps[step] = { waits = waits and host_waits() - waits, peak = shard.memory.stats(device).peak,
                      root_state = root_state }
    loss:free(); x:free(); y:free()
    collectgarbage("restart")
  end
  for i, u in ipairs(model.all_units) do
    if u.fp then r.shards[i] = host_copy(u.fp:shard()) end
  end
  r.host = shard.memory.stats("cpu")
  free_all(model, opt)
  return r
end

local function close(a, b, what)
  local ok, d = pcall(support.rel, a, b)
  if not ok or type(d) ~= "number" or d ~= d then d = math.huge end
  check(d <= TOL, "%s differs by %.3g (normwise relative; at most %g)", what, d, TOL)
end

-- Step 2's dependency graph with offload (the emulator's text format, tests/cuda_emu/README.md):
-- the shards' copies to the device run on the host-copy stream (device.cu makes it fourth,
-- creation index 3), the grads' copies back on the reduce-scatter stream (2), the compute
-- stream (0) waits on neither directly when a gather stands between (world > 1), and the host
-- waits only for the grads' copies (an event on stream 2, one per unit) and for reads.
local function check_graph(path, name, units)
  local creation, node_stream = {}, {}
  local h2d, d2h, bad, grad_waits, other_waits = 0, 0, {}, 0, {}
  local event_stream = {}
  for line in io.lines(path) do
    local kind, rest = line:match("^(%S+)%s+(.*)$")
    if kind == "stream" then
      local id, c = rest:match("^(%d+)%s+(%S+)")
      creation[tonumber(id)] = c
    end
  end
  for line in io.lines(path) do
    local kind, rest = line:match("^(%S+)%s+(.*)$")
    if kind == "node" then
      local id, stream, what = rest:match("^(%d+)%s+(%d+)%s+(.*)$")
      local c = creation[tonumber(stream)]
      node_stream[tonumber(id)] = c
      if what:find("pinned -> device", 1, true) then
        h2d = h2d + 1
        if c ~= "3" then bad[#bad + 1] = "a shard copy on stream " .. tostring(c) end
      elseif what:find("device -> pinned", 1, true) then
        d2h = d2h + 1
        if c ~= "2" then bad[#bad + 1] = "a grad copy on stream " .. tostring(c) end
      end
    elseif kind == "edge" then
      local from, to = rest:match("^(%d+)%s+(%d+)")
      if size > 1 and node_stream[tonumber(from)] == "3" and node_stream[tonumber(to)] == "0" then
        bad[#bad + 1] = "compute waits on the host-copy stream directly"
      end
    elseif kind == "hostwait" then
      local stream = rest:match("^event_sync event %S+ stream (%d+)")
      if stream and creation[tonumber(stream)] == "2" then grad_waits = grad_waits + 1
      elseif not rest:match("^memcpy ") then other_waits[#other_waits + 1] = rest end
    end
  end
  check(h2d > 0 and d2h == units, "%s graph: %d shard copies to the device, %d grad copies to the host (%d units)", name, h2d, d2h, units)
  check(#bad == 0, "%s graph: %s", name, table.concat(bad, "; "))
  check(grad_waits == units and #other_waits == 0, "%s graph: the host waited %d times for grad copies (%d units) and also: %s",
        name, grad_waits, units, table.concat(other_waits, "; "))
end

local function compare(case, name)
  local ref = train(case, cuda, false)
  local graph = emu_graph.dump and scratch .. ".graph" or nil
  local off = train(case, cuda, true, graph)
  if graph then check_graph(graph, name, off.units); os.remove(graph) end
  check(off.on_host, "%s: with offload the shards and the AdamW state are not host tensors", name)
  for i, g in pairs(ref.grads) do
    check(off.grads[i] ~= nil, "%s: unit %d has no grad shard with offload", name, i)
    if off.grads[i] then close(off.grads[i], g, ("%s: unit %d's grad shard before the first update"):format(name, i)) end
  end
  for step = 1, STEPS do
    local a, b = off.losses[step], ref.losses[step]
    check(math.abs(a - b) <= TOL * math.abs(b), "%s step %d: loss %.9g with offload, %.9g without", name, step, a, b)
    if not case.bf16 then
      a, b = off.norms[step], ref.norms[step]
      check(math.abs(a - b) <= TOL * math.abs(b), "%s step %d: grad norm %.9g with offload, %.9g without", name, step, a, b)
      check(b > 0.05, "%s step %d: grad norm %.9g: clipping to 0.05 did nothing", name, step, b)
    end
  end
  for i, s in pairs(ref.shards) do close(off.shards[i], s, ("%s: unit %d's final shard"):format(name, i)) end
  -- memory: the steady-state step's device peak, without and with offload
  local p_ref, p_off = ref.steps[STEPS].peak, off.steps[STEPS].peak
  if rank == 0 then
    print(("%s: device peak %d bytes without offload, %d with: %d less; optimizer state + grad shards %d bytes; " ..
           "host: %d bytes allocated (param %d, grad %d, optim %d)"):format(name, p_ref, p_off, p_ref - p_off, off.moved,
           off.host.allocated, off.host.by_tag.param, off.host.by_tag.grad, off.host.by_tag.optim))
  end
  -- shard estimate --offload: its host figure (shards, grads, AdamW state) against the host's
  -- stats, within the allocator's 64-byte rounding of each block
  require("shard.tensor").default_device = "cpu"
  local est = estimate.estimate({ n_layer = CFG.n_layer, n_head = CFG.n_head, n_embd = CFG.n_embd, vocab_size = CFG.vocab_size,
    block_size = CFG.block_size, bias = CFG.bias, world = size, strategy = case.strategy, hybrid_group = case.hybrid_group or 0,
    batch_size = B_LOCAL, param = case.bf16 and "bf16" or "f32", offload = true })
  local host = off.host.by_tag.param + off.host.by_tag.grad + off.host.by_tag.optim
  check(host >= est.host and host - est.host <= 64 * off.blocks, "%s: shard estimate --offload says %d bytes of host memory, " ..
        "the host holds %d in %d blocks", name, est.host, host, off.blocks)
  check(p_ref - p_off >= off.moved, "%s: the device peak fell by %d bytes with offload (%d -> %d); the optimizer state and " ..
        "grad shards it moved are %d", name, p_ref - p_off, p_ref, p_off, off.moved)
  for step = 2, STEPS do
    local st = off.steps[step]
    if st.waits then
      if rank == 0 and step == 2 then
        print(("%s: %d host waits in step 2 with offload (%d units), %d without"):format(name, st.waits, off.units, ref.steps[2].waits))
      end
      local base = ref.steps[step].waits      -- without offload: the loss and the clipped norm read
      check(st.waits <= off.units + base, "%s step %d: the host waited %d times (at most %d: one per unit for the CPU " ..
            "optimizer, and the %d of a step without offload)", name, step, st.waits, off.units + base, base)
    end
    check(st.peak == off.steps[2].peak, "%s step %d: device peak %d bytes, step 2's was %d", name, step, st.peak, off.steps[2].peak)
    check(st.root_state == "gathering", "%s step %d: after the optimizer step the root is %s: the next step's copy did not start",
          name, step, tostring(st.root_state))
  end
  for _, t in pairs(ref.grads) do t:free() end
  for _, t in pairs(off.grads) do t:free() end
  for _, t in pairs(ref.shards) do t:free() end
  for _, t in pairs(off.shards) do t:free() end
end

local cases = {}
for _, strategy in ipairs({ "full_shard", "shard_grad_op" }) do
  for _, bf16 in ipairs({ false, true }) do cases[#cases + 1] = { strategy = strategy, bf16 = bf16 } end
end
-- hybrid: shards of one rank, replicated across the world (the all-reduce runs before the copy out)
if size > 1 then cases[#cases + 1] = { strategy = "hybrid_shard", bf16 = false, hybrid_group = 1 } end
local only = os.getenv("SHARD_OFFLOAD_CASES")
for _, case in ipairs(cases) do
  local name = ("%s/%s"):format(case.strategy, case.bf16 and "bf16" or "f32")
  if not only or only:find(name, 1, true) then compare(case, name) end
end

-- The other optimizer over host shards: SGD with momentum (its buffer follows the shard to the
-- host) gives the losses and final shards of the same training without offload.
local function sgd_case()
  local function run(offload)
    require("shard.tensor").default_device = cuda
    local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end, {
      policy = fsdp.policy.transformer{ nn.Block }, offload = offload and { params = true } or nil })
    local opt = optim.SGD(model, { lr = 0.05, momentum = 0.9, weight_decay = 0.1 })
    local r = { losses = {}, shards = {}, on_host = true }
    for step = 1, STEPS do
      local x, y = batch(step, cuda)
      local loss = model(x, y)
      loss:backward()
      opt:step()
      opt:zero_grad(true)
      r.losses[step] = loss:item()
      loss:free(); x:free(); y:free()
    end
    for _, e in ipairs(opt.entries) do r.on_host = r.on_host and e.m:device() == "cpu" end
    for i, u in ipairs(model.all_units) do
      if u.fp then r.shards[i] = host_copy(u.fp:shard()) end
    end
    free_all(model, opt)
    return r
  end
  local ref, off = run(false), run(true)
  check(off.on_host, "sgd: with offload the momentum buffers are not host tensors")
  for step = 1, STEPS do
    local a, b = off.losses[step], ref.losses[step]
    check(math.abs(a - b) <= TOL * math.abs(b), "sgd step %d: loss %.9g with offload, %.9g without", step, a, b)
  end
  for i, t in pairs(ref.shards) do
    close(off.shards[i], t, ("sgd: unit %d's final shard"):format(i))
    t:free(); off.shards[i]:free()
  end
end
if not only or only:find("sgd", 1, true) then sgd_case() end

---------------------------------------------------------------------------------------------
-- a checkpoint saved after step 1 and loaded after step 3, while the optimizer's prefetch of
-- the next step's first units is in flight: steps 2 and 3 again give the same losses

local function resume_case()
  local checkpoint = require("shard.checkpoint")
  local dir = ("/tmp/shard_offload_ckpt.%s"):format(os.getenv("PMIX_NAMESPACE") or tostring(ffi.C.getpid()))
  require("shard.tensor").default_device = cuda
  local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end, {
    policy = fsdp.policy.transformer{ nn.Block }, offload = { params = true } })
  local opt = optim.AdamW(model, { lr = LR, weight_decay = 0.1 })
  local function step(k)
    local x, y = batch(k, cuda)
    local loss = model(x, y)
    loss:backward()
    opt:step()
    opt:zero_grad(true)
    local v = loss:item()
    loss:free(); x:free(); y:free()
    return v
  end
  step(1)
  checkpoint.save(dir, { model = model, optim = opt, step = 1 })
  local first = { step(2), step(3) }
  check(model.all_units[1].fp:state() == "gathering", "resume: the root is not prefetched after the optimizer step")
  shard.C.sh_cuda_synchronize(env.local_rank % gpus)   -- the prefetch has run, as a GPU would have run it by now
  checkpoint.load(dir, { model = model, optim = opt })
  local again = { step(2), step(3) }
  for k = 1, 2 do
    check(again[k] == first[k], "resume: step %d after loading step 1's checkpoint: loss %.9g, first time %.9g", k + 1, again[k], first[k])
  end
  free_all(model, opt)
  env.barrier()
  if rank == 0 then os.execute("rm -rf " .. require("shard.ffi").shell_quote(dir)) end
end
resume_case()

---------------------------------------------------------------------------------------------
-- the options

local function wrap_error(opts, device)
  require("shard.tensor").default_device = device
  local ok, err = pcall(fsdp.wrap, function() shard.manual_seed(7); return nn.GPT(CFG) end, opts)
  return not ok and tostring(err) or nil
end

local err = wrap_error({ policy = fsdp.policy.transformer{ nn.Block }, strategy = "no_shard", offload = { params = true } }, cuda)
check(err and err:find("unit transformer.h.0", 1, true) and err:find("no_shard", 1, true) and err:find("full_shard", 1, true),
      "no_shard with offload: expected an error naming the unit, no_shard and the strategies that take offload; got %s", tostring(err))
err = wrap_error({ strategy = "full_shard", offload = true }, cuda)
check(err and err:find("offload must be a table", 1, true), "offload = true: expected an error saying it must be a table; got %s", tostring(err))
err = wrap_error({ strategy = "full_shard", offload = { param = true } }, cuda)
check(err and err:find("no option 'param'", 1, true), "offload = { param = true }: expected an error naming 'param'; got %s", tostring(err))

-- On the CPU: accepted, nothing moves, the same training, one notice (rank 0, stderr).
local function cpu_losses(offload)
  require("shard.tensor").default_device = "cpu"
  local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end, {
    policy = fsdp.policy.transformer{ nn.Block }, offload = offload and { params = true } or nil })
  local opt = optim.AdamW(model, { lr = LR })
  local losses, moved = {}, false
  for _, u in ipairs(model.all_units) do if u.fp and u.fp:info().offload then moved = true end end
  for step = 1, 2 do
    local x, y = batch(step, "cpu")
    local loss = model(x, y)
    loss:backward()
    opt:step()
    opt:zero_grad(true)
    losses[step] = loss:item()
    loss:free(); x:free(); y:free()
  end
  free_all(model, opt)
  return losses, moved
end
local plain = cpu_losses(false)
fsdp.offload_noted = nil
local with, moved = cpu_losses(true)
check(not moved, "on the CPU, offload marked a FlatParameter as offloaded")
check(fsdp.offload_noted == true, "on the CPU, offload was not noted")
for step = 1, 2 do
  check(with[step] == plain[step], "on the CPU step %d: loss %.9g with offload, %.9g without", step, with[step], plain[step])
end

support.finish(("offload_fsdp (world %d, %s)"):format(size, cuda))
