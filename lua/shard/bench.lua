-- shard bench NAME [--key=value ...]: runs bench/NAME.lua (make bench runs every benchmark
-- beside its peer). Without a name, lists the benchmarks.
local M = {}

local function root() return os.getenv("SHARD_HOME") or "." end

function M.main(args)
  local name = args[1]
  if not name then
    local files = require("shard.files")
    local names = files.lines_of("ls " .. files.shell_quote(root() .. "/bench") .. " 2>/dev/null")
    print("benchmarks (shard bench NAME [--key=value ...]; shard bench NAME --help):")
    local config = require("shard.config")
    for _, f in ipairs(names) do
      local n = f:match("^(.-)%.lua$")
      local about = n and config.description(root() .. "/bench/" .. f)
      if n then print(("  %-22s %s"):format(n, about and config.summary(about) or "")) end
    end
    return 0
  end
  local file = root() .. "/bench/" .. name .. ".lua"
  local f = io.open(file, "r")
  if not f then
    io.stderr:write(("shard bench: no benchmark '%s' (%s is missing); `shard bench` lists them\n"):format(name, file))
    return 2
  end
  f:close()
  local rest = { "run", file }
  for i = 2, #args do rest[#rest + 1] = args[i] end
  return require("shard.cli").main(rest)
end

return M
