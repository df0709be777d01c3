-- A GPT training step (forward, backward, clip, optimizer) captured as a CUDA graph and
-- replayed (shard.cuda_graph.step) against the same steps run eagerly, the lr following a
-- warmup + cosine schedule set before each step (as the recipes do): losses and parameters
-- equal bit for bit over 7 steps (2 eager warm-up, the captured one, 4 replays; the capture
-- inside the schedule's warmup, so every replay runs another lr than the captured one), for
-- the plain model under AdamW and under SGD (momentum, Nesterov, weight decay), and under FSDP
-- with AdamW (full_shard, bf16 mixed precision, clip_grad_norm, activation checkpointing) at the
-- world it runs in (tests/cuda_emu/run.sh runs it alone and under mpirun -np 2, where the
-- collectives in the graph are the NCCL stand-in's; FSDP only there); a replayed step is one
-- host launch (the emulator's counters, skipped on a real GPU); and, at world 1, the refusals: a
-- host read inside the step, another batch shape, two optimizers captured with different lrs
-- driven by one, a negative lr, CPU offload, a CPU device, fp16's grad scaler. SHARD_GRAPH_CASES (a list of plain,
-- sgd, fsdp, refusals; default all) runs some (the drain-order reruns take fsdp). Prints
-- "cuda_graph_step (rank R of N): N passed, N failed".
local shard = require("shard")
local ffi = require("ffi")
local nn, optim = shard.nn, shard.optim
local cuda_graph = require("shard.cuda_graph")
local snapshot = require("shard.snapshot")

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
local SGD_CFG = { n_layer = 1, n_head = 2, n_embd = 32, vocab_size = 100, block_size = 32, bias = true }   -- the SGD runs: its kernel and the batch copy need no more
local STEPS, ROWS = 7, 4
local cases = os.getenv("SHARD_GRAPH_CASES") or "plain,sgd,fsdp,refusals,recipe"
local function wanted(case) return (","  .. cases .. ","):find("," .. case .. ",", 1, true) ~= nil end

-- the lr of step `it` (from 0) for a base lr: linear warmup over 3 steps, cosine to a tenth
-- by the last step (the recipes' schedule)
local function lr_at(base, it)
  return optim.cosine_schedule{ lr = base, min_lr = base / 10, warmup = 3, decay_iters = STEPS - 1 }(it)
end

local batches = {}
for step = 1, STEPS do
  local x, y = support.rank_batch(step, "cpu", env.rank, env.world, ROWS, CFG.block_size, CFG.vocab_size)
  batches[step] = { x, y }
end

-- model, optimizer and step function for one run; fsdp: wrapped at the world it runs in;
-- kind: AdamW or SGD
local function setup(fsdp, kind)
  shard.manual_seed(11)
  local model
  if fsdp then
    model = shard.fsdp.wrap(function() local m = nn.GPT(CFG); m:checkpoint({ nn.Block }); return m end, {
      policy = shard.fsdp.policy.transformer{ nn.Block }, mixed_precision = { param = "bf16", reduce = "f32" } })
  else
    model = nn.GPT(kind == "SGD" and SGD_CFG or CFG)
  end
  local opt = kind == "SGD" and optim.SGD(model, { lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01 })
            or optim.AdamW(model, { lr = 1e-3 })
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

-- a loss for a message: LuaJIT takes some NaN bit patterns (the poison's) for other values
local function loss_text(t)
  local v = t:item()
  return ("%.9g"):format(type(v) == "number" and v or 0 / 0)
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

-- step s (from 1) of a run on `model`, through `call` at the schedule's lr: the loss
local function step_at(s, opt, call, base, x, y)
  opt:set_lr(lr_at(base, s - 1))
  x, y = x or batches[s][1]:to(env.device), y or batches[s][2]:to(env.device)
  local loss = call(x, y)
  x:free(); y:free()
  return loss
end

-- losses and parameters of STEPS steps, eager or through the graph helper; opts.skip_copy: the
-- planted bug, a replay that does not copy the new batch into the graph's inputs (its first
-- replay shows it, so the run stops there); opts.snapshots: snapshots (shard.snapshot, as
-- train.lua drives them) after every step but the last, so the newest is of a step a replay
-- followed. Also the lrs set and the snapshots.
local function run(fsdp, kind, graphed, opts)
  opts = opts or {}
  local model, opt, step = setup(fsdp, kind)
  local losses, launches, lrs, call = {}, {}, {}, step
  local base = opt.lr
  local snaps = opts.snapshots and snapshot.new{ model = model, optim = opt, env = env, interval = 1 } or nil
  if graphed then call = cuda_graph.step(step, { optimizer = opt, model = model, warmup = 2 }) end
  for s = 1, opts.skip_copy and 4 or STEPS do
    lrs[s] = lr_at(base, s - 1)
    local x, y
    if opts.skip_copy and s > 3 then x, y = batches[3][1]:to(env.device), batches[3][2]:to(env.device) end
    if snaps then snaps:before_update() end   -- the replayed step ends in the optimizer
    if on_emu then ffi.C.shard_emu_reset_counters() end
    local loss = step_at(s, opt, call, base, x, y)
    if on_emu then
      launches[s] = { tonumber(ffi.C.shard_emu_launches()), tonumber(ffi.C.shard_emu_graph_launches()),
                      tonumber(ffi.C.shard_emu_graph_nodes()) }
    end
    losses[s] = { bits = bits(loss), text = loss_text(loss) }
    if snaps and s < STEPS then snaps:after_step(s) end
  end
  return losses, params_of(model), launches, opt, lrs, snaps
end

-- at world 2 only FSDP: the plain model and the refusals have no collective to show there
local runs = {}
if env.world == 1 and wanted("plain") then runs[#runs + 1] = { name = "plain AdamW", kind = "AdamW" } end
if env.world == 1 and wanted("sgd") then runs[#runs + 1] = { name = "plain SGD", kind = "SGD", snapshots = true } end
if wanted("fsdp") then runs[#runs + 1] = { name = ("FSDP world %d AdamW"):format(env.world), kind = "AdamW", fsdp = true } end
for _, r in ipairs(runs) do
  local name, fsdp = r.name, r.fsdp
  local el, ep, _, _, lrs = run(fsdp, r.kind, false)
  local gl, gp, gn, gopt, _, snaps = run(fsdp, r.kind, true, { snapshots = r.snapshots })
  local differ = 0   -- the replays' lrs, each unlike the captured step's
  for s = 4, STEPS do if lrs[s] ~= lrs[3] then differ = differ + 1 end end
  check(differ == STEPS - 3, ("%s: %d of %d replays run another lr than the captured step"):format(name, differ, STEPS - 3))
  for s = 1, STEPS do
    check(el[s].bits == gl[s].bits, ("%s step %d: graph loss %s vs eager %s"):format(name, s, gl[s].text, el[s].text))
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
  -- the newest snapshot, of the step before the last replay, restored into a fresh model and
  -- optimizer: the eager last step from there ends where the graph's did
  if snaps then
    local model, opt, step = setup(fsdp, r.kind)
    local base = opt.lr   -- the schedule's, before the restore sets the snapshot's
    local from, how = snapshot.restore{ model = model, optim = opt, env = env }
    check(from == STEPS - 1 and how.source == "memory",
      ("%s: restored step %d from %s, expected step %d from memory"):format(name, from, how.source, STEPS - 1))
    check(opt.step_count == STEPS - 1, ("%s: the restored optimizer counts %d steps"):format(name, opt.step_count))
    step_at(STEPS, opt, step, base)
    local rp, same = params_of(model), 0
    for i = 1, #gp do if rp[i] == gp[i] then same = same + 1 end end
    check(same == #gp, ("%s: %d of %d parameters equal bit for bit after a restore of step %d and one step more"):format(
      name, same, #gp, STEPS - 1))
    snaps:close()
  end
  -- the planted bug: a replay on the captured batch instead of the new one must show
  if r.kind == "SGD" then   -- on the smallest model: the batch copy is the same for any
    local bl = run(fsdp, r.kind, true, { skip_copy = true })
    check(bl[4].bits ~= el[4].bits, ("a replay without the new batch must differ: %s vs %s"):format(bl[4].text, el[4].text))
  end
end

-- refusals, each naming what it refuses
local function fails(fn, pattern, what)
  local ok, err = pcall(fn)
  check(not ok and tostring(err):find(pattern, 1, true) ~= nil, ("%s: %s"):format(what, tostring(err)))
end

if env.world == 1 and wanted("refusals") then
  local model, opt, step = setup(false)
  local x, y = batches[1][1]:to(env.device), batches[1][2]:to(env.device)
  local s = cuda_graph.step(step, { optimizer = opt, warmup = 1 })
  s(x, y); s(x, y)
  local x2, y2 = x:narrow(1, 1, 2):contiguous(), y:narrow(1, 1, 2):contiguous()
  fails(function() s(x2, y2) end, "the captured step's is i64 [4, 32]", "another batch shape")
  opt:set_lr(-1)
  fails(function() s(x, y) end, "cuda_graph_set_lr: lr must be >= 0, got -1", "a negative lr")
  opt:set_lr(1e-3)
  -- two optimizers over halves of the model at different lrs: one lr cannot drive both
  local params = model:parameters()
  local half = math.floor(#params / 2)
  local first, second = optim.AdamW({ unpack(params, 1, half) }, { lr = 1e-3 }),
                        optim.AdamW({ unpack(params, half + 1) }, { lr = 5e-4 })
  local two = cuda_graph.step(function(a, b)
    local loss = model(a, b); loss:backward(); first:step(); second:step(); first:zero_grad(true); second:zero_grad(true)
    return loss
  end, { optimizer = first, warmup = 1 })
  two(x, y)
  fails(function() two(x, y) end, "captured with learning rates 0.001 and 0.0005", "two optimizers, two lrs")
  local reads = cuda_graph.step(function(a, b) local loss = step(a, b); loss:item(); return loss end, { warmup = 1 })
  reads(x, y)
  fails(function() reads(x, y) end, "while a CUDA graph is captured", "a host read inside the step")
  fails(function() cuda_graph.step(step, { warmup = 0 }) end, "warmup must be a whole number >= 1", "warmup 0")
  local scaler = shard.amp.GradScaler(opt)
  local scaled = cuda_graph.step(function(a, b)
    local loss = model(a, b)
    scaler:scale(loss):backward(); scaler:step(); scaler:update(); opt:zero_grad(true)
    return loss
  end, { warmup = 1 })
  scaled(x, y)
  fails(function() scaled(x, y) end, "amp.GradScaler: fp16 loss scaling skips a step by reading on the host", "fp16's grad scaler")
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

-- the recipe with its default schedule (warmup over every step of this short run, so each a
-- new lr) and a snapshot every step: --cuda_graph trains to the parameters of the eager run
if env.world == 1 and wanted("recipe") then
  local rt = require("shard.ffi")
  local q, dir = rt.shell_quote, os.tmpname()
  local function run_recipe(flags)
    local out, status = rt.shell(("%s run %s --device=cuda --data=/usr/share/common-licenses/GPL-3 --max_iters=6 " ..
      "--n_layer=1 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 --eval_iters=1 --sample_tokens=0 " ..
      "--snapshot_interval=1 --out_dir=%s %s"):format(q(require("shard.tools.launch").shard_exe()),
      q(rt.root .. "/recipes/gpt_shakespeare_char.lua"), q(dir .. "_run"), flags))
    local sha = out:match('"params_sha256":"(%x+)"')
    check(status == 0 and sha ~= nil, ("the recipe %s: exit %d\n%s"):format(flags, status, out))
    return sha
  end
  local eager, graphed = run_recipe(""), run_recipe("--cuda_graph")
  check(eager == graphed, ("the recipe's parameters with --cuda_graph %s, eager %s"):format(tostring(graphed), tostring(eager)))
  rt.shell("rm -rf " .. q(dir .. "_run") .. " " .. q(dir))
end

if env.world > 1 then
  check(env.group:device_backend() == "nccl", "the CUDA collectives took " .. env.group:device_backend() .. ", not nccl")
end
support.finish(("cuda_graph_step (rank %d of %d)"):format(env.rank, env.world))
