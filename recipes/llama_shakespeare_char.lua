-- Character-level Llama on Shakespeare: the GPT recipe's size, steps and schedule
-- (recipes/gpt_shakespeare_char.lua) with Llama's blocks: RMSNorm, rotary embeddings,
-- grouped-query attention (4 query heads sharing 2 k/v heads) and a SwiGLU MLP of 3 x dim,
-- which makes each block exactly as large as GPT's (196,864 parameters); no learned positions,
-- an untied head. Any text works with --data=PATH.
--   shard run recipes/llama_shakespeare_char.lua [--max_iters=2000 ...]
--   shard launch --nproc 4 recipes/llama_shakespeare_char.lua --strategy=full_shard
-- The loop and its settings are shard.train's (see the GPT recipe).
local shard = require("shard")
local nn = shard.nn

shard.train.run{
  defaults = { n_layer = 4, n_head = 4, n_kv_head = 2, dim = 128, ffn_dim = 384, rope_theta = 10000, norm_eps = 1e-5 },
  spec = { n_kv_head = { min = 1, help = "divides n_head" }, dim = { help = "a multiple of n_head" },
           ffn_dim = { min = 1 }, rope_theta = { above = 0 }, norm_eps = { above = 0 } },
  build = function(cfg, vocab_size)
    return nn.Llama{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_kv_head = cfg.n_kv_head, dim = cfg.dim,
                     ffn_dim = cfg.ffn_dim, vocab_size = vocab_size, max_seq_len = cfg.block_size,
                     rope_theta = cfg.rope_theta, norm_eps = cfg.norm_eps }
  end,
  block = nn.LlamaBlock,
  -- the matmuls' 6 FLOPs per parameter per token and attention's scores and weighted sums
  flops_per_token = function(cfg, n_params)
    return 6 * n_params + 12 * cfg.n_layer * cfg.dim * cfg.block_size
  end,
}
