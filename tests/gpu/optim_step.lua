-- shard.optim's AdamW step and clip_grad_norm on CUDA against the CPU (make test-gpu; the
-- emulated device in make test): the Lua side hands all of a device's tensors to optim.h's
-- multi-tensor fronts, so a step over N parameters is ceil(N / 16) launches and no host
-- wait, and a clip (plain, and FSDP's at world 1) reads one number back from the device.
-- Launches and waits are the emulator's counters (tests/cuda_emu/emu_counters.cpp); with a
-- real GPU those checks are skipped. Prints "N passed, N failed".
local shard = require("shard")
local ffi = require("ffi")
local nn, optim = shard.nn, shard.optim
local tensor = require("shard.tensor")

local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check, rel = support.check, support.rel

ffi.cdef [[void sh_emu_counters_get(long out[4]); void sh_emu_counters_reset(void);]]
local counting = pcall(function() return ffi.C.sh_emu_counters_get end)
if not counting then print("# not on the emulator: launches and host waits are not counted") end

-- f() under the counters: its results, then {launches, host waits} (nil when not counting)
local function counted(f)
  if counting then ffi.C.sh_emu_counters_reset() end
  local r = f()
  if not counting then return r, nil end
  local c = ffi.new("long[4]")
  ffi.C.sh_emu_counters_get(c)
  return r, { launches = tonumber(c[2]), waits = tonumber(c[3]) }
end

local CFG = { n_layer = 2, n_head = 4, n_embd = 32, vocab_size = 50, block_size = 16, bias = true }
local function build() shard.manual_seed(11); return nn.GPT(CFG) end

local cpu = build()
local env = shard.init{ device = "cuda" }
local gpu = build()
for i, t in ipairs(gpu:parameters()) do t:copy_(cpu:parameters()[i]) end
shard.manual_seed(5)
local ids = (shard.rand({ 2, 17 }, { device = "cpu" }) * CFG.vocab_size):to("i64")
local x, y = ids:narrow(2, 1, 16):contiguous(), ids:narrow(2, 2, 16):contiguous()
cpu(x, y):backward()
-- the same gradients on both sides, so the steps compare the optimizers alone
for i, t in ipairs(gpu:parameters()) do t.grad = cpu:parameters()[i].grad:to(env.device) end

local n = #gpu:parameters()
local oc, og = optim.AdamW(cpu, { lr = 1e-2 }), optim.AdamW(gpu, { lr = 1e-2 })
for step = 1, 2 do
  local want = optim.clip_grad_norm(cpu, 0.5):item()
  local norm, c = counted(function() return optim.clip_grad_norm(gpu, 0.5) end)
  check(not c or c.waits == 0, ("step %d: clip_grad_norm over %d grads waited %d times, expected 0"):format(step, n, c and c.waits or 0))
  local got = norm:item()
  check(math.abs(got - want) <= 1e-12 * want, ("step %d: clip_grad_norm %.17g, cpu %.17g"):format(step, got, want))
  oc:step()
  local _, s = counted(function() og:step() end)
  local groups = math.ceil(n / 16)
  check(not s or (s.launches == groups and s.waits == 0),
    ("step %d: AdamW over %d params: %d launches and %d waits, expected %d and 0"):format(step, n,
      s and s.launches or 0, s and s.waits or 0, groups))
end
local worst = 0
for i, t in ipairs(gpu:parameters()) do worst = math.max(worst, rel(t, cpu:parameters()[i])) end
check(worst <= 1e-6, ("AdamW after 2 steps: parameters equal the cpu's (worst relative error %.3g)"):format(worst))

-- FSDP at world 1: Unit:grad_norm sums every unit's shard on the device, one read
tensor.default_device = env.device
local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block } })
model(x:to(env.device), y:to(env.device)):backward()
local plain = optim.clip_grad_norm(build(), 1.0):item()   -- no grads: 0
local got, c = counted(function() return model:grad_norm(2) end)
tensor.default_device = "cpu"
local ref = build()
ref(x, y):backward()
local want = optim.clip_grad_norm(ref, math.huge):item()
check(plain == 0, "a norm over no gradients is 0")
check(math.abs(got - want) <= 1e-4 * want, ("fsdp grad_norm %.9g, cpu %.9g"):format(got, want))
check(not c or c.waits == 1, ("fsdp grad_norm waited %d times, expected 1"):format(c and c.waits or 0))

support.finish("optim_step")
