-- tests/netns/link_bytes.lua --strategy=S: a few FSDP steps of a GPT with about 1M parameters
-- (hybrid_group = "node"), so that tests/netns/run.sh can count the bytes that cross the link
-- between the two "hosts" under each strategy: full_shard gathers every parameter across it,
-- hybrid_shard only all-reduces gradient shards across it.
local shard = require("shard")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim
local strategy = "full_shard"
for _, a in ipairs(arg or {}) do strategy = a:match("^%-%-strategy=(.*)$") or strategy end
local w = fsdp.world()
local CFG = { n_layer = 4, n_head = 4, n_embd = 128, vocab_size = 64, block_size = 16, bias = false, dropout = 0 }
local model = fsdp.wrap(function() shard.manual_seed(7); return nn.GPT(CFG) end,
  { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = "node" })
local opt = optim.AdamW(model, { lr = 1e-3 })
for step = 1, 3 do
  shard.manual_seed(100 * step + w:rank())
  local u = shard.rand({ 2, CFG.block_size + 1 })
  local s = u * CFG.vocab_size
  local ids = s:to("i64")
  local x = ids:narrow(2, 1, CFG.block_size):contiguous()
  local y = ids:narrow(2, 2, CFG.block_size):contiguous()
  local loss = model(x, y)
  loss:backward()
  opt:step()
  opt:zero_grad(true)
  if w:rank() == 0 then print(("%s step %d loss %.4f"):format(strategy, step, loss:item())) end
  loss:free(); x:free(); y:free(); ids:free(); u:free(); s:free()
end
