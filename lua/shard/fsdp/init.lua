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
-- by unit on the CPU (runtime/dist/flatparam.h, fsdp/unit.lua). Sharding strategies only.
-- Shared parameters stay with the closest unit over all their users (fsdp/shared.lua).
-- ignored_params / ignored_modules: left out of every FlatParameter, replicated on every
-- rank, their grads all-reduced at the end of the backward (none when frozen). Frozen and
-- trainable parameters in one unit: two FlatParameters (split_frozen). Accumulation over
-- micro-batches: fsdp.no_sync, set_requires_gradient_sync, set_requires_all_reduce.
-- deterministic = true (fsdp/determ.lua): the same gradients and parameters, bit for bit, at
-- any world size and strategy, for a loop that runs one backward per chunk of the global batch
-- between fsdp.deterministic_begin(model, { chunks, first, count }) and deterministic_finish.
-- check_schedule: the ranks compare where they are before each unit's collectives (a small
-- all-gather each) and name a unit some ranks skipped, instead of failing in the collective
-- or, where the buffers have the same size, averaging different units' gradients without a
-- word. true (or SHARD_FSDP_CHECK=1): every step; false (SHARD_FSDP_CHECK=0): never; not set:
-- the first CHECK_STEPS backward passes of a CPU run (a divergence the model's structure
-- causes shows there; one that depends on the data, later, needs true).
-- Code outside FSDP reads a wrapped model through the public face below (fsdp/state.lua):
-- is_fsdp, offloaded, local_slices (this rank's slice of every parameter), gather_full, mark_stale,
-- layout, unit_name, gather_state; never a unit's fields.
-- The files: wrap.lua (wrap, the policy's walk, ignored parameters, sharded init), unit.lua
-- (the unit: strategy, FlatParameter, offload, frozen split, unshard/reshard), shared.lua
-- (shared parameters), mesh.lua (process groups), schedule.lua (the forward and backward
-- hooks, reductions, accumulation, the schedule check), grads.lua (optimizer entries,
-- zero_grad), clip.lua (norms, clipping), state.lua (the public face), determ.lua (deterministic
-- mode), policy.lua.
local fsdp = { policy = require("shard.fsdp.policy") }
local mesh = require("shard.fsdp.mesh")
local unit = require("shard.fsdp.unit")
local schedule = require("shard.fsdp.schedule")
local wrap = require("shard.fsdp.wrap")
local clip = require("shard.fsdp.clip")
local state = require("shard.fsdp.state")
local determ = require("shard.fsdp.determ")
require("shard.fsdp.grads")     -- the units' optim_groups and zero_grad

fsdp.STRATEGIES, fsdp.Unit = unit.STRATEGIES, unit.Unit
fsdp.world, fsdp.hybrid_mesh = mesh.world, mesh.hybrid_mesh
fsdp.wrap, fsdp.sync_module_states, fsdp.init_shards = wrap.wrap, wrap.sync_module_states, wrap.init_shards
fsdp.no_sync = schedule.no_sync
fsdp.clip_grad_norm = clip.clip_grad_norm
-- deterministic mode (fsdp/determ.lua): a step of one backward per chunk between these
local function root_of(model) return type(model) == "table" and rawget(model, "fsdp_unit") and model.root or nil end
fsdp.deterministic_begin = function(model, spec) return determ.begin(root_of(model), spec) end
fsdp.deterministic_finish = function(model) return determ.finish(root_of(model)) end

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
for _, k in ipairs { "is_fsdp", "offloaded", "local_slices", "gather_full", "mark_stale", "layout", "unit_name", "gather_state",
                     "params_sha256" } do
  fsdp[k] = state[k]
end

return fsdp
