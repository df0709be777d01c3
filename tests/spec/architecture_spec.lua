-- docs/ARCHITECTURE.md's "Adding an op" and "Adding a collective" against the code: each
-- section names an example (`silu_forward`, `SH_COLL_ALL_GATHER`) and lists, one numbered item
-- each, the files it lives in. Every listed file exists and names the example, and no other
-- file under the section's roots names it, so the list can be followed to add the next one.
local rt = require("shard.ffi")

local ROOTS = {
  op = { "runtime", "kernels", "lua", "tests/ops" },
  collective = { "runtime", "kernels", "lua" },
}

local function read(path)
  local f = io.open(rt.root .. "/" .. path, "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

-- The section under heading `title`: its example token and, for each numbered item, its file
-- and what the file must name: the example, or the item's next `token` where a binding calls
-- it by another name (Lua's Group method by the C function it wraps).
local function section(doc, title)
  local body = doc:match("\n### " .. title .. "\n(.-)\n##")
  assert(body, "docs/ARCHITECTURE.md has no section '### " .. title .. "'")
  local example = body:match("The files `([^`]+)` lives? in")
  local files = {}
  for file, rest in body:gmatch("\n%d+%. `([^`]+)`([^\n]*)") do
    files[#files + 1] = { path = file, names = rest:match("`([%w_]+)`") }
  end
  return example, files
end

-- Source files under roots that contain token (plain text), relative to the repository.
local function files_naming(token, roots)
  local found = {}
  for _, root in ipairs(roots) do
    local out = rt.shell("cd " .. rt.shell_quote(rt.root) .. " && grep -rlF --include='*.c' --include='*.h' "
      .. "--include='*.cu' --include='*.cuh' --include='*.lua' -- " .. rt.shell_quote(token) .. " "
      .. rt.shell_quote(root))
    for line in out:gmatch("[^\n]+") do found[#found + 1] = line end
  end
  table.sort(found)
  return found
end

local function check(title, roots)
  local doc = assert(read("docs/ARCHITECTURE.md"))
  local example, files = section(doc, title)
  assert.is_truthy(example, title .. ": no example named")
  assert.is_true(#files >= 5, title .. ": fewer than five files listed")
  local listed = {}
  for _, f in ipairs(files) do
    listed[f.path] = true
    local text = read(f.path)
    assert.is_truthy(text, title .. ": lists " .. f.path .. ", which does not exist")
    local named = text:find(example, 1, true) or (f.names and text:find(f.names, 1, true))
    assert.is_truthy(named, title .. ": lists " .. f.path .. ", which names neither " .. example .. " nor " .. tostring(f.names))
  end
  for _, f in ipairs(files_naming(example, roots)) do
    assert.is_true(listed[f] == true, title .. ": " .. f .. " names " .. example .. " but is not in the list")
  end
end

describe("docs/ARCHITECTURE.md", function()
  it("lists every file that adding an op touches", function() check("Adding an op", ROOTS.op) end)
  it("lists every file that adding a collective touches", function() check("Adding a collective", ROOTS.collective) end)
  it("lists only directories that exist in its layer table", function()
    local doc = assert(read("docs/ARCHITECTURE.md"))
    for dir in doc:gmatch("| `(%a+)/` |") do
      local layer = dir == "kernels" and "kernels" or "runtime/" .. dir
      assert.is_truthy(rt.shell("ls -d " .. rt.shell_quote(rt.root .. "/" .. layer)):find(layer, 1, true),
                       "layer table names " .. dir .. "/, which does not exist")
    end
  end)
end)
