-- shard.save / shard.load: a model's full state dict (Hugging Face names for GPT) as one
-- safetensors file. Under FSDP every rank takes part (the f32 master shards are all-gathered,
-- so mixed precision loses nothing) and rank 0 writes, atomically; loading copies into each
-- rank just the slice of the FlatParameter it owns, so a checkpoint written at one world size
-- loads at any other.
local tensor = require "shard.tensor"
local safetensors = require "shard.io.safetensors"

local M = {}

local function is_fsdp(model) return model.all_units ~= nil end

-- Calls fn(unit, i, param, slot, name) for every stored (untied) parameter of an FSDP model
-- (slot: shard.flatparam's FlatParam:slot).
local function each_slot(model, fn)
  for _, u in ipairs(model.all_units) do
    if u.fp then
      for i, t in ipairs(u.params) do
        local slot = u.fp:slot(i)
        if not slot.tied_to then fn(u, i, t, slot, model.names[t]) end
      end
    end
  end
end

-- name -> CPU f32 tensor of the full value.
function M.state_dict(model)
  local out = {}
  if not is_fsdp(model) then
    for _, np in ipairs(model:named_parameters()) do out[np.name] = np.tensor:to{ dtype = "f32", device = "cpu" } end
    return out
  end
  local gathered = {}
  each_slot(model, function(u, i, t, slot, name)
    local full = gathered[u]
    if not full then
      local shard = u.fp:shard()
      if u.mode.shard then
        full = tensor.empty({ u.info.padded_numel }, { dtype = shard:dtype(), device = shard:device() })
        u.group:all_gather(full, shard)
        shard:free()
      else
        full = shard
      end
      gathered[u] = full
    end
    local part = full:narrow(1, slot.offset + 1, slot.numel)
    local value = part:reshape(t:shape())
    out[name] = value:to{ dtype = "f32", device = "cpu" }
    part:free(); value:free()
  end)
  for _, full in pairs(gathered) do full:free() end
  return out
end

-- Every rank calls it; rank 0 writes (shard.init's env, when there is one, says the rank).
function M.save(model, path, metadata)
  local dict = M.state_dict(model)
  local env = rawget(require("shard"), "env")
  if not env or env.rank == 0 then safetensors.save(path, dict, metadata) end
  for _, t in pairs(dict) do t:free() end
  if env then env.barrier() end     -- every rank returns once the file is complete
end

-- Loads path into model; every parameter must be there with its shape, and (unless
-- opts.strict == false) the file may hold nothing else.
function M.load(model, path, opts)
  local dict = safetensors.load(path)
  local used = {}
  local function value_for(name, t)
    local v = dict[name]
    if not v then error(("load: %s has no tensor '%s'"):format(path, name), 3) end
    local a, b = table.concat(v:shape(), "x"), table.concat(t:shape(), "x")
    if a ~= b then error(("load: %s: '%s' is %s in the file but %s in the model"):format(path, name, a, b), 3) end
    used[name] = true
    return v
  end
  if is_fsdp(model) then
    each_slot(model, function(u, i, t, slot, name)
      u.fp:init_param(i, value_for(name, t))
    end)
    for _, u in ipairs(model.all_units) do u:reshard() end    -- full buffers are stale now
  else
    for _, np in ipairs(model:named_parameters()) do np.tensor:copy_(value_for(np.name, np.tensor)) end
  end
  if not (opts and opts.strict == false) then
    local extra = {}
    for name in pairs(dict) do if not used[name] then extra[#extra + 1] = name end end
    table.sort(extra)
    if #extra > 0 then error(("load: %s holds tensors the model lacks: %s"):format(path, table.concat(extra, ", ")), 2) end
  end
  for _, t in pairs(dict) do t:free() end
end

return M
