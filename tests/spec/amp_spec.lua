-- shard.amp.GradScaler on one process (tests/mpi/amp_fp16.lua covers FSDP and the ranks
-- agreeing): unscaled gradients are the true ones, an inf or NaN skips the step and halves the
-- scale, growth_interval clean steps double it, and bad arguments are refused by name.
local shard = require("shard")
local amp, optim, nn = require("shard.amp"), shard.optim, shard.nn

local function setup(opts)
  shard.manual_seed(4)
  local m = nn.Linear(3, 2)
  local opt = optim.SGD(m, { lr = 0.1 })
  return m, opt, amp.GradScaler(opt, opts)
end

local function backward(m, scaler)
  local x = shard.tensor({ { 1, 2, 3 } })
  local loss = m(x):sum()
  local scaled = scaler:scale(loss)
  scaled:backward()
  loss:free(); scaled:free(); x:free()
end

describe("amp.GradScaler", function()
  it("unscales to the true gradients and steps", function()
    local m, opt, scaler = setup{ init_scale = 1024 }
    backward(m, scaler)
    assert.is_false(scaler:unscale())
    assert.same({ 1, 2, 3, 1, 2, 3 }, m.weight.grad:tolist_flat())   -- d(sum of x W^T)/dW = x per row
    local before = m.weight:tolist_flat()
    assert.is_true(scaler:step())
    assert.is_true(math.abs(m.weight:tolist_flat()[1] - (before[1] - 0.1)) < 1e-6)
    scaler:update()
    assert.equal(1024, scaler:get_scale())
  end)

  it("skips a step with an inf or a NaN and halves the scale; doubles it after growth_interval clean steps", function()
    local m, opt, scaler = setup{ init_scale = 8, growth_interval = 2 }
    local want = {}
    for step, bad in ipairs { 0 / 0, false, false, math.huge, false } do
      backward(m, scaler)
      if bad then m.weight.grad:set({ 1, 2 }, bad) end
      local before = m.weight:tolist_flat()
      local stepped = scaler:step()
      assert.equal(not bad, stepped, "step " .. step)
      if bad then assert.same(before, m.weight:tolist_flat()) end
      scaler:update()
      want[step] = scaler:get_scale()
      opt:zero_grad(true)
    end
    assert.same({ 4, 4, 8, 4, 4 }, want)
    assert.equal(1, opt.loss_scale_clean_steps)
    assert.equal(4, opt:state_dict().hyper.loss_scale)
  end)

  it("refuses what it cannot use, naming it", function()
    local _, opt = setup()
    local cases = {
      { function() amp.GradScaler(nil) end, "expected an optimizer" },
      { function() amp.GradScaler(opt, { init_scale = 0 }) end, "init_scale = 0; expected a number > 0" },
      { function() amp.GradScaler(opt, { growth_factor = 1 }) end, "growth_factor = 1; expected a number > 1" },
      { function() amp.GradScaler(opt, { backoff_factor = 2 }) end, "backoff_factor = 2; expected < 1" },
      { function() local _, _, s = setup(); s:update() end, "call step() (or unscale()) first" },
      { function() local _, _, s = setup(); s:scale(3) end, "expected the loss tensor" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(c[2], 1, true), err)
    end
  end)
end)
