-- shard.cuda_graph on a machine without CUDA (the CUDA side: tests/gpu/cuda_graph_step.lua):
-- it refuses with a clear error instead of running anything; the step helper checks its
-- arguments, runs its warm-up steps eagerly and refuses at the capture; the recipes'
-- --cuda_graph takes their lr schedule and refuses what a replayed step cannot keep, before
-- any work, naming the flag to drop.
local shard = require("shard")
local cuda_graph = require("shard.cuda_graph")
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")

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

  it("--cuda_graph: takes the default lr schedule; refuses deterministic mode, offload and a CPU device by name", function()
    local recipe = "run recipes/gpt_shakespeare_char.lua --data=/usr/share/common-licenses/GPL-3 --max_iters=1 --out_dir=" ..
                   os.tmpname() .. "_cg"
    -- no GPU here: the schedule passes the checks and the device is what is refused
    local out, code = support.shard(recipe .. " --cuda_graph")
    assert.are_not.equal(0, code)
    assert.matches("--cuda_graph: needs a CUDA device, got cpu", out, 1, true)
    out, code = support.shard(recipe .. " --cuda_graph --deterministic")
    assert.are_not.equal(0, code)
    assert.matches("--cuda_graph with --deterministic: the deterministic step is not captured (fsdp/determ.lua runs " ..
                   "it row by row); drop --deterministic (or drop --cuda_graph)", out, 1, true)
    out, code = support.shard(recipe .. " --cuda_graph --offload --strategy=full_shard")
    assert.are_not.equal(0, code)
    assert.matches("--cuda_graph with --offload: CPU offload copies on a stream of its own, outside the captured step; " ..
                   "drop --offload", out, 1, true)
    out, code = support.shard(recipe .. " --cuda_graph --strategy=full_shard --accum_sync=last --grad_accum=2")
    assert.are_not.equal(0, code)
    assert.matches("--cuda_graph with --accum_sync=last: the captured step syncs gradients on every micro-batch; " ..
                   "leave --accum_sync at every", out, 1, true)
  end)
end)
