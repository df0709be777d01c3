-- shard.cpu: the CPU kernel set (runtime/cpu/cpu.h) from Lua, and the `shard cpu` command.
-- The set in use is the best the CPU runs, or SHARD_CPU_ISA's; M.use switches it in a
-- running process (the REPL, a comparison script).
local ffi = require("ffi")
local C = require("shard.ffi").C

local M = {}

-- The sets, lowest first (cpu.h's order).
M.SETS = { "generic", "avx2", "avx512", "avx512bf16" }

function M.model() return ffi.string(C.sh_cpu_model()) end
function M.isa() return ffi.string(C.sh_cpu_isa_name(C.sh_cpu_isa())) end

-- The sets this CPU runs, best first.
function M.runs()
  local out = {}
  for i = C.sh_cpu_isa_best(), 0, -1 do out[#out + 1] = M.SETS[i + 1] end
  return out
end

function M.use(name)
  for i, set in ipairs(M.SETS) do
    if set == name then
      if C.sh_cpu_set_isa(i - 1) ~= 0 then error(ffi.string(C.sh_last_error()), 2) end
      return
    end
  end
  error(("shard.cpu.use: %s is not a kernel set (%s)"):format(tostring(name), table.concat(M.SETS, ", ")), 2)
end

-- "AMD EPYC 9R14, kernel set avx512bf16": what a log names a CPU figure by.
function M.describe() return ("%s, kernel set %s"):format(M.model(), M.isa()) end

-- `shard cpu`: three lines a script can read.
function M.main(args)
  if args[1] then
    io.stderr:write("shard: cpu takes no arguments (SHARD_CPU_ISA=", table.concat(M.SETS, "|"), " chooses the set)\n")
    return 2
  end
  print("model: " .. M.model())
  print("in use: " .. M.isa())
  print("runs: " .. table.concat(M.runs(), " "))
  return 0
end

return M
