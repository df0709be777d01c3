-- shard.profile: where a step's time goes, per differentiable op, forward and backward.
--   shard.profile.start(); ...steps...; print(shard.profile.report()); shard.profile.stop()
-- Wall time around each op of shard.functional (and the tensor methods that are those ops)
-- and around each recorded backward; ops run synchronously on the CPU, so the times add up.
local timer = require "shard.timer"
local F = require "shard.functional"
local A = require "shard.autograd"
local tensor = require "shard.tensor"
local Tensor = tensor.Tensor

local P = { stats = {} }
local saved_F, saved_T, saved_record

local function stat(name)
  local s = P.stats[name]
  if not s then s = { calls = 0, fwd = 0, bwd = 0, bwd_calls = 0 }; P.stats[name] = s end
  return s
end

local function timed(name, fn)
  return function(...)
    local t0 = timer.now()
    local a, b, c = fn(...)
    local s = stat(name)
    s.calls, s.fwd = s.calls + 1, s.fwd + timer.now() - t0
    return a, b, c
  end
end

function P.start()
  if saved_F then return end
  P.stats, saved_F, saved_T = {}, {}, {}
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
    local s = stat(name or "?")
    local bw = function(node, g)
      local t0 = timer.now()
      local r = backward(node, g)
      s.bwd, s.bwd_calls = s.bwd + timer.now() - t0, s.bwd_calls + 1
      return r
    end
    return saved_record(out, inputs, bw, saved, name)
  end
end

function P.stop()
  if not saved_F then return end
  for name, fn in pairs(saved_F) do F[name] = fn end
  for name, fn in pairs(saved_T) do Tensor[name] = fn end
  A.record = saved_record
  saved_F, saved_T, saved_record = nil, nil, nil
end

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
