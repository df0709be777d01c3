-- shard.fsdp.wrap: fsdp.wrap, which turns the modules a policy picks into units and the root
-- into a unit over what no child holds, with its options (strategy, limits, ignored and
-- frozen parameters, offload, the schedule check); and the sharded init of a deferred build.
local Module = require("shard.nn.module")
local optim = require("shard.optim")
local shard_tensor = require("shard.tensor")
local mesh = require("shard.fsdp.mesh")
local unit = require("shard.fsdp.unit")
local shared = require("shard.fsdp.shared")
local state = require("shard.fsdp.state")
local clip = require("shard.fsdp.clip")
local determ = require("shard.fsdp.determ")

local M = {}
local Unit, is_unit, own_params = unit.Unit, unit.is_unit, unit.own_params
local param_users, split_shared, refuse_split, shared_report =
  shared.param_users, shared.split_shared, shared.refuse_split, shared.shared_report
local CHECK_STEPS = 2

-- tensor -> its dotted name in the model (a tensor held twice: its first holder's name).
local function param_names(module, prefix, out)
  out = out or {}
  for _, p in ipairs(module._params) do
    if not out[p.tensor] then out[p.tensor] = prefix == "" and p.name or (prefix .. "." .. p.name) end
  end
  for _, c in ipairs(module:named_children()) do
    local inner = is_unit(c.module) and c.module.module or c.module
    param_names(inner, prefix == "" and c.name or (prefix .. "." .. c.name), out)
  end
  return out
end

-- CPU offload (opts.offload = { params = true }; runtime/dist/flatparam.h): the unit's shard and
-- sharded grad live in pinned host memory and its optimizer entries step on the CPU. Every
-- sharding strategy takes it; no_shard refuses it (the full model on every rank would be
-- copied to the device twice a step). On the CPU there is nothing to move: accepted, noted
-- once per process on rank 0.
local function check_offload(opts)
  local o = opts.offload
  if o == nil then return end
  if type(o) ~= "table" or (o.params ~= nil and type(o.params) ~= "boolean") then
    error(("fsdp.wrap: offload must be a table such as { params = true }, got %s"):format(
      type(o) == "table" and ("params = " .. tostring(o.params)) or tostring(o)), 0)
  end
  for k in pairs(o) do
    if k ~= "params" then error(("fsdp.wrap: offload has no option '%s' (known: params)"):format(tostring(k)), 0) end
  end
end

-- A policy's answer must be a boolean: Lua would take 0 or "no" as true.
local function wants_unit(policy, module, name, unwrapped)
  local r = policy(module, name, unwrapped)
  if type(r) ~= "boolean" then
    error(("fsdp.wrap: the policy returned %s (%s) for module '%s'; it must return true or false"):format(
      tostring(r), type(r), name), 0)
  end
  return r
end

-- Post-order walk: children first, so a policy sees how many parameters are still unwrapped.
local function apply_policy(module, name, policy, opts, units, users)
  local unwrapped = 0
  for _, p in ipairs(module._params) do unwrapped = unwrapped + p.tensor:numel() end
  for _, c in ipairs(module:named_children()) do
    local child_name = name == "" and c.name or (name .. "." .. c.name)
    if is_unit(c.module) then
      for _, u in ipairs(c.module.all_units or { c.module }) do
        refuse_split(u, child_name, users)
        units[#units + 1] = u
      end
    else
      local n, wrapped = apply_policy(c.module, child_name, policy, opts, units, users)
      if wrapped then
        module:replace_child(c.name, wrapped)
      else
        unwrapped = unwrapped + n
      end
    end
  end
  -- containers that are never called (ModuleList) cannot hook a forward, so never become units
  if name ~= "" and policy and not module.container and wants_unit(policy, module, name, unwrapped) then
    local keep, left = split_shared(own_params(module), name, users)
    local u = Unit(module, name, opts, nil, keep, left)
    units[#units + 1] = u
    return 0, u
  end
  return unwrapped, nil
end

-- A schedule limit: a whole number >= least, default when absent.
local function limit_option(opts, name, default, least)
  local v = opts[name]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= math.floor(v) or v < least then
    error(("fsdp.wrap: %s = %s; expected a whole number >= %d"):format(name, tostring(v), least), 0)
  end
  return v
end

-- opts.ignored_params (tensors) and opts.ignored_modules (modules: all their parameters): a
-- set, and the list in the model's parameter order (the same on every rank: their grads are
-- all-reduced in that order).
local function ignored_params(model, opts)
  local set, any = {}, false
  for i, t in ipairs(opts.ignored_params or {}) do
    if not shard_tensor.is_tensor(t) then
      error(("fsdp.wrap: ignored_params[%d] is a %s, not a parameter tensor"):format(i, type(t)), 3)
    end
    set[t], any = true, true
  end
  for i, m in ipairs(opts.ignored_modules or {}) do
    if type(m) ~= "table" or not m._params then
      error(("fsdp.wrap: ignored_modules[%d] is a %s, not a module"):format(i, type(m)), 3)
    end
    for _, t in ipairs(m:parameters()) do set[t], any = true, true end
  end
  if not any then return nil, {} end
  local list, known = {}, {}
  for _, np in ipairs(model:named_parameters()) do
    known[np.tensor] = true
    if set[np.tensor] then list[#list + 1] = np.tensor end
  end
  for t in pairs(set) do
    if not known[t] then error(("fsdp.wrap: an ignored parameter (%s) is not a parameter of the model"):format(t:describe()), 3) end
  end
  return set, list
end

-- fsdp.wrap's arguments, checked (errors name wrap's caller); returns opts, {} when absent.
local function checked_args(model, opts)
  if type(model) ~= "function" and not (type(model) == "table" and getmetatable(model) and model._params) then
    error("fsdp.wrap: expected a module (or a function that builds one), got " .. type(model), 3)
  end
  if opts ~= nil and type(opts) ~= "table" then error("fsdp.wrap: opts must be a table, got " .. type(opts), 3) end
  opts = opts or {}
  check_offload(opts)
  determ.check_wrap(opts)
  if opts.policy ~= nil and type(opts.policy) ~= "function" then
    error(("fsdp.wrap: policy must be a function (module, name, unwrapped) -> boolean, such as " ..
           "fsdp.policy.transformer{ nn.Block }; got %s %s"):format(type(opts.policy), tostring(opts.policy)), 3)
  end
  return opts
end

-- The root unit over what no unit below holds, and the model's tables it keeps: its units (all
-- of them, frozen companions included, each numbered by uid), the ignored parameters, the
-- parameters' names and the schedule's limits.
local function make_root(model, opts, units, ignored)
  local root = Unit(model, "", opts, nil)
  root.units = units
  root.ignored = ignored
  root.is_root = true
  root.prefetch_depth = limit_option(opts, "prefetch", 1, 0)
  root.reduces_in_flight = limit_option(opts, "reduces_in_flight", 2, 1)
  root.gather_limit = limit_option(opts, "limit_all_gathers", nil, 1)
  root.all_units = {}
  for _, u in ipairs { root, unpack(units) } do
    u.root = root
    root.all_units[#root.all_units + 1] = u
    if u.frozen_part then u.frozen_part.root = root; root.all_units[#root.all_units + 1] = u.frozen_part end
  end
  root.names = param_names(model, "")
  for i, u in ipairs(root.all_units) do u.uid = i - 1 end
  return root
end

-- The schedule check's communicator and buffers (fsdp/schedule.lua), when it is on: the
-- check_schedule option, else SHARD_FSDP_CHECK, else the first CHECK_STEPS backward passes.
local function setup_schedule_check(root, opts)
  local check = opts.check_schedule
  if check == nil and os.getenv("SHARD_FSDP_CHECK") then check = os.getenv("SHARD_FSDP_CHECK") == "1" end
  local w = mesh.world()
  if check == nil then
    -- by default the first CHECK_STEPS backward passes of a CPU run: where a model's structure
    -- makes ranks diverge (a unit used on some ranks only), it shows at once, for a few small
    -- exchanges; not in a dry run (one rank of a world that cannot split arbitrarily)
    check = shard_tensor.default_device == "cpu" and w:backend() ~= "dry"
    root.check_until = CHECK_STEPS
  end
  if check and w:size() > 1 then
    root.check_group = w:split(0, w:rank(), "fsdp schedule check"):set_counted(false)
    root.check_mine = shard_tensor.zeros({ 3 }, { dtype = "f64", device = "cpu" })
    root.check_all = shard_tensor.zeros({ 3 * w:size() }, { dtype = "f64", device = "cpu" })
  end
end

-- Wraps model; returns the root unit (any field it lacks comes from the model).
-- Given a constructor instead of a model, builds it under deferred init: no rank ever holds
-- the full parameters, and each fills its shard with the values an eager init would give.
function M.wrap(model, opts)
  opts = checked_args(model, opts)
  local recipes
  if type(model) == "function" then model, recipes = Module.deferred(model) end
  if opts.sync_module_states then M.sync_module_states(model) end
  if opts.checkpoint then Module.checkpoint(model, opts.checkpoint, { keep = opts.checkpoint_keep }) end
  local ignored_set, ignored = ignored_params(model, opts)
  if ignored_set then opts = setmetatable({ ignored_set = ignored_set }, { __index = opts }) end
  local units = {}
  local users = param_users(model, "")
  apply_policy(model, "", opts.policy, opts, units, users)
  local root = make_root(model, opts, units, ignored)
  setup_schedule_check(root, opts)
  root.shared = shared_report(root, users)
  root.clip_state = optim.clip_buffers(clip.clip_device(root))
  M.init_shards(root, recipes)
  return root
end

-- Broadcasts rank 0's parameters to every rank (before wrapping).
function M.sync_module_states(model)
  local w = mesh.world()
  for _, t in ipairs(model:parameters()) do w:broadcast(t, 0) end
end

---------------------------------------------------------------------------------------------
-- sharded init: parameters created under a deferred build (Module.deferred) hold no storage,
-- only a recipe (normal with its generator counters, or a constant); each rank draws just
-- its own slice, which gives the same values as drawing the whole tensor. recipes: the
-- build's tensor -> recipe table (nil: nothing to do).

function M.init_shards(root, recipes)
  if not recipes then return end
  for _, sl in ipairs(state.local_slices(root)) do
    local recipe = recipes[sl.tensor]
    if recipe and not sl.whole and sl.count > 0 then
      local view = sl:view()
      recipe(view, sl.start)
      view:free()
    end
  end
end

return M
