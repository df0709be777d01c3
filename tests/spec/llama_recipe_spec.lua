-- The Llama Shakespeare recipe end to end, small: one process trains, evaluates and samples,
-- and `shard launch --nproc 2` under full_shard (units on LlamaBlock) gives its loss curve.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local TEXT = "/usr/share/common-licenses/GPL-3"
local ARGS = " --data=" .. TEXT .. " --n_layer=2 --n_head=4 --n_kv_head=2 --dim=32 --ffn_dim=64 --block_size=16"
  .. " --batch_size=4 --max_iters=6 --eval_interval=3 --eval_iters=1 --log_interval=1 --sample_tokens=20 --warmup=2"

local run = support.shard

local losses = support.recipe_losses

describe("llama_shakespeare_char recipe", function()
  local single, rc = run("run recipes/llama_shakespeare_char.lua --out_dir=/tmp/shard_llama_recipe_1" .. ARGS)

  it("trains, evaluates and samples in one process", function()
    assert.equal(0, rc, single)
    assert.is_truthy(single:find("---- sample ----", 1, true))
    assert.equal(6 + 3 * 2, #losses(single))
  end)

  it("gives the same loss curve under launch --nproc 2 --strategy=full_shard", function()
    local out, code = run("launch --nproc 2 recipes/llama_shakespeare_char.lua --strategy=full_shard"
      .. " --out_dir=/tmp/shard_llama_recipe_2" .. ARGS)
    assert.equal(0, code, out)
    local a, b = losses(single), losses(out)
    assert.equal(#a, #b, out)
    for i = 1, #a do assert.is_true(math.abs(a[i] - b[i]) <= 2e-4, ("value %d: %.4f vs %.4f\n%s"):format(i, a[i], b[i], out)) end
  end)
end)
