-- shard.io.safetensors: the safetensors format through runtime/io/safetensors.c, which validates
-- the whole header (sizes, dtypes, offsets tiling the data section, duplicate keys) before a
-- byte of data is used, reads just the byte ranges asked for, and writes atomically.
--   local f = S.open(path)         f:names(), f:info(name), f:metadata(),
--                                  f:read(name, dst, first, count), f:close()
--   S.load(path) -> name -> CPU tensor, metadata      S.save(path, tensors, metadata)
--   S.crc32c(t), f:read_crc32c(name, dst, first, count), S.verifying(opt): the checksums
--                                  shard's checkpoints keep per tensor (runtime/io/checksum.h)
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local C, check = rt.C, rt.check

local S = {}

local File = {}
File.__index = File

local function closer(h) C.sh_st_close(h) end

-- Opens and validates path; raises an error naming the file (and the tensor) otherwise.
function S.open(path)
  if type(path) ~= "string" then error("safetensors.open: path must be a string, got " .. type(path), 2) end
  local out = ffi.new("sh_st_file*[1]")
  check(C.sh_st_open(out, path), 2)
  local self = setmetatable({ path = path, h = ffi.gc(out[0], closer) }, File)
  return self
end

local function handle(self, level)
  if self.h == nil then error("safetensors: " .. self.path .. " is closed", (level or 1) + 1) end
  return self.h
end

-- Sorted list of tensor names.
function File:names()
  local h = handle(self, 2)
  local out = {}
  for i = 0, C.sh_st_count(h) - 1 do out[#out + 1] = ffi.string(C.sh_st_at(h, i).name) end
  return out
end

local function info_of(t)
  local shape = {}
  for d = 0, t.ndim - 1 do shape[d + 1] = tonumber(t.shape[d]) end
  return {
    dtype = t.dtype >= 0 and tensor.dtype_name(t.dtype) or ffi.string(t.dtype_name):lower(),
    shape = shape,
    numel = tonumber(t.numel),
    nbytes = tonumber(t["end"] - t.begin),
  }
end

-- { dtype = "f32"..., shape = {...}, numel = N, nbytes = N } or nil when name is absent.
-- I16 and I8 tensors report "i16" / "i8": valid files, but shard has no such dtype to read into.
function File:info(name)
  local h = handle(self, 2)
  local i = C.sh_st_find(h, tostring(name))
  if i < 0 then return nil end
  return info_of(C.sh_st_at(h, i))
end

-- The __metadata__ table (string -> string; empty when the file has none).
function File:metadata()
  local h = handle(self, 2)
  local out = {}
  local k, kl, v, vl = ffi.new("const char*[1]"), ffi.new("size_t[1]"), ffi.new("const char*[1]"), ffi.new("size_t[1]")
  for i = 0, C.sh_st_metadata_count(h) - 1 do
    C.sh_st_metadata_at(h, i, k, kl, v, vl)
    out[ffi.string(k[0], kl[0])] = ffi.string(v[0], vl[0])
  end
  return out
end

-- A read's handle, the index of `name`, and first and count with their defaults; its errors
-- name the read's caller (File:read and File:read_crc32c call it).
local function read_target(self, name, dst, first, count)
  local h = handle(self, 3)
  local i = C.sh_st_find(h, tostring(name))
  if i < 0 then error(("safetensors: %s: no tensor '%s'"):format(self.path, tostring(name)), 3) end
  if not tensor.is_tensor(dst) then error(("safetensors: %s: tensor '%s': read needs a destination tensor"):format(self.path, name), 3) end
  return h, i, first or 0, count or dst:numel()
end

-- Copies elements [first, first + count) (0-based, row-major) of `name` into dst: a CPU
-- tensor, contiguous, of the file's dtype, with numel == count. first defaults to 0 and
-- count to dst's numel. Returns dst.
function File:read(name, dst, first, count)
  local h, i
  h, i, first, count = read_target(self, name, dst, first, count)
  check(C.sh_st_read(h, i, first, count, dst.p), 2)
  return dst
end

-- File:read, and the CRC32C of all of the tensor's bytes in the file (8 hex digits, as
-- S.crc32c gives): a partial read still checksums the whole tensor (the rest passes through
-- a small buffer), so a slice is checked against the checksum its writer kept.
function File:read_crc32c(name, dst, first, count)
  local h, i
  h, i, first, count = read_target(self, name, dst, first, count)
  local dtype = info_of(C.sh_st_at(h, i)).dtype
  if dst:device() ~= "cpu" or not dst:is_contiguous() or dst:dtype() ~= dtype or dst:numel() ~= count then
    error(("safetensors: %s: tensor '%s': reading %d elements needs a contiguous cpu %s tensor of as many, got %s %s[%d]")
      :format(self.path, name, count, dtype, dst:device(), dst:dtype(), dst:numel()), 2)
  end
  local crc = ffi.new("uint32_t[1]")
  check(C.sh_crc32c_st_read(h, i, first, count, dst:data_ptr(), crc), 2)
  return dst, ("%08x"):format(crc[0])
end

function File:close()
  if self.h ~= nil then
    C.sh_st_close(ffi.gc(self.h, nil))
    self.h = nil
  end
end

-- The CRC32C of a CPU tensor's bytes (contiguous) as 8 hex digits.
function S.crc32c(t)
  if not tensor.is_tensor(t) or t:device() ~= "cpu" or not t:is_contiguous() then
    error("safetensors.crc32c: needs a contiguous cpu tensor", 2)
  end
  local n = t:numel() * tonumber(C.sh_dtype_size(tensor.dtype_id(t:dtype())))
  return ("%08x"):format(C.sh_crc32c(0, t:data_ptr(), n))
end

-- Whether a load checks checksums: opt (a load's `verify` option) unless it is nil, else
-- not when the environment sets SHARD_VERIFY_CHECKSUMS=0.
function S.verifying(opt)
  if opt ~= nil then return opt ~= false end
  return os.getenv("SHARD_VERIFY_CHECKSUMS") ~= "0"
end

-- Returns name -> CPU tensor and the __metadata__ table. All or nothing: on any error the
-- tensors already read are freed.
function S.load(path)
  local f = S.open(path)
  local out = {}
  local ok, err = pcall(function()
    for _, name in ipairs(f:names()) do
      local info = f:info(name)
      if C.sh_dtype_from_name(info.dtype) < 0 then
        error(("safetensors: %s: tensor '%s': dtype %s has no shard equivalent"):format(path, name, info.dtype:upper()), 0)
      end
      local t = tensor.empty(info.shape, { dtype = info.dtype, device = "cpu" })
      out[name] = t
      f:read(name, t, 0, info.numel)
    end
  end)
  local meta = ok and f:metadata()
  f:close()
  if not ok then
    for _, t in pairs(out) do t:free() end
    error(err, 2)
  end
  return out, meta
end

-- Writes name -> tensor (any device) with optional string metadata, atomically.
function S.save(path, tensors, metadata)
  local names = {}
  for name in pairs(tensors) do
    if type(name) ~= "string" then error(("safetensors: %s: tensor names must be strings, got %s"):format(path, type(name)), 2) end
    names[#names + 1] = name
  end
  table.sort(names)
  local hosts, made = {}, {}
  local function cleanup() for _, t in ipairs(made) do t:free() end end
  for i, name in ipairs(names) do
    local t = tensors[name]
    if not tensor.is_tensor(t) then cleanup(); error(("safetensors: '%s' is not a tensor (%s)"):format(name, type(t)), 2) end
    local rc = C.sh_tensor_check(t.p, "safetensors save '" .. name .. "'")
    if rc ~= 0 then cleanup(); check(rc, 2) end
    if t.p.device >= 0 or not t:is_contiguous() then
      local h = t:to{ device = "cpu" }
      made[#made + 1] = h
      if not h:is_contiguous() then h = h:contiguous(); made[#made + 1] = h end
      hosts[i] = h
    else
      hosts[i] = t
    end
  end
  local keys, values = {}, {}
  for k, v in pairs(metadata or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      cleanup()
      error(("safetensors: %s: metadata must map strings to strings (%s -> %s)"):format(path, tostring(k), type(v)), 2)
    end
    keys[#keys + 1] = k; values[#values + 1] = v
  end
  local n, m = #names, #keys
  local cnames, cts = ffi.new("const char*[?]", n + 1), ffi.new("sh_tensor*[?]", n + 1)
  for i = 1, n do cnames[i - 1] = names[i]; cts[i - 1] = hosts[i].p end
  local ck, cv = ffi.new("const char*[?]", m + 1), ffi.new("const char*[?]", m + 1)
  for i = 1, m do ck[i - 1] = keys[i]; cv[i - 1] = values[i] end
  local rc = C.sh_st_save(path, n, cnames, cts, m, ck, cv)
  cleanup()
  check(rc, 2)
end

return S
