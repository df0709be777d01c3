-- shard.cuda_graph on a machine without CUDA (the CUDA side: tests/gpu/cuda_graph_step.lua):
-- it refuses with a clear error instead of running anything; the step helper checks its
-- arguments, runs its warm-up steps eagerly and refuses at the capture.
local shard = require("shard")
local cuda_graph = require("shard.cuda_graph")

describe("shard.cuda_graph without a GPU", function()
  it("refuses a CPU device or a bad name, naming what it got", function()
    local ok, err = pcall(cuda_graph.capture, "cpu", function() end)
    assert.is_false(ok)
    assert.matches("needs a CUDA device (cuda or cuda:N), got cpu", err, 1, true)
    ok, err = pcall(cuda_graph.capture, "gpu0", function() end)
    assert.matches("got gpu0", err, 1, true)
  end)

  it("runs the warm-up steps eagerly, then refuses CPU tensors at the capture", function()
    local calls = 0
    local step = cuda_graph.step(function(x) calls = calls + 1; return x * 2 end, { warmup = 2 })
    local x = shard.tensor({ 1, 2 })
    assert.are.same({ 2, 4 }, step(x):tolist())
    step(x)
    assert.equals(2, calls)
    local ok, err = pcall(step, x)
    assert.is_false(ok)
    assert.matches("cuda_graph.step: a CUDA graph needs a CUDA device (cuda or cuda:N), got cpu", err, 1, true)
    assert.equals(2, calls)
  end)

  it("checks its arguments", function()
    assert.has_error(function() cuda_graph.step(42) end, "cuda_graph.step: expected a function, got number")
    for _, w in ipairs { 0, 1.5, "2" } do
      local ok, err = pcall(cuda_graph.step, function() end, { warmup = w })
      assert.is_false(ok)
      assert.matches("warmup must be a whole number >= 1", err, 1, true)
    end
  end)
end)
