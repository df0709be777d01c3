-- GPT-2 sizes on one GPU: bench/gpt2_124m.lua (bf16 mixed precision, FSDP full_shard at world
-- 1, AdamW, random tokens) at 124M, 350M, 774M and 1.5B parameters and two batch sizes:
-- tokens/s, MFU, step time and peak memory beside shard estimate's prediction.
--   shard sweep recipes/sweeps/gpt2_gpu.lua
-- A size that does not fit is recorded with its out-of-memory error and the sweep goes on.
local SIZES = {   -- GPT-2's configurations (vocab padded to 50304, T 1024)
  { n_layer = 12, n_head = 12, n_embd = 768 },    -- 124M
  { n_layer = 24, n_head = 16, n_embd = 1024 },   -- 350M
  { n_layer = 36, n_head = 20, n_embd = 1280 },   -- 774M
  { n_layer = 48, n_head = 25, n_embd = 1600 },   -- 1558M
}
local points = {}
for _, size in ipairs(SIZES) do
  for _, batch in ipairs { 4, 8 } do
    points[#points + 1] = { n_layer = size.n_layer, n_head = size.n_head, n_embd = size.n_embd, batch_size = batch }
  end
end

return {
  name = "gpt2_gpu",
  bench = "gpt2_124m",
  settings = { iters = 10, warmup = 3 },
  points = points,
  timeout = 600,
  metrics = { "tokens_per_s", "mfu", "ms_per_iter", "peak_bytes", "loss" },
  estimate = function(p)
    return { n_layer = p.n_layer, n_head = p.n_head, n_embd = p.n_embd, vocab_size = 50304, block_size = 1024,
             bias = true, world = 1, strategy = "full_shard", batch_size = p.batch_size, param = "bf16" }
  end,
  plots = {
    { x = "batch_size", y = "tokens_per_s", by = "n_embd", file = "tokens_per_s.png",
      title = "GPT-2 sizes on one GPU: tokens/s against batch (series: n_embd)" },
    { x = "batch_size", y = "peak_bytes", by = "n_embd", estimate = true, file = "peak_memory.png",
      title = "peak memory (solid: measured, dashed: shard estimate)" },
  },
}
