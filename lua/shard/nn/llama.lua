-- shard.nn.Llama: Llama's architecture (pre-RMSNorm blocks, rotary q/k, grouped-query
-- attention, SwiGLU MLP, untied lm_head unless tie_embeddings) with Hugging Face's parameter
-- names (model.layers.0.self_attn.q_proj.weight ...) and rotary layout (rotate_half), so their
-- checkpoints load without renaming or permuting. Weights are [out, in] like nn.Linear.
local Module = require("shard.nn.module")
local L = require("shard.nn.layers")
local F = require("shard.functional")
local memory = require("shard.memory")
local Tr = require("shard.nn.transformer")

local M = {}

M.LlamaAttention = Module:extend("LlamaAttention")
function M.LlamaAttention:init(c)
  local D = c.dim / c.n_head
  self.n_head, self.n_kv_head, self.rope_theta = c.n_head, c.n_kv_head, c.rope_theta
  self:child("q_proj", L.Linear(c.dim, c.n_head * D, { bias = false }))
  self:child("k_proj", L.Linear(c.dim, c.n_kv_head * D, { bias = false }))
  self:child("v_proj", L.Linear(c.dim, c.n_kv_head * D, { bias = false }))
  self:child("o_proj", L.Linear(c.n_head * D, c.dim, { bias = false, std = c.proj_std }))
end
function M.LlamaAttention:forward(x)
  local y = F.rope_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.n_head, self.n_kv_head,
                             self.rope_theta)
  return self.o_proj(y)
end

-- down_proj(silu(gate_proj x) * up_proj x)
M.LlamaMLP = Module:extend("LlamaMLP")
function M.LlamaMLP:init(c)
  self:child("gate_proj", L.Linear(c.dim, c.ffn_dim, { bias = false }))
  self:child("up_proj", L.Linear(c.dim, c.ffn_dim, { bias = false }))
  self:child("down_proj", L.Linear(c.ffn_dim, c.dim, { bias = false, std = c.proj_std }))
end
function M.LlamaMLP:forward(x)
  return self.down_proj(F.swiglu(self.gate_proj(x), self.up_proj(x)))
end

M.LlamaBlock = Module:extend("LlamaBlock")
function M.LlamaBlock:init(c)
  self:child("input_layernorm", L.RMSNorm(c.dim, { eps = c.norm_eps }))
  self:child("self_attn", M.LlamaAttention(c))
  self:child("post_attention_layernorm", L.RMSNorm(c.dim, { eps = c.norm_eps }))
  self:child("mlp", M.LlamaMLP(c))
end
function M.LlamaBlock:forward(x)
  return Tr.pre_norm(x, self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp)
end

local LlamaModel = Module:extend("LlamaModel")
function LlamaModel:init(c)
  self:child("embed_tokens", L.Embedding(c.vocab_size, c.dim))
  self:child("layers", Tr.blocks(c.n_layer, M.LlamaBlock, c))
  self:child("norm", L.RMSNorm(c.dim, { eps = c.norm_eps }))
end

M.Llama = Module:extend("Llama")
M.Llama.defaults = { n_layer = 32, n_head = 32, dim = 4096, multiple_of = 256, vocab_size = 32000,
                     max_seq_len = 2048, rope_theta = 10000, norm_eps = 1e-5, tie_embeddings = false }

-- Meta's hidden size when only multiple_of is given: 2/3 of 4 dim, rounded up to a multiple.
function M.ffn_dim(dim, multiple_of)
  local hidden = math.floor(2 * 4 * dim / 3)
  return multiple_of * math.ceil(hidden / multiple_of)
end

local function positive_int(c, key)
  local v = c[key]
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(("Llama: %s must be a positive integer, got %s"):format(key, tostring(v)), 4)
  end
end

-- The full config: defaults, n_kv_head = n_head and ffn_dim from multiple_of when not given,
-- block_size = max_seq_len (what generation and the data loaders read); checked.
function M.Llama.config(cfg)
  local c = Tr.config(M.Llama.defaults, cfg)
  c.n_kv_head = c.n_kv_head or c.n_head
  for _, key in ipairs { "n_layer", "n_head", "n_kv_head", "dim", "vocab_size", "max_seq_len", "multiple_of" } do
    positive_int(c, key)
  end
  c.ffn_dim = c.ffn_dim or M.ffn_dim(c.dim, c.multiple_of)
  positive_int(c, "ffn_dim")
  if c.dim % c.n_head ~= 0 then error(("Llama: dim %d must be a multiple of n_head %d"):format(c.dim, c.n_head), 3) end
  if (c.dim / c.n_head) % 2 ~= 0 then
    error(("Llama: the head size dim / n_head = %d must be even (rotary pairs)"):format(c.dim / c.n_head), 3)
  end
  if c.n_head % c.n_kv_head ~= 0 then
    error(("Llama: n_kv_head %d must divide n_head %d"):format(c.n_kv_head, c.n_head), 3)
  end
  if not (type(c.rope_theta) == "number" and c.rope_theta > 0) then
    error("Llama: rope_theta must be a number > 0, got " .. tostring(c.rope_theta), 3)
  end
  c.block_size = c.max_seq_len
  c.proj_std = c.proj_std or 0.02 / math.sqrt(2 * c.n_layer)
  return c
end

function M.Llama:init(cfg)
  local c = M.Llama.config(cfg)
  self.config = c
  self:child("model", LlamaModel(c))
  if c.tie_embeddings then
    self.lm_head = { weight = self:tie("lm_head.weight", self.model.embed_tokens.weight) }
  else
    self:child("lm_head", L.Linear(c.dim, c.vocab_size, { bias = false }))
  end
end

-- A Hugging Face Llama checkpoint directory (config.json and model.safetensors or its
-- sharded index) as an nn.Llama; opts as GPT.from_pretrained. See shard.io.hf.
function M.Llama.from_pretrained(path, opts)
  return require("shard.io.hf").from_pretrained_llama(M.Llama, path, opts)
end

-- The final hidden states [B, T, dim].
function M.Llama:hidden(idx)
  local m = self.model
  return m.norm(Tr.run_blocks(m.layers, m.embed_tokens(idx)))
end

M.Llama.logits = Tr.logits

-- idx [B, T] token ids; with targets [B, T]: the mean cross-entropy (0-dim); without: the
-- logits of the last position [B, V]. Arguments checked as GPT's.
function M.Llama:forward(idx, targets)
  local B, T = Tr.check_tokens("Llama", idx, targets, "max_seq_len", self.config.max_seq_len)
  return memory.with_tag("activation", Tr.forward_tagged, self, idx, targets, B, T)
end

M.Llama.generate = Tr.generate

return M
