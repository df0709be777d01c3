-- In-memory snapshots of CUDA training state (shard.snapshot; make test runs it on the emulated
-- device): snapshots taken every step through step 3, restored into a fresh model and
-- optimizer, continue bit for bit as the uninterrupted run does through step 5: a plain model,
-- FSDP full_shard and FSDP with bf16 mixed precision (f32 master shards), at world 1. The
-- snapshot's copies of the device state are the host copies shard.checkpoint takes.
-- Prints "N passed, N failed".
local shard = require("shard")
local nn, fsdp = shard.nn, shard.fsdp
local snapshot = require("shard.snapshot")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")  -- tests/gpu/support.lua
local check = support.check

local env = shard.init{ device = "cuda" }
local CFG = { n_layer = 2, n_head = 4, n_embd = 32, vocab_size = 50, block_size = 16, bias = true }

local function build(mode)
  local make = function() shard.manual_seed(11); return nn.GPT(CFG) end
  if mode == "plain" then return make() end
  return fsdp.wrap(make, { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                           mixed_precision = mode == "bf16" and { param = "bf16" } or nil })
end

-- Steps from + 1 .. to on each step's own batch; snaps, when given, as train.lua drives it.
local function train(model, opt, from, to, snaps)
  for s = from + 1, to do
    local x, y = support.rank_batch(s, env.device, 0, 1, 2, CFG.block_size, CFG.vocab_size)
    local loss = model(x, y)
    loss:backward()
    if snaps then snaps:before_update() end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free(); y:free()
    if snaps then snaps:after_step(s) end
  end
end

local function values(model)
  local out = {}
  for name, t in pairs(fsdp.gather_full(model)) do out[name] = t:tolist_flat(); t:free() end
  return out
end

for _, mode in ipairs { "plain", "full_shard", "bf16" } do
  local a = build(mode)
  local oa = shard.optim.AdamW(a, { lr = 1e-2 })
  local snaps = snapshot.new{ model = a, optim = oa, env = env, interval = 1 }
  train(a, oa, 0, 3, snaps)
  snaps:before_update()                       -- the copy of step 3 done; its files stay
  train(a, oa, 3, 5)
  local want = values(a)
  local b = build(mode)
  local ob = shard.optim.AdamW(b, { lr = 1e-2 })
  local step, how = snapshot.restore{ model = b, optim = ob, env = env }
  check(step == 3 and how.source == "memory", ("%s: restored step %d from %s, expected step 3 from memory"):format(mode, step, how.source))
  train(b, ob, 3, 5)
  local got, bad = values(b), 0
  for name, w in pairs(want) do
    for i = 1, #w do if got[name][i] ~= w[i] then bad = bad + 1 end end
  end
  check(bad == 0, ("%s: %d parameter values differ from the uninterrupted run after the restore"):format(mode, bad))
  snaps:close()
end
support.finish("snapshot_restore")
