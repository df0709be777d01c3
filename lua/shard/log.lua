-- shard.log(it, {key = value, ...}): one line per call on rank 0, tensors read with :item().
local tensor = require("shard.tensor")

local M = { rank = 0 }

local function fmt(v)
  if tensor.is_tensor(v) then v = v:item() end
  if type(v) ~= "number" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  if math.abs(v) >= 1e4 or math.abs(v) < 1e-3 then return ("%.3e"):format(v) end
  return ("%.4f"):format(v)
end

function M.line(it, fields, order)
  local keys = order or {}
  if not order then
    for k in pairs(fields) do keys[#keys + 1] = k end
    table.sort(keys)
  end
  local parts = { ("iter %d"):format(it) }
  for _, k in ipairs(keys) do
    if fields[k] ~= nil then parts[#parts + 1] = k .. " " .. fmt(fields[k]) end
  end
  return table.concat(parts, " | ")
end

function M.log(it, fields, order)
  local line = M.line(it, fields, order)
  if M.rank == 0 then print(line); io.stdout:flush() end
  return line
end

return setmetatable(M, { __call = function(_, ...) return M.log(...) end })
