-- FSDP mixed precision: bf16 compute copies of f32 master shards, grads reduced in f32.
-- The loss curve must follow f32 training within bf16's resolution, the parameters seen in
-- forward must be bf16, and the optimizer's shards and grads f32.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local CFG = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 16, bias = false }

local function train(mp)
  local model = shard.fsdp.wrap(function() shard.manual_seed(1); return nn.GPT(CFG) end,
    { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard",
      mixed_precision = mp and { param = "bf16", reduce = "f32" } or nil })
  local opt = shard.optim.AdamW(model, { lr = 1e-2 })
  local seen_dtype
  local blk = model.transformer.h._children[1].module.module
  local fwd = blk.forward
  blk.forward = function(self, x) seen_dtype = self.attn.c_attn.weight:dtype(); return fwd(self, x) end
  local losses = {}
  for step = 1, 5 do
    shard.manual_seed(50 + step)
    local u = shard.rand({ 2 * env.world, 16 }); local s = u * 16; local ids = s:to("i64")
    local x = ids:narrow(1, 2 * env.rank + 1, 2):contiguous()
    local loss = model(x, x)
    losses[step] = env.all_reduce_mean(loss:item())
    loss:backward(); model:clip_grad_norm(1); opt:step()
    for _, e in ipairs(model:optim_groups()) do
      assert(e.tensor:dtype() == "f32", "master shard is " .. e.tensor:dtype())
      local g = e.grad()
      if g then assert(g:dtype() == "f32", "grad shard is " .. g:dtype()); g:free() end
      e.tensor:free()
    end
    opt:zero_grad(true)
    u:free(); s:free(); ids:free(); x:free(); loss:free()
  end
  return losses, seen_dtype
end

local f32, d32 = train(false)
local bf16, d16 = train(true)
assert(d32 == "f32" and d16 == "bf16", ("forward saw %s and %s parameters"):format(d32, d16))
for i = 1, #f32 do
  assert(math.abs(f32[i] - bf16[i]) < 0.02 * math.abs(f32[i]),
    ("step %d: bf16 loss %.4f strays from f32 %.4f"):format(i, bf16[i], f32[i]))
end
