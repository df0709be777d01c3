-- FSDP against single-process training, at the world size mpirun gives (1 to 4).
-- For every strategy that fits the world (hybrid as 2 x 2 at world 4), 5 AdamW steps of a
-- small GPT on a global batch split across ranks must give the losses and final parameters
-- of one process training on the whole batch (f32, 1e-5 relative). Also checked: collective
-- counts per step, the per-rank bytes of parameters + grads + optimizer state (16 P / N plus
-- padding, within 1%), and a peak below the unsharded model's on the same per-rank batch.
-- lr is nanoGPT's 1e-3: AdamW divides by sqrt(v), so for elements with tiny gradients it turns
-- the last-bit differences of a sharded reduction order into visible ones at larger rates.
local shard = require("shard")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
local ffi = require("ffi")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim
local C = shard.C

local world = fsdp.world().p   -- the raw sh_comm* for the C calls below
local rank, size = C.sh_comm_rank(world), C.sh_comm_size(world)
-- No biases, as the recipe: the key projection's bias gets a gradient that is pure rounding
-- noise (softmax ignores it), which AdamW then turns into lr-sized random steps.
local CFG = { n_layer = 4, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 16, bias = false, dropout = 0 }
local B_LOCAL, STEPS = 2, 5
local failures = 0

local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end

local function batch(step)   -- the global batch, the same on every rank
  return support.random_batch(1000 + step, B_LOCAL * size, CFG.block_size, CFG.vocab_size)
end

local function local_rows(t)
  return t:narrow(1, rank * B_LOCAL + 1, B_LOCAL):contiguous()
end

local function new_model()
  shard.manual_seed(7)
  return nn.GPT(CFG)
end

local function all_reduce_avg(v)
  local t = shard.tensor({ v }, { dtype = "f64" })
  assert(C.sh_comm_all_reduce(world, t.p, C.SH_RED_AVG, -1) == 0, ffi.string(C.sh_last_error()))
  return t:get({ 1 })
end

-- single-process reference on the global batch
local function tagged(s) return s.by_tag.param + s.by_tag.grad + s.by_tag.optim end
shard.memory.reset_peak()
local base = shard.memory.stats().allocated
local ref = new_model()
local ref_opt = optim.AdamW(ref, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
local ref_losses = {}
-- The global batch is fed as one micro-batch per rank with gradient accumulation, the
-- mean loss being the mean of the micro-batch means: the same sums in the same order as the
-- ranks' reduction, so the comparison is not blurred by summation order.
for step = 1, STEPS do
  local gx, gy = batch(step)
  local total = 0
  for r = 0, size - 1 do
    local x = gx:narrow(1, r * B_LOCAL + 1, B_LOCAL):contiguous()
    local y = gy:narrow(1, r * B_LOCAL + 1, B_LOCAL):contiguous()
    local loss = ref(x, y)
    total = total + loss:item()
    local scaled = loss / size
    scaled:backward()
    loss:free(); scaled:free(); x:free(); y:free()
  end
  ref_losses[step] = total / size
  optim.clip_grad_norm(ref, 1.0)
  ref_opt:step()
  ref_opt:zero_grad(true)
  gx:free(); gy:free()
end
-- The unsharded model's peak over a step on this rank's share of the batch, model and
-- optimizer creation included (what each rank would hold without FSDP).
local function unsharded_peak()
  shard.memory.reset_peak()
  local before = shard.memory.stats().allocated
  local model = new_model()
  local opt = optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
  for step = 1, 2 do
    local gx, gy = batch(step)
    local x, y = local_rows(gx), local_rows(gy)
    local loss = model(x, y)
    loss:backward()
    optim.clip_grad_norm(model, 1.0)
    opt:step()
    opt:zero_grad(true)
    loss:free(); x:free(); y:free(); gx:free(); gy:free()
  end
  local peak = shard.memory.stats().peak - before
  for _, t in ipairs(model:parameters()) do t:free() end
  for _, e in ipairs(opt.entries) do e.m:free(); e.v:free() end
  return peak
end
local ref_peak = unsharded_peak()
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = np.tensor:tolist_flat() end
local P = ref:num_params()

local function close(a, b) return math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)) end

local strategies = { "full_shard", "shard_grad_op", "no_shard" }
if size == 4 then strategies[#strategies + 1] = "hybrid_shard"; strategies[#strategies + 1] = "hybrid_shard_zero2" end

for _, strategy in ipairs(strategies) do
  local before = shard.memory.stats().allocated
  local before_tagged = tagged(shard.memory.stats())
  shard.memory.reset_peak()
  local model = fsdp.wrap(new_model, { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = 2 })
  local units = #model.all_units
  local opt = optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
  for step = 1, STEPS do
    local gx, gy = batch(step)
    local x, y = local_rows(gx), local_rows(gy)
    gx:free(); gy:free()
    C.sh_comm_reset_counts(nil)
    local loss = model(x, y)
    local fwd_ag = tonumber(C.sh_comm_count(nil, C.SH_COLL_ALL_GATHER))
    loss:backward()
    local bwd_ag = tonumber(C.sh_comm_count(nil, C.SH_COLL_ALL_GATHER)) - fwd_ag
    local rs = tonumber(C.sh_comm_count(nil, C.SH_COLL_REDUCE_SCATTER))
    local ar = tonumber(C.sh_comm_count(nil, C.SH_COLL_ALL_REDUCE))
    local expect = ({
      full_shard = { units, units - 1, units, 0 },
      shard_grad_op = { units, 0, units, 0 },
      no_shard = { 0, 0, 0, units },
      hybrid_shard = { units, units - 1, units, units },
      hybrid_shard_zero2 = { units, 0, units, units },
    })[strategy]
    if fwd_ag ~= expect[1] or bwd_ag ~= expect[2] or rs ~= expect[3] or ar ~= expect[4] then
      fail("%s step %d: collectives fwd all-gather %d, bwd all-gather %d, reduce-scatter %d, all-reduce %d; expected %d, %d, %d, %d",
        strategy, step, fwd_ag, bwd_ag, rs, ar, expect[1], expect[2], expect[3], expect[4])
    end
    local l = all_reduce_avg(loss:item())
    if not close(l, ref_losses[step]) then fail("%s step %d: loss %.8f, single process %.8f", strategy, step, l, ref_losses[step]) end
    model:clip_grad_norm(1.0)
    opt:step()
    if step == 1 and strategy == "full_shard" then
      local s = shard.memory.stats()
      local held = tagged(s) - before_tagged
      local padded = 0
      for _, u in ipairs(model.all_units) do padded = padded + tonumber(u.info.padded_numel) end
      local expect_bytes = 16 * padded / size
      if math.abs(held - expect_bytes) > 0.01 * expect_bytes then
        fail("full_shard bytes: param+grad+optim = %d, expected 16*P/N = %d (P=%d padded %d)", held, expect_bytes, P, padded)
      end
      if rank == 0 then print(("full_shard world %d: param+grad+optim %d bytes per rank (16*P/N = %d, P = %d)"):format(size, held, expect_bytes, P)) end
    end
    opt:zero_grad(true)
    loss:free(); x:free(); y:free()
  end
  local peak = shard.memory.stats().peak - before
  if size > 1 and strategy == "full_shard" and peak >= ref_peak then
    fail("full_shard peak %d bytes is not below the unsharded peak %d", peak, ref_peak)
  end
  if rank == 0 and strategy == "full_shard" then
    local t = {}
    for k, v in pairs(shard.memory.stats().peak_by_tag) do t[#t + 1] = k .. " " .. v end
    table.sort(t)
    print(("full_shard world %d: step peak %d bytes vs unsharded %d (at the peak: %s)"):format(size, peak, ref_peak, table.concat(t, ", ")))
  end
  -- final parameters: every slice this rank owns equals the reference's
  local worst, where = 0, ""
  for _, e in ipairs(model:optim_groups()) do
    local mine = e.tensor:tolist_flat()
    local want = ref_params[e.name]
    for i = 1, #mine do
      local r = want[e.start + i]
      local d = math.abs(mine[i] - r) / math.max(1, math.abs(r))
      if d > worst then worst, where = d, ("%s[%d]: %.9g vs %.9g"):format(e.name, e.start + i, mine[i], r) end
    end
    e.tensor:free()
  end
  if worst > 1e-5 then fail("%s: final parameters differ from single process by %.3g (relative) at %s", strategy, worst, where) end
  if rank == 0 then print(("%s world %d: max relative parameter difference %.3g"):format(strategy, size, worst)) end
end

C.sh_comm_barrier(world)
if failures > 0 then os.exit(1) end
