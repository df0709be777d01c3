-- `shard bench`: lists the benchmarks, runs one by name, refuses an unknown one.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local run = support.shard

describe("shard bench", function()
  it("lists the benchmarks", function()
    local out, code = run("bench")
    assert.equal(0, code)
    assert.matches("cpu_train", out)
  end)

  it("runs one by name with overrides", function()
    local out, code = run("bench cpu_train --iters=1 --warmup=0 --n_layer=1 --n_embd=16 --n_head=2 --block_size=8 --batch_size=2")
    assert.equal(0, code, out)
    assert.matches("tokens_per_s %d", out)
  end)

  it("refuses an unknown benchmark with exit code 2", function()
    local out, code = run("bench nope")
    assert.equal(2, code)
    assert.matches("no benchmark 'nope'", out)
  end)
end)
