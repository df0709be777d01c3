-- shard.memory: the allocator's statistics rise and fall with tensors, tags split them,
-- the peak is remembered until reset, and a limit gives a clean out-of-memory error.
local shard = require("shard")
local memory = shard.memory

-- `allocated` counts the bytes asked for, 64-byte aligned.
local function used(n) return math.ceil(n / 64) * 64 end

-- The allocator's size class for n bytes, from its definition: 64-byte steps up to 1 KiB,
-- then four classes per power of two. `reserved` counts whole classes.
local function class_bytes(n)
  for b = 64, 1024, 64 do if n <= b then return b end end
  local p = 10
  while true do
    for k = 1, 4 do
      local b = 2 ^ p + k * 2 ^ (p - 2)
      if n <= b then return b end
    end
    p = p + 1
  end
end

describe("shard.memory", function()
  -- The Lua GC must not free anything behind the test's back while it counts bytes.
  before_each(function() collectgarbage(); collectgarbage("stop") end)
  after_each(function() memory.set_limit(nil); collectgarbage("restart") end)

  it("reports the fields of the allocator's stats", function()
    local s = memory.stats()
    for _, k in ipairs { "allocated", "peak", "reserved", "n_alloc", "n_system_alloc", "limit" } do
      assert.is_number(s[k], k)
    end
    for _, tag in ipairs { "other", "param", "grad", "optim", "activation", "comm" } do
      assert.is_number(s.by_tag[tag], tag)
      assert.is_number(s.peak_by_tag[tag], tag)
    end
    assert.same(memory.stats(), memory.stats("cpu"))
  end)

  it("rises by each tensor's size and falls back after :free()", function()
    memory.empty_cache()
    local base = memory.stats()
    local sizes, ts, expect, expect_reserved = { 1, 100, 2500, 100000 }, {}, base.allocated, base.reserved
    for i, n in ipairs(sizes) do
      ts[i] = shard.empty{ n }
      expect = expect + used(4 * n)
      expect_reserved = expect_reserved + class_bytes(4 * n)   -- fresh blocks: the cache is empty
      assert.equal(expect, memory.stats().allocated)
      assert.equal(expect_reserved, memory.stats().reserved)
    end
    local high = memory.stats()
    assert.equal(base.n_alloc + #sizes, high.n_alloc)
    for _, t in ipairs(ts) do t:free() end
    local after = memory.stats()
    assert.equal(base.allocated, after.allocated)
    assert.is_true(after.peak >= high.allocated)
    assert.is_true(after.reserved >= high.allocated, "freed blocks stay cached")

    -- the same sizes again are served from the cache
    for i, n in ipairs(sizes) do ts[i] = shard.empty{ n } end
    assert.equal(after.n_system_alloc, memory.stats().n_system_alloc)
    for _, t in ipairs(ts) do t:free() end
  end)

  it("counts views once and frees with the last reference", function()
    local base = memory.stats().allocated
    local t = shard.zeros{ 64, 64 }
    local v = t:narrow(1, 1, 10)
    local w = t:transpose(1, 2)
    assert.equal(base + used(64 * 64 * 4), memory.stats().allocated)
    t:free(); w:free()
    assert.equal(base + used(64 * 64 * 4), memory.stats().allocated)
    v:free()
    assert.equal(base, memory.stats().allocated)
  end)

  it("remembers the peak until reset_peak", function()
    memory.reset_peak()
    local base = memory.stats()
    assert.equal(base.allocated, base.peak)
    local big = shard.empty{ 1000, 100 }
    local bytes = used(400000)
    big:free()
    local s = memory.stats()
    assert.equal(base.allocated, s.allocated)
    assert.equal(base.allocated + bytes, s.peak)
    memory.reset_peak()
    assert.equal(s.allocated, memory.stats().peak)
  end)

  it("splits bytes by tag with with_tag, and restores the tag after an error", function()
    memory.reset_peak()
    local base = memory.stats()
    local p, g = memory.with_tag("param", function() return shard.empty{ 256 }, shard.empty{ 256 } end)
    local gr = memory.with_tag("grad", shard.empty, { 512 })
    local other = shard.empty{ 16 }
    local s = memory.stats()
    assert.equal(base.by_tag.param + 2 * 1024, s.by_tag.param)
    assert.equal(base.by_tag.grad + 2048, s.by_tag.grad)
    assert.equal(base.by_tag.other + 64, s.by_tag.other)
    assert.equal(base.by_tag.grad + 2048, s.peak_by_tag.grad)

    local ok, err = pcall(memory.with_tag, "optim", function() error("inside") end)
    assert.is_false(ok)
    assert.matches("inside", err)
    local after = shard.empty{ 16 }
    assert.equal(s.by_tag.other + 64, memory.stats().by_tag.other, "tag restored after the error")
    assert.equal(base.by_tag.optim, memory.stats().by_tag.optim)

    for _, t in ipairs { p, g, gr, other, after } do t:free() end
    s = memory.stats()
    for tag, bytes in pairs(base.by_tag) do assert.equal(bytes, s.by_tag[tag], tag) end
    assert.has_error(function() memory.with_tag("weights", function() end) end)
  end)

  it("empty_cache returns cached blocks to the system", function()
    shard.empty{ 10000 }:free()
    assert.is_true(memory.stats().reserved > memory.stats().allocated)
    memory.empty_cache()
    local s = memory.stats()
    assert.equal(s.allocated, s.reserved)
  end)

  it("fails cleanly past the limit, with the breakdown by tag", function()
    local keep = memory.with_tag("param", shard.empty, { 256 })
    local s = memory.stats()
    memory.set_limit(s.allocated + 1000)
    assert.equal(s.allocated + 1000, memory.stats().limit)
    local ok, err = pcall(shard.empty, { 1024 })
    assert.is_false(ok)
    assert.matches("out of memory", err)
    assert.matches("memory limit reached", err)
    assert.matches("f32%[1024%]", err)
    -- every figure as shard.units prints bytes, as the memory line and the estimate do
    local units = require("shard.units")
    local now = memory.stats()
    for _, figure in ipairs { "allocating 4.0 KiB (tag other)", "allocated " .. units.bytes(now.allocated),
                              "reserved " .. units.bytes(now.reserved), "limit " .. units.bytes(now.limit),
                              "param " .. units.bytes(now.by_tag.param), "activation " .. units.bytes(now.by_tag.activation) } do
      assert.is_truthy(err:find(figure, 1, true), ("%q in %s"):format(figure, err))
    end
    assert.equal(s.allocated, memory.stats().allocated, "a refused allocation changes nothing")
    local small = shard.empty{ 16 }    -- what fits still works
    small:free()
    memory.set_limit(nil)
    shard.empty{ 1024 }:free()
    keep:free()
  end)

  it("formats a one-line summary", function()
    local t = memory.with_tag("activation", shard.empty, { 300000 })
    local line = memory.format(memory.stats())
    assert.matches("^allocated [%d%.]+ %a+", line)
    assert.matches("activation 1.1 MiB", line, 1, true)   -- 1.2e6 bytes
    assert.matches("peak", line)
    assert.is_nil(line:find("\n"))
    t:free()
    assert.equal("12.0 KiB", memory.format_bytes(12288))
    assert.equal(memory.format_bytes, require("shard.units").bytes)
  end)
end)
