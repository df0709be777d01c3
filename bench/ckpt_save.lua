-- The step-time cost of a checkpoint save, synchronous against asynchronous (shard.checkpoint).
--   shard run bench/ckpt_save.lua [--n_layer=6 --n_embd=384 --steps=30 --every=10 --dir=/tmp/ckpt_bench]
--   mpirun -np 2 bin/shard run bench/ckpt_save.lua --strategy=full_shard
-- Trains the same GPT three times: no saves, a synchronous save every `every` steps, an
-- asynchronous one; prints the mean step time, the mean time the save call blocks the step,
-- and the bytes written per save.
local shard = require("shard")
local cfg = shard.config({ n_layer = 6, n_head = 6, n_embd = 384, block_size = 64, batch_size = 8, vocab_size = 65,
                          steps = 30, every = 10, dir = "/tmp/ckpt_bench", strategy = "full_shard" },
                        { steps = { min = 1 }, every = { min = 1 },
                          strategy = { oneof = { "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2" } } })
local env = shard.init{ device = "cpu" }
local timer, ck = require("shard.timer"), shard.checkpoint

local trial_gpt = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "lib/gpt_trial.lua")

local function du(path)
  local p = io.popen("du -sb " .. require("shard.ffi").shell_quote(path) .. " 2>/dev/null")
  local n = tonumber((p:read("*l") or ""):match("^(%d+)")) or 0
  p:close()
  return n
end

local function trial(mode)
  local model, opt, x = trial_gpt.setup(cfg, env)
  local dir = cfg.dir .. "/" .. mode .. "_" .. env.world
  if env.rank == 0 then shard.C.sh_ckpt_remove_tree(dir) end
  env.barrier()
  local steps, save_time, saves = 0, 0, 0
  local t0
  for it = 1, cfg.steps + 2 do
    if it == 3 then env.barrier(); t0 = timer.now() end      -- two warm-up steps
    local loss = model(x, x)
    loss:backward()
    opt:step(); opt:zero_grad(true)
    loss:free()
    if it > 2 then steps = steps + 1 end
    if mode ~= "none" and it > 2 and (it - 2) % cfg.every == 0 then
      local s0 = timer.now()
      ck.save(dir, { model = model, optim = opt, step = it, async = mode == "async", keep = 1 })
      save_time, saves = save_time + (timer.now() - s0), saves + 1
    end
  end
  ck.wait()
  local total = timer.now() - t0
  local bytes = mode ~= "none" and env.rank == 0 and du(dir .. "/step-" .. (cfg.steps + 2)) or 0
  return total / steps, saves > 0 and save_time / saves or 0, bytes, model:num_params()
end

local rows = {}
for _, mode in ipairs { "none", "sync", "async" } do rows[mode] = { trial(mode) } end
if env.rank == 0 then
  print(("GPT %d layers x %d (%.1fM params), %s at world %d, %d steps, a save every %d"):format(cfg.n_layer, cfg.n_embd,
    rows.none[4] / 1e6, cfg.strategy, env.world, cfg.steps, cfg.every))
  print(("%-6s %14s %16s %14s %12s"):format("save", "ms/step", "ms/step vs none", "ms save call", "MB/save"))
  for _, mode in ipairs { "none", "sync", "async" } do
    local r = rows[mode]
    print(("%-6s %14.1f %+16.1f %14.1f %12.1f"):format(mode, r[1] * 1e3, (r[1] - rows.none[1]) * 1e3, r[2] * 1e3, r[3] / 1e6))
  end
end
