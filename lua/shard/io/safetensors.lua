-- shard.io.safetensors: read and write the safetensors format (an 8-byte little-endian
-- header length, a JSON header of name -> {dtype, shape, data_offsets}, then the raw bytes).
-- Writes are atomic: a temporary file renamed over the target once complete.
local ffi = require "ffi"
local rt = require "shard.ffi"
local tensor = require "shard.tensor"
local json = require "shard.io.json"
local C, check = rt.C, rt.check

local S = {}

local TO_SHARD = { F64 = "f64", F32 = "f32", BF16 = "bf16", F16 = "f16", I64 = "i64", I32 = "i32", U8 = "u8", BOOL = "bool" }
local FROM_SHARD = {}
for k, v in pairs(TO_SHARD) do FROM_SHARD[v] = k end

local function u64le(s, i)
  local n = 0
  for k = 7, 0, -1 do n = n * 256 + s:byte(i + k) end
  return n
end

-- Returns name -> tensor (CPU) and the header's __metadata__ table.
function S.load(path)
  local f, err = io.open(path, "rb")
  if not f then error("safetensors: cannot open " .. path .. ": " .. tostring(err), 2) end
  local bytes = f:read("*a")
  f:close()
  if #bytes < 8 then error("safetensors: " .. path .. " is too short to be a safetensors file", 2) end
  local hlen = u64le(bytes, 1)
  if 8 + hlen > #bytes then error(("safetensors: %s: header length %d exceeds the file size %d"):format(path, hlen, #bytes), 2) end
  local ok, header = pcall(json.decode, bytes:sub(9, 8 + hlen))
  if not ok then error("safetensors: " .. path .. ": bad header: " .. header, 2) end
  local base = 8 + hlen
  local out = {}
  for name, info in pairs(header) do
    if name ~= "__metadata__" then
      local dtype = TO_SHARD[info.dtype]
      if not dtype then error(("safetensors: %s: tensor %s has unsupported dtype %s"):format(path, name, tostring(info.dtype)), 2) end
      local a, b = info.data_offsets[1], info.data_offsets[2]
      local t = tensor.empty(info.shape, { dtype = dtype, device = "cpu" })
      local nbytes = t:numel() * C.sh_dtype_size(t.p.dtype)
      if b - a ~= nbytes or base + b > #bytes then
        error(("safetensors: %s: tensor %s: offsets [%d, %d) do not hold %s %s"):format(path, name, a, b, dtype,
          table.concat(info.shape, "x")), 2)
      end
      if nbytes > 0 then ffi.copy(C.sh_tensor_data(t.p), ffi.cast("const char*", bytes) + base + a, nbytes) end
      out[name] = t
    end
  end
  return out, header.__metadata__ or {}
end

-- Writes name -> tensor (any device) with optional string metadata, atomically.
function S.save(path, tensors, metadata)
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  local header, blobs, offset = {}, {}, 0
  for _, name in ipairs(names) do
    local t = tensors[name]
    if not tensor.is_tensor(t) then error(("safetensors: '%s' is not a tensor (%s)"):format(name, type(t)), 2) end
    check(C.sh_tensor_check(t.p, "safetensors save '" .. name .. "'"), 2)
    local host = (t.p.device >= 0 or not t:is_contiguous()) and t:to{ device = "cpu" }:contiguous() or t
    local nbytes = host:numel() * C.sh_dtype_size(host.p.dtype)
    blobs[#blobs + 1] = nbytes > 0 and ffi.string(C.sh_tensor_data(host.p), nbytes) or ""
    header[name] = { dtype = FROM_SHARD[host:dtype()], shape = host:shape(), data_offsets = { offset, offset + nbytes } }
    offset = offset + nbytes
  end
  if metadata then header.__metadata__ = metadata end
  local h = json.encode(header)
  h = h .. string.rep(" ", (8 - #h % 8) % 8)
  local len = {}
  local n = #h
  for k = 1, 8 do len[k] = string.char(n % 256); n = math.floor(n / 256) end
  local tmp = path .. ".tmp." .. tostring(os.time()) .. tostring(math.random(1e9))
  local f, err = io.open(tmp, "wb")
  if not f then error("safetensors: cannot write " .. tmp .. ": " .. tostring(err), 2) end
  f:write(table.concat(len), h)
  for _, b in ipairs(blobs) do f:write(b) end
  local ok = f:close()
  if not ok or not os.rename(tmp, path) then os.remove(tmp); error("safetensors: cannot finish writing " .. path, 2) end
end

return S
