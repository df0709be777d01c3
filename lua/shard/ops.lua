-- shard.ops: tensor math as Tensor methods. Each method is one call into the C runtime
-- (runtime/ops.h), so autograd can wrap them one by one. Dims are 1-based (negative counts
-- from the end) and become 0-based for C; indices that are data (argmax's result) stay
-- 0-based, as token ids are. Random numbers come from shard.random's generator.
local rt = require "shard.ffi"
local tensor = require "shard.tensor"
local random = require "shard.random"
local C, check = rt.C, rt.check
local Tensor, new_from, is_tensor = tensor.Tensor, tensor.new_from, tensor.is_tensor

local M = {}

-- Every method defined here, also kept in M.raw: autograd replaces some Tensor methods with
-- differentiable versions, and its backward passes (and the specs) can still reach these.
local raw = {}
M.raw = raw
local function def(name, fn) raw[name] = fn; Tensor[name] = fn end

-- The op codes of ops.h.
local OP = { add = 0, sub = 1, mul = 2, div = 3, pow = 4, maximum = 5, minimum = 6, eq = 7, lt = 8, gt = 9 }
local UN = { neg = 0, exp = 1, log = 2, sqrt = 3, rsqrt = 4, tanh = 5, abs = 6, square = 7, reciprocal = 8, sign = 9 }
local RED = { sum = 0, mean = 1, max = 2, min = 3 }
M.OP, M.UN, M.RED = OP, UN, RED

-- A Lua dim (1-based, or negative from the end) as a C dim; C checks the range.
local function cdim(d, op)
  if type(d) ~= "number" or d % 1 ~= 0 then error(op .. ": dim must be an integer, got " .. tostring(d), 3) end
  if d == 0 then error(op .. ": dims are 1-based; dim 0 does not exist", 3) end
  return d > 0 and d - 1 or d
end
M.cdim = cdim

local function operand_error(op, x)
  error(("%s: expected a tensor or a number, got %s"):format(op, type(x)), 3)
end

---------------------------------------------------------------------------------------------
-- elementwise

-- a:add(b) with b a tensor or a number; the r-forms are number OP tensor (operators use them).
for name, op in pairs(OP) do
  def(name, function(a, b)
    if type(b) == "number" then return new_from(C.sh_binary_scalar, op, a.p, b, 0) end
    if not is_tensor(b) then operand_error(name, b) end
    return new_from(C.sh_binary, op, a.p, b.p)
  end)
end
for _, name in ipairs { "add", "sub", "mul", "div", "pow" } do
  local op = OP[name]
  def("r" .. name, function(a, s)
    if type(s) ~= "number" then operand_error(name, s) end
    return new_from(C.sh_binary_scalar, op, a.p, s, 1)
  end)
end

for name, op in pairs(UN) do
  def(name, function(a) return new_from(C.sh_unary, op, a.p) end)
end

---------------------------------------------------------------------------------------------
-- in place

-- A scalar as a one-element tensor that broadcasts into dst without widening its dtype
-- (f32 stays f32; bf16 computes in f32; an integer dst takes integral scalars only). One
-- per dtype, reused, so in-place scalar math allocates nothing.
local scalar_cache = {}
local function scalar_for(dst, v)
  local dt = dst:dtype()
  local holder = (dt == "f64" or dt == "f32") and dt or (dt == "bf16" or dt == "f16") and "f32"
                 or (v % 1 == 0 and "i64" or "f32")
  local s = scalar_cache[holder]
  if not s then s = tensor.empty({}, { dtype = holder }); scalar_cache[holder] = s end
  check(C.sh_tensor_fill_(s.p, v), 3)
  return s
end

local function inplace(name, op)
  return function(self, x)
    if type(x) == "number" then x = scalar_for(self, x)
    elseif not is_tensor(x) then operand_error(name, x) end
    check(C.sh_binary_(self.p, op, x.p), 2)
    return self
  end
end
def("sub_", inplace("sub_", OP.sub))
def("div_", inplace("div_", OP.div))
local add_ = inplace("add_", OP.add)

-- t:add_(x) or t:add_(x, alpha) (t += alpha * x) or t:add_(number)
def("add_", function(self, x, alpha)
  if alpha == nil then return add_(self, x) end
  if not is_tensor(x) then operand_error("add_", x) end
  check(C.sh_axpy_(self.p, alpha, x.p), 2)
  return self
end)

-- t:axpy_(alpha, x): t += alpha * x, x broadcast to t (the argument order of sh_axpy_).
def("axpy_", function(self, alpha, x)
  if not is_tensor(x) then operand_error("axpy_", x) end
  check(C.sh_axpy_(self.p, alpha, x.p), 2)
  return self
end)

def("scale_", function(self, alpha) check(C.sh_scale_(self.p, alpha), 2); return self end)

-- t:mul_(tensor) or t:mul_(number)
local mul_ = inplace("mul_", OP.mul)
def("mul_", function(self, x)
  if type(x) == "number" then return raw.scale_(self, x) end
  return mul_(self, x)
end)

def("fill_", function(self, v) check(C.sh_tensor_fill_(self.p, v), 2); return self end)

---------------------------------------------------------------------------------------------
-- reductions

-- t:sum() over everything (a 0-dim tensor), t:sum(dim, keepdim) over one dim.
for name, op in pairs(RED) do
  def(name, function(a, dim, keepdim)
    if dim == nil then return new_from(C.sh_reduce_all, op, a.p) end
    return new_from(C.sh_reduce, op, a.p, cdim(dim, name), keepdim and 1 or 0)
  end)
end

-- 0-based i64 indices of the first max; over everything when dim is nil.
def("argmax", function(self, dim, keepdim)
  if dim ~= nil then return new_from(C.sh_argmax, self.p, cdim(dim, "argmax"), keepdim and 1 or 0) end
  local flat = self:reshape(self:numel())
  local ok, r = pcall(new_from, C.sh_argmax, flat.p, 0, 0)
  flat:free()
  if not ok then error(r, 2) end
  return r
end)

-- Sum of squares in f64, as a Lua number (grad-norm clipping).
local status = require("ffi").new("int[1]")
def("sumsq", function(self)
  local v = C.sh_sumsq(self.p, status)
  check(status[0], 2)
  return v
end)

-- Sums self down to `shape` (a table), undoing broadcasting.
def("sum_to", function(self, shape)
  local n, s = tensor.shape_args(shape)
  return new_from(C.sh_sum_to_shape, self.p, n, s)
end)

---------------------------------------------------------------------------------------------
-- matrix products

def("matmul", function(self, b)
  if not is_tensor(b) then operand_error("matmul", b) end
  return new_from(C.sh_matmul, self.p, b.p)
end)

local function ndim_matmul(name, nd)
  return function(a, b)
    if not is_tensor(b) then operand_error(name, b) end
    if a.p.ndim ~= nd or b.p.ndim ~= nd then
      error(("%s: needs two %d-D tensors, got %s and %s"):format(name, nd, a:describe(), b:describe()), 2)
    end
    return new_from(C.sh_matmul, a.p, b.p)
  end
end
def("mm", ndim_matmul("mm", 2))
def("bmm", ndim_matmul("bmm", 3))

---------------------------------------------------------------------------------------------
-- creation and random numbers

-- (shape, opts) where shape is a table, or numbers followed by an optional opts table.
local function shape_opts(first, ...)
  if type(first) == "table" then return first, (...) end
  local shape, args = {}, { first, ... }
  for i = 1, select("#", first, ...) do
    if type(args[i]) == "table" then return shape, args[i] end
    shape[#shape + 1] = args[i]
  end
  return shape, nil
end

def("normal_", function(self, mean, std) return random.normal_(self, mean, std) end)
def("uniform_", function(self, low, high) return random.uniform_(self, low, high) end)

function M.randn(...)
  local shape, opts = shape_opts(...)
  return random.normal_(tensor.empty(shape, opts), 0, 1)
end

function M.rand(...)
  local shape, opts = shape_opts(...)
  return random.uniform_(tensor.empty(shape, opts), 0, 1)
end

function M.normal_(t, mean, std) return random.normal_(t, mean, std) end
function M.uniform_(t, low, high) return random.uniform_(t, low, high) end

-- arange(stop), arange(start, stop), arange(start, stop, step), each optionally followed
-- by opts; as torch, i64 when every bound is integral, else the default float dtype.
function M.arange(...)
  local nums, opts = {}, nil
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if type(v) == "table" then opts = v
    elseif type(v) == "number" then nums[#nums + 1] = v
    else error("arange: expected numbers and an optional opts table, got " .. type(v), 2) end
  end
  if #nums < 1 or #nums > 3 then error("arange: expected 1 to 3 numbers, got " .. #nums, 2) end
  local start, stop, step = 0, nums[1], 1
  if #nums >= 2 then start, stop = nums[1], nums[2] end
  if #nums == 3 then step = nums[3] end
  opts = opts or {}
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local dtype = tensor.dtype_id(opts.dtype or (integral and "i64" or tensor.default_dtype))
  return new_from(C.sh_arange, start, stop, step, dtype, tensor.device_id(opts.device))
end

M.manual_seed = random.manual_seed

return M
