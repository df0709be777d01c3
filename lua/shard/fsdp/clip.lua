-- shard.fsdp.clip: the gradients' total norm over every rank, and clipping by it without
-- reading it (the coefficient stays on the device for the optimizer's next step). It adds
-- grad_norm_part, grad_norm, clip_grad_norm and take_clip_coef to fsdp.Unit.
local optim = require("shard.optim")
local shard_tensor = require("shard.tensor")
local mesh = require("shard.fsdp.mesh")
local grads = require("shard.fsdp.grads")
local determ = require("shard.fsdp.determ")
local Unit = require("shard.fsdp.unit").Unit

local M = {}
local unit_entries, ignored_entries = grads.unit_entries, grads.ignored_entries

-- Where the root keeps its clip's norm and coefficient (made at wrap, so the first clip
-- allocates nothing mid-step): on the units' device, the all-reduced part's; under offload on
-- the host, where the CPU optimizer reads the coefficient.
local function clip_device(root)
  for _, u in ipairs(root.all_units) do
    if u.fp then return u.offload and "cpu" or u.fp:info().device end
  end
  return shard_tensor.default_device
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

-- Deterministic mode's L2 part (fsdp/determ.lua): the same bits at any world size, read on
-- the host; the max norm is exact in any order, so it takes the general path.
local function determ_part(self, norm_type)
  if norm_type ~= 2 then
    error(("fsdp: clip_grad_norm with norm_type %s: deterministic mode computes the L2 norm (2) and the max (math.huge)"):format(
      tostring(norm_type)), 0)
  end
  return shard_tensor.tensor({ determ.sumsq(self) }, { dtype = "f64", device = clip_device(self) })
end

-- The norm part of every sharded gradient as a tensor on the device: one part summed there,
-- one all-reduce over the world, nothing read; each unit's gradients are weighted by
-- 1/(number of replicas of its shards) so replicated shards count once.
function Unit:grad_norm_part(norm_type)
  if self.opts.deterministic and norm_type ~= math.huge then return determ_part(self, norm_type) end
  local w = mesh.world()
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

function M.clip_grad_norm(model, max_norm, norm_type)
  if model.clip_grad_norm then return model:clip_grad_norm(max_norm, norm_type) end
  return optim.clip_grad_norm(model, max_norm, norm_type)
end

M.clip_device = clip_device

return M
