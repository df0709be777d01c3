-- shard.io.state_dict, behind shard.save / shard.load: a model's full state dict (Hugging Face
-- names for GPT) as one safetensors file. Under FSDP every rank takes part (the f32 master
-- shards are all-gathered, fsdp.gather_full, so mixed precision loses nothing) and rank 0
-- writes, atomically; loading copies into each rank just the slice of the FlatParameter it
-- owns, so a file written at one world size loads at any other. Not a resumable training
-- checkpoint (shard.checkpoint: each rank's slices and the optimizer's state), nor
-- activation checkpointing (nn.Module.checkpoint).
-- Checksums: the file's __metadata__ "crc32c" holds a JSON object of every tensor's CRC32C
-- (8 hex digits; a string, so the reference safetensors library reads the file as any other),
-- and shard.load checks every tensor against it before anything is copied. A file without
-- them (older, or from another writer) loads unverified, with a note; opts.verify = false or
-- SHARD_VERIFY_CHECKSUMS=0 skips the check.
local tensor = require("shard.tensor")
local safetensors = require("shard.io.safetensors")
local json = require("shard.io.json")
local fsdp = require("shard.fsdp")

local M = {}

-- name -> CPU f32 tensor of the full value (under FSDP every rank calls it and gets it all).
function M.state_dict(model) return fsdp.gather_full(model) end

local CHECKSUMS = "crc32c"   -- the __metadata__ key of the tensors' checksums

-- metadata (copied) with every tensor's checksum added.
local function with_checksums(dict, metadata, path)
  local out, sums = {}, {}
  for k, v in pairs(metadata or {}) do out[k] = v end
  if out[CHECKSUMS] ~= nil then error(("save: %s: metadata key '%s' is shard's (the tensors' checksums)"):format(path, CHECKSUMS), 0) end
  for name, t in pairs(dict) do sums[name] = safetensors.crc32c(t) end
  out[CHECKSUMS] = json.encode(sums)
  return out
end

-- Every rank calls it; rank 0 writes (shard.init's env, when there is one, says the rank).
function M.save(model, path, metadata)
  local dict = M.state_dict(model)
  local env = rawget(require("shard"), "env")
  if not env or env.rank == 0 then
    local ok, err = pcall(function() safetensors.save(path, dict, with_checksums(dict, metadata, path)) end)
    if not ok then for _, t in pairs(dict) do t:free() end; error(err, 0) end
  end
  for _, t in pairs(dict) do t:free() end
  if env then env.barrier() end     -- every rank returns once the file is complete
end

-- name -> checksum from the file's metadata; false (after a note on rank 0) when it has none.
local function checksums_of(f, path)
  local text = f:metadata()[CHECKSUMS]
  if text == nil then
    local env = rawget(require("shard"), "env")
    if not env or env.rank == 0 then
      io.stderr:write(("shard.load: %s carries no checksums (written before shard.save kept them, or by another tool): loaded unverified\n"):format(path))
    end
    return false
  end
  local ok, sums = pcall(json.decode, text)
  if not ok or type(sums) ~= "table" then error(("%s: __metadata__ '%s' is not a JSON object of checksums"):format(path, CHECKSUMS), 0) end
  return sums
end

-- Reads tensor `name` whole into dst and checks it against sums[name].
local function verified_read(f, path, sums, name, dst)
  local want = sums[name]
  if type(want) ~= "string" then error(("%s: tensor '%s' has no checksum in the file's __metadata__"):format(path, name), 0) end
  local _, got = f:read_crc32c(name, dst)
  if got ~= want then
    error(("%s: tensor '%s' fails its checksum (its bytes give CRC32C %s, the file says %s): the file is corrupt; "
      .. "shard.load(model, path, { verify = false }) or SHARD_VERIFY_CHECKSUMS=0 loads it anyway"):format(path, name, got, want), 0)
  end
end

-- Loads path into model; every parameter must be there with its shape, and (unless
-- opts.strict == false) the file may hold nothing else. All or nothing: the whole header is
-- validated and every name, shape and dtype checked against the model, then every value is
-- read into host memory (and checked against its checksum), and only then is anything copied
-- into the model; on any error the model is as it was. opts.verify = false skips the checksums.
function M.load(model, path, opts)
  local C = require("shard.ffi").C
  local function is_float(dtype) local id = C.sh_dtype_from_name(dtype); return id >= 0 and C.sh_dtype_is_float(id) == 1 end
  local f = safetensors.open(path)
  local wanted = fsdp.local_slices(model)     -- in copy order: { name, tensor, set }
  local used, problems = {}, {}
  for _, w in ipairs(wanted) do
    local info = f:info(w.name)
    local want = table.concat(w.tensor:shape(), "x")
    if not info then
      problems[#problems + 1] = ("no tensor '%s' (%s %s in the model)"):format(w.name, w.tensor:dtype(), want)
    else
      local have = table.concat(info.shape, "x")
      if have ~= want then
        problems[#problems + 1] = ("'%s' is %s in the file but %s in the model"):format(w.name, have, want)
      elseif C.sh_dtype_from_name(info.dtype) < 0 or is_float(info.dtype) ~= is_float(w.tensor:dtype()) then
        problems[#problems + 1] = ("'%s' is %s in the file but %s in the model"):format(w.name, info.dtype, w.tensor:dtype())
      end
      used[w.name] = true
    end
  end
  if not (opts and opts.strict == false) then
    local extra = {}
    for _, name in ipairs(f:names()) do if not used[name] then extra[#extra + 1] = name end end
    if #extra > 0 then problems[#problems + 1] = "holds tensors the model lacks: " .. table.concat(extra, ", ") end
  end
  if #problems > 0 then
    f:close()
    error(("load: %s: %s (the model is unchanged)"):format(path, table.concat(problems, "; ")), 2)
  end
  -- Every value is read (and verified) before the first copy, so a read error or a corrupt
  -- byte leaves the model untouched.
  local values = {}
  local ok, err = pcall(function()
    local sums = safetensors.verifying(opts and opts.verify) and checksums_of(f, path)
    for k, w in ipairs(wanted) do
      local info = f:info(w.name)
      values[k] = tensor.empty(info.shape, { dtype = info.dtype, device = "cpu" })
      if sums then verified_read(f, path, sums, w.name, values[k]) else f:read(w.name, values[k], 0, info.numel) end
    end
  end)
  f:close()
  if not ok then
    for _, v in pairs(values) do v:free() end
    error(("load: %s (the model is unchanged)"):format(tostring(err)), 2)
  end
  for k, w in ipairs(wanted) do w:set(values[k]) end
  fsdp.mark_stale(model)
  for _, v in ipairs(values) do v:free() end
end

return M
