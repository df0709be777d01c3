-- Activation checkpointing: the same loss and gradients as without it, fewer bytes held
-- between forward and backward, the same random numbers (dropout) in the re-run, and the
-- same behaviour inside FSDP units.
local shard = require "shard"
local nn = shard.nn
local gradcheck = require "shard.gradcheck"

local CFG = { n_layer = 3, n_head = 2, n_embd = 32, vocab_size = 17, block_size = 16, bias = true, dropout = 0.1 }
local function build() shard.manual_seed(8); return nn.GPT(CFG) end
local x = shard.tensor({ { 1, 5, 2, 9, 3, 3, 16, 0, 4, 4, 7, 8, 1, 2, 3, 4 } }, { dtype = "i64" })

local function run(model)
  shard.manual_seed(99)
  shard.memory.reset_peak()
  local base = shard.memory.stats().allocated
  local loss = model(x, x)
  local held = shard.memory.stats().allocated - base
  loss:backward()
  local grads = {}
  for _, np in ipairs(model:named_parameters()) do grads[np.name] = np.tensor.grad:tolist_flat() end
  return loss:item(), grads, held
end

describe("activation checkpointing", function()
  it("gives the same loss and gradients with less memory held after forward", function()
    local l1, g1, held1 = run(build())
    local l2, g2, held2 = run(nn.Module.checkpoint(build(), { nn.Block }))
    assert.equal(l1, l2)
    for name, g in pairs(g1) do assert.same(g, g2[name], name) end
    assert.is_true(held2 < 0.6 * held1, ("held %d with checkpointing vs %d without"):format(held2, held1))
  end)

  it("passes gradcheck on a checkpointed region", function()
    local w = shard.randn({ 4, 3 }):requires_grad_()
    local inp = shard.randn({ 2, 3 }):requires_grad_()
    local ok, worst = gradcheck.check(function(a, b)
      return shard.autograd.checkpoint(function(u, v) return shard.F.linear(u, v):tanh() end, a, b)
    end, { inp, w })
    assert(ok, gradcheck.describe(worst))
  end)

  it("works inside FSDP units (fsdp.wrap{checkpoint = ...})", function()
    local l1, g1 = run(build())
    local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block }, checkpoint = { nn.Block } })
    shard.manual_seed(99)
    local loss = model(x, x)
    loss:backward()
    assert.is_true(math.abs(loss:item() - l1) < 1e-6)
    for _, e in ipairs(model:optim_groups()) do
      local g = e.grad()
      local want = g1[e.name]
      for i, v in ipairs(g:tolist_flat()) do
        assert.is_true(math.abs(v - want[e.start + i]) <= 1e-6 + 1e-5 * math.abs(want[e.start + i]), e.name)
      end
    end
  end)
end)
