-- fp16 training with a sharded dynamic loss scaler (shard.amp, issue 11): full_shard with
-- mixed_precision = { param = "f16", reduce = "f32" } against one process training in f32 on
-- the whole global batch, 6 AdamW steps. At step 3 an overflow is forced on the last rank
-- only (an inf written into its own grad shard, which no other rank holds): every rank must
-- skip that step (its parameters and optimizer step count unchanged, bit for bit) and halve
-- the scale; after growth_interval = 2 clean steps the scale doubles. Also checked: unscaled
-- gradients equal the f32 reference's within f16's resolution (a missing unscale is off by
-- the scale), the losses follow the reference (which skips the same step) within 1%, and the
-- scaler's state comes back through opt:state_dict() and through shard.checkpoint. And from a
-- scale of 2^24 real f16 overflows skip steps and halve the scale until steps go through.
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim, amp = shard.fsdp, shard.nn, shard.optim, require("shard.amp")
local ck = require("shard.checkpoint")
local rank, size = env.rank, env.world
local CFG = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 16, bias = false }
local B, STEPS, FORCED, INIT = 2, 6, 3, 2 ^ 8
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(3); return nn.GPT(CFG) end
local function new_opt(m) return optim.AdamW(m, { lr = 3e-3 }) end

local function batch(step)
  shard.manual_seed(900 + step)
  local u = shard.rand({ size * B, CFG.block_size }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  return x
end

-- reference: one process, f32, the whole batch, the same step skipped
local ref = build()
local ref_opt = new_opt(ref)
local ref_losses, ref_grads1 = {}, {}
for step = 1, STEPS do
  local x = batch(step)
  local loss = ref(x, x)
  ref_losses[step] = loss:item()
  loss:backward()
  if step == 1 then
    for _, np in ipairs(ref:named_parameters()) do ref_grads1[np.name] = np.tensor.grad:tolist_flat() end
  end
  if step ~= FORCED then ref_opt:step() end
  ref_opt:zero_grad(true)
  loss:free(); x:free()
end

local function shards(model)
  local out = {}
  for i, e in ipairs(model:optim_groups()) do out[i] = e.tensor:tolist_flat(); e.tensor:free() end
  return out
end

local function same_lists(a, b)
  for i = 1, #a do for j = 1, #a[i] do if a[i][j] ~= b[i][j] then return false end end end
  return true
end

-- the largest difference of this rank's grad slices from the reference's, over the largest |g|
local function grad_error(model)
  local worst, top = 0, 0
  for _, e in ipairs(model:optim_groups()) do
    local g = e.grad()
    if g then
      local mine = g:tolist_flat(); g:free()
      for i = 1, #mine do
        local r = ref_grads1[e.name][e.start + i]
        worst = math.max(worst, math.abs(mine[i] - r))
        top = math.max(top, math.abs(r))
      end
    end
    e.tensor:free()
  end
  return worst / math.max(top, 1e-30)
end

-- an inf in the last rank's first non-empty grad shard slice
local function force_overflow(model)
  if rank ~= size - 1 then return end
  for _, e in ipairs(model:optim_groups()) do
    local g = e.grad()
    local done = false
    if g and g:numel() > 0 then g:set({ 1 }, math.huge); done = true end
    if g then g:free() end
    e.tensor:free()
    if done then return end
  end
end

local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                                 mixed_precision = { param = "f16", reduce = "f32" } })
local opt = new_opt(model)
local scaler = amp.GradScaler(opt, { init_scale = INIT, growth_interval = 2 })
local want_scale = { INIT, 2 * INIT, INIT, INIT, 2 * INIT, 2 * INIT }   -- after each update
for step = 1, STEPS do
  local gx = batch(step)
  local x = gx:narrow(1, rank * B + 1, B):contiguous(); gx:free()
  local loss = model(x, x)
  local l = env.all_reduce_mean(loss:item())
  if math.abs(l - ref_losses[step]) > 0.01 * ref_losses[step] then
    fail("step %d: f16 loss %.5f, f32 one process %.5f", step, l, ref_losses[step])
  end
  local scaled = scaler:scale(loss)
  scaled:backward()
  if step == FORCED then force_overflow(model) end
  local found = scaler:unscale()
  if step == 1 then
    local err = grad_error(model)
    if err > 1e-2 then fail("step 1: unscaled f16 gradients differ from f32 by %.3g of the largest", err) end
    if rank == 0 then print(("step 1: unscaled f16 grads within %.3g of the f32 reference (relative to the largest)"):format(err)) end
  end
  model:clip_grad_norm(1.0)
  local before, count = shards(model), opt.step_count
  local stepped = scaler:step()
  if stepped ~= (step ~= FORCED) or found ~= (step == FORCED) then
    fail("step %d: stepped %s, found inf %s; the overflow was forced at step %d", step, tostring(stepped), tostring(found), FORCED)
  end
  if step == FORCED and (not same_lists(before, shards(model)) or opt.step_count ~= count) then
    fail("step %d: the skipped step changed the parameters or the step count", step)
  end
  scaler:update()
  if scaler:get_scale() ~= want_scale[step] then
    fail("step %d: scale %g, expected %g", step, scaler:get_scale(), want_scale[step])
  end
  opt:zero_grad(true)
  loss:free(); scaled:free(); x:free()
end

-- a real overflow: at 2^24 the scaled logits' gradient (about scale / tokens) passes f16's
-- 65504 in the f16 backward; the scaler backs off (every rank alike) until steps go through
do
  local m = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                               mixed_precision = { param = "f16", reduce = "f32" } })
  local o = new_opt(m)
  local sc = amp.GradScaler(o, { init_scale = 2 ^ 24, growth_interval = 100 })
  local skipped, first_ok = 0, nil
  for step = 1, 12 do
    local gx = batch(step)
    local x = gx:narrow(1, rank * B + 1, B):contiguous(); gx:free()
    local loss = m(x, x)
    local scaled = sc:scale(loss)
    scaled:backward()
    if sc:step() then first_ok = first_ok or step else skipped = skipped + 1 end
    sc:update()
    o:zero_grad(true)
    loss:free(); scaled:free(); x:free()
  end
  local scale = env.all_reduce_mean(sc:get_scale())
  if skipped == 0 or not first_ok or scale ~= sc:get_scale() or sc:get_scale() ~= 2 ^ (24 - skipped) then
    fail("natural overflow from 2^24: %d skipped, first step taken %s, scale %g (mean over ranks %g)", skipped,
      tostring(first_ok), sc:get_scale(), scale)
  end
  if rank == 0 then print(("from scale 2^24: %d steps skipped on f16 overflow, then steps at 2^%d"):format(skipped, 24 - skipped)) end
end

-- the state travels with the optimizer's
local sd = opt:state_dict()
local opt2 = new_opt(model)
local scaler2 = amp.GradScaler(opt2, { init_scale = 1, growth_interval = 2 })
opt2:load_state_dict(sd)
if scaler2:get_scale() ~= scaler:get_scale() or opt2.loss_scale_clean_steps ~= opt.loss_scale_clean_steps then
  fail("state_dict: scale %g (clean %d) came back as %g (clean %d)", scaler:get_scale(), opt.loss_scale_clean_steps,
    scaler2:get_scale(), opt2.loss_scale_clean_steps)
end
local dir = os.getenv("SHARD_TEST_TMP") or "/tmp"
dir = dir .. ("/amp_fp16_ckpt_%d"):format(size)
ck.save(dir, { model = model, optim = opt, step = STEPS })
local model3 = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
                                  mixed_precision = { param = "f16", reduce = "f32" } })
local opt3 = new_opt(model3)
local scaler3 = amp.GradScaler(opt3, { init_scale = 1, growth_interval = 2 })
ck.load(dir, { model = model3, optim = opt3 })
if scaler3:get_scale() ~= scaler:get_scale() or opt3.loss_scale_clean_steps ~= opt.loss_scale_clean_steps then
  fail("checkpoint: scale %g (clean %d) came back as %g (clean %d)", scaler:get_scale(), opt.loss_scale_clean_steps,
    scaler3:get_scale(), opt3.loss_scale_clean_steps)
end
env.barrier()
if rank == 0 then os.execute("rm -rf " .. dir) end
if rank == 0 and failures == 0 then print(("world %d: f16 + loss scaler follows f32; the forced overflow on rank %d skipped step %d on every rank"):format(size, size - 1, FORCED)) end
if failures > 0 then os.exit(1) end
