-- Ranks with different numbers of batches (rank r has 2 + r) train under FSDP until the
-- shortest runs out: env.all_true ends every rank's loop at the same step, so nobody waits
-- in a collective that the others will never issue.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local model = shard.fsdp.wrap(function()
  shard.manual_seed(1)
  return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false }
end, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
local opt = shard.optim.AdamW(model, { lr = 1e-3 })
local mine = 2 + env.rank
local steps = 0
local i = 1
while env.all_true(i <= mine) do
  shard.manual_seed(100 * env.rank + i)
  local u = shard.rand({ 2, 8 })
  local s = u * 11
  local x = s:to("i64")
  local loss = model(x, x)
  loss:backward()
  opt:step()
  opt:zero_grad(true)
  u:free(); s:free(); x:free(); loss:free()
  steps, i = steps + 1, i + 1
end
if steps ~= 2 then error(("rank %d ran %d steps; expected the shortest rank's 2"):format(env.rank, steps)) end
