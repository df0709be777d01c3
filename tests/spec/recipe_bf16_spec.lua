-- The Shakespeare recipe with --dtype=bf16 (FSDP mixed precision on one process: bf16
-- compute, f32 master weights; on the CPU the linear layers' GEMMs run on AVX-512 BF16 in the
-- avx512bf16 kernel set) against the same run in f32: the loss curve must follow f32's within
-- what bf16 rounding moves it, and learn. The same with SHARD_CPU_ISA=generic, the widening
-- path of every CPU without the instructions, which says so once.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local TEXT = "/usr/share/common-licenses/GPL-3"
local ARGS = " --data=" .. TEXT .. " --n_layer=2 --n_head=2 --n_embd=64 --block_size=32 --batch_size=8"
  .. " --max_iters=60 --eval_interval=30 --eval_iters=2 --log_interval=10 --sample_tokens=0 --warmup=5 --lr=3e-3"
-- bf16 keeps 8 bits of mantissa, so the curves drift apart slowly over the steps (measured
-- here: at most 0.006 on either path); a run that stops learning, or a wrong product, moves
-- them by tenths
local TOL = 0.03

-- the logged step losses, then each evaluation's train and val loss; and the train losses
-- of the first and last evaluations
-- the losses, and the first and last evaluation's train loss
local function losses(out)
  local t, train = support.recipe_losses(out)
  return t, train[1], train[#train]
end

local function close(f32_out, out)
  local a = losses(f32_out)
  local b, first, last = losses(out)
  assert.equal(7 + 3 * 2, #a, f32_out)   -- 7 logged steps (0, 10, ..., 50 and the last, 59), 3 evaluations of train and val
  assert.equal(#a, #b, out)
  for i = 1, #a do
    assert.is_true(math.abs(a[i] - b[i]) <= TOL, ("value %d: bf16 %.4f vs f32 %.4f\n%s"):format(i, b[i], a[i], out))
  end
  assert.is_true(last < first - 0.5, ("bf16 did not learn: train loss %.4f at the start, %.4f at the end\n%s"):format(first, last, out))
end

describe("gpt_shakespeare_char recipe --dtype=bf16", function()
  local f32, rc = support.shard("run recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_bf16_f32" .. ARGS)

  it("follows the f32 loss curve", function()
    assert.equal(0, rc, f32)
    local out, code = support.shard("run recipes/gpt_shakespeare_char.lua --dtype=bf16 --out_dir=/tmp/shard_bf16_a" .. ARGS)
    assert.equal(0, code, out)
    close(f32, out)
  end)

  it("follows it on the widening path (SHARD_CPU_ISA=generic), saying so once", function()
    local out, code = support.run("SHARD_CPU_ISA=generic " .. support.quote(support.BIN)
      .. " run recipes/gpt_shakespeare_char.lua --dtype=bf16 --out_dir=/tmp/shard_bf16_b" .. ARGS)
    assert.equal(0, code, out)
    close(f32, out)
    local _, notices = out:gsub("CPU kernel set generic %(no vdpbf16ps%): bf16 matrix products on the CPU widen to f32", "")
    assert.equal(1, notices, out)
  end)

  it("refuses another dtype, naming the choices", function()
    local out, code = support.shard("run recipes/gpt_shakespeare_char.lua --dtype=f16 --out_dir=/tmp/shard_bf16_c" .. ARGS)
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("--dtype=f16: expected one of f32, bf16", 1, true), out)
  end)

  -- no_shard's bf16 copy of the parameters is re-cast after each optimizer step (it was built
  -- once and went stale: the loss stayed flat)
  it("follows it under no_shard", function()
    local out, code = support.shard("run recipes/gpt_shakespeare_char.lua --dtype=bf16 --strategy=no_shard --out_dir=/tmp/shard_bf16_d" .. ARGS)
    assert.equal(0, code, out)
    close(f32, out)
  end)
end)
