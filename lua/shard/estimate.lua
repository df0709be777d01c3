-- shard estimate: per-rank memory of a GPT under an FSDP strategy, before running it.
--   shard estimate --n_layer=12 --n_head=12 --n_embd=768 --vocab_size=50304 --block_size=1024
--                  --world=8 --strategy=full_shard --batch_size=8 --param=bf16
-- Parameters, gradients and AdamW state come from the model's exact parameter shapes and the
-- FlatParameter layout (units from the transformer policy, padding to the group size); the
-- model is built under deferred init, so nothing is allocated for it. Activation memory is
-- measured, not modelled: one forward and backward of a 1-block and a 2-block model at the
-- given width, batch and sequence length on this CPU gives the per-block and fixed parts.
local shard = require "shard"
local config = require "shard.config"
local Module = require "shard.nn.module"
local nn = shard.nn

local M = {}

local MiB = 1024 * 1024
local function mib(b) return ("%10.1f MiB"):format(b / MiB) end

local function gpt_units(cfg)
  local model = Module.deferred(nn.GPT, cfg)
  local units, root = {}, 0
  local seen = {}
  for _, c in ipairs(model.transformer.h._children) do
    local n = 0
    for _, t in ipairs(c.module:parameters()) do n = n + t:numel(); seen[t] = true end
    units[#units + 1] = n
  end
  for _, t in ipairs(model:parameters()) do if not seen[t] then root = root + t:numel() end end
  table.insert(units, 1, root)
  return units
end

-- Peak bytes of one forward + backward at this width with n_layer blocks, less the
-- parameters' gradients (counted separately above).
local function step_peak(cfg, n_layer, batch)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.n_layer = n_layer
  shard.manual_seed(1)
  local model = nn.GPT(c)
  local x = shard.zeros({ batch, c.block_size }, { dtype = "i64" })
  shard.memory.reset_peak()
  local base = shard.memory.stats().allocated
  local loss = model(x, x)
  loss:backward()
  local peak = shard.memory.stats().peak - base - 4 * model:num_params()
  loss:free(); x:free()
  for _, t in ipairs(model:parameters()) do t:free() end
  return peak
end

function M.estimate(o)
  local cfg = { n_layer = o.n_layer, n_head = o.n_head, n_embd = o.n_embd, vocab_size = o.vocab_size,
                block_size = o.block_size, bias = o.bias, dropout = 0 }
  local strategy = shard.fsdp.STRATEGIES[o.strategy]
  if not strategy then error("estimate: unknown strategy " .. tostring(o.strategy), 0) end
  local N = o.world
  local shard_n = strategy.shard and (strategy.hybrid and (o.hybrid_group > 0 and o.hybrid_group or N) or N) or 1
  local pbytes = ({ f32 = 4, bf16 = 2, f16 = 2 })[o.param]
  if not pbytes then error("estimate: --param must be f32, bf16 or f16", 0) end
  local units = gpt_units(cfg)
  local P, padded, largest = 0, 0, { 0, 0 }
  for _, n in ipairs(units) do
    P = P + n
    padded = padded + math.ceil(n / shard_n) * shard_n
    if n > largest[1] then largest = { n, largest[1] } elseif n > largest[2] then largest[2] = n end
  end
  local per_rank = padded / shard_n
  local r = {
    params = P, units = #units,
    master = 4 * per_rank, grads = 4 * per_rank, adamw = 8 * per_rank,
  }
  -- full buffers alive at once: the unit computing and the one prefetched (full_shard), or
  -- every unit from forward to backward (shard_grad_op), or none beyond the shard (no_shard)
  if not strategy.shard then r.gathered = (pbytes == 4) and 0 or pbytes * padded
  elseif strategy.reshard_after_forward then r.gathered = pbytes * (largest[1] + largest[2])
  else r.gathered = pbytes * padded end
  r.flat_grad = 4 * largest[1] * (strategy.shard and 2 or 1)   -- a unit's flat grad and its reduced shard
  local one, two = step_peak(cfg, 1, o.batch_size), step_peak(cfg, 2, o.batch_size)
  r.act_per_block, r.act_fixed = two - one, one - (two - one)
  r.activations = r.act_fixed + r.act_per_block * o.n_layer
  r.total = r.master + r.grads + r.adamw + r.gathered + r.flat_grad + r.activations
  return r
end

function M.main(args)
  config.set_overrides(config.parse_args(args))
  local o = config{ n_layer = 12, n_head = 12, n_embd = 768, vocab_size = 50304, block_size = 1024, bias = true,
                    world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 1, param = "f32" }
  local r = M.estimate(o)
  print(("GPT %d layers, n_embd %d, vocab %d, T %d: %.1fM parameters in %d units"):format(
    o.n_layer, o.n_embd, o.vocab_size, o.block_size, r.params / 1e6, r.units))
  print(("per rank, %s over %d ranks, batch %d per rank, %s compute parameters:"):format(o.strategy, o.world, o.batch_size, o.param))
  print("  master parameters (f32)  " .. mib(r.master))
  print("  gradients (f32)          " .. mib(r.grads))
  print("  AdamW state (f32 m, v)   " .. mib(r.adamw))
  print("  gathered parameters      " .. mib(r.gathered))
  print("  flat gradient buffers    " .. mib(r.flat_grad))
  print(("  activations              %s  (measured: %.1f MiB per block + %.1f MiB)"):format(mib(r.activations),
    r.act_per_block / MiB, r.act_fixed / MiB))
  print("  estimated peak           " .. mib(r.total))
  return 0
end

return M
