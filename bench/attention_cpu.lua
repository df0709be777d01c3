-- bench/attention_cpu.lua: CPU causal attention alone, on the benchmark model's shapes (qkv of
-- [batch, block, 3 n_embd] split into n_head heads, as GPT's attention reads it). Prints the
-- best of `rounds` rounds of `iters` calls, in us per call: forward + backward, and forward
-- alone (no grad). Thread count: OMP_NUM_THREADS.
--   shard run bench/attention_cpu.lua [--iters=300 --batch_size=12 --block_size=64 --n_embd=128 --n_head=4]
local shard = require("shard")
local F = require("shard.functional")
local timer = require("shard.timer")
local cfg = shard.config({ iters = 300, rounds = 7, warmup = 10, batch_size = 12, block_size = 64, n_embd = 128,
                          n_head = 4, seed = 1337 }, { warmup = { min = 0 } })
shard.manual_seed(cfg.seed)
local qkv = shard.randn({ cfg.batch_size, cfg.block_size, 3 * cfg.n_embd }):requires_grad_(true)
local dy = shard.randn({ cfg.batch_size, cfg.block_size, cfg.n_embd })

local function best_us(f)
  for _ = 1, cfg.warmup do f() end
  local best = math.huge
  for _ = 1, cfg.rounds do
    local t0 = timer.now()
    for _ = 1, cfg.iters do f() end
    best = math.min(best, (timer.now() - t0) / cfg.iters * 1e6)
  end
  return best
end

local function forward_backward()
  local y = F.causal_attention(qkv, cfg.n_head)
  y:backward(dy)
  y:free()
  qkv.grad = nil
end

local function forward()
  shard.no_grad(function() F.causal_attention(qkv, cfg.n_head):free() end)
end

print(("attention_fwd_bwd_us %.1f"):format(best_us(forward_backward)))
print(("attention_fwd_us %.1f"):format(best_us(forward)))
