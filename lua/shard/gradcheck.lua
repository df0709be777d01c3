-- shard.gradcheck: an op's backward against central finite differences.
-- fn(inputs...) -> tensor. The check differentiates L = sum(fn(x) * r) for a fixed random r,
-- so every output element contributes with its own weight. The difference quotient is
-- formed in f64 from the outputs; the ops themselves run in the inputs' dtype, so with f32
-- kernels the step h is 1e-3 and the tolerance is set for f32 rounding (about 1e-7 * |L| / h).
local tensor = require("shard.tensor")
local A = require("shard.autograd")
local R = require("shard.random")

local G = {}

local function weighted_sum(out, r)
  local vals = out:tolist_flat()
  local s = 0
  for i = 1, #vals do s = s + vals[i] * r[i] end
  return s
end

-- inputs: list of tensors (the ones with requires_grad are checked). opts: h, atol, rtol,
-- reseed (a seed reset before every evaluation, for ops that draw random numbers).
-- Returns ok, worst (a table describing the worst element).
function G.check(fn, inputs, opts)
  opts = opts or {}
  local h, atol, rtol = opts.h or 1e-3, opts.atol or 2e-3, opts.rtol or 2e-2
  local function run()
    if opts.reseed then R.manual_seed(opts.reseed) end
    return fn(unpack(inputs))
  end
  -- analytic
  for _, x in ipairs(inputs) do if tensor.is_tensor(x) then x:zero_grad() end end
  local out = run()
  local n = out:numel()
  local r = {}
  local rt = tensor.empty(out:shape(), { dtype = "f64" })
  R.manual_seed(opts.weight_seed or 4242)
  R.normal_(rt, 0, 1)
  r = rt:tolist_flat()
  local rw = rt:to(out:dtype())
  local loss = (out * rw):sum()
  loss:backward()
  loss:free(); rw:free(); rt:free()
  local worst = { err = 0 }
  local ok = true
  for k, x in ipairs(inputs) do
    if tensor.is_tensor(x) and x.requires_grad then
      local g = x.grad
      local analytic = g and g:tolist_flat() or {}
      if g then g:free() end
      local flat = x:tolist_flat()
      local shape = x:shape()
      for i = 1, #flat do
        local idx, rem = {}, i - 1
        for d = #shape, 1, -1 do idx[d] = rem % shape[d] + 1; rem = math.floor(rem / shape[d]) end
        x:set(idx, flat[i] + h)
        local lp = A.no_grad(function() local o = run(); local v = weighted_sum(o, r); return v end)
        x:set(idx, flat[i] - h)
        local lm = A.no_grad(function() local o = run(); local v = weighted_sum(o, r); return v end)
        x:set(idx, flat[i])
        local numeric = (lp - lm) / (2 * h)
        local a = analytic[i] or 0
        local err = math.abs(a - numeric)
        if err > atol + rtol * math.abs(numeric) then ok = false end
        if err > worst.err then worst = { err = err, input = k, index = i, analytic = a, numeric = numeric } end
      end
    end
  end
  return ok, worst
end

function G.describe(worst)
  return ("worst error %.3g at input %s element %s: analytic %.6g, numeric %.6g"):format(
    worst.err, tostring(worst.input), tostring(worst.index), worst.analytic or 0, worst.numeric or 0)
end

return G
