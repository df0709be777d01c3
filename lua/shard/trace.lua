-- shard.trace: step traces in the Chrome trace-event format (ui.perfetto.dev, chrome://tracing)
-- and a summary of where the steps' time went.
--   trace.setup{ path = "out/trace.json", steps = "3:5", memory_timeline = "out/mem.png" }
--   for it = ... do trace.begin_step(it); ...; trace.span("data", fn); ...; trace.end_step(it) end
--   trace.finish()      -- at the loop's end, in case the last traced step never came
-- What a trace holds, one process (pid) per rank:
--   host thread (tid 1): the step, each op forward and backward (shard.profile's hooks), each
--     FSDP unit's forward, unshard, prefetch, reshard, pre- and post-backward, the spans the
--     loop names (data, optimizer), and every wait that blocked on a collective (exposed);
--   communication (tids 10.. gathers and broadcasts, 20.. reductions): each collective from
--     issue to completion with its bytes, group and the unit it serves (runtime/dist/comm.c's
--     event ring); overlapping collectives take further lanes;
--   a memory counter by tag (runtime/core/alloc.c's event ring, shard.memory's timeline);
--   on a CUDA device, one track per stream (tids 30 compute, 31 all-gather, 32 reduce-scatter)
--   with each op's and each collective's device time (shard.trace_device).
-- Every rank writes its part beside the path; rank 0 merges them after a barrier. Times are
-- the ranks' CLOCK_MONOTONIC, shifted so the earliest rank starts at 0: comparable across
-- ranks of one node (each rank's own track stays exact across nodes).
-- On a CUDA device the host spans time the launches, and the summary comes from the device
-- tracks instead (see summarize).
local ffi = require("ffi")
local cjson = require("cjson")
local rt = require("shard.ffi")
local timer = require("shard.timer")
local profile = require("shard.profile")
local memory = require("shard.memory")
local A = require("shard.autograd")
local tensor = require("shard.tensor")
local trace_device = require("shard.trace_device")
local units = require("shard.units")
local C, check = rt.C, rt.check

local M = {}

local kind_name = require("shard.comm").kind_name   -- the runtime's names of the collective kinds
local REDUCTION = { [kind_name(C.SH_COLL_REDUCE_SCATTER)] = true, [kind_name(C.SH_COLL_ALL_REDUCE)] = true }
M.HOST, M.GATHERS, M.REDUCTIONS, M.DEVICE = 1, 10, 20, 30

local cfg = {}          -- setup's options
local rec               -- the recording: { origin, rank, world, spans, steps, ... } while on
local finished = false

local function create(path, what)
  local f, err = io.open(path, "w")
  if not f then error(("trace: cannot write the %s %s (%s)"):format(what, path, err), 0) end
  return f
end

---------------------------------------------------------------------------------------------
-- steps to trace: "3:5" (3 to 5), "4" (just 4)

function M.parse_steps(s)
  s = tostring(s or "")
  local a, b = s:match("^(%d+):(%d+)$")
  if not a then a = s:match("^(%d+)$"); b = a end
  a, b = tonumber(a), tonumber(b)
  if not a or b < a then
    error(("trace: --trace_steps=%s; expected FIRST:LAST (e.g. 3:5) or one step, FIRST <= LAST"):format(s), 0)
  end
  return a, b
end

-- opts: path (the trace, nil for none), steps ("1:2" by default), memory_timeline (a PNG
-- path, nil for none), device (whose memory the timeline follows; default the CPU).
-- Nothing is recorded unless one of the two outputs is asked for.
function M.setup(opts)
  cfg = { path = opts.path ~= "" and opts.path or nil, memory_timeline = opts.memory_timeline ~= "" and opts.memory_timeline or nil,
          device = opts.device }
  cfg.first, cfg.last = M.parse_steps(opts.steps or "1:2")
  finished = false
  -- a path that cannot be written fails now, not after the steps
  if cfg.path then create(cfg.path, "trace"):close(); os.remove(cfg.path) end
  if cfg.memory_timeline then
    if not rt.have_command("gnuplot") then
      error(("trace: the memory timeline %s is drawn by gnuplot, which is not installed (make deps installs "
             .. "gnuplot-nox)"):format(cfg.memory_timeline), 2)
    end
    create(cfg.memory_timeline, "memory timeline"):close(); os.remove(cfg.memory_timeline)
  end
end

function M.enabled() return (cfg.path or cfg.memory_timeline) ~= nil end
function M.recording() return rec ~= nil end

---------------------------------------------------------------------------------------------
-- host spans

local function span(name, cat, t0, t1, args)
  if rec then rec.spans[#rec.spans + 1] = { name = name, cat = cat, t0 = t0, t1 = t1, args = args } end
end

local function finish_span(name, cat, t0, ok, ...)
  span(name, cat, t0, timer.now())
  if not ok then error((...), 0) end
  return ...
end

-- Runs fn(...) inside a span of the host track (data loading, the optimizer step).
function M.span(name, fn, ...)
  if not rec then return fn(...) end
  return finish_span(name, "loop", timer.now(), pcall(fn, ...))
end

local function on_op(name, phase, t0, t1)
  if not rec then return end
  local full, cat = phase == "fwd" and name or (name .. " backward"), phase == "fwd" and "op" or "op.bwd"
  span(full, cat, t0, t1)
  if rec.dev then rec.dev:op_end(full, cat == "op" and "device" or "device.bwd") end
end

local function before_op()
  if rec and rec.dev then rec.dev:op_begin() end
end

---------------------------------------------------------------------------------------------
-- FSDP: spans per unit, the label its collectives carry, and memory marks for unshard/reshard

local labels, label_names = setmetatable({}, { __mode = "k" }), { [0] = "(no unit)" }

local function unit_name(u) return u.name == "" and "(root)" or u.name end

local function label_of(u)
  local l = labels[u]
  if not l then l = #label_names + 1; labels[u] = l; label_names[l] = unit_name(u) end
  return l
end

local function state(u) return require("shard.fsdp").gather_state(u) end

local saved_unit = {}

-- method(self, ...) inside a span named "<what> <unit>", with the unit's label on the
-- collectives it issues; `changes` spans only calls that change the gather state (a reshard
-- of an unsharded unit, not a no-op), and marks the memory timeline with them.
local function traced_method(Unit, method, what, changes)
  local fn = Unit[method]
  saved_unit[method] = fn
  Unit[method] = function(self, ...)
    if not rec then return fn(self, ...) end
    local before = changes and state(self)
    local old = C.sh_comm_trace_label(label_of(self))
    local t0 = timer.now()
    local ok, a, b = pcall(fn, self, ...)
    C.sh_comm_trace_label(old)
    if not changes or state(self) ~= before then
      local name = what .. " " .. unit_name(self)
      span(name, "fsdp", t0, timer.now())
      if changes then memory.mark(name) end
    end
    if not ok then error(a, 0) end
    return a, b
  end
end

local FSDP_SPANS = { { "forward", "forward" }, { "pre_backward", "pre-backward" }, { "post_backward", "post-backward" },
                     { "unshard", "unshard", true }, { "prefetch", "prefetch", true }, { "reshard", "reshard", true } }

local saved_backward

local function hook()
  profile.watch(on_op, before_op)
  local Unit = require("shard.fsdp").Unit
  for _, s in ipairs(FSDP_SPANS) do traced_method(Unit, s[1], s[2], s[3]) end
  saved_backward = A.backward
  A.backward = function(...) return finish_span("backward", "step", timer.now(), pcall(saved_backward, ...)) end
end

local function unhook()
  profile.unwatch(on_op)
  local Unit = require("shard.fsdp").Unit
  for method, fn in pairs(saved_unit) do Unit[method] = fn end
  saved_unit = {}
  A.backward = saved_backward
end

---------------------------------------------------------------------------------------------
-- recording

local function world()
  local comm = require("shard.comm")
  return comm.world()
end

local function start()
  local w = world()
  rec = { origin = timer.now(), rank = w:rank(), world = w:size(), spans = {}, comm = {}, steps = {} }
  local device = tensor.device_id(cfg.device)
  if device >= 0 then rec.dev = trace_device.new(device) end
  check(C.sh_comm_trace_start(1048576))
  if not memory.timeline_recording() then
    memory.timeline_start { device = cfg.device, reset_peak = false }
    rec.owns_timeline = true
  end
  hook()
end

local comm_event = ffi.typeof("sh_comm_event[?]")

local function read_comm()
  local buf, out = comm_event(1024), {}
  while true do
    local n = C.sh_comm_trace_read(buf, 1024)
    for i = 0, n - 1 do
      local e = buf[i]
      local c = { t0 = e.t0, t1 = e.t1, bytes = tonumber(e.bytes), seq = tonumber(e.seq), kind = kind_name(e.kind),
                  wait = e.wait ~= 0, device = e.device, unit = label_names[e.label] or "?", group = ffi.string(e.group) }
      out[#out + 1] = c
      if rec.dev then
        rec.dev:collective(c.kind .. " " .. c.unit, e.stream, e.device_events,
                           { bytes = c.bytes, group = c.group, seq = c.seq, unit = c.unit, device = c.device })
      else
        for j = 0, 2 do if e.device_events[j] ~= nil then C.sh_cuda_event_destroy(e.device_events[j]) end end
      end
    end
    if n < 1024 then break end
  end
  rec.comm_dropped = tonumber(C.sh_comm_trace_dropped())
  C.sh_comm_trace_start(0)
  return out
end

local function stop()
  unhook()
  rec.comm = read_comm()
  if rec.dev then rec.device_spans = rec.dev:finish() end
  if rec.owns_timeline then rec.timeline = memory.timeline_stop() end
  local r = rec
  rec = nil
  return r
end

function M.begin_step(it)
  if finished or not M.enabled() or it < cfg.first or it > cfg.last then return end
  if not rec then start() end
  rec.step_t0, rec.step_it = timer.now(), it
end

function M.end_step(it)
  if not rec or rec.step_it ~= it then return end
  span("step " .. it, "step", rec.step_t0, timer.now(), { step = it })
  rec.steps[#rec.steps + 1] = it
  rec.step_it = nil
  if it >= cfg.last then return M.finish() end
end

---------------------------------------------------------------------------------------------
-- trace events

-- Microseconds from the origin, to the nanosecond; durations from the rounded ends, so that
-- spans that nest in time nest in the file.
local function ns(t, origin) return math.floor((t - origin) * 1e9 + 0.5) end
local function us(t, origin) return ns(t, origin) / 1e3 end

local function complete(out, r, tid, name, cat, t0, t1, args)
  local a = ns(t0, r.origin)
  out[#out + 1] = { ph = "X", pid = r.rank, tid = tid, name = name, cat = cat, ts = a / 1e3, dur = (ns(t1, r.origin) - a) / 1e3, args = args }
end

-- Greedy lanes: a collective goes to the first lane of its class free at its start.
local function lane(lanes, t0, t1)
  for i, last in ipairs(lanes) do
    if last <= t0 then lanes[i] = t1; return i - 1 end
  end
  lanes[#lanes + 1] = t1
  return #lanes - 1
end

local function thread_name(out, r, tid, name)
  out[#out + 1] = { ph = "M", pid = r.rank, tid = tid, name = "thread_name", args = { name = name } }
  out[#out + 1] = { ph = "M", pid = r.rank, tid = tid, name = "thread_sort_index", args = { sort_index = tid } }
end

local function memory_counters(out, r)
  local tl = r.timeline
  if not tl then return end
  for _, p in ipairs(memory.timeline_series(tl).points) do
    local args = {}
    for name, v in pairs(p.by_tag) do args[name] = v / 1048576 end
    out[#out + 1] = { ph = "C", pid = r.rank, name = "memory (MiB)", ts = us(p.t, r.origin), args = args }
  end
end

-- This rank's events, times in microseconds from its origin.
local function rank_events(r)
  local out = {
    { ph = "M", pid = r.rank, name = "process_name", args = { name = "rank " .. r.rank } },
    { ph = "M", pid = r.rank, name = "process_sort_index", args = { sort_index = r.rank } },
  }
  thread_name(out, r, M.HOST, "host")
  for _, s in ipairs(r.spans) do complete(out, r, M.HOST, s.name, s.cat, s.t0, s.t1, s.args) end
  local lanes, named = { [M.GATHERS] = {}, [M.REDUCTIONS] = {} }, {}
  table.sort(r.comm, function(a, b) return a.t0 < b.t0 end)
  for _, e in ipairs(r.comm) do
    local args = { bytes = e.bytes, group = e.group, seq = e.seq, unit = e.unit, device = e.device }
    if e.wait then
      complete(out, r, M.HOST, "wait " .. e.kind .. " " .. e.unit, "comm.wait", e.t0, e.t1, args)
    else
      local class = REDUCTION[e.kind] and M.REDUCTIONS or M.GATHERS
      local tid = class + lane(lanes[class], e.t0, e.t1)
      if not named[tid] then
        named[tid] = true
        thread_name(out, r, tid, (class == M.GATHERS and "comm: gathers" or "comm: reductions") ..
                                 (tid > class and (" (" .. (tid - class + 1) .. ")") or ""))
      end
      complete(out, r, tid, e.kind .. " " .. e.unit, "comm", e.t0, e.t1, args)
    end
  end
  for kind, name in pairs(r.device_spans and trace_device.STREAMS or {}) do thread_name(out, r, M.DEVICE + kind, name) end
  for _, s in ipairs(r.device_spans or {}) do complete(out, r, M.DEVICE + s.kind, s.name, s.cat, s.t0, s.t1, s.args) end
  memory_counters(out, r)
  return out
end

---------------------------------------------------------------------------------------------
-- the summary, from the events alone (so it can be recomputed from a trace file)

-- Total length of the union of [a, b) intervals.
local function union(list)
  table.sort(list, function(x, y) return x[1] < y[1] end)
  local total, lo, hi = 0, nil, nil
  for _, iv in ipairs(list) do
    if hi and iv[1] <= hi then
      if iv[2] > hi then hi = iv[2] end
    else
      if hi then total = total + hi - lo end
      lo, hi = iv[1], iv[2]
    end
  end
  if hi then total = total + hi - lo end
  return total
end

-- A rank with device tracks (CUDA), from them: step is the window from its first device
-- span to its last, compute the time some op ran on the device, comm the time some
-- collective did, exposed the time a collective ran and no op did (each such moment split
-- evenly between the collectives then running, for exposed_by_unit), other the idle rest.
local function device_times(ops, colls)
  local marks = {}
  -- { time, depth change, collective (+i starts, -i ends), 0 for a start and 1 for an end }
  for _, iv in ipairs(ops) do marks[#marks + 1] = { iv[1], 1, 0, 0 }; marks[#marks + 1] = { iv[2], -1, 0, 1 } end
  for i, c in ipairs(colls) do marks[#marks + 1] = { c[1], 0, i, 0 }; marks[#marks + 1] = { c[2], 0, -i, 1 } end
  table.sort(marks, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[4] < b[4] end)
  local r = { compute = 0, comm = 0, exposed = 0, other = 0, exposed_by_unit = {} }
  local depth, running, n = 0, {}, 0
  for k, m in ipairs(marks) do
    if m[2] ~= 0 then depth = depth + m[2]
    elseif m[3] > 0 then running[m[3]] = true; n = n + 1
    else running[-m[3]] = nil; n = n - 1 end
    local nxt = marks[k + 1]
    local len = nxt and (nxt[1] - m[1]) / 1e3 or 0
    if len > 0 then
      if depth > 0 then r.compute = r.compute + len end
      if n > 0 then r.comm = r.comm + len end
      if depth == 0 and n > 0 then
        r.exposed = r.exposed + len
        for i in pairs(running) do
          local u = colls[i].unit
          r.exposed_by_unit[u] = (r.exposed_by_unit[u] or 0) + len / n
        end
      elseif depth == 0 then
        r.other = r.other + len
      end
    end
  end
  r.step = #marks > 0 and (marks[#marks][1] - marks[1][1]) / 1e3 or 0
  return r
end

-- Per rank, in milliseconds: step (the steps' spans), compute (host time in ops), comm (time
-- some collective was in flight or waited for), exposed (host blocked in waits), overlap
-- (1 - exposed / comm), other (step - compute - exposed: FSDP bookkeeping, data, the loop),
-- exposed_by_unit, and per collective kind its count and bytes; clock "host". On a CUDA
-- device the same from the device tracks (device_times), clock "device".
function M.summarize(events)
  local ranks = {}
  local function rank(pid)
    local s = ranks[pid + 1]
    if not s then
      s = { rank = pid, step = 0, ops = {}, comm = {}, exposed = 0, exposed_by_unit = {}, count = {}, bytes = {},
            dev_ops = {}, dev_comm = {} }
      ranks[pid + 1] = s
    end
    return s
  end
  for _, e in ipairs(events) do
    if e.ph == "X" then
      local s, iv = rank(e.pid), { e.ts, e.ts + e.dur }
      if e.cat == "step" and e.name:match("^step ") then s.step = s.step + e.dur
      elseif e.cat == "op" or e.cat == "op.bwd" then s.ops[#s.ops + 1] = iv
      elseif e.cat == "device" or e.cat == "device.bwd" then s.dev_ops[#s.dev_ops + 1] = iv
      elseif e.cat == "device.comm" then s.dev_comm[#s.dev_comm + 1] = { iv[1], iv[2], unit = e.args.unit }
      elseif e.cat == "comm.wait" then
        s.exposed = s.exposed + e.dur
        s.comm[#s.comm + 1] = iv
        s.exposed_by_unit[e.args.unit] = (s.exposed_by_unit[e.args.unit] or 0) + e.dur / 1e3
      elseif e.cat == "comm" then
        s.comm[#s.comm + 1] = iv
        local k = e.name:match("^(%S+)")
        s.count[k] = (s.count[k] or 0) + 1
        s.bytes[k] = (s.bytes[k] or 0) + e.args.bytes
      end
    end
  end
  local out = {}
  for i = 1, #ranks do
    local s = ranks[i]
    if s then
      local r
      if #s.dev_ops + #s.dev_comm > 0 then
        r = device_times(s.dev_ops, s.dev_comm)
        r.clock = "device"
      else
        r = { step = s.step / 1e3, compute = union(s.ops) / 1e3, comm = union(s.comm) / 1e3, exposed = s.exposed / 1e3,
              exposed_by_unit = s.exposed_by_unit, clock = "host" }
        r.other = r.step - r.compute - r.exposed
      end
      r.rank, r.count, r.bytes = s.rank, s.count, s.bytes
      r.overlap = r.comm > 0 and 1 - r.exposed / r.comm or 1
      out[#out + 1] = r
    end
  end
  return out
end

-- The summary for a person (shard.units: ms and percent), columns aligned.
function M.format_summary(sum, steps)
  local function ms(x) return units.ms(x / 1e3) end   -- the summary's figures are ms already
  local rows = { { "rank", "step", "compute", "comm", "exposed", "overlap", "other", "clock" } }
  local names, seen = {}, {}
  for _, r in ipairs(sum) do
    rows[#rows + 1] = { tostring(r.rank), ms(r.step), ms(r.compute), ms(r.comm), ms(r.exposed), units.percent(r.overlap),
                        ms(r.other), r.clock }
    for u in pairs(r.exposed_by_unit) do if not seen[u] then seen[u] = true; names[#names + 1] = u end end
  end
  local text = ("trace summary over %s (ms per rank, all traced steps together):\n"):format(steps)
    .. units.columns(rows, { align = { "r" } })
  if #names == 0 then return text end
  table.sort(names)
  local by_unit = { { "exposed comm by unit" } }
  for _, r in ipairs(sum) do by_unit[1][#by_unit[1] + 1] = "rank " .. r.rank end
  for _, u in ipairs(names) do
    local row = { u }
    for _, r in ipairs(sum) do row[#row + 1] = ms(r.exposed_by_unit[u] or 0) end
    by_unit[#by_unit + 1] = row
  end
  return text .. "\n" .. units.columns(by_unit)
end

---------------------------------------------------------------------------------------------
-- writing and merging

local function part_path(path, rank) return ("%s.rank%d.part"):format(path, rank) end

local function write_part(path, r, events)
  local f = create(path, "rank part")
  f:write(cjson.encode { rank = r.rank, origin = ("%.9f"):format(r.origin), steps = r.steps, dropped = r.comm_dropped }, "\n")
  for _, e in ipairs(events) do f:write(cjson.encode(e), "\n") end
  f:close()
end

local function read_part(path)
  local f, err = io.open(path, "r")
  if not f then error(("trace: cannot read rank part %s (%s): the ranks must share a file system"):format(path, err), 0) end
  local head = cjson.decode(f:read("*l"))
  local events = {}
  for line in f:lines() do events[#events + 1] = cjson.decode(line) end
  f:close()
  return head, events
end

-- Merges the parts of ranks 0..world-1 into path; returns the events.
local function merge(path, world_size)
  local heads, parts, origin = {}, {}, math.huge
  for r = 0, world_size - 1 do
    heads[r], parts[r] = read_part(part_path(path, r))
    origin = math.min(origin, tonumber(heads[r].origin))
  end
  local all = {}
  for r = 0, world_size - 1 do
    local shift = math.floor((tonumber(heads[r].origin) - origin) * 1e9 + 0.5) / 1e3
    for _, e in ipairs(parts[r]) do
      if e.ts then e.ts = e.ts + shift end
      all[#all + 1] = e
    end
    os.remove(part_path(path, r))
  end
  local f = create(path, "trace")
  f:write('{"displayTimeUnit":"ms","otherData":', cjson.encode { tool = "shard.trace", ranks = world_size, steps = heads[0].steps },
          ',"traceEvents":[\n')
  for i, e in ipairs(all) do f:write(cjson.encode(e), i < #all and ",\n" or "\n") end
  f:write("]}\n")
  f:close()
  return all
end

local function timeline_path(path, rank)
  if rank == 0 then return path end
  local base, ext = path:match("^(.*)(%.[^./]*)$")
  return base and (base .. ".rank" .. rank .. ext) or (path .. ".rank" .. rank)
end

-- What rank 0 adds to its timeline line: where the other ranks' PNGs go (a launch shows
-- rank 0's output only).
local function other_timelines(path, world_size)
  if world_size == 1 then return "" end
  local paths = {}
  for rank = 1, world_size - 1 do paths[#paths + 1] = timeline_path(path, rank) end
  return ("; %s %s"):format(world_size == 2 and "rank 1:" or ("ranks 1-%d:"):format(world_size - 1), table.concat(paths, ", "))
end

-- Stops recording and writes what setup asked for: the merged trace (rank 0 prints the
-- summary) and each rank's memory timeline PNG. Every rank must call it (a barrier).
-- Returns { steps, png, timeline_peak (bytes), summary (rank 0, when a trace was written) }.
function M.finish()
  if not rec then return end
  finished = true
  local r = stop()
  local steps = #r.steps > 0 and (r.steps[1] == r.steps[#r.steps] and ("step " .. r.steps[1]) or
                ("steps " .. r.steps[1] .. "-" .. r.steps[#r.steps])) or "no complete step"
  local result = { steps = steps }
  if r.timeline then result.timeline_peak = memory.timeline_series(r.timeline).peak.bytes end
  if cfg.memory_timeline and r.timeline then
    result.png = timeline_path(cfg.memory_timeline, r.rank)
    memory.timeline_png(r.timeline, result.png, ("memory timeline, rank %d, %s"):format(r.rank, steps))
    print(("memory timeline: rank %d, peak %s -> %s%s"):format(r.rank, units.bytes(result.timeline_peak), result.png,
      r.rank == 0 and other_timelines(cfg.memory_timeline, r.world) or ""))
  end
  if not cfg.path then return result end
  write_part(part_path(cfg.path, r.rank), r, rank_events(r))
  if r.world > 1 then world():barrier() end
  if r.rank ~= 0 then return result end
  result.summary = M.summarize(merge(cfg.path, r.world))
  print(M.format_summary(result.summary, steps))
  print(("trace: %d rank%s, %s -> %s (open in ui.perfetto.dev)"):format(r.world, r.world > 1 and "s" or "", steps, cfg.path))
  if (r.comm_dropped or 0) > 0 then print(("trace: %d collective events were dropped (ring full)"):format(r.comm_dropped)) end
  return result
end

return M
