-- shard.units: quantities as a person reads them, one format per kind, whatever the size:
-- the progress line, shard estimate, the dry run, the trace summary, sweep tables and memory
-- messages all print through here. Machine output (JSON, JSONL, CSV) keeps raw numbers.
--   units.bytes(760.2 * 2^20)   -> "760.2 MiB"   binary units, the largest that leaves >= 1
--   units.mib(41.5 * 2^20)      -> "41.5"        bytes in MiB, for keys and columns named MiB
--   units.time(1306.8)          -> "21.8 min"    seconds in us, ms, s, min or h
--   units.ms(0.0601)            -> "60.1"        seconds in ms, for keys and columns named ms
--   units.count(12780.4)        -> "12,780"      rounded, thousands separated
--   units.percent(0.4231)       -> "42.3%"       a fraction as a percentage
--   units.lr(5.05e-4)           -> "5.05e-04"    a learning rate: always 3 significant digits
--   units.si(6.38e11, "FLOP")   -> "638.0 GFLOP" decimal prefixes (FLOPs, FLOP/s, link speeds)
--   units.fixed(2.50123, 4)     -> "2.5012"      a plain number to a fixed number of decimals
--   units.plural(1, "rank")     -> "1 rank"
--   units.columns(rows)         -> lines of a table, each column as wide as its widest cell
--   units.parse("12,780")       -> 12780         the number a bare figure above stands for
local M = {}

-- Each format rounds the same way; a negative zero prints as zero.
local function fixed(x, decimals)
  local s = ("%." .. decimals .. "f"):format(x)
  if s:match("^%-[0.]+$") then s = s:sub(2) end
  return s
end
M.fixed = fixed

local BYTE_UNITS = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" }

-- Whole bytes below 1 KiB, else one decimal in the largest binary unit that leaves the value
-- at least 1; a value that rounds up to 1024.0 moves to the next unit ("1.0 GiB").
function M.bytes(n)
  local u, v = 1, n
  while u < #BYTE_UNITS and (math.abs(v) >= 1024 or (u > 1 and fixed(math.abs(v), 1) == "1024.0")) do
    v = v / 1024; u = u + 1
  end
  if u == 1 then return ("%d B"):format(v) end
  return fixed(v, 1) .. " " .. BYTE_UNITS[u]
end

function M.mib(n) return fixed(n / 2 ^ 20, 1) end

-- The unit that leaves the value at or above 1 and under the next step: 850 us, 60.1 ms,
-- 6.33 s, 21.8 min, 2.5 h.
function M.time(seconds)
  local s = math.abs(seconds)
  if s < 0.9995e-3 then return fixed(seconds * 1e6, 0) .. " us" end
  if s < 0.99995 then return fixed(seconds * 1e3, 1) .. " ms" end
  if s < 59.995 then return fixed(seconds, 2) .. " s" end
  if s < 3600 - 3 then return fixed(seconds / 60, 1) .. " min" end
  return fixed(seconds / 3600, 1) .. " h"
end

function M.ms(seconds) return fixed(seconds * 1e3, 1) end

function M.count(n)
  local s = fixed(n, 0)
  local sign, digits = s:match("^(%-?)(%d+)$")
  digits = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
  return sign .. digits
end

function M.percent(fraction) return fixed(fraction * 100, 1) .. "%" end

function M.lr(x) return ("%.2e"):format(x) end

local SI = { { 1e15, "P" }, { 1e12, "T" }, { 1e9, "G" }, { 1e6, "M" }, { 1e3, "k" } }

-- One decimal in the largest decimal prefix that leaves the value at least 1 once rounded.
function M.si(x, unit)
  for _, p in ipairs(SI) do
    if math.abs(x) >= p[1] * (1 - 0.05 / 1000) then return fixed(x / p[1], 1) .. " " .. p[2] .. unit end
  end
  return fixed(x, 1) .. " " .. unit
end

function M.plural(n, noun, nouns)
  return ("%s %s"):format(M.count(n), n == 1 and noun or (nouns or noun .. "s"))
end

-- rows: lists of cells (strings); opts.align: per column "l" or "r" (default: the first
-- column left, the others right); opts.indent: a prefix for every line. Returns the lines
-- joined by newlines.
function M.columns(rows, opts)
  opts = opts or {}
  local align, widths = opts.align or {}, {}
  for _, row in ipairs(rows) do
    for i, cell in ipairs(row) do widths[i] = math.max(widths[i] or 0, #cell) end
  end
  local lines = {}
  for r, row in ipairs(rows) do
    local cells = {}
    for i, cell in ipairs(row) do
      local left = (align[i] or (i == 1 and "l" or "r")) == "l"
      local pad = (" "):rep(widths[i] - #cell)
      cells[i] = left and cell .. pad or pad .. cell
    end
    lines[r] = ((opts.indent or "") .. table.concat(cells, "  ")):gsub("%s+$", "")
  end
  return table.concat(lines, "\n")
end

-- A figure printed by count, percent (a fraction again), fixed, mib, ms or lr, or any number
-- Lua reads; nil for other text.
function M.parse(text)
  local number, percent = text:match("^(.-)(%%?)$")
  local head, groups, tail = number:match("^(%-?%d%d?%d?)([,%d]*)(.*)$")
  if groups and groups:find(",") then
    if groups:gsub(",%d%d%d", "") ~= "" then return nil end   -- separators every 3 digits only
    number = head .. groups:gsub(",", "") .. tail
  end
  local n = tonumber(number)
  if n and percent == "%" then n = n / 100 end
  return n
end

return M
