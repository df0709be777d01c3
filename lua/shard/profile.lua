-- shard.profile: where a step's time goes, per differentiable op, forward and backward.
--   shard.profile.start(); ...steps...; print(shard.profile.report()); shard.profile.stop()
-- Wall time around each op of shard.functional (and the tensor methods that are those ops)
-- and around each recorded backward; ops run synchronously on the CPU, so the times add up.
local timer = require("shard.timer")
local F = require("shard.functional")
local A = require("shard.autograd")
local tensor = require("shard.tensor")
local Tensor = tensor.Tensor

local P = { stats = {} }
local saved_F, saved_T, saved_record
-- Who hears of each timed op: fn(name, "fwd" | "bwd", t0, t1), called as the op returns
-- (so an op's span comes after those of the ops it called), and before(name, phase) if given,
-- called as it starts (shard.trace records CUDA events there). The stats are one of them;
-- shard.trace adds another.
local observers, befores = {}, {}

local function notify(name, phase, t0, t1)
  for i = 1, #observers do observers[i](name, phase, t0, t1) end
end

local function starting(name, phase)
  for _, b in pairs(befores) do b(name, phase) end
end

local function stat(name)
  local s = P.stats[name]
  if not s then s = { calls = 0, fwd = 0, bwd = 0, bwd_calls = 0 }; P.stats[name] = s end
  return s
end

local function count(name, phase, t0, t1)
  local s = stat(name)
  if phase == "fwd" then s.calls, s.fwd = s.calls + 1, s.fwd + t1 - t0
  else s.bwd, s.bwd_calls = s.bwd + t1 - t0, s.bwd_calls + 1 end
end

local function timed(name, fn)
  return function(...)
    starting(name, "fwd")
    local t0 = timer.now()
    local a, b, c = fn(...)
    notify(name, "fwd", t0, timer.now())
    return a, b, c
  end
end

local function install()
  saved_F, saved_T = {}, {}
  for name, fn in pairs(F) do
    if type(fn) == "function" then saved_F[name] = fn; F[name] = timed(name, fn) end
  end
  for name, fn in pairs(Tensor) do
    for fname, ffn in pairs(saved_F) do
      if fn == ffn then saved_T[name] = fn; Tensor[name] = timed(fname, fn) end
    end
  end
  saved_record = A.record
  A.record = function(out, inputs, backward, saved, name)
    name = name or "?"
    local bw = function(node, g)
      starting(name, "bwd")
      local t0 = timer.now()
      local r = backward(node, g)
      notify(name, "bwd", t0, timer.now())
      return r
    end
    return saved_record(out, inputs, bw, saved, name)
  end
end

local function uninstall()
  for name, fn in pairs(saved_F) do F[name] = fn end
  for name, fn in pairs(saved_T) do Tensor[name] = fn end
  A.record = saved_record
  saved_F, saved_T, saved_record = nil, nil, nil
end

-- Adds an observer (the ops are wrapped while any is there); unwatch removes it.
function P.watch(fn, before)
  for _, o in ipairs(observers) do if o == fn then return end end
  observers[#observers + 1] = fn
  befores[fn] = before
  if not saved_F then install() end
end

function P.unwatch(fn)
  befores[fn] = nil
  for i, o in ipairs(observers) do if o == fn then table.remove(observers, i); break end end
  if #observers == 0 and saved_F then uninstall() end
end

function P.start()
  for _, o in ipairs(observers) do if o == count then return end end
  P.stats = {}
  P.watch(count)
end

function P.stop() P.unwatch(count) end

-- A table sorted by total time: op, calls, forward ms, backward ms, share of the total.
function P.report()
  local rows, total = {}, 0
  for name, s in pairs(P.stats) do
    rows[#rows + 1] = { name = name, s = s, t = s.fwd + s.bwd }
    total = total + s.fwd + s.bwd
  end
  table.sort(rows, function(a, b) return a.t > b.t end)
  local lines = { ("%-18s %8s %12s %12s %7s"):format("op", "calls", "forward ms", "backward ms", "share") }
  for _, r in ipairs(rows) do
    lines[#lines + 1] = ("%-18s %8d %12.2f %12.2f %6.1f%%"):format(r.name, r.s.calls, r.s.fwd * 1e3, r.s.bwd * 1e3,
      total > 0 and 100 * r.t / total or 0)
  end
  lines[#lines + 1] = ("%-18s %8s %12.2f ms in ops"):format("total", "", total * 1e3)
  return table.concat(lines, "\n")
end

return P
