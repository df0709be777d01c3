-- shard.flatparam: the FlatParameter (runtime/dist/flatparam.h) seen from Lua, the one binding of
-- sh_flatparam_* (shard.fsdp drives its units through it). It keeps the parameter tensors it
-- was built from alive (the C side re-points their structs in place) and hands out aliases
-- of the local shards. The gather state lives in C only: fp:state() reads it.
--
--   local fp = flatparam.new(params, { group = shard_group, param = "bf16", reduce = "f32" })
--   fp:unshard()  ...forward/backward...  fp:reduce_grad("avg"); fp:reshard()
--   opt_step(fp:shard(), fp:grad_shard())
-- fp:set_offload() right after new moves the shard (and the grads to come) to pinned host
-- memory: shard() and grad_shard() are then CPU tensors.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local C, check = rt.C, rt.check

local M = {}
local FlatParam = {}
FlatParam.__index = FlatParam
M.FlatParam = FlatParam

local STATES = { [C.SH_FP_SHARDED] = "sharded", [C.SH_FP_GATHERING] = "gathering", [C.SH_FP_UNSHARDED] = "unsharded" }
local REDUCE_OPS = { sum = C.SH_RED_SUM, avg = C.SH_RED_AVG }

local function dtype_or_default(d) return d and tensor.dtype_id(d) or -1 end
local function group_ptr(g) return g and g.p or nil end

-- The parameters' C-side grads were dropped or replaced behind Lua's back: end the views
-- that t.grad handed out for them (shard.tensor keeps one per tensor).
local function grads_changed(self)
  for _, t in ipairs(self.params) do tensor.grad_changed(t) end
end

-- Like new, but returns nil and the runtime's message when the runtime refuses the
-- parameters (shard.fsdp names the unit in its own error).
function M.create(params, opts)
  opts = opts or {}
  local n = #params
  local arr = ffi.new("sh_tensor*[?]", math.max(n, 1))
  for i = 1, n do
    if not tensor.is_tensor(params[i]) then return nil, ("flatparam: parameter %d is not a tensor"):format(i) end
    arr[i - 1] = params[i].p
  end
  local box = ffi.new("sh_flatparam*[1]")
  local rc = C.sh_flatparam_create(box, arr, n, group_ptr(opts.group), dtype_or_default(opts.master),
                                   dtype_or_default(opts.param), dtype_or_default(opts.reduce), opts.no_shard and 1 or 0,
                                   opts.align or 1)
  if rc ~= 0 then return nil, ffi.string(C.sh_last_error()) end
  local params_copy = {}
  for i = 1, n do params_copy[i] = params[i] end
  local self = setmetatable({ p = ffi.gc(box[0], C.sh_flatparam_destroy), params = params_copy, group = opts.group }, FlatParam)
  grads_changed(self)     -- create released the parameters, grads included
  return self
end

-- params: a list of Tensors in registration order (the same Tensor twice = tied).
-- opts: group (a shard.comm Group or nil for a group of one), master, param, reduce (dtype
-- names; default: the first parameter's dtype, then master, then param), no_shard, align
-- (the shard a multiple of align elements; default 1).
function M.new(params, opts)
  local fp, err = M.create(params, opts)
  if not fp then error(err, 2) end
  return fp
end

function FlatParam:info()
  local i = ffi.new("sh_flatparam_info")
  check(C.sh_flatparam_get_info(self.p, i), 2)
  return { numel = tonumber(i.numel), padded_numel = tonumber(i.padded_numel), shard_numel = tonumber(i.shard_numel),
           padding = tonumber(i.padded_numel - i.numel), n_params = i.n_params, n_unique = i.n_unique,
           group_size = i.group_size, rank = i.rank, master_dtype = tensor.dtype_name(i.master_dtype),
           param_dtype = tensor.dtype_name(i.param_dtype), reduce_dtype = tensor.dtype_name(i.reduce_dtype),
           no_shard = i.no_shard ~= 0, state = STATES[i.state], unsharded = i.state == C.SH_FP_UNSHARDED,
           has_grad = i.has_grad ~= 0, device = tensor.device_name(i.device), offload = i.offload ~= 0 }
end

-- CPU offload (runtime/dist/flatparam.h): the shard and the sharded grad move to pinned host
-- memory, so shard() and grad_shard() are CPU tensors and the optimizer steps on the CPU.
-- Returns whether anything moved (false on the CPU, where there is nothing to move).
function FlatParam:set_offload()
  check(C.sh_flatparam_set_offload(self.p, 1), 2)
  return self:info().offload
end

-- "sharded", "gathering" (an unshard_start not yet waited for) or "unsharded".
function FlatParam:state() return STATES[C.sh_flatparam_state(self.p)] end

-- Parameter i (1-based): its place in the flat buffer and the part `rank` (0-based; default
-- this rank) owns: elements own_start+1 .. own_start+own_numel of the flattened parameter,
-- at shard_offset in that rank's shard.
local slot_box = ffi.new("sh_flatparam_slot")
function FlatParam:slot(i, rank)
  local s = slot_box
  check(C.sh_flatparam_get_slot(self.p, i - 1, rank or -1, s), 2)
  return { offset = tonumber(s.offset), numel = tonumber(s.numel), own_start = tonumber(s.own_start),
           own_numel = tonumber(s.own_numel), shard_offset = tonumber(s.shard_offset),
           tied_to = s.tied_to >= 0 and s.tied_to + 1 or nil, frozen = s.frozen ~= 0 }
end

function FlatParam:unshard() check(C.sh_flatparam_unshard(self.p), 2); return self end
function FlatParam:unshard_start() check(C.sh_flatparam_unshard_start(self.p), 2); return self end
function FlatParam:unshard_wait() check(C.sh_flatparam_unshard_wait(self.p), 2); return self end
function FlatParam:reshard() check(C.sh_flatparam_reshard(self.p), 2); return self end

-- Before a backward: each trainable parameter's .grad becomes a view of one flat buffer.
function FlatParam:prepare_grads()
  check(C.sh_flatparam_prepare_grads(self.p), 2)
  grads_changed(self)
  return self
end

local function op_id(op)
  local id = REDUCE_OPS[op or "avg"]
  if not id then error("flatparam: grads reduce with 'sum' or 'avg', got '" .. tostring(op) .. "'", 3) end
  return id
end

-- The end of a call that took the parameters' grads (rc: its status): their Lua side follows,
-- failed or not; then a failure raises. The methods tail-call it: the error blames their caller.
local function grads_taken(self, rc)
  grads_changed(self)
  check(rc, 2)
  return self
end

-- op "avg" (default) or "sum"; replicate: the Group to all-reduce the shard across (hybrid).
-- The parameters' grads are taken (and freed) by the start.
function FlatParam:reduce_grad(op, replicate)
  return grads_taken(self, C.sh_flatparam_reduce_grad(self.p, op_id(op), group_ptr(replicate)))
end
function FlatParam:reduce_grad_start(op, replicate)
  return grads_taken(self, C.sh_flatparam_reduce_grad_start(self.p, op_id(op), group_ptr(replicate)))
end
function FlatParam:reduce_grad_wait() check(C.sh_flatparam_reduce_grad_wait(self.p), 2); return self end
function FlatParam:zero_grad(free_it) check(C.sh_flatparam_zero_grad(self.p, free_it and 1 or 0), 2); return self end
-- Drops the grads backwards left on the parameters unreduced (accumulation with sync off).
function FlatParam:drop_local_grads() return grads_taken(self, C.sh_flatparam_drop_local_grads(self.p)) end

-- The deterministic reduction's ends (flatparam.h): take_grad returns the flat grad (the
-- parameters' grads laid end to end, taken and freed; no collective), add_grad lands a
-- reduced shard in the sharded grad; grad_block_sumsq(block, out) writes the sharded grad's
-- f64 sum of squares per block into out.
function FlatParam:take_grad()
  local box = ffi.new("sh_tensor*[1]")
  local rc = C.sh_flatparam_take_grad(box, self.p)
  grads_taken(self, rc)
  return tensor.wrap(box[0])
end
function FlatParam:add_grad(shard) check(C.sh_flatparam_add_grad(self.p, shard.p), 2); return self end
function FlatParam:grad_block_sumsq(block, out) check(C.sh_flatparam_grad_block_sumsq(self.p, block, out.p), 2); return out end

-- Aliases of the local shards (in-place updates reach the FlatParameter); the caller frees
-- them. grad_shard is nil while there is no sharded grad.
function FlatParam:shard() return tensor.new_from(C.sh_flatparam_shard, self.p) end
function FlatParam:grad_shard()
  local box = ffi.new("sh_tensor*[1]")
  check(C.sh_flatparam_grad_shard(box, self.p), 2)
  if box[0] == nil then return nil end
  return tensor.wrap(box[0])
end

-- Sharded init: a 1-D view of the part of parameter i this rank owns, and a copy of this
-- rank's part from a full-size value.
function FlatParam:shard_view(i) return tensor.new_from(C.sh_flatparam_shard_view, self.p, i - 1) end
function FlatParam:init_param(i, value) check(C.sh_flatparam_init_param(self.p, i - 1, value.p), 2); return self end

-- Reshards (the parameters are left without storage) and frees every buffer now.
function FlatParam:free()
  if self.p == nil then return end
  check(C.sh_flatparam_reshard(self.p), 2)
  C.sh_flatparam_destroy(ffi.gc(self.p, nil))
  self.p = nil
end

return M
