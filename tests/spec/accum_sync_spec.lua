-- The recipe's --accum_sync (shard.train): under hybrid_shard at 4 ranks (--hybrid_group=2) with
-- --grad_accum=3, skipping both reductions on the inner micro-batches (last) or only the
-- all-reduce across groups (replica_last) gives the loss curve of one process on the same
-- global batch; bad values stop with a message naming the option.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local TEXT = "/usr/share/common-licenses/GPL-3"
local ARGS = " --data=" .. TEXT .. " --n_layer=1 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 --grad_accum=3"
  .. " --max_iters=4 --eval_interval=2 --eval_iters=1 --log_interval=1 --sample_tokens=0 --warmup=1"
  .. " --straggler_margin=1e9"   -- a loaded machine's straggler warnings would interleave with the loss lines
local run = support.shard

local losses = support.recipe_losses

describe("--accum_sync", function()
  local single, rc = run("run recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_accum_1" .. ARGS)

  for _, mode in ipairs { "last", "replica_last" } do
    it(("=%s under hybrid_shard at 4 ranks gives one process's loss curve"):format(mode), function()
      assert.equal(0, rc, single)
      local out, code = run(("launch --nproc 4 recipes/gpt_shakespeare_char.lua --strategy=hybrid_shard --hybrid_group=2 --accum_sync=%s --out_dir=/tmp/shard_accum_%s%s")
        :format(mode, mode, ARGS))
      assert.equal(0, code, out)
      local a, b = losses(single), losses(out)
      assert.equal(#a, #b, out)
      assert.is_true(#a >= 6, single)
      for i = 1, #a do assert.is_true(math.abs(a[i] - b[i]) <= 2e-4, ("value %d: %.4f vs %.4f\n%s"):format(i, a[i], b[i], out)) end
    end)
  end

  it("refuses an unknown mode, one without FSDP, and replica_last without hybrid", function()
    local cases = {
      { "--accum_sync=sometimes", "--accum_sync=sometimes: expected one of every, last, replica_last" },
      { "--accum_sync=last", "--accum_sync=last: only FSDP reduces gradients" },
      { "--accum_sync=replica_last --strategy=full_shard", "full_shard has no all-reduce across groups" },
    }
    for _, c in ipairs(cases) do
      local out, code = run("run recipes/gpt_shakespeare_char.lua --out_dir=/tmp/shard_accum_bad --max_iters=1 " .. c[1] .. ARGS)
      assert.equal(2, code, out)   -- a wrong command line, found before any work
      assert.is_truthy(out:find(c[2], 1, true), out)
    end
  end)
end)
