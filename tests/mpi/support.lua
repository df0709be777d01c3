-- tests/mpi/support.lua: what the multi-process scripts share (loaded with dofile; not a test).
local shard = require("shard")
local S = {}

-- A global batch, the same on every rank: inputs and targets, rows x cols token ids below
-- vocab, drawn after shard.manual_seed(seed).
function S.random_batch(seed, rows, cols, vocab)
  shard.manual_seed(seed)
  local function ids()
    local u = shard.rand({ rows, cols })
    local s = u * vocab
    local i = s:to("i64")
    u:free(); s:free()
    return i
  end
  local x = ids()
  return x, ids()
end

return S
