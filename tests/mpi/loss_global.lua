-- The loss over the global batch (issue 19, item 3): 3 micro-batches per rank with different
-- numbers of valid target tokens (ignore_index -1; one micro-batch has none), accumulated
-- under full_shard and no_shard through nn.global_loss, must give the gradient (before the
-- optimizer, each of 2 steps), the loss and the final parameters of one process taking the
-- whole global batch in one forward: the mean over every valid token of every rank.
-- Averaging the micro-batch means instead (loss / 3) misses the loss by a third here, and
-- some gradient elements by 20 times.
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim = shard.fsdp, shard.nn, shard.optim
local rank, size = env.rank, env.world
local CFG = { n_layer = 1, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false }
local ACC, B, T, STEPS = 3, 2, 8, 2
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(21); return nn.GPT(CFG) end

-- the global batch: micro-batch m (0-based; rank r holds m = r * ACC .. r * ACC + ACC - 1) has
-- its last k(m) targets of each row ignored, k from 0 to 8 (all)
local function ignored(m) return m == 1 and T or (m * 3 + 1) % T end
local function batch(step)
  shard.manual_seed(300 + step)
  local n = size * ACC * B
  local u = shard.rand({ n, T }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  u = shard.rand({ n, T }); s = u * CFG.vocab_size
  local y = s:to("i64"); u:free(); s:free()
  for m = 0, size * ACC - 1 do
    for row = m * B + 1, m * B + B do
      for col = T - ignored(m) + 1, T do y:set({ row, col }, -1) end
    end
  end
  return x, y
end
local function micro(t, m) return t:narrow(1, m * B + 1, B):contiguous() end

local ref = build()
local ref_opt = optim.AdamW(ref, { lr = 1e-3 })
local ref_losses, ref_grads = {}, {}
for step = 1, STEPS do
  local x, y = batch(step)
  local loss = ref(x, y)
  ref_losses[step] = loss:item()
  loss:backward()
  ref_grads[step] = {}
  for _, np in ipairs(ref:named_parameters()) do ref_grads[step][np.name] = np.tensor.grad:tolist_flat() end
  ref_opt:step(); ref_opt:zero_grad(true)
  loss:free(); x:free(); y:free()
end
local ref_params = {}
for _, np in ipairs(ref:named_parameters()) do ref_params[np.name] = np.tensor:tolist_flat() end

local function worst_of(model, want, get, floor)
  local worst, where = 0, "nothing"
  for _, e in ipairs(model:optim_groups()) do
    local t = get(e)
    if t then
      local mine = t:tolist_flat(); t:free()
      for i = 1, #mine do
        local r = want[e.name][e.start + i]
        local d = math.abs(mine[i] - r) / math.max(floor, math.abs(r))
        if d > worst then worst, where = d, ("%s[%d] %.9g vs %.9g"):format(e.name, e.start + i, mine[i], r) end
      end
    end
    e.tensor:free()
  end
  return worst, where
end

for _, strategy in ipairs { "full_shard", "no_shard" } do
  local model = fsdp.wrap(build, { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy })
  local opt = optim.AdamW(model, { lr = 1e-3 })
  for step = 1, STEPS do
    local gx, gy = batch(step)
    local xs, ys = {}, {}
    for i = 1, ACC do xs[i], ys[i] = micro(gx, rank * ACC + i - 1), micro(gy, rank * ACC + i - 1) end
    local gl = nn.global_loss(ys)
    local sum = 0
    for i = 1, ACC do
      local loss = model(xs[i], ys[i])
      local scaled = gl:scale(loss, i)
      sum = sum + scaled:item()
      scaled:backward()
      loss:free(); scaled:free(); xs[i]:free(); ys[i]:free()
    end
    local l = gl:mean(sum)
    if math.abs(l - ref_losses[step]) > 1e-5 * ref_losses[step] then
      fail("%s step %d: loss %.8f, one process %.8f", strategy, step, l, ref_losses[step])
    end
    local w, where = worst_of(model, ref_grads[step], function(e) return e.grad() end, 1e-2)
    if w > 1e-4 then fail("%s step %d: gradient differs from one process by %.3g at %s", strategy, step, w, where) end
    opt:step(); opt:zero_grad(true)
    gx:free(); gy:free()
  end
  local w, where = worst_of(model, ref_params, function(e) return e.tensor:clone() end, 1)
  if w > 1e-5 then fail("%s: final parameters differ from one process by %.3g at %s", strategy, w, where) end
  if rank == 0 then print(("%s world %d, accumulation %d: global-batch loss and gradients match one process (parameters %.3g)"):format(strategy, size, ACC, w)) end
end
env.barrier()
if failures > 0 then os.exit(1) end
