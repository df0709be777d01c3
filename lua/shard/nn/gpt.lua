-- shard.nn.GPT: nanoGPT's GPT-2 architecture (pre-LN blocks, learned positions, lm_head
-- tied to wte), with Hugging Face's GPT-2 parameter names (transformer.h.0.attn.c_attn.weight).
-- Weights are [out, in] like nn.Linear; HF's Conv1D stores the transpose, which io converts.
local Module = require("shard.nn.module")
local L = require("shard.nn.layers")
local F = require("shard.functional")
local tensor = require("shard.tensor")
local memory = require("shard.memory")
local Tr = require("shard.nn.transformer")
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
function G.Block:forward(x) return Tr.pre_norm(x, self.ln_1, self.attn, self.ln_2, self.mlp) end

G.ModuleList = Tr.ModuleList

local Transformer = Module:extend("Transformer")
function Transformer:init(cfg)
  self:child("wte", L.Embedding(cfg.vocab_size, cfg.n_embd))
  self:child("wpe", L.Embedding(cfg.block_size, cfg.n_embd))
  self:child("drop", L.Dropout(cfg.dropout))
  self:child("h", Tr.blocks(cfg.n_layer, G.Block, cfg))
  self:child("ln_f", L.LayerNorm(cfg.n_embd, { bias = cfg.bias }))
end

G.GPT = Module:extend("GPT")
G.GPT.defaults = { n_layer = 12, n_head = 12, n_embd = 768, block_size = 1024, vocab_size = 50304,
                   dropout = 0, bias = true }

function G.GPT:init(cfg)
  local c = Tr.config(G.GPT.defaults, cfg)
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
  local B, T = Tr.check_tokens("GPT", idx, targets, "block_size", self.config.block_size)
  return memory.with_tag("activation", self.forward_tagged, self, idx, targets, B, T)
end

-- The final hidden states [B, T, C].
function G.GPT:hidden(idx)
  local tr = self.transformer
  local pos = tensor.new_from(C.sh_arange, 0, idx:size(2), 1, C.SH_I64, idx.p.device)
  local x = tr.wte(idx) + tr.wpe(pos)
  pos:free()      -- wpe's node holds its own reference: nothing is left for the Lua GC
  return tr.ln_f(Tr.run_blocks(tr.h, tr.drop(x)))
end

G.GPT.logits = Tr.logits
G.GPT.forward_tagged = Tr.forward_tagged
G.GPT.generate = Tr.generate
G.sample = Tr.sample

return G
