-- shard.straggler: names a rank that is slower than the others long before a collective
-- times out.
--   local watch = straggler.new{ group = g, margin = 0.25, windows = 3 }
--   local warnings = watch:observe(steps, seconds, waited)   -- every rank, same steps
-- Under data parallelism every rank's step takes as long as the slowest one's: the others
-- wait for it inside the collectives. What differs is each rank's own work, the step time
-- minus the time blocked in collectives (shard.comm.wait_seconds), and that is what is
-- compared: once per window, with one all-reduce of one number per rank. A rank whose own
-- work exceeds the median of the other ranks' by more than `margin` for `windows` windows in
-- a row is named, with how much slower it was over those windows; it is named again only
-- after it recovered. (The others' median, not everyone's: at world 2 the median of both
-- would sit halfway to the straggler.)
local tensor = require("shard.tensor")
local median = require("shard.stats").median

local Watch = {}
Watch.__index = Watch

local M = {}

function M.new(opts)
  local group = assert(opts.group, "straggler.new: group is required")
  local margin, windows = opts.margin or 0.25, opts.windows or 3
  if not (margin > 0) then error(("straggler: margin %s must be positive"):format(tostring(margin)), 2) end
  if windows < 1 or windows % 1 ~= 0 then error(("straggler: windows %s must be a whole number >= 1"):format(tostring(windows)), 2) end
  local world = group:size()
  local self = setmetatable({ group = group, margin = margin, windows = windows, world = world,
                              rank = group:rank() }, Watch)
  self.slow_for, self.own_sum, self.median_sum, self.steps_sum, self.named = {}, {}, {}, {}, {}
  for r = 0, world - 1 do self:forget(r) end
  return self
end

function Watch:forget(r)
  self.slow_for[r], self.own_sum[r], self.median_sum[r], self.steps_sum[r], self.named[r] = 0, 0, 0, 0, false
end

-- Every rank's own work per step over the window, in rank order.
function Watch:gather(per_step)
  local t = tensor.zeros({ self.world }, { dtype = "f64", device = "cpu" })
  t:set({ self.rank + 1 }, per_step)
  self.group:all_reduce(t, "sum")
  local values = {}
  for r = 1, self.world do values[r] = t:get({ r }) end
  t:free()
  return values
end

-- One window of `steps` steps that took `seconds`, of which `waited` blocked in collectives.
-- Collective: every rank calls it at the same step. Returns the warnings (the same on every
-- rank), empty when no rank stands out.
function Watch:observe(steps, seconds, waited)
  if self.world < 2 or steps < 1 then return {} end
  local own = self:gather(math.max(seconds - waited, 0) / steps)
  local warnings = {}
  for r = 0, self.world - 1 do
    local v, others = own[r + 1], {}
    for q = 1, self.world do if q ~= r + 1 then others[#others + 1] = own[q] end end
    local mid = median(others)
    if mid > 0 and v > mid * (1 + self.margin) then
      self.slow_for[r] = self.slow_for[r] + 1
      self.own_sum[r] = self.own_sum[r] + v * steps
      self.median_sum[r] = self.median_sum[r] + mid * steps
      self.steps_sum[r] = self.steps_sum[r] + steps
      if self.slow_for[r] >= self.windows and not self.named[r] then
        self.named[r] = true
        warnings[#warnings + 1] = ("rank %d is %d%% slower than the median of the other ranks over the last %d steps (its own work, collective waits excluded)")
          :format(r, math.floor(100 * (self.own_sum[r] / self.median_sum[r] - 1) + 0.5), self.steps_sum[r])
      end
    else
      self:forget(r)
    end
  end
  return warnings
end

return M
