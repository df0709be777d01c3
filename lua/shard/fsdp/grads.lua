-- shard.fsdp.grads: the optimizer's side of a wrapped model: one entry per parameter slice
-- a unit owns on this rank (and per trainable ignored parameter), and zero_grad. It adds
-- optim_groups and zero_grad to fsdp.Unit.
local shard_tensor = require("shard.tensor")
local state = require("shard.fsdp.state")
local Unit = require("shard.fsdp.unit").Unit

local M = {}

-- After an offloaded unit's update on the CPU: when it is one of the units the next forward
-- gathers first (the root and the `prefetch` after it), its copy to the device and its gather
-- start now, behind the rest of the optimizer step; the forward then finds them under way.
local function prefetch_next_step(u)
  local root = u.root
  if root.order and u.index and u.index <= 1 + root.prefetch_depth then u:prefetch() end
end

-- The grad of elements [off, off + n) of unit u's shard, as a function for an optimizer entry:
-- an alias of that slice of the sharded grad (nil while there is none). Grads still owed a
-- reduction (accumulation) are refused.
local function slice_grad(u, off, n)
  return function()
    if u.unsynced or u.replica_owed then
      error(("fsdp: unit %s still owes its gradients a %s (accumulation with %s); run the last micro-batch's " ..
             "backward with sync on before the optimizer or clipping reads them"):format(
        u.name == "" and "(root)" or u.name, u.unsynced and "reduction" or "all-reduce across replicas",
        u.unsynced and "gradient sync off" or "all-reduce off"), 0)
    end
    local g = u.fp:grad_shard()
    if not g then return nil end
    local v = g:narrow(1, off + 1, n)
    g:free()
    return v
  end
end

-- One optimizer entry per parameter slice a unit owns on this rank: the shard view (updated
-- in place), its grad (the matching slice of the sharded grad), nanoGPT's decay rule (dims
-- >= 2), and where the slice starts in the parameter.
local function unit_entries(u, names, entries)
  state.each_stored(u, function(i, t, slot)
    if not slot.frozen and slot.own_numel > 0 then
      entries[#entries + 1] = {
        tensor = u.fp:shard_view(i),
        decay = t.p.ndim >= 2,
        name = names and names[t],
        start = slot.own_start,
        -- offloaded units step one after another on the CPU, each after its own grad landed
        group = u.offload and u or nil,
        after_step = u.offload and function() prefetch_next_step(u) end or nil,
        grad = slice_grad(u, slot.shard_offset, slot.own_numel),
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

M.unit_entries, M.ignored_entries = unit_entries, ignored_entries

return M
