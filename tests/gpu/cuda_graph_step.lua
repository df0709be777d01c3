-- A GPT training step (forward, backward, clip, AdamW) captured as a CUDA graph and replayed
-- (shard.cuda_graph.step) against the same steps run eagerly: losses and parameters equal bit
-- for bit over 6 steps (2 eager warm-up, the captured one, 3 replays), for the plain model and
-- under FSDP (full_shard, bf16 mixed precision, clip_grad_norm, activation checkpointing) at
-- the world it runs in (tests/cuda_emu/run.sh runs it alone and under mpirun -np 2, where the
-- collectives in the graph are the NCCL stand-in's; FSDP only there); a replayed step is one
-- host launch (the emulator's counters, skipped on a real GPU); and, at world 1, the refusals: a
-- host read inside the step, another batch shape, a changed lr, CPU offload, a CPU device. Prints
-- "cuda_graph_step (rank R of N): N passed, N failed".
local shard = require("shard")
local ffi = require("ffi")
local nn, optim = shard.nn, shard.optim
local cuda_graph = require("shard.cuda_graph")

local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check = support.check

ffi.cdef [[
long shard_emu_launches(void);
long shard_emu_graph_launches(void);
long shard_emu_graph_nodes(void);
void shard_emu_reset_counters(void);
]]
local on_emu = pcall(function() return ffi.C.shard_emu_graph_launches end)
if not on_emu then print("# no emulator (shard_emu_graph_launches absent): launch counts not checked") end

local env = shard.init{ device = "cuda" }
local CFG = { n_layer = 2, n_head = 4, n_embd = 64, vocab_size = 100, block_size = 32, bias = true }
local STEPS, ROWS = 6, 4

local batches = {}
for step = 1, STEPS do
  local x, y = support.rank_batch(step, "cpu", env.rank, env.world, ROWS, CFG.block_size, CFG.vocab_size)
  batches[step] = { x, y }
end

-- model, optimizer and step function for one run; fsdp: wrapped at world 1
local function setup(fsdp)
  shard.manual_seed(11)
  local model
  if fsdp then
    model = shard.fsdp.wrap(function() local m = nn.GPT(CFG); m:checkpoint({ nn.Block }); return m end, {
      policy = shard.fsdp.policy.transformer{ nn.Block }, mixed_precision = { param = "bf16", reduce = "f32" } })
  else
    model = nn.GPT(CFG)
  end
  local opt = optim.AdamW(model, { lr = 1e-3 })
  local function step(x, y)
    local loss = model(x, y)
    loss:backward()
    if fsdp then model:clip_grad_norm(1.0) end
    opt:step()
    opt:zero_grad(true)
    return loss
  end
  return model, opt, step
end

-- a tensor's bytes, as the host reads them (bit for bit)
local function bits(t)
  local h = t:to("cpu"):contiguous()
  return ffi.string(h:data_ptr(), h:numel() * ffi.C.sh_dtype_size(h.p.dtype))
end

local function params_of(model)
  local out = {}
  for i, sl in ipairs(shard.fsdp.local_slices(model)) do
    local v = sl:view()
    out[i] = bits(v)
    v:free()
  end
  return out
end

-- losses and parameters of STEPS steps, eager or through the graph helper (`skip_copy`: the
-- planted bug, a replay that does not copy the new batch into the graph's inputs)
local function run(fsdp, graphed, skip_copy)
  local model, opt, step = setup(fsdp)
  local losses, launches, call = {}, {}, step
  if graphed then call = cuda_graph.step(step, { optimizer = opt, model = model, warmup = 2 }) end
  for s = 1, STEPS do
    local x, y = batches[s][1]:to(env.device), batches[s][2]:to(env.device)
    if skip_copy and s > 3 then x, y = batches[3][1]:to(env.device), batches[3][2]:to(env.device) end
    if on_emu then ffi.C.shard_emu_reset_counters() end
    local loss = call(x, y)
    if on_emu then
      launches[s] = { tonumber(ffi.C.shard_emu_launches()), tonumber(ffi.C.shard_emu_graph_launches()),
                      tonumber(ffi.C.shard_emu_graph_nodes()) }
    end
    losses[s] = loss:item()
    x:free(); y:free()
  end
  return losses, params_of(model), launches, opt
end

-- at world 2 only FSDP: the plain model and the refusals have no collective to show there
for _, fsdp in ipairs(env.world == 1 and { false, true } or { true }) do
  local name = fsdp and ("FSDP world %d"):format(env.world) or "plain"
  local el, ep = run(fsdp, false)
  local gl, gp, gn, gopt = run(fsdp, true)
  for s = 1, STEPS do
    check(el[s] == gl[s], ("%s step %d: graph loss %.9g vs eager %.9g"):format(name, s, gl[s], el[s]))
  end
  local same = 0
  for i = 1, #ep do if ep[i] == gp[i] then same = same + 1 end end
  check(same == #ep, ("%s: %d of %d parameters equal bit for bit after %d steps"):format(name, same, #ep, STEPS))
  check(gopt.step_count == STEPS, ("%s: the optimizer counts %d steps, expected %d"):format(name, gopt.step_count, STEPS))
  if on_emu then
    local w = gn[2]
    check(w[1] > 20 and w[2] == 0, ("%s: an eager step launches kernels (%d) and no graph (%d)"):format(name, w[1], w[2]))
    for s = 4, STEPS do   -- the batch goes in by two copies (memcpy, not kernels)
      local r = gn[s]
      check(r[1] == 0 and r[2] == 1 and r[3] >= w[1],
        ("%s replayed step %d: %d kernel launches and %d graph launch from the host (expected 0 and 1), %d nodes " ..
         "replayed (eager: %d launches)"):format(name, s, r[1], r[2], r[3], w[1]))
    end
  end
  -- the planted bug: a replay on the captured batch instead of the new one must show
  if not fsdp then
    local bl = run(fsdp, true, true)
    check(bl[4] ~= el[4], ("a replay without the new batch must differ: %.9g vs %.9g"):format(bl[4], el[4]))
  end
end

-- refusals, each naming what it refuses
local function fails(fn, pattern, what)
  local ok, err = pcall(fn)
  check(not ok and tostring(err):find(pattern, 1, true) ~= nil, ("%s: %s"):format(what, tostring(err)))
end

if env.world == 1 then
  local model, opt, step = setup(false)
  local x, y = batches[1][1]:to(env.device), batches[1][2]:to(env.device)
  local s = cuda_graph.step(step, { optimizer = opt, warmup = 1 })
  s(x, y); s(x, y)
  local x2, y2 = x:narrow(1, 1, 2):contiguous(), y:narrow(1, 1, 2):contiguous()
  fails(function() s(x2, y2) end, "the captured step's is i64 [4, 32]", "another batch shape")
  opt:set_lr(5e-4)
  fails(function() s(x, y) end, "the learning rate changed from 0.001 to 0.0005", "a changed lr")
  local reads = cuda_graph.step(function(a, b) local loss = step(a, b); loss:item(); return loss end, { warmup = 1 })
  reads(x, y)
  fails(function() reads(x, y) end, "while a CUDA graph is captured", "a host read inside the step")
  fails(function() cuda_graph.step(step, { warmup = 0 }) end, "warmup must be a whole number >= 1", "warmup 0")
  local off = shard.fsdp.wrap(function() return nn.GPT(CFG) end, { policy = shard.fsdp.policy.transformer{ nn.Block },
                                                                    offload = { params = true } })
  local off_opt = optim.AdamW(off, { lr = 1e-3 })
  fails(function() cuda_graph.step(function() end, { optimizer = off_opt, model = off }) end,
    "cuda_graph.step: FSDP CPU offload copies on a stream of its own", "CPU offload")
  fails(function() cuda_graph.capture("cpu", function() end) end, "needs a CUDA device (cuda or cuda:N), got cpu", "cpu")
  -- after a refused capture the device works eagerly
  local loss = step(x, y)
  check(loss:item() == loss:item(), "an eager step after the refused capture")
end

if env.world > 1 then
  check(env.group:device_backend() == "nccl", "the CUDA collectives took " .. env.group:device_backend() .. ", not nccl")
end
support.finish(("cuda_graph_step (rank %d of %d)"):format(env.rank, env.world))
