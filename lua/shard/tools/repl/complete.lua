-- shard.tools.repl.complete: tab completion of Lua names. complete.candidates(text, env) takes the
-- line up to the cursor and returns the completions of the name being typed, whole
-- ("shard.nn.Li" -> "shard.nn.Linear"), sorted:
--   name          globals of env and Lua keywords
--   a.b.name      fields of the value a.b
--   a.b:name      its methods (fields that are functions)
-- A value's fields are its own keys plus those its metatable's __index gives: a table's keys
-- (following __index chains), or for an __index function the keys of the tables among its
-- upvalues (the method tables it looks in) that it answers for. FFI cdata (a tensor) hide
-- their metatype, so for them the keys of the loaded modules' tables (and of the tables in
-- those) are tried. Nothing is called but __index itself; an error while looking is no
-- completion.
local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
                   "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

local MAX_CHAIN = 8

local function get(v, k)
  local ok, r = pcall(function() return v[k] end)
  if ok then return r end
end

local function indexable(v)
  local t = type(v)
  return t == "table" or ((t == "userdata" or t == "cdata" or t == "string") and getmetatable(v) ~= nil)
end

-- Adds the identifier keys of table t to set.
local function add_keys(set, t)
  for k in pairs(t) do
    if type(k) == "string" and k:match("^[%a_][%w_]*$") then set[k] = true end
  end
end

-- The keys an __index function answers for: those of the tables among its upvalues for which
-- v[k] is not nil.
local function keys_of_function(set, v, fn)
  for i = 1, 255 do
    local name, up = debug.getupvalue(fn, i)
    if not name then break end
    if type(up) == "table" then
      for k in pairs(up) do
        if type(k) == "string" and k:match("^[%a_][%w_]*$") and not set[k] and get(v, k) ~= nil then set[k] = true end
      end
    end
  end
end

-- The keys of the loaded modules' tables and their tables' that v answers for.
local function keys_of_cdata(set, v)
  local tried = {}
  local function try(t)
    if tried[t] then return end
    tried[t] = true
    for k in pairs(t) do
      if type(k) == "string" and not set[k] and k:match("^[%a_][%w_]*$") and get(v, k) ~= nil then set[k] = true end
    end
  end
  for _, mod in pairs(package.loaded) do
    if type(mod) == "table" then
      try(mod)
      for _, t in pairs(mod) do if type(t) == "table" then try(t) end end
    end
  end
end

-- The field names of v.
local function fields(v)
  local set = {}
  if type(v) == "table" then add_keys(set, v) end
  if type(v) == "cdata" then keys_of_cdata(set, v); return set end
  local mt = getmetatable(v)
  for _ = 1, MAX_CHAIN do
    if type(mt) ~= "table" then break end
    local index = rawget(mt, "__index")
    if type(index) == "table" then
      add_keys(set, index)
      mt = getmetatable(index)
    else
      if type(index) == "function" then keys_of_function(set, v, index) end
      break
    end
  end
  return set
end

-- The value that the dotted path names in env ("a.b.c"), or nil.
local function resolve(path, env)
  local v = env
  for name in path:gmatch("[^.:]+") do
    if not indexable(v) then return nil end
    v = get(v, name)
  end
  return v
end

function M.candidates(text, env)
  env = env or _G
  local word = text:match("[%a_][%w_.:]*$")
  if not word or text:sub(-#word - 1, -#word - 1):match("[%w_]") then return {} end
  local base, sep, partial = word:match("^(.-)([.:])([%a_]?[%w_]*)$")
  local names, prefix = {}, ""
  if base then
    if base == "" or base:find("[.:]$") or base:find(":") then return {} end
    local v = resolve(base, env)
    if not indexable(v) then return {} end
    names = fields(v)
    if sep == ":" then
      for k in pairs(names) do if type(get(v, k)) ~= "function" then names[k] = nil end end
    end
    prefix = base .. sep
  else
    partial = word
    names = fields(env)
    for _, k in ipairs(KEYWORDS) do names[k] = true end
  end
  local list = {}
  for k in pairs(names) do
    if k:sub(1, #partial) == partial then list[#list + 1] = prefix .. k end
  end
  table.sort(list)
  return list
end

return M
