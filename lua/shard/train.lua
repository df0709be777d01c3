-- shard.train: the training loop the language-model recipes share. A recipe names its model
-- and the settings that shape it; everything else (data, sharding, optimizer, evaluation,
-- checkpoints, logging, sampling, the metrics line) is here:
--   require("shard.train").run{
--     defaults = { n_layer = 4, n_embd = 128 },           -- the model's settings (overridable)
--     spec = { n_layer = { min = 1 } },                    -- their ranges (shard.config)
--     build = function(cfg, vocab_size) return nn.GPT{ ... } end,
--     block = nn.Block,                                    -- the wrap policy's unit
--     flops_per_token = function(cfg, n_params) return 6 * n_params + ... end,
--   }
-- Two more fields replace the character corpus and the built model: data = function(cfg, env)
-- returning the tokenizer ({ vocab_size, decode(ids), prompt = ids }) and the train and val
-- tokens (shard.data.load_tokens tables), and from_pretrained = function(cfg, wrap, vocab_size)
-- returning the model, sharded by fsdp.wrap's options `wrap` (nil: plain) (gpt2_finetune.lua).
-- Settings every recipe takes (see COMMON): the corpus (--data, else tinyshakespeare.txt in
-- $SHARD_DATA; only `make run`'s --demo falls back to a text every Debian machine has), the
-- batch and schedule, --strategy (FSDP, any world size), checkpoints (--save_interval,
-- --async_save, --keep, --resume at any world size or strategy), --grad_accum=K (the loss of
-- a step is the mean over every target token of every micro-batch of every rank), and with it
-- --accum_sync: every (the default: each micro-batch reduces into the sharded grads, the least
-- memory), last (the inner micro-batches skip every reduction and keep unsharded grads: one
-- reduction per step) or replica_last (hybrid: the inner ones reduce-scatter within the shard
-- group and skip only the all-reduce across groups, the collective that crosses nodes).
-- --deterministic: the losses and parameters bit-identical at any world size, strategy and
-- grad_accum split of the step's global batch of batch_size x grad_accum windows (FSDP's
-- deterministic mode, fsdp/determ.lua; f32, on the CPU or CUDA). The final metrics line carries
-- params_sha256, the digest of the trained parameters, in either mode.
-- --dtype=bf16 computes in bf16 with f32 master weights: FSDP mixed precision (param bf16,
-- gradients reduced and kept in f32, the optimizer on the f32 shards); with --strategy=none
-- the model is wrapped as one process's full_shard FSDP (world 1: one shard, all of it),
-- which holds the f32 parameters and gathers their bf16 copy for each forward and backward. On the CPU the linear layers' GEMMs
-- then run on AVX-512 BF16 in the avx512bf16 CPU kernel set (runtime/cpu.h, gemm_bf16.c).
--
-- Every log_interval steps a progress line gives tokens/s, the model FLOP/s achieved per rank
-- and MFU (against shard.peak: the measured GEMM peak on the CPU, the vendor's on a GPU), the
-- memory peak and the communication the host waited for (exposed); the same figures go, one
-- JSON object per line, to --metrics_file (default OUT_DIR/train.jsonl) for shard sweep and
-- plots. At the same points each rank's own work per step is compared with the others'
-- (shard.straggler): a rank slower than the median by --straggler_margin for
-- --straggler_windows intervals in a row is named in a warning.
-- --trace=FILE writes a Chrome/Perfetto trace of steps --trace_steps=FIRST:LAST (default 1:2)
-- and prints its summary (shard.trace); --memory_timeline=PNG draws each rank's allocations
-- over those steps, stacked by tag.
-- --snapshot_interval=K copies each rank's state into host memory every K steps
-- (shard.snapshot; -1, the default: when shard launch may restart the job, every step if a
-- snapshot costs the step at most 3% of its wall time, measured on the run, else the smallest
-- K under it; else never),
-- --snapshot_replicas=1 keeps each rank's buddy's too; a
-- job that shard launch restarts (SHARD_RESTART) goes on from the newest state every rank
-- can restore: snapshots, else the newest checkpoint.
local shard = require("shard")
local cjson = require("cjson")
local timer = require("shard.timer")
local median = require("shard.stats").median
local readable = require("shard.files").readable
local units = require("shard.units")

local M = {}

local SHAKESPEARE = (os.getenv("SHARD_DATA") or ((os.getenv("SHARD_HOME") or ".") .. "/../shared/data")) .. "/tinyshakespeare.txt"
local DEMO_TEXT = "/usr/share/common-licenses/GPL-3"

M.COMMON = {
  data = "", demo = false, out_dir = "out/shakespeare_char",
  block_size = 64, batch_size = 12,
  lr = 1e-3, min_lr = 1e-4, max_iters = 2000, warmup = 100, beta1 = 0.9, beta2 = 0.99,
  weight_decay = 0.1, grad_clip = 1.0, eval_interval = 250, eval_iters = 20, log_interval = 50,
  seed = 1337, sample_tokens = 300, strategy = "none", device = "auto",   -- auto: cuda when a GPU is there
  dtype = "f32",   -- or bf16: mixed precision with f32 master weights
  offload = false, -- FSDP CPU offload: sharded parameters, grads and AdamW state in host memory
  save_interval = 0, keep = 0, resume = false, async_save = false, grad_accum = 1,
  metrics_file = "", straggler_margin = 0.25, straggler_windows = 3, accum_sync = "every",
  hybrid_group = "node",   -- hybrid strategies: ranks per shard group, or "node"
  trace = "", trace_steps = "1:2", memory_timeline = "",   -- shard.trace: a Chrome trace, a memory PNG
  snapshot_interval = -1, snapshot_replicas = 0,           -- shard.snapshot
  deterministic = false,   -- the same bits at any world size, strategy and grad_accum (fsdp/determ.lua)
  cuda_graph = false,      -- the step captured once as a CUDA graph and replayed (shard.cuda_graph)
}

-- Each common setting's range (shard.config checks it before any work and --help lists it;
-- sizes such as batch_size take at least 1 there); a recipe adds its own as recipe.spec.
local STRATEGIES = { "none", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2" }
M.SPEC = {
  data = { help = "a text file; unset: tinyshakespeare.txt in $SHARD_DATA, else in ../shared/data" },
  demo = { help = "no corpus found: train on " .. DEMO_TEXT },
  out_dir = { help = "token files (data/CORPUS/), checkpoints (ckpt/), train.jsonl" },
  metrics_file = { help = 'one JSON object per progress line; "": OUT_DIR/train.jsonl' },
  resume = { help = "from the newest checkpoint in OUT_DIR/ckpt, at any world size" },
  offload = { help = "FSDP CPU offload of the sharded parameters, grads and AdamW state" },
  trace = { help = "a Chrome/Perfetto trace file of --trace_steps" },
  trace_steps = { help = "FIRST:LAST" }, memory_timeline = { help = "a PNG of each rank's allocations over --trace_steps" },
  batch_size = { help = "the global batch, split over the ranks" },
  lr = { min = 0 }, min_lr = { min = 0 }, warmup = { min = 0 }, max_iters = { min = 0, help = "0: evaluate only" },
  beta1 = { min = 0, below = 1 }, beta2 = { min = 0, below = 1 }, weight_decay = { min = 0 },
  grad_clip = { min = 0, help = "0: no clipping" }, eval_interval = { min = 1 },
  log_interval = { min = 1 }, sample_tokens = { min = 0 }, strategy = { oneof = STRATEGIES },
  device = { oneof = { "auto", "cpu", "cuda" } }, dtype = { oneof = { "f32", "bf16" }, help = "bf16: mixed precision, f32 master weights" },
  save_interval = { min = 0, help = "0: no checkpoints" }, keep = { min = 0, help = "0: keep every checkpoint" },
  straggler_margin = { above = 0, help = "0.25: 25% slower than the median" },
  straggler_windows = { min = 1 }, accum_sync = { oneof = { "every", "last", "replica_last" } },
  hybrid_group = { help = "ranks per shard group, or node" },
  snapshot_interval = { min = -1, help = "steps between in-memory snapshots; 0: none; -1: under shard launch --max_restarts the smallest under 3% of a step (1 if it is), else none" },
  snapshot_replicas = { min = 0, max = 1, help = "1: each rank also holds its buddy's snapshot (on another node where there is one)" },
  deterministic = { help = "losses and parameters bit-identical at any world size, strategy and grad_accum (f32; CPU or CUDA, each its own bits)" },
  cuda_graph = { help = "CUDA: capture the step once as a graph, replay it each step (each at its step's lr)" },
}

local function usage(fmt, ...) error({ usage = fmt:format(...) }, 0) end

-- The settings that depend on each other (each alone is checked by its range in SPEC).
local function check_combinations(cfg)
  local mode = cfg.accum_sync
  if mode ~= "every" and cfg.strategy == "none" then
    usage("--accum_sync=%s: only FSDP reduces gradients; pass --strategy too", mode)
  end
  if mode == "replica_last" and not cfg.strategy:find("^hybrid_shard") then
    usage("--accum_sync=replica_last: %s has no all-reduce across groups; use hybrid_shard or hybrid_shard_zero2", cfg.strategy)
  end
  if cfg.deterministic and cfg.dtype ~= "f32" then usage("--deterministic: f32 only, not --dtype=%s", cfg.dtype) end
  if cfg.deterministic and mode ~= "every" then
    usage("--deterministic --accum_sync=%s: deterministic mode reduces once per step; leave accum_sync at every", mode)
  end
  if cfg.cuda_graph then
    -- a replayed step is the captured step's sequence of work (the lr schedule goes to each
    -- launch: shard.cuda_graph); what changes that sequence or runs outside it is refused
    for _, o in ipairs {
      { cfg.deterministic, "--deterministic", "the deterministic step is not captured (fsdp/determ.lua runs it row by " ..
        "row); drop --deterministic" },
      { cfg.offload, "--offload", "CPU offload copies on a stream of its own, outside the captured step; drop --offload" },
      { mode ~= "every", "--accum_sync=" .. mode,
        "the captured step syncs gradients on every micro-batch; leave --accum_sync at every" },
    } do
      if o[1] then usage("--cuda_graph with %s: %s (or drop --cuda_graph)", o[2], o[3]) end
    end
  end
  if cfg.hybrid_group ~= "node" and not ((tonumber(cfg.hybrid_group) or 0) >= 1) then
    usage("--hybrid_group=%s: expected a number of ranks (at least 1) or node", cfg.hybrid_group)
  end
end

local function corpus(cfg, env)
  if cfg.data ~= "" then return cfg.data end
  if readable(SHAKESPEARE) then return SHAKESPEARE end
  if cfg.demo and readable(DEMO_TEXT) then
    if env.rank == 0 then
      print(("*** DEMO: %s is missing, so this run trains on %s instead (pass --data=PATH for a real corpus) ***")
        :format(SHAKESPEARE, DEMO_TEXT))
    end
    return DEMO_TEXT
  end
  error(("no corpus: %s is missing; pass --data=PATH"):format(SHAKESPEARE), 0)
end

-- --data is read before any work: a path that cannot be read is a wrong command line.
local function check_data(cfg)
  if cfg.data == "" or readable(cfg.data .. "/meta.json") then return end   -- a text, or shard.data.prepare's folder
  local f, err = io.open(cfg.data, "rb")
  if not f then usage("--data=%s: cannot read it (%s)", cfg.data, err:match(": ([^:]*)$") or err) end
  local ok = f:read(0)   -- nil for a directory or an empty file
  f:close()
  if not ok then usage("--data=%s: an empty file or a directory, not a text to train on", cfg.data) end
end

local function settings(recipe)
  local defaults = {}
  for k, v in pairs(M.COMMON) do defaults[k] = v end
  for k, v in pairs(recipe.defaults or {}) do defaults[k] = v end
  local spec = {}
  for k, v in pairs(M.SPEC) do spec[k] = v end
  for k, v in pairs(recipe.spec or {}) do spec[k] = v end
  local cfg = shard.config(defaults, spec)
  check_combinations(cfg)
  check_data(cfg)
  return cfg
end

-- characters -> OUT_DIR/data/CORPUS/{train.bin, val.bin, meta.lua}: rank 0 prepares, the
-- others wait. Returns the tokenizer and the train and val sources (paths, or in a dry run
-- the token arrays themselves: a dry run writes no file that a run reads).
local function prepare_data(recipe, cfg, env)
  if recipe.data then return recipe.data(cfg, env) end
  if env.device == "meta" then
    local c = shard.data.char_corpus(cfg.data)
    return c.tok, c.train, c.val
  end
  local dir = shard.data.corpus_dir(cfg.out_dir .. "/data", cfg.data)
  if env.rank == 0 then
    local _, ntrain, nval, current = shard.data.prepare_char(cfg.data, dir)
    print(("data: %s -> %s: %d train / %d val tokens%s"):format(cfg.data, dir, ntrain, nval, current and " (up to date)" or ""))
  end
  env.barrier()
  return shard.data.load_meta(dir .. "/meta.lua"), dir .. "/train.bin", dir .. "/val.bin"
end

local function make_model(recipe, cfg, env, vocab_size)
  local function build() return recipe.build(cfg, vocab_size) end
  local model
  local mixed = cfg.dtype == "bf16" and { param = "bf16" } or nil
  -- deterministic with --strategy=none: one process's full_shard FSDP, as bf16 is
  local wrapped = cfg.strategy ~= "none" or mixed or cfg.deterministic
  if cfg.strategy == "none" and env.world > 1 then
    error(("%d ranks need a sharding strategy: --strategy=full_shard, shard_grad_op, no_shard or hybrid_shard"):format(env.world), 0)
  end
  if cfg.offload and (cfg.strategy == "none" or cfg.strategy == "no_shard") then
    error(("--offload needs a sharding strategy (full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2), not --strategy=%s"):format(cfg.strategy), 0)
  end
  if recipe.from_pretrained then   -- the recipe loads its weights, plain or sharded as wrap's options say
    local wrap = nil
    if wrapped then
      wrap = { policy = shard.fsdp.policy.transformer{ recipe.block }, strategy = cfg.strategy == "none" and "full_shard" or cfg.strategy,
               hybrid_group = tonumber(cfg.hybrid_group) or cfg.hybrid_group, mixed_precision = mixed,
               offload = cfg.offload and { params = true } or nil, deterministic = cfg.deterministic }
    end
    model = recipe.from_pretrained(cfg, wrap, vocab_size)
    if wrap and env.rank == 0 then print(shard.fsdp.summary(model)) end
  elseif not wrapped then
    model = build()
  else
    -- given the constructor, wrap initialises each rank's shard only (same values as eager init);
    -- bf16 on one process: full_shard of world 1 (see above)
    local strategy = cfg.strategy == "none" and "full_shard" or cfg.strategy
    model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ recipe.block }, strategy = strategy,
                                     hybrid_group = tonumber(cfg.hybrid_group) or cfg.hybrid_group,
                                     mixed_precision = mixed, offload = cfg.offload and { params = true } or nil,
                                     deterministic = cfg.deterministic })
    if env.rank == 0 then print(shard.fsdp.summary(model)) end
  end
  if env.rank == 0 then print(("model: %.2fM parameters"):format(model:num_params() / 1e6)) end
  return model
end

-- batch_size is the global batch; each rank takes its share of the same windows. Under
-- --deterministic the training loader draws a step's whole global batch (batch_size x
-- grad_accum windows) at once, so that any grad_accum split of it is the same windows.
local function loaders(cfg, env, train_src, val_src)
  local function loader(src, seed, batch)
    local o = { block = cfg.block_size, batch = batch or cfg.batch_size, seed = seed, rank = env.rank, world = env.world, device = env.device }
    if type(src) == "string" then o.path = src else o.tokens = src end
    return shard.data.tokens(o)
  end
  local train = loader(train_src, cfg.seed, cfg.deterministic and cfg.batch_size * cfg.grad_accum or nil)
  return train, { train = loader(train.tokens, cfg.seed + 1), val = loader(val_src, cfg.seed + 2) }
end

local function estimate_loss(model, splits, cfg, env)
  model:eval()
  local out = {}
  for _, name in ipairs { "train", "val" } do   -- a fixed order: every rank must issue the same collectives
    local split = splits[name]
    local total = 0
    for i = 1, cfg.eval_iters do
      local x, y = split:batch_at(i)
      total = total + shard.no_grad(function() return model(x, y):item() end)
      x:free(); y:free()
    end
    out[name] = env.all_reduce_mean(total / cfg.eval_iters)
  end
  model:train()
  return out
end

-- A job shard launch restarted: from the newest snapshot or checkpoint (shard.snapshot);
-- rank 0 says which, for the launcher's restart line.
local function restore(cfg, env, state)
  local step, how = require("shard.snapshot").restore{ model = state.model, optim = state.optim, data = state.data,
                                                        env = env, ckpt_dir = cfg.out_dir .. "/ckpt" }
  for _, why in ipairs(how.skipped) do io.stderr:write(("snapshot: skipped %s (rank %d)\n"):format(why, env.rank)) end
  if env.rank == 0 then
    print(("restart: restored step %d from %s%s%s"):format(step, how.source,
      how.source == "memory" and (" (world %d: %d own, %d buddy copies)"):format(how.world, how.own, how.copies) or "",
      how.lost and (", %d step%s lost"):format(how.lost, how.lost == 1 and "" or "s") or ""))
    io.stdout:flush()
  end
  return step
end

-- The snapshot interval in effect (see --snapshot_interval): a number of steps (0: none) or "auto".
local function snapshot_interval(cfg)
  if cfg.snapshot_interval >= 0 then return cfg.snapshot_interval end
  return (tonumber(os.getenv("SHARD_MAX_RESTARTS") or "") or 0) > 0 and "auto" or 0
end

local function resume(cfg, env, state)
  local checkpoint, ckpt_dir = shard.checkpoint, cfg.out_dir .. "/ckpt"
  if not checkpoint.latest(ckpt_dir) then
    if env.rank == 0 then print("resume: no checkpoint in " .. ckpt_dir .. ", starting afresh") end
    return 0
  end
  local info = checkpoint.load(ckpt_dir, state)
  if env.rank == 0 then print(("resumed from %s at step %d"):format(info.path, info.step)) end
  return info.step
end

-- A step's end, after its backward: clip, then the optimizer. snaps: a copy of the state may be
-- in flight until the optimizer writes it.
local function update(model, opt, cfg, snaps)
  local trace = shard.trace
  if cfg.grad_clip > 0 then trace.span("clip grad norm", shard.fsdp.clip_grad_norm, model, cfg.grad_clip) end
  if snaps then snaps:before_update() end
  trace.span("optimizer", function() opt:step(); opt:zero_grad(true) end)
end

-- One training step of grad_accum micro-batches; returns the step's loss when `read` (a read
-- waits for the device, so only logged steps read it).
local function step(model, opt, train, cfg, read, snaps)
  local trace = shard.trace
  local xs, ys = {}, {}
  trace.span("data", function() for i = 1, cfg.grad_accum do xs[i], ys[i] = train:next() end end)
  -- each micro-batch's mean loss weighted by its share of the step's target tokens on all
  -- ranks, so the gradient is that of the whole global batch whatever each one holds
  local gl = shard.nn.global_loss(ys)
  local loss_sum = 0
  for i = 1, cfg.grad_accum do
    local last = i == cfg.grad_accum
    if cfg.accum_sync == "last" then model:set_requires_gradient_sync(last) end
    if cfg.accum_sync == "replica_last" then model:set_requires_all_reduce(last) end
    local loss = model(xs[i], ys[i])
    local scaled = gl:scale(loss, i)
    scaled:backward()
    if read then loss_sum = loss_sum + scaled:item() end
    loss:free(); scaled:free(); xs[i]:free(); ys[i]:free()
  end
  update(model, opt, cfg, snaps)
  return read and gl:mean(loss_sum) or nil
end

-- The --cuda_graph step: step()'s work captured once (shard.cuda_graph.step) on the
-- micro-batches and their global-loss factors (computed on the host before each launch, from
-- the batch), returning the scaled losses' sum on the device; read only when `read`.
local function graph_stepper(model, opt, cfg, env)
  local n = cfg.grad_accum
  local graphed = shard.cuda_graph.step(function(factors, ...)
    local batch, sum = { ... }, nil
    for i = 1, n do
      local loss = model(batch[i], batch[n + i])
      local scaled = loss * factors:select(1, i)
      scaled:backward()
      local v = scaled:detach()
      sum = sum and sum + v or v
    end
    if cfg.grad_clip > 0 then shard.fsdp.clip_grad_norm(model, cfg.grad_clip) end
    opt:step()
    opt:zero_grad(true)
    return sum
  end, { optimizer = opt, model = model })
  return function(train, read)
    local xs, ys, f = {}, {}, {}
    for i = 1, n do xs[i], ys[i] = train:next() end
    local gl = shard.nn.global_loss(ys)
    for i = 1, n do f[i] = gl:factor(i) end
    local factors = shard.tensor(f, { device = env.device })
    local args = { factors, unpack(xs) }
    for i = 1, n do args[n + 1 + i] = ys[i] end
    local sum = graphed(unpack(args))
    factors:free()
    for i = 1, n do xs[i]:free(); ys[i]:free() end
    return read and gl:mean(sum:item()) or nil
  end
end

-- A --deterministic step's gradients (fsdp/determ.lua): this rank's rows of the step's global
-- batch, one forward and backward each (each row a chunk of the fixed tree; the grad_accum
-- split does not change what runs), each loss scaled by its row's share of the global batch's
-- target tokens; the gradients reduced in tree order at the end. Returns the step's loss when
-- `read`: the rows' scaled losses added in row order over every rank (an all-gather).
local function deterministic_backward(model, train, env, read)
  local fsdp = shard.fsdp
  local x, y
  shard.trace.span("data", function() x, y = train:next() end)
  local rows = x:shape()[1]
  local xs, ys = {}, {}
  for i = 1, rows do xs[i], ys[i] = x:narrow(1, i, 1), y:narrow(1, i, 1) end
  local gl = shard.nn.global_loss(ys)
  fsdp.deterministic_begin(model, { chunks = rows * env.world, first = env.rank * rows, count = rows })
  local losses = {}
  for i = 1, rows do
    local loss = model(xs[i], ys[i])
    local scaled = loss * (gl.tokens > 0 and gl.counts[i] / gl.tokens or 0)
    scaled:backward()
    if read then losses[i] = scaled:item() end
    loss:free(); scaled:free(); xs[i]:free(); ys[i]:free()
  end
  x:free(); y:free()
  fsdp.deterministic_finish(model)
  if not read then return nil end
  local mine = shard.tensor(losses, { dtype = "f64" })
  local all = env.group:all_gather(mine)
  local sum = 0
  for _, v in ipairs(all:tolist_flat()) do sum = sum + v end
  mine:free(); all:free()
  return sum
end

local function deterministic_step(model, opt, train, cfg, env, read, snaps)
  local loss = deterministic_backward(model, train, env, read)
  update(model, opt, cfg, snaps)
  return loss
end

-- Throughput over a window of steps: tokens/s for the whole job, model FLOP/s per rank, MFU.
local Meter = {}
Meter.__index = Meter

local function meter(recipe, cfg, env, model)
  local n_params = model:num_params()
  local per_token = recipe.flops_per_token and recipe.flops_per_token(cfg, n_params) or 6 * n_params
  local peak = require("shard.peak").of(env.device, cfg.dtype)
  local self = setmetatable({ env = env, per_token = per_token, peak = peak,
                              tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum }, Meter)
  self:restart()
  return self
end

function Meter:restart()
  self.t0, self.waited0, self.steps = timer.now(), require("shard.comm").wait_seconds(), 0
  self.cpu0 = os.clock()   -- this process's CPU time, every thread's: a measure the machine's load does not stretch
end

-- The window's figures; restarts the window.
function Meter:window()
  local seconds = timer.now() - self.t0
  local waited = require("shard.comm").wait_seconds() - self.waited0
  local steps = self.steps
  local dt = seconds / steps
  local tokens_per_s = self.tokens_per_step / dt
  local flops = self.per_token * tokens_per_s / self.env.world      -- per rank
  local out = { steps = steps, seconds = seconds, waited = waited, ms_per_iter = dt * 1000,
                cpu_ms_per_iter = (os.clock() - self.cpu0) / steps * 1000,
                tokens_per_s = tokens_per_s, tflops = flops / 1e12,
                mfu = self.peak and flops / self.peak.flops or nil,
                exposed_comm_ms = waited / steps * 1000,
                peak_bytes = shard.memory.stats(self.env.device).peak }
  self:restart()
  return out
end

-- The window's figures for a person, each kind in one format (shard.units); train.jsonl has
-- the same figures as raw numbers (MFU there a fraction).
local function progress_line(it, loss, lr, w)
  shard.log(it, { loss = units.fixed(loss, 4), ms_per_iter = units.ms(w.seconds / w.steps),
                  tokens_per_s = units.count(w.tokens_per_s), lr = units.lr(lr), tflops = units.fixed(w.tflops, 3),
                  mfu = w.mfu and units.percent(w.mfu), peak_mib = units.mib(w.peak_bytes),
                  exposed_comm_ms = units.ms(w.waited / w.steps) },
            { "loss", "ms_per_iter", "tokens_per_s", "lr", "tflops", "mfu", "peak_mib", "exposed_comm_ms" })
end

local function jsonl_writer(cfg, env)
  local path = cfg.metrics_file ~= "" and cfg.metrics_file or (cfg.out_dir .. "/train.jsonl")
  if env.rank ~= 0 or env.device == "meta" then return function() end end   -- a dry run writes nothing
  local f, err = io.open(path, "w")
  if not f then error(("--metrics_file: cannot write %s: %s"):format(path, err), 0) end
  return function(fields)
    f:write(cjson.encode(fields), "\n")
    f:flush()
  end, path
end

-- One machine-readable line for shard sweep: `metrics {json}` on rank 0. peak_bytes is the
-- largest allocator peak over the ranks (the whole run: training, evaluation, sampling).
-- Bytes per step come from one more forward and backward after everything else, counted
-- alone (the loop's counters would mix in evaluation and sampling): the collectives a
-- training step issues, which the optimizer step adds none to. Its gradients are dropped,
-- so the model is left as trained.
local function metrics_line(model, opt, train, cfg, env, extra)
  local comm = shard.comm
  comm.reset_counts()
  if cfg.deterministic then
    deterministic_backward(model, train, env, false)
  else
    local x, y = train:next()
    local loss = model(x, y)
    loss:backward()
    loss:free(); x:free(); y:free()
  end
  if cfg.grad_clip > 0 then shard.fsdp.clip_grad_norm(model, cfg.grad_clip) end
  local counts, bytes = comm.counts(), {}
  local total = 0
  for kind in pairs(counts) do bytes[kind] = comm.bytes(kind); total = total + bytes[kind] end
  opt:zero_grad(true)
  local peak = shard.tensor({ shard.memory.stats(env.device).peak }, { dtype = "f64" })
  env.group:all_reduce(peak, "max")
  local fields = { world = env.world, strategy = cfg.strategy, peak_bytes = peak:get({ 1 }),
                   comm_bytes_per_step = total, comm_bytes_by_kind = bytes, collectives_per_step = counts }
  for k, v in pairs(extra) do fields[k] = v end
  peak:free()
  if env.rank == 0 then print("metrics " .. cjson.encode(fields)); io.stdout:flush() end
end

function M.run(recipe)
  local cfg = settings(recipe)
  local env = shard.init{ device = cfg.device }
  if cfg.deterministic and env.device == "meta" then
    usage("--deterministic: not in a dry run (its ordered reduction has no dry-run collective)")
  end
  if cfg.cuda_graph and not env.device:find("^cuda") then usage("--cuda_graph: needs a CUDA device, got %s", env.device) end
  local cpu = env.device == "cpu" and require("shard.cpu").describe() or nil
  if cpu and env.rank == 0 then print("cpu: " .. cpu) end
  shard.manual_seed(cfg.seed)
  if cfg.deterministic and (cfg.batch_size * cfg.grad_accum) % env.world ~= 0 then
    usage("--deterministic: the step's global batch of %d x %d windows does not split over %d ranks",
          cfg.batch_size, cfg.grad_accum, env.world)
  elseif not cfg.deterministic and cfg.batch_size % env.world ~= 0 then
    usage("--batch_size=%d: the global batch does not split over %d ranks", cfg.batch_size, env.world)
  end
  cfg.data = corpus(cfg, env)
  local tok, train_src, val_src = prepare_data(recipe, cfg, env)
  local model = make_model(recipe, cfg, env, tok.vocab_size)

  local optim = shard.optim
  local opt = optim.AdamW(model, { lr = cfg.lr, betas = { cfg.beta1, cfg.beta2 }, weight_decay = cfg.weight_decay })
  local lr_at = optim.cosine_schedule{ lr = cfg.lr, min_lr = cfg.min_lr, warmup = cfg.warmup, decay_iters = cfg.max_iters }
  local graphed = cfg.cuda_graph and graph_stepper(model, opt, cfg, env)
  local train, splits = loaders(cfg, env, train_src, val_src)
  local checkpoint, ckpt_dir = shard.checkpoint, cfg.out_dir .. "/ckpt"
  local state = { model = model, optim = opt, data = train }
  local restarted = (tonumber(os.getenv("SHARD_RESTART") or "") or 0) > 0 and env.device ~= "meta"
  local start = restarted and restore(cfg, env, state) or cfg.resume and resume(cfg, env, state) or 0
  local interval = env.device ~= "meta" and snapshot_interval(cfg) or 0
  local snaps = interval ~= 0 and require("shard.snapshot").new{ model = model, optim = opt, data = train, env = env,
                                                                  interval = interval, replicas = cfg.snapshot_replicas } or nil

  local write = jsonl_writer(cfg, env)
  local watch = require("shard.straggler").new{ group = env.group, margin = cfg.straggler_margin, windows = cfg.straggler_windows }
  local meter = meter(recipe, cfg, env, model)
  write{ event = "start", device = env.device, cpu = cpu, world = env.world, strategy = cfg.strategy,
         n_params = model:num_params(), flops_per_token = meter.per_token, tokens_per_step = meter.tokens_per_step,
         peak_tflops = meter.peak and meter.peak.flops / 1e12, peak_source = meter.peak and meter.peak.source }
  local rates, mfus, cpus = {}, {}, {}
  shard.trace.setup{ path = cfg.trace, steps = cfg.trace_steps, memory_timeline = cfg.memory_timeline, device = env.device }
  for it = start, cfg.max_iters do
    if it % cfg.eval_interval == 0 or it == cfg.max_iters then
      local l = estimate_loss(model, splits, cfg, env)
      shard.log(it, { train_loss = l.train, val_loss = l.val }, { "train_loss", "val_loss" })
      write{ iter = it, train_loss = l.train, val_loss = l.val }
      meter:restart()
    end
    if it == cfg.max_iters then break end
    opt:set_lr(lr_at(it))
    local logging = it % cfg.log_interval == 0 or it == cfg.max_iters - 1   -- the last step too
    shard.trace.begin_step(it)
    local loss
    if cfg.deterministic then loss = deterministic_step(model, opt, train, cfg, env, logging, snaps)
    elseif graphed then
      if snaps then snaps:before_update() end   -- the replayed step ends in the optimizer
      loss = graphed(train, logging)
    else loss = step(model, opt, train, cfg, logging, snaps) end
    shard.trace.end_step(it)
    if snaps then snaps:after_step(it + 1) end
    if restarted and it == start and env.rank == 0 then print(("restart: step %d completed"):format(it + 1)); io.stdout:flush() end
    meter.steps = meter.steps + 1
    if logging then
      local w = meter:window()
      rates[#rates + 1], mfus[#mfus + 1], cpus[#cpus + 1] = w.tokens_per_s, w.mfu, w.cpu_ms_per_iter
      progress_line(it, loss, opt.lr, w)
      write{ iter = it, loss = loss, ms_per_iter = w.ms_per_iter, tokens_per_s = w.tokens_per_s, lr = opt.lr,
             tflops = w.tflops, mfu = w.mfu, peak_bytes = w.peak_bytes, exposed_comm_ms = w.exposed_comm_ms,
             world = env.world, strategy = cfg.strategy }
      for _, warning in ipairs(watch:observe(w.steps, w.seconds, w.waited)) do
        -- on stdout, whole lines between the progress lines (stderr would interleave with them)
        if env.rank == 0 then print("warning: " .. warning); io.stdout:flush() end
      end
    end
    if cfg.save_interval > 0 and (it + 1) % cfg.save_interval == 0 then
      checkpoint.save(ckpt_dir, { model = model, optim = opt, step = it + 1, data = train, config = cfg,
                                  keep = cfg.keep, async = cfg.async_save })
    end
  end
  checkpoint.wait()    -- an asynchronous save still writing
  if snaps then snaps:close() end
  shard.trace.finish()   -- when the run ended before the last traced step

  -- the trained parameters' digest, for comparing runs (the same at any world size under --deterministic)
  local params_sha256 = env.device ~= "meta" and shard.fsdp.params_sha256(model) or nil
  -- where memory went on this rank (peak and the bytes by tag at the peak)
  if env.rank == 0 then print("memory (rank 0): " .. shard.memory.format(shard.memory.stats())) end

  if cfg.sample_tokens > 0 and model.generate then   -- every rank runs it: a sharded model's forward is collective
    local first = shard.tensor({ tok.prompt or { tok.stoi["\n"] or 0 } }, { dtype = "i64" })
    local out = model:generate(first, cfg.sample_tokens, 0.8, 200)
    if env.rank == 0 then
      print("---- sample ----")
      print(tok.decode(out:tolist()[1]))
    end
  end
  -- the medians leave out the first window when there are others: it is the run's first step
  -- alone (compiling, allocating, warming the caches)
  local function steady(xs) return #xs > 1 and { unpack(xs, 2) } or xs end
  metrics_line(model, opt, train, cfg, env, { tokens_per_s = median(steady(rates)), mfu = median(steady(mfus)),
                                              cpu_ms_per_iter = median(steady(cpus)),
                                              params_sha256 = params_sha256, deterministic = cfg.deterministic })
  return { model = model, cfg = cfg, env = env }
end

return M
