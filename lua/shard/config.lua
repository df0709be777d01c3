-- shard.config: a recipe's settings, its defaults overridden from the command line.
--   local cfg = shard.config{ lr = 1e-3, n_layer = 6, data = "data/shakespeare" }
-- With `shard run recipe.lua --lr=3e-4 --n_layer=4`, cfg.lr is 3e-4 and cfg.n_layer is 4.
-- Every override must name a key of the defaults and match its type: a typo such as --lr_=1
-- is an error listing the known keys, never a silently ignored setting. A default decides
-- the type: numbers take numbers, booleans take true/false (a bare --flag means true),
-- strings take the text as written. A count (a whole-number default whose key is named like
-- one: n_layer, max_iters, eval_interval, batch_size, seed, ...) takes whole numbers only, and
-- a non-negative default refuses negative values. An argument that is not --key=value
-- (`max_iters=5`) is an error too, once the recipe asks for its config.
--
-- Every recipe also understands --help (its first comment line, then each key with its
-- default and type; exit 0) and --memory_limit=BYTES (also SHARD_MEMORY_LIMIT; suffixes KiB,
-- MiB, GiB): allocations past it fail with an out-of-memory error.
-- A wrong override raises a usage error (a table { usage = message }), which bin/shard turns
-- into exit code 2; --help raises { help = text } (exit 0).
local M = {}

M.overrides = {}   -- key -> raw string value, from the command line
M.stray = {}       -- arguments that are not --key=value
M.script = nil     -- the recipe's path, for --help

-- Collects --key=value (and bare --flag) arguments; anything else is kept as stray.
function M.parse_args(args)
  local out, stray = {}, {}
  for _, a in ipairs(args) do
    local key, value = a:match("^%-%-([%w_%.%-]+)=(.*)$")
    if not key then key = a:match("^%-%-([%w_][%w_%.%-]*)$"); value = key and "true" end
    if key then out[key:gsub("%-", "_")] = value else stray[#stray + 1] = a end
  end
  return out, stray
end

function M.set_overrides(overrides, stray, script)
  M.overrides, M.stray, M.script = overrides, stray or {}, script
end

local function usage(fmt, ...) error({ usage = fmt:format(...) }, 0) end

local UNITS = { [""] = 1, B = 1, KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30, TiB = 2 ^ 40, KB = 1e3, MB = 1e6, GB = 1e9 }

-- "512MiB", "2GiB", "1000000" -> bytes; nil when malformed.
function M.parse_bytes(text)
  local num, unit = tostring(text):match("^%s*([%d%.]+)%s*(%a*)%s*$")
  local n, scale = tonumber(num), UNITS[unit or ""]
  if not n or not scale or n <= 0 then return nil end
  return math.floor(n * scale)
end

local function apply_memory_limit(raw, from)
  local bytes = M.parse_bytes(raw)
  if not bytes then usage("config: %s=%s is not a size (e.g. 512MiB, 2GiB or a number of bytes)", from, raw) end
  local memory = require "shard.memory"
  memory.set_limit(bytes)
  local cuda = require("shard.tensor").default_device
  if cuda and cuda ~= "cpu" then memory.set_limit(bytes, cuda) end
  return bytes
end
M.apply_memory_limit = apply_memory_limit

-- The recipe's first comment line (its one-line description), or nil.
local function description(path)
  local f = path and io.open(path, "r")
  if not f then return nil end
  for line in f:lines() do
    local text = line:match("^%s*%-%-%s*(.-)%s*$")
    if text and text ~= "" then f:close(); return text end
    if not line:match("^%s*$") and not line:match("^#!") then break end
  end
  f:close()
  return nil
end

local function help_text(defaults)
  local lines = {}
  local d = description(M.script)
  if d then lines[#lines + 1] = d; lines[#lines + 1] = "" end
  lines[#lines + 1] = ("usage: shard run %s [--key=value ...]"):format(M.script or "RECIPE")
  lines[#lines + 1] = ""
  local keys = {}
  for k in pairs(defaults) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = defaults[k]
    local kind = type(v) == "number" and (v == math.floor(v) and "integer" or "number") or type(v)
    lines[#lines + 1] = ("  --%-20s %-8s default %s"):format(k, kind, tostring(v))
  end
  lines[#lines + 1] = ("  --%-20s %-8s default %s"):format("memory_limit", "size", "none (or SHARD_MEMORY_LIMIT)")
  return table.concat(lines, "\n")
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  return keys
end

-- Lua has one number type, so a default of 1 cannot say whether 0.5 is meant: keys named
-- like counts (n_layer, max_iters, eval_interval, batch_size, seed, ...) take whole numbers.
local COUNT_PATTERNS = { "^n_", "^num_", "^max_", "_iters$", "_interval$", "_size$", "_tokens$", "_steps?$",
                         "^steps?$", "^seed$", "^keep$", "^warmup", "accum", "^world", "^epochs?$", "_layers?$", "_heads?$" }
local function is_count(key)
  for _, pat in ipairs(COUNT_PATTERNS) do if key:find(pat) then return true end end
  return false
end

local function convert(key, raw, default)
  local kind = type(default)
  if kind == "number" then
    local v = tonumber(raw)
    if not v or v ~= v then usage("config: --%s expects a number, got '%s'", key, raw) end
    local whole = default == math.floor(default) and is_count(key)
    if whole and v ~= math.floor(v) then usage("config: --%s expects a whole number (its default is %s), got '%s'", key, tostring(default), raw) end
    if default >= 0 and v < 0 then usage("config: --%s must not be negative, got '%s'", key, raw) end
    return v
  elseif kind == "boolean" then
    if raw == "true" then return true elseif raw == "false" then return false end
    usage("config: --%s expects true or false, got '%s'", key, raw)
  elseif kind == "string" then
    return raw
  end
  usage("config: --%s cannot be set from the command line (its default is a %s)", key, kind)
end

-- shard.config(defaults): a new table, the defaults with the command line's overrides applied.
function M.apply(defaults)
  if type(defaults) ~= "table" then error("shard.config expects a table of defaults, got " .. type(defaults), 0) end
  if M.overrides.help and defaults.help == nil then error({ help = help_text(defaults) }, 0) end
  if #M.stray > 0 then
    usage("config: stray argument '%s'; settings are given as --key=value (known keys: %s)", M.stray[1],
          table.concat(sorted_keys(defaults), ", "))
  end
  local cfg = {}
  for k, v in pairs(defaults) do cfg[k] = v end
  for key, raw in pairs(M.overrides) do
    if key == "memory_limit" and defaults[key] == nil then
      apply_memory_limit(raw, "--memory_limit")
    elseif defaults[key] == nil then
      usage("config: unknown option --%s; known options: %s", key, table.concat(sorted_keys(defaults), ", "))
    else
      cfg[key] = convert(key, raw, defaults[key])
    end
  end
  return cfg
end

return setmetatable(M, { __call = function(_, defaults) return M.apply(defaults) end })
