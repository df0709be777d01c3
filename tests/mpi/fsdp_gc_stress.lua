-- FSDP with a Lua GC that never rests, against the same run with the GC as usual. With a
-- pause of 0 every allocation Lua makes runs a collection step, so finalizers run wherever
-- Lua allocates: between issuing a collective and waiting for it, inside the schedule's
-- hooks, around every t.grad. The GC only decides when host structs go, never a value, so
-- losses, gradient norms and final parameters must be the same bit for bit; a handle whose
-- only reference was dropped while its pointer is still in use would show up here.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false }

local function train(strategy)
  local model = shard.fsdp.wrap(function() shard.manual_seed(2); return nn.GPT(CFG) end,
    { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = strategy })
  local opt = shard.optim.AdamW(model, { lr = 1e-2 })
  local out = {}
  for step = 1, 3 do
    shard.manual_seed(70 + step)
    local u = shard.rand({ 2 * env.world, 8 }); local s = u * 16; local ids = s:to("i64")
    local x = ids:narrow(1, 2 * env.rank + 1, 2):contiguous()
    local loss = model(x, x)
    out[#out + 1] = loss:item()
    loss:backward()
    out[#out + 1] = model:clip_grad_norm(1.0):item()
    opt:step()
    opt:zero_grad(true)
    u:free(); s:free(); ids:free(); x:free(); loss:free()
  end
  for _, e in ipairs(model:optim_groups()) do
    for _, v in ipairs(e.tensor:tolist_flat()) do out[#out + 1] = v end
    e.tensor:free()
  end
  return out
end

-- A plain model too: its parameters' t.grad views are read and dropped every step.
local function train_plain()
  shard.manual_seed(2)
  local model = nn.GPT(CFG)
  local opt = shard.optim.AdamW(model, { lr = 1e-2 })
  local out = {}
  for step = 1, 3 do
    shard.manual_seed(70 + step)
    local x = (shard.rand({ 2, 8 }) * 16):to("i64")
    local loss = model(x, x)
    out[#out + 1] = loss:item()
    loss:backward()
    for _, t in ipairs(model:parameters()) do out[#out + 1] = t.grad:sumsq() end
    opt:step()
    opt:zero_grad(true)
    x:free(); loss:free()
  end
  return out
end

-- run() with the GC as usual, then under stress: a pause of 0, and a full collection (which
-- runs the finalizers of whatever became garbage) every HOOK_EVERY VM instructions, the JIT
-- off so that the hook sees them all. Every value must be the same.
local HOOK_EVERY = tonumber(os.getenv("SHARD_GC_HOOK_EVERY") or "") or 200
local failures = 0
local function compare(name, run)
  local calm = run()
  local pause = collectgarbage("setpause", 0)
  local stepmul = collectgarbage("setstepmul", 1000)
  jit.off(); jit.flush()                                     -- so the hook sees every instruction
  debug.sethook(function() collectgarbage() end, "", HOOK_EVERY)
  local ok, stressed = pcall(run)
  debug.sethook()
  jit.on()
  collectgarbage("setpause", pause)
  collectgarbage("setstepmul", stepmul)
  if not ok then error(("rank %d %s under GC stress: %s"):format(env.rank, name, tostring(stressed)), 0) end
  for i = 1, math.max(#calm, #stressed) do
    if calm[i] ~= stressed[i] then
      failures = failures + 1
      io.stderr:write(("rank %d %s: value %d is %.17g with the GC as usual, %s under GC stress\n"):format(
        env.rank, name, i, calm[i] or 0 / 0, tostring(stressed[i])))
      return
    end
  end
end

local strategies = { "full_shard", "shard_grad_op", "no_shard" }
if env.world == 4 then strategies[#strategies + 1] = "hybrid_shard" end
for _, strategy in ipairs(strategies) do compare(strategy, function() return train(strategy) end) end
compare("plain", train_plain)
if failures > 0 then os.exit(1) end
if env.rank == 0 then print(("fsdp under GC stress at world %d: same values"):format(env.world)) end
