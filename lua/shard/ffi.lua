-- shard.ffi: the C runtime seen from Lua. The declarations are the runtime headers' own
-- text (preprocessor lines dropped), so C and Lua cannot drift. Inside bin/shard the symbols
-- are in the executable; from a plain luajit, lib/libshard.so is loaded.
local ffi = require("ffi")
local files = require("shard.files")

local M = {}

local function project_root()
  local env = os.getenv("SHARD_HOME")
  if env and env ~= "" then return env end
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  return (src:match("^(.*)/lua/shard/ffi%.lua$") or ".")
end
M.root = project_root()

local LAYERS = { "core", "cpu", "ops", "dist", "io" }
local CORE = { "core/status.h", "core/dtype.h", "core/alloc.h", "core/tensor.h" }

local function read(path) return assert(files.read_file(path), "shard: cannot read runtime header " .. path) end

local function declarations(text)
  local out = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if not line:match("^%s*#") then out[#out + 1] = line end
  end
  return (table.concat(out, "\n"):gsub("__attribute__%b()", ""))
end

-- shell_quote(s): a path as one shell word; shell(cmd): its output and exit status (shard.files).
M.shell_quote, M.shell = files.shell_quote, files.shell

-- Whether the shell finds a program called name.
function M.have_command(name)
  local _, status = M.shell("command -v " .. M.shell_quote(name) .. " >/dev/null")
  return status == 0
end

-- Public headers, layer by layer as runtime/ stacks them (a layer's headers use only those of
-- the layers before it): core's in dependency order first, then in each layer every *.h that
-- is not *_internal.h, in name order.
local function header_list()
  local seen, list = {}, {}
  for _, h in ipairs(CORE) do seen[h] = true; list[#list + 1] = h end
  for _, layer in ipairs(LAYERS) do
    local rest = {}
    local names = files.lines_of("ls " .. M.shell_quote(M.root .. "/runtime/" .. layer) .. " 2>/dev/null")
    for _, name in ipairs(names) do
      local h = layer .. "/" .. name
      if name:match("%.h$") and not name:match("_internal%.h$") and not seen[h] then rest[#rest + 1] = h end
    end
    table.sort(rest)
    for _, h in ipairs(rest) do list[#list + 1] = h end
  end
  return list
end

for _, h in ipairs(header_list()) do
  ffi.cdef(declarations(read(M.root .. "/runtime/" .. h)))
end

local function runtime_library()
  if pcall(function() return ffi.C.sh_last_error end) then return ffi.C end
  return ffi.load(M.root .. "/lib/libshard.so", true)
end
M.C = runtime_library()

-- Number of visible CUDA devices; 0 when the runtime was built without CUDA (then cuda.h's
-- functions are declared but have no symbols).
function M.cuda_device_count()
  local ok, n = pcall(function() return M.C.sh_cuda_device_count() end)
  return ok and tonumber(n) or 0
end

-- Turns a runtime status into a Lua error carrying the runtime's message.
function M.check(rc, level)
  if rc ~= 0 then error(ffi.string(M.C.sh_last_error()), (level or 1) + 1) end
end

return M
