-- tests/mpi/comm_flatparam.lua: the Lua bindings of shard.comm and shard.flatparam under
-- mpirun -np 1..4 (tests/run.sh; pass = exit 0). Values are formulas of (rank, i), so every
-- rank computes the expected results itself.
local shard = require("shard")
local comm, flatparam = shard.comm, shard.flatparam

local info = comm.info()
local world = info.group
local rank, size = info.rank, info.world
assert(world:rank() == rank and world:size() == size, "rank/size")
assert(info.device == "cpu", "device " .. tostring(info.device))
local env = comm.env()
assert(env.rank == rank and env.world == size, "env")

local function close(a, b, tol) return math.abs(a - b) <= (tol or 1e-5) * (1 + math.abs(b)) end
local function vec(values) return shard.tensor(values) end

-- all_gather (new output) and counters
comm.reset_counts()
local mine = vec { rank, rank + 0.5 }
local all = world:all_gather(mine)
local got = all:tolist()
for r = 0, size - 1 do
  assert(got[2 * r + 1] == r and got[2 * r + 2] == r + 0.5, "all_gather at rank " .. r)
end
assert(world:count("all_gather") == 1 and comm.count("all_gather") == 1, "all_gather counted")

-- reduce_scatter avg and all_reduce sum/max, async
local input = shard.zeros({ 3 * size })
for i = 1, 3 * size do input[i] = rank * 10 + i end
local out = world:reduce_scatter(input, "avg")
for i = 1, 3 do
  local want = 0
  for r = 0, size - 1 do want = want + r * 10 + rank * 3 + i end
  assert(close(out[i], want / size), ("reduce_scatter avg [%d]: %g vs %g"):format(i, out[i], want / size))
end
local t = vec { rank + 1, -rank }
local w = world:all_reduce(t, "max", { async = true })
w:wait()
assert(t[1] == size and t[2] == 0, "all_reduce max")
local b = vec { rank, rank }
world:broadcast(b, size - 1)
assert(b[1] == size - 1, "broadcast")
world:barrier()

-- bf16 with reduce dtype
local h = vec { 1 }:to("bf16")
world:all_reduce(h, "sum")
assert(h[1] == size, "bf16 all_reduce")

-- errors name the op, the group and the rank
local ok, err = pcall(function() world:all_gather(shard.zeros({ 5 }), vec { 1, 2 }) end)
assert(not ok and err:find("all_gather on world") and err:find("rank " .. rank), tostring(err))

-- split: pairs of ranks
local pair = world:split((rank - rank % 2) / 2, rank, "shard group " .. (rank - rank % 2) / 2)
assert(pair:name():find("shard group"), pair:name())
local s = vec { rank }
pair:all_reduce(s, "sum")
local want = 0
for r = rank - rank % 2, math.min(rank - rank % 2 + 1, size - 1) do want = want + r end
assert(s[1] == want, "pair sum " .. s[1] .. " want " .. want)

-- FlatParameter: round trip, tied, grads
local a = shard.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
local c = shard.tensor { 7, 8, 9, 10, 11 }
a.requires_grad = true
c.requires_grad = true
local fp = flatparam.new({ a, c, a }, { group = world })
local fi = fp:info()
assert(fi.numel == 11 and fi.n_unique == 2 and fi.shard_numel == math.ceil(11 / size), "flatparam info")
assert(a:is_freed(), "sharded parameters have no storage")
assert(not pcall(function() return a:tolist() end), "using a resharded parameter is an error")
assert(fp:slot(3).tied_to == 1, "tied")
-- the gather state is the runtime's: sharded -> gathering -> unsharded, one all-gather
assert(fp:state() == "sharded" and fi.state == "sharded", "state after create: " .. tostring(fp:state()))
comm.reset_counts()
fp:unshard_start()
assert(fp:state() == "gathering", "state after unshard_start: " .. tostring(fp:state()))
fp:unshard_start()              -- started already: nothing more
fp:unshard_wait()
assert(fp:state() == "unsharded" and fp:info().state == "unsharded", "state after unshard_wait: " .. tostring(fp:state()))
fp:unshard_start()              -- unsharded already: nothing
fp:unshard()
assert(comm.count("all_gather") == 1, "one all-gather for one unshard, got " .. comm.count("all_gather"))
assert(a:tolist()[2][3] == 6 and c[5] == 11, "unshard values")
a.grad = shard.full({ 2, 3 }, rank + 1)
c.grad = shard.full({ 5 }, 2 * (rank + 1))
local a_grad = a.grad            -- a view of a's grad, which reduce_grad takes
fp:reduce_grad_start("sum"):reduce_grad_wait()
assert(a_grad:is_freed() and a.grad == nil, "reduce_grad took the grads, ending their views")
fp:reshard()
assert(fp:state() == "sharded", "state after reshard: " .. tostring(fp:state()))
local g = fp:grad_shard()
local S = fi.shard_numel
local total = size * (size + 1) / 2
for i = 1, S do
  local j = rank * S + i          -- 1-based flat index
  local want = j <= 6 and total or j <= 11 and 2 * total or 0
  assert(close(g[i], want), ("grad shard [%d] = %g, want %g"):format(i, g[i], want))
end
local shard_t = fp:shard()
assert(shard_t:numel() == S, "shard alias")
fp:free()
print(("rank %d of %d: comm and flatparam bindings ok"):format(rank, size))
