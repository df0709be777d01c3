-- FSDP of nn.Llama (policy fsdp.policy.transformer{ nn.LlamaBlock }) against single-process
-- training, at the world size mpirun gives: for each strategy, the gradients before the
-- optimizer (every rank's shard of them) after the first backward (1e-5 of each tensor's
-- largest gradient), then the losses of 5 AdamW steps and the final parameters (1e-5
-- relative, absolute below 1, as fsdp_parity.lua: AdamW turns last-bit differences of the
-- ranks' summation order into ~1e-6 steps on elements with tiny gradients) must equal one
-- process training on the whole batch. Also: one unit per LlamaBlock plus the root.
local shard = require("shard")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
local ffi = require("ffi")
local fsdp, nn, optim = require("shard.fsdp"), shard.nn, shard.optim
local C = shard.C

local world = fsdp.world().p
local rank, size = C.sh_comm_rank(world), C.sh_comm_size(world)
local CFG = { n_layer = 3, n_head = 4, n_kv_head = 2, dim = 32, ffn_dim = 64, vocab_size = 16, max_seq_len = 16 }
local B_LOCAL, STEPS = 2, 5
local failures = 0

local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end

local function batch(step)   -- the global batch, the same on every rank
  return support.random_batch(1000 + step, B_LOCAL * size, CFG.max_seq_len, CFG.vocab_size)
end
local function rows(t, r) return t:narrow(1, r * B_LOCAL + 1, B_LOCAL):contiguous() end

local function new_model()
  shard.manual_seed(7)
  return nn.Llama(CFG)
end
local function new_opt(model) return optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 }) end

local function all_reduce_avg(v)
  local t = shard.tensor({ v }, { dtype = "f64" })
  assert(C.sh_comm_all_reduce(world, t.p, C.SH_RED_AVG, -1) == 0, ffi.string(C.sh_last_error()))
  return t:get({ 1 })
end

-- Single process on the global batch, fed as one micro-batch per rank (the ranks' sums in
-- the ranks' order); the gradients of step 1 are kept.
local ref = new_model()
local ref_opt = new_opt(ref)
local ref_losses, ref_grads = {}, {}
for step = 1, STEPS do
  local gx, gy = batch(step)
  local total = 0
  for r = 0, size - 1 do
    local x, y = rows(gx, r), rows(gy, r)
    local loss = ref(x, y)
    total = total + loss:item()
    local scaled = loss / size
    scaled:backward()
    loss:free(); scaled:free(); x:free(); y:free()
  end
  if step == 1 then
    for _, np in ipairs(ref:named_parameters()) do ref_grads[np.name] = np.tensor.grad:tolist_flat() end
  end
  ref_losses[step] = total / size
  optim.clip_grad_norm(ref, 1.0)
  ref_opt:step()
  ref_opt:zero_grad(true)
  gx:free(); gy:free()
end
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = np.tensor:tolist_flat() end

local function close(a, b) return math.abs(a - b) <= 1e-5 * math.max(1, math.abs(b)) end

-- The largest error of this rank's slices (values(e) of each optim entry) against want:
-- relative to each tensor's largest magnitude (per_tensor), else to max(1, |element|).
local function worst_slice(model, values, want, per_tensor)
  local worst, where = 0, ""
  for _, e in ipairs(model:optim_groups()) do
    local mine = values(e)
    local ref_t = want[e.name]
    local scale = 1e-3
    for _, v in ipairs(ref_t) do scale = math.max(scale, math.abs(v)) end
    for i = 1, #mine do
      local r = ref_t[e.start + i]
      local d = math.abs(mine[i] - r) / (per_tensor and scale or math.max(1, math.abs(r)))
      if d > worst then worst, where = d, ("%s[%d]: %.9g vs %.9g"):format(e.name, e.start + i, mine[i], ref_t[e.start + i]) end
    end
    e.tensor:free()
  end
  return worst, where
end

for _, strategy in ipairs { "full_shard", "shard_grad_op", "no_shard" } do
  local model = fsdp.wrap(new_model, { policy = fsdp.policy.transformer{ nn.LlamaBlock }, strategy = strategy })
  if #model.all_units ~= CFG.n_layer + 1 then fail("%s: %d units, expected %d", strategy, #model.all_units, CFG.n_layer + 1) end
  local opt = new_opt(model)
  for step = 1, STEPS do
    local gx, gy = batch(step)
    local x, y = rows(gx, rank), rows(gy, rank)
    gx:free(); gy:free()
    local loss = model(x, y)
    loss:backward()
    local l = all_reduce_avg(loss:item())
    if not close(l, ref_losses[step]) then fail("%s step %d: loss %.8f, single process %.8f", strategy, step, l, ref_losses[step]) end
    if step == 1 then
      local worst, where = worst_slice(model, function(e)
        local g = e.grad()
        local v = g:tolist_flat()
        g:free()
        return v
      end, ref_grads, true)
      if worst > 1e-5 then fail("%s: gradients before the optimizer differ by %.3g at %s", strategy, worst, where) end
      if rank == 0 then print(("%s world %d: max gradient difference %.3g"):format(strategy, size, worst)) end
    end
    model:clip_grad_norm(1.0)
    opt:step()
    opt:zero_grad(true)
    loss:free(); x:free(); y:free()
  end
  local worst, where = worst_slice(model, function(e) return e.tensor:tolist_flat() end, ref_params)
  if worst > 1e-5 then fail("%s: final parameters differ from single process by %.3g at %s", strategy, worst, where) end
  if rank == 0 then print(("%s world %d: max parameter difference %.3g"):format(strategy, size, worst)) end
end

C.sh_comm_barrier(world)
if failures > 0 then os.exit(1) end
