-- Tensor math from Lua (shard.ops): operators and methods against f64 references computed
-- here in Lua, broadcasting, reductions over 1-based and negative dims, matmul shapes,
-- in-place forms, arange and the seeded generator, and runtime errors as Lua errors.
-- The methods are the differentiable ops of shard.functional; `raw` (shard.ops) reaches the bindings
-- themselves where their behaviour is the point (tensor exponents, argmax over everything).
local shard = require("shard")
local raw = require("shard.ops").raw

-- Deterministic values: +-{0.5, 1, 1.5, 2} (exact in every float dtype, never 0).
local seed = 12345
local function value()
  seed = (seed * 1103515245 + 12345) % 2147483648
  local v = 0.5 * (1 + seed % 4)
  return (math.floor(seed / 4) % 2 == 0) and v or -v
end

local function numel(shape) local n = 1; for _, s in ipairs(shape) do n = n * s end; return n end

-- A tensor of the given shape and dtype filled with value() (positive when asked).
local function make(shape, dtype, positive)
  local flat = {}
  for i = 1, numel(shape) do flat[i] = positive and math.abs(value()) or value() end
  local t = shard.tensor(flat, { dtype = dtype or "f32" })
  if #shape == 1 then return t end
  return t:reshape(shape)
end

local function near(got, want, rtol)
  if want ~= want then return got ~= got end
  if want == math.huge or want == -math.huge then return got == want end
  return math.abs(got - want) <= (rtol or 1e-6) * math.max(math.abs(want), 1e-3)
end

-- Every element of t against ref(flat index (1-based), multi-index) in f64.
local function expect(t, shape, ref, rtol)
  assert.are.same(shape, t:shape())
  local flat, bad = t:tolist_flat(), {}
  local idx = {}
  for i = 1, #flat do
    local rest = i - 1
    for d = #shape, 1, -1 do idx[d] = rest % shape[d] + 1; rest = math.floor(rest / shape[d]) end
    local want = ref(i, idx)
    if not near(flat[i], want, rtol) then bad[#bad + 1] = ("[%d] %s vs %s"):format(i, flat[i], want) end
    if #bad > 5 then break end
  end
  assert.are.same({}, bad)
end

-- Element of t (flat values `v`, shape s) read by output multi-index idx under broadcasting.
local function at(v, s, idx)
  local pos, mul = 0, 1
  for d = #s, 1, -1 do
    local od = d + #idx - #s
    if s[d] ~= 1 then pos = pos + (idx[od] - 1) * mul end
    mul = mul * s[d]
  end
  return v[pos + 1]
end

local ref_binary = {
  add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
  mul = function(x, y) return x * y end, div = function(x, y) return x / y end,
  pow = function(x, y) return x ^ y end,
  maximum = function(x, y) return math.max(x, y) end, minimum = function(x, y) return math.min(x, y) end,
  eq = function(x, y) return x == y and 1 or 0 end, lt = function(x, y) return x < y and 1 or 0 end,
  gt = function(x, y) return x > y and 1 or 0 end,
}

describe("elementwise", function()
  it("operators match f64 on tensors and numbers on either side", function()
    local a, b = make({ 3, 4 }), make({ 3, 4 })
    local pa = a:abs()
    local va, vb, vpa = a:tolist_flat(), b:tolist_flat(), pa:tolist_flat()
    local s = { 3, 4 }
    expect(a + b, s, function(i) return va[i] + vb[i] end)
    expect(a - b, s, function(i) return va[i] - vb[i] end)
    expect(a * b, s, function(i) return va[i] * vb[i] end)
    expect(a / b, s, function(i) return va[i] / vb[i] end)
    expect(raw.pow(pa, b), s, function(i) return vpa[i] ^ vb[i] end)
    expect(-a, s, function(i) return -va[i] end)
    expect(a + 2.5, s, function(i) return va[i] + 2.5 end)
    expect(2.5 - a, s, function(i) return 2.5 - va[i] end)
    expect(3 * a, s, function(i) return 3 * va[i] end)
    expect(1 / a, s, function(i) return 1 / va[i] end)
    expect(raw.rpow(a, 2), s, function(i) return 2 ^ va[i] end)
    expect(pa ^ 2, s, function(i) return vpa[i] ^ 2 end)
  end)

  it("has every binary op as a method with tensor or number arguments", function()
    local a, b = make({ 2, 5 }), make({ 2, 5 })
    local va, vb = a:tolist_flat(), b:tolist_flat()
    for name, f in pairs(ref_binary) do
      local x = name == "pow" and a:abs() or a
      local vx = x:tolist_flat()
      expect(raw[name](x, b), { 2, 5 }, function(i) return f(vx[i], vb[i]) end)
      expect(raw[name](x, 1.5), { 2, 5 }, function(i) return f(vx[i], 1.5) end)
    end
    -- r-forms: number OP tensor
    expect(a:rsub(1), { 2, 5 }, function(i) return 1 - va[i] end)
    expect(a:rdiv(3), { 2, 5 }, function(i) return 3 / va[i] end)
    expect(raw.rpow(a, 2), { 2, 5 }, function(i) return 2 ^ va[i] end)
    expect(a:radd(1), { 2, 5 }, function(i) return 1 + va[i] end)
    expect(a:rmul(-2), { 2, 5 }, function(i) return -2 * va[i] end)
  end)

  it("broadcasts with numpy rules", function()
    local cases = { { { 2, 3, 4 }, { 4 }, { 2, 3, 4 } }, { { 2, 1, 4 }, { 3, 1 }, { 2, 3, 4 } },
                    { { 5 }, {}, { 5 } }, { { 4, 1 }, { 1, 6 }, { 4, 6 } } }
    for _, c in ipairs(cases) do
      local a = make(c[1])
      local b = #c[2] == 0 and shard.tensor(1.5) or make(c[2])
      local va, vb = a:tolist_flat(), b:tolist_flat()
      expect(a * b, c[3], function(_, idx) return at(va, c[1], idx) * at(vb, c[2], idx) end)
      expect(b - a, c[3], function(_, idx) return at(vb, c[2], idx) - at(va, c[1], idx) end)
    end
  end)

  it("reads transposed and narrowed views", function()
    local base = make({ 4, 3 })
    local a = base:t()                          -- [3,4], column-major
    local b = make({ 3, 8 }):narrow(2, 3, 4)    -- [3,4], row stride 8
    local ac, bc = a:contiguous():tolist_flat(), b:contiguous():tolist_flat()
    expect(a + b, { 3, 4 }, function(i) return ac[i] + bc[i] end)
  end)

  it("has the unary math", function()
    local a = make({ 4, 5 }, "f64", true)
    local v = a:tolist_flat()
    local refs = {
      neg = function(x) return -x end, exp = math.exp, log = math.log, sqrt = math.sqrt,
      rsqrt = function(x) return 1 / math.sqrt(x) end,
      tanh = function(x) return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1) end,
      abs = math.abs, square = function(x) return x * x end, reciprocal = function(x) return 1 / x end,
      sign = function(x) return x > 0 and 1 or (x < 0 and -1 or 0) end,
    }
    for name, f in pairs(refs) do
      expect(a[name](a), { 4, 5 }, function(i) return f(v[i]) end, 1e-14)
    end
  end)

  it("promotes dtypes", function()
    local h, f = make({ 3 }, "bf16"), make({ 3 }, "f32")
    assert.equal("f32", (h + f):dtype())
    assert.equal("bf16", (h * 2):dtype())
    assert.equal("f64", (f + make({ 3 }, "f64")):dtype())
    local i = shard.tensor({ 7, 8, 9 }, { dtype = "i32" })
    assert.equal("i32", (i + 1):dtype())
    assert.equal("f32", (i + 0.5):dtype())
    assert.same({ 3.5, 4, 4.5 }, (i / 2):tolist())
    assert.equal("f32", (f:lt(h)):dtype())       -- comparisons give 0/1 in the promoted dtype
  end)
end)

describe("in place", function()
  it("adds, multiplies and scales in place", function()
    local a, b = make({ 3, 4 }), make({ 4 })
    local va, vb = a:tolist_flat(), b:tolist_flat()
    local r = a:add_(b)
    assert.equal(a, r)
    expect(a, { 3, 4 }, function(i) return va[i] + vb[(i - 1) % 4 + 1] end)
    va = a:tolist_flat()
    a:add_(b, -0.5)
    expect(a, { 3, 4 }, function(i) return va[i] - 0.5 * vb[(i - 1) % 4 + 1] end)
    va = a:tolist_flat()
    a:axpy_(2, b)
    expect(a, { 3, 4 }, function(i) return va[i] + 2 * vb[(i - 1) % 4 + 1] end)
    va = a:tolist_flat()
    a:add_(1.25)
    expect(a, { 3, 4 }, function(i) return va[i] + 1.25 end)
    va = a:tolist_flat()
    a:mul_(b)
    expect(a, { 3, 4 }, function(i) return va[i] * vb[(i - 1) % 4 + 1] end)
    va = a:tolist_flat()
    a:mul_(-2)
    expect(a, { 3, 4 }, function(i) return -2 * va[i] end)
    va = a:tolist_flat()
    a:scale_(0.5):sub_(b)
    expect(a, { 3, 4 }, function(i) return 0.5 * va[i] - vb[(i - 1) % 4 + 1] end)
    va = a:tolist_flat()
    a:div_(2)
    expect(a, { 3, 4 }, function(i) return va[i] / 2 end)
    a:fill_(7)
    expect(a, { 3, 4 }, function() return 7 end)
  end)

  it("writes through strided views", function()
    local base = shard.zeros({ 4, 3 })
    local v = base:t()
    v:add_(shard.arange(4, { dtype = "f32" }))
    expect(base, { 4, 3 }, function(_, idx) return idx[1] - 1 end)
  end)

  it("refuses results that do not fit the destination", function()
    local i = shard.tensor({ 1, 2 }, { dtype = "i32" })
    assert.has_error(function() i:add_(0.5) end, nil)
    local ok, err = pcall(i.add_, i, 0.5)
    assert.is_false(ok)
    assert.matches("add: result f32 cannot be stored in place into i32%[2%]", err)
    i:add_(3)
    assert.same({ 4, 5 }, i:tolist())
    local ok2, err2 = pcall(function() make({ 4 }):add_(make({ 2, 4 })) end)
    assert.is_false(ok2)
    assert.matches("does not broadcast to the in%-place destination", err2)
  end)
end)

describe("reductions", function()
  local shape = { 2, 3, 4 }
  local a = make(shape, "f64")
  local v = a:tolist_flat()
  local function ref(op, dim)
    local out = {}
    for i = 1, #v do
      local rest, idx = i - 1, {}
      for d = 3, 1, -1 do idx[d] = rest % shape[d] + 1; rest = math.floor(rest / shape[d]) end
      idx[dim] = 1
      local key = (idx[1] - 1) * 12 + (idx[2] - 1) * 4 + idx[3]
      local x = v[i]
      if out[key] == nil then out[key] = { x, x, x, 1 }
      else
        local o = out[key]
        o[1], o[2], o[3], o[4] = o[1] + x, math.max(o[2], x), math.min(o[3], x), o[4] + 1
      end
    end
    local list = {}
    for key = 1, 24 do
      local o = out[key]
      if o then
        if op == "sum" then list[#list + 1] = o[1] elseif op == "mean" then list[#list + 1] = o[1] / o[4]
        elseif op == "max" then list[#list + 1] = o[2] else list[#list + 1] = o[3] end
      end
    end
    return list
  end

  it("reduces over 1-based and negative dims, with keepdim", function()
    for _, op in ipairs { "sum", "mean", "max", "min" } do
      for dim = 1, 3 do
        local want = ref(op, dim)
        local kept = { 2, 3, 4 }
        kept[dim] = 1
        local dropped = {}
        for d = 1, 3 do if d ~= dim then dropped[#dropped + 1] = shape[d] end end
        expect(a[op](a, dim), dropped, function(i) return want[i] end, 1e-14)
        expect(a[op](a, dim - 4, true), kept, function(i) return want[i] end, 1e-14)
      end
    end
  end)

  it("reduces over everything into a 0-dim tensor", function()
    local s = 0
    for i = 1, #v do s = s + v[i] end
    local t = a:sum()
    assert.equal(0, t:dim())
    assert.is_true(near(t:item(), s, 1e-14))
    assert.is_true(near(a:mean():item(), s / #v, 1e-14))
    assert.equal(math.max(unpack(v)), a:max():item())
    assert.equal(math.min(unpack(v)), a:min():item())
    local sq = 0
    for i = 1, #v do sq = sq + v[i] * v[i] end
    assert.is_true(near(a:sumsq(), sq, 1e-14))
  end)

  it("finds the first max as a 0-based index", function()
    local t = shard.tensor{ { 1, 5, 5 }, { 7, 2, 7 } }
    assert.same({ 1, 0 }, t:argmax(2):tolist())
    assert.same({ 1, 0, 1 }, t:argmax(1):tolist())
    assert.same({ { 1 }, { 0 } }, t:argmax(-1, true):tolist())
    assert.equal(3, raw.argmax(t):item())
  end)

  it("sums back to a broadcast shape", function()
    local g = make({ 2, 3, 4 }, "f64")
    local vg = g:tolist_flat()
    expect(g:sum_to({ 4 }), { 4 }, function(i)
      local s = 0
      for r = 0, 5 do s = s + vg[r * 4 + i] end
      return s
    end, 1e-14)
    expect(g:sum_to({ 3, 1 }), { 3, 1 }, function(i)
      local s = 0
      for b = 0, 1 do for k = 1, 4 do s = s + vg[b * 12 + (i - 1) * 4 + k] end end
      return s
    end, 1e-14)
  end)

  it("names the op and the dim when the dim is out of range", function()
    local ok, err = pcall(function() return a:sum(4) end)
    assert.is_false(ok)
    assert.matches("sum: dim 4 is out of range for f64%[2,3,4%]", err)
    ok, err = pcall(function() return raw.argmax(a, -4) end)
    assert.is_false(ok)
    assert.matches("argmax: dim %-4 is out of range", err)
    ok, err = pcall(function() return raw.sum(a, 0) end)
    assert.is_false(ok)
    assert.matches("sum: dim 0 is out of range .*dims are 1%-based", err)
  end)
end)

describe("matmul", function()
  local function ref_mm(va, vb, m, k, n)
    return function(i)
      local r, c = math.floor((i - 1) / n), (i - 1) % n
      local s = 0
      for j = 0, k - 1 do s = s + va[r * k + j + 1] * vb[j * n + c + 1] end
      return s
    end
  end

  it("multiplies 2-D, 1-D and batched operands with torch's shapes", function()
    local a, b = make({ 3, 4 }, "f64"), make({ 4, 5 }, "f64")
    expect(a:matmul(b), { 3, 5 }, ref_mm(a:tolist_flat(), b:tolist_flat(), 3, 4, 5), 1e-14)
    expect(raw.mm(a, b), { 3, 5 }, ref_mm(a:tolist_flat(), b:tolist_flat(), 3, 4, 5), 1e-14)
    local x, y = make({ 4 }, "f64"), make({ 4 }, "f64")
    local vx, vy = x:tolist_flat(), y:tolist_flat()
    local dot = 0
    for i = 1, 4 do dot = dot + vx[i] * vy[i] end
    local d = x:matmul(y)
    assert.equal(0, d:dim())
    assert.equal(dot, d:item())
    assert.same({ 5 }, x:matmul(b):shape())
    assert.same({ 3 }, a:matmul(y):shape())
    local p, q = make({ 2, 3, 4 }), make({ 2, 4, 5 })
    local out = raw.bmm(p, q)
    assert.same({ 2, 3, 5 }, out:shape())
    local vp, vq = p:tolist_flat(), q:tolist_flat()
    local second = out:select(1, 2)
    local sp, sq = {}, {}
    for i = 1, 12 do sp[i] = vp[12 + i] end
    for i = 1, 20 do sq[i] = vq[20 + i] end
    expect(second, { 3, 5 }, ref_mm(sp, sq, 3, 4, 5))
    assert.same({ 2, 5, 3, 2 }, make({ 2, 1, 3, 4 }):matmul(make({ 5, 4, 2 })):shape())
    assert.same({ 2, 3, 5 }, p:matmul(b:float()):shape())
  end)

  it("uses transposed views as they are", function()
    local w = make({ 5, 4 })
    local x = make({ 3, 4 })
    local vw, vx = w:tolist_flat(), x:tolist_flat()
    expect(x:matmul(w:t()), { 3, 5 }, function(i)
      local r, c = math.floor((i - 1) / 5), (i - 1) % 5
      local s = 0
      for k = 0, 3 do s = s + vx[r * 4 + k + 1] * vw[c * 4 + k + 1] end
      return s
    end)
  end)

  it("reports shape errors with the op name", function()
    local ok, err = pcall(function() return make({ 3, 4 }):matmul(make({ 3, 4 })) end)
    assert.is_false(ok)
    assert.matches("matmul: inner dims differ %(4 vs 3%)", err)
    ok, err = pcall(function() return raw.mm(make({ 2, 3, 4 }), make({ 4, 5 })) end)
    assert.is_false(ok)
    assert.matches("mm: needs two 2%-D tensors", err)
    ok, err = pcall(function() return raw.bmm(make({ 3, 4 }), make({ 4, 5 })) end)
    assert.is_false(ok)
    assert.matches("bmm: needs two 3%-D tensors", err)
  end)
end)

describe("creation and random numbers", function()
  it("aranges like torch", function()
    local t = shard.arange(5)
    assert.equal("i64", t:dtype())
    assert.same({ 0, 1, 2, 3, 4 }, t:tolist())
    assert.same({ 2, 3, 4 }, shard.arange(2, 5):tolist())
    local f = shard.arange(1, 2, 0.25)
    assert.equal("f32", f:dtype())
    assert.same({ 1, 1.25, 1.5, 1.75 }, f:tolist())
    assert.same({ 5, 3, 1 }, shard.arange(5, 0, -2):tolist())
    assert.equal("f64", shard.arange(3, { dtype = "f64" }):dtype())
    local ok, err = pcall(shard.arange, 0, 5, 0)
    assert.is_false(ok)
    assert.matches("arange: needs finite start, end and a non%-zero step", err)
  end)

  it("repeats the same numbers after manual_seed", function()
    shard.manual_seed(42)
    local a = shard.randn{ 2, 3 }
    local b = shard.randn(4)
    shard.manual_seed(42)
    local a2, b2 = shard.randn({ 2, 3 }), shard.randn(4)
    assert.same(a:tolist(), a2:tolist())
    assert.same(b:tolist(), b2:tolist())
    assert.are_not.same(a:tolist_flat(), b:tolist_flat())
    shard.manual_seed(43)
    assert.are_not.same(a:tolist(), shard.randn{ 2, 3 }:tolist())
  end)

  it("advances the offset by whole blocks of four", function()
    shard.manual_seed(7)
    local x, y = shard.randn(3):tolist(), shard.randn(5):tolist()
    shard.manual_seed(7)
    local all = shard.randn(9):tolist()
    assert.same({ all[1], all[2], all[3] }, x)              -- counters 0..2
    assert.same({ all[5], all[6], all[7], all[8], all[9] }, y) -- counters 4..8
  end)

  it("draws plausible normals and uniforms", function()
    shard.manual_seed(1)
    local n = shard.randn(100000)
    local mean = n:mean():item()
    local sd = math.sqrt(n:square():mean():item() - mean * mean)
    assert.is_true(math.abs(mean) < 0.02 and math.abs(sd - 1) < 0.02, ("mean %g std %g"):format(mean, sd))
    local u = shard.rand({ 1000 }, { dtype = "f64" })
    assert.equal("f64", u:dtype())
    assert.is_true(u:min():item() > 0 and u:max():item() <= 1)
    local t = shard.empty{ 1000 }
    assert.equal(t, t:normal_(3, 0.5))
    assert.is_true(math.abs(t:mean():item() - 3) < 0.1)
    shard.uniform_(t, -2, -1)
    assert.is_true(t:min():item() > -2 and t:max():item() <= -1)
  end)
end)

describe("the deterministic switch", function()
  it("is off by default, process-wide, and returns the previous setting", function()
    assert.is_false(shard.deterministic())
    assert.is_false(shard.set_deterministic(true))
    assert.is_true(shard.deterministic())
    assert.equal(1, shard.C.sh_deterministic())
    assert.is_true(shard.set_deterministic(false))
    assert.is_false(shard.deterministic())
  end)
end)

describe("errors", function()
  it("surface as Lua errors naming the op, shapes and dtypes", function()
    local ok, err = pcall(function() return make({ 2, 3 }) + make({ 2 }) end)
    assert.is_false(ok)
    assert.matches("add: shapes %[2,3%] and %[2%] do not broadcast", err)
    local bools = shard.tensor({ 1, 0 }, { dtype = "bool" })
    ok, err = pcall(function() return bools + bools end)
    assert.is_false(ok)
    assert.matches("add: arithmetic on bool", err)
    ok, err = pcall(function() return bools:exp() end)
    assert.is_false(ok)
    assert.matches("exp: not defined for bool", err)
    ok, err = pcall(function() return raw.add(make({ 2 }), "x") end)
    assert.is_false(ok)
    assert.matches("add: expected a tensor or a number, got string", err)
  end)

  it("refuses a freed tensor", function()
    local t = make({ 3 })
    t:free()
    local ok, err = pcall(function() return t:exp() end)
    assert.is_false(ok)
    assert.matches("exp: tensor f32%[3%] cpu %(freed%) was used after :free%(%)", err)
    ok, err = pcall(function() return t:sumsq() end)
    assert.is_false(ok)
    assert.matches("sumsq", err)
  end)
end)
