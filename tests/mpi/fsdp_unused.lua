-- A unit used on some ranks only (issue 19, item 2): a two-Linear model whose second Linear
-- (its own unit) runs on rank 0 only. Before, a 2-rank full_shard run aborted inside MPI
-- (MPI_ERR_TRUNCATE) naming nothing of ours. With check_schedule (by default in the first two
-- steps, with check_schedule = true in every step) every rank stops at once
-- with an error naming the unit, the ranks that ran it and those that did not, and the step;
-- first at step 1, then at step 3 after two steps where every rank ran it (the forward order
-- recorded and prefetching). Where every rank runs both units, check_schedule training
-- matches one process on the global batch (parameters, 1e-5).
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim = shard.fsdp, shard.nn, shard.optim
local rank, size = env.rank, env.world
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end

local Two = nn.Module:extend("Two")
function Two:init()
  shard.manual_seed(11)
  self:child("l1", nn.Linear(8, 8))
  self:child("l2", nn.Linear(8, 8))
  self.use_l2 = true
end
function Two:forward(x)
  local y = self.l1(x)
  if self.use_l2 then y = self.l2(y) end
  return y:sum()
end

local B = 2
local function batch(step)
  shard.manual_seed(70 + step)
  return shard.rand({ B * size, 8 })
end
local function rows(t, r) return t:narrow(1, r * B + 1, B):contiguous() end

-- every rank runs both units: the same parameters as one process
local ref = Two()
local ref_opt = optim.AdamW(ref, { lr = 1e-2 })
for step = 1, 3 do
  local g = batch(step)
  for r = 0, size - 1 do
    local x = rows(g, r)
    local l = ref(x) / size; l:backward(); l:free(); x:free()
  end
  ref_opt:step(); ref_opt:zero_grad(true); g:free()
end
local want = {}
for _, np in ipairs(ref:named_parameters()) do want[np.name] = np.tensor:tolist_flat() end

local model = fsdp.wrap(Two(), { policy = fsdp.policy.transformer{ nn.Linear }, check_schedule = true })
local opt = optim.AdamW(model, { lr = 1e-2 })
for step = 1, 3 do
  local g = batch(step); local x = rows(g, rank)
  local l = model(x); l:backward(); opt:step(); opt:zero_grad(true)
  l:free(); x:free(); g:free()
end
for _, e in ipairs(model:optim_groups()) do
  local mine = e.tensor:tolist_flat()
  for i = 1, #mine do
    local r = want[e.name][e.start + i]
    if math.abs(mine[i] - r) > 1e-5 * math.max(1, math.abs(r)) then fail("%s[%d] %.9g, one process %.9g", e.name, e.start + i, mine[i], r); break end
  end
  e.tensor:free()
end

-- l2 used on rank 0 only, from step `from` on: every rank stops with the same named error
-- (check: the check_schedule option; nil is the default, which checks the first 2 steps)
local function diverge(from, strategy, check)
  local m = fsdp.wrap(Two(), { policy = fsdp.policy.transformer{ nn.Linear }, strategy = strategy, check_schedule = check })
  local t0 = os.time()
  local ok, err
  for step = 1, from do
    m.module.use_l2 = rank == 0 or step < from
    ok, err = pcall(function()
      local g = batch(step); local x = rows(g, rank)
      local l = m(x); l:backward(); m:zero_grad(true); l:free(); x:free(); g:free()
    end)
    if not ok then break end
  end
  if size == 1 then
    if not ok then fail("world 1 stopped: %s", tostring(err)) end
    return
  end
  local others = {}
  for r = 1, size - 1 do others[#others + 1] = tostring(r) end
  local expect = ("fsdp: unit 2 (l2) ran its forward on rank 0 but not on rank%s %s at step %d"):format(
    size > 2 and "s" or "", table.concat(others, ", "), from)
  if ok then fail("%s from step %d: no error; expected %q", strategy, from, expect)
  elseif not tostring(err):find(expect, 1, true) then fail("%s from step %d: error %s\nexpected it to start %q", strategy, from, tostring(err), expect)
  elseif os.time() - t0 > 5 then fail("%s from step %d: took %d s to stop", strategy, from, os.time() - t0)
  elseif rank == 0 and from == 3 then print(err) end
end
diverge(1, "full_shard", true)
diverge(3, "full_shard", true)
diverge(2, "no_shard", true)
diverge(1, "full_shard")       -- the issue's run, as a new user writes it: named by default
diverge(2, "shard_grad_op")

-- the default check ends after 2 steps, its exchanges stay out of the counters
do
  local m = fsdp.wrap(Two(), { policy = fsdp.policy.transformer{ nn.Linear } })
  local counts, checks = {}, 0
  for step = 1, 4 do
    shard.comm.reset_counts()
    local g = batch(step); local x = rows(g, rank)
    local l = m(x); l:backward(); m:zero_grad(true); l:free(); x:free(); g:free()
    counts[step] = shard.comm.count("all_gather")
    checks = checks + (m.check_group and m.check_group:count("all_gather") or 0)
  end
  for step = 2, 4 do
    if counts[step] ~= counts[1] then fail("step %d counted %d all-gathers, step 1 %d: the check's exchanges were counted", step, counts[step], counts[1]) end
  end
  if size > 1 and checks ~= 2 * 3 * 3 then
    fail("the default check exchanged %d times; expected 2 steps x 3 units x 3 phases", checks)
  end
end
env.barrier()
if failures > 0 then os.exit(1) end
