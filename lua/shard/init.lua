-- shard: require "shard" gives the runtime's Lua front-end.
local tensor = require "shard.tensor"
local rt = require "shard.ffi"

local shard = {
  version = "0.1.0",
  C = rt.C,
  Tensor = tensor.Tensor,
  tensor = tensor.tensor,
  empty = tensor.empty, zeros = tensor.zeros, ones = tensor.ones, full = tensor.full,
  is_tensor = tensor.is_tensor,
}

-- Modules load on first use, so `require "shard"` stays cheap.
local lazy = { memory = "shard.memory", config = "shard.config" }
setmetatable(shard, { __index = function(t, k)
  local mod = lazy[k]
  if mod then local v = require(mod); rawset(t, k, v); return v end
end })

return shard
