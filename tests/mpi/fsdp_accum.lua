-- Gradient accumulation under FSDP against one process on the whole global batch (issue 11).
-- Each rank runs K micro-batches per step, their losses scaled by 1/K, in four modes:
--   every      the default: each backward reduce-scatters (all-reduces) into the sharded grad
--   no_sync    fsdp.no_sync(model, fn) around the inner K-1 micro-batches (FSDP1)
--   sync_off   model:set_requires_gradient_sync(false) on the inner ones (FSDP2's name)
--   replica    model:set_requires_all_reduce(false) on the inner ones (hybrid: all-reduce once)
-- For every strategy that fits the world (hybrid as 2 x 2 at world 4), over 2 SGD steps:
-- the gradient before the optimizer equals the reference's (1e-6), and so do the parameters
-- after the steps; the step's reduce-scatters and all-reduces are counted (U units: K*U when
-- every micro-batch reduces, U when only the last does); the grad memory held between micro-
-- batches is exactly the sharded grads (every, replica) or every unit's unsharded flat grad
-- (no_sync, sync_off); the optimizer refuses grads still owed a reduction; and zero_grad
-- after an abandoned accumulation drops the unreduced grads it left.
local shard = require("shard")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
local env = shard.init()
local fsdp, nn, optim, comm = shard.fsdp, shard.nn, shard.optim, shard.comm
local rank, size = env.rank, env.world
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false }
local K, B, STEPS = 3, 2, 2
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(5); return nn.GPT(CFG) end
-- SGD with momentum: linear in the gradient, so a parameter differs by what its gradients
-- did. AdamW's first steps are lr * g / (|g| + eps), which turns the last-bit rounding of a
-- 1e-8 gradient (micro-batches sum in another order than one batch) into lr-sized steps.
local function new_opt(m) return optim.SGD(m, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 }) end

local function batch(step)   -- the global batch: K micro-batches of B rows per rank
  return support.random_batch(700 + step, size * K * B, CFG.block_size, CFG.vocab_size)
end
local function micro(t, i) return t:narrow(1, (rank * K + i - 1) * B + 1, B):contiguous() end

-- the reference: one forward over the whole global batch per step
local ref = build()
local ref_opt = new_opt(ref)
local ref_grads = {}
for step = 1, STEPS do
  local x, y = batch(step)
  local loss = ref(x, y)
  loss:backward()
  ref_grads[step] = {}
  for _, np in ipairs(ref:named_parameters()) do ref_grads[step][np.name] = np.tensor.grad:tolist_flat() end
  ref_opt:step(); ref_opt:zero_grad(true)
  loss:free(); x:free(); y:free()
end
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = np.tensor:tolist_flat() end

local function worst_of(model, want, get)
  local worst, where = 0, "nothing"
  for _, e in ipairs(model:optim_groups()) do
    local t = get(e)
    local mine = t:tolist_flat(); t:free()
    for i = 1, #mine do
      local r = want[e.name][e.start + i]
      local d = math.abs(mine[i] - r) / math.max(1, math.abs(r))
      if d > worst then worst, where = d, ("%s[%d] %.9g vs %.9g"):format(e.name, e.start + i, mine[i], r) end
    end
    e.tensor:free()
  end
  return worst, where
end

local function align(n) return math.ceil(n / 64) * 64 end

-- grad bytes held between micro-batches: sharded grads, or every unit's unsharded flat grad
local function expected_grad_bytes(model, mode)
  local n = 0
  for _, u in ipairs(model.all_units) do
    if u.fp then n = n + align(4 * ((mode == "no_sync" or mode == "sync_off") and u.info.padded_numel or u.info.shard_numel)) end
  end
  return n
end

-- reduce-scatters and all-reduces of one step
local function expected_counts(model, strategy, mode)
  local U = 0
  for _, u in ipairs(model.all_units) do if u.fp then U = U + 1 end end
  local once = mode == "no_sync" or mode == "sync_off"
  local hybrid = fsdp.STRATEGIES[strategy].hybrid
  local rs = strategy == "no_shard" and 0 or (once and U or K * U)
  local ar = 0
  if strategy == "no_shard" then ar = once and U or K * U end
  if hybrid then ar = (once or mode == "replica") and U or K * U end
  return rs, ar
end

-- runs micro-batch i of a step in the given mode
local function run_micro(model, mode, x, y, i)
  local last = i == K
  local function fwd_bwd()
    local loss = model(x, y)
    local scaled = loss / K
    scaled:backward()
    loss:free(); scaled:free()
  end
  if mode == "no_sync" and not last then return fsdp.no_sync(model, fwd_bwd) end
  if mode == "sync_off" then model:set_requires_gradient_sync(last) end
  if mode == "replica" then model:set_requires_all_reduce(last) end
  fwd_bwd()
end

local strategies = { "full_shard", "shard_grad_op", "no_shard" }
if size == 4 then strategies[#strategies + 1] = "hybrid_shard"; strategies[#strategies + 1] = "hybrid_shard_zero2" end

for _, strategy in ipairs(strategies) do
  for _, mode in ipairs { "every", "no_sync", "sync_off", "replica" } do
    local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = 2 })
    local opt = new_opt(model)
    local what = ("%s %s"):format(strategy, mode)
    -- an accumulation abandoned half-way: zero_grad drops what it left (unreduced grads)
    local jx, jy = batch(99)
    local x, y = micro(jx, 1), micro(jy, 1)
    run_micro(model, mode, x, y, 1)
    opt:zero_grad(true)
    jx:free(); jy:free(); x:free(); y:free()
    local held_at, counts_at = 0, ""
    for step = 1, STEPS do
      local gx, gy = batch(step)
      local grad_before = shard.memory.stats().by_tag.grad
      comm.reset_counts()
      for i = 1, K do
        local x, y = micro(gx, i), micro(gy, i)
        run_micro(model, mode, x, y, i)
        x:free(); y:free()
        if i == K - 1 then
          local held = shard.memory.stats().by_tag.grad - grad_before
          local want = expected_grad_bytes(model, mode)
          held_at = held
          if held ~= want then fail("%s step %d: %d grad bytes held between micro-batches, expected %d", what, step, held, want) end
          if (mode == "no_sync" or mode == "replica" and fsdp.STRATEGIES[strategy].hybrid) and step == 1 then
            local ok, err = pcall(model.grad_norm, model)
            if ok or not tostring(err):find("still owes", 1, true) then
              fail("%s: grad_norm with a reduction owed gave %s", what, tostring(err))
            end
          end
        end
      end
      local rs, ar = comm.count("reduce_scatter"), comm.count("all_reduce")
      local want_rs, want_ar = expected_counts(model, strategy, mode)
      counts_at = ("%d reduce-scatters, %d all-reduces"):format(rs, ar)
      if rs ~= want_rs or ar ~= want_ar then
        fail("%s step %d: %d reduce-scatters and %d all-reduces, expected %d and %d", what, step, rs, ar, want_rs, want_ar)
      end
      local w, where = worst_of(model, ref_grads[step], function(e) return e.grad() end)
      if w > 1e-6 then fail("%s step %d: gradient differs from one process by %.3g at %s", what, step, w, where) end
      opt:step(); opt:zero_grad(true)
      gx:free(); gy:free()
    end
    model:set_requires_gradient_sync(true); model:set_requires_all_reduce(true)
    local w, where = worst_of(model, ref_params, function(e) return e.tensor:clone() end)
    if w > 1e-6 then fail("%s: parameters after %d steps differ from one process by %.3g at %s", what, STEPS, w, where) end
    if rank == 0 then
      print(("%s world %d, K = %d: grads and parameters match one process (%.3g); a step: %s; %d grad bytes held between micro-batches"):format(
        what, size, K, w, counts_at, held_at))
    end
  end
end
env.barrier()
if failures > 0 then os.exit(1) end
