-- shard sweep end to end on a tiny stand-in recipe (it logs, prints a metrics line, fails or
-- hangs as its --mode says): the JSONL records, the rerun that skips done points, a failing
-- and a timed-out point recorded while the sweep goes on, the table and CSV, the PNG; and the
-- metric parser on its own.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local cjson = require("cjson")
local sweep = require("shard.tools.sweep")

local DIR = os.tmpname()
os.remove(DIR)
os.execute("mkdir -p " .. support.quote(DIR))
local OUT = DIR .. "/out"
local INJECTED = DIR .. "/injected"

local function write(path, text)
  local f = assert(io.open(path, "w")); f:write(text); f:close()
end
local function read(path)
  local f = io.open(path); if not f then return nil end
  local s = f:read("*a"); f:close(); return s
end
local function records()
  local t = {}
  for line in (read(OUT .. "/results.jsonl") or ""):gmatch("[^\n]+") do t[#t + 1] = cjson.decode(line) end
  return t
end

write(DIR .. "/tiny.lua", [[
-- a stand-in recipe for the sweep spec
local shard = require("shard")
local cfg = shard.config{ mode = "ok", speed = 100, note = "" }
local env = shard.init{ device = "cpu" }
if cfg.mode == "fail" then error("this point fails on purpose", 0) end
if cfg.mode == "hang" then os.execute("sleep 60") end
for i = 0, 3 do shard.log(i, { loss = 1 / (i + 1), tokens_per_s = i == 0 and 1 or cfg.speed + i }) end
if env.rank == 0 then print(('metrics {"peak_bytes": %d, "inner": {"x": 7}}'):format(1048576 * env.world)) end
]])

-- four points: two that work (one through shard launch at world 2), one that fails, one that
-- hangs past its time limit; the note carries shell syntax that must stay text
write(DIR .. "/tiny_sweep.lua", ([[
return {
  name = "tiny",
  recipe = %q,
  out = %q,
  settings = { note = "$(touch %s)" },
  points = { { mode = "ok", speed = 100 }, { mode = "ok", speed = 200, world = 2 },
             { mode = "fail" }, { mode = "hang" } },
  timeout = function(p) return p.mode == "hang" and 2 or 60 end,
  metrics = { { "tokens_per_s", reduce = "median" }, "loss", "peak_bytes", "inner.x" },
  plots = { { x = "world", y = "tokens_per_s", file = "tps.png" } },
}
]]):format(DIR .. "/tiny.lua", OUT, INJECTED))

describe("shard sweep", function()
  local first, rc1, secs = support.shard("sweep " .. support.quote(DIR .. "/tiny_sweep.lua"))
  local first_records = records()

  it("runs every point, each as its own process, and goes on past a failure and a timeout", function()
    assert.equal(0, rc1, first)
    assert.equal(4, #first_records, first)
    local by = {}
    for _, r in ipairs(first_records) do by[r.point.mode .. (r.point.world or 1)] = r end
    assert.equal("ok", by.ok1.status, first)
    assert.equal("ok", by.ok2.status, first)
    assert.equal("failed", by.fail1.status)
    assert.is_truthy(by.fail1.error:find("this point fails on purpose", 1, true), by.fail1.error)
    assert.equal("timeout", by.hang1.status)
    assert.equal("timed out after 2 s", by.hang1.error)
    assert.is_true(by.hang1.seconds < 20, "the hung point was stopped at its limit")
    assert.is_true(secs < 40)
  end)

  it("records the settings, metrics, git revision, machine and date of each point", function()
    local r = first_records[1]
    assert.equal("tiny", r.sweep)
    assert.equal(100, r.point.speed)
    assert.equal(1, r.point.world)
    assert.equal(102, r.metrics.tokens_per_s)          -- median of 101, 102, 103: the first window left out
    assert.equal(0.25, r.metrics.loss)                 -- the last logged value
    assert.equal(1048576, r.metrics.peak_bytes)        -- from the metrics line
    assert.equal(7, r.metrics["inner.x"])
    assert.equal(2 * 1048576, first_records[2].metrics.peak_bytes, "world 2 ran through shard launch")
    assert.is_truthy(r.git:match("^%x+"), r.git)
    assert.is_string(r.machine.host)
    assert.is_number(r.machine.cpus)
    assert.is_truthy(r.date:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"), r.date)
    -- paths keep their slashes: no "\/" in the file, the same values read back
    local text = read(OUT .. "/results.jsonl")
    assert.is_nil(text:find("\\/"), text)
    assert.is_truthy(text:find(DIR .. "/tiny.lua", 1, true), text)
    assert.equal(DIR .. "/tiny.lua", r.key:match("^%S+"))
  end)

  it("prints a progress line with points done, elapsed time and what is left", function()
    assert.is_truthy(first:find("[1/4] ", 1, true), first)
    -- times in shard.units' format: "1.23 s", "2.1 min"
    assert.is_truthy(first:match("%[2/4%][^\n]-: ok in %d+%.%d+ %a+ | 2/4 done, 0 failed, elapsed %d+%.%d+ %a+, ~%d+%.%d+ %a+ left"), first)
    assert.is_truthy(first:match("%[4/4%].-4/4 done, 2 failed, elapsed %d+%.%d+ %a+\n"), first)
  end)

  it("never hands a setting to a shell: $(...) reaches the recipe as text", function()
    assert.is_nil(io.open(INJECTED))
    assert.is_truthy(first_records[1].point.note:find("$(touch", 1, true))
  end)

  it("writes the Markdown table and the CSV", function()
    local md = read(OUT .. "/table.md")
    local lines = {}
    for l in md:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(6, #lines, md)
    assert.equal("| mode | speed | world | status | tokens_per_s | loss | peak_bytes (MiB) | inner.x |", lines[1])
    assert.equal("| ok | 100 | 1 | ok | 102 | 0.25 | 1.0 | 7 |", lines[3])
    assert.equal("| ok | 200 | 2 | ok | 202 | 0.25 | 2.0 | 7 |", lines[4])
    assert.is_truthy(lines[5]:find("| fail |  |", 1, true), lines[5])   -- the settings it did not set stay empty
    assert.is_truthy(lines[5]:find("| failed: exit 1: this point fails on purpose |", 1, true), lines[5])
    assert.is_truthy(lines[6]:find("| timeout: timed out after 2 s |", 1, true), lines[6])
    local csv = read(OUT .. "/table.csv")
    local rows = {}
    for l in csv:gmatch("[^\n]+") do rows[#rows + 1] = l end
    assert.equal(5, #rows, csv)
    assert.equal("mode,speed,world,status,tokens_per_s,loss,peak_bytes,inner.x,seconds,error", rows[1])
    assert.is_truthy(rows[2]:match("^ok,100,1,ok,102,0.25,1048576,7,[%d%.]+,$"), rows[2])
    assert.is_truthy(rows[5]:match("^hang,,1,timeout,,,,,[%d%.]+,timed out after 2 s$"), rows[5])
  end)

  it("draws the plot as a PNG (gnuplot comes with make deps, which make test runs)", function()
    assert.is_true(sweep.have_gnuplot(), "gnuplot is not installed: make deps installs gnuplot-nox")
    local png = read(OUT .. "/tps.png")
    assert.is_truthy(png and png:sub(1, 8) == "\137PNG\r\n\26\n", "tps.png is a PNG")
    assert.is_truthy(first:find("plot: " .. OUT .. "/tps.png", 1, true), first)
  end)

  it("skips the points already done on a rerun; --retry-failed runs the failed ones again", function()
    local out, rc = support.shard("sweep " .. support.quote(DIR .. "/tiny_sweep.lua"))
    assert.equal(0, rc, out)
    assert.is_truthy(out:find("4 points, 4 done before, 0 to run", 1, true), out)
    assert.equal(4, #records())
    assert.is_truthy(read(OUT .. "/table.md"):find("| ok | 100 | 1 | ok | 102 |", 1, true))
    -- the hung point would cost its limit again: leave only the failing one undone
    out, rc = support.shard("sweep --retry-failed " .. support.quote(DIR .. "/tiny_sweep.lua") .. " --dry-run")
    assert.equal(0, rc, out)
    assert.is_truthy(out:find("[4/4] env timeout -k 10 '2' ", 1, true), out)   -- prints, runs nothing
    local recs = records()
    local keep = {}
    for _, r in ipairs(recs) do if r.point.mode ~= "hang" then keep[#keep + 1] = cjson.encode(r) end end
    local f = assert(io.open(OUT .. "/results.jsonl", "w"))
    f:write(table.concat(keep, "\n"), "\n", '{"key": "torn')     -- a torn last line is ignored
    f:close()
    out, rc = support.shard("sweep --retry-failed " .. support.quote(DIR .. "/tiny_sweep.lua"))
    assert.equal(0, rc, out)
    assert.is_truthy(out:find("4 points, 2 done before, 2 to run", 1, true), out)
  end)

  it("refuses a sweep file without a target or with a bad grid, saying what is wrong", function()
    local bad = DIR .. "/bad.lua"
    write(bad, "return { grid = { world = { 1 } } }")
    local out, rc = support.shard("sweep " .. support.quote(bad))
    assert.equal(1, rc)
    assert.is_truthy(out:find("name one of recipe = FILE or bench = NAME", 1, true), out)
    write(bad, ("return { recipe = %q, grid = { world = 2 } }"):format(DIR .. "/tiny.lua"))
    out, rc = support.shard("sweep " .. support.quote(bad))
    assert.equal(1, rc)
    assert.is_truthy(out:find("grid.world must be a non-empty list", 1, true), out)
    out, rc = support.shard("sweep")
    assert.equal(2, rc)
    assert.is_truthy(out:find("missing FILE.lua", 1, true), out)
  end)
end)

describe("shard.tools.sweep", function()
  local spec = { recipe = "r.lua", settings = {}, metrics = { { "tokens_per_s", reduce = "median" }, "loss", "a.b", "nope" } }

  it("reads metrics from the metrics line first, then the log lines", function()
    local out = table.concat({
      "iter 0 | loss 4.0000 | tokens_per_s 10",
      "iter 5 | loss 3.0000 | tokens_per_s 1.000e+04",
      "iter 10 | loss 2.5000 | tokens_per_s 3.000e+04",
      'metrics {"loss": 9, "a": {"b": 3}}',
      "memory (rank 0): whatever",
    }, "\n")
    local m, missing = sweep.parse_metrics(spec, out, {})
    assert.equal(2e4, m.tokens_per_s)
    -- the training loop's progress line (shard.units): thousands separators, MFU in percent
    local s2 = { recipe = "r.lua", settings = {}, metrics = { { "tokens_per_s", reduce = "median" }, "mfu", "peak_mib" } }
    local m2 = sweep.parse_metrics(s2, table.concat({
      "iter 0 | loss 4.1000 | tokens_per_s 912 | lr 1.00e-03 | mfu 1.5% | peak_mib 39.5",
      "iter 50 | loss 2.5012 | tokens_per_s 12,780 | lr 5.05e-04 | mfu 42.3% | peak_mib 41.5",
      "iter 99 | loss 2.4012 | tokens_per_s 12,990 | lr 1.00e-04 | mfu 43.1% | peak_mib 41.5",
    }, "\n"), {})
    assert.equal(12885, m2.tokens_per_s)
    assert.equal(0.431, m2.mfu)
    assert.equal(41.5, m2.peak_mib)
    assert.equal(9, m.loss)
    assert.equal(3, m["a.b"])
    assert.same({ "nope" }, missing)
  end)

  it("expands a grid in its order, less the skipped points, and names the settings that vary", function()
    local s = { recipe = "r.lua", settings = { max_iters = 5 }, grid = { s = { "a", "b" }, world = { 1, 2 } },
                order = { "s", "world" }, skip = function(p) return p.s == "b" and p.world == 2 end }
    local points, columns = sweep.points(s)
    assert.equal(3, #points)
    assert.same({ "s", "world" }, columns)
    assert.same({ s = "a", world = 2, max_iters = 5 }, points[2])
    assert.equal("r.lua world=2 --max_iters=5 --s=a", sweep.key(s, points[2]))
  end)

end)
