-- SGD (torch semantics), the warmup + cosine schedule and clip_grad_norm, against plain Lua.
local shard = require("shard")
local optim = shard.optim

describe("optim", function()
  it("SGD with momentum, dampening, weight decay and nesterov follows torch.optim.SGD", function()
    for _, nesterov in ipairs { false, true } do
      local w = shard.tensor({ 1.0, -2.0, 0.5 }):requires_grad_()
      local opts = { lr = 0.1, momentum = 0.9, dampening = nesterov and 0 or 0.1, weight_decay = 0.01, nesterov = nesterov }
      local opt = optim.SGD({ w }, opts)
      local ref, buf = { 1.0, -2.0, 0.5 }, {}
      for step = 1, 3 do
        local l = (w * w * w):sum()          -- grad 3 w^2
        l:backward()
        opt:step(); opt:zero_grad(true)
        for i = 1, 3 do
          local g = 3 * ref[i] ^ 2 + opts.weight_decay * ref[i]
          buf[i] = step == 1 and g or opts.momentum * buf[i] + (1 - opts.dampening) * g
          local d = nesterov and g + opts.momentum * buf[i] or buf[i]
          ref[i] = ref[i] - opts.lr * d
        end
        local got = w:tolist()
        for i = 1, 3 do assert.is_true(math.abs(got[i] - ref[i]) < 1e-5 * math.max(1, math.abs(ref[i])), ("step %d [%d]: %g vs %g"):format(step, i, got[i], ref[i])) end
      end
    end
  end)

  it("warms up linearly, then decays along a cosine to min_lr", function()
    local lr = optim.cosine_schedule{ lr = 1.0, min_lr = 0.1, warmup = 10, decay_iters = 110 }
    assert.is_true(math.abs(lr(0) - 1 / 11) < 1e-12)
    assert.is_true(math.abs(lr(9) - 10 / 11) < 1e-12)
    assert.is_true(math.abs(lr(10) - 1.0) < 1e-12)
    assert.is_true(math.abs(lr(60) - 0.55) < 1e-12)
    assert.equal(0.1, lr(200))
  end)

  it("clips the global gradient norm (2, 1 and inf) and returns the norm before", function()
    for _, case in ipairs { { 2, 5 }, { 1, 7 }, { math.huge, 4 } } do
      local a = shard.tensor({ 3, 0 }):requires_grad_()
      local b = shard.tensor({ 4 }):requires_grad_()
      local l = (a * shard.tensor({ 3, 0 })):sum() + (b * shard.tensor({ -4 })):sum()   -- grads (3, 0), (-4)
      l:backward()
      local total = optim.clip_grad_norm({ a, b }, 1.0, case[1]):item()
      assert.is_true(math.abs(total - case[2]) < 1e-6, tostring(total))
      local ga, gb = a.grad:tolist(), b.grad:tolist()
      assert.is_true(math.abs(ga[1] - 3 / case[2]) < 1e-5 and math.abs(gb[1] + 4 / case[2]) < 1e-5)
    end
  end)

  -- FSDP's clip scales nothing itself: the next step applies its coefficient, once.
  it("FSDP's clip applies its coefficient in the next step only, as the plain clip does; zero_grad drops it", function()
    local x = shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i64" })
    local function tiny()
      shard.manual_seed(3)
      return shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false }
    end
    local plain, model = tiny(), shard.fsdp.wrap(tiny())
    local po, fo = optim.SGD(plain, { lr = 1 }), optim.SGD(model, { lr = 1 })
    local function backward(m) local l = m(x, x); l:backward(); l:free() end
    local function loss(m) return shard.no_grad(function() return m(x, x):item() end) end
    backward(plain); backward(model)
    local norm = optim.clip_grad_norm(plain, math.huge):item()   -- coefficient 1: grads unchanged
    local got = model:clip_grad_norm(norm / 2):item()
    assert.is_true(math.abs(got - norm) <= 1e-6 * norm, ("fsdp norm %.9g, plain %.9g"):format(got, norm))
    optim.clip_grad_norm(plain, norm / 2)
    po:step(); fo:step(); po:zero_grad(true); fo:zero_grad(true)
    local function same(when)
      local a, b = loss(model), loss(plain)
      assert.is_true(math.abs(a - b) <= 1e-5 * b, ("%s: loss %.9g under fsdp, %.9g plain"):format(when, a, b))
    end
    same("after a clipped step")
    backward(model)
    model:clip_grad_norm(norm / 2)
    fo:zero_grad(true)   -- the clip's coefficient goes with the grads it was for
    backward(plain); backward(model)
    po:step(); fo:step()
    same("after an unclipped step")
  end)
end)
