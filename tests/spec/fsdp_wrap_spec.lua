-- fsdp.wrap's policies, manual nesting and per-unit strategies: which modules become units,
-- and that the units together hold every parameter exactly once.
local shard = require("shard")
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
    -- 320) stays with the root.
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

-- Shared parameters (issue 19, item 1): a policy that puts the users of one parameter in
-- different units leaves the parameter with the closest unit over all of them.
describe("fsdp.wrap with shared parameters", function()
  local Pair = nn.Module:extend("Pair")   -- b's weight is a's
  function Pair:init()
    shard.manual_seed(5)
    self:child("a", nn.Linear(4, 4))
    self:child("b", nn.Linear(4, 4))
    self.b:param("weight", self.a.weight)
  end
  function Pair:forward(x) return self.b(self.a(x)) end

  it("transformer{ nn.Block, nn.Embedding }: wte is a unit, its weight (tied to lm_head) stays with the root", function()
    local want = loss_of(tiny())
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block, nn.Embedding } })
    assert.equal(" transformer.wte transformer.wpe transformer.h.0 transformer.h.1", unit_names(m))
    assert.equal(0, m.all_units[2]:numel())
    assert.is_true(covers_all(m))
    assert.equal(1, #m.shared)
    assert.same({ name = "transformer.wte.weight", users = { "lm_head.weight", "transformer.wte.weight" }, unit = "(root)" }, m.shared[1])
    assert.is_truthy(fsdp.summary(m):find("shared transformer.wte.weight (used by lm_head.weight, transformer.wte.weight) is held by (root)", 1, true))
    assert.equal(want, loss_of(m))
  end)

  it("two units tied by a registered parameter: one copy at the root, both uses in its gradient", function()
    local ref = Pair()
    local x = shard.tensor({ { 1, -2, 0.5, 3 } })
    local l = ref(x):sum(); l:backward()
    local want = ref.a.weight.grad:tolist_flat()
    local m = fsdp.wrap(Pair(), { policy = fsdp.policy.transformer{ nn.Linear } })
    assert.same({ name = "a.weight", users = { "a.weight", "b.weight" }, unit = "(root)" }, m.shared[1])
    assert.equal(16, m.all_units[1]:numel())            -- the root holds the shared weight once
    assert.equal(4, m.all_units[2]:numel())             -- a and b keep their biases
    local loss = m(x):sum(); loss:backward()
    local got
    for _, e in ipairs(m:optim_groups()) do
      if e.name == "a.weight" then local g = e.grad(); got = g:tolist_flat(); g:free() end
      e.tensor:free()
    end
    for i = 1, #want do assert.is_true(math.abs(got[i] - want[i]) <= 1e-6 * math.max(1, math.abs(want[i])), i) end
  end)

  it("refuses a unit wrapped on its own before whose parameter is used outside it, naming both users", function()
    local p = Pair()
    p:replace_child("b", fsdp.wrap(p.b))
    local ok, err = pcall(fsdp.wrap, p)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("parameter b.weight is used by b.weight inside the unit b", 1, true), err)
    assert.is_truthy(tostring(err):find("and by a.weight outside it", 1, true), err)
  end)
end)

-- nn.global_loss (issue 19, item 3) in one process; tests/mpi/loss_global.lua runs it on
-- several ranks with accumulation against one process.
describe("nn.global_loss", function()
  it("weighs each micro-batch's mean by its share of the valid target tokens", function()
    local y1 = shard.tensor({ { 1, 2, -1, -1 } }, { dtype = "i64" })     -- 2 valid
    local y2 = shard.tensor({ { 3, 4, 5, 6 } }, { dtype = "i64" })       -- 4 valid
    local y3 = shard.tensor({ { -1, -1, -1, -1 } }, { dtype = "i64" })   -- none
    local gl = nn.global_loss({ y1, y2, y3 })
    assert.same({ 2, 4, 0 }, gl.counts)
    assert.equal(6, gl.tokens)
    local function scaled(v, i) local t = shard.tensor({ v }); local s = gl:scale(t, i); local r = s:tolist_flat()[1]; t:free(); s:free(); return r end
    assert.is_true(math.abs(scaled(3, 1) - 1) < 1e-6)        -- 3 * 2 / 6
    assert.is_true(math.abs(scaled(3, 2) - 2) < 1e-6)        -- 3 * 4 / 6
    assert.equal(0, scaled(3, 3))
    assert.is_true(math.abs(gl:mean(3) - 3) < 1e-12)
  end)

  it("refuses a tensor where a list belongs, and an index outside the list", function()
    local y = shard.tensor({ { 1, 2 } }, { dtype = "i64" })
    local ok, err = pcall(nn.global_loss, y)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("one tensor (wrap it in { })", 1, true), err)
    local gl = nn.global_loss({ y })
    ok, err = pcall(gl.scale, gl, shard.tensor({ 1 }), 2)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("micro-batch index out of range 1..1", 1, true), err)
  end)
end)

describe("fsdp.wrap mixed precision", function()
  it("reduces gradients in f32 unless reduce says otherwise", function()
    local function reduce_dtypes(mp)
      local model = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block }, mixed_precision = mp })
      local seen = {}
      for _, u in ipairs(model.all_units) do
        if u.fp then local i = u.fp:info(); seen[i.param_dtype .. "/" .. i.reduce_dtype] = true end
      end
      local out = {}
      for k in pairs(seen) do out[#out + 1] = k end
      return table.concat(out, ",")
    end
    assert.equal("bf16/f32", reduce_dtypes({ param = "bf16" }))
    assert.equal("f16/f32", reduce_dtypes({ param = "f16" }))
    assert.equal("bf16/bf16", reduce_dtypes({ param = "bf16", reduce = "bf16" }))
    assert.equal("f32/f32", reduce_dtypes(nil))
  end)
end)

describe("a wrapped model's methods outside its forward", function()
  it("logits names the way out while sharded, and gives the plain model's logits when gathered", function()
    local x = shard.tensor({ { 1, 2, 3, 4 } }, { dtype = "i64" })
    local want = shard.no_grad(function() return tiny():logits(x):tolist_flat() end)
    local m = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block } })
    local ok, err = pcall(function() return m:logits(x) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("FSDP-wrapped", 1, true))
    assert.truthy(tostring(err):find("model:unshard()", 1, true))
    -- gathered around the call, before any forward recorded the units' order
    local got = shard.no_grad(function()
      m:unshard()
      local l = m:logits(x)
      m:reshard()
      return l:tolist_flat()
    end)
    assert.same(want, got)
  end)
end)
