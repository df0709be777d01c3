-- `shard launch` from the outside: rank 0's output, --all prefixes, and a failing rank ending
-- the job within seconds with its error shown (the others sit in a collective with the
-- default 600 s timeout, so only launch/mpirun can stop them that fast).
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh, script = support.BIN, support.quote, support.sh, support.script

local function launch(args) return sh(quote(BIN) .. " launch " .. args) end

local HELLO = script [[
local shard = require "shard"
local info = shard.comm.info()
local t = shard.tensor { info.rank + 1 }
info.group:all_reduce(t, "sum")
print(("hello from rank %d of %d, sum %g, lr %s"):format(info.rank, info.world, t[1], tostring(shard.config{ lr = 1 }.lr)))
]]

local FAIL = script [[
local shard = require "shard"
local info = shard.comm.info()
if info.rank == 1 then error("rank one exploded on purpose") end
local t = shard.tensor { 1 }
info.group:all_reduce(t, "sum")
print("unreachable on rank " .. info.rank)
]]

local KILLED = script [[
local shard = require "shard"
local ffi = require "ffi"
ffi.cdef "int getpid(void); int kill(int pid, int sig);"
local info = shard.comm.info()
if info.rank == 1 then ffi.C.kill(ffi.C.getpid(), 9) end
info.group:barrier()
print("unreachable on rank " .. info.rank)
]]

local STUCK = script [[
local shard = require "shard"
local info = shard.comm.info()
if info.rank == 1 then os.execute("sleep 60") end
local t = shard.tensor { 1 }
info.group:all_reduce(t, "sum")
]]

-- Rank 1 stops itself (SIGSTOP) in the second step of a full_shard model: rank 0 times out
-- with a prefetched all-gather still pending.
local STOPPED = script [[
local shard = require "shard"
local ffi = require "ffi"
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

  it("names the rank and the signal when a rank is killed", function()
    local code, out, err = launch("--nproc 2 " .. quote(KILLED))
    assert.are_not.equal(0, code)
    assert.truthy(err:find("shard launch: rank 1 was killed by signal 9 (Killed)", 1, true), err)
    assert.falsy(out:find("unreachable", 1, true), out)
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
