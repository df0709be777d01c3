-- shard.fsdp.unit: the FSDP unit, a module wrapped with the FlatParameter over its parameters
-- (a strategy says how it is sharded), and what it does to its gather state: unshard,
-- prefetch, reshard. The schedule that drives it is fsdp/schedule.lua; its optimizer entries
-- and clipping, fsdp/grads.lua and fsdp/clip.lua; wrap builds the units (fsdp/wrap.lua).
local Module = require("shard.nn.module")
local flatparam = require("shard.flatparam")
local mesh = require("shard.fsdp.mesh")
local determ = require("shard.fsdp.determ")

local M = {}

local STRATEGIES = {
  full_shard = { shard = true, reshard_after_forward = true },
  shard_grad_op = { shard = true, reshard_after_forward = false },
  no_shard = { shard = false, reshard_after_forward = false },
  hybrid_shard = { shard = true, reshard_after_forward = true, hybrid = true },
  hybrid_shard_zero2 = { shard = true, reshard_after_forward = false, hybrid = true },
}
M.STRATEGIES = STRATEGIES

---------------------------------------------------------------------------------------------
-- the unit

local Unit = Module:extend("FSDPUnit")
M.Unit = Unit
-- A wrapped root has its own metatable, so units are told by a field, not the metatable.
local function is_unit(m) return rawget(m, "fsdp_unit") == true end
M.is_unit = is_unit

-- Parameters the module holds outside any unit below it, in registration order (tied ones
-- appear once per holder; the FlatParameter stores a repeated tensor once), and those a unit
-- below left to its ancestors because one of their users lies outside it.
local function own_params(module, out)
  out = out or {}
  for _, p in ipairs(module._params) do
    out[#out + 1] = p.tensor
  end
  for _, c in ipairs(module:named_children()) do
    if not is_unit(c.module) then own_params(c.module, out)
    else for _, t in ipairs(c.module.left or {}) do out[#out + 1] = t end end
  end
  return out
end
M.own_params = own_params

-- CPU offload (wrap's offload = { params = true }; runtime/dist/flatparam.h): the unit's shard and
-- sharded grad move to pinned host memory and its optimizer entries step on the CPU. A
-- sharding strategy only; on the CPU there is nothing to move: noted once per process on
-- rank 0.
local function offload_unit(u)
  local label = u.name == "" and "(root)" or u.name
  if not u.mode.shard then
    error(("fsdp: unit %s: offload = { params = true } needs a sharding strategy (full_shard, shard_grad_op, " ..
           "hybrid_shard, hybrid_shard_zero2); %s keeps the full parameters on every rank, which offload " ..
           "would copy to the device twice a step"):format(label, u.strategy), 0)
  end
  local ok, moved = pcall(u.fp.set_offload, u.fp)
  if not ok then error(("fsdp: unit %s: %s"):format(label, tostring(moved)), 0) end
  u.offload = moved
  local fsdp = require("shard.fsdp")    -- the note is the public table's (a test clears it)
  if not moved and not fsdp.offload_noted then
    fsdp.offload_noted = true
    if mesh.world():rank() == 0 then
      io.stderr:write("fsdp: offload = { params = true } on the CPU backend: the parameters already live in host memory; nothing to move\n")
    end
  end
end

-- ignored_params / ignored_modules (wrap options) stay out of every FlatParameter.
local function without_ignored(params, ignored)
  if not ignored then return params end
  local out = {}
  for _, t in ipairs(params) do if not ignored[t] then out[#out + 1] = t end end
  return out
end

-- Frozen and trainable parameters in one unit (LoRA-style) go to two FlatParameters: the
-- frozen ones' (a companion unit, `frozen_part`) is gathered and resharded with the unit's and
-- never reduced, so no frozen gradient is computed (the backward formulas skip inputs that do
-- not require grad) nor sent (a shared flat buffer would reduce-scatter their zeros).
local function split_frozen(params)
  local trainable, frozen = {}, {}
  for _, t in ipairs(params) do
    if t.p.requires_grad ~= 0 then trainable[#trainable + 1] = t else frozen[#frozen + 1] = t end
  end
  return trainable, frozen
end

-- Stands the unit where its module stood: fields the unit does not have come from the module.
local function stand_in(self, module)
  local mt = {}
  for k, v in pairs(getmetatable(self)) do mt[k] = v end
  mt.__index = function(_, k) local v = Unit[k]; if v ~= nil then return v end; return module[k] end
  setmetatable(self, mt)
end

-- The unit's strategy (opts.strategy_for, else opts.strategy, else full_shard) and its mode.
local function strategy_of(module, name, opts)
  local strategy = opts.strategy_for and opts.strategy_for(module, name) or opts.strategy or "full_shard"
  local mode = STRATEGIES[strategy]
  if not mode then
    local known = {}
    for k in pairs(STRATEGIES) do known[#known + 1] = k end
    table.sort(known)
    error(("fsdp: unknown strategy '%s' for unit %s (known: %s)"):format(tostring(strategy), name, table.concat(known, ", ")), 0)
  end
  return strategy, mode
end

-- The groups the unit shards over and all-reduces across: the world and none, or under
-- hybrid sharding its shard and replicate groups (no replicate group with one replica, as
-- on one node: the all-reduce across replicas would be a copy).
local function groups_of(mode, opts)
  if not mode.hybrid then return mesh.world(), nil end
  local m = mesh.hybrid_mesh(opts.hybrid_group or "node")
  local replicate = m.replicate
  if replicate and replicate:size() == 1 then replicate = nil end
  return m.shard, replicate
end

-- The FlatParameter over the unit's parameters, in opts.mixed_precision's dtypes.
local function make_flatparam(self, opts)
  local mp = opts.mixed_precision or {}
  -- Gradients are reduced in f32 unless `reduce` says otherwise, even when the parameters
  -- compute in bf16/f16: a sum over N ranks in bf16 loses bits as N grows (each partial sum
  -- is rounded to 8 bits of mantissa), which is how low-precision reductions drift at scale.
  local reduce = mp.reduce or (mp.param and "f32") or nil
  -- deterministic mode: whole norm blocks per shard (fsdp/determ.lua)
  local fp, err = flatparam.create(self.params, { group = self.group, param = mp.param, reduce = reduce,
                                                  no_shard = not self.mode.shard,
                                                  align = opts.deterministic and determ.BLOCK or 1 })
  if not fp then error(("fsdp: unit %s: %s"):format(self.name == "" and "(root)" or self.name, err), 0) end
  return fp
end

function Unit:init(module, name, opts, root, params, left)
  self.fsdp_unit = true
  self.left = left
  self:child("module", module)
  stand_in(self, module)
  self.name, self.opts, self.root = name, opts, root or self
  self.strategy, self.mode = strategy_of(module, name, opts)
  self.group, self.replicate = groups_of(self.mode, opts)
  self.params = without_ignored(params or own_params(module), opts.ignored_set)
  self.info = { numel = 0, padded_numel = 0, shard_numel = 0, padding = 0 }
  if #self.params == 0 then return end    -- a root whose children hold everything: hooks only
  local trainable, frozen = split_frozen(self.params)
  self.trainable = #trainable > 0
  if self.trainable and #frozen > 0 then
    self.params = trainable
    self.frozen_part = Unit(module, name .. " (frozen)", opts, root, frozen)
  end
  self.fp = make_flatparam(self, opts)
  if opts.offload and opts.offload.params then offload_unit(self) end
  local i = self.fp:info()
  self.info = { numel = i.numel, padded_numel = i.padded_numel, shard_numel = i.shard_numel, padding = i.padding }
end

function Unit:numel() return self.info.numel end

-- The gather state is the FlatParameter's (fp:state()); these only say what the schedule
-- wants. unshard waits for a prefetch or gathers now; prefetch starts a gather unless one
-- is started or done; reshard frees the full parameters of a sharded unit, or a prefetch
-- (under offload the optimizer prefetches the next step's first units: a checkpoint loaded
-- after it reshards every unit, so that the next forward gathers the loaded shards).
function Unit:unshard()
  if self.fp then self.fp:unshard() end
  if self.frozen_part then self.frozen_part:unshard() end
end
function Unit:prefetch()
  if self.fp then self.fp:unshard_start() end
  if self.frozen_part then self.frozen_part:prefetch() end
end
function Unit:reshard()
  if self.fp and (self.mode.shard or self:casts()) and self.fp:state() ~= "sharded" then self.fp:reshard() end
  if self.frozen_part then self.frozen_part:reshard() end
end

-- Under no_shard the full parameters are the shard itself, or, in mixed precision, a copy in
-- the compute dtype: that copy must go after the backward, so that the next forward casts the
-- master weights the optimizer has updated since.
function Unit:casts()
  local i = self.fp:info()
  return i.param_dtype ~= i.master_dtype
end

function Unit:named_parameters(prefix, out, seen) return self.module:named_parameters(prefix, out, seen) end

return M
