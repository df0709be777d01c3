-- What a new user meets first (issue 31, items 1, 10, 11; issue 39, items 4, 5): a dry run
-- leaves every file a run reads alone; a wrong value of a known option is exit 2 with a line
-- naming it, before any work; --help says what a command does and what each setting takes;
-- SHARD_MEMORY_LIMIT holds without shard.init; errors name the problem, not shard's files.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local TEXT = "/usr/share/common-licenses/GPL-3"
local RECIPE = "recipes/gpt_shakespeare_char.lua"
local SMALL = " --n_layer=1 --n_head=2 --n_embd=16 --block_size=8 --batch_size=4 --max_iters=1"
  .. " --eval_interval=1 --eval_iters=1 --log_interval=1 --sample_tokens=0 --warmup=0"

local function write(path, text) local f = assert(io.open(path, "wb")); f:write(text); f:close() end

-- Every file under dir, path -> contents (nil when dir does not exist).
local function snapshot(dir)
  local p = io.popen("find " .. support.quote(dir) .. " -type f 2>/dev/null")
  local files, any = {}, false
  for path in p:lines() do
    local f = assert(io.open(path, "rb"))
    files[path] = f:read("*a"); f:close()
    any = true
  end
  p:close()
  return any and files or nil
end

local function exists(path) return os.execute("test -e " .. support.quote(path)) == 0 end

describe("a dry run", function()
  it("rewrites none of a run's files, whatever corpus it is given", function()
    local dir = "/tmp/shard_new_user_dry"
    os.execute("rm -rf " .. dir)
    local out, code = support.shard(("run %s --data=%s --out_dir=%s%s"):format(RECIPE, TEXT, dir, SMALL))
    assert.equal(0, code, out)
    local before = snapshot(dir)
    assert.is_truthy(before[dir .. "/data/GPL-3/train.bin"], out)
    local other = "/tmp/shard_new_user_corpus.txt"   -- another corpus, and one named like the first
    write(other, ("To be, or not to be: that is the question.\n"):rep(40))
    for _, data in ipairs { other, TEXT } do
      out, code = support.shard(("estimate --dry-run --world=4 %s --data=%s --out_dir=%s --strategy=full_shard"):format(RECIPE, data, dir))
      assert.equal(0, code, out)
      assert.same(before, snapshot(dir))
    end
    local fresh = "/tmp/shard_new_user_dry_fresh"
    os.execute("rm -rf " .. fresh)
    out, code = support.shard(("estimate --dry-run %s --data=%s --out_dir=%s"):format(RECIPE, other, fresh))
    assert.equal(0, code, out)
    assert.is_false(exists(fresh), "the dry run made " .. fresh)
  end)
end)

describe("a wrong value of a known option", function()
  local dir = "/tmp/shard_new_user_bad"
  local cases = {
    { "--batch_size=0", "--batch_size=0: expected at least 1" },
    { "--block_size=0", "--block_size=0: expected at least 1" },
    { "--eval_iters=0", "--eval_iters=0: expected at least 1" },
    { "--max_iters=-1", "--max_iters must not be negative" },
    { "--eval_interval=0", "--eval_interval=0: expected at least 1" },
    { "--n_layer=0", "--n_layer=0: expected at least 1" },
    { "--dropout=1", "--dropout=1: expected at least 0 and below 1" },
    { "--beta2=1.5", "--beta2=1.5: expected at least 0 and below 1" },
    { "--straggler_windows=1.5", "--straggler_windows expects a whole number" },
    { "--strategy=fullshard", "--strategy=fullshard: expected one of none, full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2" },
    { "--dtype=f16", "--dtype=f16: expected one of f32, bf16" },
    { "--device=gpu", "--device=gpu: expected one of auto, cpu, cuda" },
    { "--hybrid_group=x --strategy=hybrid_shard", "--hybrid_group=x: expected a number of ranks" },
    { "--data=/nonexistent.txt", "--data=/nonexistent.txt: cannot read it (No such file or directory)" },
    { "--data=/dev/null", "--data=/dev/null: an empty file or a directory" },
    { "--data=/tmp", "--data=/tmp: an empty file or a directory" },
  }
  for _, case in ipairs(cases) do
    it(("%s is exit 2 before any work, naming it"):format(case[1]), function()
      os.execute("rm -rf " .. dir)
      local out, code = support.shard(("run %s --out_dir=%s --data=%s%s %s"):format(RECIPE, dir, TEXT, SMALL, case[1]))
      assert.equal(2, code, out)
      assert.is_truthy(out:find(case[2], 1, true), out)
      assert.is_nil(out:find("lua/shard/", 1, true), out)   -- no file or line of shard's own
      assert.is_nil(out:find("data:", 1, true), out)         -- stopped before data preparation
      assert.is_false(exists(dir), out)
    end)
  end

  it("of a benchmark, of shard estimate or of the Llama recipe is exit 2 too", function()
    for _, case in ipairs {
      { "bench cpu_train --iters=0", "--iters=0: expected at least 1" },
      { "bench ckpt_save --every=0", "--every=0: expected at least 1" },
      { "estimate --n_layer=0", "--n_layer=0: expected at least 1" },
      { "estimate --world=0", "--world=0: expected at least 1" },
      { "estimate --model=bert", "--model=bert: expected one of gpt, llama" },
      { "run recipes/llama_shakespeare_char.lua --n_kv_head=0", "--n_kv_head=0: expected at least 1" },
      { "sweep /nonexistent/sweep.lua", "sweep: cannot open /nonexistent/sweep.lua: No such file or directory" },
    } do
      local out, code = support.shard(case[1])
      assert.equal(2, code, case[1] .. "\n" .. out)
      assert.is_truthy(out:find(case[2], 1, true), out)
    end
  end)

  it("a global batch that does not split over the ranks is exit 2 on every rank, naming both", function()
    local out, code = support.shard(("launch --nproc 2 %s --out_dir=%s --data=%s%s --batch_size=3 --strategy=full_shard")
      :format(RECIPE, dir, TEXT, SMALL))
    assert.are_not.equal(0, code, out)
    assert.is_truthy(out:find("--batch_size=3: the global batch does not split over 2 ranks", 1, true), out)
    assert.is_nil(out:find("lua/shard/", 1, true), out)
  end)
end)

describe("--help", function()
  it("of estimate names its usage and --dry-run; of the dry run, its options", function()
    local out, code = support.shard("estimate --help")
    assert.equal(0, code, out)
    assert.is_truthy(out:find("usage: shard estimate [--key=value ...]", 1, true), out)
    assert.is_truthy(out:find("shard estimate --dry-run [--world=N", 1, true), out)
    assert.is_truthy(out:find("--param%s+string%s+default f32%s+%(one of f32, bf16, f16%)"), out)
    assert.is_nil(out:find("shard run", 1, true), out)
    out, code = support.shard("estimate --dry-run --help")
    assert.equal(0, code, out)
    for _, opt in ipairs { "--world=N", "--rank=R", "--local_size=L", "--steps=S", "--verbose", "--json" } do
      assert.is_truthy(out:find(opt, 1, true), out)
    end
  end)

  it("of a recipe gives each setting's type as it is taken, its range and where the corpus is looked for", function()
    local out, code = support.shard("run " .. RECIPE .. " --help")
    assert.equal(0, code, out)
    assert.matches("%-%-dropout%s+number%s+default 0%s+%(at least 0 and below 1%)", out)
    assert.matches("%-%-grad_clip%s+number%s+default 1%s", out)
    assert.matches("%-%-batch_size%s+integer%s+default 12%s+%(.*at least 1%)", out)
    assert.matches('%-%-data%s+string%s+default ""%s+%(a text file; unset: tinyshakespeare.txt in %$SHARD_DATA, else in ../shared/data%)', out)
    assert.matches("%-%-demo%s+boolean%s+default false%s+%(no corpus found: train on /usr/share/common%-licenses/GPL%-3%)", out)
    -- the whole first paragraph of the header, not its first line
    assert.is_truthy(out:find("(nanoGPT reports val loss 1.88 for it). Any text works with --data=PATH.", 1, true), out)
  end)

  it("of shard bench lists every benchmark with its first sentence; a benchmark's gives its whole header paragraph", function()
    local out, code = support.shard("bench")
    assert.equal(0, code, out)
    local p = io.popen("ls " .. support.ROOT .. "/bench/*.lua")
    for path in p:lines() do
      local name = path:match("([^/]+)%.lua$")
      assert.matches("\n  " .. name:gsub("%p", "%%%0") .. "%s+%S[^\n]*%.\n", out)
    end
    p:close()
    assert.is_truthy(out:find("cpu_train%s+training%-step throughput of the Shakespeare recipe's model on the CPU %(n_layer 4,"), out)
    out = support.shard("bench cpu_train --help")
    assert.is_truthy(out:find("the convention of bench/gpt2_124m.lua; make bench turns it into GFLOP/s.", 1, true), out)
  end)
end)

describe("SHARD_MEMORY_LIMIT", function()
  local script = support.script([[
local shard = require("shard")
local cfg = shard.config{}
local ok, err = pcall(shard.empty, { 1024 * 1024 })   -- 4 MiB, never shard.init
print(ok and "allocated" or err)
]])
  it("holds in a script that never calls shard.init, and in the REPL", function()
    local out, code = support.run("SHARD_MEMORY_LIMIT=1MiB " .. support.quote(support.BIN) .. " run " .. script)
    assert.equal(0, code, out)
    assert.matches("out of memory on cpu: memory limit reached", out)
    out = support.run("echo 'print(pcall(shard.empty, { 1024 * 1024 }))' | SHARD_MEMORY_LIMIT=1MiB " .. support.quote(support.BIN) .. " repl")
    assert.matches("false%s+[^\n]*out of memory on cpu: memory limit reached", out)
    out = support.run(support.quote(support.BIN) .. " run " .. script)
    assert.matches("allocated", out)
  end)

  it("that is not a size stops the run with exit 2, naming it", function()
    local out, code = support.run("SHARD_MEMORY_LIMIT=lots " .. support.quote(support.BIN) .. " run " .. script)
    assert.equal(2, code, out)
    assert.is_truthy(out:find("SHARD_MEMORY_LIMIT=lots is not a size", 1, true), out)
  end)
end)

describe("an API error", function()
  it("names the module's class, not its printed tree (export_hf of an MLP)", function()
    local script = support.script([[
local shard = require("shard")
local m = shard.nn.MLP(16)
shard.export_hf(m, "/tmp/shard_new_user_hf")
]])
    local out, code = support.shard("run " .. script)
    assert.equal(1, code, out)
    assert.equal("export_hf: expected an nn.GPT or nn.Llama (plain or FSDP-wrapped), got an nn.MLP\n", out)
  end)
end)

describe("the REPL reading a script from a pipe", function()
  it("names each error's own input line", function()
    local code, out, err = support.sh(support.quote(support.BIN) .. " repl",
      'x = 1\nprint(x)\nlocal t = {\n  a = 1,\n}\nerror("boom")\nprint(nil + 1)\n')
    assert.equal(1, code, out .. err)
    assert.equal("1\n", out)
    assert.equal("stdin:6: boom\nstdin:7: attempt to perform arithmetic on a nil value\n", err)
  end)
end)
