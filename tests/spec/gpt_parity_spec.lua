-- nn.GPT against PyTorch: tests/fixtures/gpt_tiny.safetensors holds a tiny GPT's weights, a
-- batch, its logits, loss, every gradient and the losses of 5 AdamW steps, written by
-- tests/fixtures/make_gpt_fixture.py with Debian's torch 1.13.
local shard = require("shard")
local S = require("shard.io.safetensors")

local FIX = (os.getenv("SHARD_HOME") or ".") .. "/tests/fixtures/gpt_tiny.safetensors"
local CFG = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 65, block_size = 16, bias = true, dropout = 0 }

local function max_abs(t) local m = 0; for _, v in ipairs(t:tolist_flat()) do m = math.max(m, math.abs(v)) end; return m end
local function max_diff(a, b)
  local x, y = a:tolist_flat(), b:tolist_flat()
  assert.equal(#y, #x)
  local m = 0
  for i = 1, #x do m = math.max(m, math.abs(x[i] - y[i])) end
  return m
end

local function load_model(fix)
  local model = shard.nn.GPT(CFG)
  local n = 0
  for _, np in ipairs(model:named_parameters()) do
    local src = fix["param." .. np.name]
    assert(src, "fixture lacks " .. np.name)
    assert.same(src:shape(), np.tensor:shape())
    np.tensor:copy_(src)
    n = n + 1
  end
  return model, n
end

describe("GPT parity with PyTorch", function()
  local fix = S.load(FIX)

  it("has Hugging Face GPT-2 parameter names with lm_head tied to wte", function()
    local model, n = load_model(fix)
    local expect = 0
    for name in pairs(fix) do if name:match("^param%.") then expect = expect + 1 end end
    assert.equal(expect, n)
    assert.equal(model.transformer.wte.weight, model.lm_head.weight)
  end)

  it("matches logits, loss and every gradient", function()
    local model = load_model(fix)
    local logits = shard.no_grad(function() return model:logits(fix.x) end)
    local err = max_diff(logits, fix.logits)
    assert.is_true(err <= 1e-5 * math.max(1, max_abs(fix.logits)), "logits max error " .. err)
    local loss = model(fix.x, fix.y)
    assert.is_true(math.abs(loss:item() - fix.loss:item()) <= 1e-5, "loss " .. loss:item() .. " vs " .. fix.loss:item())
    loss:backward()
    for _, np in ipairs(model:named_parameters()) do
      local ref = fix["grad." .. np.name]
      local g = np.tensor.grad
      local e = max_diff(g, ref)
      assert.is_true(e <= 1e-5 * math.max(1e-3, max_abs(ref)) + 1e-8,
        ("grad %s: max error %.3g (scale %.3g)"):format(np.name, e, max_abs(ref)))
      g:free()
    end
  end)

  it("matches the losses of 5 AdamW steps with gradient clipping", function()
    local model = load_model(fix)
    local opt = shard.optim.AdamW(model, { lr = 1e-2, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
    local ref = fix.adamw_losses:tolist()
    for step = 1, 5 do
      local loss = model(fix.x, fix.y)
      local v = loss:item()
      assert.is_true(math.abs(v - ref[step]) <= 1e-5 * math.max(1, math.abs(ref[step])),
        ("step %d: loss %.7f vs torch %.7f"):format(step, v, ref[step]))
      loss:backward()
      shard.optim.clip_grad_norm(model, 1.0)
      opt:step()
      opt:zero_grad(true)
    end
  end)
end)
