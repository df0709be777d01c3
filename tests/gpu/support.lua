-- Helpers the CUDA Lua scripts (tests/gpu/*.lua) share; not a test itself (tests/run_gpu.sh and
-- tests/cuda_emu/run.sh skip it). Loaded with dofile relative to the script, which works from
-- any directory and under bin/shard as under bin/shard-emu:
--   local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
-- Each dofile gives a fresh tally: support.check(ok, what) counts (printing "not ok what" on a
-- failure), support.finish(name) prints "name: N passed, N failed" and exits 1 if any failed.
local T = { passed = 0, failed = 0 }

function T.check(ok, what)
  if ok then T.passed = T.passed + 1 else T.failed = T.failed + 1; print("not ok " .. what) end
end

function T.finish(name)
  print(("%s: %d passed, %d failed"):format(name, T.passed, T.failed))
  if T.failed > 0 then os.exit(1) end
end

-- normwise relative error ||a - b|| / ||b||
function T.rel(a, b)
  local x, y = a:tolist_flat(), b:tolist_flat()
  local d, n = 0, 0
  for i = 1, #y do d = d + (x[i] - y[i]) ^ 2; n = n + y[i] ^ 2 end
  return math.sqrt(d / math.max(n, 1e-30))
end

return T
