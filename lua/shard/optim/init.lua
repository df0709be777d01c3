-- shard.optim: AdamW and SGD over parameter tensors (or FSDP's flat shards), learning-rate
-- schedules and gradient clipping. Each update is one fused C pass per tensor (optim.h).
local rt = require "shard.ffi"
local tensor = require "shard.tensor"
local memory = require "shard.memory"
local C, check = rt.C, rt.check

local O = {}

-- The tensors an optimizer updates, as {tensor, decay} entries. A model may supply its own
-- (FSDP gives flat-shard segments) through :optim_groups(); else its parameters, where, as
-- in nanoGPT, only tensors of 2 or more dims are decayed.
local function collect(params)
  if type(params) == "table" and params.optim_groups then return params:optim_groups() end
  local list = params.parameters and params:parameters() or params
  local out = {}
  for _, t in ipairs(list) do
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

local Optimizer = {}
Optimizer.__index = Optimizer

function Optimizer:zero_grad(set_to_none)
  for _, e in ipairs(self.entries) do
    if e.zero_grad then e.zero_grad(set_to_none) else e.tensor:zero_grad(set_to_none) end
  end
  if self.model and self.model.zero_grad then self.model:zero_grad(set_to_none) end
end

function Optimizer:set_lr(lr) self.lr = lr end

-- One step: update(self, entry, grad, grad_scale) for every entry that has a gradient.
function Optimizer:step(grad_scale)
  self.step_count = self.step_count + 1
  for _, e in ipairs(self.entries) do
    local g, owned = grad_of(e)
    if g then
      self:update(e, g, grad_scale or 1)
      if owned then g:free() end
    end
  end
end

local function new_optimizer(params, fields, update)
  fields.entries = collect(params)
  fields.model = params.parameters and params or nil
  fields.step_count = 0
  fields.update = update
  return setmetatable(fields, Optimizer)
end

-- AdamW (torch.optim.AdamW semantics: decoupled decay, bias correction).
function O.AdamW(params, opts)
  opts = opts or {}
  local betas = opts.betas or {}
  local self = new_optimizer(params, {
    lr = opts.lr or 1e-3, beta1 = betas[1] or 0.9, beta2 = betas[2] or 0.999,
    eps = opts.eps or 1e-8, weight_decay = opts.weight_decay or 0.01,
  }, function(s, e, g, grad_scale)
    check(C.sh_adamw_step_(e.tensor.p, g.p, e.m.p, e.v.p, e.shadow and e.shadow.p or nil, s.lr,
      s.beta1, s.beta2, s.eps, e.decay and s.weight_decay or 0, s.step_count, grad_scale))
  end)
  for _, e in ipairs(self.entries) do e.m = state_like(e.tensor); e.v = state_like(e.tensor) end
  return self
end

-- SGD with momentum (torch.optim.SGD semantics).
function O.SGD(params, opts)
  opts = opts or {}
  local self = new_optimizer(params, {
    lr = opts.lr or 1e-2, momentum = opts.momentum or 0, dampening = opts.dampening or 0,
    weight_decay = opts.weight_decay or 0, nesterov = opts.nesterov and 1 or 0,
  }, function(s, e, g, grad_scale)
    check(C.sh_sgd_step_(e.tensor.p, g.p, e.m and e.m.p or nil, s.lr, s.momentum, s.dampening,
      s.weight_decay, s.nesterov, s.step_count == 1 and 1 or 0, grad_scale))
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

-- The gradient norm of a parameter list (2, 1 or math.huge); tensors without grad skipped.
local function local_norm_part(grads, norm_type)
  local acc = 0
  for _, g in ipairs(grads) do
    if norm_type == 2 then
      local st = require("ffi").new("int[1]")
      acc = acc + C.sh_sumsq(g.p, st)
      if st[0] ~= 0 then check(st[0]) end
    else
      local a = g:abs()
      local r = norm_type == 1 and a:sum() or a:max()
      local v = r:item(); a:free(); r:free()
      acc = norm_type == 1 and acc + v or math.max(acc, v)
    end
  end
  return acc
end
O.local_norm_part = local_norm_part

-- Scales every gradient so the total norm is at most max_norm; returns the norm before.
-- combine(part) merges the per-rank parts (FSDP passes an all-reduce).
function O.clip_grad_norm(params, max_norm, norm_type, combine)
  norm_type = norm_type or 2
  local entries = collect(params)
  local grads, owned = {}, {}
  for _, e in ipairs(entries) do
    local g, own = grad_of(e)
    if g then grads[#grads + 1] = g; owned[#grads] = own end
  end
  local part = local_norm_part(grads, norm_type)
  if combine then part = combine(part, norm_type) end
  local total = norm_type == 2 and math.sqrt(part) or part
  local coef = max_norm / (total + 1e-6)
  for i, g in ipairs(grads) do
    if coef < 1 then g:scale_(coef) end
    if owned[i] then g:free() end
  end
  return total
end

return O
