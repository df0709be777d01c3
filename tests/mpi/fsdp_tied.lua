-- Shared parameters under a policy that splits their users (issue 19, item 1): GPT ties
-- lm_head to wte, and fsdp.policy.transformer{ nn.Block, nn.Embedding } makes wte a unit of
-- its own. wrap must keep transformer.wte.weight in one FlatParameter held by the closest
-- unit over both users (the root), so that 4 AdamW steps give the gradients (before the
-- optimizer), the losses and the final parameters of one process on the global batch.
-- Before: the first step stopped in gpt.lua with "w f32[16,32] cpu (freed) was used after
-- :free()", wte's unit having resharded the weight the head still needed.
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim = shard.fsdp, shard.nn, shard.optim
local rank, size = env.rank, env.world
local CFG = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 8, bias = false }
local B, STEPS = 2, 4
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(7); return nn.GPT(CFG) end
local function batch(step)
  shard.manual_seed(500 + step)
  local u = shard.rand({ B * size, CFG.block_size }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  u = shard.rand({ B * size, CFG.block_size }); s = u * CFG.vocab_size
  local y = s:to("i64"); u:free(); s:free()
  return x, y
end
local function rows(t, r) return t:narrow(1, r * B + 1, B):contiguous() end
local function flat(t) return t:tolist_flat() end

-- reference: one process, the global batch as one micro-batch per rank
local ref = build()
local ref_opt = optim.AdamW(ref, { lr = 1e-3 })
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
  ref_losses[step] = total / size
  ref_grads[step] = {}
  for _, np in ipairs(ref:named_parameters()) do ref_grads[step][np.name] = flat(np.tensor.grad) end
  ref_opt:step(); ref_opt:zero_grad(true)
  gx:free(); gy:free()
end
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = flat(np.tensor) end

local function worst_of(entries, want, get, floor)
  local worst, where = 0, "nothing"
  for _, e in ipairs(entries) do
    local t = get(e)
    if t then
      local mine, ref_v = flat(t), want[e.name]
      t:free()
      for i = 1, #mine do
        local r = ref_v[e.start + i]
        local d = math.abs(mine[i] - r) / math.max(floor, math.abs(r))
        if d > worst then worst, where = d, ("%s[%d] %.9g vs %.9g"):format(e.name, e.start + i, mine[i], r) end
      end
    end
    e.tensor:free()
  end
  return worst, where
end

for _, strategy in ipairs { "full_shard", "shard_grad_op" } do
  local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block, nn.Embedding }, strategy = strategy })
  local sh = model.shared[1]
  if #model.shared ~= 1 or sh.name ~= "transformer.wte.weight" or sh.unit ~= "(root)"
     or table.concat(sh.users, ",") ~= "lm_head.weight,transformer.wte.weight" then
    fail("%s: shared parameters %s; expected transformer.wte.weight used by it and lm_head.weight, held by (root)\n%s",
      strategy, sh and (sh.name .. " by " .. table.concat(sh.users, ",") .. " in " .. sh.unit) or "none", fsdp.summary(model))
  end
  local opt = optim.AdamW(model, { lr = 1e-3 })
  for step = 1, STEPS do
    local gx, gy = batch(step)
    local x, y = rows(gx, rank), rows(gy, rank)
    local loss = model(x, y)
    loss:backward()
    local l = env.all_reduce_mean(loss:item())
    if math.abs(l - ref_losses[step]) > 1e-5 * math.abs(ref_losses[step]) then
      fail("%s step %d: loss %.8f, one process %.8f", strategy, step, l, ref_losses[step])
    end
    local w, where = worst_of(model:optim_groups(), ref_grads[step], function(e) return e.grad() end, 1e-2)
    -- the first step's parameters are equal, so only the reduction's summation order differs;
    -- after it AdamW turns last-bit differences into slightly different parameters
    if w > (step == 1 and 1e-5 or 1e-3) then fail("%s step %d: gradient differs from one process by %.3g at %s", strategy, step, w, where) end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free(); y:free(); gx:free(); gy:free()
  end
  local w, where = worst_of(model:optim_groups(), ref_params, function(e) return e.tensor:clone() end, 1)
  if w > 1e-5 then fail("%s: final parameters differ from one process by %.3g at %s", strategy, w, where) end
  if rank == 0 then print(("%s world %d, policy {Block, Embedding}: losses match, max relative parameter difference %.3g"):format(strategy, size, w)) end
end
env.barrier()
if failures > 0 then os.exit(1) end
