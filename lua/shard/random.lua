-- shard.random: the global generator state. Draws come from the runtime's counter-based
-- Philox stream: a draw of n numbers takes counters [offset, offset + n) of the seed and
-- advances the offset (rounded up to a whole Philox block), so the same seed gives the same
-- numbers on every backend and every rank, and a draw never depends on how the others ran.
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

local R = { seed = 1337, offset = 0 }

function R.manual_seed(seed)
  R.seed, R.offset = seed, 0
end

-- Reserves n counters; returns the seed and the first counter.
function R.reserve(n)
  local first = R.offset
  R.offset = first + math.ceil(n / 4) * 4
  return R.seed, first
end

function R.get_state() return { seed = R.seed, offset = R.offset } end
function R.set_state(s) R.seed, R.offset = s.seed, s.offset end

function R.normal_(t, mean, std)
  local seed, offset = R.reserve(t:numel())
  check(C.sh_random_normal_(t.p, seed, offset, mean or 0, std or 1), 2)
  return t
end

function R.uniform_(t, low, high)
  local seed, offset = R.reserve(t:numel())
  check(C.sh_random_uniform_(t.p, seed, offset, low or 0, high or 1), 2)
  return t
end

return R
