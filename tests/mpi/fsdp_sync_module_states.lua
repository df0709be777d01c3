-- sync_module_states: ranks that initialised differently all start from rank 0's parameters.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local function build(seed)
  shard.manual_seed(seed)
  return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = true }
end
local want = {}
for _, np in ipairs(build(0):named_parameters()) do want[np.name] = np.tensor:tolist_flat() end
local model = shard.fsdp.wrap(build(env.rank), { policy = shard.fsdp.policy.transformer{ nn.Block },
                                                 sync_module_states = true })
for _, e in ipairs(model:optim_groups()) do
  local mine = e.tensor:tolist_flat()
  for i = 1, #mine do
    if mine[i] ~= want[e.name][e.start + i] then
      error(("rank %d: %s[%d] is %.9g, rank 0 has %.9g"):format(env.rank, e.name, e.start + i, mine[i], want[e.name][e.start + i]))
    end
  end
end
