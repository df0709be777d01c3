-- shard.fsdp.mesh: the process groups FSDP's units communicate over: the world, and the shard
-- and replicate groups of hybrid sharding.
local comm = require("shard.comm")

local M = {}

-- The world group (shard.comm's).
function M.world() return comm.world() end

local mesh_cache = {}
-- Shard and replicate groups for hybrid sharding. G ranks: shard groups of G consecutive
-- ranks, replicate groups of the ranks at the same place in each. G = "node": a shard group
-- is the ranks of one node, wherever the launcher numbered them (mpirun --map-by node, srun's
-- cyclic distribution), and a replicate group the ranks with the same local rank, one per
-- node, so that only the all-reduce crosses nodes.
local function hybrid_mesh(G)
  if mesh_cache[G] then return mesh_cache[G] end
  local w = M.world()
  local rank, size = w:rank(), w:size()
  local mesh
  if G == "node" then
    if not w:nodes_uniform() then
      error(("fsdp: hybrid_group = \"node\" needs the same number of ranks on every node; rank %d's node %s (%d of %d) runs %d of the world's %d"):format(
        rank, w:node_name(), w:node(), w:nodes(), w:local_size(), size), 0)
    end
    local node, lr = w:node(), w:local_rank()
    mesh = { shard = w:split_node(("shard group node %d (%s)"):format(node, w:node_name())),
             replicate = w:split(lr, node, ("replicate group local rank %d"):format(lr)) }
  elseif type(G) ~= "number" or G < 1 or G % 1 ~= 0 then
    error(("fsdp: hybrid_group is %s; expected \"node\" or a whole number of ranks (rank %d)"):format(
      type(G) == "string" and ("'" .. G .. "'") or tostring(G), rank), 0)
  elseif size % G ~= 0 then
    error(("fsdp: world size %d is not a multiple of the hybrid group size %d (rank %d)"):format(size, G, rank), 0)
  else
    mesh = { shard = w:split(math.floor(rank / G), rank % G, ("shard group %d"):format(math.floor(rank / G))),
             replicate = w:split(rank % G, math.floor(rank / G), ("replicate group %d"):format(rank % G)) }
  end
  mesh_cache[G] = mesh
  return mesh
end
M.hybrid_mesh = hybrid_mesh

return M
