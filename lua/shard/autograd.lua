-- shard.autograd: reverse-mode differentiation on a tape (a Wengert list).
-- Each differentiable op appends a node {out, inputs, saved, backward}; loss:backward() walks
-- the tape in reverse, hands each node the gradient of its output, accumulates the input
-- gradients (leaves into their C-side .grad, intermediates in a table), and right after a
-- node's backward releases the node's output and everything it saved. So activations are
-- freed explicitly, in order, and never wait for the Lua GC.
--
-- Ownership: the tape owns every tensor an op produced while recording. Tensors the user
-- keeps past backward (besides the loss) must be kept with t:retain().
local tensor = require("shard.tensor")
local memory = require("shard.memory")
local Tensor = tensor.Tensor

local A = {}
local tape = {}
A.tape = tape
local R = require("shard.random")
A.grad_enabled = true

local produced = setmetatable({}, { __mode = "k" })  -- non-leaf tensors (made by a node)
local retained = setmetatable({}, { __mode = "k" })

local function requires(t) return tensor.is_tensor(t) and t.p.requires_grad ~= 0 end
A.requires = requires

-- True when an op on these inputs must be recorded.
function A.needs_grad(a, b, c, d, e)
  return A.grad_enabled and (requires(a) or requires(b) or requires(c) or requires(d) or requires(e))
end

-- Appends a node whose output is `out`; `inputs` are the tensors gradients flow to (nil
-- entries allowed), `saved` extra tensors the node owns, `backward(node, gout)` returns the
-- input gradients in input order (nil where none is needed).
function A.record(out, inputs, backward, saved, name)
  out.p.requires_grad = 1
  produced[out] = true
  tape[#tape + 1] = { out = out, inputs = inputs, backward = backward, saved = saved, name = name }
  return out
end

-- A marker node runs fn() at its place in the backward pass (FSDP's pre/post-backward hooks).
function A.marker(fn, name)
  tape[#tape + 1] = { marker = fn, name = name }
end

function A.is_leaf(t) return not produced[t] end
function Tensor:retain() retained[self] = true; return self end

-- Outside recording, op outputs are tracked by the innermost scope, which releases them at
-- its end unless they are among its results.
local arena = nil
function A.track(t)
  if arena then arena[#arena + 1] = t end
  return t
end

local function close_scope(list, ok, a, b, c)
  for _, t in ipairs(list) do
    if t ~= a and t ~= b and t ~= c and not retained[t] then t:free() end
  end
  if not ok then error(a, 0) end
  if arena then for _, r in ipairs({ a, b, c }) do if tensor.is_tensor(r) then arena[#arena + 1] = r end end end
  return a, b, c
end

-- Runs fn; op outputs created inside are released when it returns, except its results.
function A.scope(fn, ...)
  local outer = arena
  arena = {}
  local list = arena
  local ok, a, b, c = pcall(fn, ...)
  arena = outer
  return close_scope(list, ok, a, b, c)
end

-- Runs fn with recording off, as a scope.
function A.no_grad(fn, ...)
  local was = A.grad_enabled
  A.grad_enabled = false
  local ok, a, b, c = pcall(A.scope, fn, ...)
  A.grad_enabled = was
  if not ok then error(a, 0) end
  return a, b, c
end

---------------------------------------------------------------------------------------------
-- gradient accumulation

local grads = {}   -- gradient of each non-leaf output, during the current backward

-- Whether t is a leaf with no gradient yet: a kernel that can write instead of sum (the
-- linear layers' dw and db) then writes a new buffer, A.new_grad(t), with no zero fill.
function A.grad_is_fresh(t) return not produced[t] and t.p.grad == nil end

-- A new, uninitialised gradient for fresh leaf t, set as t.grad (the caller's kernel writes
-- every element, or drops it with A.drop_grad on an error); returned borrowed. Memory stats
-- count it as a gradient.
function A.new_grad(t)
  local g = memory.with_tag("grad", tensor.empty, t:shape(), { dtype = t:dtype(), device = t:device() })
  tensor.set_grad(t, g)
  g:free()
  return tensor.borrow(t.p.grad)
end

-- The tensor into which t's gradient accumulates: a leaf's .grad (created as zeros on first
-- use), or the running gradient of a non-leaf. Fused backward kernels add into it directly.
function A.grad_buffer(t)
  if produced[t] then
    local g = grads[t]
    if not g then g = tensor.zeros(t:shape(), { dtype = t:dtype(), device = t:device() }); grads[t] = g end
    return g
  end
  if t.p.grad == nil then return A.new_grad(t):fill_(0) end
  return tensor.borrow(t.p.grad)
end
function A.drop_grad(t) tensor.set_grad(t, nil) end

-- Adds g (which the caller gives up) into t's gradient.
local function accumulate(t, g)
  if t.p.requires_grad == 0 then g:free(); return end
  if produced[t] then
    local have = grads[t]
    if have then have:add_(g); g:free() else grads[t] = g end
    return
  end
  if t.p.grad == nil then
    if g:dtype() ~= t:dtype() then local c = g:to(t:dtype()); g:free(); g = c end
    tensor.set_grad(t, g)
  else
    tensor.borrow(t.p.grad):add_(g)
  end
  g:free()
end
A.accumulate = accumulate

local function release(t)
  if t and not retained[t] then t:free() end
end

-- Runs one node's backward in its own scope: the temporaries the formula makes (what it
-- passes to A.track: shard.functional's backward helpers, and ops run as methods, grad
-- being off) are released when it returns, except the gradients it returns, which
-- accumulate hands on.
local function run_node(node, gout)
  local outer = arena
  arena = {}
  local made = arena
  local ok, gins = pcall(node.backward, node, gout)
  arena = outer
  local keep = {}
  if ok and gins then for _, g in pairs(gins) do keep[g] = true end end
  for _, t in ipairs(made) do if not keep[t] then release(t) end end
  if not ok then error(gins, 0) end
  return gins
end

local function release_node(node)
  if node.out then release(node.out) end
  if node.saved then for _, s in pairs(node.saved) do if tensor.is_tensor(s) then release(s) end end end
end

-- The nodes root depends on: a walk from root's producer through the inputs' producers.
local function reachable_from(root)
  local producer = {}
  for _, node in ipairs(tape) do if node.out then producer[node.out] = node end end
  if not producer[root] then return nil end
  local seen, stack = {}, { producer[root] }
  while #stack > 0 do
    local node = table.remove(stack)
    if node and not seen[node] then
      seen[node] = true
      for _, inp in pairs(node.inputs) do
        local p = producer[inp]
        if p and not seen[p] then stack[#stack + 1] = p end
      end
    end
  end
  return seen
end

-- Runs the tape backward from `root` (a scalar unless `gradient` is given). The nodes root
-- depends on are run and released; others (another graph recorded alongside) stay on the
-- tape for their own backward. Marker nodes always run.
-- Gradients whose value the host knows (the seed of a backward): tensor -> number.
local known = setmetatable({}, { __mode = "k" })
function A.known_value(t) return known[t] end

function A.backward(root, gradient)
  if not tensor.is_tensor(root) then error("backward: expected a tensor, got " .. type(root), 2) end
  if not produced[root] then error("backward: the tensor was not produced by a recorded op (does anything require grad?)", 2) end
  if gradient == nil and root:numel() ~= 1 then
    error(("backward: %s is not a scalar; pass a gradient of its shape (t:backward(g)) or reduce it first (t:sum():backward())"):format(
      root:describe()), 2)
  end
  if gradient ~= nil then
    if not tensor.is_tensor(gradient) then error("backward: gradient must be a tensor, got " .. type(gradient), 2) end
    local rs, gs = root:shape(), gradient:shape()
    if table.concat(rs, ",") ~= table.concat(gs, ",") then
      error(("backward: gradient %s does not have the shape of %s"):format(gradient:describe(), root:describe()), 2)
    end
  end
  local needed = reachable_from(root)
  if not needed then
    error("backward: the graph of " .. root:describe() .. " was already run backward or cleared (its activations are " ..
          "freed); run the forward again for another backward", 2)
  end
  retained[root] = true
  local outer_grads = grads          -- a checkpoint's backward runs a nested backward
  grads = {}
  if gradient then grads[root] = gradient:clone()
  else
    -- the seed's value is known on the host, so an op that takes its upstream gradient as a
    -- number (cross-entropy) need not read it back from the device
    grads[root] = tensor.ones(root:shape(), { dtype = root:dtype(), device = root:device() })
    known[grads[root]] = 1
  end
  local was = A.grad_enabled
  A.grad_enabled = false
  local kept = {}
  local ok, err = pcall(function()
    for i = #tape, 1, -1 do
      local node = tape[i]
      tape[i] = nil
      if node.marker then
        node.marker()
      elseif not needed[node] then
        kept[#kept + 1] = node
      else
        local gout = grads[node.out]
        if gout then
          grads[node.out] = nil
          local gins = run_node(node, gout)
          gout:free()
          if gins then
            for j, inp in pairs(node.inputs) do
              local g = gins[j]
              if g then
                if tensor.is_tensor(inp) then accumulate(inp, g) else g:free() end
              end
            end
          end
        end
        release_node(node)
      end
    end
  end)
  A.grad_enabled = was
  for t, g in pairs(grads) do g:free(); grads[t] = nil end
  grads = outer_grads
  for i = #kept, 1, -1 do tape[#tape + 1] = kept[i] end
  if not ok then A.clear(); error(err, 0) end
end

-- Selective checkpointing: ops named in a keep set (A.KEEPABLE: the matmuls and attention,
-- whose outputs cost the most to recompute for their size) have their results saved by the
-- checkpointed forward and handed back, in call order, when the backward re-runs it; every
-- other op (norms, activations, residual adds, copies) is recomputed. shard.functional's
-- kept ops call A.replay before their forward kernel and A.save after it.
A.KEEPABLE = { linear = true, matmul = true, attention = true }
local stash = nil   -- the innermost selective checkpoint: { mode = "save"|"replay", keep, list, next }

-- In a selective checkpoint's re-run, the saved results of kept op `name` (nil otherwise:
-- the op computes). Usage in an op: local y = A.replay("linear"); if not y then y = ...;
-- A.save("linear", y) end.
function A.replay(name)
  local st = stash
  if not st or st.mode ~= "replay" or not st.keep[name] then return nil end
  local saved = st.list[st.next]
  if not saved or saved.name ~= name then
    error(("selective checkpoint: the recomputed forward's kept op %d is %s, the first run's was %s (fn must run the same ops each time)"):format(
      st.next, name, saved and saved.name or "none"), 0)
  end
  st.list[st.next] = false
  st.next = st.next + 1
  return unpack(saved)
end

-- In a selective checkpoint's first run, keeps aliases of kept op `name`'s results.
function A.save(name, ...)
  local st = stash
  if not st or st.mode ~= "save" or not st.keep[name] then return end
  local saved = { name = name }
  for i = 1, select("#", ...) do saved[i] = (select(i, ...)):alias() end
  st.list[#st.list + 1] = saved
end

-- The saved results as the checkpoint node's own saved tensors, so a tape dropped before its
-- backward (A.clear) releases them too (a release is idempotent).
local function stashed(st)
  local all = {}
  for _, saved in ipairs(st.list) do for _, t in ipairs(saved) do all[#all + 1] = t end end
  return all
end

local function drop_stash(st)
  for _, saved in ipairs(st.list) do if saved then for _, t in ipairs(saved) do t:free() end end end
end

-- Runs fn(...) with stash st as the innermost one.
local function with_stash(st, fn, ...)
  local outer = stash
  stash = st
  local ok, a, b, c = pcall(fn, ...)
  stash = outer
  if not ok then error(a, 0) end
  return a, b, c
end

-- A keep list ({ "linear", "attention" }) as a set; nil for full checkpointing.
local function keep_set(keep)
  if keep == nil then return nil end
  if type(keep) ~= "table" then error("checkpoint: keep must be a list of op names such as { \"linear\", \"attention\" }, got " .. type(keep), 3) end
  local set = {}
  for i, name in ipairs(keep) do
    if not A.KEEPABLE[name] then
      local known = {}
      for k in pairs(A.KEEPABLE) do known[#known + 1] = k end
      table.sort(known)
      error(("checkpoint: keep[%d] is '%s'; the ops whose outputs can be kept are %s"):format(i, tostring(name), table.concat(known, ", ")), 3)
    end
    set[name] = true
  end
  return set
end
A.keep_set = keep_set

-- Activation checkpointing: runs fn(...) keeping none of its activations and records one
-- node; its backward re-runs fn on a nested tape (same random numbers) and backpropagates
-- through it. Every tensor fn differentiates must come in through its arguments (parameters
-- of modules it calls are fine: they are leaves). A.checkpoint_keep(keep, fn, ...) is the
-- selective form: the outputs of the ops named in keep are saved, not recomputed.
function A.checkpoint(fn, ...) return A.checkpoint_keep(nil, fn, ...) end

function A.checkpoint_keep(keep, fn, ...)
  if not A.grad_enabled then return fn(...) end
  local set = keep_set(keep)
  local st = set and { mode = "save", keep = set, list = {}, next = 1 } or nil
  local args = { ... }
  local rng = R.get_state()
  local out = st and with_stash(st, A.no_grad, fn, ...) or A.no_grad(fn, ...)
  return A.record(out, args, function(node, gout)
    local after = R.get_state()
    R.set_state(rng)
    local leaves = {}
    for i, a in pairs(args) do
      if tensor.is_tensor(a) then
        leaves[i] = a:alias()
        leaves[i].p.requires_grad = a.p.requires_grad
      else
        leaves[i] = a
      end
    end
    local outer = tape
    tape = {}
    A.tape = tape
    if st then st.mode = "replay" end
    local ok, err = pcall(function()
      A.grad_enabled = true
      local again
      if st then again = with_stash(st, fn, unpack(leaves, 1, table.maxn(args)))
      else again = fn(unpack(leaves, 1, table.maxn(args))) end
      A.grad_enabled = false
      A.backward(again, gout)
      again:free()
    end)
    if st then drop_stash(st) end
    A.clear()
    tape = outer
    A.tape = outer
    A.grad_enabled = false
    R.set_state(after)
    local gins = {}
    for i, l in pairs(leaves) do
      if tensor.is_tensor(l) then
        -- an alias of its own: l:free() ends l.grad's view
        if ok and l.p.grad ~= nil then gins[i] = tensor.borrow(l.p.grad):alias() end
        l:free()
      end
    end
    if not ok then error(err, 0) end
    return gins
  end, st and stashed(st) or nil, st and "selective checkpoint" or "checkpoint")
end

-- Drops the tape without running it (a forward whose backward will not come).
function A.clear()
  for i = #tape, 1, -1 do
    local node = tape[i]
    tape[i] = nil
    if not node.marker then release_node(node) end
  end
end

function Tensor:backward(gradient) return A.backward(self, gradient) end

function Tensor:requires_grad_(flag)
  self.p.requires_grad = (flag == nil or flag) and 1 or 0
  return self
end

function Tensor:zero_grad(set_to_none)
  if self.p.grad == nil then return end
  if set_to_none == false then tensor.borrow(self.p.grad):fill_(0) else tensor.set_grad(self, nil) end
end

function Tensor:detach() local a = self:alias(); a.p.requires_grad = 0; return a end

return A
