-- Deterministic mode (fsdp.wrap{ deterministic = true }, recipes' --deterministic): the same
-- bits at any world size. tests/fixtures/deterministic_run.lua trains a small GPT for 20 steps
-- in every case (each strategy, activation checkpointing, offload, grad_accum splits) and
-- prints each step's loss as its f64 bits and the parameters' SHA-256; its output at world
-- 1, 2, 3 and 4 must be the same, character for character. The recipe loop is checked the
-- same way through its metrics line's params_sha256 (strategies, grad_accum splits of one
-- global batch), and the lower CPU kernel sets each against themselves at world 1 and 3.
-- One thread per rank: the kernels' bits are those of a thread count (README).
local S = dofile("tests/spec/support.lua")

local MPIRUN = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"

local function run(np, args, env)
  local out, code = S.run(("%s %s -np %d %s run %s"):format(env or "", MPIRUN, np, S.quote(S.BIN), args))
  assert(code == 0, ("world %d exited %d:\n%s"):format(np, code, out))
  return out
end

-- case name -> its line, from the fixture's output
local function cases(out)
  local t, n = {}, 0
  for name, rest in out:gmatch("case (%S+) (losses [^\n]*)") do t[name] = rest; n = n + 1 end
  return t, n
end

local function same_cases(ref, got, np)
  for name, line in pairs(ref) do
    assert(got[name] ~= nil, ("world %d did not run case %s"):format(np, name))
    assert(got[name] == line, ("case %s at world %d differs from world 1:\n  1: %s\n  %d: %s"):format(name, np, line, np, got[name]))
  end
end

describe("deterministic mode", function()
  it("trains bit-identically at world 1, 2, 3 and 4 in every case", function()
    local ref, n = cases(run(1, "tests/fixtures/deterministic_run.lua"))
    assert.is_true(n >= 9, "the fixture ran " .. n .. " cases")
    for np = 2, 4 do same_cases(ref, cases(run(np, "tests/fixtures/deterministic_run.lua")), np) end
    -- every case, whatever its strategy, trains the same model: one digest for all
    local digest
    for _, line in pairs(ref) do
      local d = line:match("sha256 (%x+)")
      digest = digest or d
      assert.equals(digest, d)
    end
  end)

  it("gives the recipe the same params_sha256 at any world size, strategy and grad_accum split", function()
    local base = "recipes/gpt_shakespeare_char.lua --data=/usr/share/common-licenses/GPL-3 --deterministic --n_layer=1 --n_embd=32 --block_size=16 " ..
                 "--max_iters=20 --log_interval=1 --eval_interval=1000 --eval_iters=1 --sample_tokens=0 --out_dir=" ..
                 os.tmpname() .. "_d"
    local function digest(np, extra)
      local out = run(np, base .. " " .. extra)
      local d = out:match('"params_sha256":"(%x+)"')
      assert(d, "no params_sha256 in:\n" .. out)
      local losses = {}
      for l in out:gmatch("iter %d+ | loss ([%d%.]+)") do losses[#losses + 1] = l end
      assert.equals(20, #losses)
      return d, table.concat(losses, " ")
    end
    local d1, l1 = digest(1, "--batch_size=12")
    for _, c in ipairs {
      { 2, "--strategy=full_shard --batch_size=6 --grad_accum=2" },
      { 3, "--strategy=no_shard --batch_size=3 --grad_accum=4" },
      { 4, "--strategy=hybrid_shard --hybrid_group=2 --batch_size=12" },
    } do
      local d, l = digest(c[1], c[2])
      assert(d == d1, ("world %d %s: params_sha256 %s, world 1: %s"):format(c[1], c[2], d, d1))
      assert.equals(l1, l)
    end
  end)

  it("gives each lower CPU kernel set the same bits at world 1 and 3", function()
    local cpu = S.run(S.quote(S.BIN) .. " cpu")
    local in_use, sets = cpu:match("in use: (%S+)"), cpu:match("runs: ([^\n]*)")
    assert(in_use and sets, "shard cpu said:\n" .. cpu)
    for set in sets:gmatch("%S+") do
      if set ~= in_use then
      local env = "SHARD_CPU_ISA=" .. set .. " SHARD_DETERM_CASES=full_shard,no_shard SHARD_DETERM_STEPS=5"
      local ref = cases(run(1, "tests/fixtures/deterministic_run.lua", env))
      local n = 0
      for _ in pairs(ref) do n = n + 1 end
      assert.equals(2, n)
      same_cases(ref, cases(run(3, "tests/fixtures/deterministic_run.lua", env)), 3)
      end
    end
  end)

  it("turns the deterministic-kernels switch on from begin to finish, and back", function()
    local out = S.run(S.quote(S.BIN) .. " run " .. S.quote(S.script([[
      local shard = require("shard")
      local fsdp, nn = shard.fsdp, shard.nn
      local model = fsdp.wrap(nn.GPT{ n_layer = 1, n_head = 1, n_embd = 8, vocab_size = 8, block_size = 4, bias = false, dropout = 0 },
                              { deterministic = true })
      local x = shard.tensor({ { 1, 2, 3, 4 } }, { dtype = "i64" })
      local was = shard.deterministic()
      fsdp.deterministic_begin(model, { chunks = 1, first = 0, count = 1 })
      local during = shard.deterministic()
      local loss = model(x, x)
      loss:backward()
      fsdp.deterministic_finish(model)
      print(("switch %s %s %s"):format(was, during, shard.deterministic()))
    ]])))
    assert.matches("switch false true false", out)
  end)

  it("refuses what it does not cover, by name", function()
    local out, code = S.shard("run recipes/gpt_shakespeare_char.lua --deterministic --dtype=bf16")
    assert.equals(2, code)
    assert.matches("%-%-deterministic: f32 only", out)
    out = S.run(S.quote(S.BIN) .. " run " .. S.quote(S.script([[
      local shard = require("shard")
      local nn = shard.nn
      local model = shard.fsdp.wrap(nn.GPT{ n_layer = 1, n_head = 1, n_embd = 8, vocab_size = 8, block_size = 4, bias = false, dropout = 0 },
                                    { deterministic = true })
      local ok, err = pcall(shard.fsdp.deterministic_begin, model, { chunks = 3, first = 1, count = 2 })
      print(err)
      ok, err = pcall(shard.fsdp.deterministic_begin, model, { chunks = 0, first = 0, count = 0 })
      print(err)
      ok, err = pcall(shard.fsdp.wrap, nn.Linear(2, 2), { deterministic = true, mixed_precision = { param = "bf16" } })
      print(err)
      ok, err = pcall(shard.fsdp.deterministic_finish, model)
      print(err)
    ]])))
    assert.matches("rank 0 holds chunks 1..2; each rank's chunks must follow the previous rank's", out)
    assert.matches("rank 0 holds no chunk; deterministic mode needs at least one chunk %(sequence%) per rank, " ..
                   "and 1 ranks share the global batch's 0", out)
    assert.matches("deterministic = true is f32 only", out)
    assert.matches("no deterministic step was begun", out)
  end)
end)
