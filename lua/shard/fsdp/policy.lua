-- shard.fsdp.policy: which modules become FSDP units. A policy is a function
-- (module, name, unwrapped_params) -> true when the module gets its own unit.
local P = {}

-- Every module whose class is one of `classes` (e.g. {nn.Block}).
function P.transformer(classes)
  if type(classes) ~= "table" or #classes == 0 then
    error("fsdp.policy.transformer: expected a list of module classes such as { nn.Block }, got " .. type(classes), 2)
  end
  local set = {}
  for i, c in ipairs(classes) do
    if type(c) ~= "table" then error(("fsdp.policy.transformer: entry %d is a %s, not a module class"):format(i, type(c)), 2) end
    set[c] = true
  end
  return function(module) return set[getmetatable(module)] == true end
end

-- Any module holding at least min_params parameters not already in a unit below it.
function P.size(opts)
  local min = type(opts) == "table" and opts.min_params or opts
  if type(min) ~= "number" then
    error("fsdp.policy.size: expected min_params, a number (size(1e6) or size{ min_params = 1e6 }), got " .. type(min), 2)
  end
  return function(module, name, unwrapped) return unwrapped >= min end
end

-- Any module for which fn(module, name) is true.
function P.predicate(fn)
  if type(fn) ~= "function" then error("fsdp.policy.predicate: expected a function (module, name), got " .. type(fn), 2) end
  return function(module, name) return fn(module, name) == true end
end

return P
