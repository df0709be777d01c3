-- Every FSDP strategy at world 1-4 on the Shakespeare model (recipes/gpt_shakespeare_char.lua's
-- defaults: 4 layers, n_embd 128, block 64, global batch 12), on the CPU:
--   SHARD_DATA=DIR shard sweep recipes/sweeps/strategies.lua     (DIR holds tinyshakespeare.txt)
-- tokens/s is the median of the logged windows after the first (which holds warm-up); peak
-- memory the largest rank's allocator peak, beside shard estimate's prediction for the
-- same model, strategy and per-rank batch; bytes communicated are one rank's per training step.
-- On one node the hybrid strategies shard inside the node, so they run like their plain
-- counterparts (same bytes, same memory): they are here to show exactly that.
local STRATEGIES = { "none", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2" }
local BATCH = 12

return {
  name = "strategies",
  recipe = "recipes/gpt_shakespeare_char.lua",
  settings = { max_iters = 60, log_interval = 10, eval_interval = 1000, eval_iters = 2, sample_tokens = 0,
               batch_size = BATCH, device = "cpu", out_dir = "out/sweeps/strategies/run" },
  grid = { strategy = STRATEGIES, world = { 1, 2, 3, 4 } },
  order = { "strategy", "world" },
  skip = function(p) return p.strategy == "none" and p.world > 1 end,   -- one rank needs no strategy
  env = { OMP_NUM_THREADS = 1 },
  timeout = 300,
  metrics = { { "tokens_per_s", reduce = "median" }, "peak_bytes", "comm_bytes_per_step", "loss" },
  estimate = function(p)
    return { n_layer = 4, n_head = 4, n_embd = 128, vocab_size = 65, block_size = 64, bias = false,
             world = p.world, strategy = p.strategy == "none" and "no_shard" or p.strategy,
             batch_size = BATCH / p.world, param = "f32" }
  end,
  plots = {
    { x = "world", y = "tokens_per_s", by = "strategy", file = "tokens_per_s.png",
      title = "Shakespeare char GPT on the CPU: tokens/s against world size" },
    { x = "world", y = "peak_bytes", by = "strategy", estimate = true, file = "peak_memory.png",
      title = "peak memory per rank (solid: measured, dashed: shard estimate)" },
    { x = "world", y = "comm_bytes_per_step", by = "strategy", file = "comm_bytes.png",
      title = "bytes communicated per training step, per rank" },
  },
}
