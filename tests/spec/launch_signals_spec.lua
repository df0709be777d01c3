-- shard launch under a signal to it alone (a scheduler's scancel, a CI timeout): SIGTERM,
-- SIGINT and SIGHUP reach the whole job, the launcher ends by the same signal, and no process
-- of the job outlives it; a rank whose launcher was killed (SIGKILL) ends itself. The job's
-- processes are found by a marker in their environment, which every one of them inherits.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, script = support.BIN, support.quote, support.script
local job = require("shard.tools.job")
local timer = require("shard.timer")
local ffi = require("ffi")

-- Ranks that say they are up, then meet in a barrier every 0.2 s for a minute.
local LOOP = script [[
local shard = require("shard")
local info = shard.comm.info()
info.group:barrier()
if info.rank == 0 then print("ranks up"); io.stdout:flush() end
for _ = 1, 300 do info.group:barrier(); os.execute("sleep 0.2") end
]]

-- The pids of the processes whose environment holds SHARD_TEST_MARK=mark.
local function marked(mark)
  local p = io.popen(("grep -lzxF %s /proc/[0-9]*/environ 2>/dev/null"):format(quote("SHARD_TEST_MARK=" .. mark)))
  local pids = {}
  for line in p:lines() do pids[#pids + 1] = line:match("^/proc/(%d+)/") end
  p:close()
  return pids
end

-- Starts the launcher (its own process: the signals go to its pid alone) and waits for the
-- ranks to be up; returns the launcher's job handle.
local function start(mark)
  local j = job.start(("exec env SHARD_TEST_MARK=%s %s launch --nproc 2 %s"):format(mark, quote(BIN), quote(LOOP)), "launcher-" .. mark)
  local deadline, seen = timer.now() + 60, ""
  while not seen:find("ranks up", 1, true) and timer.now() < deadline do
    local lines = j:read(200)
    if not lines then break end
    seen = seen .. table.concat(lines, "\n")
  end
  assert.truthy(seen:find("ranks up", 1, true), "the ranks never came up: " .. seen)
  return j
end

local function kill_marked(mark)
  for _, pid in ipairs(marked(mark)) do ffi.C.kill(tonumber(pid), 9) end
end

describe("shard launch under a signal", function()
  for _, case in ipairs { { "SIGTERM", 15 }, { "SIGINT", 2 }, { "SIGHUP", 1 } } do
    local name, sig = case[1], case[2]
    it("forwards " .. name .. " to the whole job, ends by it, and leaves no process of the job", function()
      local mark = ("%s-%d"):format(name, job.pid())
      local j = start(mark)
      assert.truthy(#marked(mark) >= 3, "mpirun and both ranks carry the mark")
      ffi.C.kill(j.pid, sig)
      local deadline = timer.now() + 30
      while not j:exited() and timer.now() < deadline do j:read(200) end
      local status, left = j:exited(), marked(mark)
      kill_marked(mark)
      assert.are.same({ signal = sig }, status)
      assert.are.same({}, left)
    end)
  end

  it("ends the ranks of a launcher that was killed (SIGKILL) within seconds", function()
    local mark = ("SIGKILL-%d"):format(job.pid())
    local j = start(mark)
    ffi.C.kill(j.pid, 9)
    j:exited(true)
    local deadline = timer.now() + 30
    while #marked(mark) > 0 and timer.now() < deadline do job.sleep(200) end
    local left = marked(mark)
    kill_marked(mark)
    assert.are.same({}, left)
  end)
end)
