-- shard launch's diagnosis from the ranks' flight records (lua/shard/tools/launch.lua M.diagnose),
-- on records written here by hand in the runtime's own layout (comm.h's sh_flight_record):
-- which rank never reached the collective the others timed out in, and, across nodes, the
-- network when the ranks of one node finished a collective that those of another still wait in.
local ffi = require("ffi")
require("shard.ffi")
local launch = require("shard.tools.launch")

local ALL_REDUCE = 2
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. require("shard.ffi").shell_quote(dir)))

-- rank r issued `issued` collectives on world and waits (state 1) or timed out (2) in #wait_seq
local function record(r, node, issued, wait_seq, state, waited)
  local rec = ffi.new("sh_flight_record")
  ffi.copy(rec.magic, "shflt03", 7)
  rec.rank, rec.size, rec.n_groups = r, 4, 1
  ffi.copy(rec.groups[0].name, "world")
  rec.groups[0].issued, rec.groups[0].last_kind, rec.groups[0].size = issued, ALL_REDUCE, 4
  ffi.copy(rec.wait_group, "world")
  rec.wait_seq, rec.wait_kind, rec.wait_state, rec.wait_for = wait_seq, ALL_REDUCE, state, waited
  ffi.copy(rec.node_name, node)
  local f = assert(io.open(("%s/rank%d.flight"):format(dir, r), "wb"))
  f:write(ffi.string(rec, ffi.sizeof(rec)))
  f:close()
end

describe("shard launch's diagnosis of a stopped job", function()
  it("names the rank that never reached the collective", function()
    for r = 0, 2 do record(r, "", 12, 12, 2, 4) end
    record(3, "", 11, 11, 0, 0)
    local line = launch.diagnose(dir, 4)
    assert.is_truthy(line:find("rank 3 never reached all_reduce #12 on group world", 1, true), line)
  end)

  -- the records as the first rank to time out copied them: it is the odd one out, and the
  -- others still wait (state 1) in the collective it went past
  it("takes the collective most ranks wait in as the reference, timed out or still waiting", function()
    for _, r in ipairs { 0, 1, 3 } do record(r, "", 12, 12, 1, 0) end
    record(2, "", 13, 13, 2, 2)
    local line = launch.diagnose(dir, 4)
    assert.is_truthy(line:find("rank 2 finished all_reduce #12 on group world and went on; ranks 0,1,3 waited", 1, true), line)
  end)

  it("counts a rank that issued the collective but was not waiting in it yet among those that reached it", function()
    for _, r in ipairs { 0, 2 } do record(r, "", 12, 12, 2, 2) end
    record(1, "", 12, 11, 0, 0)   -- issued #12 (async), its last wait was #11
    record(3, "", 11, 11, 0, 0)
    local line = launch.diagnose(dir, 4)
    assert.is_truthy(line:find("rank 3 never reached all_reduce #12 on group world; ranks 0-2 waited", 1, true)
      or line:find("rank 3 never reached all_reduce #12 on group world; ranks 0,1,2 waited", 1, true), line)
  end)

  it("names the network when one node's ranks finished what the other node's still wait in", function()
    record(0, "a", 13, 13, 2, 4); record(1, "a", 13, 13, 2, 4)
    record(2, "b", 12, 12, 2, 4.5); record(3, "b", 12, 12, 1, 0)
    local line = launch.diagnose(dir, 4, { [0] = "a", "a", "b", "b" })
    assert.is_truthy(line:find("finished all_reduce #12 on group world and went on", 1, true), line)
    assert.is_truthy(line:find("check the network between nodes a and b", 1, true), line)
  end)

  it("names the network when every rank reached the collective", function()
    for r = 0, 3 do record(r, r < 2 and "a" or "b", 12, 12, 2, 4) end
    local line = launch.diagnose(dir, 4, { [0] = "a", "a", "b", "b" })
    assert.is_truthy(line:find("check the network between nodes a and b", 1, true), line)
  end)

  -- a real job: rank 1 stops itself (SIGSTOP) at a point of its own; rank 0 times out
  local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
  local function stopped_job(body)
    local path = support.script([[
local shard = require("shard")
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void); int kill(int pid, int sig);")
local info = shard.comm.info()
local world = info.group
local function stop() ffi.C.kill(ffi.C.getpid(), 19) end
]] .. body)
    local code, _, err = support.sh(support.quote(support.BIN) .. " launch --nproc 2 --timeout=3 " .. support.quote(path))
    assert.are_not.equal(0, code)
    return err
  end

  it("names a rank stopped before a barrier as never reaching it", function()
    local err = stopped_job [[
if info.rank == 1 then stop() end
world:barrier()
]]
    assert.is_truthy(err:find("shard launch: rank 1 never reached barrier #1 on group world; rank 0 waited", 1, true), err)
  end)

  it("names a rank stopped after it issued the collective: its record did not move", function()
    local err = stopped_job [[
local t = shard.ones{ 4 }
local w = world:all_reduce(t, "sum", { async = true })
if info.rank == 1 then stop() end
w:wait()
]]
    assert.is_truthy(err:find("shard launch: rank 1 issued all_reduce #1 on group world but its record has not moved for", 1, true), err)
  end)

  it("names a rank stopped from outside while the ranks exchange data", function()
    local err = stopped_job [[
if info.rank == 1 then os.execute(("(sleep 1; kill -STOP %d) &"):format(ffi.C.getpid())) end
local t = shard.ones{ 100000 }
for _ = 1, 1000000 do world:all_reduce(t, "sum") end
]]
    local line = err:match("shard launch: ([^\n]*waited[^\n]*)")
    assert.is_truthy(line and line:find("^rank 1 "), err)
  end)
end)
