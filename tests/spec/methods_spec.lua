-- Tensor methods are each defined once, by the module that owns them (shard.tensor,
-- shard.ops, shard.functional, shard.autograd), so what a method does cannot depend on the
-- order those modules were loaded in.
local shard = require("shard")
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")

local function run(script)
  local path = support.script(script)
  local out, code = support.shard("run " .. support.quote(path))
  os.remove(path)
  return out, code
end

describe("Tensor methods", function()
  it("the differentiable ones are shard.functional's; the raw bindings are not methods", function()
    local ops = require("shard.ops")
    for _, name in ipairs { "add", "mul", "pow", "exp", "sum", "argmax", "matmul", "mm", "view", "reshape",
                            "narrow", "select", "transpose", "t", "flatten", "softmax", "gelu" } do
      assert.is_true(rawequal(shard.Tensor[name], shard.F[name]), name)
      assert.is_false(rawequal(shard.Tensor[name], ops.raw[name]), name)
    end
  end)

  it("record the same whichever module is loaded first", function()
    local out, code = run([[
      require("shard.functional")   -- before shard.ops, which once redefined a:mul as the raw op
      require("shard.ops")
      local shard = require("shard")
      local a = shard.tensor({ 1, 2, 3 }):requires_grad_()
      local l = (a * a):sum()
      l:backward()
      assert(table.concat(a.grad:tolist(), " ") == "2 4 6", "grad " .. table.concat(a.grad:tolist(), " "))
      print("recorded")
    ]])
    assert.equal(0, code, out)
    assert.is_truthy(out:find("recorded", 1, true), out)
  end)

  it("are all there with only shard.tensor loaded", function()
    local out, code = run([[
      local tensor = require("shard.tensor")
      local t = tensor.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
      assert(t:t():contiguous():view(6):sum():item() == 21)
      assert(t:narrow(2, 2, 2):tolist()[2][2] == 6)
      print("complete")
    ]])
    assert.equal(0, code, out)
    assert.is_truthy(out:find("complete", 1, true), out)
  end)
end)
