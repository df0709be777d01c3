-- The step-time cost of in-memory snapshots (shard.snapshot) beside a checkpoint to disk at the
-- same interval, the peer way to lose no more than K steps (shard.checkpoint, asynchronous).
--   shard run bench/snapshot.lua [--n_layer=4 --n_embd=128 --steps=40 --every=1 --rounds=5]   (--every=0: "auto")
--   mpirun -np 2 bin/shard run bench/snapshot.lua --strategy=full_shard --snapshot_replicas=1
-- Trains the same GPT with no snapshots ("off"), with a snapshot every `every` steps ("on"),
-- and with an asynchronous checkpoint save every `every` steps, in alternating rounds (the
-- order reversed each round). Prints, per mode, the wall ms per step (median over the rounds
-- [min-max]) and the process's CPU ms per step (every thread: the copy thread's too); the cost
-- against off: the median of the rounds' paired ratios [min-max], in wall and in CPU time;
-- what the step waits on: the main thread's time per step in the snapshot's calls
-- (after_step: collect the state's views, describe them, start the copy thread;
-- before_update: the wait for the copy) and the copy thread's own CPU time per snapshot
-- (copy + CRC32C into /dev/shm); and the host bytes per rank the snapshot files take (own two
-- slots, plus the buddy's with replicas). --every=0 lets the snapshots measure their cost and
-- pick their interval (train's default under shard launch --max_restarts), which they print.
-- Then the finest interleaving, in one run: --pairs pairs of consecutive steps, the first of
-- each with a snapshot in flight (taken at its start) and the second without, each step timed
-- from one step boundary to the next (wall and process CPU): the cost of a snapshot every step
-- is the median of the pairs' differences over the median step without [quartiles], so that a
-- load that comes and goes on a shared machine hits both halves of a pair alike.
local ffi = require("ffi")
local shard = require("shard")
local cfg = shard.config({ n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch_size = 12, vocab_size = 65,
                           steps = 40, every = 1, rounds = 5, pairs = 30, strategy = "none", snapshot_replicas = 0,
                           dir = "/tmp/snapshot_bench" },
                         { steps = { min = 1 }, every = { min = 0 }, rounds = { min = 1 }, pairs = { min = 0 }, snapshot_replicas = { min = 0, max = 1 },
                           strategy = { oneof = { "none", "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2" } } })
local env = shard.init{ device = "cpu" }
local timer, snapshot, ck = require("shard.timer"), require("shard.snapshot"), shard.checkpoint
local stats = require("shard.stats")
local median = stats.median

local trial_gpt = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "lib/gpt_trial.lua")

local ts = ffi.new("struct sh_timespec")
local function cpu_now() ffi.C.clock_gettime(2, ts); return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9 end   -- CLOCK_PROCESS_CPUTIME_ID

local function file_bytes(path)
  local f = io.open(path, "rb")
  if not f then return 0 end
  local n = f:seek("end")
  f:close()
  return n
end

-- Runs f, adding its wall seconds to acc[key]; reads a copy the call settled into acc.copies.
local function timed(snaps, acc, key, f)
  local was, t0 = snaps.inflight, timer.now()
  f()
  acc[key] = acc[key] + timer.now() - t0
  if was and snaps.inflight ~= was then acc.copies[#acc.copies + 1] = tonumber(shard.C.sh_snap_last_seconds(snaps.file)) end
end

-- One trial: seconds per step (wall, process CPU), the main thread's seconds per step in
-- after_step and before_update, the copy thread's CPU seconds per snapshot, host bytes.
local function trial(mode)
  local model, opt, x = trial_gpt.setup(cfg, env)
  local snaps = mode == "on" and snapshot.new{ model = model, optim = opt, env = env, interval = cfg.every == 0 and "auto" or cfg.every,
                                               replicas = cfg.snapshot_replicas } or nil
  local dir = cfg.dir .. "/r" .. env.world
  local acc, t0, c0 = { after = 0, before = 0, copies = {} }, nil, nil
  for it = 1, cfg.steps + 2 do
    if it == 3 then env.barrier(); t0, c0, acc.after, acc.before, acc.copies = timer.now(), cpu_now(), 0, 0, {} end   -- two warm-up steps
    local loss = model(x, x)
    loss:backward()
    if snaps then timed(snaps, acc, "before", function() snaps:before_update() end) end
    opt:step(); opt:zero_grad(true)
    loss:free()
    if snaps then timed(snaps, acc, "after", function() snaps:after_step(it) end) end
    if mode == "checkpoint" and it % math.max(cfg.every, 1) == 0 then ck.save(dir, { model = model, optim = opt, step = it, async = true, keep = 1 }) end
  end
  if snaps then snaps:before_update() end
  ck.wait()
  env.barrier()
  local wall, cpu = timer.now() - t0, cpu_now() - c0
  local bytes = 0
  if snaps then
    bytes = file_bytes(snaps.path)
    for peer in pairs(snaps.copies) do bytes = bytes + file_bytes(snapshot.path(snaps.job, env.world, peer, "copy")) end
    snaps:close()
  end
  if mode == "checkpoint" and env.rank == 0 then shard.C.sh_ckpt_remove_tree(dir) end
  x:free()
  return { wall = wall / cfg.steps, cpu = cpu / cfg.steps, after = acc.after / cfg.steps, before = acc.before / cfg.steps,
           copy = #acc.copies > 0 and median(acc.copies) or 0, bytes = bytes, n_params = model:num_params() }
end

-- Pairs of steps, on then off (a snapshot every 2 steps): the wall and CPU seconds of each.
local function paired_steps()
  local model, opt, x = trial_gpt.setup(cfg, env)
  local snaps = snapshot.new{ model = model, optim = opt, env = env, interval = 2, replicas = cfg.snapshot_replicas }
  local on, off, last = { wall = {}, cpu = {} }, { wall = {}, cpu = {} }, nil
  for it = 1, 2 * cfg.pairs + 3 do   -- two warm-up steps
    local loss = model(x, x)
    loss:backward()
    snaps:before_update()
    opt:step(); opt:zero_grad(true)
    loss:free()
    local t, c = timer.now(), cpu_now()
    if last and it > 3 then   -- the step just done began at after_step(it - 1): on when that took a snapshot
      local into = (it - 1) % 2 == 0 and on or off
      table.insert(into.wall, t - last.t); table.insert(into.cpu, c - last.c)
    end
    last = { t = t, c = c }
    snaps:after_step(it)
  end
  snaps:close()
  x:free()
  return on, off
end

local modes = { "off", "on", "checkpoint" }
local runs = { off = {}, on = {}, checkpoint = {} }
for round = 1, cfg.rounds do
  for i = 1, #modes do
    local mode = modes[round % 2 == 1 and i or #modes + 1 - i]
    table.insert(runs[mode], trial(mode))
  end
end

local function field(list, k) local out = {}; for i, r in ipairs(list) do out[i] = r[k] end; return out end
local function spread(xs, scale, fmt)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(xs) do lo, hi = math.min(lo, v), math.max(hi, v) end
  return (fmt .. " [" .. fmt .. " to " .. fmt .. "]"):format(median(xs) * scale, lo * scale, hi * scale)
end
-- each round's mode against the same round's off, as a share
local function paired(mode, k)
  local out = {}
  for i, r in ipairs(runs[mode]) do out[i] = r[k] / runs.off[i][k] - 1 end
  return out
end

local pairs_on, pairs_off = paired_steps()

-- the pairs' differences over the median step without: median [lower to upper quartile]
local function pair_cost(k)
  local d = {}
  for i = 1, math.min(#pairs_on[k], #pairs_off[k]) do d[i] = pairs_on[k][i] - pairs_off[k][i] end
  table.sort(d)
  local base = median(pairs_off[k])
  local q = function(f) return d[math.max(1, math.floor(f * #d + 0.5))] / base end
  return median(d) / base, q(0.25), q(0.75)
end

if env.rank == 0 then
  local on = runs.on
  print(("GPT %d layers x %d (%.2fM params), %s at world %d, %d steps x %d rounds, every %s%s"):format(cfg.n_layer, cfg.n_embd,
    on[1].n_params / 1e6, cfg.strategy, env.world, cfg.steps, cfg.rounds, cfg.every == 0 and "K steps (auto)" or cfg.every .. " step(s)",
    cfg.snapshot_replicas > 0 and ", buddy replicas" or ""))
  print(("%-26s %-30s %-30s %-24s %s"):format("", "wall ms/step", "CPU ms/step", "wall vs off", "CPU vs off"))
  for _, mode in ipairs(modes) do
    local name = ({ off = "snapshot off", on = "snapshot on (memory)", checkpoint = "checkpoint (disk, async)" })[mode]
    print(("%-26s %-30s %-30s %-24s %s"):format(name, spread(field(runs[mode], "wall"), 1e3, "%.2f"), spread(field(runs[mode], "cpu"), 1e3, "%.2f"),
      mode == "off" and "" or spread(paired(mode, "wall"), 100, "%+.1f%%"), mode == "off" and "" or spread(paired(mode, "cpu"), 100, "%+.1f%%")))
  end
  local base = median(field(runs.off, "wall"))
  if cfg.pairs > 0 then
    local w, w1, w3 = pair_cost("wall")
    local c, c1, c3 = pair_cost("cpu")
    print(("%d pairs of steps in one run, the first with a snapshot in flight, the second without:"):format(#pairs_off.wall))
    print(("  wall %.2f ms with, %.2f ms without: %+.1f%% [%+.1f%% to %+.1f%%]; CPU %.2f / %.2f ms: %+.1f%% [%+.1f%% to %+.1f%%]"):format(
      median(pairs_on.wall) * 1e3, median(pairs_off.wall) * 1e3, 100 * w, 100 * w1, 100 * w3,
      median(pairs_on.cpu) * 1e3, median(pairs_off.cpu) * 1e3, 100 * c, 100 * c1, 100 * c3))
    print(("snapshot_cost_pct %.2f"):format(100 * w))
    print(("snapshot_cpu_cost_pct %.2f"):format(100 * c))
  end
  print(("snapshot_rounds_cost_pct %.2f"):format(100 * median(paired("on", "wall"))))
  print(("snapshot_rounds_cpu_cost_pct %.2f"):format(100 * median(paired("on", "cpu"))))
  print(("checkpoint_cost_pct %.2f"):format(100 * median(paired("checkpoint", "wall"))))
  print(("snapshot_main_thread_after_step_ms %.3f"):format(median(field(on, "after")) * 1e3))
  print(("snapshot_main_thread_wait_ms %.3f"):format(median(field(on, "before")) * 1e3))
  print(("snapshot_main_thread_pct_of_step %.2f"):format(100 * (median(field(on, "after")) + median(field(on, "before"))) / base))
  print(("snapshot_copy_thread_cpu_ms %.2f"):format(median(field(on, "copy")) * 1e3))
  print(("snapshot_copy_thread_cpu_pct_of_step %.2f"):format(100 * median(field(on, "copy")) / base))
  print(("snapshot_host_bytes_per_rank %d"):format(on[1].bytes))
end
