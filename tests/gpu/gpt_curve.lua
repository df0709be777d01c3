-- 20 AdamW training steps of a small GPT on CUDA against the same 20 on the CPU (make test-gpu,
-- make test-cuda-emu): the f32 loss curve within F32_TOL relative at every step; bf16 mixed
-- precision under fsdp.wrap (world 1) within BF16_TOL of the f32 CPU curve. And the steady
-- state of each CUDA run: from step 2 on a step calls no cudaMalloc (the emulator's counter;
-- skipped on a real GPU), the bytes reserved do not grow and the step's peak (reset at each
-- step's start) is the same every step. Prints "N passed, N failed".
local ffi = require("ffi")
local shard = require("shard")
local nn, optim, memory, fsdp = shard.nn, shard.optim, shard.memory, shard.fsdp

local STEPS = 20
local F32_TOL = 1e-4
-- Measured under the emulator: at most 2.2e-4 over the 20 steps, with no growth along the
-- curve. 2e-3 is about ten times that and half bf16's 2^-8 spacing, yet well below what one
-- AdamW update does to the curve here (one step skipped: 4e-3 to 4e-2 relative afterwards).
local BF16_TOL = 2e-3

local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check = support.check

-- The emulator's cudaMalloc counter (tests/cuda_emu/emu_counters_lua.cpp): bin/shard-emu has
-- it, bin/shard on a real GPU does not.
ffi.cdef "long shard_emu_malloc_count(void);"
local has_counter = pcall(function() return ffi.C.shard_emu_malloc_count end)
local function mallocs() return has_counter and tonumber(ffi.C.shard_emu_malloc_count()) or 0 end
if not has_counter then print("# no emulator (shard_emu_malloc_count absent): cudaMalloc counts not checked") end

local CFG = { n_layer = 2, n_head = 4, n_embd = 64, vocab_size = 100, block_size = 64, bias = true }
local B, T = 4, 16
local function build() shard.manual_seed(11); return nn.GPT(CFG) end

-- A few fixed batches on the CPU, cycled: the model memorises them, so the loss falls.
shard.manual_seed(5)
local batches = {}
for i = 1, 4 do
  local u = shard.rand({ B, T + 1 }, { device = "cpu" })
  local s = u * CFG.vocab_size
  local ids = s:to("i64")
  batches[i] = { x = ids:narrow(2, 1, T):contiguous(), y = ids:narrow(2, 2, T):contiguous() }
  u:free(); s:free(); ids:free()
end

-- Trains STEPS steps as a training loop does (batch to the device, forward, backward,
-- clipping, AdamW, zero_grad, everything of the step freed); returns the losses and, per
-- step, the device's reserved bytes and peak after it and the cudaMalloc calls during it.
-- The Lua GC is stopped meanwhile (after collecting what earlier runs left): a tensor of
-- the step that only a finalizer would free shows as growth every step, not at the GC's whim.
local function train(model, device)
  local opt = optim.AdamW(model, { lr = 1e-3, weight_decay = 0.1 })
  local losses, mem = {}, {}
  collectgarbage()
  collectgarbage("stop")
  for step = 1, STEPS do
    local calls = mallocs()
    memory.reset_peak(device)
    local b = batches[(step - 1) % #batches + 1]
    local x, y = b.x:to(device), b.y:to(device)
    local loss = model(x, y)
    loss:backward()
    fsdp.clip_grad_norm(model, 1.0)
    opt:step()
    opt:zero_grad(true)
    losses[step] = loss:item()
    loss:free(); x:free(); y:free()
    local s = memory.stats(device)
    mem[step] = { reserved = s.reserved, peak = s.peak, mallocs = mallocs() - calls }
  end
  collectgarbage("restart")
  return losses, mem
end

local function follows(what, losses, ref, tol)
  local worst = 0
  for step = 1, STEPS do
    local e = math.abs(losses[step] - ref[step]) / math.abs(ref[step])
    worst = math.max(worst, e)
    check(e <= tol, ("%s step %2d: loss %.7f vs f32 cpu %.7f (relative %.2g, tolerance %.0g)"):format(
      what, step, losses[step], ref[step], e, tol))
  end
  print(("# %s: %d steps, largest relative loss error %.2g (tolerance %.0g)"):format(what, STEPS, worst, tol))
end

local function steady(what, mem)
  for step = 2, STEPS do
    local m = mem[step]
    if has_counter then
      check(m.mallocs == 0, ("%s step %d: %d cudaMalloc calls (step 1: %d)"):format(what, step, m.mallocs, mem[1].mallocs))
    end
    check(m.reserved == mem[1].reserved, ("%s step %d: reserved %d bytes, %+d since step 1"):format(
      what, step, m.reserved, m.reserved - mem[1].reserved))
    check(m.peak == mem[2].peak, ("%s step %d: peak %d bytes, %+d against step 2"):format(
      what, step, m.peak, m.peak - mem[2].peak))
  end
  print(("# %s: reserved %s after step 1, peak %s per step from step 2, %s"):format(what,
    memory.format_bytes(mem[1].reserved), memory.format_bytes(mem[2].peak),
    has_counter and ("%d cudaMalloc calls in step 1"):format(mem[1].mallocs) or "cudaMalloc calls not counted"))
end

local cpu = build()                      -- before shard.init: on the CPU
local env = shard.init{ device = "cuda" }
local gpu = build()
for i, t in ipairs(gpu:parameters()) do t:copy_(cpu:parameters()[i]) end

local cpu_losses = train(cpu, "cpu")
check(cpu_losses[STEPS] < cpu_losses[1] - 0.5, ("the f32 cpu loss falls: %.4f -> %.4f"):format(cpu_losses[1], cpu_losses[STEPS]))

-- f32 on CUDA from the CPU model's initial parameters
local losses, mem = train(gpu, env.device)
follows("f32 cuda", losses, cpu_losses, F32_TOL)
steady("f32 cuda", mem)

-- bf16 mixed precision under FSDP at world 1, built in place (deferred init)
local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block },
                                 mixed_precision = { param = "bf16", reduce = "f32" } })
losses, mem = train(model, env.device)
follows("bf16 fsdp", losses, cpu_losses, BF16_TOL)
steady("bf16 fsdp", mem)

support.finish("gpt_curve")
