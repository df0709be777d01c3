-- bench/cpu_train.lua: training-step throughput of the Shakespeare recipe's model on the
-- CPU (n_layer 4, n_head 4, n_embd 128, block 64, batch 12, vocab 65, AdamW, grad clip 1),
-- on random tokens. Prints "tokens_per_s N" after `warmup` untimed steps, and
-- "flops_per_token N": the step's matmul work, 6 (12 L C^2 + C V) + 6 L C T (forward and
-- backward of every linear layer and the tied head, attention's QK^T and AV with the causal
-- half skipped), the convention of bench/gpt2_124m.lua; make bench turns it into GFLOP/s.
-- --dtype=bf16: the same model wrapped as FSDP full_shard of one process with mixed precision
-- (bf16 compute, f32 master weights and optimizer), as the recipe's --dtype=bf16 runs it.
--   shard run bench/cpu_train.lua [--iters=50] [--dtype=bf16]
local shard = require("shard")
local timer = require("shard.timer")
local cfg = shard.config({ iters = 50, warmup = 5, profile = false, n_layer = 4, n_head = 4, n_embd = 128, block_size = 64,
                          batch_size = 12, vocab_size = 65, seed = 1337, dtype = "f32" },
                        { warmup = { min = 0 }, dtype = { oneof = { "f32", "bf16" } } })
shard.manual_seed(cfg.seed)
local function build()
  return shard.nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.block_size,
                       vocab_size = cfg.vocab_size, bias = false, dropout = 0 }
end
assert(cfg.dtype == "f32" or cfg.dtype == "bf16", "--dtype: expected f32 or bf16")
local model = cfg.dtype == "f32" and build() or
  shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ shard.nn.Block }, strategy = "full_shard",
                           mixed_precision = { param = "bf16" } })
local opt = shard.optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 })

local function batch()
  local u = shard.rand({ cfg.batch_size, cfg.block_size + 1 })
  local s = u * cfg.vocab_size
  local ids = s:to("i64")
  u:free(); s:free()
  local x = ids:narrow(2, 1, cfg.block_size):contiguous()
  local y = ids:narrow(2, 2, cfg.block_size):contiguous()
  ids:free()
  return x, y
end

local function step()
  local x, y = batch()
  local loss = model(x, y)
  loss:backward()
  shard.fsdp.clip_grad_norm(model, 1.0)
  opt:step()
  opt:zero_grad(true)
  local v = loss:item()
  loss:free(); x:free(); y:free()
  return v
end

for _ = 1, cfg.warmup do step() end
if cfg.profile then shard.profile.start() end
local t0 = timer.now()
for _ = 1, cfg.iters do step() end
local dt = timer.now() - t0
if cfg.profile then shard.profile.stop(); print(shard.profile.report()) end
print(("tokens_per_s %.1f"):format(cfg.iters * cfg.batch_size * cfg.block_size / dt))
print(("ms_per_iter %.3f"):format(dt / cfg.iters * 1000))
local L, C = cfg.n_layer, cfg.n_embd
print(("flops_per_token %d"):format(6 * (12 * L * C * C + C * cfg.vocab_size) + 6 * L * C * cfg.block_size))
print(("peak_bytes %d"):format(shard.memory.stats().peak))
