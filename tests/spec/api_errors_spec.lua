-- Bad input to the Lua API gets an error naming the op, the argument and what was wrong,
-- with dims and indices counted from 1 as the API counts them: never a raw Lua error from
-- inside shard ("attempt to index a nil value"), a crash, or a silent wrong answer
-- (issue 12, items 12 and 13).
local shard = require("shard")
local nn = shard.nn

-- The message of the error fn raises; fails the test if it raises none.
local function err_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

-- No raw Lua runtime error leaked from shard's own files.
local function not_raw(msg)
  assert.is_nil(msg:match("attempt to"), "raw internal error: " .. msg)
end

describe("indices and dims are 1-based in messages and checks", function()
  local a = shard.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })

  it("get takes a table or numbers", function()
    assert.equal(6, a:get(2, 3))
    assert.equal(6, a:get({ 2, 3 }))
    assert.equal(6, a:get({ -1, -1 }))
  end)

  it("refuses index 0 instead of reading the last element", function()
    local msg = err_of(function() return a:get({ 0, 0 }) end)
    assert.matches("get: index 0 is out of range for dim 1 of size 2", msg)
    msg = err_of(function() return a:set({ 1, 0 }, 7) end)
    assert.matches("set: index 0 is out of range for dim 2 of size 3", msg)
    assert.equal(3, a:get(1, 3))
  end)

  it("names an index past the end as the caller wrote it", function()
    assert.matches("get: index 4 is out of range for dim 2 of size 3", err_of(function() return a:get({ 1, 4 }) end))
    assert.matches("get: index 3 is out of range for dim 1 of size 2", err_of(function() return a:get(3, 1) end))
    assert.matches("get: index has 1 entries", err_of(function() return a:get({ 1 }) end))
    assert.matches("get: index entry 2 must be an integer, got 1.5", err_of(function() return a:get({ 1, 1.5 }) end))
    assert.matches("set: expected a table of indices", err_of(function() return a:set(1, 2) end))
    assert.matches("set: the value must be a number", err_of(function() return a:set({ 1, 1 }) end))
  end)

  it("view ops name dims 1-based", function()
    assert.matches("narrow: dim 3 is out of range for f32%[2,3%] cpu %(dims are 1%-based", err_of(function() return a:narrow(3, 1, 1) end))
    assert.matches("narrow: elements 3..4 are out of range for dim 2 of size 3", err_of(function() return a:narrow(2, 3, 2) end))
    assert.matches("narrow: elements 0..0 are out of range", err_of(function() return a:narrow(2, 0, 1) end))
    assert.matches("select: index 3 is out of range for dim 1 of size 2", err_of(function() return a:select(1, 3) end))
    assert.matches("select: index 0 is out of range", err_of(function() return a:select(1, 0) end))
    assert.matches("transpose: dim 3 is out of range", err_of(function() return a:transpose(1, 3) end))
    assert.matches("unsqueeze: dim 4 is out of range", err_of(function() return a:unsqueeze(4) end))
    assert.matches("squeeze: dim 2 of f32%[2,3%] cpu has size 3, not 1", err_of(function() return a:squeeze(2) end))
    assert.matches("permute: dim 1 is given twice", err_of(function() return a:permute(1, 1) end))
    assert.matches("sum: dim 0 is out of range", err_of(function() return a:sum(0) end))
    assert.matches("max: dim 3 is out of range", err_of(function() return require("shard.ops").raw.max(a, 3) end))
    assert.matches("index 3 out of range for dim 1 of size 2", err_of(function() return a[3] end))
  end)

  it("C messages for a dim the caller did not pass read the same 0- or 1-based", function()
    local msg = err_of(function() return a + shard.zeros({ 4, 3 }) end)
    assert.matches("add: shapes %[2,3%] and %[4,3%] do not broadcast %(the 1st dim of the result: 2 vs 4%)", msg)
    msg = err_of(function() return a:expand(2, 4) end)
    assert.matches("expand: cannot expand f32%[2,3%] cpu to %[2,4%] %(the 2nd dim: 3 vs 4%)", msg)
  end)
end)

describe("tensor arguments", function()
  local a = shard.zeros({ 2, 3 })

  it("matmul names a nil operand", function()
    assert.matches("matmul: b %(argument 2%) must be a tensor, got nil", err_of(function() return a:matmul(nil) end))
    assert.matches("matmul: a %(argument 1%) must be a tensor, got nil", err_of(function() return shard.F.matmul(nil, a) end))
    assert.matches("mm: b %(argument 2%) must be a tensor, got a number", err_of(function() return a:mm(3) end))
  end)

  it("matmul refuses an integer operand instead of promoting it", function()
    local ids = shard.zeros({ 3, 2 }, { dtype = "i64" })
    assert.matches("matmul: needs float tensors, got f32%[2,3%] cpu @ i64%[3,2%] cpu", err_of(function() return a:matmul(ids) end))
    assert.matches("matmul: needs float tensors", err_of(function() return ids:matmul(a:t()) end))
  end)

  it("a module called with nil names the op and the argument", function()
    local lin = nn.Linear(3, 2)
    local msg = err_of(function() return lin(nil) end)
    not_raw(msg)
    assert.matches("linear: x %(argument 1%) must be a tensor, got nil", msg)
    msg = err_of(function() return nn.LayerNorm(3)("x") end)
    assert.matches("layernorm: x %(argument 1%) must be a tensor, got a string", msg)
  end)

  it("GPT names a nil or non-tensor idx and targets", function()
    local gpt = nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 11, block_size = 4, bias = false }
    assert.matches("GPT: idx must be a %[batch, time%] tensor of token ids, got nil", err_of(function() return gpt(nil) end))
    local idx = shard.zeros({ 1, 4 }, { dtype = "i64" })
    assert.matches("GPT: targets must be a tensor", err_of(function() return gpt(idx, { 1, 2 }) end))
  end)

  it("unary ops, reductions and views name a non-tensor input", function()
    local msg = err_of(function() return shard.F.exp(nil) end)
    assert.matches("exp: the input %(argument 1%) must be a tensor, got nil", msg)
    assert.matches("sum: the input", err_of(function() return shard.F.sum({}) end))
    assert.matches("view: the input", err_of(function() return shard.F.view(nil, 3) end))
  end)
end)

describe("backward", function()
  it("refuses a non-scalar root without a gradient", function()
    local w = shard.randn({ 3 }):requires_grad_()
    local y = w * 2
    assert.matches("backward: f32%[3%] cpu is not a scalar", err_of(function() y:backward() end))
    assert.is_nil(w.grad)
    -- with a gradient of its shape it runs; of another shape it is refused
    assert.matches("backward: gradient f32%[2%] cpu does not have the shape of f32%[3%] cpu",
      err_of(function() y:backward(shard.ones({ 2 })) end))
    y:backward(shard.ones({ 3 }))
    assert.same({ 2, 2, 2 }, w.grad:tolist())
  end)

  it("refuses a second backward over a graph already run", function()
    local w = shard.randn({ 3 }):requires_grad_()
    local loss = (w * 2):sum()
    loss:backward()
    local before = w.grad:tolist()
    assert.matches("backward: the graph of f32%[%] cpu was already run backward", err_of(function() loss:backward() end))
    assert.same(before, w.grad:tolist())
  end)

  it("a one-element non-0-dim root is a scalar", function()
    local w = shard.randn({ 1 }):requires_grad_()
    local y = w * 3
    y:backward()
    assert.same({ 3 }, w.grad:tolist())
  end)
end)

describe("fsdp.wrap", function()
  local function mlp() shard.manual_seed(1); return nn.MLP(4) end

  it("names a nil model", function()
    local msg = err_of(function() return shard.fsdp.wrap(nil) end)
    not_raw(msg)
    assert.matches("fsdp.wrap: expected a module %(or a function that builds one%), got nil", msg)
  end)

  it("refuses a policy that is not a function", function()
    local msg = err_of(function() return shard.fsdp.wrap(mlp(), { policy = "transformer" }) end)
    assert.matches("fsdp.wrap: policy must be a function", msg)
    assert.matches("got string transformer", msg)
    assert.matches("fsdp.policy.transformer: expected a list of module classes",
      err_of(function() return shard.fsdp.policy.transformer(nil) end))
    assert.matches("fsdp.policy.size: expected min_params", err_of(function() return shard.fsdp.policy.size() end))
  end)

  it("requires a boolean from the policy: 0 is not true", function()
    local msg = err_of(function() return shard.fsdp.wrap(mlp(), { policy = function() return 0 end }) end)
    assert.matches("fsdp.wrap: the policy returned 0 %(number%) for module 'c_fc'; it must return true or false", msg)
    local root = shard.fsdp.wrap(mlp(), { policy = function(m, name) return name == "c_fc" end })
    assert.equal(1, #root.units)
  end)
end)

describe("layers", function()
  it("refuse a nil or non-integer size instead of building a wrong shape", function()
    assert.matches("Linear: n_in %(argument 1%) must be a positive integer, got nil", err_of(function() return nn.Linear(nil, 3) end))
    assert.matches("Linear: n_out %(argument 2%) must be a positive integer, got 2.5", err_of(function() return nn.Linear(3, 2.5) end))
    assert.matches("Embedding: dim %(argument 2%) must be a positive integer, got nil", err_of(function() return nn.Embedding(10) end))
    assert.matches("LayerNorm: dim %(argument 1%) must be a positive integer, got 0", err_of(function() return nn.LayerNorm(0) end))
    assert.matches("Dropout: p must be a number in %[0, 1%)", err_of(function() return nn.Dropout(1.5) end))
    assert.same({ 2, 3 }, nn.Linear(3, 2).weight:shape())
  end)
end)

describe("shard.load", function()
  it("names a directory given as the checkpoint", function()
    local msg = err_of(function() return shard.load(nn.Linear(3, 2), "/tmp") end)
    not_raw(msg)
    assert.matches("shard.load: /tmp is a directory", msg)
    assert.matches("shard.load: path must be a string, got nil", err_of(function() return shard.load(nn.Linear(3, 2)) end))
  end)
end)

describe("optimizers", function()
  it("refuse a freed model instead of building one whose step does nothing", function()
    local m = nn.Linear(4, 3)
    for _, p in ipairs(m:parameters()) do p:free() end
    local msg = err_of(function() return shard.optim.AdamW(m, { lr = 1e-3 }) end)
    not_raw(msg)
    assert.matches("optim: parameter 1 %(f32%[3,4%] cpu %(freed%)%) was freed", msg)
    assert.matches("optim: expected a model or a list of tensors, got nil", err_of(function() return shard.optim.SGD(nil) end))
  end)
end)
