-- shard.fsdp.state: what a model's parameters hold on this rank, read from outside FSDP
-- (checkpoints, the full state dict, Hugging Face import and export, tracing) without
-- touching a unit's fields. Every function takes a model fsdp.wrap returned or a plain module.
--   for _, sl in ipairs(fsdp.local_slices(model)) do ... sl:view() ... sl:set(full) end
--   local dict = fsdp.gather_full(model)   -- name -> CPU f32 tensor, every rank calls it
--   fsdp.mark_stale(model)                 -- after writing into the shards
--   fsdp.params_sha256(model)              -- a digest of the full parameters (every rank calls it)
local ffi = require("ffi")
local comm = require("shard.comm")
local tensor = require("shard.tensor")
local C = ffi.C

local S = {}

-- True for a model fsdp.wrap returned (its root unit).
function S.is_fsdp(model) return type(model) == "table" and rawget(model, "all_units") ~= nil end

-- True when a unit of the model keeps its shard in host memory (CPU offload took it).
function S.offloaded(model)
  if not S.is_fsdp(model) then return false end
  for _, u in ipairs(model.all_units) do
    if u.offload then return true end
  end
  return false
end

-- The one walk over what a unit's FlatParameter stores: fn(i, t, slot) for every parameter i
-- (tensor t) that is not a repeat of an earlier one (a tied tensor is stored once); slot is
-- shard.flatparam's FlatParam:slot(i). Nothing for a unit without a FlatParameter.
function S.each_stored(u, fn)
  local fp = u.fp
  if not fp then return end
  for i, t in ipairs(u.params) do
    local slot = fp:slot(i)
    if not slot.tied_to then fn(i, t, slot) end
  end
end

---------------------------------------------------------------------------------------------
-- slices

-- One parameter as this rank holds it:
--   name    the dotted name; tensor the parameter (its shape and dtype); shape
--   start, count   elements [start, start + count) of the flattened parameter are this rank's
--                  (count 0: none; a whole parameter is [0, numel))
--   dtype   what the rank stores them in (a FlatParameter's master dtype, else the tensor's)
--   whole   the rank holds the whole tensor itself (a plain model's parameter, or one
--           fsdp.wrap ignored): every rank holds the same value
--   owner   this rank is the one that writes the slice where several ranks hold it (hybrid
--           sharding, no_shard, whole parameters: the first replica, rank 0)
local Slice = {}
Slice.__index = Slice

-- A live 1-D alias of this rank's elements (in-place writes reach the parameter); the caller
-- frees it.
function Slice:view()
  if self._fp then return self._fp:shard_view(self._i) end
  local t = self.tensor
  return t:view({ t:numel() })
end

-- Copies this rank's elements from value, a full-size tensor of the parameter (any float
-- dtype). Under FSDP the full parameters stay stale until fsdp.mark_stale.
function Slice:set(value)
  if self._fp then self._fp:init_param(self._i, value) else self.tensor:copy_(value) end
end

local function whole_slice(name, t, rank)
  return setmetatable({ name = name, tensor = t, shape = t:shape(), start = 0, count = t:numel(), dtype = t:dtype(),
                        whole = true, owner = rank == 0 }, Slice)
end

-- This process's rank in the world (a plain model: shard.init's, or 0 without it).
local function world_rank(model)
  if S.is_fsdp(model) then return comm.world():rank() end
  local env = rawget(require("shard"), "env")
  return env and env.rank or 0
end

-- Every parameter of the model as this rank holds it (see Slice above), each once: an FSDP
-- model's in the order of its units and their FlatParameters (a slice for every stored
-- parameter, count 0 where this rank owns none of it), then the ignored ones; a plain
-- model's in named_parameters order. Every rank gets the same names in the same order.
function S.local_slices(model)
  local out, rank = {}, world_rank(model)
  if not S.is_fsdp(model) then
    for _, np in ipairs(model:named_parameters()) do out[#out + 1] = whole_slice(np.name, np.tensor, rank) end
    return out
  end
  for _, u in ipairs(model.all_units) do
    if u.fp then
      local owner = (u.replicate == nil or u.replicate:rank() == 0) and (u.mode.shard or u.group:rank() == 0)
      local dtype = u.fp:info().master_dtype
      S.each_stored(u, function(i, t, slot)
        out[#out + 1] = setmetatable({ name = model.names[t], tensor = t, shape = t:shape(), start = slot.own_start,
                                       count = slot.own_numel, dtype = dtype, owner = owner, _fp = u.fp, _i = i }, Slice)
      end)
    end
  end
  for _, t in ipairs(model.ignored or {}) do out[#out + 1] = whole_slice(model.names[t], t, rank) end
  return out
end

---------------------------------------------------------------------------------------------
-- the full state, and after writing into the shards

-- Unit u's full flat buffer on this rank: its master shard all-gathered over the shard group
-- (no_shard: the shard itself). The caller frees it.
local function full_flat(u)
  local shard = u.fp:shard()
  if not u.mode.shard then return shard end
  local full = tensor.empty({ u.info.padded_numel }, { dtype = shard:dtype(), device = shard:device() })
  u.group:all_gather(full, shard)
  shard:free()
  return full
end

-- name -> a CPU f32 tensor of the parameter's full value, for every parameter. Under FSDP
-- every rank calls it (each unit's f32 master shards are all-gathered, one unit at a time,
-- so mixed precision loses nothing) and every rank gets the whole dict.
function S.gather_full(model)
  local out = {}
  local function put(name, t) out[name] = t:to{ dtype = "f32", device = "cpu" } end
  if not S.is_fsdp(model) then
    for _, np in ipairs(model:named_parameters()) do put(np.name, np.tensor) end
    return out
  end
  for _, u in ipairs(model.all_units) do
    if u.fp then
      local full = full_flat(u)
      S.each_stored(u, function(_, t, slot)
        local part = full:narrow(1, slot.offset + 1, slot.numel)
        local value = part:reshape(t:shape())
        put(model.names[t], value)
        part:free(); value:free()
      end)
      full:free()
    end
  end
  for _, t in ipairs(model.ignored or {}) do put(model.names[t], t) end
  return out
end

-- The SHA-256 (hex) of the full parameters as f32: for each name in sorted order, the name,
-- a NUL byte and the values' bytes (little-endian f32, row-major). Equal digests mean equal
-- parameters, whatever the world size, strategy or padding; every rank calls it and gets it.
function S.params_sha256(model)
  local full = S.gather_full(model)
  local names = {}
  for name in pairs(full) do names[#names + 1] = name end
  table.sort(names)
  local st, digest = ffi.new("sh_sha256"), ffi.new("uint8_t[32]")
  C.sh_sha256_init(st)
  for _, name in ipairs(names) do
    local t = full[name]
    C.sh_sha256_update(st, name .. "\0", #name + 1)
    C.sh_sha256_update(st, t:data_ptr(), t:numel() * 4)
    t:free()
  end
  C.sh_sha256_final(st, digest)
  local hex = {}
  for i = 0, 31 do hex[i + 1] = ("%02x"):format(digest[i]) end
  return table.concat(hex)
end

-- After writing into the shards (Slice:set, or a view): every unit's full parameters are
-- stale, so each is resharded and the next forward gathers the new values. A plain model has
-- nothing to do.
function S.mark_stale(model)
  if not S.is_fsdp(model) then return end
  for _, u in ipairs(model.all_units) do u:reshard() end
end

-- How the model is laid out over the ranks, for a checkpoint's index: { strategy,
-- hybrid_group }, strategy "none" for a plain model.
function S.layout(model)
  if not S.is_fsdp(model) then return { strategy = "none" } end
  return { strategy = model.strategy, hybrid_group = model.opts and model.opts.hybrid_group or nil }
end

---------------------------------------------------------------------------------------------
-- a unit seen from a tool (tracing, the dry run)

-- The unit's name for people: its module path, "(root)" for the root.
function S.unit_name(u) return u.name == "" and "(root)" or u.name end

-- The gather state of the unit's FlatParameter ("sharded", "gathering", "unsharded"); nil for
-- a unit without one.
function S.gather_state(u) return u.fp and u.fp:state() end

return S
