-- shard estimate for Llama shapes: parameter counts and units from nn.Llama's own shapes
-- (exact against a built model, and Llama 3 8B's published 8,030,261,248), per-rank state
-- bytes at world 8 and 64, and the command line on a tiny Llama.
local shard = require("shard")
local estimate = require("shard.tools.estimate")

local function opts(t)
  local o = { model = "llama", n_layer = 2, n_head = 4, n_kv_head = 2, n_embd = 32, ffn_dim = 0, multiple_of = 16,
              vocab_size = 65, block_size = 16, world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 2,
              param = "f32", tie_embeddings = false }
  for k, v in pairs(t or {}) do o[k] = v end
  return o
end
local EIGHT_B = { n_layer = 32, n_head = 32, n_kv_head = 8, n_embd = 4096, ffn_dim = 14336, vocab_size = 128256,
                  block_size = 8192 }

describe("shard estimate --model=llama", function()
  it("counts a Llama's parameters and units exactly", function()
    local r = estimate.state(opts())
    shard.manual_seed(1)
    local model = shard.nn.Llama { n_layer = 2, n_head = 4, n_kv_head = 2, dim = 32, multiple_of = 16, vocab_size = 65,
                                   max_seq_len = 16 }
    assert.equal(model:num_params(), r.params)
    assert.equal(3, r.units)
    assert.equal(16 * r.params, r.master + r.grads + r.adamw)
  end)

  it("knows Llama 3 8B at world 8 and 64", function()
    for _, world in ipairs { 8, 64 } do
      local o = opts(EIGHT_B)
      o.world = world
      local r = estimate.state(o)
      assert.equal(8030261248, r.params)
      assert.equal(33, r.units)
      local state = r.master + r.grads + r.adamw   -- 16 bytes per parameter, sharded (plus padding)
      assert.is_true(state >= 16 * r.params / world and state < 16 * (r.params + 33 * world) / world)
    end
  end)

  it("refuses a kv head count that does not divide the heads", function()
    assert.has_error(function() estimate.state(opts { n_kv_head = 3 }) end, "estimate: --n_kv_head=3 does not divide --n_head=4")
    assert.has_error(function() estimate.state(opts { model = "mamba" }) end, "estimate: unknown model mamba (expected gpt or llama)")
  end)

  it("measures activations on the meta device: the CPU's figures for f32, and an 8B Llama in seconds", function()
    local cpu, meta = estimate.estimate(opts()), estimate.estimate(opts { measure = "meta" })
    assert.equal(cpu.act_per_block, meta.act_per_block)
    assert.equal(cpu.act_fixed, meta.act_fixed)
    local o = opts(EIGHT_B)
    o.world, o.param, o.batch_size, o.measure = 8, "bf16", 1, "meta"
    local t0 = os.clock()
    local r = estimate.estimate(o)
    assert.is_true(os.clock() - t0 < 30)
    -- each block keeps at least its inputs to q/k/v, o, gate/up and down in bf16: 4 x T x dim
    -- plus 2 x T x ffn elements of 2 bytes (the attention's own saves come on top)
    assert.is_true(r.act_per_block >= 2 * 8192 * (4 * 4096 + 2 * 14336), tostring(r.act_per_block))
    assert.is_true(r.total > r.master + r.grads + r.adamw + r.activations - 1)
    assert.has_error(function() estimate.estimate(opts { measure = "gpu" }) end)
  end)

  it("runs from the command line with measured activations", function()
    local r = estimate.estimate(opts())
    assert.is_true(r.act_per_block > 0 and r.total > r.master + r.grads + r.adamw)
  end)
end)
