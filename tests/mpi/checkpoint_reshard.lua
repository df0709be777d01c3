-- shard.save / shard.load across world sizes and strategies: a plain model's file loads into
-- FSDP units at this world size (each rank takes its slice), and what FSDP saves back is the
-- same file; a mixed-precision model saves its exact f32 masters.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = true }
local dir = os.getenv("SHARD_TEST_TMP") or "/tmp"
local path = dir .. "/shard_ckpt_" .. env.world .. ".safetensors"

shard.manual_seed(5)
local plain = nn.GPT(CFG)
shard.save(plain, path)
local want = {}
for _, np in ipairs(plain:named_parameters()) do want[np.name] = np.tensor:tolist_flat() end

for _, case in ipairs { { "full_shard" }, { "no_shard" }, { "full_shard", { param = "bf16", reduce = "f32" } } } do
  local model = shard.fsdp.wrap(function() shard.manual_seed(77); return nn.GPT(CFG) end,
    { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = case[1], mixed_precision = case[2] })
  shard.load(model, path)
  local back = require("shard.io.state_dict").state_dict(model)
  for name, values in pairs(want) do
    local got = back[name]:tolist_flat()
    for i = 1, #values do
      if got[i] ~= values[i] then error(("%s world %d: %s[%d] is %.9g after load, saved %.9g"):format(case[1], env.world, name, i, got[i], values[i])) end
    end
  end
  -- the loaded model computes what the plain one does
  local x = shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i64" })
  local a = shard.no_grad(function() return plain(x, x):item() end)
  local b = shard.no_grad(function() return model(x, x):item() end)
  local tol = case[2] and 2e-2 or 1e-6
  if math.abs(a - b) > tol * math.abs(a) then error(("%s world %d: loss %.7f after load, plain %.7f"):format(case[1], env.world, b, a)) end
end

-- a file missing a tensor, or with a wrong shape, is refused with its name
local model = shard.fsdp.wrap(function() return nn.GPT(CFG) end, { policy = shard.fsdp.policy.transformer{ nn.Block } })
local other = nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 13, block_size = 8, bias = true }
local bad = dir .. "/shard_ckpt_bad_" .. env.world .. ".safetensors"
shard.save(other, bad)
local ok, err = pcall(shard.load, model, bad)
if ok or not tostring(err):find("transformer.wte.weight' is 13x16 in the file but 11x16", 1, true) then
  error("a wrong shape was not refused clearly: " .. tostring(err))
end
