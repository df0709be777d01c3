-- shard.show: Lua values as text, as the REPL prints them (shard.tools.repl) and as bin/shard
-- names an error object that is not a string (shard.cli). The values of one chunk go on one line,
-- separated by tabs; strings print as they are, values with a __tostring as it says (tensors
-- pretty-printed), and tables by their contents (functions in them as <function>, so that
-- ranks holding the same table print the same):
--   { allocated = 0, by_tag = { activation = 0, comm = 0, ... }, peak = 4096 }
-- on one line when it fits, else one entry per line. Inside a table, strings are quoted, a
-- value whose tostring spans lines shows its last line (a tensor's "[f32 2x3, cpu]"), tables
-- nest MAX_DEPTH deep and show MAX_ITEMS entries, and a table met again prints as <cycle>.
local M = {}

local MAX_DEPTH, MAX_ITEMS, WIDTH = 3, 40, 78

local function has_tostring(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__tostring") ~= nil
end

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil
end

-- Array part first, then the other keys ordered by type and then by their text.
local function sorted_keys(t)
  local keys, n = {}, #t
  for k in pairs(t) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" then return a < b end
    return tostring(a) < tostring(b)
  end)
  return n, keys
end

local function one_line(v)
  local s = tostring(v)
  return s:match("([^\n]*)\n?$") or s
end

local format_table

local function nested(v, depth, seen)
  if type(v) == "string" then return (("%q"):format(v):gsub("\\\n", "\\n")) end
  if type(v) == "table" and not has_tostring(v) then return format_table(v, depth, seen) end
  if type(v) == "function" then return "<function>" end
  return one_line(v)
end

function format_table(t, depth, seen)
  if seen[t] then return "<cycle>" end
  if depth > MAX_DEPTH then return "{...}" end
  seen[t] = true
  local n, keys = sorted_keys(t)
  local items = {}
  for i = 1, math.min(n, MAX_ITEMS) do items[#items + 1] = nested(t[i], depth + 1, seen) end
  for _, k in ipairs(keys) do
    if #items >= MAX_ITEMS then break end
    local name = is_identifier(k) and k or "[" .. nested(k, depth + 1, seen) .. "]"
    items[#items + 1] = name .. " = " .. nested(t[k], depth + 1, seen)
  end
  if n + #keys > #items then items[#items + 1] = ("... (%d more)"):format(n + #keys - #items) end
  seen[t] = nil
  if #items == 0 then return "{}" end
  local flat = "{ " .. table.concat(items, ", ") .. " }"
  if #flat + 2 * depth <= WIDTH and not flat:find("\n") then return flat end
  local pad = ("  "):rep(depth)
  return "{\n" .. pad .. "  " .. table.concat(items, ",\n" .. pad .. "  ") .. "\n" .. pad .. "}"
end

-- One value as the REPL prints it.
function M.value(v)
  if type(v) == "table" and not has_tostring(v) then return format_table(v, 0, {}) end
  return tostring(v)
end

-- The text printed for a chunk's n values (with a newline), or "" when it returned none.
function M.values(n, values)
  if n == 0 then return "" end
  local parts = {}
  for i = 1, n do parts[i] = M.value(values[i]) end
  return table.concat(parts, "\t") .. "\n"
end

return M
