-- The Shakespeare recipe end to end, small: single process against `shard launch` at 2 and
-- 4 ranks under FSDP strategies. batch_size is the global batch and every rank takes its
-- share of the same windows, so the loss curves must match the single process's.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local TEXT = "/usr/share/common-licenses/GPL-3"
local ARGS = " --data=" .. TEXT .. " --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4"
  .. " --max_iters=6 --eval_interval=3 --eval_iters=1 --log_interval=1 --sample_tokens=20 --warmup=2"

local run = support.shard

local losses = support.recipe_losses

describe("gpt_shakespeare_char recipe", function()
  local single, rc = run("run recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_recipe_1" .. ARGS)

  it("trains, evaluates and samples in one process", function()
    assert.equal(0, rc, single)
    assert.is_truthy(single:find("---- sample ----", 1, true))
    assert.equal(6 + 3 * 2, #losses(single))   -- 6 logged steps, 3 evaluations of train and val
  end)

  for _, case in ipairs { { 2, "full_shard" }, { 2, "shard_grad_op" }, { 4, "no_shard" }, { 4, "hybrid_shard" } } do
    local n, strategy = case[1], case[2]
    it(("gives the same loss curve under launch --nproc %d --strategy=%s"):format(n, strategy), function()
      local out, code = run(("launch --nproc %d recipes/gpt_shakespeare_char.lua --strategy=%s --out_dir=/tmp/shard_recipe_%d%s")
        :format(n, strategy, n, ARGS))
      assert.equal(0, code, out)
      local a, b = losses(single), losses(out)
      assert.equal(#a, #b, out)
      for i = 1, #a do assert.is_true(math.abs(a[i] - b[i]) <= 2e-4, ("value %d: %.4f vs %.4f\n%s"):format(i, a[i], b[i], out)) end
    end)
  end

  it("stops on a --data that does not exist, naming it (no silent substitute)", function()
    local out, code = run("run recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_recipe_y --data=/nonexistent/corpus.txt --max_iters=1")
    assert.equal(2, code, out)
    assert.is_truthy(out:find("--data=/nonexistent/corpus.txt: cannot read it", 1, true), out)
  end)

  it("without the Shakespeare text stops unless it is make run's demo, which says so", function()
    local home = "SHARD_DATA=/nonexistent "   -- where tinyshakespeare.txt is not
    local args = " --out_dir=/tmp/shard_recipe_z --n_layer=1 --n_head=1 --n_embd=8 --block_size=8 --batch_size=2"
      .. " --max_iters=1 --eval_interval=1 --eval_iters=1 --sample_tokens=1"
    local out, code = support.run(home .. support.quote(support.BIN) .. " run recipes/gpt_shakespeare_char.lua" .. args)
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("no corpus", 1, true), out)
    out, code = support.run(home .. support.quote(support.BIN) .. " run recipes/gpt_shakespeare_char.lua --demo" .. args)
    assert.equal(0, code, out)
    assert.is_truthy(out:find("*** DEMO:", 1, true), out)
  end)

  it("never hands a path to a shell: an out_dir holding $(...) is a directory name", function()
    local dir = "/tmp/shard_recipe_$(touch /tmp/shard_injected)"
    os.remove("/tmp/shard_injected")
    local out, code = run("run recipes/gpt_shakespeare_char.lua --out_dir=" .. support.quote(dir) .. ARGS .. " --max_iters=1")
    assert.equal(0, code, out)
    assert.is_nil(io.open("/tmp/shard_injected", "r"))
    assert.is_truthy(io.open(dir .. "/data/GPL-3/meta.lua", "r"))
  end)

  -- CPU offload on the CPU backend: nothing to move, said once, the same training
  it("takes --offload under FSDP: on the CPU it says there is nothing to move and trains the same", function()
    local plain, rc1 = run("run recipes/gpt_shakespeare_char.lua --strategy=full_shard --out_dir=/tmp/shard_recipe_o1" .. ARGS)
    local out, rc2 = run("run recipes/gpt_shakespeare_char.lua --strategy=full_shard --offload --out_dir=/tmp/shard_recipe_o2" .. ARGS)
    assert.equal(0, rc1, plain)
    assert.equal(0, rc2, out)
    local _, notes = out:gsub("nothing to move", "")
    assert.equal(1, notes, out)
    local a, b = losses(plain), losses(out)
    assert.equal(#a, #b, out)
    for i = 1, #a do assert.equal(a[i], b[i], out) end
    local bad, code = run("run recipes/gpt_shakespeare_char.lua --offload --out_dir=/tmp/shard_recipe_o3" .. ARGS)
    assert.are_not.equal(0, code)
    assert.is_truthy(bad:find("--offload needs a sharding strategy", 1, true), bad)
  end)

  it("refuses several ranks without a strategy, naming the choices", function()
    local out, code = run("launch --nproc 2 recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_recipe_x" .. ARGS)
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("need a sharding strategy", 1, true), out)
  end)
end)
