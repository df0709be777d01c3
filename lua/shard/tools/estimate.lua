-- shard estimate: per-rank memory of a GPT under an FSDP strategy, before running it.
-- (shard estimate --dry-run ... RECIPE runs a recipe itself as one of N ranks: shard.tools.dryrun.)
--   shard estimate --n_layer=12 --n_head=12 --n_embd=768 --vocab_size=50304 --block_size=1024
--                  --world=8 --strategy=full_shard --batch_size=8 --param=bf16
--   shard estimate --model=llama --n_layer=32 --n_head=32 --n_kv_head=8 --n_embd=4096
--                  --ffn_dim=14336 --vocab_size=128256 --block_size=8192 --world=8   (Llama 3 8B)
-- (for --model=llama, --n_embd is the width `dim`, --block_size max_seq_len; --n_kv_head=0
-- means n_head and --ffn_dim=0 Meta's size from --multiple_of).
-- Parameters, gradients and AdamW state come from the model's exact parameter shapes and the
-- FlatParameter layout (units from the transformer policy, padding to the group size); the
-- model is built under deferred init, so nothing is allocated for it. Activation memory is
-- measured, not modelled: one forward and backward of a 1-block and a 2-block model at the
-- given width, batch and sequence length, with parameters in the --param dtype, on this CPU
-- gives the per-block and fixed parts. Both are linear in the batch (GPT-2 small: 57.1,
-- 114.1, 228.3 MiB per block at batch 1, 2, 4). Against measured peaks: README.
local shard = require("shard")
local config = require("shard.config")
local Module = require("shard.nn.module")
local nn = shard.nn

local M = {}

local units = require("shard.units")
local rt = require("shard.ffi")

-- A FlatParameter of n elements over a group of group_size ranks: its padded size, by the
-- runtime's own rule (flatparam.h's sh_flatparam_padded_numel), so the estimate lays units out
-- as shard.flatparam does.
function M.padded_numel(n, group_size)
  return tonumber(rt.C.sh_flatparam_padded_numel(n, group_size))
end

-- The model kinds: the nn class, its config from the options, and the list of its blocks
-- (one FSDP unit each under the transformer policy; the rest is the root unit).
local MODELS = {
  gpt = {
    class = function() return nn.GPT end,
    config = function(o)
      return { n_layer = o.n_layer, n_head = o.n_head, n_embd = o.n_embd, vocab_size = o.vocab_size,
               block_size = o.block_size, bias = o.bias, dropout = 0 }
    end,
    blocks = function(model) return model.transformer.h end,
  },
  llama = {
    class = function() return nn.Llama end,
    config = function(o)
      return { n_layer = o.n_layer, n_head = o.n_head, n_kv_head = o.n_kv_head > 0 and o.n_kv_head or o.n_head,
               dim = o.n_embd, ffn_dim = o.ffn_dim > 0 and o.ffn_dim or nil, multiple_of = o.multiple_of,
               vocab_size = o.vocab_size, max_seq_len = o.block_size, tie_embeddings = o.tie_embeddings }
    end,
    blocks = function(model) return model.model.layers end,
  },
}

-- The per-unit parameter counts, root first, of the model built under deferred init.
local function model_units(kind, cfg)
  local model = Module.deferred(kind.class(), cfg)
  local units, root = {}, 0
  local seen = {}
  for _, c in ipairs(kind.blocks(model):named_children()) do
    local n = 0
    for _, t in ipairs(c.module:parameters()) do n = n + t:numel(); seen[t] = true end
    units[#units + 1] = n
  end
  for _, t in ipairs(model:parameters()) do if not seen[t] then root = root + t:numel() end end
  table.insert(units, 1, root)
  return units
end

-- The model's parameters as `dtype` copies (what a mixed-precision step computes with: FSDP
-- gathers bf16 parameters, so every activation is bf16 too); shared ones (lm_head's weight
-- is wte's) stay shared.
local function cast_params(model, dtype)
  local map = {}
  local function walk(m)
    for _, e in ipairs(m._params) do
      local t = map[e.tensor]
      if not t then
        t = e.tensor:to(dtype)
        t.requires_grad = true
        map[e.tensor] = t
        e.tensor:free()
      end
      e.tensor = t
      m[e.name] = t
    end
    for _, c in ipairs(m:named_children()) do walk(c.module) end
  end
  walk(model)
  if model.lm_head then model.lm_head.weight = map[model.lm_head.weight] or model.lm_head.weight end
end

-- Peak bytes of one forward + backward at this width with n_layer blocks and parameters in
-- `dtype`, beyond the parameters and their gradients (counted separately above). The
-- gradients are allocated before the step, so they are in the baseline whatever the moment
-- of the peak. (Subtracting 4 x all parameters from the peak instead, as before, took off
-- gradients that did not exist yet: the peak comes at the head's backward, before any
-- block's gradient, so each block's 27 MiB of GPT-2 gradients was subtracted from its
-- activations, and the per-block figure came out as 57 B - 27 MiB, not linear in B.)
local function step_peak(kind, cfg, n_layer, batch, seq, dtype, device)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.n_layer = n_layer
  shard.manual_seed(1)
  local tensor = require("shard.tensor")
  local default = tensor.default_device
  tensor.default_device = device          -- the model, its grads and the input live there
  local ok, peak = pcall(function()
    local model = kind.class()(c)
    if dtype ~= "f32" then cast_params(model, dtype) end
    for _, t in ipairs(model:parameters()) do
      local g = shard.zeros(t:shape(), { dtype = t:dtype() })
      t.grad = g
      g:free()
    end
    local x = shard.zeros({ batch, seq }, { dtype = "i64" })
    -- the collector would free earlier garbage at a moment of its choosing, inside or outside
    -- the measured step: collect first, then hold it off for the step
    collectgarbage()
    collectgarbage("stop")
    shard.memory.reset_peak(device)
    local base = shard.memory.stats(device).allocated
    local loss = model(x, x)
    loss:backward()
    local measured = shard.memory.stats(device).peak - base
    collectgarbage("restart")
    loss:free(); x:free()
    for _, t in ipairs(model:parameters()) do t:free() end
    return measured
  end)
  tensor.default_device = default
  collectgarbage("restart")
  if not ok then error(peak, 0) end
  return peak
end

-- The options, checked: a bad one is named instead of giving nan, a negative size or an
-- error from deep inside the measuring step.
local function whole(o, name, least)
  local v = o[name]
  if type(v) ~= "number" or v ~= math.floor(v) or v < least then
    error(("estimate: --%s must be a whole number >= %d, got %s"):format(name, least, tostring(v)), 0)
  end
end
local function check_options(o)
  for _, name in ipairs { "n_layer", "n_head", "n_embd", "vocab_size", "block_size", "world", "batch_size" } do
    whole(o, name, 1)
  end
  whole(o, "hybrid_group", 0)
  o.model = o.model or "gpt"
  if not MODELS[o.model] then error(("estimate: unknown model %s (expected gpt or llama)"):format(tostring(o.model)), 0) end
  if o.model == "llama" then
    whole(o, "n_kv_head", 0); whole(o, "ffn_dim", 0); whole(o, "multiple_of", 1)
    local kv = o.n_kv_head > 0 and o.n_kv_head or o.n_head
    if o.n_head % kv ~= 0 then error(("estimate: --n_kv_head=%d does not divide --n_head=%d"):format(kv, o.n_head), 0) end
  end
  if o.n_embd % o.n_head ~= 0 then
    error(("estimate: --n_embd=%d is not a multiple of --n_head=%d"):format(o.n_embd, o.n_head), 0)
  end
  local strategy = shard.fsdp.STRATEGIES[o.strategy]
  if not strategy then
    local names = {}
    for k in pairs(shard.fsdp.STRATEGIES) do names[#names + 1] = k end
    table.sort(names)
    error(("estimate: unknown strategy %s (expected one of %s)"):format(tostring(o.strategy), table.concat(names, ", ")), 0)
  end
  if o.hybrid_group > 0 then
    if not strategy.hybrid then
      error(("estimate: --hybrid_group applies to hybrid_shard and hybrid_shard_zero2, not %s"):format(o.strategy), 0)
    end
    if o.world % o.hybrid_group ~= 0 then
      error(("estimate: --world=%d is not a multiple of --hybrid_group=%d"):format(o.world, o.hybrid_group), 0)
    end
  end
  if not ({ f32 = true, bf16 = true, f16 = true })[o.param] then
    error("estimate: --param must be f32, bf16 or f16, got " .. tostring(o.param), 0)
  end
  return strategy
end

-- --offload (fsdp.wrap's offload = { params = true }): the master shards, their gradients and
-- AdamW's state live in host memory, with, under mixed precision, a copy of the shards in the
-- compute dtype (what is copied to the device); the device keeps the gathered parameters, the
-- flat gradients and the activations. r.total is then the device's peak and r.host the host's.
local function offload_split(r, o)
  local strategy = check_options(o)
  if not strategy.shard then
    error(("estimate: --offload needs a sharding strategy (full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2), not %s"):format(o.strategy), 0)
  end
  local pbytes = ({ f32 = 4, bf16 = 2, f16 = 2 })[o.param]
  r.host_cast = pbytes == 4 and 0 or r.master / 4 * pbytes
  r.host = r.master + r.grads + r.adamw + r.host_cast
  r.total = r.gathered + r.flat_grad + r.activations
end

-- The state part (no step is run): parameter count, units and the per-rank bytes of master
-- parameters, gradients, AdamW state, gathered parameters and flat gradient buffers.
function M.state(o)
  local strategy = check_options(o)
  local kind = MODELS[o.model]
  local cfg = kind.config(o)
  local N = o.world
  local shard_n = strategy.shard and (strategy.hybrid and (o.hybrid_group > 0 and o.hybrid_group or N) or N) or 1
  local pbytes = ({ f32 = 4, bf16 = 2, f16 = 2 })[o.param]
  local units = model_units(kind, cfg)
  local P, padded, largest = 0, 0, { 0, 0 }
  for _, n in ipairs(units) do
    P = P + n
    padded = padded + M.padded_numel(n, shard_n)
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
  r.flat_grad = pbytes * largest[1] * (strategy.shard and 2 or 1)   -- a unit's flat grad and its reduced shard, in the compute dtype (reduced in it, as mixed precision does by default)
  return r, kind, cfg
end

-- progress (optional): called with each measured step's description before it runs, and
-- again with its description and seconds after (shard estimate shows them on stderr: on the
-- CPU a GPT-2-sized step takes seconds).
function M.estimate(o, progress)
  local r, kind, cfg = M.state(o)
  local device = o.measure or "cpu"
  if device ~= "cpu" and device ~= "meta" then
    error(("estimate: --measure must be cpu (run a step here) or meta (count the same step's allocations without computing it), got %s"):format(tostring(device)), 0)
  end
  local function measure(n_layer)
    local what = ("one step of %s on %s (batch %d, T %d, %s)"):format(units.plural(n_layer, "block"), device,
      o.batch_size, o.block_size, o.param)
    if progress then progress(what) end
    local t0 = require("shard.timer").now()
    local peak = step_peak(kind, cfg, n_layer, o.batch_size, o.block_size, o.param, device)
    if progress then progress(what, require("shard.timer").now() - t0) end
    return peak
  end
  local one, two = measure(1), measure(2)
  r.act_per_block, r.act_fixed = two - one, one - (two - one)
  r.activations = r.act_fixed + r.act_per_block * o.n_layer
  r.total = r.master + r.grads + r.adamw + r.gathered + r.flat_grad + r.activations
  r.host = 0
  if o.offload then offload_split(r, o) end
  return r
end

local USAGE = [[usage: shard estimate [--key=value ...]
       shard estimate --dry-run [--world=N --rank=R --local_size=L --steps=S --verbose --json] RECIPE [--key=value ...]
                      (the recipe itself as one rank of N, no data: shard estimate --dry-run --help)]]
local ABOUT = "Per-rank memory of a GPT or Llama under an FSDP strategy, before running it: parameters, gradients and\n"
  .. "AdamW state from the model's exact shapes, activations measured on --measure (cpu: one step run here;\n"
  .. "meta: the same step's allocations counted, nothing computed)."
local SPEC = {
  model = { oneof = { "gpt", "llama" } }, param = { oneof = { "f32", "bf16", "f16" } }, measure = { oneof = { "cpu", "meta" } },
  world = { min = 1 }, batch_size = { help = "per rank" }, n_embd = { help = "Llama: dim" },
  block_size = { help = "Llama: max_seq_len" },
  n_kv_head = { help = "0: n_head" }, ffn_dim = { help = "0: Meta's size from --multiple_of" },
  hybrid_group = { help = "ranks per shard group of hybrid strategies; 0: all of --world" },
}

-- A line on stderr per measured step, its time when done: the report waits for both.
local function show_progress(what, seconds)
  if seconds then io.stderr:write(("estimate: %s took %s\n"):format(what, units.time(seconds)))
  else io.stderr:write(("estimate: measuring %s ...\n"):format(what)) end
  io.stderr:flush()
end

-- The figures of M.estimate for a person (shard.units), in aligned columns.
function M.report(o, r)
  local host = o.offload and "in host memory" or ""
  local rows = {
    { "master parameters (f32)", units.bytes(r.master), host },
    { "gradients (f32)", units.bytes(r.grads), host },
    { "AdamW state (f32 m, v)", units.bytes(r.adamw), host },
    { "gathered parameters", units.bytes(r.gathered) },
    { "flat gradient buffers", units.bytes(r.flat_grad) },
  }
  if o.offload and r.host_cast > 0 then rows[#rows + 1] = { o.param .. " copy of the shards", units.bytes(r.host_cast), host } end
  rows[#rows + 1] = { "activations", units.bytes(r.activations), ("measured on %s: %s per block + %s"):format(o.measure,
    units.bytes(r.act_per_block), units.bytes(r.act_fixed)) }
  rows[#rows + 1] = { o.offload and "estimated device peak" or "estimated peak", units.bytes(r.total) }
  if o.offload then rows[#rows + 1] = { "host memory", units.bytes(r.host) } end
  return table.concat({
    ("%s %d layers, n_embd %d, vocab %s, T %d: %.1fM parameters in %s"):format(o.model == "llama" and "Llama" or "GPT",
      o.n_layer, o.n_embd, units.count(o.vocab_size), o.block_size, r.params / 1e6, units.plural(r.units, "unit")),
    ("per rank, %s over %s, batch %d per rank, %s compute parameters:"):format(o.strategy, units.plural(o.world, "rank"),
      o.batch_size, o.param),
    units.columns(rows, { indent = "  ", align = { "l", "r", "l" } }),
  }, "\n")
end

function M.main(args)
  for i, a in ipairs(args) do
    if a == "--dry-run" then   -- the recipe itself, run as one rank of --world (shard.tools.dryrun)
      local rest = { unpack(args, 1, i - 1) }
      for j = i + 1, #args do rest[#rest + 1] = args[j] end
      return require("shard.tools.dryrun").main(rest)
    end
  end
  config.set_overrides(config.parse_args(args))
  config.describe(USAGE, ABOUT)
  local o = config({ n_layer = 12, n_head = 12, n_embd = 768, vocab_size = 50304, block_size = 1024, bias = true,
                    world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 1, param = "f32",
                    model = "gpt", n_kv_head = 0, ffn_dim = 0, multiple_of = 256, tie_embeddings = false,
                    offload = false, measure = "cpu" }, SPEC)
  local r = M.estimate(o, show_progress)
  print(M.report(o, r))
  return 0
end

return M
