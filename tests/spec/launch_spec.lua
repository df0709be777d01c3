-- `shard launch` from the outside: rank 0's output, --all prefixes, and a failing rank ending
-- the job within seconds with its error shown (the others sit in a collective with the
-- default 600 s timeout, so only launch/mpirun can stop them that fast).
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh, script = support.BIN, support.quote, support.sh, support.script

local launch_mod = require("shard.tools.launch")

local function launch(args) return sh(quote(BIN) .. " launch " .. args) end

local HELLO = script [[
local shard = require("shard")
local info = shard.comm.info()
local t = shard.tensor { info.rank + 1 }
info.group:all_reduce(t, "sum")
print(("hello from rank %d of %d, sum %g, lr %s"):format(info.rank, info.world, t[1], tostring(shard.config{ lr = 1 }.lr)))
]]

local FAIL = script [[
local shard = require("shard")
local info = shard.comm.info()
if info.rank == 1 then error("rank one exploded on purpose") end
local t = shard.tensor { 1 }
info.group:all_reduce(t, "sum")
print("unreachable on rank " .. info.rank)
]]

local KILLED = script [[
local shard = require("shard")
local ffi = require("ffi")
ffi.cdef "int getpid(void); int kill(int pid, int sig);"
local info = shard.comm.info()
if info.rank == 1 then ffi.C.kill(ffi.C.getpid(), 9) end
info.group:barrier()
print("unreachable on rank " .. info.rank)
]]

-- Rank 1's writes without a newline, between rank 0's lines (barriers and pauses order them).
local PARTIAL = script [[
local shard = require("shard")
local info = shard.comm.info()
local function step() io.stdout:flush(); io.stderr:flush(); os.execute("sleep 0.2"); info.group:barrier() end
if info.rank == 1 then io.stdout:write("partial from rank 1") end
step()
if info.rank == 0 then print("line from rank 0") end
step()
if info.rank == 1 then io.stdout:write(" continued\n"); io.stderr:write("deliberate failure on rank 1") end
step()
if info.rank == 0 then print("rank 0 started") end
step()
if info.rank == 1 then os.exit(3) end
info.group:barrier()
]]

-- Rank 1 is sent SIGSEGV from outside while it sends data: Open MPI's handler, printing its
-- backtrace, may abort (signal 6), which is what mpirun then reports.
local SEGV = script [[
local shard = require("shard")
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void);")
local info = shard.comm.info()
if info.rank == 1 then os.execute(("(sleep 1; kill -SEGV %d) &"):format(ffi.C.getpid())) end
local t = shard.ones{ 1000000 }
for _ = 1, 100000 do info.group:all_reduce(t, "sum") end
]]

local TABLE_ERROR = script [[
local shard = require("shard")
if shard.comm.info().rank == 1 then error({ code = 1, why = "disk full" }) end
]]

local STUCK = script [[
local shard = require("shard")
local info = shard.comm.info()
if info.rank == 1 then os.execute("sleep 60") end
local t = shard.tensor { 1 }
info.group:all_reduce(t, "sum")
]]

-- Rank 1 stops itself (SIGSTOP) in the second step of a full_shard model: rank 0 times out
-- with a prefetched all-gather still pending.
local STOPPED = script [[
local shard = require("shard")
local ffi = require("ffi")
ffi.cdef "int getpid(void); int kill(int pid, int sig);"
local nn = shard.nn
local env = shard.init()
local model = shard.fsdp.wrap(function()
  return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 32, block_size = 16, vocab_size = 65, bias = false }
end, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
local x = shard.tensor{ { 1, 2, 3, 4 } }:to("i64")
for it = 1, 3 do
  if it == 2 and env.rank == 1 then ffi.C.kill(ffi.C.getpid(), 19) end
  local loss = model(x, x)
  loss:backward()
end
]]

-- Feeds mpirun's raw lines to launch's router; returns what it printed and the router.
local function routed(all, raw)
  local out = { lines = {} }
  function out:write(...) self.lines[#self.lines + 1] = table.concat { ... } end
  function out.flush() end
  local router = launch_mod.router({ all = all }, out, out)
  for _, line in ipairs(raw) do router:line(line) end
  router:finish()
  return table.concat(out.lines), router
end

describe("shard launch's router of mpirun's lines", function()
  it("joins each rank's writes into its own lines, whatever came between them", function()
    local printed = routed(true, {
      "[1,1]<stdout>:partial from rank 1[1,0]<stdout>:line from rank 0",
      "[1,1]<stdout>: continued",
      "[1,1]<stderr>:no newline on rank 1[1,0]<stdout>:rank 0 again",
      "[1,1]<stdout>:left open[1,0]<stdout>:rank 0 last",
      "[1,1]<stderr>:failed--------------------------------------------------------------------------",
    })
    assert.are.equal("[rank 0] line from rank 0\n[rank 1] partial from rank 1 continued\n[rank 0] rank 0 again\n"
      .. "[rank 0] rank 0 last\n[rank 1] no newline on rank 1failed\n[rank 1] left open\n", printed)
  end)

  it("drops Open MPI's report of a copy from a peer that died, and keeps the first signal a rank got", function()
    local printed, router = routed(false, {
      "[1,0]<stderr>:[vm:02799] Read -1, expected 4000000, errno = 3",
      "[1,1]<stderr>:[vm:02800] Signal: Segmentation fault (11)",
      "[1,1]<stderr>:[vm:02800] Signal: Aborted (6)",
    })
    assert.are.equal("", printed)
    assert.are.equal("signal 11 (Segmentation fault)", router.signal[1])
  end)
end)

describe("shard launch", function()
  it("runs N ranks and prints rank 0's output, passing overrides", function()
    local code, out, err = launch("--nproc 2 " .. quote(HELLO) .. " --lr=0.5")
    assert.are.equal(0, code, err)
    assert.are.equal("hello from rank 0 of 2, sum 3, lr 0.5\n", out)
  end)

  it("prefixes every rank's output with --all", function()
    local code, out, err = launch("--nproc 3 --all " .. quote(HELLO))
    assert.are.equal(0, code, err)
    for r = 0, 2 do
      assert.truthy(out:find(("[rank %d] hello from rank %d of 3, sum 6"):format(r, r), 1, true), out)
    end
  end)

  it("stops every rank within seconds when one fails, and shows its error", function()
    local t0 = os.time()
    local code, out, err = launch("--nproc 3 " .. quote(FAIL))
    local elapsed = os.time() - t0
    assert.are_not.equal(0, code)
    assert.truthy(elapsed <= 20, "took " .. elapsed .. " s")
    assert.truthy(err:find("rank 1 failed", 1, true), err)
    assert.truthy(err:find("rank one exploded on purpose", 1, true), err)
    assert.falsy(out:find("unreachable", 1, true), out)
  end)

  it("ends a job with a stuck rank after --timeout seconds, saying what the timeout is", function()
    local t0 = os.time()
    local code, _, err = launch("--nproc 2 --timeout=2 " .. quote(STUCK))
    local elapsed = os.time() - t0
    assert.are_not.equal(0, code)
    assert.truthy(elapsed <= 15, "took " .. elapsed .. " s")
    assert.truthy(err:find("timed out after", 1, true), err)
    assert.truthy(err:find("the timeout is 2 s", 1, true), err)
  end)

  it("ends a job with a stopped rank within the timeout and a few seconds, pending work given up", function()
    local t0 = os.time()
    local code, _, err = launch("--nproc 2 --timeout=4 " .. quote(STOPPED))
    local elapsed = os.time() - t0
    assert.are_not.equal(0, code)
    assert.truthy(err:find("timed out after", 1, true), err)
    assert.truthy(elapsed <= 7, "took " .. elapsed .. " s with a 4 s timeout")   -- each pending op awaited again: 8 s or more
  end)

  it("refuses a timeout that is not a positive number", function()
    local code, _, err = launch("--nproc 2 --timeout=0 " .. quote(STUCK))
    assert.are.equal(2, code)
    assert.truthy(err:find("--timeout expects a positive number of seconds", 1, true), err)
  end)

  it("names the rank and the signal when a rank is killed, and says nothing else", function()
    local code, out, err = launch("--nproc 2 " .. quote(KILLED))
    assert.are.equal(137, code)
    assert.are.equal("shard launch: rank 1 was killed by signal 9 (Killed)\n", err)
    assert.falsy(out:find("unreachable", 1, true), out)
  end)

  it("names the signal a rank received, not the abort of Open MPI's handler after it", function()
    local code, _, err = launch("--nproc 2 " .. quote(SEGV))
    assert.are.equal(128 + 11, code)   -- as the message says, not the abort that followed
    assert.truthy(err:find("shard launch: rank 1 was killed by signal 11 (Segmentation fault)\n", 1, true), err)
  end)

  it("shows a recipe's error object that is not a string by its contents, with the recipe", function()
    local code, _, err = launch("--nproc 2 " .. quote(TABLE_ERROR))
    assert.are.equal(1, code)
    assert.truthy(err:find("[rank 1] " .. TABLE_ERROR .. ' raised an error table: { code = 1, why = "disk full" }', 1, true), err)
    local path = script 'error(setmetatable({}, { __tostring = function() return "custom failure" end }))'
    code, _, err = sh(quote(BIN) .. " run " .. quote(path))
    assert.are.equal(1, code)
    assert.are.equal(path .. " raised an error table: custom failure\n", err)
  end)

  it("keeps every line whole and with its rank when writes without a newline interleave", function()
    local code, out, err = launch("--nproc 2 --all " .. quote(PARTIAL))
    assert.are.equal(3, code, err)
    local want = { "[rank 0] line from rank 0", "[rank 1] partial from rank 1 continued",
                   "[rank 1] deliberate failure on rank 1", "[rank 0] rank 0 started" }
    local lines = {}
    for line in out:gmatch("[^\n]+") do lines[#lines + 1] = line end
    table.sort(want); table.sort(lines)   -- rank 1's last line is whole only when the job ends
    assert.are.same(want, lines)
    code, out, err = launch("--nproc 2 " .. quote(PARTIAL))
    assert.are.equal(3, code, err)
    assert.are.equal("line from rank 0\nrank 0 started\n", out)
    assert.truthy(err:find("\n[rank 1] partial from rank 1 continued\n[rank 1] deliberate failure on rank 1\n", 1, true), err)
  end)

  it("rejects a bad command line with exit code 2", function()
    local code, _, err = launch(quote(HELLO))
    assert.are.equal(2, code)
    assert.truthy(err:find("--nproc", 1, true), err)
    code, _, err = launch("--nproc 2 /nonexistent/recipe.lua")
    assert.are.equal(2, code)
    assert.truthy(err:find("cannot open", 1, true), err)
    code, _, err = launch("--nproc 2 --bogus " .. quote(HELLO))
    assert.are.equal(2, code)
    assert.truthy(err:find("unknown option", 1, true), err)
  end)
end)
