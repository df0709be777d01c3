-- shard sweep FILE.lua: scripted benchmark sweeps. A sweep file returns a table naming what to
-- run, the settings to run it with and the metrics to collect:
--
--   return {
--     name = "strategies",                          -- default: the file's name
--     recipe = "recipes/gpt_shakespeare_char.lua",  -- or bench = "cpu_train" (bench/NAME.lua)
--     settings = { max_iters = 40 },                -- every point
--     grid = { strategy = { "full_shard", "no_shard" }, world = { 1, 2, 4 } },  -- every combination
--     order = { "strategy", "world" },              -- the grid's nesting (default: keys sorted)
--     points = { { strategy = "none", world = 1 } },-- and/or an explicit list
--     skip = function(p) return false end,          -- leave a point out
--     env = { OMP_NUM_THREADS = 1 },                -- environment of every point
--     timeout = 300,                                -- seconds per point (default 600), or function(p)
--     metrics = { "peak_bytes", { "tokens_per_s", reduce = "median" } },
--     estimate = function(p) return { n_layer = 4, ..., world = p.world } end,  -- shard estimate's options
--     plots = { { x = "world", y = "tokens_per_s", by = "strategy" },
--               { x = "world", y = "peak_bytes", by = "strategy", estimate = true } },
--   }
--
-- A point's settings become --key=value arguments, except `world`: the number of ranks, run
-- through `shard launch --nproc N` when above 1. Each point is its own process under
-- timeout(1). Metrics come from the point's output: the last `metrics {json}` line (dotted
-- names reach inside it) and the `iter N | name value | ...` log lines (the last value, or
-- reduce = "median" / "mean" / "max" over the windows after the first, which holds warm-up),
-- then lines that are just `name number` (the benches' output); a metric may also be
-- { name, fn = function(output, point) return value end }.
--
-- Results go to OUT/results.jsonl (OUT = out/sweeps/NAME unless --out), one record per point
-- as it finishes: the settings, status ("ok", "failed", "timeout") with the error, metrics,
-- seconds, command, git revision, machine and date. A point is known by its command line: a
-- rerun skips every point recorded before (--retry-failed runs failed and timed-out ones
-- again, --force all of them); a point stopped by Ctrl-C is not recorded and ends the run. At the end OUT/table.md, OUT/table.csv and one PNG per plot
-- (gnuplot; skipped with a note when it is not installed).
local cjson = require("cjson")
local rt = require("shard.ffi")
local argv = require("shard.argv")
local sys = require("shard.tools.sys")
local units = require("shard.units")
local files = require("shard.files")

local M = {}
local quote = rt.shell_quote

local USAGE = "usage: shard sweep FILE.lua [--out DIR] [--retry-failed] [--force] [--report] [--dry-run]"

---------------------------------------------------------------------------------------------
-- the sweep file

local function fail(fmt, ...) error(("sweep: " .. fmt):format(...), 0) end

local function is_list(t)
  if type(t) ~= "table" then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

-- Loads and checks a sweep file; returns the spec with defaults filled in.
function M.load(file)
  local chunk, err = loadfile(file)
  if not chunk then fail("%s", err) end
  local ok, spec = pcall(chunk)
  if not ok then fail("%s: %s", file, tostring(spec)) end
  if type(spec) ~= "table" then fail("%s must return a table, got %s", file, type(spec)) end
  spec.file = file
  spec.name = spec.name or file:match("([^/]+)%.lua$") or file
  if (spec.recipe == nil) == (spec.bench == nil) then fail("%s: name one of recipe = FILE or bench = NAME", file) end
  if spec.bench then
    spec.target = rt.root .. "/bench/" .. spec.bench .. ".lua"
  else
    spec.target = spec.recipe
    if not io.open(spec.target) and not spec.target:match("^/") then spec.target = rt.root .. "/" .. spec.recipe end
  end
  local f = io.open(spec.target)
  if not f then fail("%s: cannot open %s", file, spec.target) end
  f:close()
  spec.settings = spec.settings or {}
  spec.timeout = spec.timeout or 600
  if type(spec.timeout) ~= "function" and (type(spec.timeout) ~= "number" or spec.timeout <= 0) then
    fail("timeout must be a positive number of seconds or a function(point) returning one")
  end
  spec.metrics = spec.metrics or {}
  spec.plots = spec.plots or {}
  spec.env = spec.env or {}
  spec.out = spec.out or ("out/sweeps/" .. spec.name)
  if spec.grid ~= nil and type(spec.grid) ~= "table" then fail("grid must be a table of key = { values }") end
  for k, v in pairs(spec.grid or {}) do
    if not is_list(v) or #v == 0 then fail("grid.%s must be a non-empty list of values", tostring(k)) end
  end
  if spec.points ~= nil and not is_list(spec.points) then fail("points must be a list of tables") end
  return spec
end

local function metric_spec(m)
  if type(m) == "string" then return { name = m } end
  if type(m) == "table" then
    local s = {}
    for k, v in pairs(m) do s[k] = v end
    s.name = s.name or m[1]
    s.fn = s.fn or (type(m[2]) == "function" and m[2] or nil)
    if type(s.name) ~= "string" then fail("a metric needs a name: { \"name\", ... }") end
    return s
  end
  fail("a metric is a name or a table { name, reduce = ..., fn = function(output, point) }, got %s", type(m))
end

---------------------------------------------------------------------------------------------
-- points

local function value_text(v)
  if type(v) == "number" and v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
  return tostring(v)
end

-- The arguments a point's process gets after the target file (world excluded).
function M.args(point)
  local args = {}
  for _, k in ipairs(sys.sorted_keys(point)) do
    if k ~= "world" then args[#args + 1] = "--" .. k .. "=" .. value_text(point[k]) end
  end
  return args
end

-- A point's identity: what it runs and with which arguments.
function M.key(spec, point)
  local parts = { spec.bench and ("bench " .. spec.bench) or spec.recipe, "world=" .. value_text(point.world or 1) }
  for _, a in ipairs(M.args(point)) do parts[#parts + 1] = a end
  return table.concat(parts, " ")
end

-- Every point: the grid's combinations (the last key in `order` varies fastest), then the
-- explicit list, each over `settings`, less those `skip` drops. Returns the points and the
-- names of the settings that vary (the table's columns).
function M.points(spec)
  local list = {}
  if spec.grid and next(spec.grid) then
    local order = spec.order or sys.sorted_keys(spec.grid)
    for k in pairs(spec.grid) do
      local found = false
      for _, o in ipairs(order) do found = found or o == k end
      if not found then fail("grid key %s is missing from order", tostring(k)) end
    end
    local function expand(i, acc)
      if i > #order then
        local p = {}
        for k, v in pairs(acc) do p[k] = v end
        list[#list + 1] = p
        return
      end
      for _, v in ipairs(spec.grid[order[i]]) do acc[order[i]] = v; expand(i + 1, acc) end
      acc[order[i]] = nil
    end
    expand(1, {})
  end
  for _, p in ipairs(spec.points or {}) do
    if type(p) ~= "table" then fail("points must hold tables of settings") end
    list[#list + 1] = p
  end
  local out, seen = {}, {}
  for _, p in ipairs(list) do
    local point = {}
    for k, v in pairs(spec.settings) do point[k] = v end
    for k, v in pairs(p) do point[k] = v end
    point.world = point.world or 1
    if type(point.world) ~= "number" or point.world < 1 or point.world % 1 ~= 0 then
      fail("world must be a whole number >= 1, got %s", tostring(point.world))
    end
    for k, v in pairs(point) do
      if type(v) ~= "number" and type(v) ~= "string" and type(v) ~= "boolean" then
        fail("setting %s must be a number, string or boolean, got %s", tostring(k), type(v))
      end
    end
    if not (spec.skip and spec.skip(point)) then
      local key = M.key(spec, point)
      if not seen[key] then seen[key] = true; out[#out + 1] = point end
    end
  end
  -- columns: the settings that differ between points, the grid's order first
  local varies, columns = {}, {}
  for _, p in ipairs(out) do
    for k, v in pairs(p) do if v ~= out[1][k] then varies[k] = true end end
    for k in pairs(out[1]) do if p[k] == nil then varies[k] = true end end
  end
  for _, k in ipairs(spec.order or sys.sorted_keys(spec.grid or {})) do
    if varies[k] then columns[#columns + 1] = k; varies[k] = nil end
  end
  for _, k in ipairs(sys.sorted_keys(varies)) do columns[#columns + 1] = k end
  return out, columns
end

---------------------------------------------------------------------------------------------
-- running one point

-- A point's time limit in seconds (spec.timeout may be a function of the point).
function M.timeout(spec, point)
  local t = spec.timeout
  if type(t) == "function" then t = t(point) end
  if type(t) ~= "number" or t <= 0 then fail("timeout for %s: expected a positive number of seconds, got %s", M.key(spec, point), tostring(t)) end
  return t
end

-- The shell command line of a point (every piece quoted), its output going to log.
function M.command(spec, point, log)
  local exe = require("shard.tools.launch").shard_exe()
  local parts = { "env" }
  for _, k in ipairs(sys.sorted_keys(spec.env)) do
    if not tostring(k):match("^[%a_][%w_]*$") then fail("env: %s is not a variable name", tostring(k)) end
    parts[#parts + 1] = quote(k .. "=" .. value_text(spec.env[k]))
  end
  parts[#parts + 1] = "timeout -k 10 " .. quote(value_text(M.timeout(spec, point)))
  parts[#parts + 1] = quote(exe)
  if point.world > 1 then
    parts[#parts + 1] = "launch --nproc " .. quote(value_text(point.world))
  else
    parts[#parts + 1] = "run"
  end
  parts[#parts + 1] = quote(spec.target)
  for _, a in ipairs(M.args(point)) do parts[#parts + 1] = quote(a) end
  local cmd = table.concat(parts, " ")
  if log then cmd = cmd .. " >" .. quote(log) .. " 2>&1 </dev/null" end
  return cmd
end

local REDUCE = {
  last = function(t) return t[#t] end,
  median = require("shard.stats").median,
  mean = function(t) local s = 0; for _, v in ipairs(t) do s = s + v end; return #t > 0 and s / #t or nil end,
  max = function(t) local m; for _, v in ipairs(t) do if not m or v > m then m = v end end; return m end,
}

-- The metrics named in the spec, from a point's output. Returns the table and the names of
-- those not found.
function M.parse_metrics(spec, output, point)
  local json, log, plain = nil, {}, {}
  for line in output:gmatch("[^\n]+") do
    local body = line:match("^metrics (%b{})%s*$")
    local pname, pvalue = line:match("^([%a_][%w_%.]*) (%S+)%s*$")
    if pname and tonumber(pvalue) then plain[pname] = tonumber(pvalue) end
    if body then
      local ok, t = pcall(cjson.decode, body)
      if ok and type(t) == "table" then json = t end
    elseif line:match("^iter %d+ |") then
      for name, value in line:gmatch("| ([%w_%.]+) ([^|]-)%s*%f[|%z]") do
        local v = units.parse(value)   -- the progress line's figures: "12,780", "42.3%"
        if v then log[name] = log[name] or {}; table.insert(log[name], v) end
      end
    end
  end
  local out, missing = {}, {}
  for _, m in ipairs(spec.metrics) do
    local s = metric_spec(m)
    local v
    if s.fn then
      local ok, r = pcall(s.fn, output, point)
      if ok then v = r end
    else
      if json then
        v = json
        for part in s.name:gmatch("[^%.]+") do v = type(v) == "table" and v[part] or nil end
        if type(v) ~= "number" and type(v) ~= "string" then v = nil end
      end
      if v == nil and log[s.name] then
        local values, reduce = log[s.name], s.reduce or "last"
        if not REDUCE[reduce] then fail("metric %s: reduce must be last, median, mean or max, got %s", s.name, tostring(reduce)) end
        if reduce ~= "last" and #values > 1 then
          local rest = {}
          for i = 2, #values do rest[#rest + 1] = values[i] end
          values = rest
        end
        v = REDUCE[reduce](values)
      end
      if v == nil then v = plain[s.name] end
    end
    if v == nil then missing[#missing + 1] = s.name else out[s.name] = v end
  end
  return out, missing
end

local function read_file(path) return files.read_file(path) or "" end

local function last_lines(text, n)
  local lines = {}
  for line in text:gmatch("[^\n]+") do
    if line:match("%S") then lines[#lines + 1] = line end
  end
  local from = math.max(1, #lines - n + 1)
  return table.concat(lines, "\n", from)
end

local function sh(cmd)
  local p = io.popen(cmd)
  if not p then return nil end
  local s = p:read("*a")
  p:close()
  return s
end

local function mkdir_p(dir)
  local rc = os.execute("mkdir -p " .. quote(dir))
  if rc ~= 0 and rc ~= true then fail("cannot make directory %s", dir) end
end

local machine_cache, git_cache
function M.machine()
  if machine_cache then return machine_cache end
  local m = { host = (read_file("/proc/sys/kernel/hostname"):gsub("%s+$", "")) }
  local info = read_file("/proc/cpuinfo")
  m.cpu = info:match("model name%s*:%s*([^\n]+)")
  local n = 0
  for _ in info:gmatch("\nprocessor%s*:") do n = n + 1 end
  if info:match("^processor%s*:") then n = n + 1 end
  m.cpus = n
  m.os = read_file("/etc/os-release"):match('PRETTY_NAME="([^"\n]*)"')
  if rt.cuda_device_count() > 0 then
    local gpu = sh("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null") or ""
    m.gpu = gpu:match("[^\n]+")
    m.gpus = rt.cuda_device_count()
  end
  machine_cache = m
  return m
end

function M.git()
  if git_cache then return git_cache end
  local root = quote(rt.root)
  local rev = (sh("git -C " .. root .. " rev-parse --short=12 HEAD 2>/dev/null") or ""):match("%x+")
  if rev then
    local dirty = sh("git -C " .. root .. " status --porcelain --untracked-files=no 2>/dev/null") or ""
    if dirty:match("%S") then rev = rev .. "-dirty" end
  end
  git_cache = rev or "unknown"
  return git_cache
end

local function now()
  local t = require("shard.timer")
  return t.now()
end

-- Runs one point; returns its record (not yet written).
function M.run_point(spec, point, log)
  local cmd = M.command(spec, point, log)
  local t0 = now()
  local _, rc = rt.shell(cmd)
  local seconds = now() - t0
  local output = read_file(log)
  local rec = { sweep = spec.name, key = M.key(spec, point), point = point, seconds = seconds, exit = rc,
                command = M.command(spec, point), log = log, git = M.git(), machine = M.machine(),
                date = os.date("!%Y-%m-%dT%H:%M:%SZ") }
  if rc == 124 or rc == 137 then
    rec.status = "timeout"
    rec.error = ("timed out after %s s"):format(value_text(M.timeout(spec, point)))
  elseif rc ~= 0 then
    rec.status = "failed"
    rec.error = ("exit %d: %s"):format(rc, last_lines(output, 3))
  else
    rec.status = "ok"
  end
  local metrics, missing = M.parse_metrics(spec, output, point)
  rec.metrics = metrics
  if #missing > 0 then rec.missing = missing end
  return rec
end

---------------------------------------------------------------------------------------------
-- results

-- Every record of a JSONL file (a torn last line, from a sweep killed mid-write, is skipped).
function M.read_results(path)
  local out = {}
  local f = io.open(path, "r")
  if not f then return out end
  for line in f:lines() do
    local ok, rec = pcall(cjson.decode, line)
    if ok and type(rec) == "table" and rec.key then out[#out + 1] = rec end
  end
  f:close()
  return out
end

-- One JSON line; paths keep their slashes (cjson writes "\/", which JSON allows but nobody
-- reads well; an escaped backslash before a slash stays "\\" + "/").
local function json_line(rec) return (cjson.encode(rec):gsub("\\/", "/")) end

function M.append(path, rec)
  local f = io.open(path, "a")
  if not f then fail("cannot append to %s", path) end
  f:write(json_line(rec), "\n")
  f:close()
end

-- The latest record per key.
local function latest(records)
  local by = {}
  for _, r in ipairs(records) do by[r.key] = r end
  return by
end

local function is_bytes(name) return name:match("bytes") ~= nil end
local function is_fraction(name) return name == "mfu" end

local function label(name)
  if is_bytes(name) then return name .. " (MiB)" end
  if is_fraction(name) then return name .. " (%)" end
  return name
end

-- A metric in the Markdown table (shard.units): bytes in MiB and MFU in percent (their
-- columns name the unit), whole and large numbers as counts, others to 4 significant digits.
local function format_value(name, v, fmt)
  if type(v) ~= "number" then return v == nil and "" or tostring(v) end
  if fmt then return fmt:format(v) end
  if is_bytes(name) then return units.mib(v) end
  if is_fraction(name) then return units.fixed(100 * v, 1) end
  if v == math.floor(v) or math.abs(v) >= 100 then return units.count(v) end
  return ("%.4g"):format(v)
end

local estimate_cache = {}
local ESTIMATE_DEFAULTS = { n_layer = 12, n_head = 12, n_embd = 768, vocab_size = 50304, block_size = 1024, bias = true,
                            world = 1, strategy = "full_shard", hybrid_group = 0, batch_size = 1, param = "f32" }
-- shard estimate's predicted peak for a point (nil when the spec has no estimate or it fails).
function M.estimate(spec, point)
  if not spec.estimate then return nil end
  local ok, o = pcall(spec.estimate, point)
  if not ok or type(o) ~= "table" then return nil end
  local opts = {}
  for k, v in pairs(ESTIMATE_DEFAULTS) do opts[k] = v end
  for k, v in pairs(o) do opts[k] = v end
  local key = cjson.encode(opts)
  if estimate_cache[key] == nil then
    local ok2, r = pcall(require("shard.tools.estimate").estimate, opts)
    estimate_cache[key] = ok2 and r.total or false
  end
  return estimate_cache[key] or nil
end

-- The table's rows, in the sweep's order: { point, record, estimate }.
local function rows(spec, points, records)
  local by = latest(records)
  local out = {}
  for _, p in ipairs(points) do
    local r = by[M.key(spec, p)]
    if r then out[#out + 1] = { point = p, record = r, estimate = r.status ~= nil and M.estimate(spec, p) or nil } end
  end
  return out
end

local function csv_field(s)
  s = tostring(s)
  if s:find('[,"\n\r]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

-- Markdown and CSV text of the results for these points.
function M.tables(spec, points, columns, records)
  local metrics = {}
  for _, m in ipairs(spec.metrics) do metrics[#metrics + 1] = metric_spec(m) end
  local list = rows(spec, points, records)
  local est = spec.estimate ~= nil
  local head, chead = {}, {}
  for _, c in ipairs(columns) do head[#head + 1] = c; chead[#chead + 1] = c end
  head[#head + 1] = "status"; chead[#chead + 1] = "status"
  for _, m in ipairs(metrics) do head[#head + 1] = m.label or label(m.name); chead[#chead + 1] = m.name end
  if est then head[#head + 1] = "estimate (MiB)"; chead[#chead + 1] = "estimate_bytes" end
  chead[#chead + 1] = "seconds"; chead[#chead + 1] = "error"
  local md = { "| " .. table.concat(head, " | ") .. " |" }
  local sep = {}
  for i = 1, #head do sep[i] = i <= #columns + 1 and "---" or "---:" end
  md[2] = "|" .. table.concat(sep, "|") .. "|"
  local csv = { table.concat(chead, ",") }
  for _, row in ipairs(list) do
    local r, cells, ccells = row.record, {}, {}
    for _, c in ipairs(columns) do
      cells[#cells + 1] = value_text(row.point[c] == nil and "" or row.point[c])
      ccells[#ccells + 1] = csv_field(value_text(row.point[c] == nil and "" or row.point[c]))
    end
    local status = r.status
    if r.error then
      local short = (r.error:gsub("\n.*", "")):gsub("|", "\\|")
      if #short > 60 then short = short:sub(1, 57) .. "..." end
      status = status .. ": " .. short
    end
    cells[#cells + 1] = status
    ccells[#ccells + 1] = r.status
    for _, m in ipairs(metrics) do
      local v = r.metrics and r.metrics[m.name]
      cells[#cells + 1] = format_value(m.name, v, m.format)
      ccells[#ccells + 1] = csv_field(v == nil and "" or value_text(v))
    end
    if est then
      cells[#cells + 1] = row.estimate and units.mib(row.estimate) or ""
      ccells[#ccells + 1] = row.estimate and ("%d"):format(row.estimate) or ""
    end
    ccells[#ccells + 1] = ("%.2f"):format(r.seconds or 0)
    ccells[#ccells + 1] = csv_field(r.error or "")
    md[#md + 1] = "| " .. table.concat(cells, " | ") .. " |"
    csv[#csv + 1] = table.concat(ccells, ",")
  end
  return table.concat(md, "\n") .. "\n", table.concat(csv, "\n") .. "\n"
end

---------------------------------------------------------------------------------------------
-- plots

function M.have_gnuplot() return rt.have_command("gnuplot") end

local function gp_string(s) return "'" .. tostring(s):gsub("'", "''") .. "'" end

-- Writes one PNG per plot spec through gnuplot; returns the paths written.
function M.plots(spec, points, records, dir)
  if #spec.plots == 0 then return {} end
  if not M.have_gnuplot() then
    print("sweep: plots skipped: gnuplot is not installed (make deps installs it)")
    return {}
  end
  local written = {}
  for i, plot in ipairs(spec.plots) do
    local x, y, by = plot.x or "world", plot.y, plot.by
    if type(y) ~= "string" then fail("plot %d needs y = METRIC", i) end
    local file = plot.file or (y .. (by and ("_by_" .. by) or "") .. ".png")
    local png = dir .. "/" .. file
    -- series name -> list of { x, y, estimate }
    local series, names = {}, {}
    for _, row in ipairs(rows(spec, points, records)) do
      local r = row.record
      local xv, yv = row.point[x], r.metrics and r.metrics[y]
      if r.status == "ok" and type(xv) == "number" and type(yv) == "number" then
        local name = by and value_text(row.point[by]) or y
        if not series[name] then series[name] = {}; names[#names + 1] = name end
        local scale = is_bytes(y) and 2 ^ 20 or is_fraction(y) and 0.01 or 1   -- the axis's unit (label)
        table.insert(series[name], { xv, yv / scale, row.estimate and row.estimate / scale or nil })
      end
    end
    if #names > 0 then
      local data = png:gsub("%.png$", "") .. ".dat"
      local f = assert(io.open(data, "w"))
      local xs, seen = {}, {}
      for si, name in ipairs(names) do
        table.sort(series[name], function(a, b) return a[1] < b[1] end)
        f:write(("# %s\n"):format(name))
        for _, pt in ipairs(series[name]) do
          f:write(("%.17g %.17g %s\n"):format(pt[1], pt[2], pt[3] and ("%.17g"):format(pt[3]) or "NaN"))
          if not seen[pt[1]] then seen[pt[1]] = true; xs[#xs + 1] = pt[1] end
        end
        if si < #names then f:write("\n\n") end
      end
      f:close()
      table.sort(xs)
      local tics = {}
      for _, v in ipairs(xs) do tics[#tics + 1] = value_text(v) end
      local lines = {
        "set terminal pngcairo size 900,540 noenhanced font ',11'",
        "set output " .. gp_string(png),
        "set title " .. gp_string(plot.title or (spec.name .. ": " .. label(y) .. " against " .. x)),
        "set xlabel " .. gp_string(plot.xlabel or x),
        "set ylabel " .. gp_string(plot.ylabel or label(y)),
        "set xtics (" .. table.concat(tics, ", ") .. ")",
        "set grid", "set key outside right top", "set yrange [0:*]",
        "set offsets 0.2, 0.2, 0, 0",
      }
      local cmds = {}
      for si, name in ipairs(names) do
        cmds[#cmds + 1] = ("%s index %d using 1:2 with linespoints lw 2 pt 7 lc %d title %s"):format(
          gp_string(data), si - 1, si, gp_string(name))
        if plot.estimate then
          cmds[#cmds + 1] = ("%s index %d using 1:3 with linespoints dt 2 pt 4 lc %d title %s"):format(
            gp_string(data), si - 1, si, gp_string(name .. " (estimate)"))
        end
      end
      lines[#lines + 1] = "plot " .. table.concat(cmds, ", \\\n     ")
      local script = png:gsub("%.png$", "") .. ".gp"
      f = assert(io.open(script, "w"))
      f:write(table.concat(lines, "\n"), "\n")
      f:close()
      local err, status = rt.shell("gnuplot " .. quote(script))
      if status == 0 then
        written[#written + 1] = png
      else
        print(("sweep: gnuplot failed on %s: %s"):format(script, last_lines(err, 4)))
      end
    end
  end
  return written
end

---------------------------------------------------------------------------------------------
-- the command

local function describe_point(point, columns)
  local parts = {}
  for _, c in ipairs(columns) do parts[#parts + 1] = c .. "=" .. value_text(point[c] == nil and "-" or point[c]) end
  if #parts == 0 then parts[1] = "(one point)" end
  return table.concat(parts, " ")
end

local OPTIONS = { { "out", "string" }, { "retry-failed", "flag" }, { "force", "flag" }, { "report", "flag" },
                  { "dry-run", "flag" } }

function M.parse_args(args)
  local o, files = argv.parse(args, { options = OPTIONS, help = USAGE, prefix = "sweep: ", suffix = "\n" .. USAGE })
  if #files > 1 then error({ usage = "sweep: one sweep file at a time, got " .. table.concat(files, " and ") .. "\n" .. USAGE }, 0) end
  o.file = files[1]
  if not o.file then error({ usage = "sweep: missing FILE.lua\n" .. USAGE }, 0) end
  return o
end

function M.main(args)
  local o = M.parse_args(args)
  local f, err = io.open(o.file, "r")
  if not f then error({ usage = "sweep: cannot open " .. tostring(err) }, 0) end   -- a wrong command line: exit 2
  f:close()
  local spec = M.load(o.file)
  if o.out then spec.out = o.out end
  local points, columns = M.points(spec)
  local out = spec.out
  local results = out .. "/results.jsonl"
  if o.dry_run then
    for i, p in ipairs(points) do print(("[%d/%d] %s"):format(i, #points, M.command(spec, p))) end
    return 0
  end
  mkdir_p(out .. "/logs")
  local records = M.read_results(results)
  if not o.report then
    local done = latest(records)
    local pending = {}
    for i, p in ipairs(points) do
      local r = done[M.key(spec, p)]
      if o.force or not r or (o.retry_failed and r.status ~= "ok") then pending[#pending + 1] = { index = i, point = p } end
    end
    local skipped = #points - #pending
    print(("sweep %s: %d points, %d done before, %d to run -> %s"):format(spec.name, #points, skipped, #pending, results))
    io.stdout:flush()
    local t0, spent, failed = now(), 0, 0
    for n, job in ipairs(pending) do
      local p = job.point
      local slug = describe_point(p, columns):gsub("[^%w_=%.%-]+", "_"):sub(1, 80)
      local log = ("%s/logs/%03d-%s.log"):format(out, job.index, slug)
      local rec = M.run_point(spec, p, log)
      if rec.exit == 130 then   -- Ctrl-C (SIGINT): the point is not done; stop here, unrecorded
        print(("[%d/%d] %s: interrupted; stopping (a rerun starts here)"):format(skipped + n, #points, describe_point(p, columns)))
        break
      end
      M.append(results, rec)
      records[#records + 1] = rec
      spent = spent + rec.seconds
      if rec.status ~= "ok" then failed = failed + 1 end
      local left = #pending - n
      local eta = left > 0 and (", ~" .. units.time(spent / n * left) .. " left") or ""
      local what = rec.status == "ok" and "ok" or (rec.status .. " (" .. (rec.error:gsub("\n.*", "")) .. ")")
      print(("[%d/%d] %s: %s in %s | %d/%d done, %d failed, elapsed %s%s"):format(
        skipped + n, #points, describe_point(p, columns), what, units.time(rec.seconds), skipped + n, #points, failed,
        units.time(now() - t0), eta))
      io.stdout:flush()
    end
  end
  local md, csv = M.tables(spec, points, columns, records)
  local f = assert(io.open(out .. "/table.md", "w")); f:write(md); f:close()
  f = assert(io.open(out .. "/table.csv", "w")); f:write(csv); f:close()
  print("")
  io.write(md)
  print(("\ntable: %s/table.md, %s/table.csv"):format(out, out))
  for _, png in ipairs(M.plots(spec, points, records, out)) do print("plot: " .. png) end
  return 0
end

return M
