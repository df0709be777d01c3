-- shard.ops: the bindings of runtime/ops/ops.h, one per C entry point, and the tensor math that
-- is not differentiable as Tensor methods (in-place updates, sumsq, sum_to, random fills).
-- The differentiable methods (a:add(b), a:sum(dim), a:matmul(b), ...) are shard.functional's,
-- built on these bindings; ops.raw holds their non-recording forms. Dims are 1-based
-- (negative counts from the end) and become 0-based for C; indices that are data (argmax's
-- result) stay 0-based, as token ids are. Random numbers come from shard.random's generator.
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local random = require("shard.random")
local C, check = rt.C, rt.check
local Tensor, new_from, is_tensor = tensor.Tensor, tensor.new_from, tensor.is_tensor

local M = {}

-- The op codes of ops.h, read from its enums (shard.ffi declares the header).
M.BINARY = { add = C.SH_OP_ADD, sub = C.SH_OP_SUB, mul = C.SH_OP_MUL, div = C.SH_OP_DIV, pow = C.SH_OP_POW,
             maximum = C.SH_OP_MAXIMUM, minimum = C.SH_OP_MINIMUM, eq = C.SH_OP_EQ, lt = C.SH_OP_LT, gt = C.SH_OP_GT }
M.UNARY = { neg = C.SH_OP_NEG, exp = C.SH_OP_EXP, log = C.SH_OP_LOG, sqrt = C.SH_OP_SQRT, rsqrt = C.SH_OP_RSQRT,
            tanh = C.SH_OP_TANH, abs = C.SH_OP_ABS, square = C.SH_OP_SQUARE, reciprocal = C.SH_OP_RECIPROCAL,
            sign = C.SH_OP_SIGN }
M.REDUCE = { sum = C.SH_OP_SUM, mean = C.SH_OP_MEAN, max = C.SH_OP_MAX, min = C.SH_OP_MIN }
local BINARY, UNARY, REDUCE = M.BINARY, M.UNARY, M.REDUCE

---------------------------------------------------------------------------------------------
-- the bindings: one per entry point of ops.h that makes a new tensor (dims 0-based here)

function M.binary(op, a, b) return new_from(C.sh_binary, op, a.p, b.p) end
function M.binary_scalar(op, a, s, scalar_first) return new_from(C.sh_binary_scalar, op, a.p, s, scalar_first and 1 or 0) end
function M.unary(op, a) return new_from(C.sh_unary, op, a.p) end
-- Over C dim `dim` (0-based or negative), or over everything into a 0-dim tensor when nil.
function M.reduce(op, a, dim, keepdim)
  if dim == nil then return new_from(C.sh_reduce_all, op, a.p) end
  return new_from(C.sh_reduce, op, a.p, dim, keepdim and 1 or 0)
end
function M.argmax(a, dim, keepdim) return new_from(C.sh_argmax, a.p, dim, keepdim and 1 or 0) end
function M.matmul(a, b) return new_from(C.sh_matmul, a.p, b.p) end
function M.sum_to_shape(a, ndim, shape) return new_from(C.sh_sum_to_shape, a.p, ndim, shape) end

-- A Lua dim of t (1-based, or negative from the end) as a C dim, range checked here so the
-- message is in 1-based terms.
local function cdim(t, d, op) return tensor.cdim(t, d, op, 0, 3) end
M.cdim = cdim

local function operand_error(op, x)
  error(("%s: expected a tensor or a number, got %s"):format(op, type(x)), 3)
end

---------------------------------------------------------------------------------------------
-- raw math: the non-differentiable forms of the ops shard.functional makes Tensor methods of
-- (a:add(b), a:sum(dim), ...). Its forward and backward passes use these bindings, and the
-- specs reach them as ops.raw where the binding itself is the point.

local raw = {}
M.raw = raw

-- raw.add(a, b) with b a tensor or a number; the r-forms are number OP tensor.
for name, op in pairs(BINARY) do
  raw[name] = function(a, b)
    if type(b) == "number" then return M.binary_scalar(op, a, b, false) end
    if not is_tensor(b) then operand_error(name, b) end
    return M.binary(op, a, b)
  end
end
for _, name in ipairs { "add", "sub", "mul", "div", "pow" } do
  local op = BINARY[name]
  raw["r" .. name] = function(a, s)
    if type(s) ~= "number" then operand_error(name, s) end
    return M.binary_scalar(op, a, s, true)
  end
end

for name, op in pairs(UNARY) do
  raw[name] = function(a) return M.unary(op, a) end
end

-- raw.sum(t) over everything (a 0-dim tensor), raw.sum(t, dim, keepdim) over one dim.
for name, op in pairs(REDUCE) do
  raw[name] = function(a, dim, keepdim)
    return M.reduce(op, a, dim ~= nil and cdim(a, dim, name) or nil, keepdim)
  end
end

-- 0-based i64 indices of the first max; over everything when dim is nil.
function raw.argmax(a, dim, keepdim)
  if dim ~= nil then return M.argmax(a, cdim(a, dim, "argmax"), keepdim) end
  local flat = tensor.views.reshape(a, a:numel())
  local ok, r = pcall(M.argmax, flat, 0, false)
  flat:free()
  if not ok then error(r, 2) end
  return r
end

function raw.matmul(a, b)
  if not is_tensor(b) then operand_error("matmul", b) end
  return M.matmul(a, b)
end

local function ndim_matmul(name, nd)
  return function(a, b)
    if not is_tensor(b) then operand_error(name, b) end
    if a.p.ndim ~= nd or b.p.ndim ~= nd then
      error(("%s: needs two %d-D tensors, got %s and %s"):format(name, nd, a:describe(), b:describe()), 2)
    end
    return M.matmul(a, b)
  end
end
raw.mm = ndim_matmul("mm", 2)
raw.bmm = ndim_matmul("bmm", 3)

---------------------------------------------------------------------------------------------
-- Tensor methods that are not differentiable: in place updates, sums of squares, sum_to.

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
Tensor.sub_ = inplace("sub_", BINARY.sub)
Tensor.div_ = inplace("div_", BINARY.div)
local add_, mul_ = inplace("add_", BINARY.add), inplace("mul_", BINARY.mul)

-- t:add_(x) or t:add_(x, alpha) (t += alpha * x) or t:add_(number)
function Tensor:add_(x, alpha)
  if alpha == nil then return add_(self, x) end
  if not is_tensor(x) then operand_error("add_", x) end
  check(C.sh_axpy_(self.p, alpha, x.p), 2)
  return self
end

-- t:axpy_(alpha, x): t += alpha * x, x broadcast to t (the argument order of sh_axpy_).
function Tensor:axpy_(alpha, x)
  if not is_tensor(x) then operand_error("axpy_", x) end
  check(C.sh_axpy_(self.p, alpha, x.p), 2)
  return self
end

function Tensor:scale_(alpha) check(C.sh_scale_(self.p, alpha), 2); return self end

-- t:mul_(tensor) or t:mul_(number)
function Tensor:mul_(x)
  if type(x) == "number" then return self:scale_(x) end
  return mul_(self, x)
end

function Tensor:fill_(v) check(C.sh_tensor_fill_(self.p, v), 2); return self end

-- Sum of squares in f64, as a Lua number (grad-norm clipping).
local status = require("ffi").new("int[1]")
function Tensor:sumsq()
  local v = C.sh_sumsq(self.p, status)
  check(status[0], 2)
  return v
end

-- Sums self down to `shape` (a table), undoing broadcasting.
function Tensor:sum_to(shape)
  local n, s = tensor.shape_args(shape)
  return M.sum_to_shape(self, n, s)
end

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

function Tensor:normal_(mean, std) return random.normal_(self, mean, std) end
function Tensor:uniform_(low, high) return random.uniform_(self, low, high) end

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
