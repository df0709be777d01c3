-- A FlatParameter with CPU offload (runtime/dist/flatparam.h's sh_flatparam_set_offload) on a CUDA
-- device (the emulated one under make test), one process, no group (so no gather stands
-- between the shard's copy to the device and its use): against values written down here, exact (multiples of 1/4, exact in
-- bf16 too).
--   * the shard moves to the host (counted in its memory stats until freed) and comes back to
--     the device when unsharded, with what the host wrote into it since (f32, and cast to bf16
--     on the device);
--   * reduce_grad lands in the host grad; a second one before zero_grad adds to it (the host
--     stage), after zero_grad sets it; a bf16 reduction is cast to the f32 grad;
--   * a shard copy still in flight when the host writes the shard after grad_shard: the
--     grad's copy is ordered after it on the device, so the copy reads the old shard (the
--     emulator runs a copy only when the host waits for something behind it); and under bf16
--     compute queued before the host changed the shard sees the old values;
--   * the errors: no_shard, a grad already there, undoing it; on the CPU it does nothing.
local shard = require("shard")
local flatparam = require("shard.flatparam")
local rt = require("shard.ffi")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")

assert(rt.cuda_device_count() > 0, "offload_flatparam: no CUDA device")
shard.C.sh_cuda_init(0)
local dev = "cuda:0"

local A = { 3, 4 }     -- p1 is 3x4, p2 has 5 elements: 17 in all
local function values(n, scale, shift)
  local t = {}
  for i = 1, n do t[i] = (i + shift) * scale end
  return t
end
local V1, V2 = values(12, 0.25, 0), values(5, 0.25, 12)
local G1, G2 = values(12, -0.5, 3), values(5, 0.5, -2)

local function tensor_of(list, shape, device, dtype)
  local t = shard.tensor(list, { dtype = "f32", device = "cpu" }):reshape(shape)
  local out = t:to(device):to(dtype or "f32")
  t:free()
  return out
end

local function params()
  local p1, p2 = tensor_of(V1, A, dev), tensor_of(V2, { 5 }, dev)
  p1.requires_grad = true
  p2.requires_grad = true
  return p1, p2
end

local function list_of(t)
  local c = t:to("cpu"):to("f64")
  local l = c:tolist_flat()
  c:free()
  return l
end

local function same(got, want, what)
  local ok = #got == #want
  for i = 1, #want do ok = ok and got[i] == want[i] end
  support.check(ok, ("%s: got {%s}, want {%s}"):format(what, table.concat(got, ","), table.concat(want, ",")))
end

local function concat(a, b, k)
  local out = {}
  for i = 1, #a do out[#out + 1] = a[i] * (k or 1) end
  for i = 1, #b do out[#out + 1] = b[i] * (k or 1) end
  return out
end

local function set_grads(p1, p2, dtype)
  p1.grad = tensor_of(G1, A, dev, dtype)
  p2.grad = tensor_of(G2, { 5 }, dev, dtype)
end

local function grad_list(fp)
  local g = fp:grad_shard()
  if not g then return nil end
  support.check(g:device() == "cpu", "the grad shard of an offloaded FlatParameter is on the host, got " .. g:device())
  local l = list_of(g)
  g:free()
  return l
end

-- f32: there and back, grads set, added, set again
do
  local p1, p2 = params()
  local fp = flatparam.new({ p1, p2 })
  local before = shard.memory.stats("cpu").by_tag
  support.check(fp:set_offload() == true, "set_offload on cuda moves the shard")
  local after = shard.memory.stats("cpu").by_tag
  support.check(after.param - before.param == 128, ("the host counts the pinned shard (17 f32, 128 bytes rounded) " ..
                "as param memory: %d bytes more"):format(after.param - before.param))
  local s = fp:shard()
  support.check(s:device() == "cpu", "the shard of an offloaded FlatParameter is on the host, got " .. s:device())
  same(list_of(s), concat(V1, V2), "the host shard")
  s:free()
  fp:unshard()
  same(list_of(p1), V1, "p1 unsharded from the host shard")
  same(list_of(p2), V2, "p2 unsharded from the host shard")
  for _, k in ipairs({ 2, 0.5 }) do   -- the host changes the shard: the next unshard sees it
    fp:reshard()
    s = fp:shard()
    s:scale_(k)
    s:free()
    fp:unshard()
    same(list_of(p1), values(12, k == 2 and 0.5 or 0.25, 0), ("p1 unsharded after the host scaled the shard by %g"):format(k))
  end
  set_grads(p1, p2)
  fp:reduce_grad("sum")
  fp:reshard()
  same(grad_list(fp), concat(G1, G2), "the host grad after one reduce_grad")
  fp:unshard()
  set_grads(p1, p2)
  fp:reduce_grad("sum")
  set_grads(p1, p2)          -- a third before anyone read the second: the second is added first
  fp:reduce_grad("sum")
  fp:reshard()
  same(grad_list(fp), concat(G1, G2, 3), "the host grad after three reduce_grads (accumulated)")
  fp:zero_grad(true)
  support.check(grad_list(fp) == nil, "no grad shard after zero_grad")
  fp:unshard()
  set_grads(p1, p2)
  fp:reduce_grad("sum")
  fp:reshard()
  same(grad_list(fp), concat(G1, G2), "the host grad after zero_grad and one reduce_grad (set, not added)")

  -- the shard's copy in flight while the host writes the shard behind grad_shard
  fp:unshard()
  set_grads(p1, p2)
  fp:reshard()
  fp:unshard_start()         -- the copy of the shard to the device is queued, not run
  fp:reduce_grad("sum")
  local g = fp:grad_shard()  -- waits for the grad's copy, and so for the shard's
  g:free()
  s = fp:shard()
  s:fill_(0)
  s:free()
  fp:unshard_wait()
  same(list_of(p1), V1, "p1 gathered by a copy queued before the host zeroed the shard")
  fp:free()
  after = shard.memory.stats("cpu").by_tag
  support.check(after.param == before.param and after.grad == before.grad, ("freed, the pinned shard, grad and stage " ..
                "leave the host's stats: param %+d, grad %+d bytes"):format(after.param - before.param, after.grad - before.grad))
end

-- bf16 parameters and reductions: cast on the device both ways
do
  local p1, p2 = params()
  local fp = flatparam.new({ p1, p2 }, { param = "bf16", reduce = "bf16" })
  fp:set_offload()
  fp:unshard()
  support.check(p1:dtype() == "bf16", "p1 computes in bf16, got " .. p1:dtype())
  same(list_of(p1), V1, "p1 in bf16 from the f32 host shard")
  set_grads(p1, p2, "bf16")
  fp:reduce_grad("sum")
  fp:reshard()
  local g = fp:grad_shard()
  support.check(g:dtype() == "f32", "the host grad is f32 (the master dtype), got " .. g:dtype())
  g:free()
  same(grad_list(fp), concat(G1, G2), "the host grad from a bf16 reduction")
  -- compute queued before the host changes the shard sees the old values, though the
  -- shard's copy only runs later: the host waits for that copy before casting again
  fp:unshard()
  local y = p1 * 1
  fp:reshard()
  local s = fp:shard()
  s:scale_(2)
  s:free()
  fp:unshard_start()
  same(list_of(y), V1, "compute queued before the host scaled the shard")
  fp:unshard_wait()
  same(list_of(p1), values(12, 0.5, 0), "p1 in bf16 after the host scaled the shard")
  y:free()
  fp:free()
end

-- errors, and the CPU
local function err_of(f)
  local ok, e = pcall(f)
  return not ok and tostring(e) or ""
end
do
  local p1, p2 = params()
  local fp = flatparam.new({ p1, p2 }, { no_shard = true })
  local e = err_of(function() fp:set_offload() end)
  support.check(e:find("no_shard", 1, true) and e:find("full_shard", 1, true), "set_offload under no_shard: " .. e)
  fp:free()
  p1, p2 = params()
  fp = flatparam.new({ p1, p2 })
  fp:unshard()
  set_grads(p1, p2)
  fp:reduce_grad("sum")
  fp:reshard()
  e = err_of(function() fp:set_offload() end)
  support.check(e:find("holds no grad", 1, true), "set_offload with a grad: " .. e)
  fp:zero_grad(true)
  fp:set_offload()
  e = err_of(function() rt.check(rt.C.sh_flatparam_set_offload(fp.p, 0)) end)
  support.check(e:find("cannot be brought back", 1, true), "undoing offload: " .. e)
  fp:free()
  local c1 = tensor_of(V1, A, "cpu")
  fp = flatparam.new({ c1 })
  support.check(fp:set_offload() == false, "set_offload on the CPU moves nothing")
  fp:free()
end

support.finish("offload_flatparam (cuda:0)")
