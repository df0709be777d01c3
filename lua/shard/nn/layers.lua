-- shard.nn layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, MLP, SwiGLU.
-- Each is a Module over the differentiable ops of shard.functional.
local Module = require("shard.nn.module")
local F = require("shard.functional")
local R = require("shard.random")
local rt = require("shard.ffi")

local L = {}

-- recipe(view, start) fills elements [start, start + numel(view)) of the flattened
-- parameter, drawing the same generator counters an eager init would, so a deferred build
-- (Module.deferred: fsdp.wrap given a constructor) can fill each rank's shard alone.
local param_with = Module.init_param

-- A layer's size argument: a positive integer, else an error naming the layer and the
-- argument (a nil would otherwise drop out of the shape table: Linear(nil, 3) built a 1-D
-- weight). The error blames the caller of Layer(...).
local function size_arg(layer, what, v)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(("%s: %s must be a positive integer, got %s"):format(layer, what, tostring(v)), 4)
  end
  return v
end
L.size_arg = size_arg

local function random_param(shape, fill, a, b)
  local numel = 1
  for _, d in ipairs(shape) do numel = numel * d end
  local seed, offset = R.reserve(numel)
  return param_with(shape, function(t, start) rt.check(fill(t.p, seed, offset + start, a, b)) end)
end
local function normal_param(shape, std) return random_param(shape, rt.C.sh_random_normal_, 0, std) end
local function uniform_param(shape, low, high) return random_param(shape, rt.C.sh_random_uniform_, low, high) end
local function const_param(shape, v)
  return param_with(shape, function(t) t:fill_(v) end)
end
L.normal_param, L.const_param = normal_param, const_param

-- Linear: y = x W^T + b, W [out, in]. opts.bias (default true), opts.std (default 0.02, the
-- GPT-2 init; nil std_uniform gives torch's U(-1/sqrt(in), 1/sqrt(in)) when opts.std == false).
L.Linear = Module:extend("Linear")
function L.Linear:init(n_in, n_out, opts)
  size_arg("Linear", "n_in (argument 1)", n_in); size_arg("Linear", "n_out (argument 2)", n_out)
  opts = opts or {}
  self.n_in, self.n_out = n_in, n_out
  if opts.std == false then
    local bound = 1 / math.sqrt(n_in)
    self:param("weight", uniform_param({ n_out, n_in }, -bound, bound))
  else
    self:param("weight", normal_param({ n_out, n_in }, opts.std or 0.02))
  end
  if opts.bias ~= false then self:param("bias", const_param({ n_out }, 0)) end
end
function L.Linear:forward(x) return F.linear(x, self.weight, self.bias) end
function L.Linear:extra_repr() return ("%d -> %d%s"):format(self.n_in, self.n_out, self.bias and "" or ", no bias") end

L.Embedding = Module:extend("Embedding")
function L.Embedding:init(n, dim, opts)
  size_arg("Embedding", "n (argument 1)", n); size_arg("Embedding", "dim (argument 2)", dim)
  self.n, self.dim = n, dim
  self:param("weight", normal_param({ n, dim }, (opts and opts.std) or 0.02))
end
function L.Embedding:forward(idx) return F.embedding(idx, self.weight) end
function L.Embedding:extra_repr() return ("%d x %d"):format(self.n, self.dim) end

L.LayerNorm = Module:extend("LayerNorm")
function L.LayerNorm:init(dim, opts)
  size_arg("LayerNorm", "dim (argument 1)", dim)
  opts = opts or {}
  self.dim, self.eps = dim, opts.eps or 1e-5
  self:param("weight", const_param({ dim }, 1))
  if opts.bias ~= false then self:param("bias", const_param({ dim }, 0)) end
end
function L.LayerNorm:forward(x) return F.layernorm(x, self.weight, self.bias, self.eps) end
function L.LayerNorm:extra_repr() return tostring(self.dim) end

L.RMSNorm = Module:extend("RMSNorm")
function L.RMSNorm:init(dim, opts)
  size_arg("RMSNorm", "dim (argument 1)", dim)
  self.dim, self.eps = dim, (opts and opts.eps) or 1e-6
  self:param("weight", const_param({ dim }, 1))
end
function L.RMSNorm:forward(x) return F.rmsnorm(x, self.weight, self.eps) end
function L.RMSNorm:extra_repr() return tostring(self.dim) end

L.Dropout = Module:extend("Dropout")
function L.Dropout:init(p)
  if p ~= nil and (type(p) ~= "number" or p < 0 or p >= 1) then
    error("Dropout: p must be a number in [0, 1), got " .. tostring(p), 3)
  end
  self.p = p or 0
end
function L.Dropout:forward(x) return F.dropout(x, self.p, self.training) end
function L.Dropout:extra_repr() return tostring(self.p) end

-- GPT-2's MLP: c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout.
L.MLP = Module:extend("MLP")
function L.MLP:init(dim, opts)
  size_arg("MLP", "dim (argument 1)", dim)
  opts = opts or {}
  local hidden = opts.hidden or 4 * dim
  self:child("c_fc", L.Linear(dim, hidden, { bias = opts.bias }))
  self:child("c_proj", L.Linear(hidden, dim, { bias = opts.bias, std = opts.proj_std }))
  self:child("dropout", L.Dropout(opts.dropout))
end
-- Both projections plain f32 Linear layers (not wrapped as FSDP units, not subclassed,
-- forward not replaced) on an f32 input: one fused op, F.gelu_mlp; else the layers' own
-- forwards. Not in bf16: CUDA's epilogues take gelu of the f32 product and round once, where
-- the composition (PyTorch's autocast, and shard's CPU) rounds pre to bf16 first.
local function plain_linear(m) return getmetatable(m) == L.Linear and rawget(m, "forward") == nil end
local function f32(t) return t == nil or t:dtype() == "f32" end
function L.MLP:forward(x)
  local fc, proj = self.c_fc, self.c_proj
  if plain_linear(fc) and plain_linear(proj) and f32(x) and f32(fc.weight) and f32(proj.weight) then
    return self.dropout(F.gelu_mlp(x, fc.weight, fc.bias, proj.weight, proj.bias))
  end
  return self.dropout(proj(F.gelu(fc(x))))
end

-- Llama's MLP: w2(silu(w1 x) * w3 x).
L.SwiGLU = Module:extend("SwiGLU")
function L.SwiGLU:init(dim, hidden, opts)
  size_arg("SwiGLU", "dim (argument 1)", dim); size_arg("SwiGLU", "hidden (argument 2)", hidden)
  opts = opts or {}
  self:child("w1", L.Linear(dim, hidden, { bias = false }))
  self:child("w3", L.Linear(dim, hidden, { bias = false }))
  self:child("w2", L.Linear(hidden, dim, { bias = false, std = opts.proj_std }))
end
function L.SwiGLU:forward(x)
  return self.w2(F.swiglu(self.w1(x), self.w3(x)))
end

return L
