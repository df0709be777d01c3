-- shard.nn.GPT: nanoGPT's GPT-2 architecture (pre-LN blocks, learned positions, lm_head
-- tied to wte), with Hugging Face's GPT-2 parameter names (transformer.h.0.attn.c_attn.weight).
-- Weights are [out, in] like nn.Linear; HF's Conv1D stores the transpose, which io converts.
local Module = require "shard.nn.module"
local L = require "shard.nn.layers"
local F = require "shard.functional"
local tensor = require "shard.tensor"
local A = require "shard.autograd"
local memory = require "shard.memory"
local C = require("shard.ffi").C

local G = {}

G.CausalSelfAttention = Module:extend("CausalSelfAttention")
function G.CausalSelfAttention:init(cfg)
  assert(cfg.n_embd % cfg.n_head == 0, "n_embd must be a multiple of n_head")
  self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
  local proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
  self:child("c_attn", L.Linear(cfg.n_embd, 3 * cfg.n_embd, { bias = cfg.bias }))
  self:child("c_proj", L.Linear(cfg.n_embd, cfg.n_embd, { bias = cfg.bias, std = proj_std }))
  self:child("resid_dropout", L.Dropout(cfg.dropout))
end

function G.CausalSelfAttention:forward(x)
  local y = F.causal_attention(self.c_attn(x), self.n_head)
  return self.resid_dropout(self.c_proj(y))
end

G.Block = Module:extend("Block")
function G.Block:init(cfg)
  self:child("ln_1", L.LayerNorm(cfg.n_embd, { bias = cfg.bias }))
  self:child("attn", G.CausalSelfAttention(cfg))
  self:child("ln_2", L.LayerNorm(cfg.n_embd, { bias = cfg.bias }))
  self:child("mlp", L.MLP(cfg.n_embd, { bias = cfg.bias, dropout = cfg.dropout,
                                         proj_std = 0.02 / math.sqrt(2 * cfg.n_layer) }))
end
function G.Block:forward(x)
  x = x + self.attn(self.ln_1(x))
  return x + self.mlp(self.ln_2(x))
end

-- A container whose children are named 0, 1, 2, ... (transformer.h.0 ...)
G.ModuleList = Module:extend("ModuleList")
G.ModuleList.container = true   -- iterated, never called: FSDP policies skip it
function G.ModuleList:init(list)
  for i, m in ipairs(list or {}) do self:child(tostring(i - 1), m) end
end
function G.ModuleList:__len() return #self:named_children() end

local Transformer = Module:extend("Transformer")
function Transformer:init(cfg)
  self:child("wte", L.Embedding(cfg.vocab_size, cfg.n_embd))
  self:child("wpe", L.Embedding(cfg.block_size, cfg.n_embd))
  self:child("drop", L.Dropout(cfg.dropout))
  local blocks = {}
  for i = 1, cfg.n_layer do blocks[i] = G.Block(cfg) end
  self:child("h", G.ModuleList(blocks))
  self:child("ln_f", L.LayerNorm(cfg.n_embd, { bias = cfg.bias }))
end

G.GPT = Module:extend("GPT")
G.GPT.defaults = { n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024, vocab_size = 50304,
                   dropout = 0, bias = true }

function G.GPT:init(cfg)
  local c = {}
  for k, v in pairs(G.GPT.defaults) do c[k] = v end
  for k, v in pairs(cfg or {}) do c[k] = v end
  self.config = c
  self:child("transformer", Transformer(c))
  -- lm_head shares wte's weight: one tensor, counted once, under transformer.wte.weight.
  self.lm_head = { weight = self:tie("lm_head.weight", self.transformer.wte.weight) }
end

-- A Hugging Face GPT-2 checkpoint (a directory with model.safetensors and config.json, or
-- the .safetensors file) as an nn.GPT; opts: dropout, fsdp (wrap options). See shard.io.hf.
function G.GPT.from_pretrained(path, opts)
  return require("shard.io.hf").from_pretrained(G.GPT, path, opts)
end

-- idx [B, T] (i64/i32). With targets: the mean cross-entropy loss (0-dim); without: the
-- logits of the last position [B, V] (what generation needs).
function G.GPT:forward(idx, targets)
  if not tensor.is_tensor(idx) then error("GPT: idx must be a [batch, time] tensor of token ids, got " .. type(idx), 2) end
  if targets ~= nil and not tensor.is_tensor(targets) then
    error("GPT: targets must be a tensor of token ids (or nil), got " .. type(targets), 2)
  end
  if idx:dim() ~= 2 then error("GPT: idx must be [batch, time] token ids, got " .. idx:describe(), 2) end
  local B, T = idx:size(1), idx:size(2)
  if targets and (targets:dim() ~= 2 or targets:size(1) ~= B or targets:size(2) ~= T) then
    error(("GPT: targets %s must have the shape of idx %s"):format(targets:describe(), idx:describe()), 2)
  end
  if T > self.config.block_size then
    error(("GPT: sequence length %d is longer than block_size %d"):format(T, self.config.block_size), 2)
  end
  return memory.with_tag("activation", self.forward_tagged, self, idx, targets, B, T)
end

-- The final hidden states [B, T, C].
function G.GPT:hidden(idx)
  local tr = self.transformer
  local pos = tensor.new_from(C.sh_arange, 0, idx:size(2), 1, C.SH_I64, idx.p.device)
  local x = tr.wte(idx) + tr.wpe(pos)
  pos:free()      -- wpe's node holds its own reference: nothing is left for the Lua GC
  x = tr.drop(x)
  for _, blk in ipairs(tr.h:named_children()) do x = blk.module(x) end
  return tr.ln_f(x)
end

-- Logits of every position [B, T, V].
function G.GPT:logits(idx)
  local B, T = idx:size(1), idx:size(2)
  return F.linear(self:hidden(idx), self.lm_head.weight)
end

function G.GPT:forward_tagged(idx, targets, B, T)
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

-- Appends n tokens to idx [B, T] by sampling; temperature and top_k as nanoGPT.
function G.GPT:generate(idx, n, temperature, top_k)
  temperature = temperature or 1.0
  local R = require "shard.random"
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
      seq[b][#seq[b] + 1] = G.sample(probs[b], temperature, top_k, u:get({ b }))
    end
    u:free()
  end
  self:train(was)
  return tensor.tensor(seq, { dtype = "i64" })
end

-- Samples an index (0-based) from logits with temperature and top-k, using uniform u.
function G.sample(logits, temperature, top_k, u)
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

return G
