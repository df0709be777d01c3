-- bin/shard from the outside: exit codes, run with overrides, and the REPL through a pipe.
-- tests/run.sh exports SHARD_BIN (bin/shard, or bin/shard-asan under make test-asan).
local shard = require("shard")

local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh, script = support.BIN, support.quote, support.sh, support.script

local function shard_cmd(args, input, env)
  return sh((env or "") .. " " .. quote(BIN) .. " " .. args, input)
end


describe("bin/shard", function()
  it("prints its version", function()
    local code, out = shard_cmd("--version")
    assert.equal(0, code)
    assert.equal("shard " .. shard.version .. "\n", out)
  end)

  it("prints help listing the commands", function()
    for _, h in ipairs { "help", "--help" } do
      local code, out = shard_cmd(h)
      assert.equal(0, code)
      for _, cmd in ipairs { "run", "repl", "launch", "bench", "estimate" } do assert.matches(cmd, out) end
    end
  end)

  -- runtime/core/parallel.c: idle workers spin a while when this node's ranks x threads fit the
  -- CPUs, else sleep at once; OMP_NUM_THREADS sets the team, OMP_WAIT_POLICY overrides the wait
  it("sizes the thread team and picks its wait by how many ranks and threads share the CPUs", function()
    local probe = script('local C = require("shard.ffi").C; local s = tonumber(C.sh_parallel_spin_ns()); ' ..
                         'print(C.sh_parallel_threads() .. " " .. (s == 0 and "sleep" or s >= 2^62 and "spin" or "spin-then-sleep"))')
    local clear = "env -u OMP_WAIT_POLICY -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE " ..
                  "-u OMPI_COMM_WORLD_LOCAL_SIZE -u RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u SLURM_PROCID"
    local function wait_of(env)
      local code, out = shard_cmd("run " .. quote(probe), nil, clear .. " " .. env)
      assert.equal(0, code)
      return (out:gsub("\n$", ""))
    end
    assert.equal("1 spin-then-sleep", wait_of("OMP_NUM_THREADS=1"))
    assert.equal("1 spin-then-sleep", wait_of("OMP_NUM_THREADS=1 RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1"))
    assert.equal("2 spin-then-sleep", wait_of("OMP_NUM_THREADS=2,1 taskset -c 0-1"))
    -- more threads than the CPUs it may use, or ranks: they share cores
    assert.equal("255 sleep", wait_of("OMP_NUM_THREADS=100000"))
    assert.equal("2 sleep", wait_of("OMP_NUM_THREADS=2 taskset -c 0"))
    assert.equal("1 sleep", wait_of("OMP_NUM_THREADS=1 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=100000 " ..
                                    "OMPI_COMM_WORLD_LOCAL_SIZE=100000"))
    assert.equal("1 spin", wait_of("OMP_NUM_THREADS=1 OMP_WAIT_POLICY=active"))
    assert.equal("1 sleep", wait_of("OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive"))
    os.remove(probe)
  end)

  it("rejects an unknown command with one line and exit code 2", function()
    local code, out, err = shard_cmd("frobnicate")
    assert.equal(2, code)
    assert.equal("", out)
    assert.matches("^shard: unknown command 'frobnicate'", err)
    assert.equal(1, select(2, err:gsub("\n", "")))
  end)

  it("rejects a missing recipe file with exit code 2", function()
    local code, _, err = shard_cmd("run /nonexistent/recipe.lua")
    assert.equal(2, code)
    assert.matches("cannot open /nonexistent/recipe.lua", err, 1, true)
    code = shard_cmd("run")
    assert.equal(2, code)
  end)

  it("runs a recipe with --key=value overrides reaching shard.config, and lua's arg", function()
    local path = script [[
      local shard = require("shard")
      local cfg = shard.config{ lr = 1e-3, n_layer = 6, name = "base", compile = false }
      print(cfg.lr, cfg.n_layer, cfg.name, cfg.compile, math.type and "" or type(cfg.lr))
      print(arg[0] ~= nil, arg[1], select("#", ...))
    ]]
    local code, out, err = shard_cmd("run " .. path .. " --lr=3e-4 --name=tiny --compile")
    assert.equal(0, code, err)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("0.0003\t6\ttiny\ttrue\tnumber", lines[1])
    assert.equal("true\t--lr=3e-4\t3", lines[2])
    os.remove(path)
  end)

  it("refuses an override that names no option, listing the known ones", function()
    local path = script [[ require("shard").config{ lr = 1, steps = 2 } ]]
    local code, _, err = shard_cmd("run " .. path .. " --lrr=3")
    assert.equal(2, code)   -- a wrong command line, as README's exit codes say
    assert.matches("unknown option --lrr; known options: lr, steps", err, 1, true)
    code, _, err = shard_cmd("run " .. path .. " --steps=many")
    assert.equal(2, code)
    assert.matches("--steps expects a number, got 'many'", err, 1, true)
    os.remove(path)
  end)

  it("refuses stray arguments, fractions for whole-number keys and negative counts (exit 2)", function()
    local path = script [[ print(require("shard").config{ lr = 1e-3, max_iters = 10 }.max_iters) ]]
    local cases = {
      { "max_iters=5", "stray argument 'max_iters=5'" },
      { "--max_iters=1.5", "--max_iters expects a whole number" },
      { "--max_iters=-5", "--max_iters must not be negative" },
    }
    for _, c in ipairs(cases) do
      local code, out, err = shard_cmd("run " .. path .. " " .. c[1])
      assert.equal(2, code, c[1])
      assert.equal("", out, c[1])
      assert.matches(c[2], err, 1, true)
    end
    local code, out = shard_cmd("run " .. path .. " --max_iters=1e3")
    assert.equal(0, code)
    assert.equal("1000\n", out)
    os.remove(path)
  end)

  it("lists a recipe's keys with defaults and types for --help, and exits 0", function()
    local path = script [[
      -- A tiny recipe for the help test.
      local cfg = require("shard").config{ lr = 1e-3, max_iters = 10, data = "x" }
      print("trained")
    ]]
    local code, out = shard_cmd("run " .. path .. " --help")
    assert.equal(0, code)
    assert.matches("A tiny recipe for the help test.", out, 1, true)
    assert.matches("--max_iters%s+integer%s+default 10", out)
    assert.matches("--lr%s+number%s+default 0.001", out)
    assert.matches("--data%s+string%s+default x", out)
    assert.matches("--memory_limit", out, 1, true)
    assert.is_nil(out:find("trained", 1, true))
    code, out = shard_cmd("repl --help")
    assert.equal(0, code)
    assert.matches("usage: shard repl", out, 1, true)
    os.remove(path)
  end)

  it("refuses a directory as the recipe with exit code 2", function()
    local code, _, err = shard_cmd("run /tmp")
    assert.equal(2, code)
    assert.matches("is a directory", err, 1, true)
  end)

  it("limits memory from --memory_limit and SHARD_MEMORY_LIMIT in every recipe", function()
    local path = script [[
      local shard = require("shard")
      shard.init()
      shard.config{ n = 1 }
      print(shard.memory.stats().limit)
      local ok, err = pcall(shard.zeros, { 1024, 1024 })
      print(ok, tostring(err):find("out of memory", 1, true) ~= nil)
    ]]
    local code, out = shard_cmd("run " .. path .. " --memory_limit=1MiB")
    assert.equal(0, code)
    assert.equal("1048576\nfalse\ttrue\n", out)
    code, out = shard_cmd("run " .. path, nil, "SHARD_MEMORY_LIMIT=2MiB")
    assert.equal(0, code)
    assert.equal("2097152\nfalse\ttrue\n", out)
    code = shard_cmd("run " .. path .. " --memory_limit=lots")
    assert.equal(2, code)
    os.remove(path)
  end)

  it("exits 1 with the message when a recipe fails; a traceback only on request", function()
    local path = script "local x = 1\nerror('recipe broke')\n"
    local code, _, err = shard_cmd("run " .. path)
    assert.equal(1, code)
    assert.matches(":2: recipe broke\n$", err)
    assert.is_nil(err:find("traceback"))
    code, _, err = shard_cmd("run " .. path, nil, "SHARD_TRACEBACK=1")
    assert.equal(1, code)
    assert.matches("stack traceback", err)
    os.remove(path)
    path = script "this is not lua"
    code, _, err = shard_cmd("run " .. path)
    assert.equal(1, code)
    assert.matches(":1: '=' expected near 'is'", err, 1, true)
    os.remove(path)
  end)

  it("says which delegated commands are not available yet", function()
    for cmd, mod in pairs { launch = "shard.tools.launch", bench = "shard.bench", estimate = "shard.tools.estimate" } do
      if not package.searchpath(mod, package.path) then
        local code, _, err = shard_cmd(cmd)
        assert.equal(2, code)
        assert.matches(cmd .. " is not available yet", err)
      end
    end
  end)
end)

describe("shard repl through a pipe", function()
  it("prints expression values, with no prompt or banner", function()
    local code, out, err = shard_cmd("repl", "1 + 1\nx = 5\nx * 2\n'a', nil, true\n")
    assert.equal(0, code, err)
    assert.equal("2\n10\na\tnil\ttrue\n", out)
    assert.equal("", err)
  end)

  it("continues unfinished chunks over several lines", function()
    local code, out = shard_cmd("repl", "function f(a)\n  return a * 3\nend\nf(14)\nprint(\n'x')\n")
    assert.equal(0, code)
    assert.equal("42\nx\n", out)
  end)

  it("prints an error and goes on; the exit code then reports it", function()
    local code, out, err = shard_cmd("repl", "error('boom')\n1 + \n 2\nfoo(\n")
    assert.equal(1, code)
    assert.equal("3\n", out)
    assert.matches("^stdin:1: boom\n", err)
    assert.matches("unfinished", err)
    code, out, err = shard_cmd("repl", "local = 1\n7\n")
    assert.equal(1, code)
    assert.equal("7\n", out)
    assert.matches("stdin:1: '<name>' expected near '='", err, 1, true)
  end)

  it("pretty-prints tensors", function()
    local make = shard.randn and "shard.randn{2,3}" or "shard.zeros{2,3}"
    local code, out, err = shard_cmd("repl", "print(" .. make .. ")\n")
    assert.equal(0, code, err)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(3, #lines, out)
    assert.matches("^%[%[", lines[1])
    assert.matches("^ %[", lines[2])
    assert.equal("[f32 2x3, cpu]", lines[3])
    -- a bare expression prints the same way
    local _, out2 = shard_cmd("repl", "shard.ones{2}\n")
    assert.equal("[1., 1.]\n[f32 2, cpu]\n", out2)
  end)
end)
