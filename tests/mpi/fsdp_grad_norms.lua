-- Gradient norms across shards (2, 1 and inf) with one all-reduce each, against the norms of
-- one process's gradients on the same global batch, for every strategy that fits the world.
local shard = require("shard")
local env = shard.init()
local nn, optim, C = shard.nn, shard.optim, shard.C
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = true }
local function build() shard.manual_seed(4); return nn.GPT(CFG) end
local B = 2

shard.manual_seed(9)
local u = shard.rand({ B * env.world, 8 }); local s = u * 16; local ids = s:to("i64")

-- reference: the global batch as one micro-batch per rank, accumulated
local ref = build()
for r = 0, env.world - 1 do
  local x = ids:narrow(1, r * B + 1, B):contiguous()
  local loss = ref(x, x) / env.world
  loss:backward()
end
local function plain_norm(p)
  local grads = {}
  for _, t in ipairs(ref:parameters()) do grads[#grads + 1] = t.grad end
  local part = optim.local_norm_part(grads, p)
  return p == 2 and math.sqrt(part) or part
end

local strategies = { "full_shard", "shard_grad_op", "no_shard" }
if env.world == 4 then strategies[#strategies + 1] = "hybrid_shard" end
for _, strategy in ipairs(strategies) do
  local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = 2 })
  local x = ids:narrow(1, env.rank * B + 1, B):contiguous()
  local loss = model(x, x)
  loss:backward()
  for _, p in ipairs { 2, 1, math.huge } do
    C.sh_comm_reset_counts(nil)
    local got, want = model:grad_norm(p), plain_norm(p)
    local ar = tonumber(C.sh_comm_count(nil, C.SH_COLL_ALL_REDUCE))
    if math.abs(got - want) > 1e-5 * want then
      error(("rank %d %s: %s-norm %.9g, single process %.9g"):format(env.rank, strategy, tostring(p), got, want))
    end
    if ar ~= 1 then error(("rank %d %s: %s-norm took %d all-reduces, expected 1"):format(env.rank, strategy, tostring(p), ar)) end
  end
end
