-- shard.print: tensors as text, laid out the way torch prints them, so numbers read the same
-- in both when comparing runs. One format is chosen for all the values shown (fixed point,
-- integer-valued "1.", or scientific when the magnitudes span more than 1e3, exceed 1e8 or go
-- below 1e-4); big tensors show only their first and last edge items per dim around "...".
-- A last line names dtype, shape and device:
--   [[ 0.1234, -1.5000],
--    [ 2.0000,  3.0000]]
--   [f32 2x2, cpu]
local ffi = require("ffi")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

local M = {}
M.options = { threshold = 1000, edgeitems = 3, linewidth = 80, precision = 4 }

local ELLIPSIS = {}   -- marks the elided middle of a dim

local FLOAT = { f64 = true, f32 = true, bf16 = true, f16 = true }

local function footer(t)
  local shape = t:shape()
  local dims = #shape == 0 and "scalar" or table.concat(shape, "x")
  local extra = t.requires_grad and ", requires_grad" or ""
  return ("[%s %s, %s%s]"):format(t:dtype(), dims, t:device(), extra)
end

-- The indices of one dim that are shown: all of them, or the edges when summarizing.
local function shown(n, summarize)
  local e = M.options.edgeitems
  local list = {}
  if summarize and n > 2 * e then
    for i = 0, e - 1 do list[#list + 1] = i end
    list[#list + 1] = ELLIPSIS
    for i = n - e, n - 1 do list[#list + 1] = i end
  else
    for i = 0, n - 1 do list[#list + 1] = i end
  end
  return list
end

-- The shown values as nested tables (ELLIPSIS where elided), plus them all in a flat list.
local function gather(t, summarize)
  local p, idx, v = t.p, ffi.new("int64_t[8]"), ffi.new("double[1]")
  local flat = {}
  local function walk(d)
    if d == p.ndim then
      check(C.sh_tensor_get(p, idx, v), 3)
      flat[#flat + 1] = v[0]
      return v[0]
    end
    local out = {}
    for _, i in ipairs(shown(tonumber(p.shape[d]), summarize)) do
      if i == ELLIPSIS then out[#out + 1] = ELLIPSIS
      else idx[d] = i; out[#out + 1] = walk(d + 1) end
    end
    return out
  end
  return walk(0), flat
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

local function special(x)
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" end
  if x == -math.huge then return "-inf" end
end

-- A function turning one value into text of a common width, chosen from all shown values.
local function formatter(dtype, values)
  local width, fmt = 1, nil
  if dtype == "bool" then
    fmt = function(x) return x ~= 0 and "true" or "false" end
  elseif not FLOAT[dtype] then
    fmt = function(x) return ("%.0f"):format(x) end
  else
    local lo, hi, int_mode = math.huge, 0, true
    local nonzero = 0
    for _, x in ipairs(values) do
      if finite(x) and x ~= 0 then
        nonzero = nonzero + 1
        lo, hi = math.min(lo, math.abs(x)), math.max(hi, math.abs(x))
        if x ~= math.ceil(x) then int_mode = false end
      end
    end
    local prec = M.options.precision
    local sci = nonzero > 0 and (hi / lo > 1000 or hi > 1e8 or (not int_mode and lo < 1e-4))
    if sci then
      fmt = function(x) return special(x) or ("%." .. prec .. "e"):format(x) end
    elseif int_mode then
      fmt = function(x) return special(x) or ("%.0f."):format(x) end
    else
      fmt = function(x) return special(x) or ("%." .. prec .. "f"):format(x) end
    end
  end
  for _, x in ipairs(values) do width = math.max(width, #fmt(x)) end
  local function pad(x)
    local s = fmt(x)
    return (" "):rep(width - #s) .. s
  end
  return pad, width
end

-- Nested brackets; the innermost dim wraps at the line width, as torch's _vector_str does.
local function render(node, depth, ndim, fmt, width)
  local indent = depth - 1
  if depth == ndim then
    local items = {}
    for _, x in ipairs(node) do items[#items + 1] = x == ELLIPSIS and " ..." or fmt(x) end
    local per_line = math.max(1, math.floor((M.options.linewidth - indent) / (width + 2)))
    local lines = {}
    for i = 1, #items, per_line do
      lines[#lines + 1] = table.concat(items, ", ", i, math.min(i + per_line - 1, #items))
    end
    return "[" .. table.concat(lines, ",\n" .. (" "):rep(indent + 1)) .. "]"
  end
  local parts = {}
  for _, child in ipairs(node) do
    parts[#parts + 1] = child == ELLIPSIS and "..." or render(child, depth + 1, ndim, fmt, width)
  end
  local sep = "," .. ("\n"):rep(ndim - depth) .. (" "):rep(indent + 1)
  return "[" .. table.concat(parts, sep) .. "]"
end

function M.tensor(t)
  if t:is_freed() then return "tensor (freed) " .. footer(t) end
  if t:device() == "meta" then return "tensor (meta: a shape, no values) " .. footer(t) end
  local src = t:is_cuda() and t:to("cpu") or t
  local n = src:numel()
  local body
  if n == 0 then
    body = "[]"
  else
    local nested, flat = gather(src, n > M.options.threshold)
    local fmt, width = formatter(t:dtype(), flat)
    body = src:dim() == 0 and fmt(nested) or render(nested, 1, src:dim(), fmt, width)
  end
  if src ~= t then src:free() end
  return body .. "\n" .. footer(t)
end

return M
