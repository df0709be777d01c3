-- nn.GPT.from_pretrained under FSDP at this world size: every rank copies its slice of the
-- Hugging Face fixture (tests/fixtures/hf_gpt2_tiny), and the sharded model computes
-- PyTorch's logits and loss (reference.safetensors, float64). Also: hf.load_into an already
-- wrapped model, a bad file refused on every rank with the tensor's name (no hang), and
-- export_hf gathering the shards into the fixture's own tensors.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local S = require("shard.io.safetensors")
local hf = require("shard.io.hf")

local FIXTURE = "tests/fixtures/hf_gpt2_tiny"
local TMP = os.getenv("SHARD_TEST_TMP") or "/tmp"
local ref = S.load(FIXTURE .. "/reference.safetensors")
local x, y = ref.input_ids, ref.targets
local B, T, V = 2, 12, 64
local want_logits = ref.logits:tolist()          -- [B][T][V]

local function fail(fmt, ...) error(("rank %d world %d: " .. fmt):format(env.rank, env.world, ...), 0) end

-- tol: relative for the loss; a logit may be off by tol * max(|logit|, 1), plus slack for
-- bf16's rounding of activations (max |logit| is 6.8 here)
local function check_model(model, what, tol, slack)
  slack = slack or 0
  shard.no_grad(function()
    local loss = model(x, y):item()
    if math.abs(loss - ref.loss:item()) > tol * ref.loss:item() then
      fail("%s: loss %.9g, PyTorch %.9g", what, loss, ref.loss:item())
    end
    local function compare(got, b, t, v)
      local w = want_logits[b][t][v]
      if math.abs(got - w) > tol * math.max(math.abs(w), 1) + slack then
        fail("%s: logits[%d][%d][%d] = %.9g, PyTorch %.9g", what, b, t, v, got, w)
      end
    end
    local last = model(x):tolist()                 -- forward: the last position's logits [B][V]
    for b = 1, B do for v = 1, V do compare(last[b][v], b, T, v) end end
    -- every position: the root unit gathered (the block units gather themselves)
    model:unshard()
    local all = model:logits(x):tolist()
    model:reshard()
    for b = 1, B do for t = 1, T do for v = 1, V do compare(all[b][t][v], b, t, v) end end end
  end)
end

local cases = {
  { "full_shard", {}, 1e-5 },
  { "shard_grad_op", {}, 1e-5 },
  { "no_shard", {}, 1e-5 },
  { "full_shard bf16", { mixed_precision = { param = "bf16", reduce = "f32" } }, 2e-2, 0.1 },
}
for _, case in ipairs(cases) do
  local opts = { strategy = case[1]:match("^%S+") }
  for k, v in pairs(case[2]) do opts[k] = v end
  local model = nn.GPT.from_pretrained(FIXTURE, { fsdp = opts })
  if not model.all_units then fail("%s: from_pretrained with fsdp opts gave an unwrapped model", case[1]) end
  check_model(model, case[1], case[3], case[4])
end

-- a bf16 file (each rank reads its own range of it) into f32 masters: the values are the
-- fixture's rounded to bf16, which the shard views hold exactly
local half = ("%s/shard_hf_fsdp_bf16_%d_%d"):format(TMP, env.world, env.rank)
os.execute("rm -rf '" .. half .. "' && mkdir -p '" .. half .. "' && cp " .. FIXTURE .. "/config.json '" .. half .. "'")
local fixture = S.load(FIXTURE .. "/model.safetensors")
local halves = {}
for name, t in pairs(fixture) do halves[name] = t:dtype() == "f32" and t:dim() > 0 and t:to("bf16") or t end
S.save(half .. "/model.safetensors", halves)
local hm = nn.GPT.from_pretrained(half, { fsdp = { strategy = "full_shard" } })
for _, u in ipairs(hm.all_units) do
  for i, t in ipairs(u.params) do
    local slot = u.fp:slot(i)
    local name = hm.names[t]
    if not slot.tied_to and slot.own_numel > 0 and not require("shard.io.hf").is_conv1d(name) then
      local view = u.fp:shard_view(i)
      local want = halves[name]:to("f32"):reshape(-1):narrow(1, slot.own_start + 1, slot.own_numel):tolist_flat()
      local got = view:tolist_flat()
      for k = 1, #want do if got[k] ~= want[k] then fail("bf16 file: %s[%d] = %.9g, want %.9g", name, slot.own_start + k, got[k], want[k]) end end
      view:free()
    end
  end
end
check_model(hm, "bf16 file", 2e-2, 0.1)

-- a model wrapped by the caller
local wrapped = shard.fsdp.wrap(function()
  shard.manual_seed(9)
  return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 64, block_size = 32 }
end, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
hf.load_into(wrapped, FIXTURE)
check_model(wrapped, "load_into", 1e-5)

-- export_hf gathers the shards; rank 0 writes; the file holds the fixture's tensors exactly
local out = ("%s/shard_hf_fsdp_%d"):format(TMP, env.world)
if env.rank == 0 then os.execute("rm -rf '" .. out .. "'") end
env.barrier()
shard.export_hf(wrapped, out)
local got = S.load(out .. "/model.safetensors")
for name, t in pairs(S.load(FIXTURE .. "/model.safetensors")) do
  if not name:match("attn%.bias$") and not name:match("masked_bias$") then
    local g = got[name]
    if not g then fail("export lacks %s", name) end
    local a, b = t:tolist_flat(), g:tolist_flat()
    for i = 1, #a do if a[i] ~= b[i] then fail("export: %s[%d] = %.9g, the fixture has %.9g", name, i, b[i], a[i]) end end
  end
end

-- a mis-shaped file is refused on every rank, naming the tensor, and leaves the model as it was
local bad = ("%s/shard_hf_fsdp_bad_%d_%d"):format(TMP, env.world, env.rank)
os.execute("rm -rf '" .. bad .. "' && mkdir -p '" .. bad .. "' && cp " .. FIXTURE .. "/config.json '" .. bad .. "'")
local dict = S.load(FIXTURE .. "/model.safetensors")
dict["transformer.h.1.mlp.c_proj.weight"] = shard.zeros({ 16, 64 })
S.save(bad .. "/model.safetensors", dict)
local ok, err = pcall(hf.load_into, wrapped, bad)
if ok or not tostring(err):find("'transformer.h.1.mlp.c_proj.weight' is 16x64 in the file but the model needs 64x16", 1, true) then
  fail("a mis-shaped file was not refused clearly: %s", tostring(err))
end
check_model(wrapped, "after a refused load", 1e-5)
env.barrier()
if env.rank == 0 then print(("hf_fsdp_load: world %d ok"):format(env.world)) end
