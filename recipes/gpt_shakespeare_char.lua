-- Character-level GPT on Shakespeare: nanoGPT's shakespeare_char CPU configuration
-- (nanoGPT reports val loss 1.88 for it). Any text works with --data=PATH.
--   shard run recipes/gpt_shakespeare_char.lua [--max_iters=2000 ...]
--   shard launch --nproc 4 recipes/gpt_shakespeare_char.lua --strategy=full_shard
-- Checkpoints (shard.checkpoint, in OUT_DIR/ckpt): --save_interval=N saves every N steps
-- (--async_save writes them from a background thread), --keep=K keeps the newest K,
-- --resume continues from the latest one (at any world size or strategy).
-- --grad_accum=K: K micro-batches of batch_size per step; the loss of a step is the mean over
-- every target token of every micro-batch of every rank (shard.nn.global_loss).
local shard = require "shard"
local nn, optim, data = shard.nn, shard.optim, shard.data

-- The corpus: --data=PATH, else tinyshakespeare.txt in $SHARD_DATA (default: ../shared/data
-- beside the project). Only `make run`'s demo (--demo) may fall back to a text every Debian
-- machine has, and it says so; a --data that does not exist stops the run.
local SHAKESPEARE = (os.getenv("SHARD_DATA") or ((os.getenv("SHARD_HOME") or ".") .. "/../shared/data")) .. "/tinyshakespeare.txt"
local DEMO_TEXT = "/usr/share/common-licenses/GPL-3"

local function readable(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local cfg = shard.config{
  data = "", demo = false, out_dir = "out/shakespeare_char",
  n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 12, dropout = 0.0, bias = false,
  lr = 1e-3, min_lr = 1e-4, max_iters = 2000, warmup = 100, beta1 = 0.9, beta2 = 0.99,
  weight_decay = 0.1, grad_clip = 1.0, eval_interval = 250, eval_iters = 20, log_interval = 50,
  seed = 1337, sample_tokens = 300, strategy = "none", device = "auto",   -- auto: cuda when a GPU is there
  save_interval = 0, keep = 0, resume = false, async_save = false, grad_accum = 1,
}

if cfg.grad_accum < 1 then error(("--grad_accum=%d: expected at least 1 micro-batch per step"):format(cfg.grad_accum), 0) end
local env = shard.init{ device = cfg.device }
shard.manual_seed(cfg.seed)

local function corpus()
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
cfg.data = corpus()

-- data: characters -> train.bin / val.bin / meta.lua (rank 0 prepares, the others wait)
local dir = cfg.out_dir .. "/data"
if env.rank == 0 then
  local _, ntrain, nval = data.prepare_char(cfg.data, dir)
  print(("data: %s -> %d train / %d val tokens"):format(cfg.data, ntrain, nval))
end
env.barrier()
local tok = data.load_meta(dir .. "/meta.lua")

local function build()
  return nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.block_size,
                 vocab_size = tok.vocab_size, dropout = cfg.dropout, bias = cfg.bias }
end
local model
if cfg.strategy == "none" then
  if env.world > 1 then error(("%d ranks need a sharding strategy: --strategy=full_shard, shard_grad_op, no_shard or hybrid_shard"):format(env.world), 0) end
  model = build()
else
  -- given the constructor, wrap initialises each rank's shard only (same values as eager init)
  model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = cfg.strategy })
  if env.rank == 0 then print(shard.fsdp.summary(model)) end
end
if env.rank == 0 then print(("model: %.2fM parameters"):format(model:num_params() / 1e6)) end

local opt = optim.AdamW(model, { lr = cfg.lr, betas = { cfg.beta1, cfg.beta2 }, weight_decay = cfg.weight_decay })
local lr_at = optim.cosine_schedule{ lr = cfg.lr, min_lr = cfg.min_lr, warmup = cfg.warmup, decay_iters = cfg.max_iters }
-- batch_size is the global batch; each rank takes its share of the same windows.
local function loader(src, seed)
  local o = { block = cfg.block_size, batch = cfg.batch_size, seed = seed, rank = env.rank, world = env.world, device = env.device }
  if type(src) == "string" then o.path = src else o.tokens = src end
  return data.tokens(o)
end
local train = loader(dir .. "/train.bin", cfg.seed)
local splits = { train = loader(train.tokens, cfg.seed + 1), val = loader(dir .. "/val.bin", cfg.seed + 2) }

local function estimate_loss()
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

local checkpoint = shard.checkpoint
local ckpt_dir = cfg.out_dir .. "/ckpt"
local start = 0
if cfg.resume then
  if checkpoint.latest(ckpt_dir) then
    local info = checkpoint.load(ckpt_dir, { model = model, optim = opt, data = train })
    start = info.step
    if env.rank == 0 then print(("resumed from %s at step %d"):format(info.path, start)) end
  elseif env.rank == 0 then
    print("resume: no checkpoint in " .. ckpt_dir .. ", starting afresh")
  end
end

local tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.grad_accum
local timer = require("shard.timer")
local window_start, window_iters = timer.now(), 0
for it = start, cfg.max_iters do
  if it % cfg.eval_interval == 0 or it == cfg.max_iters then
    local l = estimate_loss()
    shard.log(it, { train_loss = l.train, val_loss = l.val }, { "train_loss", "val_loss" })
    window_start, window_iters = timer.now(), 0
  end
  if it == cfg.max_iters then break end
  opt:set_lr(lr_at(it))
  local xs, ys = {}, {}
  for i = 1, cfg.grad_accum do xs[i], ys[i] = train:next() end
  -- each micro-batch's mean loss weighted by its share of the step's target tokens on all
  -- ranks, so the gradient is that of the whole global batch whatever each one holds
  local gl = nn.global_loss(ys)
  local loss_sum, logging = 0, it % cfg.log_interval == 0
  for i = 1, cfg.grad_accum do
    local loss = model(xs[i], ys[i])
    local scaled = gl:scale(loss, i)
    scaled:backward()
    if logging then loss_sum = loss_sum + scaled:item() end   -- read only when logged: a read waits for the device
    loss:free(); scaled:free(); xs[i]:free(); ys[i]:free()
  end
  if cfg.grad_clip > 0 then shard.fsdp.clip_grad_norm(model, cfg.grad_clip) end
  opt:step()
  opt:zero_grad(true)
  window_iters = window_iters + 1
  if logging then
    local dt = (timer.now() - window_start) / window_iters
    shard.log(it, { loss = gl:mean(loss_sum), ms_per_iter = dt * 1000, tokens_per_s = tokens_per_iter / dt, lr = opt.lr },
              { "loss", "ms_per_iter", "tokens_per_s", "lr" })
    window_start, window_iters = timer.now(), 0
  end
  if cfg.save_interval > 0 and (it + 1) % cfg.save_interval == 0 then
    checkpoint.save(ckpt_dir, { model = model, optim = opt, step = it + 1, data = train, config = cfg,
                                keep = cfg.keep, async = cfg.async_save })
  end
end
checkpoint.wait()    -- an asynchronous save still writing

-- where memory went on this rank (peak and the bytes by tag at the peak)
if env.rank == 0 then print("memory (rank 0): " .. shard.memory.format(shard.memory.stats())) end

if cfg.sample_tokens > 0 then   -- every rank runs it: a sharded model's forward is collective
  local start = shard.tensor({ { tok.stoi["\n"] or 0 } }, { dtype = "i64" })
  local out = model:generate(start, cfg.sample_tokens, 0.8, 200)
  if env.rank == 0 then
    print("---- sample ----")
    print(tok.decode(out:tolist()[1]))
  end
end

-- One machine-readable line for shard sweep: `metrics {json}` on rank 0. peak_bytes is the
-- largest allocator peak over the ranks (the whole run: training, evaluation, sampling).
-- Bytes per step come from one more forward and backward after everything else, counted
-- alone (the loop's counters would mix in evaluation and sampling): the collectives a
-- training step issues, which the optimizer step adds none to. Its gradients are dropped,
-- so the model is left as trained.
do
  local comm = shard.comm
  local group = comm.world()
  local x, y = train:next()
  comm.reset_counts()
  local loss = model(x, y)
  loss:backward()
  if cfg.grad_clip > 0 then shard.fsdp.clip_grad_norm(model, cfg.grad_clip) end
  local counts, bytes = comm.counts(), {}
  local total = 0
  for kind in pairs(counts) do bytes[kind] = comm.bytes(kind); total = total + bytes[kind] end
  opt:zero_grad(true)
  loss:free(); x:free(); y:free()
  local peak = shard.tensor({ shard.memory.stats(env.device).peak }, { dtype = "f64" })
  group:all_reduce(peak, "max")
  local fields = { world = env.world, strategy = cfg.strategy, peak_bytes = peak:get({ 1 }),
                   comm_bytes_per_step = total, comm_bytes_by_kind = bytes, collectives_per_step = counts }
  peak:free()
  if env.rank == 0 then print("metrics " .. require("cjson").encode(fields)); io.stdout:flush() end
end
