-- shard estimate against a measured FSDP step at world 1: exact parameter and state bytes,
-- and a peak within 25% of what the allocator reports (it assumes the worst overlap).
local shard = require "shard"
local estimate = require "shard.estimate"

describe("shard estimate", function()
  local o = { n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false,
              world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 4, param = "f32" }

  it("counts parameters and per-rank state exactly", function()
    local r = estimate.estimate(o)
    shard.manual_seed(1)
    local P = shard.nn.GPT{ n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false }:num_params()
    assert.equal(P, r.params)
    assert.equal(4 * P, r.master)
    assert.equal(8 * P, r.adamw)
    assert.equal(3, r.units)
  end)

  it("predicts the measured peak of a full_shard step within 25%", function()
    local r = estimate.estimate(o)
    shard.memory.reset_peak()
    local base = shard.memory.stats().allocated
    local model = shard.fsdp.wrap(function()
      return shard.nn.GPT{ n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false }
    end, { policy = shard.fsdp.policy.transformer{ shard.nn.Block } })
    local opt = shard.optim.AdamW(model, { lr = 1e-3 })
    for _ = 1, 2 do
      local x = shard.zeros({ 4, 32 }, { dtype = "i64" })
      local loss = model(x, x)
      loss:backward()
      opt:step(); opt:zero_grad(true)
      loss:free(); x:free()
    end
    local peak = shard.memory.stats().peak - base
    assert.is_true(math.abs(r.total - peak) <= 0.25 * peak, ("estimated %d, measured %d"):format(r.total, peak))
  end)

  it("runs from the command line", function()
    local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
    local out, code = support.shard("estimate --n_layer=1 --n_embd=32 --n_head=2 --vocab_size=11 --block_size=8 --world=4")
    assert.equal(0, code, out)
    assert.matches("estimated peak", out)
    assert.matches("full_shard over 4 ranks", out)
  end)
end)
