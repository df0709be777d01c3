-- bench/gpt2_124m.lua: GPT-2 124M training throughput on one GPU (issue 5's benchmark).
-- 12 layers, 12 heads, n_embd 768, vocab 50304, T 1024; bf16 mixed precision (bf16 compute
-- copy, f32 master weights and reduction) under FSDP full_shard at world 1; AdamW; grad clip 1;
-- random tokens (the figure is the step, not the data pipeline). Prints, after `warmup`
-- untimed steps, the same lines as bench/peers/gpt2_124m_torch.py:
--   tokens_per_s N, ms_per_iter N, mfu N (6N + 6 L C T flops per token against the bf16
--   matmul peak measured here, in this run), matmul_tflops N, peak_bytes N; and
--   cuda_mallocs_timed N (blocks taken from cudaMalloc during the timed steps).
--   shard run bench/gpt2_124m.lua [--batch_size=32] [--iters=20] [--trace=PATH]
-- It assumes the front-end of DESIGN.md's recipe: shard.init{device = "cuda"} makes cuda:0
-- the default device (sh_cuda_init), nn.GPT(cfg) builds its parameters there, fsdp.wrap
-- takes mixed_precision = {param = "bf16", reduce = "f32"}, and sh_gemm_ dispatches CUDA
-- tensors to cuBLASLt.
local shard = require("shard")
local ffi = require("ffi")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check
local nn, fsdp, optim = shard.nn, shard.fsdp, shard.optim

local cfg = shard.config({ iters = 20, warmup = 5, batch_size = 32, block_size = 1024, n_layer = 12, n_head = 12,
                          n_embd = 768, vocab_size = 50304, seed = 1337, lr = 6e-4,
                          peak_n = 8192, trace = "" }, { warmup = { min = 0 }, lr = { min = 0 } })
local env = shard.init{ device = "cuda" }
local device = env.device
shard.manual_seed(cfg.seed)

local timing = dofile("bench/gpu_timing.lua")
local elapsed_ms = timing.elapsed_ms

-- The bf16 matmul ceiling of this GPU, measured now: peak_n^3 products (8192), median of 10.
local function matmul_peak()
  local n = cfg.peak_n
  local a = shard.randn({ n, n }):to{ dtype = "bf16", device = device }
  local b = shard.randn({ n, n }):to{ dtype = "bf16", device = device }
  local c = shard.empty({ n, n }, { dtype = "bf16", device = device })
  local function gemm() check(C.sh_gemm_(c.p, a.p, b.p, 0, 1, 1.0, 0.0)) end
  local ms = timing.median_ms(gemm, 10, 3)
  a:free(); b:free(); c:free()
  return 2 * n ^ 3 / (ms / 1e3)
end

local model = fsdp.wrap(nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
                                block_size = cfg.block_size, vocab_size = cfg.vocab_size, bias = true, dropout = 0 },
                        { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                          mixed_precision = { param = "bf16", reduce = "f32" } })
local opt = optim.AdamW(model, { lr = cfg.lr, betas = { 0.9, 0.95 }, weight_decay = 0.1 })

-- N: parameters without the position embedding (nanoGPT's count; the tied lm_head once).
local n_params = 12 * cfg.n_layer * cfg.n_embd ^ 2 + 13 * cfg.n_layer * cfg.n_embd + 2 * cfg.n_embd
                 + cfg.vocab_size * cfg.n_embd
local flops_per_token = 6 * n_params + 6 * cfg.n_layer * cfg.n_embd * cfg.block_size

local function batch()
  local u = shard.rand({ cfg.batch_size, cfg.block_size + 1 })
  local s = u * cfg.vocab_size
  local ids = s:to("i64")
  u:free(); s:free()
  -- every handle freed here, views included: a view left to the GC holds the ids' block, and
  -- the next step's batch then misses the allocator's cache
  local xs, ys = ids:narrow(2, 1, cfg.block_size), ids:narrow(2, 2, cfg.block_size)
  local x, y = xs:to(device), ys:to(device)
  xs:free(); ys:free(); ids:free()
  return x, y
end

local last_loss
local function step()
  local x, y = batch()
  local loss = model(x, y)
  loss:backward()
  fsdp.clip_grad_norm(model, 1.0)
  opt:step()
  opt:zero_grad(true)
  last_loss = loss
  x:free(); y:free()
end

-- --trace=PATH: shard.trace of the last two warm-up steps (device spans per op and stream), so
-- the timed steps carry no tracing.
shard.trace.setup{ path = cfg.trace, steps = ("%d:%d"):format(math.max(1, cfg.warmup - 1), cfg.warmup), device = device }
for i = 1, cfg.warmup do
  shard.trace.begin_step(i)
  step(); last_loss:item(); last_loss:free()
  shard.trace.end_step(i)
end
check(C.sh_mem_reset_peak(0))
local stats = ffi.new("sh_mem_stats")
check(C.sh_mem_stats_get(0, stats))
local system_allocs = stats.n_system_alloc
local ms = elapsed_ms(function()
  for i = 1, cfg.iters do
    step()
    if i < cfg.iters then last_loss:free() end
  end
end) / cfg.iters
local loss_value = last_loss:item()
last_loss:free()
check(C.sh_mem_stats_get(0, stats))
local peak_flops = matmul_peak()
local tps = cfg.batch_size * cfg.block_size / (ms / 1e3)
print(("loss %.4f"):format(loss_value))
print(("tokens_per_s %.1f"):format(tps))
print(("ms_per_iter %.3f"):format(ms))
print(("matmul_tflops %.1f"):format(peak_flops / 1e12))
print(("mfu %.4f"):format(tps * flops_per_token / peak_flops))
print(("peak_bytes %d"):format(tonumber(stats.peak)))
-- Blocks the caching allocator had to take from cudaMalloc during the timed steps: 0 once the
-- warm-up steps have filled its cache.
print(("cuda_mallocs_timed %d"):format(tonumber(stats.n_system_alloc - system_allocs)))
