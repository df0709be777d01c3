-- In-memory snapshots (shard.snapshot) and restarts (shard launch --max_restarts) on the CPU,
-- the recipe's model in a small configuration. A rank killed with SIGKILL at a random step
-- under shard launch: the job finishes, its final parameters and optimizer state (the last
-- checkpoint's rank files, byte for byte) equal an uninterrupted run's at the same world size,
-- and at most K steps are recomputed. Planted faults, each from a run killed at a random step:
-- a flipped byte in the newest slot (the older slot is restored), a truncated file (the disk
-- checkpoint), a kill in the middle of a copy (the other slot), a rank's own file gone (its
-- buddy's copy); each is named as skipped and the run still ends bitwise equal.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local job = require("shard.tools.job")
local timer = require("shard.timer")
local ffi = require("ffi")
local rt = require("shard.ffi")
local C = rt.C
local quote = support.quote

local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
local RECIPE = support.ROOT .. "/recipes/gpt_shakespeare_char.lua"
local ITERS = 10
local ARGS = ("--data=/usr/share/common-licenses/GPL-3 --n_layer=2 --n_embd=64 --n_head=2 --block_size=32 --batch_size=6 --max_iters=%d --eval_interval=1000 "
  .. "--eval_iters=1 --sample_tokens=0 --log_interval=1 --save_interval=5"):format(ITERS)

local SNAP_DIR = support.run("mktemp -d /dev/shm/snapspec.XXXXXX"):match("(%S+)")
local function tmpdir() return (support.run("mktemp -d"):match("(%S+)")) end
local function env_vars(t)
  local parts = { "env", "SHARD_SNAPSHOT_DIR=" .. quote(SNAP_DIR) }
  for k, v in pairs(t or {}) do parts[#parts + 1] = k .. "=" .. quote(tostring(v)) end
  return table.concat(parts, " ")
end

-- The final checkpoint's rank files of two runs are the same bytes.
local function assert_same_final(ref, out, world, what)
  for r = 0, world - 1 do
    local f = ("/ckpt/step-%d/rank-%05d-of-%05d.safetensors"):format(ITERS, r, world)
    local _, code = support.run(("cmp -s %s %s"):format(quote(ref .. f), quote(out .. f)))
    assert(code == 0, ("%s: rank %d's final parameters and optimizer state differ from an uninterrupted run's"):format(what, r))
  end
end

-- An uninterrupted run at each world size, once.
local refs = {}
local function reference(world)
  if refs[world] then return refs[world] end
  local dir = tmpdir()
  local cmd = world == 1 and ("%s run %s %s --out_dir=%s"):format(quote(support.BIN), quote(RECIPE), ARGS, dir)
    or ("%s launch --nproc %d %s %s --strategy=full_shard --out_dir=%s"):format(quote(support.BIN), world, quote(RECIPE), ARGS, dir)
  local out, code = support.run(env_vars() .. " " .. cmd)
  assert(code == 0, out)
  refs[world] = dir
  return dir
end

-- Reads job j's lines until rank 0 has printed step `step`'s progress line.
local function read_until(j, step)
  local seen, deadline = "", timer.now() + 120
  local want = ("\niter %d | loss"):format(step)
  while not seen:find(want, 1, true) and timer.now() < deadline do
    local lines = j:read(5)
    if not lines then break end
    seen = seen .. "\n" .. table.concat(lines, "\n")
  end
  assert(seen:find(want, 1, true), "the run never reached step " .. step .. ":\n" .. seen)
end

-- Starts cmd (exec'd, its processes marked `mark`) and waits for rank 0's progress line of step `step`.
local function start_until(cmd, step, mark)
  local j = job.start(("exec env SNAPSPEC_MARK=%s %s"):format(mark, cmd), "snapspec-" .. mark)
  read_until(j, step)
  return j
end

-- The pid of rank `rank` of the job marked `mark` (a shard process with that MPI rank), or nil.
local function rank_pid(mark, rank)
  local out = support.run(("for f in $(grep -lzxF SNAPSPEC_MARK=%s /proc/[0-9]*/environ 2>/dev/null); do p=${f#/proc/}; p=${p%%/environ}; "
    .. "[ \"$(cat /proc/$p/comm 2>/dev/null)\" = shard ] && grep -qzx OMPI_COMM_WORLD_RANK=%d $f && echo $p; done"):format(mark, rank))
  return tonumber(out:match("(%d+)"))
end

local function finish(j)
  local out, deadline = {}, timer.now() + 180
  while not j:exited() and timer.now() < deadline do
    for _, l in ipairs(j:read(200) or {}) do out[#out + 1] = l end
  end
  for _, l in ipairs(j:rest()) do out[#out + 1] = l end
  return table.concat(out, "\n"), j:exited()
end

-- A snapshot file's slots: { [0] = step or false, [1] = ... } (false: not whole), and the
-- bytes of a slot; nil when the file cannot be opened.
local function slots(path)
  local box = ffi.new("sh_snap*[1]")
  if C.sh_snap_open(box, path, 0, 0) ~= 0 then return nil end
  local head, out = ffi.new("sh_snap_head"), {}
  for s = 0, 1 do out[s] = C.sh_snap_verify(box[0], s, head) == 0 and tonumber(head.step) or false end
  local bytes = tonumber(C.sh_snap_slot_bytes(box[0]))
  C.sh_snap_close(box[0])
  return out, bytes
end

-- One process of the recipe with snapshots every step, as job `id`; vars: more environment.
local function world1(id, dir, vars)
  vars = vars or {}
  vars.SHARD_JOB_ID = id
  return ("%s %s run %s %s --snapshot_interval=1 --out_dir=%s"):format(env_vars(vars), quote(support.BIN), quote(RECIPE), ARGS, dir)
end

-- A world-1 run killed after a random step; returns its snapshot file, its out_dir and the step.
local function killed_world1(id)
  local dir = tmpdir()
  local step = math.random(3, ITERS / 2)
  local j = start_until(world1(id, dir), step, id)
  job.sleep(math.random(0, 30))   -- the copy of the step just printed is in flight: land anywhere
  C.kill(j.pid, 9)
  finish(j)
  return SNAP_DIR .. ("/shard-%s-w1-r0.snap"):format(id), dir, step
end

-- The restart of job id (SHARD_RESTART=1), to the end; its output.
local function restart_world1(id, dir)
  local out, code = support.run(world1(id, dir, { SHARD_RESTART = 1 }))
  assert(code == 0, out)
  return out
end

-- What a restart restores when the newest whole snapshot is of step `mem` (nil: none): the
-- newest disk checkpoint where it is newer, else that snapshot (a tie: memory), else nothing.
local function restore_line(dir, mem)
  local latest = require("shard.checkpoint").latest(dir .. "/ckpt")
  local disk = latest and tonumber(latest:match("step%-(%d+)$"))
  if mem and (not disk or mem >= disk) then return ("restart: restored step %d from memory"):format(mem) end
  return disk and ("restart: restored step %d from disk"):format(disk) or "restart: restored step 0 from none"
end

describe("snapshot buddies", function()
  it("pair ranks across nodes, an odd last one with the first", function()
    local pairs_ = require("shard.snapshot").pairs
    -- 2 nodes x 2 ranks, numbered node by node: each rank's buddy is on the other node
    assert.are.same({ { 0, 2 }, { 1, 3 } }, pairs_({ 0, 0, 1, 1 }, { 0, 1, 0, 1 }))
    -- placed round robin (node of rank r is r % 2)
    assert.are.same({ { 0, 1 }, { 2, 3 } }, pairs_({ 0, 1, 0, 1 }, { 0, 0, 1, 1 }))
    assert.are.same({ { 0, 1 }, { 2, 0 } }, pairs_({ 0, 0, 0 }, { 0, 1, 2 }))
    assert.are.same({ { 0, 3 }, { 1, 4 }, { 2, 5 } }, pairs_({ 0, 0, 0, 1, 1, 1 }, { 0, 1, 2, 0, 1, 2 }))
    assert.are.same({}, pairs_({ 0 }, { 0 }))
  end)
end)

describe("the automatic snapshot interval", function()
  -- The interval a run picks when a step with a snapshot in flight takes `on` seconds and one
  -- without `off` (a clock that moves by them; no copy is made: the steps are only timed).
  local function pick(on, off)
    local snapshot, shard = require("shard.snapshot"), require("shard")
    local timer = require("shard.timer")
    local now, real_now = 0, timer.now
    local snaps = snapshot.new{ model = shard.nn.Linear(2, 2), env = { world = 1, rank = 0 }, interval = "auto" }
    local taken = {}
    timer.now = function() return now end
    local ok, err = pcall(function()
      for step = 1, snapshot.WARM + 2 * snapshot.PAIRS + 1 do
        local due = snaps:due(step)
        taken[#taken + 1] = due and 1 or 0
        snaps:probe(due)
        now = now + (due and on or off)
      end
    end)
    timer.now = real_now
    assert(ok, err)
    return snaps.interval, snaps.probes, table.concat(taken)
  end

  it("is 1 when a snapshot costs the step at most 3% of its wall time, else the smallest K under that", function()
    local k, probes, taken = pick(1.02, 1.0)
    local snapshot = require("shard.snapshot")
    -- the first WARM steps, then every other step
    assert.are.same({ 1, nil, ("1"):rep(snapshot.WARM) .. ("10"):rep(snapshot.PAIRS) .. "1" }, { k, probes, taken })
    assert.are.same(4, (pick(1.10, 1.0)))        -- 10%: 4 steps apart keep it at 2.5%
    assert.are.same(1, (pick(0.95, 1.0)))        -- cheaper than without (noise): 1
    assert.are.same(34, (pick(2.0, 1.0)))        -- 100%
  end)
end)

describe("snapshots and restarts", function()
  local seed = os.time()
  math.randomseed(seed)
  teardown(function()   -- nothing of the spec's own is left in /dev/shm
    os.execute("rm -rf " .. quote(SNAP_DIR))
    for _, dir in pairs(refs) do os.execute("rm -rf " .. quote(dir)) end
  end)

  it("a rank killed at a random step under shard launch: the job finishes bitwise equal, at most K steps recomputed", function()
    local ref = reference(2)
    local dir, victim = tmpdir(), math.random(0, 1)
    local step = math.random(2, ITERS / 2)
    local mark = "launch" .. seed
    local cmd = ("%s %s launch --nproc 2 --max_restarts 1 %s %s --strategy=full_shard --out_dir=%s"):format(
      env_vars(), quote(support.BIN), quote(RECIPE), ARGS, dir)
    local j = start_until(cmd, 1, mark)
    local pid = assert(rank_pid(mark, victim), "no rank " .. victim)
    read_until(j, step)
    C.kill(pid, 9)
    local out, status = finish(j)
    local what = ("seed %d, rank %d killed after step %d"):format(seed, victim, step)
    assert.are.same({ code = 0 }, status, what .. "\n" .. out)
    local line = out:match("shard launch: restart 1 of 1: [^\n]*")
    assert(line, what .. ": no restart line\n" .. out)
    -- from memory (or, where the kill landed in the copy of a step just checkpointed, that checkpoint)
    local restored, from, lost, done, total, ended, started, first = line:match("restored step (%d+) from (.-), (%d+) steps? lost; "
      .. "step (%d+) completed ([%d.]+) s after the failure %(the job ended in ([%d.]+) s, the new one started and restored in "
      .. "([%d.]+) s, its first step took ([%d.]+) s%)$")
    assert(restored and (from == "memory (world 2: 2 own, 0 buddy copies)" or from == "disk"), what .. ": " .. line)
    -- the three parts add up to the whole (each rounded to 0.1 s)
    assert(math.abs(tonumber(ended) + tonumber(started) + tonumber(first) - tonumber(total)) <= 0.151, what .. ": " .. line)
    assert(line:find(("rank %d was killed by signal 9"):format(victim), 1, true), line)
    -- K: the default picks it from the first copies' cost (the killed run's choice; the restarted
    -- run says it too, or, killed before choosing, every step so far)
    local k = tonumber(out:match("\nsnapshot: every (%d+) steps? %(") or 1)
    assert(tonumber(lost) <= k and tonumber(done) == tonumber(restored) + 1, what .. ", K " .. k .. ": " .. line)
    assert_same_final(ref, dir, 2, what)
    assert.are.same("", (support.run("ls " .. quote(SNAP_DIR))), "the launcher left snapshot files")
  end)

  -- A world-1 run killed at a random step, its snapshot file changed by plant(path, dir), which
  -- returns the note the restart must print and the restore it must make; then the restart
  -- ends bitwise equal to an uninterrupted run.
  local function planted(name, plant)
    local ref = reference(1)
    local id = name .. seed
    local path, dir, step = killed_world1(id)
    local note, expect = plant(path, dir)
    local out = restart_world1(id, dir)
    assert(out:find(note, 1, true), out)
    assert(out:find(expect, 1, true), out)
    assert_same_final(ref, dir, 1, ("seed %d, %s after step %d"):format(seed, name, step))
  end

  it("skips a slot with a flipped byte and restores the older one", function()
    planted("flip", function(path, dir)
      local st, bytes = slots(path)
      local newest = (st[0] or -1) > (st[1] or -1) and 0 or 1
      local f = assert(io.open(path, "r+b"))
      local at = 4096 + newest * bytes + 4096 + 1000
      f:seek("set", at); local b = f:read(1); f:seek("set", at); f:write(string.char((b:byte() + 1) % 256)); f:close()
      -- the older slot (or, where the kill landed in its copy or a checkpoint is newer, the disk)
      return "payload fails its checksum", restore_line(dir, st[1 - newest] or nil)
    end)
  end)

  it("skips a truncated file and restores the newest disk checkpoint", function()
    planted("truncate", function(path, dir)
      local _, bytes = slots(path)
      local _, code = support.run(("truncate -s %d %s"):format(4096 + math.floor(bytes / 2), quote(path)))
      assert(code == 0)
      return "the file is cut short", restore_line(dir, nil)
    end)
  end)

  it("restores from the buddies' copies when the ranks' own files are gone (world 3, odd pairing)", function()
    local ref = reference(3)
    local id, dir, victim = "buddy" .. seed, tmpdir(), math.random(0, 2)
    local step = math.random(3, ITERS / 2)
    local function cmd(vars)
      vars.SHARD_JOB_ID = id
      return ("%s -np 3 %s %s run %s %s --strategy=full_shard --snapshot_interval=1 --snapshot_replicas=1 --out_dir=%s"):format(
        MPIRUN, env_vars(vars), quote(support.BIN), quote(RECIPE), ARGS, dir)
    end
    local j = start_until(cmd{}, 1, id)
    local pid = assert(rank_pid(id, victim), "no rank " .. victim)
    read_until(j, step)
    C.kill(pid, 9)
    finish(j)
    for r = 0, 2 do   -- every rank's own file: each pair's copies in both directions are needed
      assert(os.remove(SNAP_DIR .. ("/shard-%s-w3-r%d.snap"):format(id, r)), "no snapshot file of rank " .. r)
    end
    os.execute(("rm -rf %s/ckpt"):format(quote(dir)))   -- a copy is a snapshot behind: no newer checkpoint to prefer
    local out, code = support.run(cmd{ SHARD_RESTART = 1 })
    local what = ("seed %d, rank %d killed after step %d, every own file removed"):format(seed, victim, step)
    assert(code == 0, what .. "\n" .. out)
    assert(out:find("from memory %(world 3: 0 own, 3 buddy copies%)"), what .. "\n" .. out)
    assert_same_final(ref, dir, 3, what)
  end)

  it("goes on at world 1 from rank 0's file and its copy of rank 1's (rank 1's host lost), as a resume at world 1 would", function()
    local id, dir, step = "fewer" .. seed, tmpdir(), math.random(3, ITERS / 2)
    local function cmd(np, out, vars)
      vars.SHARD_JOB_ID = id
      return ("%s -np %d %s %s run %s %s --strategy=full_shard --snapshot_interval=1 --snapshot_replicas=1 --out_dir=%s"):format(
        MPIRUN, np, env_vars(vars), quote(support.BIN), quote(RECIPE), ARGS, out)
    end
    local j = start_until(cmd(2, dir, {}), 1, id)
    local pid = assert(rank_pid(id, 1), "no rank 1")
    read_until(j, step)
    C.kill(pid, 9)
    finish(j)
    os.execute(("rm -rf %s/ckpt"):format(quote(dir)))   -- no disk checkpoint to fall back on
    local own1 = SNAP_DIR .. ("/shard-%s-w2-r1.snap"):format(id)
    local kept = own1 .. ".kept"
    assert(os.rename(own1, kept), "no snapshot file of rank 1")
    -- rank 1's own file gone: rank 0's file and its copy of rank 1's, resharded to world 1
    local out, code = support.run(cmd(1, dir, { SHARD_RESTART = 1 }))
    local what = ("seed %d, rank 1 killed after step %d"):format(seed, step)
    assert(code == 0, what .. "\n" .. out)
    local restored = tonumber(out:match("restart: restored step (%d+) from memory %(world 2: 1 own, 1 buddy copies%)"))
    assert(restored, what .. "\n" .. out)
    -- the same step from both ranks' own files (a buddy copy is a snapshot behind: newer slots
    -- cleared), at world 1 as well: the same bytes at the end
    os.remove(SNAP_DIR .. ("/shard-%s-w2-r1.copy"):format(id))
    assert(os.rename(kept, own1))
    for r = 0, 1 do
      local path = SNAP_DIR .. ("/shard-%s-w2-r%d.snap"):format(id, r)
      local st, bytes = slots(path)
      local f = assert(io.open(path, "r+b"))
      for slot = 0, 1 do
        if st[slot] and st[slot] > restored then f:seek("set", 4096 + slot * bytes); f:write(("\0"):rep(8)) end
      end
      f:close()
    end
    local ref = tmpdir()
    out, code = support.run(cmd(1, ref, { SHARD_RESTART = 1 }))
    assert(code == 0, what .. "\n" .. out)
    assert(out:find(("restart: restored step %d from memory (world 2: 2 own, 0 buddy copies)"):format(restored), 1, true), what .. "\n" .. out)
    assert_same_final(ref, dir, 1, what)
  end)

  it("a kill in the middle of a copy leaves the other slot, which is restored", function()
    local ref = reference(1)
    local id = "midcopy" .. seed
    local dir = tmpdir()
    local path = SNAP_DIR .. ("/shard-%s-w1-r0.snap"):format(id)
    -- each copy pauses halfway for 200 ms: wait for a slot cut short beside a whole one
    local j = start_until(world1(id, dir, { SHARD_SNAPSHOT_COPY_DELAY_MS = 200 }), 2, id)
    local kept, deadline = nil, timer.now() + 60
    while not kept and timer.now() < deadline do
      j:read(5)
      local st = slots(path)
      if st and (st[0] == false) ~= (st[1] == false) then kept = st[0] or st[1]; C.kill(j.pid, 9) end
    end
    finish(j)
    assert(kept, "never saw a copy in flight")
    local st = slots(path)
    assert((st[0] == false) ~= (st[1] == false), "the kill did not land in the copy")
    local expect = restore_line(dir, kept)
    local out = restart_world1(id, dir)
    assert(out:find("empty (never written, or a write was cut short)", 1, true), out)
    assert(out:find(expect, 1, true), out)
    assert_same_final(ref, dir, 1, ("seed %d, killed copying after step %d"):format(seed, kept))
  end)
end)
