-- shard.fsdp: fully sharded data parallel training over FlatParameters.
--   local model = fsdp.wrap(nn.GPT(cfg), { policy = fsdp.policy.transformer{ nn.Block },
--                                         strategy = "full_shard" })
-- wrap() turns the modules the policy picks into units (each one FlatParameter over its
-- parameters) and the root into a unit over what no child holds. Units hook forward and push
-- marker nodes on the autograd tape, which drive the step as DESIGN.md lays it out:
--   forward   pre: unshard (wait a prefetch), prefetch the next unit; post: reshard
--   backward  pre: unshard, prefetch the previous unit; post: reduce-scatter grads, reshard
-- Limits on what is in flight (shard.memory.stats().in_flight shows them): prefetch = N
-- units gathered ahead of the one computing (default 1, 0 = none), limit_all_gathers = K
-- (FSDP1's rate limiter: no prefetch starts while K of the model's FlatParameters are
-- gathered, the computing unit's included; default none), forward_prefetch = false (gather
-- each unit only when its forward runs; backward_prefetch = false likewise),
-- reduces_in_flight = N flat grads reducing at once (default 2).
-- Strategies: full_shard (ZeRO-3), shard_grad_op (ZeRO-2: keep full params from forward to
-- backward), no_shard (DDP: all-reduce), hybrid_shard / hybrid_shard_zero2 (shard within
-- groups of hybrid_group ranks, or within each node with hybrid_group = "node", the default;
-- all-reduce across the groups).
-- offload = { params = true }: every unit's shard, sharded grad and AdamW state live in host
-- memory (pinned for the first two); the shard is copied to the device before each gather
-- and the grad back after each reduction, on their own streams, and the optimizer steps unit
-- by unit on the CPU (runtime/flatparam.h, offload_unit below). Sharding strategies only.
-- Shared parameters stay with the closest unit over all their users (split_shared below).
-- ignored_params / ignored_modules: left out of every FlatParameter, replicated on every
-- rank, their grads all-reduced at the end of the backward (none when frozen). Frozen and
-- trainable parameters in one unit: two FlatParameters (split_frozen). Accumulation over
-- micro-batches: fsdp.no_sync, set_requires_gradient_sync, set_requires_all_reduce.
-- check_schedule: the ranks compare where they are before each unit's collectives (a small
-- all-gather each) and name a unit some ranks skipped, instead of failing in the collective
-- or, where the buffers have the same size, averaging different units' gradients without a
-- word. true (or SHARD_FSDP_CHECK=1): every step; false (SHARD_FSDP_CHECK=0): never; not set:
-- the first CHECK_STEPS backward passes of a CPU run (a divergence the model's structure
-- causes shows there; one that depends on the data, later, needs true).
local A = require "shard.autograd"
local Module = require "shard.nn.module"
local optim = require "shard.optim"
local comm = require "shard.comm"
local flatparam = require "shard.flatparam"
local shard_tensor = require "shard.tensor"

local state = require "shard.fsdp.state"

local fsdp = { policy = require "shard.fsdp.policy" }
local CHECK_STEPS = 2

local STRATEGIES = {
  full_shard = { shard = true, reshard_after_forward = true },
  shard_grad_op = { shard = true, reshard_after_forward = false },
  no_shard = { shard = false, reshard_after_forward = false },
  hybrid_shard = { shard = true, reshard_after_forward = true, hybrid = true },
  hybrid_shard_zero2 = { shard = true, reshard_after_forward = false, hybrid = true },
}
fsdp.STRATEGIES = STRATEGIES

---------------------------------------------------------------------------------------------
-- process groups

-- The world group (shard.comm's).
function fsdp.world() return comm.world() end

local mesh_cache = {}
-- Shard and replicate groups for hybrid sharding. G ranks: shard groups of G consecutive
-- ranks, replicate groups of the ranks at the same place in each. G = "node": a shard group
-- is the ranks of one node, wherever the launcher numbered them (mpirun --map-by node, srun's
-- cyclic distribution), and a replicate group the ranks with the same local rank, one per
-- node, so that only the all-reduce crosses nodes.
local function hybrid_mesh(G)
  if mesh_cache[G] then return mesh_cache[G] end
  local w = fsdp.world()
  local rank, size = w:rank(), w:size()
  local mesh
  if G == "node" then
    if not w:nodes_uniform() then
      error(("fsdp: hybrid_group = \"node\" needs the same number of ranks on every node; rank %d's node %s (%d of %d) runs %d of the world's %d"):format(
        rank, w:node_name(), w:node(), w:nodes(), w:local_size(), size), 0)
    end
    local node, lr = w:node(), w:local_rank()
    mesh = { shard = w:split_node(("shard group node %d (%s)"):format(node, w:node_name())),
             replicate = w:split(lr, node, ("replicate group local rank %d"):format(lr)) }
  elseif type(G) ~= "number" or G < 1 or G % 1 ~= 0 then
    error(("fsdp: hybrid_group is %s; expected \"node\" or a whole number of ranks (rank %d)"):format(
      type(G) == "string" and ("'" .. G .. "'") or tostring(G), rank), 0)
  elseif size % G ~= 0 then
    error(("fsdp: world size %d is not a multiple of the hybrid group size %d (rank %d)"):format(size, G, rank), 0)
  else
    mesh = { shard = w:split(math.floor(rank / G), rank % G, ("shard group %d"):format(math.floor(rank / G))),
             replicate = w:split(rank % G, math.floor(rank / G), ("replicate group %d"):format(rank % G)) }
  end
  mesh_cache[G] = mesh
  return mesh
end
fsdp.hybrid_mesh = hybrid_mesh

---------------------------------------------------------------------------------------------
-- the unit

local Unit = Module:extend("FSDPUnit")
fsdp.Unit = Unit
-- A wrapped root has its own metatable, so units are told by a field, not the metatable.
local function is_unit(m) return rawget(m, "fsdp_unit") == true end

-- Parameters the module holds outside any unit below it, in registration order (tied ones
-- appear once per holder; the FlatParameter stores a repeated tensor once), and those a unit
-- below left to its ancestors because one of their users lies outside it.
local function own_params(module, out)
  out = out or {}
  for _, p in ipairs(module._params) do
    out[#out + 1] = p.tensor
  end
  for _, c in ipairs(module._children) do
    if not is_unit(c.module) then own_params(c.module, out)
    else for _, t in ipairs(c.module.left or {}) do out[#out + 1] = t end end
  end
  return out
end

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
  for _, c in ipairs(module._children) do
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

local function param_names(module, prefix, out)
  out = out or {}
  for _, p in ipairs(module._params) do
    if not out[p.tensor] then out[p.tensor] = prefix == "" and p.name or (prefix .. "." .. p.name) end
  end
  for _, c in ipairs(module._children) do
    local inner = is_unit(c.module) and c.module.module or c.module
    param_names(inner, prefix == "" and c.name or (prefix .. "." .. c.name), out)
  end
  return out
end

-- CPU offload (opts.offload = { params = true }; runtime/flatparam.h): the unit's shard and
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

local function offload_unit(u)
  local label = u.name == "" and "(root)" or u.name
  if not u.mode.shard then
    error(("fsdp: unit %s: offload = { params = true } needs a sharding strategy (full_shard, shard_grad_op, " ..
           "hybrid_shard, hybrid_shard_zero2); %s keeps the full parameters on every rank, which offload " ..
           "would copy to the device twice a step"):format(label, u.strategy), 0)
  end
  local ok, moved = pcall(u.fp.set_offload, u.fp)
  if not ok then error(("fsdp: unit %s: %s"):format(label, tostring(moved)), 0) end
  u.offload = moved
  if not moved and not fsdp.offload_noted then
    fsdp.offload_noted = true
    if fsdp.world():rank() == 0 then
      io.stderr:write("fsdp: offload = { params = true } on the CPU backend: the parameters already live in host memory; nothing to move\n")
    end
  end
end

-- Where the root keeps its clip's norm and coefficient (made at wrap, so the first clip
-- allocates nothing mid-step): on the units' device, the all-reduced part's; under offload on
-- the host, where the CPU optimizer reads the coefficient.
local function clip_device(root)
  for _, u in ipairs(root.all_units) do
    if u.fp then return u.offload and "cpu" or u.fp:info().device end
  end
  return shard_tensor.default_device
end

-- ignored_params / ignored_modules (wrap options) stay out of every FlatParameter.
local function without_ignored(params, ignored)
  if not ignored then return params end
  local out = {}
  for _, t in ipairs(params) do if not ignored[t] then out[#out + 1] = t end end
  return out
end

-- Frozen and trainable parameters in one unit (LoRA-style) go to two FlatParameters: the
-- frozen ones' (a companion unit, `frozen_part`) is gathered and resharded with the unit's and
-- never reduced, so no frozen gradient is computed (the backward formulas skip inputs that do
-- not require grad) nor sent (a shared flat buffer would reduce-scatter their zeros).
local function split_frozen(params)
  local trainable, frozen = {}, {}
  for _, t in ipairs(params) do
    if t.p.requires_grad ~= 0 then trainable[#trainable + 1] = t else frozen[#frozen + 1] = t end
  end
  return trainable, frozen
end

function Unit:init(module, name, opts, root, params, left)
  self.fsdp_unit = true
  self.left = left
  self:child("module", module)
  -- a unit stands where its module stood: fields it does not have come from the module
  local mt = {}
  for k, v in pairs(getmetatable(self)) do mt[k] = v end
  mt.__index = function(_, k) local v = Unit[k]; if v ~= nil then return v end; return module[k] end
  setmetatable(self, mt)
  self.name, self.opts, self.root = name, opts, root or self
  local strategy = opts.strategy_for and opts.strategy_for(module, name) or opts.strategy or "full_shard"
  self.strategy = strategy
  self.mode = STRATEGIES[strategy]
  if not self.mode then
    local known = {}
    for k in pairs(STRATEGIES) do known[#known + 1] = k end
    table.sort(known)
    error(("fsdp: unknown strategy '%s' for unit %s (known: %s)"):format(tostring(strategy), name, table.concat(known, ", ")), 0)
  end
  local group, replicate = fsdp.world(), nil
  if self.mode.hybrid then
    local mesh = hybrid_mesh(opts.hybrid_group or "node")
    group, replicate = mesh.shard, mesh.replicate
    -- one replica (hybrid on one node): the all-reduce across replicas would be a copy
    if replicate and replicate:size() == 1 then replicate = nil end
  end
  self.group, self.replicate = group, replicate
  self.params = without_ignored(params or own_params(module), opts.ignored_set)
  self.info = { numel = 0, padded_numel = 0, shard_numel = 0, padding = 0 }
  if #self.params == 0 then return end    -- a root whose children hold everything: hooks only
  local trainable, frozen = split_frozen(self.params)
  self.trainable = #trainable > 0
  if self.trainable and #frozen > 0 then
    self.params = trainable
    self.frozen_part = Unit(module, name .. " (frozen)", opts, root, frozen)
  end
  local mp = opts.mixed_precision or {}
  -- Gradients are reduced in f32 unless `reduce` says otherwise, even when the parameters
  -- compute in bf16/f16: a sum over N ranks in bf16 loses bits as N grows (each partial sum
  -- is rounded to 8 bits of mantissa), which is how low-precision reductions drift at scale.
  local reduce = mp.reduce or (mp.param and "f32") or nil
  local fp, err = flatparam.create(self.params, { group = group, param = mp.param, reduce = reduce,
                                                  no_shard = not self.mode.shard })
  if not fp then error(("fsdp: unit %s: %s"):format(name == "" and "(root)" or name, err), 0) end
  self.fp = fp
  if opts.offload and opts.offload.params then offload_unit(self) end
  local i = fp:info()
  self.info = { numel = i.numel, padded_numel = i.padded_numel, shard_numel = i.shard_numel, padding = i.padding }
end

function Unit:numel() return self.info.numel end

-- The gather state is the FlatParameter's (fp:state()); these only say what the schedule
-- wants. unshard waits for a prefetch or gathers now; prefetch starts a gather unless one
-- is started or done; reshard frees the full parameters of a sharded unit, or a prefetch
-- (under offload the optimizer prefetches the next step's first units: a checkpoint loaded
-- after it reshards every unit, so that the next forward gathers the loaded shards).
function Unit:unshard()
  if self.fp then self.fp:unshard() end
  if self.frozen_part then self.frozen_part:unshard() end
end
function Unit:prefetch()
  if self.fp then self.fp:unshard_start() end
  if self.frozen_part then self.frozen_part:prefetch() end
end
function Unit:reshard()
  if self.fp and (self.mode.shard or self:casts()) and self.fp:state() ~= "sharded" then self.fp:reshard() end
  if self.frozen_part then self.frozen_part:reshard() end
end

-- Under no_shard the full parameters are the shard itself, or, in mixed precision, a copy in
-- the compute dtype: that copy must go after the backward, so that the next forward casts the
-- master weights the optimizer has updated since.
function Unit:casts()
  local i = self.fp:info()
  return i.param_dtype ~= i.master_dtype
end

-- The schedule check (wrap option check_schedule, or SHARD_FSDP_CHECK=1). Every rank must run
-- the same units in the same order: a unit skipped on some ranks (a branch, an expert that got
-- no tokens) leaves the others in an all-gather or a reduce-scatter the skipping ranks never
-- issue, which MPI reports as a truncated message or never returns. With the check, before
-- each unit's forward, pre-backward and post-backward (the points where its collectives are
-- issued) the ranks exchange (phase, unit, step) on a communicator of their own, where every
-- message has the same size, so a divergence is named at once on every rank, before any
-- collective of the model's waits. It costs one small blocking all-gather per unit and phase
-- (and they show in shard.comm's process-wide counts). The step it names counts the root's
-- forward calls, evaluation ones included.
local PHASES = { "forward", "pre-backward", "post-backward" }

local function unit_label(root, uid)
  local u = root.all_units[uid + 1]
  return ("unit %d (%s)"):format(uid, u and (u.name == "" and "root" or u.name) or "?")
end

local function check_schedule(self, phase)
  local root = self.root
  local g = root.check_group
  if not g or (root.check_until and (root.backwards or 0) >= root.check_until) then return end
  local mine = root.check_mine
  mine:fill_(0)
  local tag = { phase, self.uid, root.step }
  for i = 1, 3 do mine:set({ i }, tag[i]) end
  g:all_gather(root.check_all, mine)
  local all, n = root.check_all:tolist_flat(), g:size()
  local same = true
  for r = 1, n - 1 do
    for i = 1, 3 do if all[3 * r + i] ~= all[i] then same = false end end
  end
  if same then return end
  -- the rank(s) earliest in the step (step, then phase) name the unit the others skipped
  local function key(r) return all[3 * r + 3] * 10 + all[3 * r + 1] end
  local first = 0
  for r = 1, n - 1 do if key(r) < key(first) then first = r end end
  local at, others, where = {}, {}, {}
  for r = 0, n - 1 do
    local same_tag = all[3 * r + 1] == all[3 * first + 1] and all[3 * r + 2] == all[3 * first + 2] and all[3 * r + 3] == all[3 * first + 3]
    if same_tag then at[#at + 1] = r else others[#others + 1] = r end
    where[#where + 1] = ("rank %d: step %d, %s of %s"):format(r, all[3 * r + 3], PHASES[all[3 * r + 1]], unit_label(root, all[3 * r + 2]))
  end
  local ph, uid, step = all[3 * first + 1], all[3 * first + 2], all[3 * first + 3]
  A.clear()    -- the step is abandoned: a caller that goes on starts from an empty tape
  root.pending_reduces = {}
  local verb = ph == 1 and "ran its forward" or (ph == 2 and "began its backward" or "produced its gradient")
  error(("fsdp: %s %s on rank%s %s but not on rank%s %s at step %d: every rank must run the same units in " ..
         "the same order (a unit used on some ranks only must still be called on the others, e.g. on an " ..
         "empty batch or with its output times 0). Where each rank is: %s"):format(
    unit_label(root, uid), verb, #at > 1 and "s" or "", table.concat(at, ", "), #others > 1 and "s" or "",
    table.concat(others, ", "), step, table.concat(where, "; ")), 0)
end

-- Units of this model whose full parameters exist (gathered or gathering); a no_shard unit's
-- full parameters are its shard, so it never counts.
local function gathered(root)
  local n = 0
  for _, u in ipairs(root.all_units) do
    if u.fp and u.mode.shard and u.fp:state() ~= "sharded" then n = n + 1 end
  end
  return n
end

-- Starts u's gather ahead of its use unless limit_all_gathers units are gathered already
-- (then u gathers when it runs, as without prefetch).
local function try_prefetch(root, u)
  if u.fp and u.fp:state() ~= "sharded" then return end
  if root.gather_limit and gathered(root) >= root.gather_limit then return end
  u:prefetch()
end

function Unit:forward(...)
  local root = self.root
  if self == root then root.step = (root.step or 0) + 1 end
  check_schedule(self, 1)
  if self == root then root.recording_order = root.order == nil; root.order = root.order or {} end
  local order = root.order
  if root.recording_order then order[#order + 1] = self; self.index = #order end
  self:unshard()
  if not root.recording_order and root.opts.forward_prefetch ~= false then
    for k = 1, root.prefetch_depth do
      local nxt = order[(self.index or 0) + k]
      if nxt and nxt.mode.reshard_after_forward then try_prefetch(root, nxt) end
    end
  end
  local recording = A.grad_enabled
  if recording then A.marker(function() self:post_backward() end, "fsdp post-backward " .. self.name) end
  local out = self.module(...)
  if self ~= root and self.mode.reshard_after_forward then self:reshard() end
  if recording then A.marker(function() self:pre_backward() end, "fsdp pre-backward " .. self.name) end
  if self == root then
    root.recording_order = false
    if not recording then for _, u in ipairs(order) do u:reshard() end end
  end
  return out
end

function Unit:pre_backward()
  check_schedule(self, 2)
  self:unshard()
  if self.fp and self.trainable then self.fp:prepare_grads() end
  if self.root.opts.backward_prefetch ~= false then
    for k = 1, self.root.prefetch_depth do
      local prev = self.root.order[(self.index or 1) - k]
      if prev then try_prefetch(self.root, prev) end
    end
  end
end

-- Gradient reductions run asynchronously behind the rest of the backward: at most
-- reduces_in_flight units' flat grads are alive at once, and the root's post-backward (the
-- last marker of the backward) finishes all of them. On a GPU "finishing" queues the rest
-- of a reduction on its own stream and frees its buffers in that stream's order: the host
-- never waits, and the bound keeps the memory of reductions the same every step.

-- A hybrid unit whose inner micro-batches skipped the all-reduce across replicas
-- (set_requires_all_reduce(false)) all-reduces its whole accumulated sharded grad once, after
-- the synced micro-batch's reduce-scatter has landed in it: the sum is linear, so that equals
-- all-reducing every micro-batch's part.
local function all_reduce_owed(u)
  if not u.all_reduce_now then return end
  local g = u.fp:grad_shard()
  u.replicate:all_reduce(g, "avg")
  g:free()
  u.all_reduce_now, u.replica_owed = false, false
end

local function wait_reduces(root, keep)
  local pending = root.pending_reduces
  while #pending > keep do
    local u = table.remove(pending, 1)
    u.fp:reduce_grad_wait()
    all_reduce_owed(u)
  end
end

-- Ignored parameters are replicated on every rank: their grads are averaged over the world at
-- the end of the backward, one all-reduce each, in the same order everywhere (a rank that
-- gave one no gradient sends zeros). Frozen ones have no grad and are skipped.
local function reduce_ignored(root)
  local w = fsdp.world()
  for _, t in ipairs(root.ignored) do
    if t.p.requires_grad ~= 0 then
      if t.p.grad == nil then
        local z = shard_tensor.zeros(t:shape(), { dtype = t:dtype(), device = t:device() })
        shard_tensor.set_grad(t, z)
        z:free()
      end
      if w:size() > 1 then w:all_reduce(shard_tensor.borrow(t.p.grad), "avg") end
    end
  end
end

-- Gradient accumulation (see fsdp.no_sync below): what this backward's post-backward does.
-- Sync off: nothing; the unsharded grads stay on the parameters and the next backward adds
-- into them. All-reduce off (hybrid): reduce-scatter into the sharded grad, no all-reduce.
local function reduce_unit_grads(self, root)
  if root.sync_grads == false then
    self.unsynced = true
    return
  end
  wait_reduces(root, root.reduces_in_flight - 1)
  local replicate = self.replicate
  if replicate and (root.sync_all_reduce == false or self.replica_owed) then
    self.replica_owed = true
    self.all_reduce_now = root.sync_all_reduce ~= false
    replicate = nil
  end
  self.fp:reduce_grad_start("avg", replicate)
  self.unsynced = false
  table.insert(root.pending_reduces, self)
end

function Unit:post_backward()
  local root = self.root
  root.pending_reduces = root.pending_reduces or {}
  check_schedule(self, 3)
  if self.fp then
    if self.trainable then reduce_unit_grads(self, root) end
    self:reshard()
  end
  if self == root then
    wait_reduces(root, 0)
    if root.sync_grads ~= false then reduce_ignored(root) end
    root.backwards = (root.backwards or 0) + 1
  end
end

-- Gradient accumulation over micro-batches, three ways (each equals one large batch when
-- every micro-batch's loss is scaled by 1/K):
--   default: every backward reduce-scatters (and, hybrid, all-reduces) into the sharded grad,
--     which accumulates: the least memory (a shard of grads), K times the communication.
--   fsdp.no_sync(model, fn) / model:set_requires_gradient_sync(false) (FSDP1's no_sync,
--     FSDP2's method of that name): backwards skip every reduction; each unit's unsharded
--     grads stay alive and accumulate locally (a full copy of the grads per rank), and the
--     first backward with sync on reduces the sum once.
--   model:set_requires_all_reduce(false) (hybrid): reduce-scatter every micro-batch within
--     the shard group, all-reduce across replicas once, at the first backward with it on.
-- The optimizer, clipping and grad_norm refuse grads that are still owed a reduction.
function Unit:set_requires_gradient_sync(flag) self.root.sync_grads = flag ~= false; return self end
function Unit:set_requires_all_reduce(flag) self.root.sync_all_reduce = flag ~= false; return self end

local function restore_sync(root, was, ok, ...)
  root.sync_grads = was
  if not ok then error((...), 0) end
  return ...
end

-- Runs fn(...) with gradient sync off (FSDP1's no_sync context); the previous setting is
-- back afterwards, whether fn returns or raises. The backward that syncs runs outside it.
function fsdp.no_sync(model, fn, ...)
  local root = type(model) == "table" and rawget(model, "fsdp_unit") and model.root
  if not root then error("fsdp.no_sync: expected a model returned by fsdp.wrap, got " .. type(model), 2) end
  if type(fn) ~= "function" then error("fsdp.no_sync: expected a function to run without gradient sync, got " .. type(fn), 2) end
  local was = root.sync_grads
  root.sync_grads = false
  return restore_sync(root, was, pcall(fn, ...))
end

function Unit:named_parameters(prefix, out, seen) return self.module:named_parameters(prefix, out, seen) end

---------------------------------------------------------------------------------------------
-- wrap

-- A policy's answer must be a boolean: Lua would take 0 or "no" as true.
local function wants_unit(policy, module, name, unwrapped)
  local r = policy(module, name, unwrapped)
  if type(r) ~= "boolean" then
    error(("fsdp.wrap: the policy returned %s (%s) for module '%s'; it must return true or false"):format(
      tostring(r), type(r), name), 0)
  end
  return r
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

-- Post-order walk: children first, so a policy sees how many parameters are still unwrapped.
local function apply_policy(module, name, policy, opts, units, users)
  local unwrapped = 0
  for _, p in ipairs(module._params) do unwrapped = unwrapped + p.tensor:numel() end
  for _, c in ipairs(module._children) do
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

-- Wraps model; returns the root unit (any field it lacks comes from the model).
-- Given a constructor instead of a model, builds it under deferred init: no rank ever holds
-- the full parameters, and each fills its shard with the values an eager init would give.
function fsdp.wrap(model, opts)
  if type(model) ~= "function" and not (type(model) == "table" and getmetatable(model) and model._params) then
    error("fsdp.wrap: expected a module (or a function that builds one), got " .. type(model), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error("fsdp.wrap: opts must be a table, got " .. type(opts), 2) end
  opts = opts or {}
  check_offload(opts)
  if opts.policy ~= nil and type(opts.policy) ~= "function" then
    error(("fsdp.wrap: policy must be a function (module, name, unwrapped) -> boolean, such as " ..
           "fsdp.policy.transformer{ nn.Block }; got %s %s"):format(type(opts.policy), tostring(opts.policy)), 2)
  end
  local recipes
  if type(model) == "function" then model, recipes = Module.deferred(model) end
  if opts.sync_module_states then fsdp.sync_module_states(model) end
  if opts.checkpoint then Module.checkpoint(model, opts.checkpoint, { keep = opts.checkpoint_keep }) end
  local ignored_set, ignored = ignored_params(model, opts)
  if ignored_set then opts = setmetatable({ ignored_set = ignored_set }, { __index = opts }) end
  local units = {}
  local users = param_users(model, "")
  apply_policy(model, "", opts.policy, opts, units, users)
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
  local check = opts.check_schedule
  if check == nil and os.getenv("SHARD_FSDP_CHECK") then check = os.getenv("SHARD_FSDP_CHECK") == "1" end
  local w = fsdp.world()
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
  root.shared = shared_report(root, users)
  root.clip_state = optim.clip_buffers(clip_device(root))
  fsdp.init_shards(root, recipes)
  return root
end

-- Broadcasts rank 0's parameters to every rank (before wrapping).
function fsdp.sync_module_states(model)
  local w = fsdp.world()
  for _, t in ipairs(model:parameters()) do w:broadcast(t, 0) end
end

---------------------------------------------------------------------------------------------
-- sharded init: parameters created under a deferred build (Module.deferred) hold no storage,
-- only a recipe (normal with its generator counters, or a constant); each rank draws just
-- its own slice, which gives the same values as drawing the whole tensor. recipes: the
-- build's tensor -> recipe table (nil: nothing to do).

function fsdp.init_shards(root, recipes)
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

---------------------------------------------------------------------------------------------
-- the step's other half: optimizer entries, zero_grad, clipping, summary

-- After an offloaded unit's update on the CPU: when it is one of the units the next forward
-- gathers first (the root and the `prefetch` after it), its copy to the device and its gather
-- start now, behind the rest of the optimizer step; the forward then finds them under way.
local function prefetch_next_step(u)
  local root = u.root
  if root.order and u.index and u.index <= 1 + root.prefetch_depth then u:prefetch() end
end

-- One optimizer entry per parameter slice a unit owns on this rank: the shard view (updated
-- in place), its grad (the matching slice of the sharded grad), nanoGPT's decay rule (dims
-- >= 2), and where the slice starts in the parameter.
local function unit_entries(u, names, entries)
  local fp = u.fp
  state.each_stored(u, function(i, t, slot)
    if not slot.frozen and slot.own_numel > 0 then
      local off, n = slot.shard_offset, slot.own_numel
      entries[#entries + 1] = {
        tensor = fp:shard_view(i),
        decay = t.p.ndim >= 2,
        name = names and names[t],
        start = slot.own_start,
        -- offloaded units step one after another on the CPU, each after its own grad landed
        group = u.offload and u or nil,
        after_step = u.offload and function() prefetch_next_step(u) end or nil,
        grad = function()
          if u.unsynced or u.replica_owed then
            error(("fsdp: unit %s still owes its gradients a %s (accumulation with %s); run the last micro-batch's " ..
                   "backward with sync on before the optimizer or clipping reads them"):format(
              u.name == "" and "(root)" or u.name, u.unsynced and "reduction" or "all-reduce across replicas",
              u.unsynced and "gradient sync off" or "all-reduce off"), 0)
          end
          local g = fp:grad_shard()
          if not g then return nil end
          local v = g:narrow(1, off + 1, n)
          g:free()
          return v
        end,
      }
    end
  end)
  return entries
end

-- Entries for the trainable ignored parameters: the whole tensor (an alias the caller frees;
-- each rank updates its replica with the same averaged grad) and an alias of its grad.
local function ignored_entries(root, entries)
  for _, t in ipairs(root.ignored or {}) do
    if t.p.requires_grad ~= 0 then
      entries[#entries + 1] = {
        tensor = t:alias(), decay = t:dim() >= 2, name = root.names[t], start = 0,
        grad = function() return t.p.grad ~= nil and shard_tensor.borrow(t.p.grad):alias() or nil end,
      }
    end
  end
  return entries
end

function Unit:optim_groups()
  local entries = {}
  for _, u in ipairs(self.all_units) do unit_entries(u, self.names, entries) end
  return ignored_entries(self, entries)
end

-- Also drops what accumulation left owed: unsharded grads kept with sync off, and a hybrid
-- unit's pending all-reduce (its sharded grad is gone).
function Unit:zero_grad(set_to_none)
  for _, u in ipairs(self.all_units or { self }) do
    if u.fp then u.fp:zero_grad(set_to_none ~= false) end
    if u.unsynced then u.fp:drop_local_grads() end
    u.unsynced, u.replica_owed = false, false
  end
  self.root.clip_owed = false
  for _, t in ipairs(self.root.ignored or {}) do t:zero_grad(set_to_none) end
end

-- t on device, t freed.
local function moved(t, device)
  local d = t:to(device)
  t:free()
  return d
end

-- Under offload the sharded grads are on the host, so is their norm's part: it goes to the
-- units' device for the all-reduce, which then runs where it runs without offload (a CPU
-- collective needs MPI, absent under a torchrun-style launch).
local function offload_part_to_device(root, t)
  for _, u in ipairs(root.all_units) do
    if u.offload then return moved(t, u.fp:info().device) end
  end
  return t
end

-- The norm part of every sharded gradient as a tensor on the device: one part summed there,
-- one all-reduce over the world, nothing read; each unit's gradients are weighted by
-- 1/(number of replicas of its shards) so replicated shards count once.
function Unit:grad_norm_part(norm_type)
  local w = fsdp.world()
  local world_size = w:size()
  local grads, weights = {}, {}
  local function add(entries, replicas)
    for _, e in ipairs(entries) do
      local g = e.grad()
      if g then grads[#grads + 1] = g; weights[#grads] = 1 / replicas end
      e.tensor:free()
    end
  end
  for _, u in ipairs(self.all_units) do
    add(unit_entries(u, nil, {}), world_size / (u.mode.shard and u.group:size() or 1))
  end
  add(ignored_entries(self, {}), world_size)
  local t = optim.norm_part_tensor(grads, norm_type, weights)
  for _, g in ipairs(grads) do g:free() end
  t = offload_part_to_device(self, t)
  w:all_reduce(t, norm_type == math.huge and "max" or "sum")
  return t
end

-- The total norm as a number: one read.
function Unit:grad_norm(norm_type)
  norm_type = norm_type or 2
  local t = self:grad_norm_part(norm_type)
  local part = t:item()
  t:free()
  return norm_type == 2 and math.sqrt(part) or part
end

-- Clips by the total norm without waiting for it: the coefficient min(1, max_norm / (norm +
-- 1e-6)) stays in a buffer of the root's, and the optimizer's next step multiplies the
-- gradients by it as it reads them (AdamW in its gradient scale: no pass over the gradients
-- here; they stay unscaled until then). Under offload the all-reduced part is read to the
-- host (the step's one read of it) and the coefficient formed there. Returns the norm before
-- as a one-element f64 tensor, a view of the root's buffer that the next clip overwrites
-- (norm:item() reads it).
function Unit:clip_grad_norm(max_norm, norm_type)
  norm_type = norm_type or 2
  local clip = self.clip_state
  local part = self:grad_norm_part(norm_type)
  if part:device() ~= clip.coef:device() then part = moved(part, clip.coef:device()) end
  optim.clip_coef(clip, part, norm_type, max_norm)
  part:free()
  self.clip_owed = true
  return clip.norm:alias()
end

-- The coefficient of the last clip, once, for the optimizer step that applies it (nil when no
-- clip is owed; zero_grad drops one).
function Unit:take_clip_coef()
  if not self.clip_owed then return nil end
  self.clip_owed = false
  return self.clip_state.coef
end

function fsdp.clip_grad_norm(model, max_norm, norm_type)
  if model.clip_grad_norm then return model:clip_grad_norm(max_norm, norm_type) end
  return optim.clip_grad_norm(model, max_norm, norm_type)
end

-- A table of units: name, parameters, shard numel, padding, strategy.
function fsdp.summary(root)
  local lines = { ("%-28s %12s %12s %8s  %s"):format("unit", "params", "shard", "padding", "strategy") }
  for _, u in ipairs(root.all_units) do
    local i = u.info
    lines[#lines + 1] = ("%-28s %12d %12d %8d  %s"):format(u.name == "" and "(root)" or u.name,
      i.numel, i.shard_numel, i.padding, u.strategy)
  end
  for _, sh in ipairs(root.shared or {}) do
    lines[#lines + 1] = ("shared %s (used by %s) is held by %s"):format(sh.name, table.concat(sh.users, ", "), sh.unit)
  end
  return table.concat(lines, "\n")
end

-- The public face (shard.fsdp.state): what a model holds on this rank, for code outside FSDP.
for _, k in ipairs { "is_fsdp", "local_slices", "gather_full", "mark_stale", "layout", "unit_name", "gather_state" } do
  fsdp[k] = state[k]
end

return fsdp
