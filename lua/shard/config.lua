-- shard.config: a recipe's settings, its defaults overridden from the command line.
--   local cfg = shard.config{ lr = 1e-3, n_layer = 6, data = "data/shakespeare" }
-- With `shard run recipe.lua --lr=3e-4 --n_layer=4`, cfg.lr is 3e-4 and cfg.n_layer is 4.
-- Every override must name a key of the defaults and match its type: a typo such as --lr_=1
-- is an error listing the known keys, never a silently ignored setting. A default decides
-- the type: numbers take numbers, booleans take true/false (a bare --flag means true),
-- strings take the text as written.
local M = {}

M.overrides = {}   -- key -> raw string value, from the command line

-- Collects --key=value (and bare --flag) arguments; anything else is left to the recipe.
function M.parse_args(args)
  local out = {}
  for _, a in ipairs(args) do
    local key, value = a:match("^%-%-([%w_%.%-]+)=(.*)$")
    if not key then key = a:match("^%-%-([%w_][%w_%.%-]*)$"); value = key and "true" end
    if key then out[key:gsub("%-", "_")] = value end
  end
  return out
end

function M.set_overrides(overrides) M.overrides = overrides end

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
    if not v then error(("config: --%s expects a number, got '%s'"):format(key, raw), 0) end
    return v
  elseif kind == "boolean" then
    if raw == "true" then return true elseif raw == "false" then return false end
    error(("config: --%s expects true or false, got '%s'"):format(key, raw), 0)
  elseif kind == "string" then
    return raw
  end
  error(("config: --%s cannot be set from the command line (its default is a %s)"):format(key, kind), 0)
end

-- shard.config(defaults): a new table, the defaults with the command line's overrides applied.
function M.apply(defaults)
  if type(defaults) ~= "table" then error("shard.config expects a table of defaults, got " .. type(defaults), 0) end
  local cfg = {}
  for k, v in pairs(defaults) do cfg[k] = v end
  for key, raw in pairs(M.overrides) do
    if defaults[key] == nil then
      error(("config: unknown option --%s; known options: %s"):format(key,
        table.concat(sorted_keys(defaults), ", ")), 0)
    end
    cfg[key] = convert(key, raw, defaults[key])
  end
  return cfg
end

return setmetatable(M, { __call = function(_, defaults) return M.apply(defaults) end })
