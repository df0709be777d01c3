-- FSDP's ignored and frozen parameters against one process (issue 11), full_shard, 2 SGD steps.
-- ignored: ignored_modules = { block 1's MLP } and ignored_params = { ln_f.weight } stay out of
--   every FlatParameter (their own tensors, with storage, between steps), replicated: each
--   rank's copy equals the reference after the steps, and grads before the optimizer match.
--   A frozen ignored parameter gets no grad and never changes.
-- frozen (LoRA-style): every block's c_attn and c_fc weights and the token embedding frozen,
--   the rest trainable, so units mix both: the frozen parameters get no grad, never change,
--   and send nothing: the step's reduce-scatter bytes scale with the trainable padded elements
--   only (against the same model with nothing frozen), and a block frozen whole issues no
--   reduce-scatter at all. Trainable grads and parameters match the reference.
local shard = require("shard")
local env = shard.init()
local fsdp, nn, optim, comm = shard.fsdp, shard.nn, shard.optim, shard.comm
local rank, size = env.rank, env.world
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = true }
local B, STEPS = 2, 2
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function block(m, i) return m.transformer.h._children[i].module end
local function new_opt(m) return optim.SGD(m, { lr = 0.1, momentum = 0.9 }) end
local POLICY = fsdp.policy.transformer{ nn.Block }

local function batch(step)
  shard.manual_seed(40 + step)
  local u = shard.rand({ size * B, CFG.block_size }); local s = u * CFG.vocab_size
  local x = s:to("i64"); u:free(); s:free()
  return x
end
local function mine(x) return x:narrow(1, rank * B + 1, B):contiguous() end

-- freeze(model) marks what the case freezes; returns nothing
local function reference(freeze)
  shard.manual_seed(9)
  local m = nn.GPT(CFG)
  freeze(m)
  local opt, grads = new_opt(m), {}
  for step = 1, STEPS do
    local x = batch(step)
    local loss = m(x, x)
    loss:backward()
    grads[step] = {}
    for _, np in ipairs(m:named_parameters()) do
      grads[step][np.name] = np.tensor.p.grad ~= nil and np.tensor.grad:tolist_flat() or false
    end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free()
  end
  local params = {}
  for _, np in ipairs(m:named_parameters()) do params[np.name] = np.tensor:tolist_flat() end
  return grads, params
end

local function worst_of(model, want, get)
  local worst, where = 0, "nothing"
  for _, e in ipairs(model:optim_groups()) do
    local t = get(e)
    if t then
      local got = t:tolist_flat(); t:free()
      for i = 1, #got do
        local r = want[e.name][e.start + i]
        local d = math.abs(got[i] - r) / math.max(1, math.abs(r))
        if d > worst then worst, where = d, ("%s[%d] %.9g vs %.9g"):format(e.name, e.start + i, got[i], r) end
      end
    end
    e.tensor:free()
  end
  return worst, where
end

-- trains a wrapped model beside the reference; per step: reduce-scatter count and bytes
local function train(model, ref_grads, what)
  local opt, rs = new_opt(model), {}
  for step = 1, STEPS do
    local gx = batch(step); local x = mine(gx); gx:free()
    comm.reset_counts()
    local loss = model(x, x)
    loss:backward()
    rs[step] = { count = comm.count("reduce_scatter"), bytes = comm.bytes("reduce_scatter") }
    if ref_grads then
      local w, where = worst_of(model, ref_grads[step], function(e) return e.grad() end)
      if w > 1e-6 then fail("%s step %d: gradient differs from one process by %.3g at %s", what, step, w, where) end
    end
    opt:step(); opt:zero_grad(true)
    loss:free(); x:free()
  end
  return rs
end

local function same(a, b) for i = 1, #b do if math.abs(a[i] - b[i]) > 1e-6 * math.max(1, math.abs(b[i])) then return false end end return true end

---------------------------------------------------------------------------------------------
-- bad input: named, before anything is flattened

for _, c in ipairs {
  { { ignored_params = { 5 } }, "ignored_params[1] is a number, not a parameter tensor" },
  { { ignored_modules = { "mlp" } }, "ignored_modules[1] is a string, not a module" },
  { { ignored_params = { shard.zeros({ 3 }) } }, "is not a parameter of the model" },
} do
  local ok, err = pcall(fsdp.wrap, nn.GPT(CFG), c[1])
  if ok or not tostring(err):find(c[2], 1, true) then fail("bad input: expected '%s', got %s", c[2], tostring(err)) end
end

---------------------------------------------------------------------------------------------
-- ignored modules and parameters

do
  local function freeze(m) block(m, 2).ln_2.bias:requires_grad_(false) end
  local ref_grads, ref_params = reference(freeze)
  shard.manual_seed(9)
  local m = nn.GPT(CFG)
  freeze(m)
  local mlp, lnf, frozen = block(m, 1).mlp, m.transformer.ln_f.weight, block(m, 2).ln_2.bias
  local model = fsdp.wrap(m, { policy = POLICY, strategy = "full_shard", ignored_modules = { mlp }, ignored_params = { lnf, frozen } })
  for _, u in ipairs(model.all_units) do
    for _, t in ipairs(u.params) do
      if t == lnf or t == frozen or t == mlp.c_fc.weight then fail("ignored: unit %s holds an ignored parameter", u.name) end
    end
  end
  train(model, ref_grads, "ignored")
  if frozen.p.grad ~= nil then fail("ignored: the frozen ignored parameter has a grad") end
  for name, t in pairs { ["transformer.h.0.mlp.c_fc.weight"] = mlp.c_fc.weight, ["transformer.h.0.mlp.c_proj.bias"] = mlp.c_proj.bias,
                         ["transformer.ln_f.weight"] = lnf, ["transformer.h.1.ln_2.bias"] = frozen } do
    if t:is_freed() then fail("ignored: %s lost its storage", name)
    elseif not same(t:tolist_flat(), ref_params[name]) then fail("ignored: %s differs from one process after %d steps", name, STEPS) end
  end
  local w, where = worst_of(model, ref_params, function(e) return e.tensor:clone() end)
  if w > 1e-6 then fail("ignored: parameters differ from one process by %.3g at %s", w, where) end
  if rank == 0 then print(("ignored world %d: replicated ignored parameters and sharded ones match one process (%.3g)"):format(size, w)) end

  -- both checkpoint forms keep the ignored parameters: loaded into a fresh wrapped model,
  -- every parameter (sharded or ignored) equals one process's after the steps
  local dir = ("%s/shard_ignored_ckpt_%d"):format(os.getenv("SHARD_TEST_TMP") or "/tmp", size)
  if rank == 0 then os.execute("rm -rf " .. require("shard.ffi").shell_quote(dir)) end
  env.barrier()
  shard.checkpoint.save(dir, { model = model, step = STEPS })
  shard.save(model, dir .. ".safetensors")
  for _, how in ipairs { "checkpoint", "save" } do
    shard.manual_seed(123)              -- other values than the trained ones
    local fm = nn.GPT(CFG)
    local fmlp, flnf, ffrozen = block(fm, 1).mlp, fm.transformer.ln_f.weight, block(fm, 2).ln_2.bias
    local fresh = fsdp.wrap(fm, { policy = POLICY, strategy = "full_shard", ignored_modules = { fmlp }, ignored_params = { flnf, ffrozen } })
    if how == "checkpoint" then shard.checkpoint.load(dir, { model = fresh }) else shard.load(fresh, dir .. ".safetensors") end
    for name, t in pairs { ["transformer.h.0.mlp.c_fc.weight"] = fmlp.c_fc.weight, ["transformer.ln_f.weight"] = flnf,
                           ["transformer.h.1.ln_2.bias"] = ffrozen } do
      if not same(t:tolist_flat(), ref_params[name]) then fail("ignored, %s: %s was not restored", how, name) end
    end
    local fw, fwhere = worst_of(fresh, ref_params, function(e) return e.tensor:clone() end)
    if fw > 1e-6 then fail("ignored, %s: parameters differ from one process by %.3g at %s", how, fw, fwhere) end
  end
end

---------------------------------------------------------------------------------------------
-- frozen and trainable parameters in one unit

do
  local function freeze(m)
    m.transformer.wte.weight:requires_grad_(false)
    for i = 1, CFG.n_layer do
      block(m, i).attn.c_attn.weight:requires_grad_(false)
      block(m, i).mlp.c_fc.weight:requires_grad_(false)
    end
  end
  local ref_grads, ref_params = reference(freeze)
  local trainable_numel = 0   -- counted on the reference, not on the wrap
  for name, g in pairs(ref_grads[1]) do if g then trainable_numel = trainable_numel + #g end end
  local function build(f) return function() shard.manual_seed(9); local m = nn.GPT(CFG); f(m); return m end end
  local all = fsdp.wrap(build(function() end), { policy = POLICY, strategy = "full_shard" })
  local rs_all = train(all, nil, "unfrozen")
  local padded_all = 0
  for _, u in ipairs(all.all_units) do padded_all = padded_all + u.info.padded_numel end

  local model = fsdp.wrap(build(freeze), { policy = POLICY, strategy = "full_shard" })
  local frozen_tensors = { model.transformer.wte.weight }
  local trainable_units = 1 + CFG.n_layer   -- the root and each block, all of them mixed
  for i = 1, CFG.n_layer do
    local b = model.transformer.h._children[i].module.module
    frozen_tensors[#frozen_tensors + 1] = b.attn.c_attn.weight
    frozen_tensors[#frozen_tensors + 1] = b.mlp.c_fc.weight
  end
  local rs = train(model, ref_grads, "frozen")
  for _, t in ipairs(frozen_tensors) do if t.p.grad ~= nil then fail("frozen: %s has a grad", t:describe()) end end
  for step = 1, STEPS do
    -- at the unfrozen model's bytes per element: the trainable elements, plus at most
    -- size - 1 elements of padding per unit
    local per = rs_all[step].bytes / padded_all
    local lo, hi = per * trainable_numel, per * (trainable_numel + trainable_units * (size - 1))
    if rs[step].bytes < lo or rs[step].bytes > hi or rs[step].count ~= trainable_units then
      fail("frozen step %d: %d reduce-scatters of %d bytes; expected %d of %d to %d bytes (%d trainable elements)",
        step, rs[step].count, rs[step].bytes, trainable_units, lo, hi, trainable_numel)
    end
  end
  -- frozen parameters gathered back equal the initial ones, trainable the reference's
  local w, where = worst_of(model, ref_params, function(e) return e.tensor:clone() end)
  if w > 1e-6 then fail("frozen: trainable parameters differ from one process by %.3g at %s", w, where) end
  for _, u in ipairs(model.all_units) do
    if not u.trainable and u.fp then
      for i, t in ipairs(u.params) do
        local slot = u.fp:slot(i)
        if not slot.tied_to and slot.own_numel > 0 then
          local v = u.fp:shard_view(i)
          local name = model.names[t]
          local want = {}
          for k = 1, slot.own_numel do want[k] = ref_params[name][slot.own_start + k] end
          if not same(v:tolist_flat(), want) then fail("frozen: %s changed", name) end
          v:free()
        end
      end
    end
  end
  if rank == 0 then
    print(("frozen world %d: %d of %d elements trainable, %d reduce-scatter bytes a step (unfrozen %d); trainable match one process (%.3g)")
      :format(size, trainable_numel, padded_all, rs[1].bytes, rs_all[1].bytes, w))
  end

  -- a block frozen whole: its unit issues no reduce-scatter
  local whole = fsdp.wrap(build(function(m) for _, t in ipairs(block(m, 1):parameters()) do t:requires_grad_(false) end end),
    { policy = POLICY, strategy = "full_shard" })
  local units = 0
  for _, u in ipairs(whole.all_units) do if u.trainable then units = units + 1 end end
  local c = train(whole, nil, "whole")
  if c[1].count ~= units or units ~= #whole.all_units - 1 then
    fail("whole: %d reduce-scatters for %d trainable units of %d", c[1].count, units, #whole.all_units)
  end
end

env.barrier()
if failures > 0 then os.exit(1) end
