-- shard.tools.dryrun: `shard estimate --dry-run --world=N RECIPE [--key=value ...]` runs a recipe as
-- one rank of an N-rank job, in one process, with nothing computed: the real fsdp.wrap,
-- schedule and caching allocator, over tensors on the meta device (runtime/core/meta.h: shapes and
-- memory accounting, no data; kernels count FLOPs and bytes) and a dry-run world
-- (runtime/dist/comm_dry.c: collectives counted as real ones, no data moved). It prints, for the
-- last of --steps training steps (the optimizer's step calls delimit them): the rank's peak
-- memory by tag and the unit running when it was reached, the collectives and their bytes,
-- the FLOPs, and the step time that a device's peak figures imply (an estimate: bounds, not
-- a measurement). Under CPU offload (a recipe's --offload: fsdp.wrap's offload = { params =
-- true }) the device's peak leaves out what moved to the host, and the host's peak by tag
-- (the shards, sharded grads and AdamW state, on the meta device's host side, meta.h) is
-- printed apart, with the bytes copied between host and device and the host kernels' bytes. Dry-run options come before RECIPE, the recipe's own after it:
--   --world=N (1)  --rank=R (0)  --local_size=L (8 ranks per node; hybrid_group = "node")
--   --steps=S (3)  --verbose (the recipe's own output too)  --json (one line `dryrun {json}`)
-- The recipe runs with its device set to meta and, where it has these settings, one
-- evaluation batch, no sampling, no checkpoints and no progress lines (DRY_SETTINGS). A value
-- read from a meta tensor is 0, so a recipe must not branch on one. A dry run writes no file a
-- real run reads: shard.train tokenizes the corpus in memory and writes no metrics file.
local ffi = require("ffi")
local rt = require("shard.ffi")
local argv = require("shard.argv")
local units = require("shard.units")
local C, check = rt.C, rt.check

local M = {}

---------------------------------------------------------------------------------------------
-- the probe: per-step counters, and the unit at the peak

local KINDS = require("shard.comm").kinds   -- the runtime's collective kinds, in code order
M.KINDS = KINDS

-- Step k's counters: comm counts and bytes (this process's, every group), the meta device's
-- FLOPs and bytes, and the memory peak of `device` and of `host` (where CPU offload puts the
-- shards: "meta:host" in a dry run, "cpu" in the real runs it is checked against) since the
-- previous step, by tag.
local function counters(device, host)
  local comm, memory = require("shard.comm"), require("shard.memory")
  local c = { count = {}, bytes = {} }
  for _, k in ipairs(KINDS) do c.count[k], c.bytes[k] = comm.count(k), comm.bytes(k) end
  c.flops_matmul = tonumber(C.sh_meta_count(C.SH_META_FLOPS_MATMUL))
  c.flops_attention = tonumber(C.sh_meta_count(C.SH_META_FLOPS_ATTENTION))
  c.kernel_bytes = tonumber(C.sh_meta_count(C.SH_META_BYTES))
  c.host_kernel_bytes = tonumber(C.sh_meta_count(C.SH_META_HOST_BYTES))
  c.copy_bytes = tonumber(C.sh_meta_count(C.SH_META_COPY_BYTES))
  local s = memory.stats(device)
  c.peak, c.peak_by_tag, c.allocated = s.peak, s.peak_by_tag, s.allocated
  local h = memory.stats(host)
  c.host_peak, c.host_peak_by_tag = h.peak, h.peak_by_tag
  return c
end

local Probe = {}
Probe.__index = Probe

-- The label of the innermost FSDP phase running now.
function Probe:label() return self.stack[#self.stack] or "outside the units (data, loss scaling, optimizer)" end

-- The peak is monotonic between resets: a rise since the last look happened in the region
-- that ran since then, which is the current label's.
function Probe:observe()
  C.sh_mem_stats_get(self.device_id, self.raw)
  local peak = tonumber(self.raw.peak)
  if peak > self.seen then self.seen, self.at_peak_now = peak, self:label() end
end

function Probe:enter(label) self:observe(); self.stack[#self.stack + 1] = label end
function Probe:leave(label)
  self:observe()
  if self.stack[#self.stack] == label then self.stack[#self.stack] = nil end
end

function Probe:after_step()
  self:observe()
  local c = counters(self.device, self.host)
  c.at_peak = self.at_peak_now
  self.steps[#self.steps + 1] = c
  require("shard.memory").reset_peak(self.device)
  require("shard.memory").reset_peak(self.host)
  C.sh_mem_stats_get(self.device_id, self.raw)
  self.seen, self.at_peak_now = tonumber(self.raw.peak), self:label()
end

-- The figures of step k (default the last): the difference of the counters across it.
function Probe:step(k)
  k = k or #self.steps
  local now, before = self.steps[k], self.steps[k - 1]
  if not now or not before then
    error(("dry run: step %s of %d has no step before it to measure from (run at least 2 steps)"):format(tostring(k), #self.steps), 2)
  end
  local r = { step = k, count = {}, bytes = {}, peak = now.peak, peak_by_tag = now.peak_by_tag, at_peak = now.at_peak,
              host_peak = now.host_peak, host_peak_by_tag = now.host_peak_by_tag }
  for _, kind in ipairs(KINDS) do
    r.count[kind] = now.count[kind] - before.count[kind]
    r.bytes[kind] = now.bytes[kind] - before.bytes[kind]
  end
  r.flops_matmul = now.flops_matmul - before.flops_matmul
  r.flops_attention = now.flops_attention - before.flops_attention
  r.flops = r.flops_matmul + r.flops_attention
  r.kernel_bytes = now.kernel_bytes - before.kernel_bytes
  r.host_kernel_bytes = now.host_kernel_bytes - before.host_kernel_bytes
  r.copy_bytes = now.copy_bytes - before.copy_bytes
  return r
end

local function wrap_method(class, name, around)
  local orig = class[name]
  class[name] = function(self, ...) return around(orig, self, ...) end
  return function() class[name] = orig end
end

-- Hooks the optimizers' step (every optimizer built from now on) and the FSDP units' phases.
-- device: where the model's memory lives ("meta" in a dry run, "cpu" for the real runs the
-- dry run is checked against); host: where CPU offload puts the shards ("meta:host" with
-- "meta", else "cpu"). Returns the probe; probe:remove() takes the hooks out.
function M.probe(device, host)
  local optim, fsdp = require("shard.optim"), require("shard.fsdp")
  host = host or (device == "meta" and "meta:host" or "cpu")
  local self = setmetatable({ device = device, host = host, device_id = require("shard.tensor").device_id(device),
                              raw = ffi.new("sh_mem_stats"), stack = {}, steps = {}, seen = 0, undo = {} }, Probe)
  local function unit_name(u) return u.name == "" and "(root)" or u.name end
  for _, ctor in ipairs { "AdamW", "SGD" } do
    self.undo[#self.undo + 1] = wrap_method(optim, ctor, function(orig, ...)
      local opt = orig(...)
      local step = opt.step
      opt.step = function(o, ...) local r = step(o, ...); self:after_step(); return r end
      return opt
    end)
  end
  self.undo[#self.undo + 1] = wrap_method(fsdp.Unit, "forward", function(orig, u, ...)
    local label = "forward of " .. unit_name(u)
    self:enter(label)
    local out = orig(u, ...)
    self:leave(label)
    return out
  end)
  self.undo[#self.undo + 1] = wrap_method(fsdp.Unit, "pre_backward", function(orig, u)
    self:enter("backward of " .. unit_name(u))
    return orig(u)
  end)
  self.undo[#self.undo + 1] = wrap_method(fsdp.Unit, "post_backward", function(orig, u)
    orig(u)
    self:leave("backward of " .. unit_name(u))
  end)
  self.steps[0] = counters(device, host)    -- step 1 is measured from here
  return self
end

function Probe:remove()
  for i = #self.undo, 1, -1 do self.undo[i]() end
  self.undo = {}
end

---------------------------------------------------------------------------------------------
-- running a recipe

-- Settings a dry run gives a recipe that has them: the meta device, no sampling, checkpoints
-- or progress lines, one evaluation batch (the evaluation before the first step and after the
-- last still runs: it lies outside the measured step). max_iters is --steps.
local DRY_SETTINGS = { device = "meta", sample_tokens = 0, save_interval = 0, eval_iters = 1,
                       log_interval = 1000000000, eval_interval = 1000000000, resume = false }
M.DRY_SETTINGS = DRY_SETTINGS

-- Runs the recipe file with its command-line overrides, the given settings forced over them
-- (only those its defaults have). print is silenced unless verbose.
function M.run_recipe(path, args, forced, verbose)
  local config = require("shard.config")
  local chunk, err = loadfile(path)
  if not chunk then error("dry run: " .. tostring(err), 0) end
  local script_args = { [0] = path, [-1] = "shard" }
  for i, a in ipairs(args) do script_args[i] = a end
  _G.arg = script_args
  local overrides, stray = config.parse_args(script_args)
  config.set_overrides(overrides, stray, path)
  local apply, print_ = config.apply, _G.print
  config.apply = function(defaults, spec)
    local cfg = apply(defaults, spec)
    for k, v in pairs(forced) do if defaults[k] ~= nil then cfg[k] = v end end
    return cfg
  end
  if not verbose then _G.print = function() end end
  local ok, e = pcall(chunk, unpack(script_args))
  config.apply, _G.print = apply, print_
  -- The run's model, FlatParameters and optimizer state must be free for the next run in this
  -- process: a compiled trace keeps every closure it was recorded through (and all it reaches)
  -- alive until the trace goes, and which loops get compiled varies from run to run.
  jit.flush()
  if not ok then error(e, 0) end
end

---------------------------------------------------------------------------------------------
-- the step time that peak figures imply

-- Bytes one rank sends per step in ring collectives over n ranks, from the counted bytes (the
-- input of each: a shard for all_gather, the full buffer for reduce_scatter and all_reduce).
function M.ring_bytes(bytes, n)
  if n <= 1 then return 0 end
  return bytes.all_gather * (n - 1) + bytes.reduce_scatter * (n - 1) / n + bytes.all_reduce * 2 * (n - 1) / n
         + bytes.broadcast
end

-- This CPU as a device row (shard.peak's shape): its f32 GEMM rate (shard.peak's measurement)
-- and its copy bandwidth (32 MiB read and written, best of 4) for memory; no link.
function M.cpu_row()
  local shard, timer = require("shard"), require("shard.timer")
  local m = 8 * 1024 * 1024
  local src, dst = shard.zeros({ m }, { device = "cpu" }), shard.empty({ m }, { device = "cpu" })
  local copy = math.huge
  for _ = 1, 4 do
    local t0 = timer.now()
    dst:copy_(src)
    copy = math.min(copy, timer.now() - t0)
  end
  src:free(); dst:free()
  local flops = require("shard.peak").measure_cpu()
  return { name = ("this CPU (%s sgemm)"):format(units.si(flops, "FLOP/s")), bf16 = flops, hbm = 2 * 4 * m / copy }
end

-- Time bounds (seconds) of one step on a device (a shard.peak.DEVICES row: bf16 FLOP/s, hbm
-- and nvlink bytes/s each way): compute at the bf16 dense peak, every kernel byte through
-- memory once, the ring's bytes over the link; with perfect overlap the step takes at least
-- the largest, with none their sum.
function M.step_bounds(r, world, dev)
  local b = { compute = r.flops / dev.bf16, hbm = r.kernel_bytes / dev.hbm }
  b.comm = dev.nvlink and M.ring_bytes(r.bytes, world) / dev.nvlink or nil
  b.overlapped = math.max(b.compute, b.hbm, b.comm or 0)
  b.serial = b.compute + b.hbm + (b.comm or 0)
  return b
end

---------------------------------------------------------------------------------------------
-- the command

local HELP = [[shard estimate --dry-run: a recipe run as one rank of an N-rank job, in one process, on the meta
device (shapes and memory accounting, no data, no file written): the rank's peak memory by tag and
the unit at the peak, the collectives and their bytes, the FLOPs per step, and the step time that
H100, H200 and this CPU's peak figures imply.

usage: shard estimate --dry-run [options] RECIPE [--key=value ...]   (the recipe's own after it)

  --world=N        ranks in the job (1)
  --rank=R         the rank to run as (0)
  --local_size=L   ranks per node (8; the recipe's hybrid_group = "node")
  --steps=S        training steps, the last measured (3, at least 3)
  --verbose        the recipe's own output too
  --json           one line `dryrun {json}` instead of the report]]

local OPTIONS = { { "world", "count", default = 1 }, { "rank", "count", default = 0 }, { "local_size", "count", default = 8 },
                  { "steps", "count", default = 3 }, { "verbose", "flag", default = false }, { "json", "flag", default = false } }

local function parse(args)
  local o, pos = argv.parse(args, { options = OPTIONS, stop = true, help = HELP,
                                    prefix = "estimate --dry-run: ", where = "before the recipe" })
  o.recipe, o.args = pos[1], { unpack(pos, 2) }
  if not o.recipe then error({ usage = "estimate --dry-run [--world=N --rank=R --local_size=L --steps=S --verbose] RECIPE [--key=value ...]" }, 0) end
  if o.world < 1 or o.rank < 0 or o.rank >= o.world then
    error({ usage = ("estimate --dry-run: --rank=%d is not a rank of --world=%d"):format(o.rank, o.world) }, 0)
  end
  if o.local_size < 1 or o.steps < 3 then
    error({ usage = ("estimate --dry-run: --local_size must be >= 1 and --steps >= 3 (the last step is measured from the " ..
      "one before, and step 1 ends with the first progress line's collectives); got %d and %d"):format(o.local_size, o.steps) }, 0)
  end
  return o
end

-- Runs the dry run; returns the options and the measured step (Probe:step's table).
function M.run(o)
  local box = ffi.new("sh_comm*[1]")
  check(C.sh_comm_init_dry(box, o.rank, o.world, math.min(o.local_size, o.world)), 2)
  C.sh_comm_destroy(box[0])      -- comm.init() takes the world's reference from here
  local probe = M.probe("meta")
  local forced = { max_iters = o.steps }
  for k, v in pairs(DRY_SETTINGS) do forced[k] = v end
  local ok, err = pcall(M.run_recipe, o.recipe, o.args, forced, o.verbose)
  probe:remove()
  if not ok then error(err, 0) end
  if #probe.steps < o.steps then
    error(("dry run: %s made %d optimizer steps, fewer than --steps=%d (does it read max_iters?)"):format(
      o.recipe, #probe.steps, o.steps), 0)
  end
  if probe.steps[#probe.steps].peak == 0 then
    error(("dry run: %s put nothing on the meta device (does it pass its device setting to shard.init?)"):format(o.recipe), 0)
  end
  return probe:step()
end

-- The report: every figure through shard.units, each table's columns aligned.
local function step_time(s) return s and units.time(s) or "n/a" end

local function by_tag_rows(by_tag)
  local rows = {}
  for _, tag in ipairs(require("shard.memory").TAGS) do
    if by_tag[tag] ~= 0 then rows[#rows + 1] = { tag, units.bytes(by_tag[tag]) } end
  end
  return units.columns(rows, { indent = "  " })
end

local function comm_rows(r)
  local rows, total = {}, 0
  for _, k in ipairs(KINDS) do
    if r.count[k] > 0 then
      rows[#rows + 1] = { k, units.count(r.count[k]) .. " x", units.bytes(r.bytes[k]), ("(%s B)"):format(units.count(r.bytes[k])) }
    end
    total = total + r.bytes[k]
  end
  rows[#rows + 1] = { "total", "", units.bytes(total), ("(%s B)"):format(units.count(total)) }
  return units.columns(rows, { indent = "  " })
end

local function bound_rows(r, world, cpu)
  local rows = { { "device", "compute", "memory", "comm", "overlapped", "serial" } }
  local devices = {}
  for _, d in ipairs(require("shard.peak").DEVICES) do
    devices[#devices + 1] = { ("%s (%s bf16)"):format(d.name, units.si(d.bf16, "FLOP/s")), d }
  end
  if cpu then devices[#devices + 1] = { cpu.name, cpu } end
  for _, d in ipairs(devices) do
    local b = M.step_bounds(r, world, d[2])
    rows[#rows + 1] = { d[1], step_time(b.compute), step_time(b.hbm), step_time(b.comm), step_time(b.overlapped),
                        step_time(b.serial) }
  end
  return units.columns(rows, { indent = "  " })
end

function M.report(o, r, cpu)
  local lines = {}
  local function say(fmt, ...) lines[#lines + 1] = fmt:format(...) end
  say("dry run of %s: rank %d of %d (%d per node), step %d of %d", o.recipe, o.rank, o.world,
      math.min(o.local_size, o.world), r.step, o.steps)
  say("peak memory (rank %d): %s", o.rank, units.bytes(r.peak))
  say("%s", by_tag_rows(r.peak_by_tag))
  say("  reached in: %s", r.at_peak or "?")
  if r.host_peak > 0 then
    say("host memory (rank %d, CPU offload: pinned on a GPU): peak %s", o.rank, units.bytes(r.host_peak))
    say("%s", by_tag_rows(r.host_peak_by_tag))
    say("  copied between host and device per step: %s; host kernels (the CPU optimizer) touch %s",
        units.bytes(r.copy_bytes), units.bytes(r.host_kernel_bytes))
  end
  say("communication per step (rank %d sends its share of each):", o.rank)
  say("%s", comm_rows(r))
  say("FLOPs per step (rank %d): %s (matmul %s, attention %s); kernels touch %s", o.rank, units.si(r.flops, "FLOP"),
      units.si(r.flops_matmul, "FLOP"), units.si(r.flops_attention, "FLOP"), units.bytes(r.kernel_bytes))
  say("step time ESTIMATE from peak figures (shard.peak; bounds, not a measurement): compute at peak, each kernel byte")
  say("through memory once, ring collectives over the link; overlapped = the largest, serial = the sum")
  say("%s", bound_rows(r, o.world, cpu))
  if o.world > 1 then
    say("  (comm: rings over all %d ranks in one NVLink domain at %s each way, an upper bound for", o.world,
        units.si(require("shard.peak").DEVICES[1].nvlink, "B/s"))
    say("  hybrid's smaller groups; across nodes the network is slower)")
  end
  return table.concat(lines, "\n")
end

function M.main(args)
  local o = parse(args)
  local t0 = require("shard.timer").now()
  local r = M.run(o)
  local took = require("shard.timer").now() - t0
  if o.json then
    print("dryrun " .. require("cjson").encode({ rank = o.rank, world = o.world, peak = r.peak, peak_by_tag = r.peak_by_tag,
      at_peak = r.at_peak, count = r.count, bytes = r.bytes, flops = r.flops, flops_matmul = r.flops_matmul,
      flops_attention = r.flops_attention, kernel_bytes = r.kernel_bytes, host_peak = r.host_peak,
      host_peak_by_tag = r.host_peak_by_tag, copy_bytes = r.copy_bytes, host_kernel_bytes = r.host_kernel_bytes,
      seconds = took }))
    return 0
  end
  print(M.report(o, r, M.cpu_row()))
  print(("(dry run took %s)"):format(units.time(took)))
  return 0
end

return M
