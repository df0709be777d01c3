-- shard.functional: the differentiable ops, and the Tensor methods they are (a:add(b),
-- a:sum(dim), a:view(...), ...; each defined here only). Each runs its C kernel (the
-- bindings of shard.ops and shard.tensor's views), then, when an input requires grad,
-- records a tape node whose backward calls the matching backward kernel. Inputs are captured
-- by the node's closure (their producers release them); tensors the node creates for
-- backward alone go in `saved`, released right after the node runs. Index inputs (no
-- gradient: embedding's ids, cross_entropy's targets) are held in `saved` by an alias of the
-- node's own, so a producer may free a temporary one right after the forward. A backward
-- formula runs in a per-node scope (shard.autograd): every temporary it makes through the
-- tracked helpers below is released when it returns, except the gradients it returns.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local ops = require("shard.ops")
local A = require("shard.autograd")
local C, check = rt.C, rt.check
local Tensor, new_from, wrap = tensor.Tensor, tensor.new_from, tensor.wrap
local requires, track = A.requires, A.track
local V = tensor.views
local BIN, UN, RED = ops.BINARY, ops.UNARY, ops.REDUCE

local F = {}

local function ptr(t) return t and t.p or nil end
local function slots(n) return ffi.new("sh_tensor*[?]", n) end
local function take(box, i) local p = box[i]; return p ~= nil and wrap(p) or nil end

-- out is recorded with a backward when the inputs need it, else tracked by the scope.
local function result(out, inputs, backward, saved, name)
  if backward and A.needs_grad(inputs[1], inputs[2], inputs[3], inputs[4], inputs[5]) then
    return A.record(out, inputs, backward, saved, name)   -- looked up each time: shard.profile wraps it
  end
  if saved then for _, s in pairs(saved) do s:free() end end
  return track(out)
end

---------------------------------------------------------------------------------------------
-- tracked helpers for backward formulas: each result goes to the node's scope

local function bin(op, a, b) return track(ops.binary(op, a, b)) end
local function bins(op, a, s, first) return track(ops.binary_scalar(op, a, s, first)) end
local function un(op, a) return track(ops.unary(op, a)) end
local function tv(view, ...) return track(view(...)) end      -- a view from tensor.views
local function alias(g) return track(g:alias()) end
local function taken(box, i) local t = take(box, i); return t and track(t) end

-- Sums g down to t's shape (undoing broadcasting); an alias of g when nothing to do.
local function sum_to(g, t)
  local gs, ts = g.p, t.p
  if gs.ndim == ts.ndim then
    local same = true
    for d = 0, gs.ndim - 1 do if gs.shape[d] ~= ts.shape[d] then same = false; break end end
    if same then return alias(g) end
  end
  return track(ops.sum_to_shape(g, ts.ndim, ts.shape))
end

-- g broadcast (copied) to the shape of t.
local function expand_to(g, t)
  local out = track(tensor.empty(t:shape(), { dtype = g:dtype(), device = g:device() }))
  return out:copy_(g)
end

---------------------------------------------------------------------------------------------
-- elementwise

local function binary_backward(op)
  return function(node, g)
    local a, b = node.inputs[1], node.inputs[2]
    local ga, gb
    if op == BIN.add then
      ga = requires(a) and sum_to(g, a); gb = requires(b) and sum_to(g, b)
    elseif op == BIN.sub then
      ga = requires(a) and sum_to(g, a); gb = requires(b) and sum_to(un(UN.neg, g), b)
    elseif op == BIN.mul then
      ga = requires(a) and sum_to(bin(BIN.mul, g, b), a); gb = requires(b) and sum_to(bin(BIN.mul, g, a), b)
    elseif op == BIN.div then
      ga = requires(a) and sum_to(bin(BIN.div, g, b), a)
      -- -g * a / b^2 = -(g * out) / b
      gb = requires(b) and sum_to(un(UN.neg, bin(BIN.div, bin(BIN.mul, g, node.out), b)), b)
    else
      error("no gradient for binary op " .. op)
    end
    return { ga or nil, gb or nil }
  end
end
local binary_backwards = { [BIN.add] = binary_backward(BIN.add), [BIN.sub] = binary_backward(BIN.sub),
                           [BIN.mul] = binary_backward(BIN.mul), [BIN.div] = binary_backward(BIN.div) }

local function scalar_backward(op, s, first)
  return function(node, g)
    local a = node.inputs[1]
    if op == BIN.add then return { alias(g) } end
    if op == BIN.sub then return { first and un(UN.neg, g) or alias(g) } end
    if op == BIN.mul then return { bins(BIN.mul, g, s) } end
    if op == BIN.div then
      if not first then return { bins(BIN.mul, g, 1 / s) } end
      return { un(UN.neg, bin(BIN.mul, g, bin(BIN.div, node.out, a))) }   -- d(s/a) = -s/a^2 = -out/a
    end
    if op == BIN.pow and not first then        -- d(a^s) = s * a^(s-1)
      return { bin(BIN.mul, g, bins(BIN.mul, bins(BIN.pow, a, s - 1), s)) }
    end
    if op == BIN.pow and first then            -- d(s^a) = out * ln s
      return { bins(BIN.mul, bin(BIN.mul, g, node.out), math.log(s)) }
    end
    error("no gradient for scalar op " .. op)
  end
end

local function binary(opname)
  local op = BIN[opname]
  return function(a, b)
    if type(b) ~= "number" and not tensor.is_tensor(b) then
      error(("%s: the operand must be a tensor or a number, got %s"):format(opname, type(b)), 3)
    end
    if type(b) == "number" then
      return result(ops.binary_scalar(op, a, b, false), { a }, scalar_backward(op, b, false), nil, opname)
    end
    return result(ops.binary(op, a, b), { a, b }, binary_backwards[op], nil, opname)
  end
end
for _, name in ipairs { "add", "sub", "mul", "div" } do F[name] = binary(name) end
function F.pow(a, b)
  if type(b) ~= "number" then error("pow: the exponent must be a number", 2) end
  return result(ops.binary_scalar(BIN.pow, a, b, false), { a }, scalar_backward(BIN.pow, b, false), nil, "pow")
end
for _, name in ipairs { "maximum", "minimum", "eq", "lt", "gt" } do
  local op = BIN[name]
  F[name] = function(a, b)
    if type(b) == "number" then return track(ops.binary_scalar(op, a, b, false)) end
    return track(ops.binary(op, a, b))
  end
end
-- number OP tensor
for _, name in ipairs { "add", "sub", "mul", "div", "pow" } do
  local op = BIN[name]
  F["r" .. name] = function(a, s)
    return result(ops.binary_scalar(op, a, s, true), { a }, scalar_backward(op, s, true), nil, "r" .. name)
  end
end

local unary_grad = {
  [UN.neg] = function(a, out, g) return un(UN.neg, g) end,
  [UN.exp] = function(a, out, g) return bin(BIN.mul, g, out) end,
  [UN.log] = function(a, out, g) return bin(BIN.div, g, a) end,
  [UN.sqrt] = function(a, out, g) return bins(BIN.mul, bin(BIN.div, g, out), 0.5) end,
  [UN.tanh] = function(a, out, g) return bin(BIN.mul, g, bins(BIN.sub, un(UN.square, out), 1, true)) end,
  [UN.square] = function(a, out, g) return bins(BIN.mul, bin(BIN.mul, g, a), 2) end,
  [UN.abs] = function(a, out, g) return bin(BIN.mul, g, un(UN.sign, a)) end,
}
for name, op in pairs(UN) do
  local grad = unary_grad[op]
  F[name] = function(a)
    return result(ops.unary(op, a), { a }, grad and function(node, g) return { grad(a, node.out, g) } end, nil, name)
  end
end

---------------------------------------------------------------------------------------------
-- reductions

-- A Lua dim (1-based, negative from the end) as C's 0-based dim; out of range is an error.
local function cdim(t, dim, op)
  if dim == nil then return nil end
  return tensor.cdim(t, dim, op, 0, 3)
end

local function reduce(opname)
  local op = RED[opname]
  return function(a, dim, keepdim)
    local out = ops.reduce(op, a, cdim(a, dim, opname), keepdim)
    local backward
    if op == RED.sum or op == RED.mean then
      backward = function(node, g)
        local gk = g
        if dim ~= nil and not keepdim then gk = tv(V.unsqueeze, g, dim < 0 and dim + a.p.ndim + 1 or dim) end
        local r = expand_to(gk, a)
        if op == RED.mean then
          local n = dim == nil and a:numel() or a:size(dim)
          r:scale_(1 / n)
        end
        return { r }
      end
    end
    return result(out, { a }, backward, nil, opname)
  end
end
for name in pairs(RED) do F[name] = reduce(name) end
-- argmax over a dim, or (no dim) the index into the flattened tensor, as torch.
function F.argmax(a, dim, keepdim)
  if dim == nil then
    local flat = V.reshape(a, a:numel())
    local ok, r = pcall(ops.argmax, flat, 0, false)
    flat:free()
    if not ok then error(r, 2) end
    return track(r)
  end
  return track(ops.argmax(a, cdim(a, dim, "argmax"), keepdim))
end

---------------------------------------------------------------------------------------------
-- matmul

local function mT(t) return tv(V.transpose, t, -1, -2) end

function F.matmul(a, b)
  local out = A.replay("matmul")    -- a selective checkpoint's re-run hands back the saved result
  if not out then out = ops.matmul(a, b); A.save("matmul", out) end
  return result(out, { a, b }, function(node, g)
    if a.p.ndim < 2 or b.p.ndim < 2 then error("matmul backward: 1-D operands are not differentiable yet; unsqueeze them") end
    local ga = requires(a) and sum_to(track(ops.matmul(g, mT(b))), a)
    local gb = requires(b) and sum_to(track(ops.matmul(mT(a), g)), b)
    return { ga or nil, gb or nil }
  end, nil, "matmul")
end
function F.mm(a, b)
  if a.p.ndim ~= 2 or b.p.ndim ~= 2 then error(("mm: needs 2-D tensors, got %s and %s"):format(a:describe(), b:describe()), 2) end
  return F.matmul(a, b)
end
function F.bmm(a, b)
  if a.p.ndim ~= 3 or b.p.ndim ~= 3 then error(("bmm: needs 3-D tensors, got %s and %s"):format(a:describe(), b:describe()), 2) end
  return F.matmul(a, b)
end

---------------------------------------------------------------------------------------------
-- views

local function viewlike(name, make, grad)
  F[name] = function(a, ...)
    local out = make(a, ...)
    local args = { ... }
    return result(out, { a }, function(node, g) return { grad(a, g, unpack(args)) } end, nil, name)
  end
end

local function reshape_back(a, g) return tv(V.reshape, g, a:shape()) end
viewlike("view", V.view, reshape_back)
viewlike("reshape", V.reshape, reshape_back)
viewlike("flatten", function(a) return V.reshape(a, a:numel()) end, reshape_back)
viewlike("unsqueeze", V.unsqueeze, reshape_back)
viewlike("squeeze", V.squeeze, reshape_back)
viewlike("contiguous", V.contiguous, function(a, g) return alias(g) end)
viewlike("transpose", V.transpose, function(a, g, d0, d1) return tv(V.transpose, g, d0, d1) end)
viewlike("t", function(a)
  if a.p.ndim ~= 2 then error("t(): needs a 2-D tensor, got " .. a:describe(), 3) end
  return V.transpose(a, 1, 2)
end, function(a, g) return tv(V.transpose, g, 1, 2) end)
viewlike("permute", V.permute, function(a, g, ...)
  local order = type((...)) == "table" and (...) or { ... }
  local inv = {}
  for i, d in ipairs(order) do inv[d < 0 and d + #order + 1 or d] = i end
  return tv(V.permute, g, inv)
end)
viewlike("narrow", V.narrow, function(a, g, dim, start, length)
  local full = track(tensor.zeros(a:shape(), { dtype = g:dtype(), device = g:device() }))
  tv(V.narrow, full, dim, start, length):copy_(g)
  return full
end)
viewlike("select", V.select, function(a, g, dim, index)
  local full = track(tensor.zeros(a:shape(), { dtype = g:dtype(), device = g:device() }))
  tv(V.select, full, dim, index):copy_(g)
  return full
end)
viewlike("expand", V.expand, function(a, g) return sum_to(g, a) end)

-- dtype conversion keeps the graph (bf16 compute copies of f32 parameters)
local raw_to = Tensor.to
function F.to(a, what)
  local out = raw_to(a, what)
  if out:dtype() == a:dtype() then return result(out, { a }, function(node, g) return { alias(g) } end, nil, "to") end
  return result(out, { a }, function(node, g) return { track(raw_to(g, a:dtype())) } end, nil, "to")
end

---------------------------------------------------------------------------------------------
-- layers

-- A linear layer's backward kernel (pre: the dgelu fusion, dx then being dpre) with w's and b's
-- gradients: written into new buffers when every one asked for is fresh (a step's first
-- backward after zero_grad(true): no zero fill, and the dw product does not read), else
-- summed into the existing ones (grad_buffer zero-fills any that is missing).
local function linear_backward_call(dx, dy, x, w, b, pre)
  local need_w, need_b = requires(w), b ~= nil and requires(b)
  local set = (need_w or need_b) and (not need_w or A.grad_is_fresh(w)) and (not need_b or A.grad_is_fresh(b))
  local grad = set and A.new_grad or A.grad_buffer
  local gw, gb = need_w and grad(w).p or nil, need_b and grad(b).p or nil
  local rc
  if set then rc = C.sh_linear_backward_set(dx, gw, gb, dy.p, x.p, w.p, ptr(pre))
  elseif pre then rc = C.sh_linear_backward_dgelu(dx, gw, gb, dy.p, x.p, w.p, pre.p)
  else rc = C.sh_linear_backward(dx, gw, gb, dy.p, x.p, w.p) end
  if rc ~= 0 and set then
    if need_w then A.drop_grad(w) end
    if need_b then A.drop_grad(b) end
  end
  check(rc)
end

function F.linear(x, w, b)
  local y = A.replay("linear")
  if not y then y = new_from(C.sh_linear_forward, x.p, w.p, ptr(b)); A.save("linear", y) end
  return result(y, { x, w, b }, function(node, dy)
    local box = slots(1)
    linear_backward_call(requires(x) and box or nil, dy, x, w, b)
    return { taken(box, 0) }
  end, nil, "linear")
end

-- GPT-2's MLP body as one op: y = gelu(x w1^T + b1) w2^T + b2, through the two fused
-- kernels: linear_gelu forward (pre and h = gelu(pre) at once), and backward's
-- linear_backward_dgelu, which gives dpre straight from dy. On CUDA they are cuBLASLt
-- epilogues; on the CPU gelu runs on each thread's rows inside the product's parallel region.
-- A selective checkpoint keeping "linear" keeps pre and y (h is recomputed from pre).
function F.gelu_mlp(x, w1, b1, w2, b2)
  local pre, h = A.replay("linear"), nil
  if pre then h = new_from(C.sh_gelu_forward, pre.p)
  else
    local box = slots(2)
    check(C.sh_linear_gelu_forward(box, box + 1, x.p, w1.p, ptr(b1)))
    h, pre = take(box, 0), take(box, 1)
    A.save("linear", pre)
  end
  local y = A.replay("linear")
  if not y then y = new_from(C.sh_linear_forward, h.p, w2.p, ptr(b2)); A.save("linear", y) end
  return result(y, { x, w1, b1, w2, b2 }, function(node, dy)
    if not (requires(x) or requires(w1) or (b1 and requires(b1))) then
      linear_backward_call(nil, dy, h, w2, b2)
      return {}
    end
    local box = slots(2)
    linear_backward_call(box, dy, h, w2, b2, pre)
    local dpre = taken(box, 0)
    linear_backward_call(requires(x) and box + 1 or nil, dpre, x, w1, b1)
    return { taken(box, 1) }
  end, { h, pre }, "gelu_mlp")
end

function F.layernorm(x, w, b, eps)
  local box = slots(3)
  check(C.sh_layernorm_forward(box, box + 1, box + 2, x.p, w.p, ptr(b), eps or 1e-5))
  local y, mean, rstd = take(box, 0), take(box, 1), take(box, 2)
  return result(y, { x, w, b }, function(node, dy)
    local dx = slots(1)
    check(C.sh_layernorm_backward(requires(x) and dx or nil,
      requires(w) and A.grad_buffer(w).p or nil, (b and requires(b)) and A.grad_buffer(b).p or nil,
      dy.p, x.p, w.p, mean.p, rstd.p))
    return { taken(dx, 0) }
  end, { mean, rstd }, "layernorm")
end

function F.rmsnorm(x, w, eps)
  local box = slots(2)
  check(C.sh_rmsnorm_forward(box, box + 1, x.p, w.p, eps or 1e-6))
  local y, rstd = take(box, 0), take(box, 1)
  return result(y, { x, w }, function(node, dy)
    local dx = slots(1)
    check(C.sh_rmsnorm_backward(requires(x) and dx or nil, requires(w) and A.grad_buffer(w).p or nil,
      dy.p, x.p, w.p, rstd.p))
    return { taken(dx, 0) }
  end, { rstd }, "rmsnorm")
end

local function activation(name, fwd, bwd)
  F[name] = function(x)
    return result(new_from(fwd, x.p), { x }, function(node, dy) return { track(new_from(bwd, dy.p, x.p)) } end, nil, name)
  end
end
activation("gelu", C.sh_gelu_forward, C.sh_gelu_backward)
activation("silu", C.sh_silu_forward, C.sh_silu_backward)

function F.swiglu(a, b)
  return result(new_from(C.sh_swiglu_forward, a.p, b.p), { a, b }, function(node, dy)
    local box = slots(2)
    check(C.sh_swiglu_backward(requires(a) and box or nil, requires(b) and box + 1 or nil, dy.p, a.p, b.p))
    return { taken(box, 0), taken(box, 1) }
  end, nil, "swiglu")
end

function F.softmax(x)
  local y = new_from(C.sh_softmax_forward, x.p)
  return result(y, { x }, function(node, dy) return { track(new_from(C.sh_softmax_backward, dy.p, node.out.p)) } end, nil, "softmax")
end

-- The attention kernel's output and log-sum-exp (saved by a selective checkpoint that keeps
-- "attention").
local function attention_forward(q, k, v, scale)
  local out, lse = A.replay("attention")
  if out then return out, lse end
  local box = slots(2)
  check(C.sh_attention_forward(box, box + 1, q.p, k.p, v.p, scale))
  out, lse = take(box, 0), take(box, 1)
  A.save("attention", out, lse)
  return out, lse
end

-- Causal attention over q, k, v [B, H, T, D].
function F.attention(q, k, v, scale)
  scale = scale or 0
  local out, lse = attention_forward(q, k, v, scale)
  return result(out, { q, k, v }, function(node, dout)
    local g = slots(3)
    check(C.sh_attention_backward(requires(q) and g or nil, requires(k) and g + 1 or nil,
      requires(v) and g + 2 or nil, dout.p, q.p, k.p, v.p, node.out.p, lse.p, scale))
    return { taken(g, 0), taken(g, 1), taken(g, 2) }
  end, { lse }, "attention")
end

-- Causal self-attention straight from the fused projection qkv [B, T, 3C] (q | k | v, each
-- H heads of D): returns y [B, T, C]. The heads are strided views, never copied: the kernel
-- reads q, k, v from qkv, writes its output through a [B, H, T, D] view of y, and backward
-- writes dq, dk, dv straight into the head views of one dqkv buffer (no layout copies).
function F.causal_attention(qkv, n_head, scale)
  scale = scale or 0
  local B, T, C3 = qkv:size(1), qkv:size(2), qkv:size(3)
  local Cn = C3 / 3
  local D = Cn / n_head
  local function heads(x, i) -- [B, H, T, D] view of slice i (0, 1, 2) of x [B, T, n C]
    local part = V.narrow(x, 3, i * Cn + 1, Cn)
    local v4 = V.view(part, B, T, n_head, D)
    local h = V.transpose(v4, 2, 3)
    part:free(); v4:free()
    return h
  end
  local q, k, v = heads(qkv, 0), heads(qkv, 1), heads(qkv, 2)
  local y, lse = A.replay("attention")
  local run = not y
  if run then
    local opts = { dtype = qkv:dtype(), device = qkv:device() }
    y = tensor.empty({ B, T, Cn }, opts)
    lse = tensor.empty({ B, n_head, T }, { dtype = "f32", device = opts.device })
  end
  local out = heads(y, 0)   -- the kernel writes y through it; backward reads the output through it
  if run then
    check(C.sh_attention_forward_into(out.p, lse.p, q.p, k.p, v.p, scale))
    A.save("attention", y, lse)
  end
  return result(y, { qkv }, function(node, dy)
    local dout = tv(V.transpose, tv(V.view, dy, B, T, n_head, D), 2, 3)
    local dqkv = track(tensor.empty({ B, T, C3 }, { dtype = dy:dtype(), device = dy:device() }))
    local dq, dk, dv = track(heads(dqkv, 0)), track(heads(dqkv, 1)), track(heads(dqkv, 2))
    check(C.sh_attention_backward_into(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, out.p, lse.p, scale))
    return { dqkv }
  end, { q, k, v, out, lse }, "causal_attention")
end

-- Llama's causal self-attention straight from its projections: q [B, T, H*D] and k, v
-- [B, T, Hkv*D] (heads are strided views, never copied). Rotary embeddings of base theta turn
-- q and k inside the op (sh_attention_rope_*: the rotated copies are the call's scratch), and
-- each k/v head serves H/Hkv query heads in place. Returns y [B, T, H*D].
function F.rope_attention(q, k, v, n_head, n_kv_head, theta)
  local B, T = q:size(1), q:size(2)
  local D = q:size(3) / n_head
  local function heads(x, h) -- [B, h, T, D] view of x
    local v4 = V.view(x, B, T, h, D)
    local t = V.transpose(v4, 2, 3)
    v4:free()
    return t
  end
  local qh, kh, vh = heads(q, n_head), heads(k, n_kv_head), heads(v, n_kv_head)
  local box = slots(2)
  check(C.sh_attention_rope_forward(box, box + 1, qh.p, kh.p, vh.p, 0, theta))
  local out, lse = take(box, 0), take(box, 1)
  local ot = V.transpose(out, 2, 3)
  local oc = V.contiguous(ot)
  local y = V.view(oc, B, T, n_head * D)
  ot:free(); oc:free()
  local inputs = { q, k, v }
  return result(y, inputs, function(node, dy)
    local dout = tv(V.transpose, tv(V.view, dy, B, T, n_head, D), 2, 3)
    local g = slots(3)
    check(C.sh_attention_rope_backward(requires(q) and g or nil, requires(k) and g + 1 or nil,
      requires(v) and g + 2 or nil, dout.p, qh.p, kh.p, vh.p, out.p, lse.p, 0, theta))
    local grads = {}
    for i, x in ipairs(inputs) do   -- [B, h, T, D] -> x's [B, T, h*D]
      local gi = taken(g, i - 1)
      if gi then grads[i] = tv(V.view, tv(V.contiguous, tv(V.transpose, gi, 2, 3)), B, T, x:size(3)) end
    end
    return grads
  end, { qh, kh, vh, out, lse }, "rope_attention")
end

function F.embedding(idx, w)
  local y = new_from(C.sh_embedding_forward, idx.p, w.p)
  return result(y, { w }, function(node, dy)
    check(C.sh_embedding_backward(A.grad_buffer(w).p, dy.p, node.saved[1].p))
    return {}
  end, { idx:alias() }, "embedding")
end

-- Mean cross-entropy of logits [N, V] against targets [N]; a 0-dim f32 loss. opts.consume:
-- nothing reads logits after this call (a language model's head output, made for the loss
-- alone), so backward writes the gradient over them and the largest activation of the step
-- is not allocated twice.
function F.cross_entropy(logits, targets, ignore_index, opts)
  ignore_index = ignore_index or -1
  local consume = opts and opts.consume and logits:is_contiguous()
  local box = slots(2)
  check(C.sh_cross_entropy_forward(box, box + 1, logits.p, targets.p, ignore_index))
  local loss, lse = take(box, 0), take(box, 1)
  return result(loss, { logits }, function(node, dloss)
    -- the upstream gradient is a number to the kernel: the seed's known value, or 1 and a
    -- device-side scale, so the backward never waits for the device to read it
    local known = A.known_value(dloss)
    local dlogits
    if consume then
      check(C.sh_cross_entropy_backward_(logits.p, node.saved[2].p, lse.p, known or 1, ignore_index))
      dlogits = logits:alias()
    else
      dlogits = new_from(C.sh_cross_entropy_backward, logits.p, node.saved[2].p, lse.p, known or 1, ignore_index)
    end
    if not known then dlogits:mul_(dloss) end
    return { track(dlogits) }
  end, { lse, targets:alias() }, "cross_entropy")
end

-- Dropout draws its mask from the shard generator; backward regenerates it.
function F.dropout(x, p, training)
  if not training or p == 0 then return x end
  local gen = require("shard.random")
  local seed, offset = gen.reserve(x:numel())
  local y = new_from(C.sh_dropout_forward, x.p, p, seed, offset)
  return result(y, { x }, function(node, dy)
    return { track(new_from(C.sh_dropout_backward, dy.p, p, seed, offset)) }
  end, nil, "dropout")
end

---------------------------------------------------------------------------------------------
-- argument checks: a nil or a non-tensor where an op takes a tensor is named, by op and
-- argument, instead of surfacing as "attempt to index a nil value" from deep inside.
-- Each op's tensor arguments in order ("?" marks one that may be nil); ops not listed take
-- one tensor first. The wrapper tail-calls the op, so error levels inside stay as they are.

local TENSOR_ARGS = {
  add = { "a" }, sub = { "a" }, mul = { "a" }, div = { "a" }, pow = { "a" },
  matmul = { "a", "b" }, mm = { "a", "b" }, bmm = { "a", "b" },
  linear = { "x", "weight", "bias?" }, gelu_mlp = { "x", "w1", "b1?", "w2", "b2?" }, layernorm = { "x", "weight", "bias?" }, rmsnorm = { "x", "weight" },
  swiglu = { "a", "b" }, attention = { "q", "k", "v" }, causal_attention = { "qkv" },
  embedding = { "idx", "weight" }, cross_entropy = { "logits", "targets" },
}

local function describe_value(v)
  if type(v) == "table" and getmetatable(v) and getmetatable(v).__name then return "a " .. getmetatable(v).__name end
  return type(v) == "nil" and "nil" or ("a " .. type(v))
end

local function checked(name, f, args)
  local n, names, optional = #args, {}, {}
  for i, a in ipairs(args) do names[i] = a:gsub("%?$", ""); optional[i] = a:sub(-1) == "?" end
  return function(...)
    for i = 1, n do
      local v = select(i, ...)
      if not tensor.is_tensor(v) and not (v == nil and optional[i]) then
        error(("%s: %s (argument %d) must be a tensor, got %s"):format(name, names[i], i, describe_value(v)), 2)
      end
    end
    return f(...)
  end
end

for name, f in pairs(F) do
  if type(f) == "function" then F[name] = checked(name, f, TENSOR_ARGS[name] or { "the input" }) end
end

---------------------------------------------------------------------------------------------
-- the Tensor methods that are these ops

for _, name in ipairs { "add", "sub", "mul", "div", "pow", "radd", "rsub", "rmul", "rdiv", "rpow",
                        "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "abs", "square", "reciprocal", "sign",
                        "sum", "mean", "max", "min", "argmax", "maximum", "minimum", "eq", "lt", "gt",
                        "matmul", "mm", "bmm", "view", "reshape", "flatten", "unsqueeze", "squeeze", "contiguous",
                        "transpose", "t", "permute", "narrow", "select", "expand",
                        "softmax", "gelu", "silu" } do
  assert(Tensor[name] == nil, "Tensor." .. name .. " is defined twice")
  Tensor[name] = F[name]
end

return F
