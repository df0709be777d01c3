-- shard.fsdp.policy: which modules become FSDP units. A policy is a function
-- (module, name, unwrapped_params) -> true when the module gets its own unit.
local P = {}

-- Every module whose class is one of `classes` (e.g. {nn.Block}).
function P.transformer(classes)
  local set = {}
  for _, c in ipairs(classes) do set[c] = true end
  return function(module) return set[getmetatable(module)] == true end
end

-- Any module holding at least min_params parameters not already in a unit below it.
function P.size(opts)
  local min = type(opts) == "table" and opts.min_params or opts
  return function(module, name, unwrapped) return unwrapped >= min end
end

-- Any module for which fn(module, name) is true.
function P.predicate(fn)
  return function(module, name) return fn(module, name) == true end
end

return P
