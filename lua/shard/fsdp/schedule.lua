-- shard.fsdp.schedule: what a unit does at each point of the step (DESIGN.md): its forward
-- (unshard, prefetch the next units, reshard after), its backward's pre- and post-hooks (the
-- marker nodes the forward pushes on the autograd tape), the gradient reductions behind the
-- backward, accumulation over micro-batches, and the check that every rank runs the same
-- units in the same order. It adds these methods to fsdp.Unit.
local A = require("shard.autograd")
local shard_tensor = require("shard.tensor")
local mesh = require("shard.fsdp.mesh")
local determ = require("shard.fsdp.determ")
local Unit = require("shard.fsdp.unit").Unit

local M = {}

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

-- Whether every rank's (phase, unit, step) in all (n ranks, three numbers each) is the same.
local function all_same(all, n)
  for r = 1, n - 1 do
    for i = 1, 3 do if all[3 * r + i] ~= all[i] then return false end end
  end
  return true
end

-- Raises the divergence the exchange showed, naming the unit the rank(s) earliest in the step
-- (step, then phase) reached and the others skipped, and where each rank is.
local function report_divergence(root, all, n)
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

-- A deterministic step's chunks after its first issue no collective (its units stay gathered
-- and reduce at its end, fsdp/determ.lua), and the ranks' shares of chunks may differ: the
-- check and its step and backward counts see each deterministic step once.
local function later_chunk(root) return root.det ~= nil and root.det.next ~= root.det.first end

local function check_schedule(self, phase)
  local root = self.root
  local g = root.check_group
  if not g or later_chunk(root) or (root.check_until and (root.backwards or 0) >= root.check_until) then return end
  local mine = root.check_mine
  mine:fill_(0)
  local tag = { phase, self.uid, root.step }
  for i = 1, 3 do mine:set({ i }, tag[i]) end
  g:all_gather(root.check_all, mine)
  local all, n = root.check_all:tolist_flat(), g:size()
  if not all_same(all, n) then report_divergence(root, all, n) end
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
  if self == root and not later_chunk(root) then root.step = (root.step or 0) + 1 end
  check_schedule(self, 1)
  if self == root then root.recording_order = root.order == nil; root.order = root.order or {} end
  local order = root.order or {}   -- none yet: a unit run outside the root's first forward
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
  -- a deterministic step keeps its units gathered from chunk to chunk (fsdp/determ.lua)
  if self ~= root and self.mode.reshard_after_forward and not root.det then self:reshard() end
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
  local w = mesh.world()
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
    if self.trainable then
      if root.det then determ.post_backward(self, root) else reduce_unit_grads(self, root) end
    end
    if not root.det then self:reshard() end
  end
  if self == root then
    if not later_chunk(root) then root.backwards = (root.backwards or 0) + 1 end
    if root.det then
      determ.next_chunk(root)   -- deterministic mode reduces at its step's end (fsdp/determ.lua)
    else
      wait_reduces(root, 0)
      if root.sync_grads ~= false then reduce_ignored(root) end
    end
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
function M.no_sync(model, fn, ...)
  local root = type(model) == "table" and rawget(model, "fsdp_unit") and model.root
  if not root then error("fsdp.no_sync: expected a model returned by fsdp.wrap, got " .. type(model), 2) end
  if type(fn) ~= "function" then error("fsdp.no_sync: expected a function to run without gradient sync, got " .. type(fn), 2) end
  local was = root.sync_grads
  root.sync_grads = false
  return restore_sync(root, was, pcall(fn, ...))
end

return M
