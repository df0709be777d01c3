-- shard.fsdp.shared: parameters with more than one user (ties such as GPT's lm_head on wte's
-- weight, or a module registered twice). Every user of each parameter tensor: the modules
-- that register it and the ties a module declares (Module:tie), each as { at = the module's
-- path, name = the user's dotted name }. A unit keeps a parameter only when all its users lie
-- inside the unit's module; otherwise the parameter goes up to the closest unit that holds
-- them all (the root at worst), which stays gathered while any of them runs: one
-- FlatParameter, one copy, one gradient that both users accumulate into.
local is_unit = require("shard.fsdp.unit").is_unit

local M = {}

-- Shared parameters. Every user of each parameter tensor: the modules that register it and
-- the ties a module declares (Module:tie, as GPT's lm_head on wte's weight), each as
-- { at = the module's path, name = the user's dotted name }. A unit keeps a parameter only
-- when all its users lie inside the unit's module; otherwise the parameter goes up to the
-- closest unit that holds them all (the root at worst), which stays gathered while any of
-- them runs: one FlatParameter, one copy, one gradient that both users accumulate into.
local function param_users(module, prefix, users)
  users = users or {}
  local function add(t, at, name)
    local list = users[t]
    if not list then list = {}; users[t] = list end
    list[#list + 1] = { at = at, name = name }
  end
  local function dotted(a, b) return a == "" and b or (a .. "." .. b) end
  for _, p in ipairs(module._params) do add(p.tensor, prefix, dotted(prefix, p.name)) end
  for _, tie in ipairs(rawget(module, "_ties") or {}) do add(tie.tensor, prefix, dotted(prefix, tie.name)) end
  for _, c in ipairs(module:named_children()) do
    local inner = is_unit(c.module) and c.module.module or c.module
    param_users(inner, dotted(prefix, c.name), users)
  end
  return users
end

local function inside(at, name)
  return name == "" or at == name or at:sub(1, #name + 1) == name .. "."
end

-- Splits a would-be unit's parameters into those it keeps and those it leaves to an ancestor.
local function split_shared(params, name, users)
  local keep, left, seen = {}, {}, {}
  for _, t in ipairs(params) do
    local escapes = false
    for _, u in ipairs(users[t] or {}) do
      if not inside(u.at, name) then escapes = true; break end
    end
    if escapes then
      if not seen[t] then seen[t] = true; left[#left + 1] = t end
    else
      keep[#keep + 1] = t
    end
  end
  return keep, left
end

-- A unit wrapped on its own before (manual nesting) has already flattened its parameters: one
-- that a module outside it also uses cannot move up any more, so wrap refuses, naming both.
local function refuse_split(u, at, users)
  for _, t in ipairs(u.params) do
    local list, inner, outer = users[t] or {}, nil, nil
    for _, x in ipairs(list) do
      if inside(x.at, at) then inner = inner or x.name else outer = outer or x.name end
    end
    if inner and outer then
      error(("fsdp.wrap: parameter %s is used by %s inside the unit %s, wrapped on its own before, and by %s outside it; " ..
             "wrap the model once with a policy (the parameter then stays with the closest unit over both users), " ..
             "or wrap a module that holds both"):format(inner, inner, at, outer), 0)
    end
  end
end

-- Every parameter with more than one user: its name, its users' names and the unit that
-- holds it (what fsdp.summary prints under the table).
local function shared_report(root, users)
  local owner = {}
  for _, u in ipairs(root.all_units) do
    for _, t in ipairs(u.params) do owner[t] = owner[t] or u end
  end
  local out = {}
  for _, u in ipairs(root.all_units) do
    for _, t in ipairs(u.params) do
      local list = users[t]
      if owner[t] == u and list and #list > 1 then
        owner[t] = false
        local names = {}
        for i, x in ipairs(list) do names[i] = x.name end
        out[#out + 1] = { name = root.names[t], users = names, unit = u.name == "" and "(root)" or u.name }
      end
    end
  end
  return out
end

M.param_users, M.split_shared, M.refuse_split, M.shared_report = param_users, split_shared, refuse_split, shared_report

return M
