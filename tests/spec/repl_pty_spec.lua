-- shard repl at a terminal: driven through a pseudo-terminal by tests/pty/ptyexpect (built by
-- make test as BUILD/tests/pty/ptyexpect; tests/run.sh exports SHARD_BUILD). Ctrl-C during a
-- long (JIT-hot) loop returns to the prompt with the session's values kept, at world 1 and 2;
-- Ctrl-C at the prompt drops the line; Tab completes names (and lists methods), never file
-- names (the specs run in the project root, beside Makefile); the history
-- file holds each line as soon as it is entered; tables print their contents; at world 2 an
-- error on one rank, ranks left out of step by a Ctrl-C inside a collective, :restart, and
-- :wait for a rank whose collective times out (it then stops with "interrupted").
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh = support.BIN, support.quote, support.sh

local DRIVER = (os.getenv("SHARD_BUILD") or "build") .. "/tests/pty/ptyexpect"
if not DRIVER:match("^/") then DRIVER = support.ROOT .. "/" .. DRIVER end

-- Runs the REPL (with args) under the driver with this script; returns the driver's exit
-- code and the session's transcript.
local function drive(args, script, env)
  assert(io.open(DRIVER, "r"), DRIVER .. " is missing: make " .. DRIVER:gsub("^.*/build/", "build/"))
  local history = os.tmpname()
  local cmd = ("env TERM=dumb INPUTRC=/dev/null SHARD_HISTORY=%s %s %s -- %s repl %s"):format(
    quote(history), env or "", quote(DRIVER), quote(BIN), args)
  local code, out, err = sh(cmd, script)
  os.remove(history)
  return code, out .. err
end

describe("shard repl at a terminal", function()
  it("stops a hot loop at Ctrl-C, keeps the session, completes names and keeps history", function()
    local code, out = drive("", [[
expect Ctrl-D exits
send mark = "hist-" .. 41\n
expect > 
send mark\n
expect hist-41
send local s = 0; for i = 1, 1e12 do s = s + i end\n
sleep 1
send \x03
expect interrupted
send mark\n
expect hist-41
send io.open(os.getenv("SHARD_HISTORY")):read("*a")\n
expect mark = "hist-" .. 41
send half = 1 +\n
expect >> 
send \x03
expect > 
send half\n
expect half\nnil
send t = shard.ones{3}\n
expect > 
send t:numel() * 10\n
expect 30
expect > 
send t:su\t\t
expect t:sumsq
send \x03
expect > 
send shard.nn.Lin\t\n
expect __name = "Linear"
send x1 = "Makef\t"\n
expect > 
send x1 .. "|"\n
expect Makef|
send shard.memory.stats()\n
expect by_tag = {
send z = "zz-" .. "printed"\n
expect > 
send y = 40 + 2\n
expect > 
send y\n
expect 42
expect > 
send \x04
wait 0
]])
    assert.equal(0, code, out)
    -- a statement prints nothing (its value would show as zz-printed)
    assert.is_nil(out:find("zz-printed", 1, true), out)
  end)

  it("drives two ranks: Ctrl-C stops both, errors show their rank, out-of-step ranks restart", function()
    local code, out = drive("--nproc 2", [[
timeout 30
expect Ctrl-D exits
send x = rank + 10\n
expect > 
send x\n
expect [1] 11
send for i = 1, 1e12 do end\n
sleep 1
send \x03
expect [0-1] error: interrupted
send x\n
expect [1] 11
send if rank == 1 then error("boom") end\n
expect [1] error: stdin:1: boom
send world:all_reduce(shard.ones{2} * x)\n
expect [0-1] [21., 21.]
send shard.nn.Lin\t\n
expect [0-1]   __name = "Linear"
send if rank == 0 then for i = 1, 1e12 do end end; world:barrier()\n
sleep 1
send \x03
expect [0] error: interrupted
expect rank 1 still running
send x\n
expect out of step
send :ranks\n
expect rank 1: pid
send :restart\n
expect restarted 2 ranks
send x\n
expect [0-1] nil
send world:all_reduce(shard.ones{1} * (rank + 1))\n
expect [0-1] [3.]
expect > 
send \x04
wait 0
]], "SHARD_REPL_GRACE=1")
    assert.equal(0, code, out)
  end)

  it("lets :wait see a rank stuck in a collective stop when the collective times out", function()
    local code, out = drive("--nproc 2 --timeout 5", [[
timeout 30
expect Ctrl-D exits
send if rank == 0 then for i = 1, 1e12 do end end; world:barrier()\n
sleep 1
send \x03
expect [0] error: interrupted
expect rank 1 still running
expect > 
send :wait\n
expect [1] error: interrupted
expect > 
send :ranks\n
expect rank 1: pid
expect idle
expect > 
send \x04
wait 0
]], "SHARD_REPL_GRACE=1")
    assert.equal(0, code, out)
  end)

  it("says when a second Ctrl-C ended the wait, and takes back a rank that finished after it", function()
    local code, out = drive("--nproc 2 --timeout 3", [[
timeout 30
expect Ctrl-D exits
send x = rank + 10\n
expect > 
send if rank == 0 then for i = 1, 1e12 do end end; world:barrier()\n
sleep 1
send \x03
sleep 1
send \x03
expect [0] error: interrupted
expect rank 1 still running at the second Ctrl-C
expect > 
sleep 4
send x\n
expect [1] error:
expect [1] 11
expect > 
send \x04
wait 0
]], "SHARD_REPL_GRACE=20")
    assert.equal(0, code, out)
    assert.is_nil(out:find("out of step (", 1, true), out)
  end)
end)
