-- shard.memory: the caching allocator's statistics and controls, per device.
--   shard.memory.stats()              -> { allocated, peak, reserved, by_tag = {param=..}, ... }
--   shard.memory.with_tag("param", function() ... end)   -- new storages are counted as params
--   print(shard.memory.format(shard.memory.stats("cuda:0")))
--   local tl = shard.memory.timeline(function() ...a step... end)   -- allocator events, by tag
--   shard.memory.timeline_png(tl, "mem.png")                          -- stacked by tag, peak marked
-- Devices are named as for tensors ("cpu", "cuda", "cuda:N"); the default is the CPU.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local timer = require("shard.timer")
local C, check = rt.C, rt.check

local M = {}

-- The tags of alloc.h's sh_mem_tag, in its order (ids from the enum itself).
local TAG_ID = { other = C.SH_TAG_OTHER, param = C.SH_TAG_PARAM, grad = C.SH_TAG_GRAD, optim = C.SH_TAG_OPTIM,
                 activation = C.SH_TAG_ACTIVATION, comm = C.SH_TAG_COMM }
M.TAGS = {}
for name, id in pairs(TAG_ID) do M.TAGS[id + 1] = name end
assert(#M.TAGS == C.SH_N_TAGS, "shard.memory: alloc.h's tags changed")

local function tag_id(name)
  local id = TAG_ID[name]
  if not id then error(("memory: unknown tag '%s' (expected %s)"):format(tostring(name), table.concat(M.TAGS, ", ")), 3) end
  return id
end

local raw = ffi.new("sh_mem_stats")
local fp_raw = ffi.new("sh_fp_stats")

function M.stats(device)
  check(C.sh_mem_stats_get(tensor.device_id(device), raw), 2)
  local by_tag, peak_by_tag = {}, {}
  for name, id in pairs(TAG_ID) do
    by_tag[name] = tonumber(raw.by_tag[id])
    peak_by_tag[name] = tonumber(raw.peak_by_tag[id])
  end
  return {
    allocated = tonumber(raw.allocated), peak = tonumber(raw.peak), reserved = tonumber(raw.reserved),
    by_tag = by_tag, peak_by_tag = peak_by_tag,
    n_alloc = tonumber(raw.n_alloc), n_system_alloc = tonumber(raw.n_system_alloc),
    limit = tonumber(raw.limit),
    -- FSDP's buffers in flight (every device): gathered units alive and flat grads alive
    in_flight = M.in_flight(),
  }
end

-- { gathers, gathers_peak, reduces, reduces_peak }: full parameter buffers and flat grad
-- buffers alive across every FlatParameter, bounded by shard.fsdp's prefetch and
-- reduces_in_flight.
function M.in_flight()
  C.sh_flatparam_stats(fp_raw)
  return { gathers = fp_raw.gathers, gathers_peak = fp_raw.gathers_peak,
           reduces = fp_raw.reduces, reduces_peak = fp_raw.reduces_peak }
end

function M.reset_peak(device)
  check(C.sh_mem_reset_peak(tensor.device_id(device)), 2)
  C.sh_flatparam_reset_peaks()
end
function M.empty_cache(device) check(C.sh_mem_empty_cache(tensor.device_id(device)), 2) end
-- Allocations that would take `allocated` past bytes fail with an out-of-memory error;
-- nil or 0 removes the limit.
function M.set_limit(bytes, device) check(C.sh_mem_set_limit(tensor.device_id(device), bytes or 0), 2) end

-- Runs fn(...) with new storages counted under tag; the previous tag is back afterwards,
-- whether fn returns or raises.
local function restore(old, ok, ...)
  C.sh_mem_set_tag(old)
  if not ok then error((...), 0) end
  return ...
end
function M.with_tag(name, fn, ...)
  return restore(C.sh_mem_set_tag(tag_id(name)), pcall(fn, ...))
end

local bytes = require("shard.units").bytes
M.format_bytes = bytes

-- One line: "allocated 1.5 MiB (param 1.0 MiB, grad 512.0 KiB), peak 2.0 MiB, reserved 4.0 MiB"
-- " (param 3.1 MiB, grad ...)" for the non-zero tags of a by-tag table
local function tag_list(by_tag)
  local parts = {}
  for _, name in ipairs(M.TAGS) do
    if by_tag[name] ~= 0 then parts[#parts + 1] = name .. " " .. bytes(by_tag[name]) end
  end
  return #parts > 0 and " (" .. table.concat(parts, ", ") .. ")" or ""
end

function M.format(s)
  local limit = s.limit > 0 and ", limit " .. bytes(s.limit) or ""
  return ("allocated %s%s, peak %s%s, reserved %s%s"):format(bytes(s.allocated), tag_list(s.by_tag), bytes(s.peak),
    tag_list(s.peak_by_tag), bytes(s.reserved), limit)
end

---------------------------------------------------------------------------------------------
-- the timeline: every allocation and free of one device over a stretch of work (a step), with
-- the marks set meanwhile (shard.trace marks each FSDP unit's unshard and reshard)

local recording          -- { device, t0, base = by_tag at the start, marks, capacity }
local mem_event = ffi.typeof("sh_mem_event[?]")

-- Starts recording. opts: device (default the CPU), capacity (events held, default 1M; older
-- ones are dropped and counted), reset_peak (default true: the timeline's peak is then
-- stats().peak at the stop; shard.trace passes false to leave a run's own figures alone).
function M.timeline_start(opts)
  opts = opts or {}
  local capacity = opts.capacity or 1048576
  if opts.reset_peak ~= false then M.reset_peak(opts.device) end
  local s = M.stats(opts.device)
  check(C.sh_mem_trace_start(capacity), 2)
  recording = { device = tensor.device_id(opts.device), t0 = timer.now(), base = s.by_tag, marks = {}, capacity = capacity }
end

function M.timeline_recording() return recording ~= nil end

-- A labelled moment on the timeline (nothing when not recording).
function M.mark(label)
  if recording then recording.marks[#recording.marks + 1] = { t = timer.now(), label = label } end
end

-- Stops recording; returns { device, t0, t1, base, events = { {t, bytes, tag}, ... }, marks, dropped }.
function M.timeline_stop()
  if not recording then error("memory.timeline_stop: no timeline is recording (timeline_start first)", 2) end
  local r = recording
  recording = nil
  local buf, events = mem_event(4096), {}
  while true do
    local n = C.sh_mem_trace_read(buf, 4096)
    for i = 0, n - 1 do
      local e = buf[i]
      if e.device == r.device then events[#events + 1] = { t = e.t, bytes = tonumber(e.bytes), tag = M.TAGS[e.tag + 1] } end
    end
    if n < 4096 then break end
  end
  local dropped = tonumber(C.sh_mem_trace_dropped())
  C.sh_mem_trace_start(0)
  return { device = r.device, t0 = r.t0, t1 = timer.now(), base = r.base, events = events, marks = r.marks, dropped = dropped }
end

-- Runs fn(...) while recording; returns the timeline (and nothing of fn's results).
function M.timeline(fn, opts, ...)
  if type(fn) ~= "function" then error("memory.timeline: expected a function to run, got " .. type(fn), 2) end
  M.timeline_start(opts)
  local ok, err = pcall(fn, ...)
  local tl = M.timeline_stop()
  if not ok then error(err, 0) end
  return tl
end

-- The bytes allocated after each event, by tag and in total, and the peak: { points =
-- { {t, total, by_tag}, ... }, peak = { t, bytes, by_tag } }.
function M.timeline_series(tl)
  local by_tag, total = {}, 0
  for _, name in ipairs(M.TAGS) do by_tag[name] = tl.base[name] or 0; total = total + by_tag[name] end
  local function copy() local c = {}; for k, v in pairs(by_tag) do c[k] = v end; return c end
  local points = { { t = tl.t0, total = total, by_tag = copy() } }
  local peak = points[1]
  for _, e in ipairs(tl.events) do
    by_tag[e.tag] = by_tag[e.tag] + e.bytes
    total = total + e.bytes
    local p = { t = e.t, total = total, by_tag = copy() }
    points[#points + 1] = p
    if total > peak.total then peak = p end
  end
  return { points = points, peak = { t = peak.t, bytes = peak.total, by_tag = peak.by_tag } }
end

local function gp_string(x) return "'" .. tostring(x):gsub("'", "''") .. "'" end

-- The tags that hold bytes at some point of the series: only they get a band and a key entry.
local function tags_used(series)
  local used = {}
  for _, name in ipairs(M.TAGS) do
    for _, p in ipairs(series.points) do
      if p.by_tag[name] ~= 0 then used[#used + 1] = name; break end
    end
  end
  if #used == 0 then used[1] = M.TAGS[1] end   -- an empty timeline still plots one (flat) band
  return used
end

-- The marks that get a label: rotated labels stand about 11 pixels apart at the font used, so
-- a mark closer than that to the last labelled one keeps its line but not its label.
local PLOT_WIDTH_PX, LABEL_PX = 950, 11
local function labelled_marks(marks, t0, span_ms)
  local gap, last, out = span_ms * LABEL_PX / PLOT_WIDTH_PX, -math.huge, {}
  for i, m in ipairs(marks) do
    local x = (m.t - t0) * 1e3
    if x - last >= gap then out[i] = true; last = x end
  end
  return out
end

-- What the PNG draws: { series (timeline_series), tags (those that hold bytes: one band
-- each), labelled (mark index -> true), span (ms) }.
function M.timeline_layout(tl)
  local series = M.timeline_series(tl)
  local span = math.max((tl.t1 - tl.t0) * 1e3, 1e-3)
  return { series = series, tags = tags_used(series), labelled = labelled_marks(tl.marks, tl.t0, span), span = span }
end

-- Draws the timeline as a PNG through gnuplot (as timeline_layout lays it out): the bands
-- stacked, the peak marked, each mark a dotted line (reshards red, gathers blue) with its
-- label at the top where it fits; the y range leaves the labels room above the bands.
-- Returns the series (as timeline_series).
function M.timeline_png(tl, path, title)
  local layout = M.timeline_layout(tl)
  local series, tags, shown, span = layout.series, layout.tags, layout.labelled, layout.span
  local data, script = path .. ".dat", path .. ".gp"
  local f = assert(io.open(data, "w"))
  -- each point twice, at its time with the previous sizes and then its own: steps, not slopes
  local prev
  for _, p in ipairs(series.points) do
    local x, row, sum = ("%.6f"):format((p.t - tl.t0) * 1e3), {}, 0
    for _, name in ipairs(tags) do sum = sum + p.by_tag[name]; row[#row + 1] = ("%.6f"):format(sum / 1048576) end
    row = table.concat(row, " ")
    if prev then f:write(x, " ", prev, "\n") end
    f:write(x, " ", row, "\n")
    prev = row
  end
  f:close()
  local peak = series.peak
  local n_shown = 0
  for _ in pairs(shown) do n_shown = n_shown + 1 end
  local lines = {
    "set terminal pngcairo size 1200,600 noenhanced font ',10'",
    "set output " .. gp_string(path),
    "set title " .. gp_string(title or ("memory timeline: peak " .. bytes(peak.bytes) .. tag_list(peak.by_tag))),
    "set xlabel " .. gp_string(("ms (dotted lines: gathers blue, frees red; %d of %d labelled, the rest too close to a neighbour)"):format(
      n_shown, #tl.marks)),
    "set ylabel 'MiB allocated'", "set grid", "set key outside right top",
    ("set xrange [0:%.6f]"):format(span),
    -- the labels take the top third of the plot, above the bands
    ("set yrange [0:%.6f]"):format(math.max(peak.bytes / 1048576, 1e-3) * 1.5),
    "set style fill solid 0.6 noborder",
    ("set label 1 %s at %.6f, %.6f point pt 7 ps 1.5 lc rgb 'red' offset 1,0.5 front"):format(
      gp_string("peak " .. bytes(peak.bytes)), (peak.t - tl.t0) * 1e3, peak.bytes / 1048576),
  }
  for i, m in ipairs(tl.marks) do
    local x = (m.t - tl.t0) * 1e3
    local color = m.label:match("^reshard") and "'#b03030'" or "'#3050b0'"   -- frees red, gathers blue
    lines[#lines + 1] = ("set arrow from %.6f, graph 0 to %.6f, graph 1 nohead dt 3 lc rgb %s"):format(x, x, color)
    if shown[i] then
      lines[#lines + 1] = ("set label %d %s at %.6f, graph 1 rotate by 90 right offset 0,-0.3 font ',7' front"):format(
        i + 1, gp_string(m.label), x)
    end
  end
  local plots = {}
  for i, name in ipairs(tags) do
    local lower = i == 1 and "(0)" or ("%d"):format(i)
    plots[#plots + 1] = ("%s using 1:%s:%d with filledcurves lt %d title %s"):format(gp_string(data), lower, i + 1,
      TAG_ID[name] + 1, gp_string(name))   -- a tag's colour is the same whichever tags are drawn
  end
  lines[#lines + 1] = "plot " .. table.concat(plots, ", \\\n     ")
  f = assert(io.open(script, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local out, status = rt.shell("gnuplot " .. rt.shell_quote(script))
  if status ~= 0 then error(("memory.timeline_png: gnuplot failed on %s (is gnuplot installed? make deps): %s"):format(script, out), 2) end
  os.remove(data); os.remove(script)
  return series
end

return M
