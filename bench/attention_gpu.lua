-- bench/attention_gpu.lua: causal attention alone on a CUDA device, at GPT-2 124M's shapes, as
-- the model calls it: qkv [B, T, 3C] bf16 split into H heads of D (strided views), y [B, T, C].
-- Prints the median device time of `iters` calls (events around each) in ms, and the rate in
-- TFLOP/s counting the causal half of the score and value products (forward 2 B H T^2 D,
-- backward 2.5x that), the same lines as bench/peers/attention_torch.py:
--   attention_fwd_ms N, attention_fwd_bwd_ms N, attention_fwd_tflops N, attention_fwd_bwd_tflops N
-- and the same forward + backward with deterministic kernels (shard.set_deterministic: the
-- two-kernel backward instead of the one pass that sums dq with atomics), which the peer lacks:
--   attention_fwd_bwd_deterministic_ms N
--   shard run bench/attention_gpu.lua [--batch_size=16 --block_size=1024 --n_embd=768 --n_head=12]
local shard = require("shard")
local F = require("shard.functional")
local timing = dofile("bench/gpu_timing.lua")

local cfg = shard.config({ iters = 20, warmup = 3, batch_size = 16, block_size = 1024, n_embd = 768, n_head = 12,
                          seed = 1337 }, { warmup = { min = 0 } })
local env = shard.init{ device = "cuda" }
shard.manual_seed(cfg.seed)
local B, T, C = cfg.batch_size, cfg.block_size, cfg.n_embd
local qkv = shard.randn({ B, T, 3 * C }):to{ dtype = "bf16", device = env.device }:requires_grad_(true)
local dy = shard.randn({ B, T, C }):to{ dtype = "bf16", device = env.device }

local function forward()
  shard.no_grad(function() F.causal_attention(qkv, cfg.n_head):free() end)
end

local function forward_backward()
  local y = F.causal_attention(qkv, cfg.n_head)
  y:backward(dy)
  y:free()
  qkv.grad:free()
  qkv.grad = nil
end

local fwd_flops = 2 * B * T * T * C          -- QK^T and PV over the causal half: 2 * (2 B H T^2 D) / 2
local fwd_ms = timing.median_ms(forward, cfg.iters, cfg.warmup)
local all_ms = timing.median_ms(forward_backward, cfg.iters, cfg.warmup)
print(("attention_fwd_ms %.4f"):format(fwd_ms))
print(("attention_fwd_bwd_ms %.4f"):format(all_ms))
print(("attention_fwd_tflops %.1f"):format(fwd_flops / (fwd_ms / 1e3) / 1e12))
print(("attention_fwd_bwd_tflops %.1f"):format(3.5 * fwd_flops / (all_ms / 1e3) / 1e12))
shard.set_deterministic(true)
print(("attention_fwd_bwd_deterministic_ms %.4f"):format(timing.median_ms(forward_backward, cfg.iters, cfg.warmup)))
shard.set_deterministic(false)
