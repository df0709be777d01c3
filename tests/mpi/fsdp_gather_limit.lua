-- limit_all_gathers and forward_prefetch (issue 11): a 4-block GPT under full_shard with
-- prefetch = 2 (two units gathered ahead). Without a limit, up to 4 of its units are gathered
-- at once (the root, the block computing, two prefetched); limit_all_gathers = 2 holds that
-- to 2 and forward_prefetch = false holds the forward to 2 (root and the block computing).
-- Checked for each: the most units gathered at once (shard.memory's in-flight count), the
-- step's memory peak (lower with the limit than without), and the losses and gradients of
-- one process on the whole batch (a limit changes when gathers run, never the numbers).
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim = shard.fsdp, shard.nn, shard.optim
local rank, size = env.rank, env.world
local CFG = { n_layer = 4, n_head = 2, n_embd = 64, vocab_size = 16, block_size = 8, bias = false }
local B, STEPS = 1, 2
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(11); return nn.GPT(CFG) end
local function new_opt(m) return optim.SGD(m, { lr = 0.1 }) end

local function batch(step)
  shard.manual_seed(60 + step)
  local u = shard.rand({ size * B, CFG.block_size }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  return x
end

local ref = build()
local ref_opt = new_opt(ref)
local ref_losses, ref_grads = {}, {}
for step = 1, STEPS do
  local x = batch(step)
  local loss = ref(x, x)
  ref_losses[step] = loss:item()
  loss:backward()
  ref_grads[step] = {}
  for _, np in ipairs(ref:named_parameters()) do ref_grads[step][np.name] = np.tensor.grad:tolist_flat() end
  ref_opt:step(); ref_opt:zero_grad(true)
  loss:free(); x:free()
end

local function grad_error(model, want)
  local worst = 0
  for _, e in ipairs(model:optim_groups()) do
    local g = e.grad()
    local got = g:tolist_flat(); g:free(); e.tensor:free()
    for i = 1, #got do
      local r = want[e.name][e.start + i]
      worst = math.max(worst, math.abs(got[i] - r) / math.max(1, math.abs(r)))
    end
  end
  return worst
end

-- The trace of a step shows it too: how far this rank's parameter memory (shard.trace's memory
-- counter, tag param) rose above its level at the step's start: the gathered buffers.
local cjson = require("cjson")
local trace = require("shard.trace")
local TMP = os.getenv("SHARD_TEST_TMP") or "/tmp"
local function traced_param_peak(path)
  env.barrier()                          -- rank 0 has merged every rank's part
  local f = assert(io.open(path, "r"))
  local doc = cjson.decode(f:read("*a"))
  f:close()
  local first, first_ts, most
  for _, e in ipairs(doc.traceEvents or doc) do
    if e.ph == "C" and e.pid == rank and e.args and e.args.param then
      if not first_ts or e.ts < first_ts then first, first_ts = e.args.param, e.ts end
      most = math.max(most or 0, e.args.param)
    end
  end
  env.barrier()
  if not most then fail("%s: no memory counter of rank %d in the trace", path, rank); return 0 end
  return math.floor((most - first) * 2 ^ 20 + 0.5)
end

-- { most gathered in the forward, in the whole step, the step's memory peak above the start,
--   the traced step's most parameter memory }
local function run(opts, what)
  local o = { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard", prefetch = 2 }
  for k, v in pairs(opts) do o[k] = v end
  local model = fsdp.wrap(build, o)
  local opt = new_opt(model)
  local fwd_most, step_most, peak = 0, 0, 0
  local path = ("%s/shard_gather_limit_%d_%s.json"):format(TMP, size, what:gsub("[^%w]", "_"))
  trace.setup{ path = path, steps = ("%d"):format(STEPS) }
  for step = 1, STEPS do
    trace.begin_step(step)
    local gx = batch(step)
    local x = gx:narrow(1, rank * B + 1, B):contiguous(); gx:free()
    local before = shard.memory.stats().allocated
    shard.memory.reset_peak()
    local loss = model(x, x)
    fwd_most = math.max(fwd_most, shard.memory.in_flight().gathers_peak)
    local l = env.all_reduce_mean(loss:item())
    if math.abs(l - ref_losses[step]) > 1e-6 * ref_losses[step] then fail("%s step %d: loss %.8f, one process %.8f", what, step, l, ref_losses[step]) end
    loss:backward()
    step_most = math.max(step_most, shard.memory.in_flight().gathers_peak)
    peak = math.max(peak, shard.memory.stats().peak - before)
    local err = grad_error(model, ref_grads[step])
    if err > 1e-6 then fail("%s step %d: gradients differ from one process by %.3g", what, step, err) end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free()
    trace.end_step(step)
  end
  return { fwd = fwd_most, step = step_most, peak = peak, traced = traced_param_peak(path) }
end

local free = run({}, "no limit")
local limited = run({ limit_all_gathers = 2 }, "limit_all_gathers = 2")
local no_fwd = run({ forward_prefetch = false }, "forward_prefetch = false")
local expect = {
  { "no limit", free, 4, 4 },
  { "limit_all_gathers = 2", limited, 2, 2 },
  { "forward_prefetch = false", no_fwd, 2, 4 },
}
for _, c in ipairs(expect) do
  if c[2].fwd ~= c[3] or c[2].step ~= c[4] then
    fail("%s: at most %d units gathered in the forward and %d in the step; expected %d and %d", c[1], c[2].fwd, c[2].step, c[3], c[4])
  end
end
if not (limited.peak < free.peak) then fail("limit_all_gathers = 2: peak %d bytes is not below %d without the limit", limited.peak, free.peak) end
if not (limited.traced < free.traced) then
  fail("limit_all_gathers = 2: the trace shows %d bytes of parameters gathered at most, not below %d without the limit", limited.traced, free.traced)
end
if rank == 0 then
  print(("world %d, prefetch 2: step peak %d bytes without a limit, %d with limit_all_gathers = 2, %d with forward_prefetch = false; parameters gathered at most in the trace %d / %d / %d"):format(
    size, free.peak, limited.peak, no_fwd.peak, free.traced, limited.traced, no_fwd.traced))
end
local ok, err = pcall(fsdp.wrap, build(), { limit_all_gathers = 0 })
if ok or not tostring(err):find("limit_all_gathers = 0; expected a whole number >= 1", 1, true) then
  fail("limit_all_gathers = 0 gave %s", tostring(err))
end
env.barrier()
if failures > 0 then os.exit(1) end
