-- shard.profile: per-op forward/backward times, and nothing left wrapped after stop.
local shard = require("shard")

describe("shard.profile", function()
  it("counts every op of a step, forward and backward, and restores the ops", function()
    local F = shard.F
    local linear, add = F.linear, shard.Tensor.add
    shard.manual_seed(1)
    local model = shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 7, block_size = 4, bias = false }
    local x = shard.tensor({ { 1, 2, 3, 4 } }, { dtype = "i64" })
    shard.profile.start()
    local loss = model(x, x)
    loss:backward()
    shard.profile.stop()
    local s = shard.profile.stats
    assert.equal(3, s.linear.calls)            -- c_attn, c_proj, lm_head
    assert.equal(3, s.linear.bwd_calls)
    assert.equal(1, s.gelu_mlp.calls)          -- c_fc, gelu and the mlp's c_proj as one op
    assert.equal(1, s.gelu_mlp.bwd_calls)
    assert.is_true(s.linear.fwd > 0 and s.linear.bwd > 0)
    assert.equal(1, s.causal_attention.calls)
    assert.matches("linear", shard.profile.report())
    assert.equal(linear, F.linear)
    assert.equal(add, shard.Tensor.add)
  end)
end)
