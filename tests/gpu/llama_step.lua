-- A whole Llama training step on CUDA against the same step on the CPU (make test-gpu; the
-- emulator runs it too): loss, every gradient (grouped-query rotary attention, RMSNorm,
-- SwiGLU) and the parameters after one AdamW step, in f32; then bf16 mixed precision under
-- FSDP (policy on LlamaBlock) at world 1 against the f32 CPU loss curve, which takes the
-- tensor-core attention kernels with D = 16. Prints "N passed, N failed".
local shard = require("shard")
local nn, optim = shard.nn, shard.optim
local tensor = require("shard.tensor")

local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check, rel = support.check, support.rel

local CFG = { n_layer = 2, n_head = 4, n_kv_head = 2, dim = 64, ffn_dim = 128, vocab_size = 100, max_seq_len = 64 }
local function build() shard.manual_seed(11); return nn.Llama(CFG) end

local cpu = build()
local env = shard.init{ device = "cuda" }
local gpu = build()
for i, t in ipairs(gpu:parameters()) do t:copy_(cpu:parameters()[i]) end

shard.manual_seed(5)
local u = shard.rand({ 4, 65 }, { device = "cpu" })
local s = u * CFG.vocab_size
local ids = s:to("i64")
local x = ids:narrow(2, 1, 64):contiguous()
local y = ids:narrow(2, 2, 64):contiguous()
local xg, yg = x:to(env.device), y:to(env.device)

local lc = cpu(x, y)
lc:backward()
local lg = gpu(xg, yg)
lg:backward()
check(math.abs(lc:item() - lg:item()) <= 1e-5 * math.abs(lc:item()), ("f32 loss: cuda %.7f vs cpu %.7f"):format(lg:item(), lc:item()))
local names = cpu:named_parameters()
for i, t in ipairs(gpu:parameters()) do
  local e = rel(t.grad, cpu:parameters()[i].grad)
  check(e <= 1e-4, ("f32 grad %s: relative error %.3g"):format(names[i].name, e))
end
local oc = optim.AdamW(cpu, { lr = 1e-3 })
local og = optim.AdamW(gpu, { lr = 1e-3 })
oc:step(); og:step()
for i, t in ipairs(gpu:parameters()) do
  local e = rel(t, cpu:parameters()[i])
  check(e <= 1e-5, ("f32 param after AdamW %s: relative error %.3g"):format(names[i].name, e))
end

-- bf16 mixed precision under FSDP (world 1) against the f32 CPU curve
tensor.default_device = "cpu"
local ref = build()
local ref_opt = optim.AdamW(ref, { lr = 1e-3 })
tensor.default_device = env.device
local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.LlamaBlock },
                                       mixed_precision = { param = "bf16", reduce = "f32" } })
local opt = optim.AdamW(model, { lr = 1e-3 })
for step = 1, 3 do
  local a = ref(x, y)
  a:backward()
  local b = model(xg, yg)
  b:backward()
  check(math.abs(a:item() - b:item()) <= 2e-2 * math.abs(a:item()),
    ("bf16 FSDP step %d: loss %.5f vs f32 cpu %.5f"):format(step, b:item(), a:item()))
  ref_opt:step(); ref_opt:zero_grad(true)
  opt:step(); opt:zero_grad(true)
end

support.finish("llama_step")
