-- fsdp.wrap's policies, manual nesting and per-unit strategies: which modules become units,
-- and that the units together hold every parameter exactly once.
local shard = require "shard"
local fsdp, nn = shard.fsdp, shard.nn

local function tiny(n_layer)
  shard.manual_seed(3)
  return nn.GPT{ n_layer = n_layer or 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false }
end

local function unit_names(model)
  local names = {}
  for _, u in ipairs(model.all_units) do names[#names + 1] = u.name end
  return table.concat(names, " ")
end

local function covers_all(model)
  local total = 0
  for _, u in ipairs(model.all_units) do total = total + u:numel() end
  return total == tiny():num_params()
end

local function loss_of(model)
  local x = shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i64" })
  return shard.no_grad(function() return model(x, x):item() end)
end

describe("fsdp.wrap policies", function()
  local want = loss_of(tiny())

  it("transformer{classes}: one unit per Block plus the root", function()
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block } })
    assert.equal(" transformer.h.0 transformer.h.1", unit_names(m))
    assert.is_true(covers_all(m))
    assert.equal(want, loss_of(m))
  end)

  it("size{min_params}: wraps the smallest subtrees that reach the size", function()
    -- at 3000: an MLP (2048) is too small, a block (3104) is not; the rest (embeddings, ln_f:
    -- 320) stays with the root. (GPT uses wte outside `transformer`, so a policy that made
    -- `transformer` a unit would split the tied lm_head from its weight's unit.)
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.size{ min_params = 3000 } })
    assert.equal(" transformer.h.0 transformer.h.1", unit_names(m))
    assert.is_true(covers_all(m))
    assert.equal(want, loss_of(m))
  end)

  it("predicate(fn): wraps what the function picks", function()
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.predicate(function(_, name) return name:match("mlp$") ~= nil end) })
    assert.equal(" transformer.h.0.mlp transformer.h.1.mlp", unit_names(m))
    assert.is_true(covers_all(m))
    assert.equal(want, loss_of(m))
  end)

  it("manual nesting: submodules wrapped first become units of the root", function()
    local model = tiny()
    local blocks = model.transformer.h
    for _, c in ipairs(blocks._children) do
      blocks:replace_child(c.name, fsdp.wrap(c.module, { strategy = "shard_grad_op" }))
    end
    local m = fsdp.wrap(model, { strategy = "full_shard" })
    assert.equal(3, #m.all_units)
    assert.is_true(covers_all(m))
    assert.equal(want, loss_of(m))
  end)

  it("strategy_for overrides the strategy per unit", function()
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
      strategy_for = function(_, name) if name == "transformer.h.1" then return "no_shard" end end })
    assert.equal("full_shard", m.all_units[2].strategy)
    assert.equal("no_shard", m.all_units[3].strategy)
    assert.is_truthy(fsdp.summary(m):find("no_shard", 1, true))
  end)
end)
