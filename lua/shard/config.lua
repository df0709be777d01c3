-- shard.config: a recipe's settings, its defaults overridden from the command line.
--   local cfg = shard.config{ lr = 1e-3, n_layer = 6, data = "data/shakespeare" }
-- With `shard run recipe.lua --lr=3e-4 --n_layer=4`, cfg.lr is 3e-4 and cfg.n_layer is 4.
-- An optional second table declares each key's range, checked before any work and listed by
-- --help: { n_layer = { min = 1 }, dropout = { min = 0, below = 1 }, lr = { above = 0 },
-- dtype = { oneof = { "f32", "bf16" } } } (min / max inclusive, above / below exclusive).
-- Keys that count what a model or a run must have (n_layer, batch_size, iters, ...: POSITIVE)
-- take at least 1 unless the spec says otherwise.
-- Every override must name a key of the defaults and match its type: a typo such as --lr_=1
-- is an error listing the known keys, never a silently ignored setting. A default decides
-- the type: numbers take numbers, booleans take true/false (a bare --flag means true,
-- --no-flag false), strings take the text as written. A count (a whole-number default whose
-- key is named like one: n_layer, max_iters, eval_interval, batch_size, seed, ...) takes whole
-- numbers only, and a non-negative default refuses negative values. An argument that is not --key=value
-- (`max_iters=5`) is an error too, once the recipe asks for its config.
--
-- Every recipe also understands --help (its first comment line, then each key with its
-- default and type; exit 0) and --memory_limit=BYTES (also SHARD_MEMORY_LIMIT; suffixes KiB,
-- MiB, GiB): allocations past it fail with an out-of-memory error.
-- A wrong override, or a value outside its declared range, raises a usage error (a table { usage = message }), which bin/shard turns
-- into exit code 2; --help raises { help = text } (exit 0).
local argv = require("shard.argv")

local M = {}

M.overrides = {}   -- key -> raw string value, from the command line
M.stray = {}       -- arguments that are not --key=value
M.script = nil     -- the recipe's path, for --help

-- The command line's --key=value (and bare --flag, --no-flag) arguments, each value the text
-- as written (typed by apply against the defaults); anything else is kept as stray.
-- shard.argv's open grammar: `--` ends the settings, what follows it is stray.
function M.parse_args(args)
  return argv.parse(args, { open = true })
end

function M.set_overrides(overrides, stray, script)
  M.overrides, M.stray, M.script = overrides, stray or {}, script
  M.usage_text, M.about = nil, nil
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
  local memory = require("shard.memory")
  memory.set_limit(bytes)
  local cuda = require("shard.tensor").default_device
  if cuda and cuda ~= "cpu" then memory.set_limit(bytes, cuda) end
  return bytes
end
M.apply_memory_limit = apply_memory_limit

-- A script's description: its header comment's first paragraph, up to an indented example
-- line (`--   shard run ...`) or the first line that is not a comment. nil when it has none.
function M.description(path)
  local f = path and io.open(path, "r")
  if not f then return nil end
  local lines = {}
  for line in f:lines() do
    local text = line:match("^%s*%-%-(.*)$")
    if not text and line:match("^#!") then text = "" end
    if not text or text:match("^%s%s%s") or (text:match("^%s*$") and #lines > 0) then break end
    if text:match("%S") then lines[#lines + 1] = text:match("^%s*(.-)%s*$") end
  end
  f:close()
  return #lines > 0 and table.concat(lines, "\n") or nil
end

-- The first sentence of a description, on one line, without a leading "path.lua: ".
function M.summary(text)
  local one = text:gsub("\n", " "):gsub("^[%w_/%.%-]+%.lua:%s*", "")
  return one:match("^(.-%.)%s") or one
end

-- What a command's --help shows above its options (shard run shows the recipe's own header):
-- its usage line(s) and its description.
function M.describe(usage_text, about)
  M.usage_text, M.about = usage_text, about
end

-- Lua has one number type, so a default of 1 cannot say whether 0.5 is meant: keys named
-- like counts (n_layer, max_iters, eval_interval, batch_size, seed, ...) take whole numbers.
local COUNT_PATTERNS = { "^n_", "^num_", "^max_", "_iters$", "_interval$", "_size$", "_tokens$", "_steps?$",
                         "^steps?$", "^seed$", "^keep$", "^warmup", "accum", "^world", "^epochs?$", "_layers?$", "_heads?$",
                         "_windows$" }
local function is_count(key)
  for _, pat in ipairs(COUNT_PATTERNS) do if key:find(pat) then return true end end
  return false
end

-- Settings whose names say they count something there must be some of: at least 1 wherever a
-- script's defaults have them, unless the script's spec gives the key a range of its own.
local POSITIVE = { n_layer = true, n_head = true, n_embd = true, dim = true, block_size = true, batch_size = true,
                   vocab_size = true, iters = true, rounds = true, max_iters = true, eval_iters = true, grad_accum = true }

local function has_range(r) return r.min or r.max or r.above or r.below or r.oneof end

-- spec[key] (help and range), with POSITIVE's range where it declares none.
local function entry(spec, key)
  local r = spec[key] or {}
  if has_range(r) or not POSITIVE[key] then return r end
  return { help = r.help, min = 1 }
end

-- "at least 1", "at least 0 and below 1", "one of f32, bf16": a key's declared range, for
-- --help and for the error a value outside it gets.
local function range_text(r)
  if r.oneof then return "one of " .. table.concat(r.oneof, ", ") end
  local parts = {}
  if r.min then parts[#parts + 1] = "at least " .. tostring(r.min) end
  if r.above then parts[#parts + 1] = "above " .. tostring(r.above) end
  if r.max then parts[#parts + 1] = "at most " .. tostring(r.max) end
  if r.below then parts[#parts + 1] = "below " .. tostring(r.below) end
  return table.concat(parts, " and ")
end

-- A default's type as --help names it: integer only where the key takes whole numbers
-- alone (a count), since 0 and 1 are whole numbers too.
local function kind_of(key, v)
  if type(v) ~= "number" then return type(v) end
  return (v == math.floor(v) and is_count(key)) and "integer" or "number"
end

local function shown(v)
  if v == "" then return '""' end
  return tostring(v)
end

local function help_text(defaults, spec)
  local lines = {}
  local d = M.about or M.description(M.script)
  if d then lines[#lines + 1] = d; lines[#lines + 1] = "" end
  lines[#lines + 1] = M.usage_text or ("usage: shard run %s [--key=value ...]"):format(M.script or "RECIPE")
  lines[#lines + 1] = ""
  local keys = {}
  for k in pairs(defaults) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local r, notes = entry(spec, k), {}
    if r.help then notes[#notes + 1] = r.help end
    if has_range(r) then notes[#notes + 1] = range_text(r) end
    local line = ("  --%-20s %-8s default %s"):format(k, kind_of(k, defaults[k]), shown(defaults[k]))
    lines[#lines + 1] = #notes > 0 and ("%s  (%s)"):format(line, table.concat(notes, "; ")) or line
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

local function in_range(v, r)
  if r.oneof then
    for _, ok in ipairs(r.oneof) do if v == ok then return true end end
    return false
  end
  return not ((r.min and v < r.min) or (r.max and v > r.max) or (r.above and v <= r.above) or (r.below and v >= r.below))
end

local function check_range(key, v, r)
  if not in_range(v, r) then usage("config: --%s=%s: expected %s", key, tostring(v), range_text(r)) end
end

-- shard.config(defaults[, spec]): a new table, the defaults with the command line's overrides
-- applied, each overridden value checked against spec[key] (its range; POSITIVE's by default).
function M.apply(defaults, spec)
  if type(defaults) ~= "table" then error("shard.config expects a table of defaults, got " .. type(defaults), 0) end
  spec = spec or {}
  if M.overrides.help and defaults.help == nil then error({ help = help_text(defaults, spec) }, 0) end
  if #M.stray > 0 then
    usage("config: stray argument '%s'; settings are given as --key=value (known keys: %s)", M.stray[1],
          table.concat(sorted_keys(defaults), ", "))
  end
  local cfg = {}
  for k, v in pairs(defaults) do cfg[k] = v end
  for key, raw in pairs(M.overrides) do
    local negated = defaults[key] == nil and raw == "true" and key:match("^no_(.+)$")
    if negated and type(defaults[negated]) == "boolean" then   -- --no-flag: a boolean default's false
      key, raw = negated, "false"
    end
    if key == "memory_limit" and defaults[key] == nil then
      apply_memory_limit(raw, "--memory_limit")
    elseif defaults[key] == nil then
      usage("config: unknown option --%s; known options: %s", key, table.concat(sorted_keys(defaults), ", "))
    else
      cfg[key] = convert(key, raw, defaults[key])
      check_range(key, cfg[key], entry(spec, key))
    end
  end
  return cfg
end

return setmetatable(M, { __call = function(_, defaults, spec) return M.apply(defaults, spec) end })
