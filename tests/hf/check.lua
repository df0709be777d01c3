-- tests/hf/check.lua MODE OUT: shard's side of make check-hf (tests/hf/check.sh), one process
-- (bin/shard run) or under FSDP (bin/shard launch --nproc 2). Rank 0 prints one line per
-- check, "ok   what (numbers)" or "FAIL what (why)"; check.sh counts them.
--   import  OUT/models.json (tests/hf/make_models.py): every model transformers saved loads
--           through nn.GPT/nn.Llama.from_pretrained (under FSDP, full_shard, when the world is
--           larger than one) and gives transformers' logits (float64) on the same ids within TOL
--   export  tiny models trained here (a few AdamW steps, FSDP full_shard at world > 1): a GPT,
--           a Llama with GQA and an untied head, a tied Llama; each exported with
--           shard.export_hf to OUT/export-wW/NAME, its logits on fixed ids written to
--           OUT/export-wW/NAME.safetensors (input_ids, logits); at world > 1 the GPT is also
--           saved with shard.checkpoint.save to OUT/export-wW/ckpt and its full state dict with
--           shard.save to OUT/export-wW/full.safetensors. check_shard_files.py reads them.
local shard = require("shard")
local env = shard.init()
local nn = shard.nn
local S = require("shard.io.safetensors")
local cjson = require("cjson")
local tensor = require("shard.tensor")

local MODE, OUT = arg[1], arg[2]
assert(MODE and OUT, "usage: check.lua import|export OUT")
local TOL = tonumber(os.getenv("CHECK_HF_TOL") or "1e-5")
local where = env.world > 1 and ("FSDP full_shard world " .. env.world) or "one process"

local function say(s) if env.rank == 0 then print(s); io.stdout:flush() end end

-- The largest of v over the ranks.
local function max_over_ranks(v)
  if env.world == 1 then return v end
  local t = tensor.tensor({ v }, { dtype = "f64" })
  env.group:all_reduce(t, "max")
  local r = t:get({ 1 })
  t:free()
  return r
end

-- Every position's logits [B, T, V] of model (plain or FSDP-wrapped) on ids. A wrapped model
-- runs one forward first (the units' order is recorded there), then the root unit is gathered
-- around model:logits, as tests/mpi/hf_fsdp_load.lua does.
local function logits_of(model, ids)
  return shard.no_grad(function()
    if model.all_units then model(ids):free(); model:unshard() end
    local l = model:logits(ids)
    if model.all_units then model:reshard() end
    return l
  end)
end

local function max_abs_diff(a, b)
  local x, y = a:tolist_flat(), b:tolist_flat()
  if #x ~= #y then return math.huge end
  local m = 0
  for i = 1, #x do
    local d = math.abs(x[i] - y[i])
    if d ~= d then return math.huge end
    if d > m then m = d end
  end
  return m
end

local function max_abs(a)
  local m = 0
  for _, v in ipairs(a:tolist_flat()) do m = math.max(m, math.abs(v)) end
  return m
end

local function read_json(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return cjson.decode(s)
end

-- Runs fn() on every rank; a failure on any rank fails the check on all of them (no hang).
local function check(what, fn)
  local ok, msg = pcall(fn)
  local all_ok = env.world == 1 and ok or env.all_true(ok)
  if not all_ok then
    say(("FAIL %s (%s)"):format(what, ok and "another rank failed" or tostring(msg):gsub("\n", " | ")))
  end
end

if MODE == "import" then
  for _, m in ipairs(read_json(OUT .. "/models.json")) do
    local what = ("import %s [%s] %s"):format(m.name, m.sharded and "index.json" or "model.safetensors", where)
    check(what, function()
      local class = m.kind == "gpt2" and nn.GPT or nn.Llama
      local opts = env.world > 1 and { fsdp = { strategy = "full_shard" } } or nil
      if m.refused then   -- an untied GPT-2 head: refused by name, on every rank
        local ok, err = pcall(class.from_pretrained, m.dir, opts)
        if ok or not tostring(err):find("untied lm_head", 1, true) then
          error(ok and "loaded, though shard's GPT ties lm_head to wte" or "refused, but not naming the untied lm_head: " .. tostring(err), 0)
        end
        say(("ok   %s (refused: %s)"):format(what, tostring(err):match("'lm_head.weight'[^\n]*")))
        return
      end
      local model = class.from_pretrained(m.dir, opts)
      local ref = S.load(m.ref)
      local got = logits_of(model, ref.input_ids)
      local err = max_over_ranks(max_abs_diff(got, ref.logits))
      if err > TOL then error(("max |logit - transformers'| = %.3g > %g"):format(err, TOL), 0) end
      say(("ok   %s (max |logit - transformers'| = %.2e, max |logit| %.2f)"):format(what, err, max_abs(ref.logits)))
    end)
  end
elseif MODE == "export" then
  local dir = ("%s/export-w%d"):format(OUT, env.world)
  if env.rank == 0 then os.execute("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "'") end
  if env.world > 1 then env.barrier() end
  local fsdp, optim = shard.fsdp, shard.optim
  local V = 97
  -- every rank its own batch of a fixed token pattern
  local function batch(step)
    local x, y = {}, {}
    for b = 1, 4 do
      x[b], y[b] = {}, {}
      for t = 1, 16 do
        local v = (7 * t + 13 * b + 5 * step + 31 * env.rank) % V
        x[b][t] = v
        y[b][t] = (v * 3 + 1) % V
      end
    end
    return tensor.tensor(x, { dtype = "i64" }), tensor.tensor(y, { dtype = "i64" })
  end
  local MODELS = {
    { name = "gpt2", class = nn.GPT, block = nn.Block,
      cfg = { n_layer = 2, n_head = 4, n_embd = 32, vocab_size = V, block_size = 32, bias = true } },
    { name = "llama-gqa-untied", class = nn.Llama, block = nn.LlamaBlock,
      cfg = { n_layer = 2, n_head = 4, n_kv_head = 2, dim = 32, ffn_dim = 72, vocab_size = V, max_seq_len = 32,
              rope_theta = 500000, norm_eps = 1e-5 } },
    { name = "llama-tied", class = nn.Llama, block = nn.LlamaBlock,
      cfg = { n_layer = 1, n_head = 2, dim = 32, ffn_dim = 48, vocab_size = V, max_seq_len = 32, tie_embeddings = true } },
  }
  for i, m in ipairs(MODELS) do
    local function make() shard.manual_seed(20 + i); return m.class(m.cfg) end
    local model = env.world > 1 and fsdp.wrap(make, { policy = fsdp.policy.transformer{ m.block }, strategy = "full_shard" })
                  or make()
    local opt = optim.AdamW(model, { lr = 1e-2, weight_decay = 0.1 })
    local first, last
    for step = 1, 6 do
      local x, y = batch(step)
      local loss = model(x, y)
      loss:backward()
      opt:step()
      opt:zero_grad(true)
      local l = env.world > 1 and env.all_reduce_mean(loss:item()) or loss:item()
      first = first or l
      last = l
      loss:free(); x:free(); y:free()
    end
    say(("note trained %s %s: loss %.3f -> %.3f in 6 AdamW steps"):format(m.name, where, first, last))
    check(("export_hf %s %s"):format(m.name, where), function()
      shard.export_hf(model, dir .. "/" .. m.name)
      local ids = {}
      for b = 1, 2 do ids[b] = {} for t = 1, 16 do ids[b][t] = (11 * t * t + 17 * b) % V end end
      local x = tensor.tensor(ids, { dtype = "i64" })
      local l = logits_of(model, x)
      if env.rank == 0 then S.save(dir .. "/" .. m.name .. ".safetensors", { input_ids = x, logits = l:to("f64") }) end
      say(("note export_hf %s %s: written"):format(m.name, where))
    end)
    if env.world > 1 and i == 1 then
      check("checkpoint.save " .. where, function()
        shard.checkpoint.save(dir .. "/ckpt", { model = model, optim = opt, step = 6 })
        shard.save(model, dir .. "/full.safetensors")
        say(("note checkpoint.save and shard.save %s: written"):format(where))
      end)
    end
  end
else
  error("check.lua: MODE must be import or export, got " .. tostring(MODE), 0)
end
