-- The step-time cost of in-memory snapshots (shard.snapshot) beside a checkpoint to disk at the
-- same interval, the peer way to lose no more than K steps (shard.checkpoint, asynchronous).
--   shard run bench/snapshot.lua [--n_layer=4 --n_embd=128 --steps=40 --every=1 --rounds=3]   (--every=0: "auto")
--   mpirun -np 2 bin/shard run bench/snapshot.lua --strategy=full_shard --snapshot_replicas=1
-- Trains the same GPT with no snapshots, with a snapshot every `every` steps, and with an
-- asynchronous checkpoint save every `every` steps, in alternating rounds (the order reversed
-- each round); prints the median step time of each over the rounds, the snapshot's cost as a
-- share of the plain step, the copy's own CPU time (what it takes from training where the
-- cores are busy) and its share of the plain step, the mean time the optimizer waited for the
-- copy, and the host bytes per rank the snapshot files take (own two slots, plus the buddy's
-- with replicas). --every=0 lets the snapshots pick their interval (train's default under
-- shard launch --max_restarts), which they print.
local shard = require("shard")
local cfg = shard.config({ n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 12, vocab_size = 65,
                           steps = 40, every = 1, rounds = 3, strategy = "none", snapshot_replicas = 0,
                           dir = "/tmp/snapshot_bench" },
                         { steps = { min = 1 }, every = { min = 0 }, rounds = { min = 1 }, snapshot_replicas = { min = 0, max = 1 },
                           strategy = { oneof = { "none", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2" } } })
local env = shard.init{ device = "cpu" }
local timer, snapshot, ck = require("shard.timer"), require("shard.snapshot"), shard.checkpoint
local median = require("shard.stats").median

local trial_gpt = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "lib/gpt_trial.lua")

local function file_bytes(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

-- One trial: mean seconds per step, mean seconds the optimizer waited for the copy, host bytes.
local function trial(mode)
  local model, opt, x = trial_gpt.setup(cfg, env)
  local snaps = mode == "snapshot" and snapshot.new{ model = model, optim = opt, env = env, interval = cfg.every == 0 and "auto" or cfg.every,
                                                      replicas = cfg.snapshot_replicas } or nil
  local dir = cfg.dir .. "/r" .. env.world
  local waited, copies, t0 = 0, {}, nil
  for it = 1, cfg.steps + 2 do
    if it == 3 then env.barrier(); t0 = timer.now() end      -- two warm-up steps
    local loss = model(x, x)
    loss:backward()
    if snaps then
      local w0, busy = timer.now(), snaps.inflight ~= nil
      snaps:before_update()
      if it > 2 then waited = waited + timer.now() - w0 end
      if busy then copies[#copies + 1] = shard.C.sh_snap_last_seconds(snaps.file) end
    end
    opt:step(); opt:zero_grad(true)
    loss:free()
    if snaps then snaps:after_step(it) end
    if mode == "checkpoint" and it % math.max(cfg.every, 1) == 0 then ck.save(dir, { model = model, optim = opt, step = it, async = true, keep = 1 }) end
  end
  if snaps then snaps:before_update() end
  ck.wait()
  env.barrier()
  local total = timer.now() - t0
  local bytes = 0
  if snaps then
    bytes = file_bytes(snaps.path)
    for peer in pairs(snaps.copies) do bytes = bytes + file_bytes(snapshot.path(snaps.job, env.world, peer, "copy")) end
    snaps:close()
  end
  if mode == "checkpoint" and env.rank == 0 then shard.C.sh_ckpt_remove_tree(dir) end
  x:free()
  return total / cfg.steps, waited / cfg.steps, bytes, model:num_params(), #copies > 0 and median(copies) or 0
end

local modes = { "none", "snapshot", "checkpoint" }
local times, waits, copies, bytes, n_params = { none = {}, snapshot = {}, checkpoint = {} }, {}, {}, 0, 0
for round = 1, cfg.rounds do
  for i = 1, #modes do
    local mode = modes[round % 2 == 1 and i or #modes + 1 - i]
    local t, w, b, n, c = trial(mode)
    table.insert(times[mode], t)
    if mode == "snapshot" then waits[#waits + 1], bytes, copies[#copies + 1] = w, b, c end
    n_params = n
  end
end
local base = median(times.none)
if env.rank == 0 then
  print(("GPT %d layers x %d (%.2fM params), %s at world %d, %d steps x %d rounds, every %d step(s)%s"):format(cfg.n_layer, cfg.n_embd,
    n_params / 1e6, cfg.strategy, env.world, cfg.steps, cfg.rounds, cfg.every, cfg.snapshot_replicas > 0 and ", buddy replicas" or ""))
  print(("%-22s %12s %14s"):format("", "ms/step", "vs none"))
  print(("%-22s %12.2f %14s"):format("none", base * 1e3, ""))
  for _, mode in ipairs { "snapshot", "checkpoint" } do
    local m = median(times[mode])
    print(("%-22s %12.2f %+13.1f%%"):format(mode == "snapshot" and "snapshot (memory)" or "checkpoint (disk, async)", m * 1e3, 100 * (m - base) / base))
  end
  print(("snapshot_cost_pct %.2f"):format(100 * (median(times.snapshot) - base) / base))
  print(("checkpoint_cost_pct %.2f"):format(100 * (median(times.checkpoint) - base) / base))
  print(("snapshot_copy_cpu_ms %.2f"):format(median(copies) * 1e3))
  print(("snapshot_copy_cpu_pct_of_step %.2f"):format(100 * median(copies) / base))
  print(("snapshot_wait_ms_per_step %.3f"):format(median(waits) * 1e3))
  print(("snapshot_host_bytes_per_rank %d"):format(bytes))
end
