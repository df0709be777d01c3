-- What the checkpoint-cost benchmarks share (bench/ckpt_save.lua, bench/snapshot.lua; loaded
-- with dofile, not a benchmark itself): T.setup(cfg, env) gives the GPT they train from cfg
-- (n_layer, n_head, n_embd, block_size, vocab_size, strategy: "none" or an FSDP strategy), its
-- AdamW, and a fixed batch of token ids for this rank's share of cfg.batch_size.
local shard = require("shard")
local nn = shard.nn

local T = {}

local function build(cfg)
  local make = function() shard.manual_seed(1); return nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.block_size, vocab_size = cfg.vocab_size, dropout = 0, bias = false } end
  if cfg.strategy == "none" then return make() end
  return shard.fsdp.wrap(make, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = cfg.strategy })
end

local function batch(cfg, env)
  local rows = {}
  for b = 1, cfg.batch_size / env.world do
    rows[b] = {}
    for t = 1, cfg.block_size do rows[b][t] = (b * 31 + t * 7) % cfg.vocab_size end
  end
  return shard.tensor(rows, { dtype = "i64" })
end

function T.setup(cfg, env)
  local model = build(cfg)
  return model, shard.optim.AdamW(model, { lr = 1e-3 }), batch(cfg, env)
end

return T
