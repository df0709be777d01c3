-- shard.optim: AdamW and SGD over parameter tensors (or FSDP's flat shards), learning-rate
-- schedules and gradient clipping. An SGD update is one fused C pass per tensor; AdamW updates
-- all the tensors of a device in one call, and the gradient norm is summed on the device
-- (optim.h's multi-tensor fronts); clipping forms its coefficient there too and reads nothing
-- back, and a model may leave one for the next step to fold into AdamW's gradient scale.
-- Entries with a group (FSDP's offloaded units) are stepped one group at a time, each as soon
-- as its gradients are on the host.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local memory = require("shard.memory")
local C, check = rt.C, rt.check

local O = {}

-- The tensors an optimizer updates, as {tensor, decay} entries. A model may supply its own
-- (FSDP gives flat-shard segments) through :optim_groups(); else its parameters, where, as
-- in nanoGPT, only tensors of 2 or more dims are decayed.
local function collect(params)
  if type(params) == "table" and params.optim_groups then return params:optim_groups() end
  if type(params) ~= "table" then error("optim: expected a model or a list of tensors, got " .. type(params), 4) end
  local list = params.parameters and params:parameters() or params
  local out = {}
  for i, t in ipairs(list) do
    if not tensor.is_tensor(t) then error(("optim: parameter %d is not a tensor (%s)"):format(i, type(t)), 4) end
    if t:is_freed() then
      error(("optim: parameter %d (%s) was freed; build the optimizer over a live model"):format(i, t:describe()), 4)
    end
    if t.p.requires_grad ~= 0 then out[#out + 1] = { tensor = t, decay = t:dim() >= 2 } end
  end
  return out
end

local function state_like(t)
  return memory.with_tag("optim", tensor.zeros, t:shape(), { dtype = "f32", device = t:device() })
end

-- The gradient of an entry: its own .grad (borrowed), or a view the owner (FSDP) hands out,
-- which the caller frees after use so the grad buffer can go at zero_grad.
local function grad_of(e)
  if e.grad then return e.grad(), true end
  local g = e.tensor.p.grad
  return g ~= nil and tensor.borrow(g) or nil, false
end
O.grad_of = grad_of   -- shard.amp unscales what the step will read

-- items split by the device of tensor_of(item), in first-seen order: { {item, ...}, ... }
local function by_device(items, tensor_of)
  local groups, of = {}, {}
  for _, it in ipairs(items) do
    local d = tensor_of(it).p.device
    if not of[d] then of[d] = {}; groups[#groups + 1] = of[d] end
    table.insert(of[d], it)
  end
  return groups
end

-- One f64 for a norm and one f32 for a clip coefficient on device (sh_grad_clip_coef's outputs).
function O.clip_buffers(device)
  return { norm = tensor.empty({ 1 }, { dtype = "f64", device = device }),
           coef = tensor.empty({ 1 }, { dtype = "f32", device = device }) }
end

-- O.clip_grad_norm's pair per device, kept for good. Made with the first optimizer over the
-- device: made by the first clip, mid-step, it would hold memory the step before it did not
-- and the next step would allocate more. FSDP's root keeps its own (its coefficient waits
-- for the optimizer's step).
local plain_clip = {}
local function plain_clip_buffers(device)
  plain_clip[device] = plain_clip[device] or O.clip_buffers(device)
  return plain_clip[device]
end

local Optimizer = {}
Optimizer.__index = Optimizer

function Optimizer:zero_grad(set_to_none)
  for _, e in ipairs(self.entries) do
    if e.zero_grad then e.zero_grad(set_to_none) else e.tensor:zero_grad(set_to_none) end
  end
  if self.model and self.model.zero_grad then self.model:zero_grad(set_to_none) end
end

function Optimizer:set_lr(lr) self.lr = lr end

-- The entries in the batches a step updates, in first-seen order: entries with a `group`
-- (FSDP's offloaded units, whose shards live in host memory) one batch per group, the rest
-- in one batch. A group's gradients are read just before its update, and reading them
-- waits for that group's copy to the host only, so the CPU updates one unit while the
-- later units' gradients are still on their way; after its update the group's entry may
-- start what comes next (after_step: FSDP starts the next step's copy of the unit).
local function step_batches(entries)
  local list, of, rest = {}, {}, nil
  for _, e in ipairs(entries) do
    local key = e.group
    if key == nil then
      if not rest then rest = {}; list[#list + 1] = rest end
      rest[#rest + 1] = e
    else
      if not of[key] then of[key] = {}; list[#list + 1] = of[key] end
      table.insert(of[key], e)
    end
  end
  return list
end

-- The clip coefficient the model left on its device for this step (FSDP's clip_grad_norm), as
-- clip_on(device): that tensor, or its copy on another device (offloaded units step on the
-- host), or nil when there is none; and a function that frees the copies.
local function step_clip(model)
  local coef = model and model.take_clip_coef and model:take_clip_coef()
  if not coef then return function() return nil end, function() end end
  local copies = {}
  local function clip_on(device)
    if device == coef:device() then return coef end
    copies[device] = copies[device] or coef:to(device)
    return copies[device]
  end
  return clip_on, function() for _, t in pairs(copies) do t:free() end end
end

-- One step: update(self, work, grad_scale, clip_on) over each batch's entries that have a
-- gradient, as work = { {entry = e, grad = g}, ... }; clip_on(device) is the clip coefficient
-- the update multiplies the gradients by (nil: none).
function Optimizer:step(grad_scale)
  self.step_count = self.step_count + 1
  self.batches = self.batches or step_batches(self.entries)
  local clip_on, free_clips = step_clip(self.model)
  for _, batch in ipairs(self.batches) do
    local work, owned = {}, {}
    for _, e in ipairs(batch) do
      local g, own = grad_of(e)
      if g then
        work[#work + 1] = { entry = e, grad = g }
        if own then owned[#owned + 1] = g end
      end
    end
    self:update(work, grad_scale or 1, clip_on)
    for _, g in ipairs(owned) do g:free() end
    if batch[1].after_step then batch[1].after_step() end
  end
  free_clips()
end

-- The optimizer's state for a checkpoint. Each entry's state tensors (f32, the entry's shape)
-- are the live buffers, not copies: `names` (tensor -> parameter name; FSDP entries carry
-- their own name and start; a function of the tensor also works) says which slice each entry is.
--   { kind = "AdamW", step_count = n, hyper = { lr =, ... },
--     entries = { { name =, start =, numel =, state = { exp_avg = t, exp_avg_sq = t } }, ... } }
-- Entries without a name (a bare tensor list and no names) are left out.
local STATE_NAMES = { m = "exp_avg", v = "exp_avg_sq" }
function Optimizer:state_dict(names)
  local entries = {}
  for _, e in ipairs(self.entries) do
    local name = e.name or (type(names) == "function" and names(e.tensor)) or (type(names) == "table" and names[e.tensor]) or nil
    if name then
      local state = {}
      for field, key in pairs(self.state_names) do if e[field] then state[key] = e[field] end end
      entries[#entries + 1] = { name = name, start = e.start or 0, numel = e.tensor:numel(), state = state }
    end
  end
  local hyper = {}
  for _, k in ipairs(self.hyper_names) do hyper[k] = self[k] end
  return { kind = self.kind, step_count = self.step_count, hyper = hyper, entries = entries }
end

-- Restores step count and hyperparameters from sd, and, for each of sd.entries that holds
-- state tensors, copies them into the entry of the same name and start (same numel).
-- shard.checkpoint fills the live buffers of state_dict() directly and passes just the scalars.
function Optimizer:load_state_dict(sd, names)
  if sd.kind and sd.kind ~= self.kind then
    error(("optim: the state is %s's, this optimizer is %s"):format(sd.kind, self.kind), 2)
  end
  self.step_count = sd.step_count or self.step_count
  for k, v in pairs(sd.hyper or {}) do self[k] = v end
  if sd.entries then
    local live = {}
    for _, e in ipairs(self:state_dict(names).entries) do live[e.name .. "@" .. e.start] = e end
    for _, e in ipairs(sd.entries) do
      local key = e.name .. "@" .. (e.start or 0)
      local to = live[key]
      if not to then error(("optim: load_state_dict: this optimizer has no entry %s"):format(key), 2) end
      for k, t in pairs(e.state or {}) do
        local dst = to.state[k]
        if not dst then error(("optim: load_state_dict: entry %s has no state '%s'"):format(key, k), 2) end
        if t:numel() ~= dst:numel() then
          error(("optim: load_state_dict: %s state '%s' has %d elements, expected %d"):format(key, k, t:numel(), dst:numel()), 2)
        end
        local src = t:reshape(dst:shape())
        dst:copy_(src)
        src:free()
      end
    end
  end
  return self
end

local function new_optimizer(params, fields, update)
  fields.entries = collect(params)
  fields.model = params.parameters and params or nil
  if not (fields.model and fields.model.clip_grad_norm) then
    for _, e in ipairs(fields.entries) do plain_clip_buffers(e.tensor:device()) end
  end
  fields.step_count = 0
  fields.update = update
  return setmetatable(fields, Optimizer)
end

-- AdamW (torch.optim.AdamW semantics: decoupled decay, bias correction).
function O.AdamW(params, opts)
  opts = opts or {}
  local betas = opts.betas or {}
  local self = new_optimizer(params, {
    kind = "AdamW", state_names = STATE_NAMES, hyper_names = { "lr", "beta1", "beta2", "eps", "weight_decay" },
    lr = opts.lr or 1e-3, beta1 = betas[1] or 0.9, beta2 = betas[2] or 0.999,
    eps = opts.eps or 1e-8, weight_decay = opts.weight_decay or 0.01,
  }, function(s, work, grad_scale, clip_on)
    for _, group in ipairs(by_device(work, function(w) return w.entry.tensor end)) do
      local params = ffi.new("sh_adamw_param[?]", #group)
      local clip = clip_on(group[1].entry.tensor:device())   -- folded into the gradient scale
      for i, w in ipairs(group) do
        local e, p = w.entry, params[i - 1]
        p.param, p.grad, p.m, p.v = e.tensor.p, w.grad.p, e.m.p, e.v.p
        p.shadow = e.shadow and e.shadow.p or nil
        p.weight_decay = e.decay and s.weight_decay or 0
        p.clip = clip and clip.p or nil
      end
      check(C.sh_adamw_step_multi_(#group, params, s.lr, s.beta1, s.beta2, s.eps, s.step_count, grad_scale))
    end
  end)
  for _, e in ipairs(self.entries) do e.m = state_like(e.tensor); e.v = state_like(e.tensor) end
  return self
end

-- SGD with momentum (torch.optim.SGD semantics).
function O.SGD(params, opts)
  opts = opts or {}
  local self = new_optimizer(params, {
    kind = "SGD", state_names = { m = "momentum_buffer" },
    hyper_names = { "lr", "momentum", "dampening", "weight_decay", "nesterov" },
    lr = opts.lr or 1e-2, momentum = opts.momentum or 0, dampening = opts.dampening or 0,
    weight_decay = opts.weight_decay or 0, nesterov = opts.nesterov and 1 or 0,
  }, function(s, work, grad_scale, clip_on)
    for _, w in ipairs(work) do
      local e = w.entry
      local clip = clip_on(w.grad:device())
      if clip then w.grad:mul_(clip) end
      check(C.sh_sgd_step_(e.tensor.p, w.grad.p, e.m and e.m.p or nil, s.lr, s.momentum, s.dampening,
        s.weight_decay, s.nesterov, s.step_count == 1 and 1 or 0, grad_scale))
    end
  end)
  if self.momentum ~= 0 then for _, e in ipairs(self.entries) do e.m = state_like(e.tensor) end end
  return self
end

-- Linear warmup, then cosine decay from lr to min_lr at decay_iters (nanoGPT's get_lr).
function O.cosine_schedule(opts)
  local lr, min_lr = opts.lr, opts.min_lr or opts.lr / 10
  local warmup, decay = opts.warmup or 0, opts.decay_iters or opts.max_iters
  return function(it)          -- it counts from 0 like nanoGPT's iter_num
    if it < warmup then return lr * (it + 1) / (warmup + 1) end
    if it > decay then return min_lr end
    local ratio = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
  end
end

-- The local part of the gradient norm (2, 1 or math.huge) of gradients on one device: the
-- sum of weights[i] * (sum of squares, or of absolute values) of grads[i] (weights nil: all
-- 1), or the largest absolute value; as a one-element f64 tensor on that device (the default
-- device when there are none), summed there and not read back (optim.h's sh_grad_norm_part).
local function norm_part_tensor(grads, norm_type, weights)
  local n = #grads
  local ts, w = ffi.new("const sh_tensor *[?]", n), weights and ffi.new("double[?]", n) or nil
  for i, g in ipairs(grads) do
    ts[i - 1] = g.p
    if w then w[i - 1] = weights[i] end
  end
  local out = tensor.empty({ 1 }, { dtype = "f64", device = n > 0 and grads[1]:device() or nil })
  check(C.sh_grad_norm_part(out.p, n, ts, w, norm_type))
  return out
end
O.norm_part_tensor = norm_part_tensor

-- The same as a number, for gradients on any devices: one read per device.
local function local_norm_part(grads, norm_type, weights)
  local acc = 0
  local index = {}
  for i = 1, #grads do index[i] = i end
  for _, group in ipairs(by_device(index, function(i) return grads[i] end)) do
    local gs, ws = {}, weights and {} or nil
    for k, i in ipairs(group) do
      gs[k] = grads[i]
      if ws then ws[k] = weights[i] end
    end
    local t = norm_part_tensor(gs, norm_type, ws)
    local v = t:item()
    t:free()
    if norm_type == math.huge then acc = (v > acc or v ~= v) and v or acc else acc = acc + v end
  end
  return acc
end
O.local_norm_part = local_norm_part

-- The norm part of gradients on any devices as a tensor on the first one (the default device
-- when there are none): each device's part summed there, the others' moved and combined.
local function device_norm_part(grads, norm_type)
  local total
  for _, group in ipairs(by_device(grads, function(g) return g end)) do
    local t = norm_part_tensor(group, norm_type)
    if total then
      local moved = t:to(total:device())
      check(C.sh_binary_(total.p, norm_type == math.huge and C.SH_OP_MAXIMUM or C.SH_OP_ADD, moved.p))
      moved:free()
      t:free()
    else
      total = t
    end
  end
  return total or norm_part_tensor({}, norm_type)
end

-- buffers.norm and buffers.coef from a norm part on their device (sh_grad_clip_coef).
function O.clip_coef(buffers, part, norm_type, max_norm)
  check(C.sh_grad_clip_coef(buffers.coef.p, buffers.norm.p, part.p, norm_type, max_norm))
end

-- Scales every gradient in place so the total norm is at most max_norm, as
-- torch.nn.utils.clip_grad_norm_, without reading anything back: the norm and the coefficient
-- min(1, max_norm / (norm + 1e-6)) are formed on the device, and each gradient is multiplied by
-- the coefficient where it is. Returns the norm before as a one-element f64 tensor on the
-- gradients' device: a view of a buffer the next clip there overwrites (norm:item() reads it).
function O.clip_grad_norm(params, max_norm, norm_type)
  norm_type = norm_type or 2
  local entries = collect(params)
  local grads, owned = {}, {}
  for _, e in ipairs(entries) do
    local g, own = grad_of(e)
    if g then grads[#grads + 1] = g; owned[#grads] = own end
  end
  local part = device_norm_part(grads, norm_type)
  local buffers = plain_clip_buffers(part:device())
  O.clip_coef(buffers, part, norm_type, max_norm)
  part:free()
  local copies = {}
  for i, g in ipairs(grads) do
    local d = g:device()
    if d ~= buffers.coef:device() then copies[d] = copies[d] or buffers.coef:to(d) end
    g:mul_(copies[d] or buffers.coef)
    if owned[i] then g:free() end
  end
  for _, t in pairs(copies) do t:free() end
  return buffers.norm:alias()
end

return O
