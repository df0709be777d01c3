-- shard estimate against a measured FSDP step at world 1: exact parameter and state bytes,
-- and a peak within 25% of what the allocator reports (it assumes the worst overlap).
local shard = require("shard")
local estimate = require("shard.tools.estimate")

describe("shard estimate", function()
  local o = { n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false,
              world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 4, param = "f32" }

  it("counts parameters and per-rank state exactly", function()
    local r = estimate.estimate(o)
    shard.manual_seed(1)
    local P = shard.nn.GPT{ n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false }:num_params()
    assert.equal(P, r.params)
    assert.equal(4 * P, r.master)
    assert.equal(8 * P, r.adamw)
    assert.equal(3, r.units)
  end)

  it("predicts the measured peak of a full_shard step within 25%", function()
    local r = estimate.estimate(o)
    shard.memory.reset_peak()
    local base = shard.memory.stats().allocated
    local model = shard.fsdp.wrap(function()
      return shard.nn.GPT{ n_layer = 2, n_head = 2, n_embd = 64, vocab_size = 65, block_size = 32, bias = false }
    end, { policy = shard.fsdp.policy.transformer{ shard.nn.Block } })
    local opt = shard.optim.AdamW(model, { lr = 1e-3 })
    for _ = 1, 2 do
      local x = shard.zeros({ 4, 32 }, { dtype = "i64" })
      local loss = model(x, x)
      loss:backward()
      opt:step(); opt:zero_grad(true)
      loss:free(); x:free()
    end
    local peak = shard.memory.stats().peak - base
    assert.is_true(math.abs(r.total - peak) <= 0.25 * peak, ("estimated %d, measured %d"):format(r.total, peak))
  end)

  it("runs from the command line: each measured step on stderr as it goes, then the report", function()
    local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
    local args = " --n_layer=1 --n_embd=32 --n_head=2 --vocab_size=11 --block_size=8"
    local code, out, err = support.sh(support.quote(support.BIN) .. " estimate" .. args .. " --world=4")
    assert.equal(0, code, out .. err)
    assert.matches("full_shard over 4 ranks", out)
    -- a line before and after each of the two measured steps (plain `shard estimate` runs
    -- GPT-2-sized steps on the CPU for seconds)
    assert.equal(table.concat({
      "estimate: measuring one step of 1 block on cpu (batch 1, T 8, f32) ...",
      "estimate: one step of 1 block on cpu (batch 1, T 8, f32) took X",
      "estimate: measuring one step of 2 blocks on cpu (batch 1, T 8, f32) ...",
      "estimate: one step of 2 blocks on cpu (batch 1, T 8, f32) took X", "" }, "\n"),
      (err:gsub("took %d+%.?%d* %a+\n", "took X\n")))
    -- every figure in shard.units' format, in aligned columns
    local ends = {}
    for line in out:gmatch("[^\n]+") do
      if line:match("^  %S") then
        local value = line:match("^  .-  +(%-?[%d.]+ %a+)")
        assert.is_truthy(value and (value:match("^%d+ B$") or value:match("^%d+%.%d [KMGT]iB$")), line)
        ends[#ends + 1] = select(2, line:find(value, 1, true))   -- right-aligned: one end column
      end
    end
    assert.equal(7, #ends, out)
    for _, e in ipairs(ends) do assert.equal(ends[1], e, out) end
    assert.matches("estimated peak +[%d.]+ [KMG]?i?B\n", out)
    -- one rank, and a size past 1024 MiB in GiB
    code, out = support.sh(support.quote(support.BIN) .. " estimate --measure=meta --n_layer=12 --world=1 --batch_size=2")
    assert.equal(0, code, out)
    assert.matches("full_shard over 1 rank,", out)
    assert.matches("estimated peak +%d+%.%d GiB\n", out)
  end)

  -- o with some fields changed
  local function with(changes, more)
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    for k, v in pairs(changes) do c[k] = v end
    for k, v in pairs(more or {}) do c[k] = v end
    return c
  end

  it("names a bad option instead of printing nan, a negative size or an internal error (issue 12, item 10)", function()
    local cases = {
      { { world = 0 }, "%-%-world must be a whole number >= 1, got 0" },
      { { world = -2 }, "%-%-world must be a whole number >= 1, got %-2" },
      { { world = 1.5 }, "%-%-world must be a whole number >= 1, got 1.5" },
      { { world = 8, strategy = "hybrid_shard", hybrid_group = 3 }, "%-%-world=8 is not a multiple of %-%-hybrid_group=3" },
      { { world = 8, hybrid_group = 4 }, "%-%-hybrid_group applies to hybrid_shard and hybrid_shard_zero2, not full_shard" },
      { { batch_size = 0 }, "%-%-batch_size must be a whole number >= 1, got 0" },
      { { n_head = 3 }, "%-%-n_embd=64 is not a multiple of %-%-n_head=3" },
      { { strategy = "zero3" }, "unknown strategy zero3" },
      { { param = "fp8" }, "%-%-param must be f32, bf16 or f16, got fp8" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(estimate.estimate, with(c[1]))
      assert.is_false(ok)
      assert.matches("estimate: " .. c[2], tostring(err))
    end
    local r = estimate.estimate(with{ world = 8, strategy = "hybrid_shard", hybrid_group = 4 })
    assert.is_true(r.total > 0)
  end)

  it("counts per-block activations linearly in the batch (gradients are not taken off them)", function()
    -- before: the peak less 4 bytes x every parameter; the peak comes before any block's
    -- gradient exists, so each block lost its gradients' bytes (here more than its activations)
    local per = {}
    for _, b in ipairs { 1, 2, 4 } do
      local r = estimate.estimate(with{ n_embd = 128, n_head = 4, block_size = 16, batch_size = b })
      assert.is_true(r.act_per_block > 0, "per-block activations must be positive")
      per[b] = r.act_per_block
    end
    assert.is_true(math.abs(per[2] / per[1] - 2) < 0.1, ("batch 2 / batch 1 = %.3f"):format(per[2] / per[1]))
    assert.is_true(math.abs(per[4] / per[1] - 4) < 0.2, ("batch 4 / batch 1 = %.3f"):format(per[4] / per[1]))
  end)

  -- the recipe's model (gpt_shakespeare_char): large enough that a block's activations, not
  -- the CPU's f32 staging copies of its bf16 weights for BLAS, are most of its bytes
  local recipe = { n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 12 }

  it("halves per-block activations for bf16 compute parameters", function()
    local f32 = estimate.estimate(with(recipe))
    local bf16 = estimate.estimate(with(recipe, { param = "bf16" }))
    local ratio = bf16.act_per_block / f32.act_per_block
    assert.is_true(ratio > 0.45 and ratio < 0.55, ("bf16 / f32 per-block activations = %.3f"):format(ratio))
  end)

  it("predicts the measured peak of a bf16 mixed-precision full_shard step within 13% (flat grads in bf16)", function()
    local r = estimate.estimate(with(recipe, { param = "bf16" }))
    shard.memory.reset_peak()
    local base = shard.memory.stats().allocated
    local model = shard.fsdp.wrap(function()
      return shard.nn.GPT{ n_layer = 4, n_head = 4, n_embd = 128, vocab_size = 65, block_size = 64, bias = false }
    end, { policy = shard.fsdp.policy.transformer{ shard.nn.Block }, mixed_precision = { param = "bf16" } })
    local opt = shard.optim.AdamW(model, { lr = 1e-3 })
    for _ = 1, 2 do
      local x = shard.zeros({ 12, 64 }, { dtype = "i64" })
      local loss = model(x, x)
      loss:backward()
      opt:step(); opt:zero_grad(true)
      loss:free(); x:free()
    end
    local peak = shard.memory.stats().peak - base
    assert.is_true(math.abs(r.total - peak) <= 0.13 * peak, ("estimated %d, measured %d"):format(r.total, peak))
  end)
end)
