-- The meta device and `shard estimate --dry-run` (issue 19, item 7). The dry run against real
-- runs at world 1-4 is tests/mpi/dryrun_parity.lua; here: the meta device's accounting and
-- counts against the formulas (2*M*N*K per product; a GPT step's 6 * weights * tokens plus
-- 12 * L * T * C * tokens of attention, nanoGPT's MFU formula), values read as 0, the errors,
-- and a 64-rank dry run of the recipe in seconds. CPU offload (issue 20): the meta device's
-- host side, and a dry run with --offload against the analytic `shard estimate --offload` and
-- against the same dry run without offload (the dry run against the emulated GPU's real offload
-- is tests/gpu/offload_dryrun.lua).
local shard = require("shard")
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local C = shard.C

local function count(kind) return tonumber(C.sh_meta_count(C["SH_META_" .. kind])) end

describe("the meta device", function()
  it("accounts its tensors in its own pool, by tag, with no host memory", function()
    collectgarbage()
    local cpu0, meta0 = shard.memory.stats("cpu").allocated, shard.memory.stats("meta").allocated
    local big = shard.memory.with_tag("param", shard.empty, { 1024, 1024, 64 }, { device = "meta" })   -- 256 MiB
    local s = shard.memory.stats("meta")
    assert.equal(256 * 1024 * 1024, s.allocated - meta0)
    assert.equal(256 * 1024 * 1024, s.by_tag.param)
    assert.equal(cpu0, shard.memory.stats("cpu").allocated)
    assert.equal("meta", big:device())
    big:free()
    assert.equal(meta0, shard.memory.stats("meta").allocated)
  end)

  it("counts 2*M*N*K FLOPs per product and the bytes each kernel touches", function()
    local M, K, N = 48, 40, 24
    local a = shard.empty({ M, K }, { device = "meta" })
    local b = shard.empty({ K, N }, { device = "meta" })
    C.sh_meta_reset_counts()
    local c = a:matmul(b)
    assert.equal(2 * M * N * K, count("FLOPS_MATMUL"))
    assert.equal(4 * (M * K + K * N + M * N), count("BYTES"))
    -- a linear forward and backward: x [B, T, in] by w [out, in]: forward 2*B*T*out*in, backward twice that
    local x = shard.empty({ 2, 8, K }, { device = "meta" })
    local w = shard.empty({ N, K }, { device = "meta" })
    x.requires_grad, w.requires_grad = true, true
    C.sh_meta_reset_counts()
    local y = shard.F.linear(x, w)
    y:sum():backward()
    assert.equal(3 * 2 * (2 * 8) * N * K, count("FLOPS_MATMUL"))
    -- attention q, k, v [B, H, T, D]: 4*B*H*T*T*D forward, 8*B*H*T*T*D backward
    local q = shard.empty({ 2, 3, 16, 8 }, { device = "meta" })
    q.requires_grad = true
    C.sh_meta_reset_counts()
    local o = shard.F.attention(q, q, q)
    assert.equal(4 * 2 * 3 * 16 * 16 * 8, count("FLOPS_ATTENTION"))
    o:sum():backward()
    assert.equal(12 * 2 * 3 * 16 * 16 * 8, count("FLOPS_ATTENTION"))
    for _, t in ipairs { a, b, c, x, w, y, q, o } do t:free() end
  end)

  it("reads as 0: item, a copy to the cpu, a list", function()
    local t = shard.tensor({ 1, 2, 3 }, { device = "meta" })
    assert.equal(0, t:sum():item())
    local h = shard.full({ 3 }, 7, { device = "cpu" })
    h:copy_(t)
    assert.same({ 0, 0, 0 }, h:tolist_flat())
    assert.same({ 0, 0, 0 }, t:tolist_flat())
    assert.matches("meta", tostring(t))
  end)

  it("names the problem when a meta tensor meets data", function()
    local t = shard.empty({ 4 }, { device = "meta" })
    local ok, err = pcall(require("shard.ffi").check, C.sh_tensor_item(t.p, require("ffi").new("double[1]")))
    assert.is_false(ok)
    assert.matches("needs a cpu tensor, got f32%[4%] meta", err)
    ok, err = pcall(function() shard.comm.world():all_reduce(t, "sum") end)
    assert.is_false(ok)
    assert.matches("all_reduce on world %(rank 0%): f32%[4%] meta is a meta tensor, which only a dry%-run world", err)
    ok, err = pcall(function() return t + shard.zeros({ 4 }, { device = "cpu" }) end)
    assert.is_false(ok)
    assert.matches("meta", err)
  end)
end)

describe("the meta device's host side (CPU offload)", function()
  it("accounts meta:host tensors in a pool of its own and counts their kernels and copies apart", function()
    collectgarbage()
    local cpu0, meta0, host0 = shard.memory.stats("cpu").allocated, shard.memory.stats("meta").allocated,
                               shard.memory.stats("meta:host").allocated
    local h = shard.memory.with_tag("optim", shard.zeros, { 1000 }, { device = "meta:host" })
    local s = shard.memory.stats("meta:host")
    assert.equal(4032, s.allocated - host0)      -- 4000 bytes, 64-byte rounded
    assert.equal(4032, s.by_tag.optim)
    assert.equal(meta0, shard.memory.stats("meta").allocated)
    assert.equal(cpu0, shard.memory.stats("cpu").allocated)
    assert.equal("meta:host", h:device())
    local d = shard.empty({ 1000 }, { device = "meta" })
    C.sh_meta_reset_counts()
    h:add_(h)                                     -- a host kernel: its bytes are not the device's
    assert.equal(8000, count("HOST_BYTES"))
    assert.equal(0, count("BYTES"))
    d:copy_(h)                                    -- host to device and back: what PCIe carries
    h:copy_(d)
    assert.equal(8000, count("COPY_BYTES"))
    assert.equal(0, count("BYTES"))
    local total = h:sum()
    assert.equal(0, total:item())
    total:free()
    local ok, err = pcall(function() shard.comm.world():all_reduce(h, "sum") end)
    assert.is_false(ok)
    assert.matches("f32%[1000%] meta:host is a meta tensor, which only a dry%-run world", err)
    h:free(); d:free()
    assert.equal(host0, shard.memory.stats("meta:host").allocated)
  end)

  it("takes an offloaded FlatParameter's shard and grad, the rest of it running as on a GPU", function()
    local fp_mod = require("shard.flatparam")
    local w = shard.empty({ 10, 7 }, { device = "meta" })
    local b = shard.empty({ 10 }, { device = "meta" })
    w.requires_grad, b.requires_grad = true, true
    local host0, meta0 = shard.memory.stats("meta:host").allocated, shard.memory.stats("meta").allocated
    local fp = fp_mod.new({ w, b }, { master = "f32", param = "bf16" })
    assert.is_true(fp:set_offload())
    local s = shard.memory.stats("meta:host")
    -- the f32 shard (80 elements: 320 bytes) and its bf16 copy for the device (160 -> 192)
    assert.equal(320 + 192, s.allocated - host0)
    -- and the device holds nothing of it: w's and b's storages (280 -> 320, 40 -> 64) went into the shard
    assert.equal(meta0 - 320 - 64, shard.memory.stats("meta").allocated)
    fp:unshard()
    local y = shard.F.linear(shard.empty({ 3, 7 }, { device = "meta", dtype = "bf16" }), w, b)
    y:sum():backward()
    fp:reduce_grad()
    fp:reshard()
    local g = fp:grad_shard()
    assert.equal("meta:host", g:device())
    assert.equal(320 + 192 + 320, shard.memory.stats("meta:host").allocated - host0)   -- + the f32 grad
    g:free(); y:free()
    fp:free()
    assert.equal(host0, shard.memory.stats("meta:host").allocated)
  end)
end)

describe("shard estimate --dry-run", function()
  local TEXT = "/usr/share/common-licenses/GPL-3"
  local RECIPE = " recipes/gpt_shakespeare_char.lua --data=" .. TEXT .. " --out_dir=/tmp/shard_dryrun_spec"
  -- the char tokenizer's vocabulary: the text's distinct bytes (a dry run writes no token files)
  local function vocab_of(path)
    local f = assert(io.open(path, "rb")); local text = f:read("*a"); f:close()
    local seen, n = {}, 0
    for i = 1, #text do local b = text:byte(i); if not seen[b] then seen[b] = true; n = n + 1 end end
    return n
  end
  local function dry(opts, recipe_args)
    local out, code, secs = support.shard("estimate --dry-run --json " .. opts .. RECIPE .. (recipe_args or ""))
    local line = out:match("dryrun (%b{})")
    return line and require("cjson").decode(line), out, code, secs
  end

  it("counts a GPT step's FLOPs as nanoGPT's formula: 6 * weights * tokens + 12 * L * T * C * tokens", function()
    local L, C_, T, B, V = 2, 32, 16, 12, 0
    for world = 1, 4 do
      if 12 % world == 0 then
        local r, out = dry(("--world=%d --rank=0"):format(world),
          (" --n_layer=%d --n_head=2 --n_embd=%d --block_size=%d --batch_size=%d --strategy=full_shard"):format(L, C_, T, B))
        assert(r, out)
        V = vocab_of(TEXT)
        local weights = L * (C_ * 3 * C_ + C_ * C_ + C_ * 4 * C_ + 4 * C_ * C_) + V * C_
        local tokens = B / world * T
        assert.equal(6 * weights * tokens, r.flops_matmul)
        assert.equal(12 * L * T * C_ * tokens, r.flops_attention)
      end
    end
  end)

  it("runs 64 ranks of the recipe's own model in seconds, each holding 1/64 of the sharded state", function()
    local r1, out1 = dry("--world=1", " --strategy=full_shard --batch_size=64")
    assert(r1, out1)
    local r, out, code, secs = dry("--world=64 --rank=63", " --strategy=full_shard --batch_size=64")
    assert(r, out)
    assert.equal(0, code)
    assert.is_true(secs <= 20, ("the 64-rank dry run took %d s"):format(secs))
    -- AdamW's two f32 states per element of the rank's shard: 1/64 of world 1's, padding aside
    local ratio = r1.peak_by_tag.optim / r.peak_by_tag.optim
    assert.is_true(ratio > 60 and ratio <= 64, ("optimizer state at world 1 / world 64: %.2f"):format(ratio))
    assert.is_true(r.count.all_gather > 0 and r.count.reduce_scatter > 0)
    assert.equal(r1.flops / 64, r.flops)
  end)

  it("prints peak memory by tag, the unit at the peak, bytes by collective, FLOPs and device estimates", function()
    local out, code = support.shard("estimate --dry-run --world=64 --local_size=8" .. RECIPE .. " --strategy=hybrid_shard --batch_size=64")
    assert.equal(0, code, out)
    assert.matches("rank 0 of 64 %(8 per node%)", out)
    assert.matches("peak memory %(rank 0%): [%d.]+ [KMG]iB", out)
    assert.matches("reached in: [%w ]+ of [%w.()]+", out)
    assert.matches("all_gather%s+%d+ x", out)
    assert.matches("all_reduce%s+%d+ x", out)        -- across the 8 nodes' replicas
    assert.matches("FLOPs per step %(rank 0%): [%d.]+ [MGT]FLOP", out)
    assert.matches("ESTIMATE", out)
    assert.matches("H100 SXM", out)
    assert.matches("H200 SXM", out)
    assert.matches("this CPU %([%d.]+ [GT]FLOP/s sgemm%)", out)
    -- the step-time table: its columns aligned (every row as long as the header), each bound
    -- a time in shard.units' format ("645 us", "2.0 ms", "3.23 s", "21.8 min") or n/a
    local header = assert(out:match("\n(  device [^\n]+)"), out)
    local rows = 0
    for row in out:gmatch("\n(  [Ht][^\n]+)") do
      if row:find("SXM (", 1, true) or row:find("this CPU", 1, true) then
        rows = rows + 1
        assert.equal(#header, #row, row)
        local bounds = row:match("%)%s+(.*)$"):gsub("%s%s+", "|")
        local n = 0
        for cell in (bounds .. "|"):gmatch("([^|]+)|") do
          n = n + 1
          assert.is_truthy(cell == "n/a" or cell:match("^%d+ us$") or cell:match("^%d+%.%d ms$")
            or cell:match("^%d+%.%d%d s$") or cell:match("^%d+%.%d min$") or cell:match("^%d+%.%d h$"), row)
        end
        assert.equal(5, n, row)
      end
    end
    assert.equal(3, rows, out)
    assert.matches("\n  total +[%d.]+ [KMG]?i?B  +%([%d,]+ B%)", out)
  end)

  it("matches real runs under the strategies tests/mpi/dryrun_parity.lua does not give its world", function()
    for _, case in ipairs { { 2, "no_shard" }, { 4, "full_shard" } } do
      local out, code = support.shard(("launch --nproc %d --all tests/mpi/dryrun_parity.lua --strategy=%s"):format(case[1], case[2]))
      assert.equal(0, code, out)
      local _, ranks = out:gsub(case[2] .. ", rank %d of %d: peak dry %d+, real %d+ bytes", "")
      assert.equal(case[1], ranks, out)
    end
  end)

  -- the recipe's model at world 4 against `shard estimate --offload` on its shapes: the host's
  -- shards, grads and AdamW state equal the analytic per-rank bytes up to the allocator's
  -- 64-byte rounding of each unit's block; the AdamW state and the master shard leave the
  -- device exactly
  it("accounts CPU offload: the host's shards, grads and AdamW state apart from the device's", function()
    for _, param in ipairs { "f32", "bf16" } do
      local recipe = " --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=12 --strategy=full_shard --dtype=" .. param
      local off, out = dry("--world=4 --rank=1", recipe .. " --offload")
      assert(off, out)
      local plain, out2 = dry("--world=4 --rank=1", recipe)
      assert(plain, out2)
      local V = vocab_of(TEXT)
      local est = require("shard.tools.estimate").estimate({ n_layer = 2, n_head = 2, n_embd = 32, vocab_size = V, block_size = 16,
        bias = false, world = 4, strategy = "full_shard", hybrid_group = 0, batch_size = 3, param = param, offload = true,
        model = "gpt", measure = "meta" })
      -- blocks: a shard, a grad (and a bf16 copy) per unit (the root and two blocks), an m and a v
      -- per parameter the rank holds a slice of (at most 2 * 6 + 3, the head tied to wte)
      local units, entries, h = 3, 2 * 6 + 3, off.host_peak_by_tag
      local function near(what, dry_bytes, analytic, blocks)
        assert.is_true(dry_bytes >= analytic and dry_bytes - analytic < 64 * blocks,
          ("%s %s: the dry run's %d bytes, shard estimate --offload's %d"):format(param, what, dry_bytes, analytic))
      end
      local casts = param == "f32" and 0 or units
      near("master shards and their copy", h.param, est.master + est.host_cast, units + casts)
      near("grads", h.grad, est.grads, units)
      near("AdamW state", h.optim, est.adamw, 2 * entries)
      near("host total", h.param + h.grad + h.optim, est.host, 2 * units + casts + 2 * entries)
      assert.equal(plain.peak_by_tag.optim, h.optim)              -- the state moved, all of it
      assert.equal(0, off.peak_by_tag.optim)
      assert.is_true(off.peak <= plain.peak - h.optim, ("%s: device peak %d with offload, %d without"):format(param, off.peak, plain.peak))
      assert.is_true(off.copy_bytes > 0 and off.host_kernel_bytes > 0)
      assert.same(plain.bytes, off.bytes)                        -- the same collectives
      print(("\n%s, world 4: device peak %d with offload, %d without; host %d (param %d, grad %d, optim %d); " ..
             "shard estimate --offload: device %d, host %d; %d bytes copied per step"):format(param, off.peak, plain.peak,
             h.param + h.grad + h.optim, h.param, h.grad, h.optim, est.total, est.host, off.copy_bytes))
    end
  end)

  it("offloads under hybrid sharding and refuses it under no_shard, as fsdp.wrap does", function()
    local r, out = dry("--world=16 --local_size=8 --rank=9", " --strategy=hybrid_shard --batch_size=16 --offload")
    assert(r, out)
    local one = dry("--world=8 --local_size=8 --rank=1", " --strategy=full_shard --batch_size=8 --offload")
    assert.equal(one.host_peak_by_tag.optim, r.host_peak_by_tag.optim)   -- sharded over the node's 8 ranks
    assert.is_true(r.count.all_reduce > one.count.all_reduce)            -- and the grads all-reduced across nodes
    local script = support.script([[
      local shard = require("shard")
      shard.init{ device = "meta" }
      shard.fsdp.wrap(shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 11, block_size = 4 },
        { policy = shard.fsdp.policy.transformer{ shard.nn.Block }, strategy = "no_shard", offload = { params = true } }) ]])
    local code
    out, code = support.shard("estimate --dry-run --world=2 " .. script)
    assert.equal(1, code)
    assert.matches("unit transformer.h.0: offload = { params = true } needs a sharding strategy", out, 1, true)
  end)

  it("refuses bad options and splits it cannot answer, naming them", function()
    local out, code = support.shard("estimate --dry-run --world=4 --rank=4" .. RECIPE)
    assert.equal(2, code)
    assert.matches("%-%-rank=4 is not a rank of %-%-world=4", out)
    out, code = support.shard("estimate --dry-run --wrold=4" .. RECIPE)
    assert.equal(2, code)
    assert.matches("unknown option %-%-wrold=4", out)
    out, code = support.shard("estimate --dry-run --world=4 --steps=2" .. RECIPE)
    assert.equal(2, code)
    assert.matches("%-%-steps >= 3", out)
    -- hybrid_group = 2 splits by rank / 2: the other ranks' colors are unknowable from one rank
    -- (rank 0's first split, color 0 and key 0, looks like a node layout's: it must fail too)
    local script = support.script([[
      local shard = require("shard")
      shard.init{ device = "meta" }
      shard.fsdp.wrap(shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 11, block_size = 4 },
        { policy = shard.fsdp.policy.transformer{ shard.nn.Block }, strategy = "hybrid_shard", hybrid_group = 2 }) ]])
    out, code = support.shard("estimate --dry-run --world=4 " .. script)
    assert.equal(1, code)
    assert.matches("dry run: split of dry world by color 0, key 0: the simulated rank 0 cannot know the other ranks' colors", out)
  end)
end)

describe("dryrun.run_recipe, one run after another in a process", function()
  -- A compiled trace keeps every closure it was recorded through alive: one through
  -- fsdp/grads.lua's optimizer entries held a unit and so the whole model, and a later run in
  -- the same process found the earlier run's FlatParameters still allocated (at world 2 on the
  -- emulated GPU, tests/gpu/offload_dryrun.lua's host peak doubled about 1 run in 8: which
  -- loops get compiled varies from process to process). Here a loop that outlives the run, as
  -- the library's do, is made hot through a closure of the recipe that holds its wrapped model.
  it("leaves nothing of a finished run alive, even what a compiled trace held", function()
    _G.dryrun_spec_spin = function(f) for _ = 1, 1000 do f() end end
    local recipe = os.tmpname()
    local f = assert(io.open(recipe, "w"))
    f:write([[
local shard = require("shard")
local model = shard.fsdp.wrap(shard.nn.Linear(8, 8), {})
dryrun_spec_spin(function() return model end)
]])
    f:close()
    local flatparam, dryrun = require("shard.flatparam"), require("shard.tools.dryrun")
    local made = setmetatable({}, { __mode = "k" })
    local create = flatparam.create
    flatparam.create = function(...) local fp, err = create(...); if fp then made[fp] = true end; return fp, err end
    dryrun.run_recipe(recipe, {}, {}, false)
    flatparam.create = create
    os.remove(recipe)
    collectgarbage(); collectgarbage()
    _G.dryrun_spec_spin = nil
    local n = 0
    for _ in pairs(made) do n = n + 1 end
    assert.equal(0, n, "FlatParameters of the finished run still alive")
  end)
end)
