-- shard.nn.transformer: what nn.GPT and nn.Llama share. A config over a model's defaults, the
-- stack of blocks (a ModuleList: children named 0, 1, 2 ... as the checkpoints name them), the
-- pre-norm residual step of a block, the forward from the final hidden states to the loss or
-- the last position's logits, and nanoGPT's sampling. A model using them has
-- self.config.block_size, self:hidden(idx) [B, T, C] and self.lm_head.weight [V, C].
local Module = require("shard.nn.module")
local F = require("shard.functional")
local tensor = require("shard.tensor")
local A = require("shard.autograd")

local M = {}

-- A container whose children are named 0, 1, 2, ... (transformer.h.0 ...)
M.ModuleList = Module:extend("ModuleList")
M.ModuleList.container = true   -- iterated, never called: FSDP policies skip it
function M.ModuleList:init(list)
  for i, m in ipairs(list or {}) do self:child(tostring(i - 1), m) end
end
function M.ModuleList:__len() return #self:named_children() end

-- n blocks Block(cfg), as a ModuleList.
function M.blocks(n, Block, cfg)
  local list = {}
  for i = 1, n do list[i] = Block(cfg) end
  return M.ModuleList(list)
end

-- x through every block of a ModuleList, in order.
function M.run_blocks(list, x)
  for _, blk in ipairs(list:named_children()) do x = blk.module(x) end
  return x
end

-- A model's full config: its defaults, then cfg's keys over them (a new table).
function M.config(defaults, cfg)
  local c = {}
  for k, v in pairs(defaults) do c[k] = v end
  for k, v in pairs(cfg or {}) do c[k] = v end
  return c
end

-- A pre-norm block's residual step: x + attn(norm1(x)), then that + mlp(norm2(x)).
function M.pre_norm(x, norm1, attn, norm2, mlp)
  x = x + attn(norm1(x))
  return x + mlp(norm2(x))
end

-- A model's forward arguments, checked: idx [B, T] token ids, targets nil or of idx's shape,
-- T at most max (the config's limit, named: block_size, max_seq_len). Errors name the model (who) and blame the
-- forward's caller. Returns B, T.
function M.check_tokens(who, idx, targets, limit, max)
  if not tensor.is_tensor(idx) then error(who .. ": idx must be a [batch, time] tensor of token ids, got " .. type(idx), 3) end
  if targets ~= nil and not tensor.is_tensor(targets) then
    error(who .. ": targets must be a tensor of token ids (or nil), got " .. type(targets), 3)
  end
  if idx:dim() ~= 2 then error(who .. ": idx must be [batch, time] token ids, got " .. idx:describe(), 3) end
  local B, T = idx:size(1), idx:size(2)
  if targets and (targets:dim() ~= 2 or targets:size(1) ~= B or targets:size(2) ~= T) then
    error(("%s: targets %s must have the shape of idx %s"):format(who, targets:describe(), idx:describe()), 3)
  end
  if T > max then error(("%s: sequence length %d is longer than %s %d"):format(who, T, limit, max), 3) end
  return B, T
end

-- Logits of every position [B, T, V]. FSDP gathers a wrapped model's parameters in its
-- forward only: called on such a model whose root is sharded, this names the two ways out
-- instead of failing on a freed parameter.
function M.logits(self, idx)
  local fsdp = require("shard.fsdp")
  if fsdp.is_fsdp(self) and fsdp.gather_state(self) == "sharded" then
    error("logits: the model is FSDP-wrapped and its parameters are sharded outside its forward: call the model "
      .. "(model(idx) gathers them), or gather them around this call (model:unshard() ... model:reshard())", 2)
  end
  return F.linear(self:hidden(idx), self.lm_head.weight)
end

-- The forward of idx [B, T] after the argument checks: with targets, the mean cross-entropy
-- loss (0-dim); without, the logits of the last position [B, V].
function M.forward_tagged(self, idx, targets, B, T)
  local x = self:hidden(idx)
  if targets then
    local logits = F.linear(x:view(B * T, -1), self.lm_head.weight)
    local flat = targets:view(B * T)
    local loss = F.cross_entropy(logits, flat, -1, { consume = true })   -- the logits serve the loss only
    flat:free()     -- the loss node holds its own reference
    return loss
  end
  local last = x:select(2, T)                       -- [B, C]
  return F.linear(last, self.lm_head.weight)
end

-- model:generate(idx, n, temperature, top_k): appends n tokens to idx [B, T] by sampling;
-- temperature and top_k as nanoGPT.
function M.generate(self, idx, n, temperature, top_k)
  temperature = temperature or 1.0
  local R = require("shard.random")
  local was = self.training
  self:eval()
  local B = idx:size(1)
  local seq = {}
  for b = 1, B do
    seq[b] = {}
    for t = 1, idx:size(2) do seq[b][t] = idx:get({ b, t }) end
  end
  for _ = 1, n do
    local T = math.min(#seq[1], self.config.block_size)
    local rows = {}
    for b = 1, B do
      local r = {}
      for t = #seq[b] - T + 1, #seq[b] do r[#r + 1] = seq[b][t] end
      rows[b] = r
    end
    local probs = A.no_grad(function()
      local x = tensor.tensor(rows, { dtype = "i64" })
      local logits = self(x, nil)
      x:free()
      return logits:tolist()
    end)
    local u = tensor.empty({ B }, { dtype = "f64" })
    R.uniform_(u, 0, 1)
    for b = 1, B do
      seq[b][#seq[b] + 1] = M.sample(probs[b], temperature, top_k, u:get({ b }))
    end
    u:free()
  end
  self:train(was)
  return tensor.tensor(seq, { dtype = "i64" })
end

-- Samples an index (0-based) from logits with temperature and top-k, using uniform u.
function M.sample(logits, temperature, top_k, u)
  local n = #logits
  local order = {}
  for i = 1, n do order[i] = i end
  local cut = -math.huge
  if top_k and top_k < n then
    table.sort(order, function(a, b) return logits[a] > logits[b] end)
    cut = logits[order[top_k]]
  end
  local mx = -math.huge
  for i = 1, n do if logits[i] > mx then mx = logits[i] end end
  local w, total = {}, 0
  for i = 1, n do
    w[i] = logits[i] >= cut and math.exp((logits[i] - mx) / temperature) or 0
    total = total + w[i]
  end
  local acc, target = 0, u * total
  for i = 1, n do
    acc = acc + w[i]
    if acc >= target and w[i] > 0 then return i - 1 end
  end
  return n - 1
end

return M
