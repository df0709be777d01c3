-- FSDP's bad input and faults: clear errors, never a crash or a hang.
local shard = require("shard")
local fsdp, nn = shard.fsdp, shard.nn
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"


local function tiny() return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false } end

describe("fsdp.wrap", function()
  it("keeps a tied pair in one unit, stored once", function()
    local model = fsdp.wrap(tiny(), { policy = fsdp.policy.transformer{ nn.Block } })
    local root = model.all_units[1]
    local P = 0
    for _, t in ipairs(tiny():parameters()) do P = P + t:numel() end
    local total = 0
    for _, u in ipairs(model.all_units) do total = total + u:numel() end
    assert.equal(P, total)     -- wte counted once although lm_head uses it too
    assert.is_truthy(fsdp.summary(model):find("(root)", 1, true))
  end)

  it("closes the deferred-init context of a constructor it refused, and nests it", function()
    local Pair = nn.Module:extend("Pair")
    function Pair:init()
      self:child("a", nn.Linear(4, 4))
      self:child("b", nn.Linear(4, 4))
      self.b:param("weight", self.a.weight)
    end
    assert.is_false(pcall(fsdp.wrap, function() return Pair() end, { policy = function() return 1 end }))
    assert.is_false(pcall(fsdp.wrap, function() error("no model today") end))
    assert.is_false(nn.Linear(4, 4).weight:is_freed())          -- built eagerly again
    local inner_recipes
    local outer, recipes = nn.Module.deferred(function()
      local m = nn.Linear(2, 2)
      local _, r = nn.Module.deferred(function() return nn.Linear(3, 3) end)
      inner_recipes = r
      return m
    end)
    assert.is_true(outer.weight:is_freed() and recipes[outer.weight] ~= nil)
    local n = 0
    for _ in pairs(inner_recipes) do n = n + 1 end
    assert.equal(2, n)                                          -- the inner build's weight and bias only
    assert.is_nil(recipes[next(inner_recipes)])
  end)

  it("refuses a world size the hybrid group does not divide", function()
    local ok, err = pcall(fsdp.wrap, tiny(), { strategy = "hybrid_shard", hybrid_group = 2 })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("world size 1 is not a multiple of the hybrid group size 2", 1, true), err)
  end)

  it("names the known strategies when given an unknown one", function()
    local ok, err = pcall(fsdp.wrap, tiny(), { strategy = "zero4" })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("unknown strategy 'zero4'", 1, true), err)
    assert.is_truthy(tostring(err):find("full_shard", 1, true), err)
    assert.is_false(nn.Linear(4, 4).weight:is_freed())          -- no deferred context left behind
  end)

  it("gives sharded init the values of eager init (deferred construction)", function()
    local function build() shard.manual_seed(5); return tiny() end
    local eager = build()
    local want = {}
    for _, np in ipairs(eager:named_parameters()) do want[np.name] = np.tensor:tolist_flat() end
    local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block } })
    for _, e in ipairs(model:optim_groups()) do
      assert.same(want[e.name], e.tensor:tolist_flat(), e.name)
    end
  end)
end)

describe("faults across ranks", function()
  it("a rank failing mid-step stops launch quickly, showing that rank's error", function()
    local out, code, dt = support.shard("launch --nproc 2 tests/fixtures/recipes/fail_mid_step.lua --mode=error")
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("injected failure on rank 1", 1, true), out)
    assert.is_true(dt < 30, "took " .. dt .. " s")
  end)

  it("a rank that stops issuing collectives makes the others fail with a timeout naming op, group and rank", function()
    local out, code, dt = support.run("SHARD_COMM_TIMEOUT=3 " .. MPIRUN .. " -np 2 " .. support.quote(support.BIN) ..
      " run tests/fixtures/recipes/fail_mid_step.lua --mode=hang")
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("timed out", 1, true) or out:find("timeout", 1, true), out)
    assert.is_truthy(out:find("rank 0", 1, true), out)
    assert.is_true(dt < 30, "took " .. dt .. " s")
  end)

  -- the launcher reads every rank's flight record (comm.h) and names the one behind
  it("names the rank that never reached a collective, and those that waited", function()
    local out, code = support.shard("launch --nproc 4 --timeout=2 tests/fixtures/recipes/hang_collective.lua --mode=stop")
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("rank 2 never reached all_reduce #3 on group world; ranks 0,1,3 waited", 1, true), out)
  end)

  it("names a rank that issued another collective in place of the one the others wait in", function()
    local out, code = support.shard("launch --nproc 4 --timeout=2 tests/fixtures/recipes/hang_collective.lua --mode=skip")
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find("rank 2 issued barrier #3 on world; ranks 0,1,3 waited", 1, true), out)
  end)

  it("names the rank stuck in the middle of an FSDP step", function()
    local out, code = support.shard("launch --nproc 4 --timeout=2 tests/fixtures/recipes/fail_mid_step.lua --mode=hang --victim=2")
    assert.are_not.equal(0, code)
    -- on group world, or on the schedule check's group where the step is one it checks
    assert.is_truthy(out:find("rank 2 never reached all_gather #%d+ on group [%w ]+; ranks 0,1,3 waited") ~= nil, out)
    assert.is_truthy(out:find("ranks 0,1,3 waited", 1, true), out)
  end)
end)
