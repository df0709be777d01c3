-- FSDP's public face across ranks (tests/spec/fsdp_face_spec.lua checks it in one process):
-- under full_shard, no_shard and hybrid_shard, each rank's fsdp.local_slices are views of the
-- plain model's elements [start, start + count), every rank lists the same parameters in the
-- same order, the owners together write each element exactly once, and fsdp.gather_full
-- gives every rank the plain model's values; Slice:set then mark_stale loads new values.
local shard = require("shard")
local env = shard.init()
local fsdp, nn = shard.fsdp, shard.nn
local rank, size = env.rank, env.world
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = true }
local failures = 0
local function fail(fmt, ...)
  failures = failures + 1
  io.stderr:write(("rank %d of %d: "):format(rank, size) .. fmt:format(...) .. "\n")
end
local function build() shard.manual_seed(21); return nn.GPT(CFG) end
local function flat(t) return t:tolist_flat() end
local function loss_of(model)
  local x = shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i64" })
  return shard.no_grad(function() return model(x, x):item() end)
end

local ref = build()
local want = {}
for _, np in ipairs(ref:named_parameters()) do want[np.name] = flat(np.tensor) end

for _, opts in ipairs { { strategy = "full_shard" }, { strategy = "no_shard" }, { strategy = "hybrid_shard", hybrid_group = 1 } } do
  local label = opts.strategy
  opts.policy = fsdp.policy.transformer{ nn.Block }
  local model = fsdp.wrap(build, opts)
  local slices = fsdp.local_slices(model)
  -- each slice: this rank's elements of the plain parameter
  local owned = shard.zeros({ #slices }, { dtype = "f64", device = "cpu" })
  local order = shard.zeros({ #slices }, { dtype = "f64", device = "cpu" })
  for i, sl in ipairs(slices) do
    local values = want[sl.name]
    if not values then
      fail("%s: slice %s is not a parameter of the plain model", label, sl.name)
    else
      local v = sl:view()
      local got = flat(v)
      v:free()
      if #got ~= sl.count then fail("%s: %s's view has %d elements, count says %d", label, sl.name, #got, sl.count) end
      for k = 1, #got do
        if got[k] ~= values[sl.start + k] then
          fail("%s: %s element %d is %.9g in the slice, %.9g in the plain model", label, sl.name, sl.start + k, got[k], values[sl.start + k])
          break
        end
      end
      if sl.owner then owned:set({ i }, sl.count) end
      order:set({ i }, #values)
    end
  end
  -- the same list on every rank, and each element written by exactly one owner
  local sizes = order:clone()
  env.group:all_reduce(owned, "sum")
  env.group:all_reduce(order, "sum")
  for i, sl in ipairs(slices) do
    local n = #(want[sl.name] or {})
    if order:get({ i }) ~= n * size then fail("%s: slice %d (%s) is not the same parameter on every rank", label, i, sl.name) end
    if owned:get({ i }) ~= n then fail("%s: the owners of %s write %d of its %d elements", label, sl.name, owned:get({ i }), n) end
    if sizes:get({ i }) ~= n then fail("%s: slice %d's size", label, i) end
  end
  owned:free(); order:free(); sizes:free()
  -- the full state on every rank
  local full = fsdp.gather_full(model)
  for name, values in pairs(want) do
    local t = full[name]
    if not t then fail("%s: gather_full has no %s", label, name)
    else
      local got = flat(t)
      for k = 1, #values do
        if got[k] ~= values[k] then fail("%s: gather_full's %s[%d] is %.9g, plain %.9g", label, name, k, got[k], values[k]); break end
      end
      t:free()
    end
  end
  -- new values through the slices: the next forward computes with them
  local other = nn.GPT(CFG)    -- the generator has moved on: different values
  local by_name = {}
  for _, np in ipairs(other:named_parameters()) do by_name[np.name] = np.tensor end
  for _, sl in ipairs(slices) do sl:set(by_name[sl.name]) end
  fsdp.mark_stale(model)
  local a, b = loss_of(other), loss_of(model)
  if math.abs(a - b) > 1e-6 * math.abs(a) then fail("%s: loss %.7f after set and mark_stale, the values set give %.7f", label, b, a) end
  if rank == 0 then print(("fsdp_face %s world %d: slices, owners, gather_full and set agree with one process"):format(label, size)) end
end
env.barrier()
if failures > 0 then os.exit(1) end
