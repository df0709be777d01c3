-- FSDP at world 1 over NCCL (run under mpirun -np 1 by tests/run_gpu.sh, so CUDA collectives
-- take the NCCL backend): full_shard must follow a plain CUDA model step for step (f32).
local shard = require("shard")
local nn, optim = shard.nn, shard.optim
local env = shard.init{ device = "cuda" }
local CFG = { n_layer = 2, n_head = 4, n_embd = 64, vocab_size = 100, block_size = 32, bias = false }
local function build() shard.manual_seed(3); return nn.GPT(CFG) end
local passed, failed = 0, 0

local plain = build()
local popt = optim.AdamW(plain, { lr = 1e-3 })
local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
local opt = optim.AdamW(model, { lr = 1e-3 })
for step = 1, 3 do
  shard.manual_seed(100 + step)
  local u = shard.rand({ 2, 32 })
  local s = u * CFG.vocab_size
  local x = s:to("i64")
  local a = plain(x, x); a:backward(); popt:step(); popt:zero_grad(true)
  local b = model(x, x); b:backward(); opt:step(); opt:zero_grad(true)
  if math.abs(a:item() - b:item()) <= 1e-5 * math.abs(a:item()) then passed = passed + 1
  else failed = failed + 1; print(("not ok step %d: fsdp %.7f vs plain %.7f"):format(step, b:item(), a:item())) end
end
-- The CUDA tensors' collectives took NCCL, whatever the host side's backend is at world 1.
if env.group:device_backend() == "nccl" then passed = passed + 1
else failed = failed + 1; print("not ok the CUDA collectives took " .. env.group:device_backend() .. ", not nccl") end
print(("mpi_fsdp_nccl (host %s, cuda %s): %d passed, %d failed"):format(env.group:backend(), env.group:device_backend(),
  passed, failed))
if failed > 0 then os.exit(1) end
