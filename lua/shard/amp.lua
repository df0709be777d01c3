-- shard.amp: dynamic loss scaling for fp16 training (torch.cuda.amp.GradScaler's rules), over
-- FSDP's sharded gradients or a plain model's.
--   local model = fsdp.wrap(gpt, { mixed_precision = { param = "f16", reduce = "f32" }, ... })
--   local opt = optim.AdamW(model, { lr = 1e-3 })
--   local scaler = amp.GradScaler(opt, { init_scale = 2^16, growth_interval = 2000 })
--   local scaled = scaler:scale(loss); scaled:backward()
--   scaler:unscale()              -- optional: before clipping, which must see true gradients
--   model:clip_grad_norm(1.0)
--   scaler:step()                 -- the optimizer's step, or none when a grad is inf/NaN
--   scaler:update()               -- halve the scale after a skip, double it after N clean steps
--   opt:zero_grad(true)
-- f16 holds 5 exponent bits: small gradients flush to zero unless the loss is scaled up, and a
-- scale too large overflows. Each rank holds a different shard of the gradients, so an inf on
-- one rank's shard is seen by that rank only: unscale() all-reduces one flag (the max) across
-- the world, and every rank skips the same step and halves the same scale. The state (the
-- scale and the clean steps since the last change) lives on the optimizer as two of its
-- hyperparameters, so opt:state_dict() and shard.checkpoint save and restore it with the rest.
local comm = require("shard.comm")
local optim = require("shard.optim")
local tensor = require("shard.tensor")
local cuda_graph = require("shard.cuda_graph")

local M = {}
local GradScaler = {}
GradScaler.__index = GradScaler

local STATE = { "loss_scale", "loss_scale_clean_steps" }

local function positive(opts, name, default, above)
  local v = opts[name]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= v or v <= above then
    error(("amp.GradScaler: %s = %s; expected a number > %s"):format(name, tostring(v), tostring(above)), 3)
  end
  return v
end

-- opt: the optimizer whose step it guards (and whose state carries the scaler's).
-- opts: init_scale (2^16), growth_factor (2), backoff_factor (0.5), growth_interval (2000
-- clean steps before growing), group (the ranks that agree on a skip; default the world).
function M.GradScaler(opt, opts)
  if type(opt) ~= "table" or type(opt.step) ~= "function" or not opt.entries then
    error("amp.GradScaler: expected an optimizer (shard.optim.AdamW or SGD) first, got " .. type(opt), 2)
  end
  opts = opts or {}
  if type(opts) ~= "table" then error("amp.GradScaler: opts must be a table, got " .. type(opts), 2) end
  local self = setmetatable({
    opt = opt,
    growth_factor = positive(opts, "growth_factor", 2, 1),
    backoff_factor = positive(opts, "backoff_factor", 0.5, 0),
    growth_interval = positive(opts, "growth_interval", 2000, 0),
    group = opts.group or comm.world(),
    unscaled = false, found_inf = false,
  }, GradScaler)
  if self.backoff_factor >= 1 then error(("amp.GradScaler: backoff_factor = %s; expected < 1"):format(self.backoff_factor), 2) end
  opt.loss_scale = positive(opts, "init_scale", 2 ^ 16, 0)
  opt.loss_scale_clean_steps = 0
  local names = {}
  for i, n in ipairs(opt.hyper_names) do names[i] = n end
  for _, n in ipairs(STATE) do names[#names + 1] = n end
  opt.hyper_names = names
  return self
end

function GradScaler:get_scale() return self.opt.loss_scale end

-- loss * scale, recorded: its backward gives scaled gradients.
function GradScaler:scale(loss)
  if not tensor.is_tensor(loss) then error("amp.GradScaler:scale: expected the loss tensor, got " .. type(loss), 2) end
  return loss * self.opt.loss_scale
end

-- Divides every gradient the optimizer will read by the scale and finds whether any rank holds
-- an inf or NaN (one all-reduce of one flag). Once per step; returns found_inf.
function GradScaler:unscale()
  if self.unscaled then return self.found_inf end
  if cuda_graph.capturing() then
    error("amp.GradScaler: fp16 loss scaling skips a step by reading on the host whether a gradient " ..
          "overflowed, which a CUDA graph cannot capture: run this step eagerly (no --cuda_graph), or " ..
          "train in bf16, which needs no scaler", 2)
  end
  local grads, owned = {}, {}
  for _, e in ipairs(self.opt.entries) do
    local g, own = optim.grad_of(e)
    if g then grads[#grads + 1] = g; owned[#grads] = own end
  end
  local inv = 1 / self.opt.loss_scale
  for _, g in ipairs(grads) do g:scale_(inv) end
  -- a sum of squares (in f64) is finite exactly when every element is, short of 1e150 grads
  local part = optim.local_norm_part(grads, 2)
  for i, g in ipairs(grads) do if owned[i] then g:free() end end
  local flag = tensor.tensor({ (part == part and part ~= math.huge) and 0 or 1 }, { dtype = "f64" })
  if self.group:size() > 1 then self.group:all_reduce(flag, "max") end
  self.found_inf = flag:item() ~= 0
  flag:free()
  self.unscaled = true
  return self.found_inf
end

-- The optimizer's step unless a gradient is inf/NaN on some rank; returns true when it stepped.
function GradScaler:step()
  local skip = self:unscale()
  if not skip then self.opt:step() end
  return not skip
end

-- After step: a skipped step multiplies the scale by backoff_factor and restarts the count;
-- growth_interval clean steps in a row multiply it by growth_factor.
function GradScaler:update()
  if not self.unscaled then error("amp.GradScaler:update: call step() (or unscale()) first in each step", 2) end
  local opt = self.opt
  if self.found_inf then
    opt.loss_scale = opt.loss_scale * self.backoff_factor
    opt.loss_scale_clean_steps = 0
  else
    opt.loss_scale_clean_steps = opt.loss_scale_clean_steps + 1
    if opt.loss_scale_clean_steps >= self.growth_interval then
      opt.loss_scale = opt.loss_scale * self.growth_factor
      opt.loss_scale_clean_steps = 0
    end
  end
  self.unscaled, self.found_inf = false, false
end

return M
