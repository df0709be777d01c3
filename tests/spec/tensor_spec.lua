-- The Tensor type from Lua: construction, views against index arithmetic, dtype copies,
-- indexing, lifetime and printing.
local shard = require("shard")
local ffi = require("ffi")

-- A 2x3x4 f64 tensor whose element (i, j, k) (1-based) is 100i + 10j + k.
local function iota3()
  local rows = {}
  for i = 1, 2 do
    rows[i] = {}
    for j = 1, 3 do
      rows[i][j] = {}
      for k = 1, 4 do rows[i][j][k] = 100 * i + 10 * j + k end
    end
  end
  return shard.tensor(rows, { dtype = "f64" })
end

-- Checks every element of t (up to 3-d) against ref(i, j, k) with 1-based indices.
local function expect_elements(t, ref)
  local shape = t:shape()
  local n1, n2, n3 = shape[1] or 1, shape[2] or 1, shape[3] or 1
  local flat, pos, bad = t:tolist_flat(), 0, {}
  for i = 1, n1 do for j = 1, n2 do for k = 1, n3 do
    pos = pos + 1
    local want = ref(i, j, k)
    if flat[pos] ~= want then bad[#bad + 1] = ("(%d,%d,%d): %s vs %s"):format(i, j, k, flat[pos], want) end
  end end end
  assert.are.same({}, bad)
end

local function same(a, b) return a == b or (a ~= a and b ~= b) end

describe("construction", function()
  it("takes its shape from nested tables", function()
    local t = shard.tensor{ { 1, 2, 3 }, { 4, 5, 6 } }
    assert.are.same({ 2, 3 }, t:shape())
    assert.are.same({ 3, 1 }, t:stride())
    assert.equal("f32", t:dtype())
    assert.equal("cpu", t:device())
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, t:tolist_flat())
    assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:tolist())
  end)

  it("rejects ragged nesting and non-numbers", function()
    assert.has_error(function() shard.tensor{ { 1, 2 }, { 3 } } end)
    local ok, err = pcall(shard.tensor, { { 1, 2 }, { 3 } })
    assert.is_false(ok)
    assert.matches("ragged", err)
    assert.has_error(function() shard.tensor{ { 1, 2 }, 3 } end)
    assert.has_error(function() shard.tensor{ 1, "x" } end)
  end)

  it("makes 0-dim, empty and filled tensors", function()
    local s = shard.tensor(2.5)
    assert.equal(0, s:dim())
    assert.equal(2.5, s:item())
    local e = shard.empty{ 0, 4 }
    assert.equal(0, e:numel())
    assert.are.same({ 2, 2 }, shard.ones({ 2, 2 }, { dtype = "i32" }):shape())
    assert.are.same({ 7, 7 }, shard.full({ 2 }, 7):tolist_flat())
    assert.are.same({ 0, 0, 0 }, shard.zeros(3):tolist_flat())
  end)

  it("rejects bad shapes and dtypes with clear errors", function()
    local ok, err = pcall(shard.empty, { 2, -1 })
    assert.is_false(ok); assert.matches("negative size", err)
    ok, err = pcall(shard.empty, { 1, 1, 1, 1, 1, 1, 1, 1, 1 })
    assert.is_false(ok); assert.matches("at most 8 dims", err)
    ok, err = pcall(shard.empty, { 2 }, { dtype = "f8" })
    assert.is_false(ok); assert.matches("unknown dtype 'f8'", err)
  end)
end)

describe("views", function()
  it("narrow selects a range and shares storage", function()
    local t = iota3()
    local v = t:narrow(2, 2, 2)
    assert.are.same({ 2, 2, 4 }, v:shape())
    expect_elements(v, function(i, j, k) return 100 * i + 10 * (j + 1) + k end)
    v:set({ 1, 1, 1 }, -1)
    assert.equal(-1, t:get{ 1, 2, 1 })
    assert.has_error(function() t:narrow(2, 3, 2) end)
    local ok, err = pcall(t.narrow, t, 2, 3, 2)
    assert.matches("out of range", err)
  end)

  it("select drops a dim; negative indices count from the end", function()
    local t = iota3()
    local v = t:select(2, -1)
    assert.are.same({ 2, 4 }, v:shape())
    expect_elements(v, function(i, j) return 100 * i + 30 + j end)
    assert.has_error(function() t:select(1, 3) end)
  end)

  it("view and reshape infer -1; view refuses a non-contiguous layout", function()
    local t = iota3()
    local v = t:view(-1, 4)
    assert.are.same({ 6, 4 }, v:shape())
    expect_elements(v, function(r, k) local i, j = math.floor((r - 1) / 3), (r - 1) % 3; return 100 * (i + 1) + 10 * (j + 1) + k end)
    assert.has_error(function() t:view(-1, -1) end)
    local ok, err = pcall(t.view, t, 5, 5)
    assert.matches("25 elements", err)
    local tt = t:transpose(1, 3)
    ok, err = pcall(tt.view, tt, 24)
    assert.is_false(ok)
    assert.matches("non%-contiguous", err)
    local r = tt:reshape(24)
    assert.is_true(r:is_contiguous())
    -- reshape of the transposed (k, j, i) view keeps its row-major order
    expect_elements(r:view(4, 3, 2), function(k, j, i) return 100 * i + 10 * j + k end)
  end)

  it("transpose, t and permute reorder dims", function()
    local t = iota3()
    local tt = t:transpose(1, 3)
    assert.are.same({ 4, 3, 2 }, tt:shape())
    assert.are.same({ 1, 4, 12 }, tt:stride())
    assert.is_false(tt:is_contiguous())
    expect_elements(tt, function(k, j, i) return 100 * i + 10 * j + k end)
    local p = t:permute(3, 1, 2)
    assert.are.same({ 4, 2, 3 }, p:shape())
    expect_elements(p, function(k, i, j) return 100 * i + 10 * j + k end)
    assert.has_error(function() t:permute(1, 1, 2) end)
    assert.has_error(function() t:permute(1, 2) end)
    local m = shard.tensor{ { 1, 2 }, { 3, 4 } }
    assert.are.same({ 1, 3, 2, 4 }, m:t():tolist_flat())
  end)

  it("expand repeats size-1 dims with stride 0", function()
    local row = shard.tensor{ { 1, 2, 3 } }
    local e = row:expand(4, 3)
    assert.are.same({ 4, 3 }, e:shape())
    assert.are.same({ 0, 1 }, e:stride())
    expect_elements(e, function(_, j) return j end)
    assert.are.same({ 2, 1, 3 }, row:expand(2, -1, 3):shape())
    local ok, err = pcall(row.expand, row, 4, 2)
    assert.is_false(ok); assert.matches("cannot expand", err)
  end)

  it("unsqueeze and squeeze add and remove size-1 dims", function()
    local t = iota3()
    assert.are.same({ 2, 1, 3, 4 }, t:unsqueeze(2):shape())
    assert.are.same({ 2, 3, 4, 1 }, t:unsqueeze(-1):shape())
    assert.are.same({ 2, 3, 4 }, t:unsqueeze(2):squeeze(2):shape())
    local ok, err = pcall(t.squeeze, t, 1)
    assert.is_false(ok); assert.matches("not 1", err)
    assert.has_error(function() t:unsqueeze(0) end)   -- dims are 1-based
  end)

  it("as_strided stays inside the storage", function()
    local t = iota3()
    local tensor = require("shard.tensor")
    local s = tensor.new_from(shard.C.sh_view_strided, t.p, 2, ffi.new("int64_t[2]", { 3, 2 }),
                              ffi.new("int64_t[2]", { 8, 1 }), 4)
    local flat = t:tolist_flat()
    expect_elements(s, function(a, b) return flat[4 + 8 * (a - 1) + (b - 1) + 1] end)
    assert.has_error(function()
      tensor.new_from(shard.C.sh_view_strided, t.p, 2, ffi.new("int64_t[2]", { 3, 2 }),
                      ffi.new("int64_t[2]", { 8, 1 }), 10)
    end)
  end)

  it("contiguous copies only when needed", function()
    local t = iota3()
    local c = t:contiguous()
    assert.equal(ffi.cast("intptr_t", t:data_ptr()), ffi.cast("intptr_t", c:data_ptr()))
    local tt = t:transpose(1, 2)
    local cc = tt:contiguous()
    assert.is_true(cc:is_contiguous())
    assert.are_not.equal(ffi.cast("intptr_t", tt:data_ptr()), ffi.cast("intptr_t", cc:data_ptr()))
    expect_elements(cc, function(j, i, k) return 100 * i + 10 * j + k end)
  end)
end)

describe("dtype copies", function()
  local DTYPES = { "f64", "f32", "bf16", "f16", "i64", "i32", "u8", "bool" }
  local EXACT = { 0, 1, 2, 3, 5, 100 }

  it("convert between every pair of dtypes", function()
    local wrong = {}
    for _, from in ipairs(DTYPES) do
      for _, to in ipairs(DTYPES) do
        local src = shard.tensor(EXACT, { dtype = from })
        local dst = src:to(to)
        local got = dst:tolist_flat()
        for i, v in ipairs(EXACT) do
          local want = (from == "bool" or to == "bool") and (v ~= 0 and 1 or 0) or v
          if got[i] ~= want or dst:dtype() ~= to then wrong[#wrong + 1] = from .. "->" .. to; break end
        end
      end
    end
    assert.are.same({}, wrong)
  end)

  it("rounds to nearest even into bf16 and f16 on exact ties", function()
    local function through(dtype, x) return shard.tensor({ x }, { dtype = "f32" }):to(dtype):item() end
    assert.equal(1, through("bf16", 1 + 2 ^ -8))                   -- tie: down to even
    assert.equal(1 + 2 ^ -6, through("bf16", 1 + 3 * 2 ^ -8))      -- tie: up to even
    assert.equal(1 + 2 ^ -7, through("bf16", 1 + 2 ^ -8 + 2 ^ -20)) -- past the tie: up
    assert.equal(1, through("f16", 1 + 2 ^ -11))
    assert.equal(1 + 2 ^ -9, through("f16", 1 + 3 * 2 ^ -11))
    assert.equal(-1 - 2 ^ -9, through("f16", -1 - 3 * 2 ^ -11))
    assert.equal(65504, through("f16", 65519))
    assert.equal(math.huge, through("f16", 65520))
  end)

  it("keeps NaN and +-Inf through every float dtype", function()
    for _, dt in ipairs { "f64", "f32", "bf16", "f16" } do
      local t = shard.tensor({ 0 / 0, math.huge, -math.huge }, { dtype = "f64" }):to(dt):to("f64")
      local v = t:tolist_flat()
      assert.is_true(v[1] ~= v[1], dt .. " NaN")
      assert.equal(math.huge, v[2])
      assert.equal(-math.huge, v[3])
    end
  end)

  it("copy_ broadcasts and converts", function()
    local dst = shard.zeros({ 2, 3 }, { dtype = "bf16" })
    dst:copy_(shard.tensor({ 1, 2, 3 }, { dtype = "f64" }))
    assert.are.same({ 1, 2, 3, 1, 2, 3 }, dst:tolist_flat())
    assert.has_error(function() dst:copy_(shard.zeros{ 2 }) end)
  end)
end)

describe("indexing", function()
  it("t[i] is a row view, or a number for 1-d tensors", function()
    local t = shard.tensor{ { 1, 2, 3 }, { 4, 5, 6 } }
    assert.are.same({ 4, 5, 6 }, t[2]:tolist_flat())
    assert.equal(6, t[2][3])
    assert.equal(3, t[-2][-1])
    assert.equal(2, #t)
    local ok, err = pcall(function() return t[3] end)
    assert.is_false(ok); assert.matches("out of range", err)
    assert.has_error(function() return shard.tensor(1)[1] end)
  end)

  it("t[i] = v writes through to the storage", function()
    local t = shard.zeros{ 2, 3 }
    t[1] = 7
    t[2] = shard.tensor{ 1, 2, 3 }
    assert.are.same({ 7, 7, 7, 1, 2, 3 }, t:tolist_flat())
    local row = t[2]
    row[2] = 9
    assert.equal(9, t:get{ 2, 2 })
  end)

  it(":item() needs exactly one element", function()
    assert.equal(4, shard.tensor{ { 4 } }:item())
    local ok, err = pcall(function() return shard.tensor{ 1, 2 }:item() end)
    assert.is_false(ok); assert.matches("one element", err)
  end)
end)

describe("lifetime", function()
  it(":free() releases at once; later use is an error naming the freed tensor", function()
    local t = shard.zeros{ 2, 3 }
    t:free()
    assert.is_true(t:is_freed())
    local ok, err = pcall(t.narrow, t, 1, 1, 1)
    assert.is_false(ok)
    assert.matches("freed", err)
    ok, err = pcall(t.item, t)
    assert.matches("freed", err)
    ok, err = pcall(t.tolist_flat, t)
    assert.matches("freed", err)
    t:free()   -- twice is harmless
  end)

  it("a view keeps the storage alive after its base is freed", function()
    local t = shard.tensor{ { 1, 2 }, { 3, 4 } }
    local v = t[2]
    t:free()
    assert.are.same({ 3, 4 }, v:tolist_flat())
  end)
end)

describe("printing", function()
  local function lines(t) return tostring(t) end

  it("uses one fixed-point format and names dtype, shape and device", function()
    assert.equal("[[ 0.1234, -1.5000],\n [ 2.0000,  3.0000]]\n[f32 2x2, cpu]",
                 lines(shard.tensor{ { 0.1234, -1.5 }, { 2, 3 } }))
  end)

  it("prints integer-valued floats with a trailing dot, integers and bools plainly", function()
    assert.equal("[1., 2., 3.]\n[f32 3, cpu]", lines(shard.tensor{ 1, 2, 3 }))
    assert.equal("[[ 1, -2],\n [30,  4]]\n[i64 2x2, cpu]", lines(shard.tensor({ { 1, -2 }, { 30, 4 } }, { dtype = "i64" })))
    assert.equal("[ true, false]\n[bool 2, cpu]", lines(shard.tensor({ 1, 0 }, { dtype = "bool" })))
  end)

  it("switches to scientific notation for wide ranges, and shows nan and inf", function()
    assert.equal("[1.0000e-05, 1.0000e+00,        nan,        inf,       -inf]\n[f32 5, cpu]",
                 lines(shard.tensor{ 1e-5, 1, 0 / 0, math.huge, -math.huge }))
  end)

  it("handles 0-dim, empty and bf16 tensors", function()
    assert.equal("2.5000\n[f32 scalar, cpu]", lines(shard.tensor(2.5)))
    assert.equal("[]\n[f32 0x3, cpu]", lines(shard.empty{ 0, 3 }))
    assert.equal("[1.5000, 2.2500]\n[bf16 2, cpu]", lines(shard.tensor({ 1.5, 2.25 }, { dtype = "bf16" })))
  end)

  it("elides the middle of big tensors, keeping three edge items per dim", function()
    local t = shard.zeros{ 2000 }
    assert.equal("[0., 0., 0.,  ..., 0., 0., 0.]\n[f32 2000, cpu]", lines(t))
    local s = lines(shard.zeros{ 10, 200 })
    local rows = 0
    for line in s:gmatch("[^\n]+") do if line:match("^ ?%[+0") then rows = rows + 1 end end
    assert.equal(6, rows)
    assert.matches("\n ...,\n", s, 1, true)
  end)

  it("wraps long rows at 80 columns", function()
    local s = lines(shard.zeros{ 30 })
    for line in s:gmatch("[^\n]+") do assert.is_true(#line <= 80, line) end
  end)

  it("says when a tensor was freed", function()
    local t = shard.zeros{ 2, 3 }
    t:free()
    assert.equal("tensor (freed) [f32 2x3, cpu]", tostring(t))
  end)
end)
