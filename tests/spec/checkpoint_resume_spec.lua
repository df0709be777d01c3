-- shard.checkpoint across processes (tests/mpi/checkpoint_resume.lua with CKPT_MODE=run does
-- the training): resume in a new process is bitwise at world 1 and at world 3 under
-- full_shard; a checkpoint written at world 2 under full_shard resumes at world 3 under
-- hybrid_shard and at world 1 unwrapped to 1e-6; a save killed with SIGKILL at random moments
-- always leaves `latest` naming a complete checkpoint equal to the state it was saved from.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local S = require("shard.io.safetensors")
local shard = require("shard")

local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
local SCRIPT = support.ROOT .. "/tests/mpi/checkpoint_resume.lua"

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  return d
end

local function command(np, vars)
  local parts = { "env", "CKPT_MODE=run" }
  local keys = {}
  for k in pairs(vars) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. support.quote(tostring(vars[k])) end
  if np then parts[#parts + 1] = MPIRUN .. " -np " .. np end
  parts[#parts + 1] = support.quote(support.BIN) .. " run " .. support.quote(SCRIPT)
  return table.concat(parts, " ")
end

local function run(np, vars)
  local cmd = command(np, vars)
  local out, code = support.run(cmd)
  assert(code == 0, cmd .. "\n" .. out)
end

-- losses (by step) and parameters of a CKPT_OUT file
local function result(path)
  local t, meta = S.load(path)
  local first = tonumber(meta.first_step)
  local losses = {}
  for i, v in ipairs(t.losses:tolist_flat()) do losses[first + i - 1] = v end
  t.losses = nil
  local params = {}
  for name, x in pairs(t) do params[name] = x:tolist_flat() end
  return losses, params
end

local function compare(what, a, b, tol)
  local la, pa = result(a)
  local lb, pb = result(b)
  local n = 0
  for s, v in pairs(lb) do
    n = n + 1
    local d = math.abs(v - la[s])
    assert(d <= tol * math.abs(la[s]), ("%s: loss at step %d is %.17g, expected %.17g"):format(what, s, v, la[s]))
  end
  assert(n > 0, what .. ": no steps ran after the resume")
  for name, va in pairs(pa) do
    local vb = assert(pb[name], what .. ": no parameter " .. name)
    for i = 1, #va do
      local d = math.abs(va[i] - vb[i])
      assert((tol == 0 and va[i] == vb[i]) or (tol > 0 and d <= tol),
        ("%s: %s[%d] is %.9g, expected %.9g"):format(what, name, i, vb[i], va[i]))
    end
  end
end

describe("checkpoint resume", function()
  it("is bitwise in a new process at world 1 and at world 3 under full_shard", function()
    for _, c in ipairs { { np = 1, strategy = "none" }, { np = 3, strategy = "full_shard" } } do
      local dir, a, b = tmpdir(), os.tmpname(), os.tmpname()
      run(c.np, { CKPT_STRATEGY = c.strategy, CKPT_STEPS = 6, CKPT_SAVE_DIR = dir, CKPT_SAVE_AT = 3, CKPT_OUT = a })
      run(c.np, { CKPT_STRATEGY = c.strategy, CKPT_STEPS = 6, CKPT_FROM = dir, CKPT_OUT = b, CKPT_SEED = 99, CKPT_RNG_SEED = 7 })
      compare(("world %d %s"):format(c.np, c.strategy), a, b, 0)
      shard.C.sh_ckpt_remove_tree(dir); os.remove(a); os.remove(b)
    end
  end)

  it("resumes at another world size and strategy, optimizer state included", function()
    local dir, a = tmpdir(), os.tmpname()
    local base = { CKPT_STEPS = 6, CKPT_DROPOUT = 0, CKPT_BIAS = 0 }
    local function with(t) local o = {}; for k, v in pairs(base) do o[k] = v end; for k, v in pairs(t) do o[k] = v end; return o end
    run(2, with{ CKPT_STRATEGY = "full_shard", CKPT_SAVE_DIR = dir, CKPT_SAVE_AT = 3, CKPT_OUT = a })
    for _, c in ipairs { { np = 3, strategy = "hybrid_shard", hybrid = 1 }, { np = 3, strategy = "hybrid_shard", hybrid = 3 },
                         { np = 1, strategy = "none" } } do
      local b = os.tmpname()
      run(c.np, with{ CKPT_STRATEGY = c.strategy, CKPT_HYBRID = c.hybrid or "", CKPT_FROM = dir, CKPT_OUT = b, CKPT_SEED = 99 })
      compare(("written at 2 full_shard, read at %d %s"):format(c.np, c.strategy), a, b, 1e-6)
      os.remove(b)
    end
    -- what a rank holds after a resharded load is exactly what was saved: read at 3 under
    -- hybrid_shard, saved again in that layout, and both read whole at world 1, every
    -- parameter and AdamW moment is the same
    local dir3, w2, w3 = tmpdir(), os.tmpname(), os.tmpname()
    run(3, with{ CKPT_STRATEGY = "hybrid_shard", CKPT_HYBRID = 1, CKPT_FROM = dir, CKPT_STEPS = 3, CKPT_SAVE_DIR = dir3, CKPT_SAVE_AT = 3 })
    run(1, with{ CKPT_STRATEGY = "none", CKPT_FROM = dir, CKPT_STEPS = 3, CKPT_OUT = w2, CKPT_DUMP_OPT = 1 })
    run(1, with{ CKPT_STRATEGY = "none", CKPT_FROM = dir3, CKPT_STEPS = 3, CKPT_OUT = w3, CKPT_DUMP_OPT = 1 })
    local t2, t3 = S.load(w2), S.load(w3)
    local n = 0
    for name, x in pairs(t2) do
      if name ~= "losses" then
        n = n + 1
        assert.same(x:tolist_flat(), assert(t3[name], name):tolist_flat(), name)
      end
    end
    assert(t2["exp_avg_sq/transformer.h.0.mlp.c_fc.weight"], "the moments were not dumped")
    for _, d in ipairs { dir, dir3 } do shard.C.sh_ckpt_remove_tree(d) end
    for _, f in ipairs { a, w2, w3 } do os.remove(f) end
  end)

  it("leaves the previous checkpoint loadable when a save is killed at any moment", function()
    local dir, mark = tmpdir(), os.tmpname()
    -- steps 1..k are saved one by one; each round resumes from latest, trains one step and
    -- saves it, and is killed at a random moment of that save (every file step of the save
    -- takes SHARD_CKPT_STEP_DELAY_MS, so the kills land all over it)
    run(nil, { CKPT_STRATEGY = "none", CKPT_STEPS = 1, CKPT_SAVE_DIR = dir, CKPT_SAVE_AT = 1 })
    local seed = os.time()
    math.randomseed(seed)
    local completed, killed = 0, 0
    for round = 1, 8 do
      local latest = shard.checkpoint.latest(dir)
      local step = tonumber(latest:match("step%-(%d+)$"))
      os.remove(mark)
      local cmd = command(nil, { CKPT_STRATEGY = "none", CKPT_FROM = dir, CKPT_STEPS = step + 1, CKPT_SAVE_DIR = dir,
                                 CKPT_SAVE_AT = step + 1, CKPT_MARK = mark, CKPT_KEEP = 2, SHARD_CKPT_STEP_DELAY_MS = 15 })
      local delay = math.random() * 0.1
      local sh = ("%s & p=$!; while [ ! -e %s ] && kill -0 $p 2>/dev/null; do sleep 0.005; done; sleep %.3f; kill -9 $p 2>/dev/null && echo KILLED; wait $p; true")
        :format(cmd, support.quote(mark), delay)
      local out = support.run("sh -c " .. support.quote(sh))
      if out:find("KILLED") then killed = killed + 1 else completed = completed + 1 end
      -- latest names a whole checkpoint equal to a straight run of that many steps
      local now = shard.checkpoint.latest(dir)
      local s = tonumber(now:match("step%-(%d+)$"))
      assert(s == step or s == step + 1, ("round %d (seed %d): latest is %s after step %d"):format(round, seed, now, step))
      local a, b = os.tmpname(), os.tmpname()
      run(nil, { CKPT_STRATEGY = "none", CKPT_FROM = dir, CKPT_STEPS = s, CKPT_OUT = a })
      run(nil, { CKPT_STRATEGY = "none", CKPT_STEPS = s, CKPT_OUT = b })
      local _, pa = result(a)
      local _, pb = result(b)
      for name, v in pairs(pb) do
        for i = 1, #v do
          assert(pa[name][i] == v[i], ("round %d (seed %d, kill after %.3f s): %s[%d] in %s differs from a straight run"):format(round, seed, delay, name, i, now))
        end
      end
      os.remove(a); os.remove(b)
    end
    assert(killed > 0, "no save was killed: the kill loop tests nothing")
    shard.C.sh_ckpt_remove_tree(dir); os.remove(mark)
  end)
end)

describe("checkpoint files and bad input", function()
  local ck = require("shard.checkpoint")
  local function tiny(vocab, seed)
    shard.manual_seed(seed or 1)
    return shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = vocab or 5, block_size = 4 }
  end

  it("writes plain safetensors rank files and an index of every parameter's pieces", function()
    local dir = tmpdir()
    local m = tiny()
    local opt = shard.optim.SGD(m, { lr = 0.1, momentum = 0.9 })
    ck.save(dir, { model = m, optim = opt, step = 7, extra = { note = "x" } })
    assert.equal(dir .. "/step-7", ck.latest(dir))
    local t = S.load(dir .. "/step-7/rank-00000-of-00001.safetensors")
    local w = m.transformer.wte.weight
    assert.same(w:tolist_flat(), t["param/transformer.wte.weight@0"]:tolist_flat())
    assert.is_not_nil(t["optim/momentum_buffer/transformer.wte.weight@0"])
    local m2 = tiny(5, 2)
    local opt2 = shard.optim.SGD(m2, { lr = 0.5, momentum = 0.9 })
    local info = ck.load(dir, { model = m2, optim = opt2 })
    assert.equal(7, info.step)
    assert.equal("x", info.extra.note)
    assert.equal(0.1, opt2.lr)
    assert.same(w:tolist_flat(), m2.transformer.wte.weight:tolist_flat())
    shard.C.sh_ckpt_remove_tree(dir)
  end)

  it("refuses a wrong shape, a missing tensor and a missing checkpoint by name", function()
    local dir = tmpdir()
    ck.save(dir, { model = tiny(), step = 1 })
    local ok, err = pcall(ck.load, dir, { model = tiny(7) })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("'transformer.wte.weight' is 5x8 in the checkpoint but 7x8 in the model (rank 0)", 1, true), err)
    ok, err = pcall(ck.load, dir .. "/nothing", { model = tiny() })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("holds no checkpoint", 1, true), err)
    -- a rank file cut short: the tensor and file are named, nothing is read past the end
    local f = dir .. "/step-1/rank-00000-of-00001.safetensors"
    local bytes = io.open(f, "rb"):read("*a")
    local out = io.open(f, "wb")
    out:write(bytes:sub(1, #bytes - 100))
    out:close()
    ok, err = pcall(ck.load, dir, { model = tiny() })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("rank-00000-of-00001.safetensors: tensor 'param/", 1, true), err)
    shard.C.sh_ckpt_remove_tree(dir)
  end)
end)
