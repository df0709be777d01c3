-- shard.nn.Module: the module protocol. A module registers parameters and children in
-- order; named_parameters() walks them depth-first with dotted names, counting a tied
-- parameter once (under its first name). Calling a module calls its forward.
local tensor = require("shard.tensor")
local memory = require("shard.memory")
local C = require("shard.ffi").C

local Module = {}
Module.__index = Module
Module.__name = "Module"
Module.__call = function(self, ...) return self:forward(...) end
Module.__tostring = function(self) return self:repr() end

-- Subclass: local Linear = Module:extend("Linear"); Linear(...) runs Linear.init(self, ...).
function Module:extend(name)
  local cls = {}
  for k, v in pairs(self) do if k:match("^__") then cls[k] = v end end
  cls.__index = cls
  cls.__name = name
  cls.super = self
  return setmetatable(cls, {
    __index = self,
    __call = function(c, ...)
      local obj = setmetatable({ _params = {}, _children = {}, training = true }, c)
      obj:init(...)
      return obj
    end,
  })
end

function Module:init() end

-- Registers t as parameter `name` (trainable unless opts.frozen).
function Module:param(name, t, frozen)
  t.p.requires_grad = frozen and 0 or 1
  self._params[#self._params + 1] = { name = name, tensor = t }
  self[name] = t
  return t
end

-- Declares that this module also uses t, a parameter registered elsewhere, under `name`
-- (GPT's lm_head.weight on wte's): nothing is registered or counted twice, but wrappers
-- that split the model (shard.fsdp) see both users and keep t in one piece.
function Module:tie(name, t)
  local ties = rawget(self, "_ties")
  if not ties then ties = {}; self._ties = ties end
  ties[#ties + 1] = { name = name, tensor = t }
  return t
end

function Module:child(name, m)
  self._children[#self._children + 1] = { name = name, module = m }
  self[name] = m
  return m
end

-- Replaces a registered child (used by wrappers such as fsdp and checkpointing).
function Module:replace_child(name, m)
  for _, c in ipairs(self._children) do if c.name == name then c.module = m end end
  self[name] = m
end

function Module:children()
  local out = {}
  for i, c in ipairs(self._children) do out[i] = c.module end
  return out
end
-- The children in registration order, each as { name =, module = }: the module's own list, no
-- copy (a forward may walk it every step); read it, change it only through child and
-- replace_child.
function Module:named_children() return self._children end

function Module:named_modules(prefix, out, seen)
  out, seen, prefix = out or {}, seen or {}, prefix or ""
  if seen[self] then return out end
  seen[self] = true
  out[#out + 1] = { name = prefix, module = self }
  for _, c in ipairs(self._children) do
    c.module:named_modules(prefix == "" and c.name or (prefix .. "." .. c.name), out, seen)
  end
  return out
end

function Module:named_parameters(prefix, out, seen)
  out, seen, prefix = out or {}, seen or {}, prefix or ""
  for _, p in ipairs(self._params) do
    if not seen[p.tensor] then
      seen[p.tensor] = true
      out[#out + 1] = { name = prefix == "" and p.name or (prefix .. "." .. p.name), tensor = p.tensor }
    end
  end
  for _, c in ipairs(self._children) do
    c.module:named_parameters(prefix == "" and c.name or (prefix .. "." .. c.name), out, seen)
  end
  return out
end

function Module:parameters()
  local out = {}
  for i, np in ipairs(self:named_parameters()) do out[i] = np.tensor end
  return out
end

function Module:num_params()
  local n = 0
  for _, t in ipairs(self:parameters()) do n = n + t:numel() end
  return n
end

function Module:apply(fn)
  for _, c in ipairs(self._children) do c.module:apply(fn) end
  fn(self)
  return self
end

function Module:train(flag)
  flag = flag == nil or flag
  return self:apply(function(m) m.training = flag end)
end
function Module:eval() return self:train(false) end

function Module:zero_grad(set_to_none)
  for _, t in ipairs(self:parameters()) do t:zero_grad(set_to_none) end
end

function Module:repr(indent)
  indent = indent or ""
  local lines = { (getmetatable(self).__name or "Module") .. (self.extra_repr and ("(" .. self:extra_repr() .. ")") or "") }
  for _, c in ipairs(self._children) do
    lines[#lines + 1] = indent .. "  (" .. c.name .. "): " .. c.module:repr(indent .. "  ")
  end
  return table.concat(lines, "\n")
end

-- Activation checkpointing for every module of the given classes under root: their forward
-- keeps no activations and is re-run during backward (shard.autograd.checkpoint). With
-- opts.keep (selective checkpointing, e.g. { "linear", "attention" }), the outputs of those
-- ops are kept and only the others (norms, activations, residual adds) are recomputed.
function Module.checkpoint(root, classes, opts)
  local A = require("shard.autograd")
  local keep = opts and opts.keep
  A.keep_set(keep)    -- names checked now, not at the first backward
  local set = {}
  for _, c in ipairs(classes) do set[c] = true end
  root:apply(function(m)
    local cls = getmetatable(m)
    if set[cls] then
      local forward = cls.forward
      m.forward = function(self, ...)
        return A.checkpoint_keep(keep, function(...) return forward(self, ...) end, ...)
      end
    end
  end)
  return root
end

-- Creates a parameter-tagged tensor (memory stats count it under "param").
function Module.new_param(shape, opts)
  return memory.with_tag("param", tensor.empty, shape, opts)
end

-- Deferred init. Module.deferred(build, ...) runs build(...) so that the parameters made
-- inside (through Module.init_param) get a shape and a recipe instead of values, and returns
-- build's result and the recipes (tensor -> recipe). The context is open only while build
-- runs (nested calls each get their own; an error closes it too), so nothing outside a
-- deferred build ever sees it.
local recipes_of_build = nil

function Module.deferred(build, ...)
  local outer = recipes_of_build
  local recipes = setmetatable({}, { __mode = "k" })
  recipes_of_build = recipes
  local ok, m = pcall(build, ...)
  recipes_of_build = outer
  if not ok then error(m, 0) end
  return m, recipes
end

-- A parameter of `shape` (f32, default device) whose values recipe(t, start) writes:
-- elements [start, start + numel(t)) of the flattened parameter into t. Eagerly the recipe
-- fills it at once; inside Module.deferred the tensor has no storage and the recipe is kept.
function Module.init_param(shape, recipe)
  for i = 1, table.maxn(shape) do
    local d = shape[i]
    if type(d) ~= "number" or d % 1 ~= 0 or d < 0 then
      error(("parameter shape entry %d is %s; sizes must be whole numbers"):format(i, tostring(d)), 2)
    end
  end
  if recipes_of_build then
    local n, s = tensor.shape_args(shape)
    local t = tensor.new_from(C.sh_tensor_meta, n, s, C.SH_F32, tensor.device_id(tensor.default_device))
    recipes_of_build[t] = recipe
    return t
  end
  local t = Module.new_param(shape)
  recipe(t, 0)
  return t
end

return Module
