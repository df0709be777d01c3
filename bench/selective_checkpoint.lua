-- bench/selective_checkpoint.lua: activation memory and time of a forward + backward of a
-- GPT on the CPU without checkpointing, with full checkpointing of every block, and with
-- selective checkpointing keeping the outputs of linear and/or attention (the rest
-- recomputed). Per mode: the activations held between forward and backward, the step's
-- memory peak, and the median time of a forward + backward, wall and process CPU time (the
-- CPU time is what to compare on a shared machine; recompute = CPU time - none's).
--   OMP_NUM_THREADS=1 shard run bench/selective_checkpoint.lua [--n_layer=6 --n_embd=256 --block_size=256 --batch_size=8 --iters=5]
local shard = require("shard")
local timer = require("shard.timer")
local nn, memory = shard.nn, shard.memory
local cfg = shard.config{ n_layer = 6, n_head = 4, n_embd = 256, block_size = 256, batch_size = 8, vocab_size = 65,
                          iters = 5, seed = 1337 }
local MODES = {
  { "none" }, { "full" }, { "keep linear+attention", { "linear", "attention" } },
  { "keep linear", { "linear" } }, { "keep attention", { "attention" } },
}

local function batch()
  local u = shard.rand({ cfg.batch_size, cfg.block_size }); local s = u * cfg.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  return x
end

local function measure(name, keep)
  shard.manual_seed(cfg.seed)
  local m = nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.block_size,
                    vocab_size = cfg.vocab_size, bias = false, dropout = 0 }
  if name ~= "none" then nn.Module.checkpoint(m, { nn.Block }, keep and { keep = keep } or nil) end
  local times, cpu, held, peak = {}, {}, 0, 0
  for i = 0, cfg.iters do                       -- i = 0 warms up
    local x = batch()
    collectgarbage(); collectgarbage("stop")
    local before = memory.stats().allocated
    memory.reset_peak()
    local t0, c0 = timer.now(), os.clock()
    local loss = m(x, x)
    held = memory.stats().allocated - before
    loss:backward()
    local t, c = timer.now() - t0, os.clock() - c0
    peak = memory.stats().peak - before
    collectgarbage("restart")
    if i > 0 then times[#times + 1] = t; cpu[#cpu + 1] = c end
    loss:free(); x:free()
    m:zero_grad(true)
  end
  table.sort(times); table.sort(cpu)
  local mid = math.ceil(#times / 2)
  return held, peak, times[mid], cpu[mid]
end

print(("GPT n_layer %d n_embd %d block %d batch %d, forward + backward on the CPU, median of %d"):format(
  cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.batch_size, cfg.iters))
print(("%-24s %10s %10s %10s %10s %14s"):format("mode", "held MiB", "peak MiB", "wall ms", "CPU ms", "recompute ms"))
local base
for _, mode in ipairs(MODES) do
  local held, peak, t, c = measure(mode[1], mode[2])
  base = base or c
  print(("%-24s %10.2f %10.2f %10.1f %10.1f %14.1f"):format(mode[1], held / 2 ^ 20, peak / 2 ^ 20, t * 1e3, c * 1e3, (c - base) * 1e3))
end
