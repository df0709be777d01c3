-- GPT.generate: appends n sampled tokens, reproducibly for a seed, within the vocabulary;
-- top_k = 1 is greedy decoding.
local shard = require("shard")

describe("GPT:generate", function()
  shard.manual_seed(3)
  local model = shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false }
  local start = shard.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "i64" })

  it("appends n tokens from the vocabulary, past the block size too", function()
    local out = model:generate(start, 10, 1.0)
    assert.same({ 2, 12 }, out:shape())
    for _, row in ipairs(out:tolist()) do
      for _, id in ipairs(row) do assert.is_true(id >= 0 and id < 11 and id == math.floor(id)) end
    end
    assert.same({ 1, 2 }, { out:get({ 1, 1 }), out:get({ 1, 2 }) })
  end)

  it("is reproducible for a seed", function()
    shard.manual_seed(42); local a = model:generate(start, 5, 0.8, 5):tolist()
    shard.manual_seed(42); local b = model:generate(start, 5, 0.8, 5):tolist()
    assert.same(a, b)
  end)

  it("with top_k = 1 picks the argmax of the logits", function()
    local out = model:generate(start, 1, 1.0, 1)
    local logits = shard.no_grad(function() return model(start) end)
    local best = logits:argmax(2):tolist()
    assert.equal(best[1], out:get({ 1, 3 }))
    assert.equal(best[2], out:get({ 2, 3 }))
  end)
end)
