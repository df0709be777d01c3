-- Hybrid sharding with node-local groups (hybrid_group = "node"), at whatever layout the
-- launcher gives: one host under tests/run.sh, 2 nodes x 2 ranks (by slot or by node) under
-- tests/netns/run.sh. Checks:
--   the node layout: every node index names ranks that agree on it, nodes() distinct indices,
--     local_size ranks each;
--   the mesh: a shard group is exactly the ranks of one node, a replicate group one rank per
--     node with the same local rank;
--   per step, every all-gather and reduce-scatter is issued on the shard group (inside a
--     node) and every all-reduce on the replicate group (across nodes), bytes included;
--   hybrid_shard and hybrid_shard_zero2 give the losses and final parameters of one process
--     training on the whole batch (f32, 1e-5 relative), as tests/mpi/fsdp_parity.lua does.
-- Rank 0 prints one "layout:" line per node (tests/netns/run.sh reads them).
local shard = require("shard")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim

local w = fsdp.world()
local rank, size = w:rank(), w:size()
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false, dropout = 0 }
local B_LOCAL, STEPS = 2, 3
local failures = 0

local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d (node %d, %s): "):format(rank, size, w:node(), w:node_name()) .. fmt:format(...) .. "\n")
end

-- Every rank's value of f over group g, as a Lua list in g's rank order.
local function gather(g, v)
  local t = shard.tensor({ v }, { dtype = "f64" })
  local all = g:all_gather(t):tolist_flat()
  t:free()
  return all
end

---------------------------------------------------------------------------------------------
-- the layout

local nodes = gather(w, w:node())
local local_sizes = gather(w, w:local_size())
local count = {}
for r = 1, size do count[nodes[r]] = (count[nodes[r]] or 0) + 1 end
local distinct = 0
for n, c in pairs(count) do
  distinct = distinct + 1
  if n < 0 or n >= w:nodes() then fail("node index %d is outside 0..%d", n, w:nodes() - 1) end
end
if distinct ~= w:nodes() then fail("%d distinct node indices, nodes() says %d", distinct, w:nodes()) end
for r = 1, size do
  if count[nodes[r]] ~= local_sizes[r] then
    fail("rank %d says its node %d runs %d ranks; %d ranks name that node", r - 1, nodes[r], local_sizes[r], count[nodes[r]])
  end
end
if rank == 0 then
  local by_node = {}
  for r = 1, size do
    local l = by_node[nodes[r] + 1] or {}
    by_node[nodes[r] + 1] = l
    l[#l + 1] = r - 1
  end
  for n, ranks in ipairs(by_node) do print(("layout: node %d ranks %s"):format(n - 1, table.concat(ranks, ","))) end
end

local mesh = fsdp.hybrid_mesh("node")
local in_shard = gather(mesh.shard, w:node())
for _, n in ipairs(in_shard) do
  if n ~= w:node() then fail("shard group %s holds a rank of node %d", mesh.shard:name(), n) end
end
if mesh.shard:size() ~= w:local_size() then
  fail("shard group %s has %d ranks, the node %d", mesh.shard:name(), mesh.shard:size(), w:local_size())
end
local seen = {}
for _, n in ipairs(gather(mesh.replicate, w:node())) do
  if seen[n] then fail("replicate group %s holds two ranks of node %d", mesh.replicate:name(), n) end
  seen[n] = true
end
if mesh.replicate:size() ~= w:nodes() then
  fail("replicate group %s has %d ranks for %d nodes", mesh.replicate:name(), mesh.replicate:size(), w:nodes())
end

---------------------------------------------------------------------------------------------
-- training against one process

local function batch(step)   -- the global batch, the same on every rank
  return support.random_batch(1000 + step, B_LOCAL * size, CFG.block_size, CFG.vocab_size)
end

local function new_model()
  shard.manual_seed(7)
  return nn.GPT(CFG)
end
local function new_opt(m) return optim.AdamW(m, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 }) end

local ref = new_model()
local ref_opt = new_opt(ref)
local ref_losses = {}
for step = 1, STEPS do   -- one micro-batch per rank, accumulated: the ranks' sums in their order
  local gx, gy = batch(step)
  local total = 0
  for r = 0, size - 1 do
    local x = gx:narrow(1, r * B_LOCAL + 1, B_LOCAL):contiguous()
    local y = gy:narrow(1, r * B_LOCAL + 1, B_LOCAL):contiguous()
    local loss = ref(x, y)
    total = total + loss:item()
    local scaled = loss / size
    scaled:backward()
    loss:free(); scaled:free(); x:free(); y:free()
  end
  ref_losses[step] = total / size
  optim.clip_grad_norm(ref, 1.0)
  ref_opt:step()
  ref_opt:zero_grad(true)
  gx:free(); gy:free()
end
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = np.tensor:tolist_flat() end

local function close(a, b) return math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)) end

for _, strategy in ipairs { "hybrid_shard", "hybrid_shard_zero2" } do
  local model = fsdp.wrap(new_model, { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = "node" })
  local opt = new_opt(model)
  for step = 1, STEPS do
    local gx, gy = batch(step)
    local x = gx:narrow(1, rank * B_LOCAL + 1, B_LOCAL):contiguous()
    local y = gy:narrow(1, rank * B_LOCAL + 1, B_LOCAL):contiguous()
    gx:free(); gy:free()
    shard.comm.reset_counts()
    local loss = model(x, y)
    loss:backward()
    -- where this step's collectives went: gathers and reductions inside the node, the
    -- all-reduce across nodes, nothing else anywhere
    for _, kind in ipairs { "all_gather", "reduce_scatter", "all_reduce" } do
      local g = kind == "all_reduce" and mesh.replicate or mesh.shard
      local other = kind == "all_reduce" and mesh.shard or mesh.replicate
      local total_n, total_b = shard.comm.count(kind), shard.comm.bytes(kind)
      -- one node: a single replica, so no all-reduce across replicas is issued at all
      local expected = kind ~= "all_reduce" or mesh.replicate:size() > 1
      if expected and total_n == 0 then fail("%s step %d: no %s at all", strategy, step, kind) end
      if not expected and total_n ~= 0 then fail("%s step %d: %d %s with one replica", strategy, step, total_n, kind) end
      if g:count(kind) ~= total_n or g:bytes(kind) ~= total_b then
        fail("%s step %d: %d %s (%d bytes) on %s of %d (%d bytes) in all", strategy, step, g:count(kind), kind,
          g:bytes(kind), g:name(), total_n, total_b)
      end
      if other:count(kind) ~= 0 then fail("%s step %d: %d %s on %s", strategy, step, other:count(kind), kind, other:name()) end
    end
    local l = gather(w, loss:item())
    local mean = 0
    for _, v in ipairs(l) do mean = mean + v / size end
    if not close(mean, ref_losses[step]) then fail("%s step %d: loss %.8f, single process %.8f", strategy, step, mean, ref_losses[step]) end
    model:clip_grad_norm(1.0)
    opt:step()
    opt:zero_grad(true)
    loss:free(); x:free(); y:free()
  end
  local worst, where = 0, ""
  for _, e in ipairs(model:optim_groups()) do
    local mine = e.tensor:tolist_flat()
    local want = ref_params[e.name]
    for i = 1, #mine do
      local r = want[e.start + i]
      local d = math.abs(mine[i] - r) / math.max(1, math.abs(r))
      if d > worst then worst, where = d, ("%s[%d]: %.9g vs %.9g"):format(e.name, e.start + i, mine[i], r) end
    end
    e.tensor:free()
  end
  if worst > 1e-5 then fail("%s: final parameters differ from single process by %.3g (relative) at %s", strategy, worst, where) end
  if rank == 0 then
    print(("%s node-local: %d nodes x %d ranks, max relative parameter difference %.3g"):format(strategy, w:nodes(), w:local_size(), worst))
  end
end

w:barrier()
if failures > 0 then os.exit(1) end
