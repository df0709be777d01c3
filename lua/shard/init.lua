-- shard: require("shard") gives the runtime's Lua front-end.
local tensor = require("shard.tensor")
local rt = require("shard.ffi")

local shard = {
  version = "0.1.0",
  C = rt.C,
  Tensor = tensor.Tensor,
  tensor = tensor.tensor,
  empty = tensor.empty, zeros = tensor.zeros, ones = tensor.ones, full = tensor.full,
  is_tensor = tensor.is_tensor,
}

-- Differentiable versions replace the raw tensor methods (after shard.ops defines those).
local ops = require("shard.ops")
shard.randn, shard.rand, shard.arange = ops.randn, ops.rand, ops.arange
shard.normal_, shard.uniform_ = ops.normal_, ops.uniform_
local autograd = require("shard.autograd")
shard.F = require("shard.functional")
shard.autograd = autograd
shard.no_grad = autograd.no_grad
shard.scope = autograd.scope
shard.random = require("shard.random")
shard.manual_seed = shard.random.manual_seed
-- shard.set_deterministic(on): kernels that would sum in an order the device's schedule picks
-- (today the CUDA attention backward's atomic dq) take their run-to-run reproducible form
-- instead; returns the previous setting. Process-wide, off by default (runtime/core/determinism.h).
function shard.set_deterministic(on) return rt.C.sh_set_deterministic(on and 1 or 0) ~= 0 end
function shard.deterministic() return rt.C.sh_deterministic() ~= 0 end
shard.log = require("shard.log")
function shard.save(model, path, metadata) return require("shard.io.state_dict").save(model, path, metadata) end
-- A directory opens for reading on Linux and only fails on the first read; say so here
-- rather than let the reader meet a nil.
local function is_directory(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local _, err, code = f:read(0)
  f:close()
  return code == 21 or (err ~= nil and err:match("[Ii]s a directory") ~= nil)
end
function shard.load(model, path, opts)
  if type(path) ~= "string" then error("shard.load: path must be a string, got " .. type(path), 2) end
  if is_directory(path) then
    error(("shard.load: %s is a directory; give the checkpoint file (a .safetensors file)"):format(path), 2)
  end
  return require("shard.io.state_dict").load(model, path, opts)
end
-- An nn.GPT or nn.Llama as a Hugging Face directory (model.safetensors + config.json) that
-- transformers loads as GPT2LMHeadModel or LlamaForCausalLM; under FSDP every rank calls it.
-- See shard.io.hf.
function shard.export_hf(model, dir) return require("shard.io.hf").export(model, dir) end

-- SHARD_MEMORY_LIMIT (a recipe's --memory_limit, for every process) holds from the moment
-- shard loads: for scripts that never call shard.init and for the REPL too.
local function env_memory_limit()
  local limit = os.getenv("SHARD_MEMORY_LIMIT")
  if limit and limit ~= "" then require("shard.config").apply_memory_limit(limit, "SHARD_MEMORY_LIMIT") end
end
env_memory_limit()

-- The process's place in the job, from mpirun / torchrun-style env / SLURM (else a world of
-- one): rank, world, local_rank, the device, the world group, and helpers recipes need.
-- opts.device: "auto" (default: cuda:<local rank> when a GPU is present, else the CPU),
-- "cpu" or "cuda". New tensors go to that device unless told otherwise.
function shard.init(opts)
  opts = opts or {}
  local comm = require("shard.comm")
  local group = comm.init()
  local env = { rank = group:rank(), world = group:size(), local_rank = group:local_rank(), group = group }
  local want = opts.device or "auto"
  local gpus = rt.cuda_device_count()
  if want == "cuda" and gpus == 0 then
    error("shard.init: device cuda asked for, but " .. (pcall(function() return rt.C.sh_cuda_init end)
      and "no CUDA device is visible" or "shard was built without CUDA"), 2)
  end
  if want == "cuda" or (want == "auto" and gpus > 0) then
    local dev = env.local_rank % math.max(gpus, 1)
    rt.check(rt.C.sh_cuda_init(dev))
    env.device = "cuda:" .. dev
  elseif want == "cpu" or want == "auto" then
    env.device = "cpu"
  elseif want == "meta" then    -- a dry run (shard estimate --dry-run): shapes and memory, no data
    env.device = "meta"
  else
    error("shard.init: device must be auto, cpu, cuda or meta, got " .. tostring(want), 2)
  end
  tensor.default_device = env.device
  env_memory_limit()   -- again, for the device just chosen
  function env.barrier() group:barrier() end
  function env.all_reduce_mean(v)
    local t = tensor.tensor({ v }, { dtype = "f64" })
    group:all_reduce(t, "avg")
    local r = t:get({ 1 })
    t:free()
    return r
  end
  -- True on every rank when flag is true on every rank: a loop over uneven data ends
  -- together (`while env.all_true(batch ~= nil) do ... end`) instead of hanging in a collective.
  function env.all_true(flag)
    local t = tensor.tensor({ flag and 1 or 0 }, { dtype = "f64" })
    group:all_reduce(t, "min")
    local r = t:get({ 1 }) == 1
    t:free()
    return r
  end
  shard.log.rank = env.rank
  shard.env = env
  return env
end

-- Modules load on first use, so `require("shard")` stays cheap.
local lazy = { memory = "shard.memory", config = "shard.config",
               nn = "shard.nn", optim = "shard.optim", data = "shard.data",
               comm = "shard.comm", flatparam = "shard.flatparam", fsdp = "shard.fsdp",
               safetensors = "shard.io.safetensors", profile = "shard.profile", checkpoint = "shard.checkpoint",
               train = "shard.train", peak = "shard.peak", straggler = "shard.straggler", amp = "shard.amp",
               trace = "shard.trace", cuda_graph = "shard.cuda_graph" }
setmetatable(shard, { __index = function(t, k)
  local mod = lazy[k]
  if mod then local v = require(mod); rawset(t, k, v); return v end
end })

return shard
