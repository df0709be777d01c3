-- shard.stats: small summaries of measured values, one definition for every tool that reports
-- them (the training loop's metrics line, the straggler watch, shard sweep's reductions).
local M = {}

-- The median of a list of numbers (the mean of the middle two for an even count); nil when
-- the list is empty. The list is not changed.
function M.median(values)
  local s = {}
  for i, v in ipairs(values) do s[i] = v end
  local n = #s
  if n == 0 then return nil end
  table.sort(s)
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

return M
