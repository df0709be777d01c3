-- Character-level GPT on Shakespeare: nanoGPT's shakespeare_char CPU configuration
-- (nanoGPT reports val loss 1.88 for it). Any text works with --data=PATH.
--   shard run recipes/gpt_shakespeare_char.lua [--max_iters=2000 ...]
--   shard launch --nproc 4 recipes/gpt_shakespeare_char.lua --strategy=full_shard
-- The loop, its settings (data, schedule, --strategy, checkpoints with --save_interval /
-- --resume, --grad_accum, the metrics file) and its progress line are shard.train's.
local shard = require("shard")
local nn = shard.nn

shard.train.run{
  defaults = { n_layer = 4, n_head = 4, n_embd = 128, dropout = 0.0, bias = false },
  spec = { n_embd = { help = "a multiple of n_head" }, dropout = { min = 0, below = 1 } },
  build = function(cfg, vocab_size)
    return nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.block_size,
                   vocab_size = vocab_size, dropout = cfg.dropout, bias = cfg.bias }
  end,
  block = nn.Block,
  -- the matmuls' 6 FLOPs per parameter per token (forward 2, backward 4) and attention's
  -- scores and weighted sums (PaLM's appendix B): what MFU counts, recomputation excluded
  flops_per_token = function(cfg, n_params)
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
  end,
}
