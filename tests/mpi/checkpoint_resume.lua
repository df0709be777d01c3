-- shard.checkpoint: resume is exact. Run by tests/run.sh under mpirun -np 1..4 with no
-- CKPT_MODE: training 2N steps is bitwise the same (every loss, every f32 master, every
-- AdamW moment) as training N, saving, building everything afresh (other init seed, other
-- RNG state), loading and training N more, under full_shard (and hybrid_shard at even world
-- sizes), with a synchronous and an asynchronous save; dropout is on, so the RNG state and the
-- data position have to come back too. tests/spec/checkpoint_resume_spec.lua runs the same
-- script as separate processes (CKPT_MODE=run) for the new-process, resharding and kill tests:
--   CKPT_STRATEGY none|full_shard|hybrid_shard  CKPT_HYBRID G  CKPT_STEPS total steps
--   CKPT_FROM dir (resume from its latest)  CKPT_SAVE_DIR dir  CKPT_SAVE_AT step (or "each")
--   CKPT_OUT path: rank 0 writes the per-step losses and the final f32 parameters there
--   CKPT_DROPOUT p  CKPT_MARK path: touched just before the save of CKPT_SAVE_AT (kill test)
local shard = require("shard")
local env = shard.init()
local nn, fsdp, optim, data = shard.nn, shard.fsdp, shard.optim, shard.data
local ck = require("shard.checkpoint")
local S = require("shard.io.safetensors")
local full_state = require("shard.io.state_dict").state_dict

local function getenv(k, default) local v = os.getenv(k); if v == nil or v == "" then return default end; return v end
local DROPOUT = tonumber(getenv("CKPT_DROPOUT", "0.1"))
-- (a key bias has no true gradient: Adam turns its rounding noise into full steps, so the
-- resharding test, whose reductions run in another order, turns biases off)
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = getenv("CKPT_BIAS", "1") == "1",
              dropout = DROPOUT }
local TMP = getenv("SHARD_TEST_TMP", "/tmp")

-- a fixed token stream (no file needed)
local ffi = require("ffi")
local NTOK = 4000
local TOKENS = { buf = ffi.new("uint16_t[?]", NTOK), n = NTOK, path = "synthetic" }
for i = 0, NTOK - 1 do TOKENS.buf[i] = (i * 7 + math.floor(i / 13)) % 11 end

local function build(strategy, hybrid, seed)
  local function make() shard.manual_seed(seed); return nn.GPT(CFG) end
  if strategy == "none" then return make() end
  return fsdp.wrap(make, { policy = fsdp.policy.transformer{ nn.Block }, strategy = strategy, hybrid_group = hybrid })
end

local lr_at = optim.cosine_schedule{ lr = 1e-2, min_lr = 1e-3, warmup = 2, decay_iters = 12 }

-- Trains up to o.steps; returns model, optimizer, losses (by step number, 1-based).
local function run(o)
  local model = build(o.strategy, o.hybrid, o.seed or 5)
  local opt = optim.AdamW(model, { lr = 1e-2, betas = { 0.9, 0.99 }, weight_decay = 0.1 })
  local loader = data.tokens{ tokens = TOKENS, block = 8, batch = 12, seed = 3, rank = env.rank, world = env.world }
  shard.manual_seed(o.rng_seed or 11)
  local start = 0
  if o.from then start = ck.load(o.from, { model = model, optim = opt, data = loader }).step end
  local losses = {}
  for it = start, o.steps - 1 do
    opt:set_lr(lr_at(it))
    local x, y = loader:next()
    local loss = model(x, y)
    loss:backward()
    fsdp.clip_grad_norm(model, 1.0)
    opt:step()
    opt:zero_grad(true)
    losses[it + 1] = env.all_reduce_mean(loss:item())
    loss:free(); x:free(); y:free()
    if o.save_dir and (o.save_at == it + 1 or o.save_at == "each") then
      if o.mark and o.save_at == it + 1 then io.open(o.mark, "w"):close() end
      ck.save(o.save_dir, { model = model, optim = opt, step = it + 1, data = loader, async = o.async, keep = o.keep,
                            config = CFG, extra = { note = "test" } })
    end
  end
  if o.save_dir and o.save_at == start and start == o.steps then   -- load, then save in this layout
    ck.save(o.save_dir, { model = model, optim = opt, step = start, data = loader, config = CFG })
  end
  ck.wait()
  return model, opt, losses
end

local function params_of(model)
  local sd = full_state(model)
  local out = {}
  for name, t in pairs(sd) do out[name] = t:tolist_flat(); t:free() end
  return out
end

local function fail(fmt, ...) error(("rank %d world %d: " .. fmt):format(env.rank, env.world, ...), 0) end

local function same_params(what, a, b, tol)
  for name, va in pairs(a) do
    local vb = b[name] or fail("%s: no parameter %s", what, name)
    for i = 1, #va do
      local d = math.abs(va[i] - vb[i])
      if (tol == 0 and va[i] ~= vb[i]) or d > (tol or 0) then
        fail("%s: %s[%d] is %.9g, expected %.9g", what, name, i, vb[i], va[i])
      end
    end
  end
end

local function read_all(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end

local mode = getenv("CKPT_MODE", "self")
if mode == "run" then
  local model, opt, losses = run{ strategy = getenv("CKPT_STRATEGY", "full_shard"), hybrid = tonumber(getenv("CKPT_HYBRID", "")),
    steps = tonumber(getenv("CKPT_STEPS", "6")), from = getenv("CKPT_FROM", nil), save_dir = getenv("CKPT_SAVE_DIR", nil),
    save_at = tonumber(getenv("CKPT_SAVE_AT", "")) or getenv("CKPT_SAVE_AT", nil), mark = getenv("CKPT_MARK", nil),
    keep = tonumber(getenv("CKPT_KEEP", "0")), async = getenv("CKPT_ASYNC", "0") == "1",
    seed = tonumber(getenv("CKPT_SEED", "5")), rng_seed = tonumber(getenv("CKPT_RNG_SEED", "11")) }
  local sd = full_state(model)
  local out = getenv("CKPT_OUT", nil)
  if out and env.rank == 0 then
    local steps, values = {}, {}
    for s, l in pairs(losses) do steps[#steps + 1] = s end
    table.sort(steps)
    for i, s in ipairs(steps) do values[i] = losses[s] end
    if getenv("CKPT_DUMP_OPT", "0") == "1" then   -- an unwrapped model's moments, whole
      for _, e in ipairs(opt:state_dict(function(t)
        for _, np in ipairs(model:named_parameters()) do if np.tensor.p == t.p then return np.name end end
      end).entries) do
        for k, t in pairs(e.state) do sd[k .. "/" .. e.name] = t end
      end
    end
    sd["losses"] = shard.tensor(#values > 0 and values or { 0 }, { dtype = "f64", device = "cpu" })
    S.save(out, sd, { first_step = tostring(steps[1] or 0), n = tostring(#steps) })
  end
  env.barrier()
  os.exit(0)
end

-- self-test: continuous 2N against N + save + fresh build + load + N, in one process
local N = 3
local cases = { { strategy = "full_shard" } }
if env.world % 2 == 0 then cases[#cases + 1] = { strategy = "hybrid_shard", hybrid = 2 } end
if env.world == 1 then cases[#cases + 1] = { strategy = "none" } end
for _, c in ipairs(cases) do
  local ref_model, ref_opt, ref_losses = run{ strategy = c.strategy, hybrid = c.hybrid, steps = 2 * N }
  local ref = params_of(ref_model)
  local function fresh(name)
    local dir = TMP .. ("/ckpt_resume_%s_%s_%d"):format(name, c.strategy, env.world)
    if env.rank == 0 then shard.C.sh_ckpt_remove_tree(dir) end
    env.barrier()
    return dir
  end
  -- the straight run's end state, saved, to compare every byte (moments, RNG, data position) with
  local ref_dir = fresh("ref")
  ck.save(ref_dir, { model = ref_model, optim = ref_opt, step = 2 * N, config = CFG })
  for _, async in ipairs { false, true } do
    local dir = fresh(tostring(async))
    run{ strategy = c.strategy, hybrid = c.hybrid, steps = N, save_dir = dir, save_at = N, async = async }
    -- a fresh model, optimizer and loader, another init and another RNG state: all from the checkpoint
    local model, opt, losses = run{ strategy = c.strategy, hybrid = c.hybrid, steps = 2 * N, from = dir, seed = 99, rng_seed = 42 }
    for s = N + 1, 2 * N do
      if losses[s] ~= ref_losses[s] then fail("%s async=%s: loss at step %d is %.17g after resume, %.17g straight", c.strategy, tostring(async), s, losses[s], ref_losses[s]) end
    end
    same_params(c.strategy .. " resumed", ref, params_of(model), 0)
    if opt.step_count ~= 2 * N then fail("step count %d after resume", opt.step_count) end
    local end_dir = fresh("end_" .. tostring(async))
    ck.save(end_dir, { model = model, optim = opt, step = 2 * N, config = CFG })
    local file = ("/step-%d/rank-%05d-of-%05d.safetensors"):format(2 * N, env.rank, env.world)
    if read_all(end_dir .. file) ~= read_all(ref_dir .. file) then fail("%s async=%s: the state after resume differs from the straight run's (%s)", c.strategy, tostring(async), file) end
    if read_all(end_dir .. ("/step-%d/index.json"):format(2 * N)) ~= read_all(ref_dir .. ("/step-%d/index.json"):format(2 * N)) then
      fail("%s async=%s: index.json (RNG, data position, optimizer step) differs from the straight run's", c.strategy, tostring(async))
    end
  end
end
