-- The meta device and `shard estimate --dry-run` (issue 19, item 7). The dry run against real
-- runs at world 1-4 is tests/mpi/dryrun_parity.lua; here: the meta device's accounting and
-- counts against the formulas (2*M*N*K per product; a GPT step's 6 * weights * tokens plus
-- 12 * L * T * C * tokens of attention, nanoGPT's MFU formula), values read as 0, the errors,
-- and a 64-rank dry run of the recipe in seconds.
local shard = require "shard"
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

describe("shard estimate --dry-run", function()
  local RECIPE = " recipes/gpt_shakespeare_char.lua --data=/usr/share/common-licenses/GPL-3 --out_dir=/tmp/shard_dryrun_spec"
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
        -- the vocabulary of the text (the char tokenizer's), read back from the data the run prepared
        V = dofile("/tmp/shard_dryrun_spec/data/meta.lua").vocab_size
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
    assert.matches("this CPU %([%d.]+ GFLOP/s sgemm%)", out)
  end)

  it("matches real runs under the strategies tests/mpi/dryrun_parity.lua does not give its world", function()
    for _, case in ipairs { { 2, "no_shard" }, { 4, "full_shard" } } do
      local out, code = support.shard(("launch --nproc %d --all tests/mpi/dryrun_parity.lua --strategy=%s"):format(case[1], case[2]))
      assert.equal(0, code, out)
      local _, ranks = out:gsub(case[2] .. ", rank %d of %d: peak dry %d+, real %d+ bytes", "")
      assert.equal(case[1], ranks, out)
    end
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
      local shard = require "shard"
      shard.init{ device = "meta" }
      shard.fsdp.wrap(shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 11, block_size = 4 },
        { policy = shard.fsdp.policy.transformer{ shard.nn.Block }, strategy = "hybrid_shard", hybrid_group = 2 }) ]])
    out, code = support.shard("estimate --dry-run --world=4 " .. script)
    assert.equal(1, code)
    assert.matches("dry run: split of dry world by color 0, key 0: the simulated rank 0 cannot know the other ranks' colors", out)
  end)
end)
