-- shard.fsdp.determ: deterministic mode (fsdp.wrap{ deterministic = true }): the same
-- gradients, norm and so the same parameters, bit for bit, at any world size and strategy.
-- The global batch is cut into chunks (one sequence each, numbered 0..G-1 over the ranks in
-- order) whose gradients are computed alone, each by its own backward (the caller runs one
-- forward and backward per chunk: the kernels then see the same shapes on every rank at any
-- world size), and summed in one fixed binary tree over the chunk indices, whichever rank
-- holds them:
--   node [j 2^l, (j + 1) 2^l) = left child + right child, or the left child alone where the
--   right one lies past G (so G need not be a power of two).
-- Each unit keeps a binary-counter stack of its flat grads over this rank's chunks: a chunk's
-- grad is pushed and two equal siblings on top are summed at once, so the stack holds the
-- maximal tree nodes inside this rank's range (at most 2 log2(chunks) of them). finish
-- sends each node's slice to the rank that owns it (one all_to_all per unit: world ranks
-- that hold the same shard get the same slices), and the owner pushes every rank's nodes in
-- chunk order through the same stack, then adds what is left right to left: the tree's sum.
-- The gradient scale (1 / the global batch's tokens) is applied per chunk by the caller, so
-- the reduction sums and never averages. The units stay gathered from the step's first
-- forward to its finish (one all-gather per unit and step, as shard_grad_op's forward, not
-- one per chunk): the full parameters are held through the step, as under shard_grad_op.
-- The clip norm: the FlatParameters are padded so that every shard is whole blocks of BLOCK
-- elements; each block's sum of squares is summed in f64 in its own fixed order
-- (sh_flatparam_grad_block_sumsq), the blocks of a unit are gathered over its shard group
-- and added in the same kind of tree (blocks of zeros past the end add nothing: x + 0 = x),
-- and the units' sums added in unit order.
-- From begin to finish the deterministic-kernels switch is on (runtime/core/determinism.h:
-- the CUDA attention backward then runs its two passes instead of adding dq with atomics).
local C = require("shard.ffi").C
local shard_tensor = require("shard.tensor")
local mesh = require("shard.fsdp.mesh")

local M = {}

-- Norm blocks: every shard is a multiple of BLOCK elements in deterministic mode.
M.BLOCK = 256

local function unit_label(u) return u.name == "" and "(root)" or u.name end

-- The tree nodes a rank holding chunks [first, first + count) pushes, in order: what the
-- stack below leaves when every chunk is pushed (each a { lo, size }).
local function pieces_of(first, count)
  local stack = {}
  for c = first, first + count - 1 do
    stack[#stack + 1] = { lo = c, size = 1 }
    while #stack >= 2 do
      local a, b = stack[#stack - 1], stack[#stack]
      if a.size ~= b.size or a.lo % (2 * a.size) ~= 0 then break end
      a.size, stack[#stack] = 2 * a.size, nil
    end
  end
  return stack
end
M.pieces_of = pieces_of

-- Pushes node { lo, size, t } and sums equal siblings on top (the left one keeps the sum).
local function push(stack, node)
  stack[#stack + 1] = node
  while #stack >= 2 do
    local a, b = stack[#stack - 1], stack[#stack]
    if a.size ~= b.size or a.lo % (2 * a.size) ~= 0 then break end
    a.t:add_(b.t)
    if b.owned then b.t:free() end
    a.size, stack[#stack] = 2 * a.size, nil
  end
end

-- The stack's sum: its nodes added right to left (each node's right neighbour is the part
-- of its parent that lies before G). Returns the tensor holding it (the bottom node's).
local function fold(stack)
  local acc = stack[#stack].t
  for k = #stack - 1, 1, -1 do
    stack[k].t:add_(acc)
    if stack[k + 1].owned then stack[k + 1].t:free() end
    acc = stack[k].t
  end
  return acc
end

-- The tree sum of a list of numbers (Lua doubles), as fold(push ...) computes it.
local function tree_sum(xs)
  local v = xs
  if #v == 0 then return 0 end
  while #v > 1 do
    local n = {}
    for i = 1, #v, 2 do n[#n + 1] = v[i + 1] and v[i] + v[i + 1] or v[i] end
    v = n
  end
  return v[1]
end
M.tree_sum = tree_sum

-- opts.deterministic at wrap: what it refuses (the options whose gradients it does not cover).
function M.check_wrap(opts)
  if not opts.deterministic then return end
  if opts.ignored_params or opts.ignored_modules then
    error("fsdp.wrap: deterministic = true does not cover ignored_params / ignored_modules (their grads are all-reduced in the ring's order)", 0)
  end
  local mp = opts.mixed_precision
  if mp and ((mp.param and mp.param ~= "f32") or (mp.reduce and mp.reduce ~= "f32")) then
    error("fsdp.wrap: deterministic = true is f32 only (mixed_precision param and reduce f32)", 0)
  end
end

-- The world rank -> its shard index in unit u's shard group (no_shard: 0), gathered once per group.
local function shard_index(root, u)
  local w = mesh.world()
  if not u.mode.shard then return function() return 0 end end
  root.det_index = root.det_index or {}
  local idx = root.det_index[u.group]
  if not idx then
    local mine = shard_tensor.tensor({ u.group:rank() }, { dtype = "f64" })
    local all = w:all_gather(mine)
    idx = all:tolist_flat()
    mine:free(); all:free()
    root.det_index[u.group] = idx
  end
  return function(q) return idx[q + 1] end
end

-- Starts a deterministic step: this rank will run `count` backwards, one per chunk, for
-- chunks first .. first + count - 1 of the global batch's `chunks`. Every rank's range must
-- follow the previous rank's.
function M.begin(root, spec)
  if not root or not root.opts.deterministic then
    error("fsdp.deterministic_begin: expected a model fsdp.wrap returned with deterministic = true", 2)
  end
  local w = mesh.world()
  local mine = shard_tensor.tensor({ spec.first, spec.count }, { dtype = "f64" })
  local all = w:all_gather(mine)
  local v = all:tolist_flat()
  mine:free(); all:free()
  local ranges, at = {}, 0
  for r = 0, w:size() - 1 do
    local first, count = v[2 * r + 1], v[2 * r + 2]
    if count < 1 then   -- a rank without a chunk would skip the step's gathers the others issue
      error(("fsdp.deterministic_begin: rank %d holds no chunk; deterministic mode needs at least one chunk " ..
             "(sequence) per rank, and %d ranks share the global batch's %d"):format(r, w:size(), spec.chunks), 2)
    end
    if first ~= at then
      error(("fsdp.deterministic_begin: rank %d holds chunks %d..%d; each rank's chunks must follow the " ..
             "previous rank's (expected to start at %d)"):format(r, first, first + count - 1, at), 2)
    end
    ranges[r + 1], at = { first = first, count = count }, first + count
  end
  if at ~= spec.chunks then
    error(("fsdp.deterministic_begin: the ranks hold %d chunks, not the global batch's %d"):format(at, spec.chunks), 2)
  end
  root.det = { ranges = ranges, first = spec.first, next = spec.first, last = spec.first + spec.count - 1,
               kernels_were = C.sh_set_deterministic(1) }
  for _, u in ipairs(root.all_units) do u.det_stack = {} end
end

-- A unit's post-backward in a deterministic step: its flat grad is this chunk's leaf.
function M.post_backward(u, root)
  local c = root.det.next
  if c > root.det.last then
    error(("fsdp: unit %s: more backwards than this rank's %d chunks in a deterministic step"):format(
      unit_label(u), root.det.last - root.det.first + 1), 0)
  end
  push(u.det_stack, { lo = c, size = 1, t = u.fp:take_grad(), owned = true })
end

-- After each backward (the root's post-backward): the next backward is the next chunk.
function M.next_chunk(root) root.det.next = root.det.next + 1 end

-- Unit u's ordered reduction: every rank's tree nodes of u's flat grad, each owner's slice
-- through one all_to_all, summed in tree order into u's sharded grad.
local function reduce_unit(root, u, ranges)
  local w = mesh.world()
  local W = w:size()
  local pieces, pmax = {}, 0
  for r = 1, W do
    pieces[r] = pieces_of(ranges[r].first, ranges[r].count)
    pmax = math.max(pmax, #pieces[r])
  end
  local mine = u.det_stack
  local info = u.fp:info()
  local S = info.shard_numel
  local index = shard_index(root, u)
  local dt, dev = info.reduce_dtype, info.device
  local send = shard_tensor.empty({ W * pmax * S }, { dtype = dt, device = dev })
  for q = 0, W - 1 do
    local from = index(q) * S
    for j = 1, pmax do
      local slot = send:narrow(1, (q * pmax + j - 1) * S + 1, S)
      if mine[j] then
        local part = mine[j].t:narrow(1, from + 1, S)
        slot:copy_(part)
        part:free()
      else
        slot:fill_(0)   -- never read: this rank has fewer nodes than pmax
      end
      slot:free()
    end
  end
  for _, node in ipairs(mine) do node.t:free() end
  u.det_stack = {}
  local recv = w:all_to_all(send)
  send:free()
  local stack, views = {}, {}
  for r = 1, W do
    for j, p in ipairs(pieces[r]) do
      local v = recv:narrow(1, ((r - 1) * pmax + j - 1) * S + 1, S)
      views[#views + 1] = v
      push(stack, { lo = p.lo, size = p.size, t = v })
    end
  end
  u.fp:add_grad(fold(stack))
  for _, v in ipairs(views) do v:free() end
  recv:free()
end

-- Ends a deterministic step: every unit's gradients reduced in tree order into its sharded
-- grad (added to what it holds, as a reduction is).
function M.finish(root)
  local det = root and root.det
  if not det then error("fsdp.deterministic_finish: no deterministic step was begun", 2) end
  if det.next ~= det.last + 1 then
    error(("fsdp.deterministic_finish: this rank ran %d backwards for its %d chunks"):format(
      det.next - det.first, det.last - det.first + 1), 2)
  end
  root.det = nil
  C.sh_set_deterministic(det.kernels_were)
  for _, u in ipairs(root.all_units) do
    u:reshard()
    if u.fp and u.trainable then reduce_unit(root, u, det.ranges) end
  end
end

-- The squared L2 norm of every sharded grad, the same bits at any world size: per unit the
-- f64 sums of squares of its BLOCK-element blocks, gathered over the shard group in the flat
-- buffer's order and added in tree order; the units' sums added in unit order.
function M.sumsq(root)
  local total = 0
  for _, u in ipairs(root.all_units) do
    if u.fp and u.trainable then
      local nb = u.info.shard_numel / M.BLOCK
      local blocks = shard_tensor.empty({ nb }, { dtype = "f64", device = "cpu" })
      u.fp:grad_block_sumsq(M.BLOCK, blocks)
      local all = blocks
      if u.mode.shard and u.group:size() > 1 then
        all = u.group:all_gather(blocks)
        blocks:free()
      end
      total = total + tree_sum(all:tolist_flat())
      all:free()
    end
  end
  return total
end

return M
