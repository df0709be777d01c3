-- Selective activation checkpointing (issue 11): Module.checkpoint(model, { nn.Block },
-- { keep = ... }) keeps the outputs of the named ops (linear, attention) and recomputes the
-- rest. The loss and every gradient equal those of the model without checkpointing (dropout
-- on: the re-run draws the same numbers); the activations held between forward and backward
-- lie between full checkpointing's and none's, and grow with what is kept; a kept op's
-- kernel is not re-run (its saved output is used: weights changed between forward and
-- backward do not reach it, as they do under full checkpointing); a name that cannot be kept
-- is refused up front.
local shard = require("shard")
local nn, memory = shard.nn, shard.memory
local CFG = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 16, bias = true, dropout = 0.1 }

local function ids(seed)
  shard.manual_seed(seed)
  local u = shard.rand({ 4, CFG.block_size }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  return x
end

-- loss, grads by name, bytes held after the forward; mutate(model) runs between forward and backward
local function run(keep, mutate)
  shard.manual_seed(1)
  local m = nn.GPT(CFG)
  if keep ~= "none" then nn.Module.checkpoint(m, { nn.Block }, keep ~= "full" and { keep = keep } or nil) end
  local x = ids(2)
  collectgarbage(); collectgarbage("stop")
  local before = memory.stats().allocated
  shard.manual_seed(3)
  local loss = m(x, x)
  local held = memory.stats().allocated - before
  collectgarbage("restart")
  if mutate then mutate(m) end
  loss:backward()
  local grads = {}
  for _, np in ipairs(m:named_parameters()) do grads[np.name] = np.tensor.grad:tolist_flat() end
  local l = loss:item()
  loss:free(); x:free()
  return l, grads, held
end

local function max_diff(a, b)
  local worst = 0
  for name, g in pairs(a) do
    for i = 1, #g do worst = math.max(worst, math.abs(g[i] - b[name][i])) end
  end
  return worst
end

describe("selective activation checkpointing", function()
  local l0, g0, none = run("none")
  local _, _, full = run("full")

  it("gives the loss and gradients of no checkpointing, keeping linear and attention outputs", function()
    for _, keep in ipairs { { "linear", "attention" }, { "linear" }, { "attention" } } do
      local l, g = run(keep)
      assert.is_true(math.abs(l - l0) <= 1e-6, ("keep %s: loss %.8f vs %.8f"):format(table.concat(keep, ","), l, l0))
      local d = max_diff(g, g0)
      assert.is_true(d <= 1e-6, ("keep %s: gradients differ by %.3g"):format(table.concat(keep, ","), d))
    end
  end)

  it("holds more than full checkpointing and less than none, more as more is kept", function()
    local _, _, lin = run({ "linear" })
    local _, _, both = run({ "linear", "attention" })
    assert.is_true(full < lin and lin < both and both < none,
      ("held after forward: full %d, keep linear %d, keep linear+attention %d, none %d"):format(full, lin, both, none))
  end)

  it("uses the saved output of a kept op instead of re-running its kernel", function()
    -- c_fc's weight changes between forward and backward. c_proj's weight gradient is its
    -- input (gelu of c_fc's output) times the upstream gradient: re-running c_fc (full
    -- checkpointing) changes it, a kept c_fc output (keep linear) leaves it as without the change
    local function bump(m) m.transformer.h._children[1].module.mlp.c_fc.weight:scale_(3) end
    local name = "transformer.h.0.mlp.c_proj.weight"
    local _, g_full = run("full", bump)
    local _, g_kept = run({ "linear" }, bump)
    local d_full, d_kept = 0, 0
    for i = 1, #g0[name] do
      d_full = math.max(d_full, math.abs(g_full[name][i] - g0[name][i]))
      d_kept = math.max(d_kept, math.abs(g_kept[name][i] - g0[name][i]))
    end
    assert.is_true(d_full > 1e-4, ("full checkpointing re-ran c_fc: expected a change, got %.3g"):format(d_full))
    assert.is_true(d_kept <= 1e-6, ("keep linear: c_proj's gradient moved by %.3g: c_fc was re-run"):format(d_kept))
  end)

  it("refuses an op whose output cannot be kept, naming the ones that can", function()
    local m = nn.GPT(CFG)
    local ok, err = pcall(nn.Module.checkpoint, m, { nn.Block }, { keep = { "linear", "gelu" } })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("keep[2] is 'gelu'; the ops whose outputs can be kept are attention, linear, matmul", 1, true), err)
  end)
end)
