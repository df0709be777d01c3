-- shard.argv: the one command-line parser, for every command of bin/shard (shard.tools.*) and
-- for shard.config's overrides.
--   local o, pos = argv.parse(args, {
--     options = {
--       { "nproc", "count", min = 1, aliases = { "nproc_per_node" } },
--       { "timeout", "seconds" },
--       { "hosts", "string", aliases = { "-H" }, key = "hosts_arg" },
--       { "map_by", "choice", oneof = { "slot", "node" } },
--       { "all", "flag", default = false },         -- aliases: other long names, or "-X" as written
--     },
--     stop = true,            -- the first positional argument ends the options
--     help = HELP,            -- --help and -h raise { help = HELP } (bin/shard prints it, exit 0)
--   })
-- The grammar, the same for every command:
--   --key=value        a value in one argument
--   --key value        the same in two (not for a flag: it takes no following argument)
--   --flag, --no-flag  a flag true, false (--flag=true and --flag=false too)
--   --                 the end of the options: every argument after it is positional
--   anything else      a positional argument, in order; with stop = true the first of them and
--                      every argument after it go to pos as they are (a recipe and its own flags)
-- A name takes '-' and '_' alike (--node-rank is --node_rank); o's keys are the declared names
-- (or the declaration's key). A repeated option keeps its last value.
-- Values by kind: "string" as written; "count" a whole number >= min (0); "number" a number >=
-- min when min is given; "seconds" a number above 0; "choice" one of oneof; "flag" a boolean.
-- A wrong command line raises { usage = message } (bin/shard: exit 2); the message names the
-- argument as it was written: "unknown option --wrold=4 (known: --world, --rank)", "--nproc
-- needs a value", "--nproc expects a whole number >= 1, got 'x'". spec.prefix and spec.suffix
-- frame every message ("sweep: ", "\n" .. usage). argv.try returns nil and the message instead.
-- open = true (shard.config's overrides): every --key is taken, its value the text as written
-- ("true" for a bare --key) and typed later against the recipe's defaults; since a key's kind is
-- not known here, --key value is not taken either (value is positional).
local M = {}

local function fail(spec, fmt, ...)
  error({ usage = (spec.prefix or "") .. fmt:format(...) .. (spec.suffix or "") }, 0)
end

local function normal(name) return (name:gsub("%-", "_")) end

-- Each kind's conversion: the value, or nil and what was expected.
local KINDS = {
  string = function(v) return v end,
  count = function(v, d)
    local n, min = tonumber(v), d.min or 0
    if n and n % 1 == 0 and n >= min then return n end
    return nil, min > 0 and ("a whole number >= %d"):format(min) or "a whole number"
  end,
  number = function(v, d)
    local n = tonumber(v)
    if n and n == n and (not d.min or n >= d.min) then return n end
    return nil, d.min and ("a number >= %s"):format(d.min) or "a number"
  end,
  seconds = function(v)
    local n = tonumber(v)
    if n and n > 0 then return n end
    return nil, "a positive number of seconds"
  end,
  choice = function(v, d)
    for _, c in ipairs(d.oneof) do if v == c then return v end end
    return nil, table.concat(d.oneof, " or ")
  end,
  flag = function(v)
    if v == "true" then return true elseif v == "false" then return false end
    return nil, "true or false"
  end,
}

-- The declarations by every name they answer to, and their names for messages.
local function index(options)
  local by, known = {}, {}
  for _, d in ipairs(options or {}) do
    local name, kind = d[1], d[2] or "string"
    if not KINDS[kind] then error("argv: option " .. name .. " has an unknown kind " .. tostring(kind), 3) end
    local decl = { kind = kind, key = d.key or normal(name), min = d.min, oneof = d.oneof }
    by["--" .. normal(name)] = decl
    for _, a in ipairs(d.aliases or {}) do
      by[a:match("^%-") and a or "--" .. normal(a)] = decl   -- "-H" as written; a long name either way
    end
    known[#known + 1] = "--" .. name
  end
  return by, known
end

-- The declaration an option argument names (--name or an alias such as -H), and whether it
-- was written --no-name (a flag's false).
local function lookup(by, a, name)
  if not name then return by[a], false end
  local key = "--" .. normal(name)
  if by[key] then return by[key], false end
  local d = key:match("^%-%-no_") and by["--" .. key:sub(6)]
  if d and d.kind == "flag" then return d, true end
  return nil
end

-- args (a list of strings) against spec; returns o (the options' values, over their defaults)
-- and pos (the positional arguments, in order).
function M.parse(args, spec)
  spec = spec or {}
  local by, known = index(spec.options)
  local o, pos = {}, {}
  for _, d in ipairs(spec.options or {}) do
    if d.default ~= nil then o[d.key or normal(d[1])] = d.default end
  end
  local i, n = 1, #args
  local function rest(from)
    for j = from, n do pos[#pos + 1] = args[j] end
  end
  while i <= n do
    local a = args[i]
    if a == "--" then rest(i + 1); break end
    if spec.help and (a == "--help" or a == "-h") then error({ help = spec.help }, 0) end
    local name, inline = a:match("^%-%-([%w_][%w_%.%-]*)=(.*)$")
    if not name then name = a:match("^%-%-([%w_][%w_%.%-]*)$") end
    if spec.open then
      if name then o[normal(name)] = inline or "true" else pos[#pos + 1] = a end
    elseif not a:match("^%-.") then
      if spec.stop then rest(i); break end
      pos[#pos + 1] = a
    else
      local d, negated = lookup(by, a, name)
      if not d then
        fail(spec, "unknown option %s%s (known: %s)", a, spec.where and " " .. spec.where or "", table.concat(known, ", "))
      end
      local flag = name and "--" .. name or a
      local value = inline
      if d.kind == "flag" then
        if negated and inline then fail(spec, "%s takes no value, got '%s'", flag, inline) end
        value = value or (negated and "false" or "true")
      elseif value == nil then
        value = args[i + 1]
        if value == nil then fail(spec, "%s needs a value", flag) end
        i = i + 1
      end
      local v, expected = KINDS[d.kind](value, d)
      if v == nil then fail(spec, "%s expects %s, got '%s'", flag, expected, value) end
      o[d.key] = v
    end
    i = i + 1
  end
  return o, pos
end

-- argv.parse, with a wrong command line as nil and the message (a help request still raises).
function M.try(args, spec)
  local ok, o, pos = pcall(M.parse, args, spec)
  if ok then return o, pos end
  if type(o) == "table" and o.usage then return nil, o.usage end
  error(o, 0)
end

return M
