-- The padding rule has one place, the runtime's (flatparam.h's sh_flatparam_padded_numel):
-- shard estimate lays a unit out as a FlatParameter of that many elements over the shard
-- group, so its padded sizes must be the FlatParameter's own. Here real FlatParameters are
-- built over dry-run worlds of 1 to 8 ranks (one process each: a dry world is made once per
-- process), on meta tensors, with odd sizes, and their padded and shard sizes are checked
-- against the estimate's.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local estimate = require("shard.tools.estimate")

-- parameter sizes of one unit each: odd, and odd sums of several (a tied weight counts once)
local UNITS = { { 1 }, { 3 }, { 7 }, { 9 }, { 15 }, { 97 }, { 1001 }, { 65537 }, { 5, 8 }, { 4, 5, 6 }, { 11, "tied" } }

-- A script that makes a dry world of SHARD_TEST_GROUP ranks and prints, per unit of UNITS,
-- its FlatParameter's numel, padded_numel and shard_numel.
local SCRIPT = [[
local ffi = require("ffi")
local rt = require("shard.ffi")
local g = tonumber(os.getenv("SHARD_TEST_GROUP"))
local box = ffi.new("sh_comm*[1]")
rt.check(rt.C.sh_comm_init_dry(box, g - 1, g, g))
rt.C.sh_comm_destroy(box[0])
local shard = require("shard")
local world = shard.comm.init()
for _, unit in ipairs(]] .. "%s" .. [[) do
  local params = {}
  for _, n in ipairs(unit) do
    params[#params + 1] = n == "tied" and params[1] or shard.empty({ n }, { device = "meta" })
  end
  local fp = shard.flatparam.new(params, { group = world })
  local i = fp:info()
  print(i.numel, i.padded_numel, i.shard_numel, i.group_size)
  fp:free()
end
]]

local function lua_list(units)
  local parts = {}
  for _, u in ipairs(units) do
    local items = {}
    for _, n in ipairs(u) do items[#items + 1] = type(n) == "string" and ("%q"):format(n) or tostring(n) end
    parts[#parts + 1] = "{ " .. table.concat(items, ", ") .. " }"
  end
  return "{ " .. table.concat(parts, ", ") .. " }"
end

describe("the estimate's padding", function()
  it("is the FlatParameter's for odd sizes over shard groups of 1 to 8 ranks", function()
    local path = support.script(SCRIPT:format(lua_list(UNITS)))
    for g = 1, 8 do
      local out, code = support.run("SHARD_TEST_GROUP=" .. g .. " " .. support.quote(support.BIN) .. " run " .. support.quote(path))
      assert.equal(0, code, out)
      local i = 0
      for numel, padded, shard_numel, group_size in out:gmatch("(%d+)\t(%d+)\t(%d+)\t(%d+)\n") do
        i = i + 1
        numel, padded, shard_numel = tonumber(numel), tonumber(padded), tonumber(shard_numel)
        assert.equal(g, tonumber(group_size))
        local what = ("%d elements over %d ranks"):format(numel, g)
        assert.equal(padded, estimate.padded_numel(numel, g), what)
        assert.equal(shard_numel, estimate.padded_numel(numel, g) / g, what)
      end
      assert.equal(#UNITS, i, out)
    end
    os.remove(path)
  end)

  it("refuses what is no size or no group", function()
    assert.equal(0, estimate.padded_numel(0, 3))
    assert.equal(-1, estimate.padded_numel(-1, 3))
    assert.equal(-1, estimate.padded_numel(5, 0))
  end)
end)
