-- shard.memory: the caching allocator's statistics and controls, per device.
--   shard.memory.stats()              -> { allocated, peak, reserved, by_tag = {param=..}, ... }
--   shard.memory.with_tag("param", function() ... end)   -- new storages are counted as params
--   print(shard.memory.format(shard.memory.stats("cuda:0")))
-- Devices are named as for tensors ("cpu", "cuda", "cuda:N"); the default is the CPU.
local ffi = require "ffi"
local rt = require "shard.ffi"
local tensor = require "shard.tensor"
local C, check = rt.C, rt.check

local M = {}

-- The tags of alloc.h's sh_mem_tag, in its order (ids from the enum itself).
local TAG_ID = { other = C.SH_TAG_OTHER, param = C.SH_TAG_PARAM, grad = C.SH_TAG_GRAD, optim = C.SH_TAG_OPTIM,
                 activation = C.SH_TAG_ACTIVATION, comm = C.SH_TAG_COMM }
M.TAGS = {}
for name, id in pairs(TAG_ID) do M.TAGS[id + 1] = name end
assert(#M.TAGS == C.SH_N_TAGS, "shard.memory: alloc.h's tags changed")

local function tag_id(name)
  local id = TAG_ID[name]
  if not id then error(("memory: unknown tag '%s' (expected %s)"):format(tostring(name), table.concat(M.TAGS, ", ")), 3) end
  return id
end

local raw = ffi.new("sh_mem_stats")
local fp_raw = ffi.new("sh_fp_stats")

function M.stats(device)
  check(C.sh_mem_stats_get(tensor.device_id(device), raw), 2)
  local by_tag, peak_by_tag = {}, {}
  for name, id in pairs(TAG_ID) do
    by_tag[name] = tonumber(raw.by_tag[id])
    peak_by_tag[name] = tonumber(raw.peak_by_tag[id])
  end
  return {
    allocated = tonumber(raw.allocated), peak = tonumber(raw.peak), reserved = tonumber(raw.reserved),
    by_tag = by_tag, peak_by_tag = peak_by_tag,
    n_alloc = tonumber(raw.n_alloc), n_system_alloc = tonumber(raw.n_system_alloc),
    limit = tonumber(raw.limit),
    -- FSDP's buffers in flight (every device): gathered units alive and flat grads alive
    in_flight = M.in_flight(),
  }
end

-- { gathers, gathers_peak, reduces, reduces_peak }: full parameter buffers and flat grad
-- buffers alive across every FlatParameter, bounded by shard.fsdp's prefetch and
-- reduces_in_flight.
function M.in_flight()
  C.sh_flatparam_stats(fp_raw)
  return { gathers = fp_raw.gathers, gathers_peak = fp_raw.gathers_peak,
           reduces = fp_raw.reduces, reduces_peak = fp_raw.reduces_peak }
end

function M.reset_peak(device)
  check(C.sh_mem_reset_peak(tensor.device_id(device)), 2)
  C.sh_flatparam_reset_peaks()
end
function M.empty_cache(device) check(C.sh_mem_empty_cache(tensor.device_id(device)), 2) end
-- Allocations that would take `allocated` past bytes fail with an out-of-memory error;
-- nil or 0 removes the limit.
function M.set_limit(bytes, device) check(C.sh_mem_set_limit(tensor.device_id(device), bytes or 0), 2) end

-- Runs fn(...) with new storages counted under tag; the previous tag is back afterwards,
-- whether fn returns or raises.
local function restore(old, ok, ...)
  C.sh_mem_set_tag(old)
  if not ok then error((...), 0) end
  return ...
end
function M.with_tag(name, fn, ...)
  return restore(C.sh_mem_set_tag(tag_id(name)), pcall(fn, ...))
end

local function bytes(n)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local u = 1
  while math.abs(n) >= 1024 and u < #units do n = n / 1024; u = u + 1 end
  return u == 1 and ("%d B"):format(n) or ("%.1f %s"):format(n, units[u])
end
M.format_bytes = bytes

-- One line: "allocated 1.5 MiB (param 1.0 MiB, grad 512.0 KiB), peak 2.0 MiB, reserved 4.0 MiB"
-- " (param 3.1 MiB, grad ...)" for the non-zero tags of a by-tag table
local function tag_list(by_tag)
  local parts = {}
  for _, name in ipairs(M.TAGS) do
    if by_tag[name] ~= 0 then parts[#parts + 1] = name .. " " .. bytes(by_tag[name]) end
  end
  return #parts > 0 and " (" .. table.concat(parts, ", ") .. ")" or ""
end

function M.format(s)
  local limit = s.limit > 0 and ", limit " .. bytes(s.limit) or ""
  return ("allocated %s%s, peak %s%s, reserved %s%s"):format(bytes(s.allocated), tag_list(s.by_tag), bytes(s.peak),
    tag_list(s.peak_by_tag), bytes(s.reserved), limit)
end

return M
