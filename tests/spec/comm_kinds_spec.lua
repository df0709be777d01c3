-- The collective kinds have one list, the runtime's (comm.h's sh_coll_kind and
-- sh_comm_kind_name): shard.comm reads it, and every tool that names a collective (the step
-- trace, the dry run, the launcher's diagnosis from the flight records) must give each code
-- the name the runtime gives it. A list of names kept anywhere else fails here.
local ffi = require("ffi")
local rt = require("shard.ffi")
local C = rt.C
local shard = require("shard")
local comm = require("shard.comm")

-- The runtime's list: code -> name, walked from C alone.
local function runtime_kinds()
  local list = {}
  for code = 0, C.SH_COLL_N - 1 do
    local p = C.sh_comm_kind_name(code)
    assert(p ~= nil, "sh_comm_kind_name(" .. code .. ") is NULL")
    list[code] = ffi.string(p)
  end
  return list
end

describe("the collective kinds", function()
  local kinds = runtime_kinds()

  it("are named once each by the runtime, and nothing outside 0..SH_COLL_N-1", function()
    assert.is_true(C.SH_COLL_N >= 5)
    local seen = {}
    for code = 0, C.SH_COLL_N - 1 do
      assert.matches("^[a-z_]+$", kinds[code])
      assert.is_nil(seen[kinds[code]], kinds[code] .. " twice")
      seen[kinds[code]] = true
    end
    assert.is_true(C.sh_comm_kind_name(-1) == nil)
    assert.is_true(C.sh_comm_kind_name(C.SH_COLL_N) == nil)
    assert.equal("all_reduce", kinds[C.SH_COLL_ALL_REDUCE])
  end)

  it("are shard.comm's: kinds, KINDS and kind_name agree with the runtime", function()
    assert.equal(C.SH_COLL_N, #comm.kinds)
    local n = 0
    for _ in pairs(comm.KINDS) do n = n + 1 end
    assert.equal(C.SH_COLL_N, n)
    for code = 0, C.SH_COLL_N - 1 do
      assert.equal(kinds[code], comm.kinds[code + 1])
      assert.equal(code, comm.KINDS[kinds[code]])
      assert.equal(kinds[code], comm.kind_name(code))
      assert.is_number(comm.count(kinds[code]))   -- the counters take every name
    end
    assert.is_nil(comm.kind_name(C.SH_COLL_N))
    assert.is_nil(comm.kind_name(-1))
    local ok, err = pcall(comm.count, "allreduce")
    assert.is_false(ok)
    assert.matches("expected " .. kinds[0], err)
  end)

  it("are the dry run's: the counters it probes per step", function()
    local dryrun = require("shard.tools.dryrun")
    assert.equal(C.SH_COLL_N, #dryrun.KINDS)
    for code = 0, C.SH_COLL_N - 1 do assert.equal(kinds[code], dryrun.KINDS[code + 1]) end
  end)

  -- every kind issued once on a world of one, traced: each event is named as the runtime
  -- names its code
  it("name the step trace's collective events", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. rt.shell_quote(dir)))
    local path = dir .. "/t.json"
    local world = comm.init()
    local issued = {
      [C.SH_COLL_ALL_GATHER] = function() world:all_gather(shard.empty{ 3 }) end,
      [C.SH_COLL_REDUCE_SCATTER] = function() world:reduce_scatter(shard.empty{ 3 }, "sum") end,
      [C.SH_COLL_ALL_REDUCE] = function() world:all_reduce(shard.empty{ 3 }, "sum") end,
      [C.SH_COLL_BROADCAST] = function() world:broadcast(shard.empty{ 3 }, 0) end,
      [C.SH_COLL_BARRIER] = function() world:barrier() end,
      [C.SH_COLL_ALL_TO_ALL] = function() world:all_to_all(shard.empty{ 3 }) end,
    }
    for code = 0, C.SH_COLL_N - 1 do
      assert.is_function(issued[code], "this spec issues no " .. kinds[code] .. ": add it")
    end
    shard.trace.setup { path = path, steps = "1:1" }
    shard.trace.begin_step(1)
    for code = 0, C.SH_COLL_N - 1 do issued[code]() end
    shard.trace.end_step(1)
    local f = assert(io.open(path))
    local doc = require("cjson").decode(f:read("*a"))
    f:close()
    os.remove(path); os.remove(dir)
    local named = {}
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" and e.cat == "comm" then named[e.name:match("^(%S+)")] = true end
    end
    for code = 0, C.SH_COLL_N - 1 do assert.is_true(named[kinds[code]] == true, kinds[code] .. " not in the trace") end
    for name in pairs(named) do assert.is_not_nil(comm.KINDS[name], name .. ": a name the runtime does not have") end
  end)

  -- records in the runtime's own layout (comm.h's sh_flight_record) where ranks 0-2 timed
  -- out in collective #12 of each kind and rank 3 stopped at #11
  it("name the collective in the launcher's diagnosis from the flight records", function()
    local launch = require("shard.tools.launch")
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. rt.shell_quote(dir)))
    for code = 0, C.SH_COLL_N - 1 do
      for r = 0, 3 do
        local rec = ffi.new("sh_flight_record")
        ffi.copy(rec.magic, "shflt03", 7)
        rec.rank, rec.size, rec.n_groups = r, 4, 1
        ffi.copy(rec.groups[0].name, "world")
        local seq = r < 3 and 12 or 11
        rec.groups[0].issued, rec.groups[0].last_kind, rec.groups[0].size = seq, code, 4
        ffi.copy(rec.wait_group, "world")
        rec.wait_seq, rec.wait_kind = seq, code
        rec.wait_state, rec.wait_for = r < 3 and 2 or 0, r < 3 and 4 or 0
        local f = assert(io.open(("%s/rank%d.flight"):format(dir, r), "wb"))
        f:write(ffi.string(rec, ffi.sizeof(rec)))
        f:close()
      end
      local line = launch.diagnose(dir, 4) or "(no diagnosis)"
      assert.is_truthy(line:find(("rank 3 never reached %s #12 on group world"):format(kinds[code]), 1, true), line)
    end
    for r = 0, 3 do os.remove(("%s/rank%d.flight"):format(dir, r)) end
    os.remove(dir)
  end)
end)
