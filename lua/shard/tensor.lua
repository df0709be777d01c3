-- shard.tensor: the Tensor type. A tensor is an FFI struct (sh_handle) holding the one
-- pointer to its C sh_tensor; the struct's metatype gives it methods, operators, indexing
-- and a __gc that is only a backstop: :free() releases the storage at once. Who owns what,
-- and when it is freed: docs/OWNERSHIP.md.
local ffi = require("ffi")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

ffi.cdef "typedef struct sh_handle { sh_tensor *p; } sh_handle;"

local M = {}
-- Methods. Each is defined once, by the module that owns it: this one (queries, lifetime,
-- copies), shard.ops (in-place and other non-differentiable math), shard.functional (the
-- differentiable ops and views) and shard.autograd (backward, retain, zero_grad, ...).
local Tensor = {}
M.Tensor = Tensor

-- dtype id -> name, from the runtime (dtype.h's enum, named by sh_dtype_name).
local DTYPES = {}
for id = 0, 63 do
  local name = ffi.string(C.sh_dtype_name(id))
  if name == "?" then break end
  DTYPES[id] = name
end
M.default_dtype = "f32"
M.default_device = "cpu"   -- shard.init picks cuda:N when a GPU is there

function M.dtype_id(name)
  if type(name) == "number" then return name end
  local id = C.sh_dtype_from_name(name)
  if id < 0 then error("unknown dtype '" .. tostring(name) .. "' (expected f64, f32, bf16, f16, i64, i32, u8 or bool)", 3) end
  return id
end
function M.dtype_name(id) return DTYPES[id] end

-- Device ids: -1 the CPU, N cuda:N, C.SH_DEVICE_META the meta device (runtime/core/meta.h: shapes
-- and memory accounting without data, for dry runs) and C.SH_DEVICE_META_HOST its host side
-- ("meta:host", where a dry run's CPU offload keeps what a GPU run keeps in pinned memory).
local META, META_HOST = C.SH_DEVICE_META, C.SH_DEVICE_META_HOST
function M.device_id(dev)
  if dev == nil or dev == "cpu" or dev == -1 then return -1 end
  if type(dev) == "number" then return dev end
  if dev == "meta" then return META end
  if dev == "meta:host" then return META_HOST end
  if dev == "cuda" then return 0 end
  local n = type(dev) == "string" and dev:match("^cuda:(%d+)$")
  if not n then error("unknown device '" .. tostring(dev) .. "' (expected cpu, cuda, cuda:N, meta or meta:host)", 3) end
  return tonumber(n)
end
function M.device_name(id)
  if id == META then return "meta" end
  if id == META_HOST then return "meta:host" end
  return id < 0 and "cpu" or ("cuda:" .. id)
end

local Handle = ffi.typeof("sh_handle")
local box = ffi.new("sh_tensor*[1]")

-- Wraps a freshly created C tensor; the handle becomes its only owner.
local function wrap(p)
  return Handle(p)
end
M.wrap = wrap

-- A handle to a tensor struct owned by someone else (a .grad owned by its tensor): no
-- finalizer, no reference of its own. Only for use right away, within the call that made
-- it (the struct goes when its owner replaces or frees it); t.grad is the form to keep.
function M.borrow(p)
  return ffi.gc(Handle(p), nil)
end

-- Calls a C function whose first argument is an sh_tensor** out-parameter.
local function new_from(fn, ...)
  box[0] = nil
  check(fn(box, ...), 3)
  return wrap(box[0])
end
M.new_from = new_from

-- Shapes come as a table {2, 3} or as numbers 2, 3.
local shape_buf = ffi.new("int64_t[8]")
local function shape_args(first, ...)
  local dims = type(first) == "table" and first or { first, ... }
  if #dims > 8 then error("a tensor has at most 8 dims, got " .. #dims, 3) end
  for i = 1, #dims do
    if type(dims[i]) ~= "number" then error("shape entries must be numbers, got " .. type(dims[i]), 3) end
    shape_buf[i - 1] = dims[i]
  end
  return #dims, shape_buf
end
M.shape_args = shape_args

local function opts_of(opts)
  opts = opts or {}
  return M.dtype_id(opts.dtype or M.default_dtype), M.device_id(opts.device or M.default_device)
end

function M.empty(shape, opts)
  local dtype, device = opts_of(opts)
  local n, s = shape_args(shape)
  return new_from(C.sh_tensor_empty, n, s, dtype, device)
end

function M.full(shape, value, opts)
  local t = M.empty(shape, opts)
  if t.p.device < 0 then check(C.sh_tensor_fill_(t.p, value), 2) else t:fill_(value) end
  return t
end
function M.zeros(shape, opts) return M.full(shape, 0, opts) end
function M.ones(shape, opts) return M.full(shape, 1, opts) end

-- shard.tensor{{1,2},{3,4}}: shape from the nesting, values in row-major order.
function M.tensor(data, opts)
  if type(data) == "number" then
    local t = M.empty({}, opts)
    check(C.sh_tensor_fill_(t.p, data), 2)
    return t
  end
  if type(data) ~= "table" then error("shard.tensor expects a number or nested tables, got " .. type(data), 2) end
  local shape, flat = {}, {}
  local node = data
  while type(node) == "table" do shape[#shape + 1] = #node; node = node[1] end
  local function walk(t, depth)
    if #t ~= shape[depth] then error(("shard.tensor: ragged nesting at depth %d (%d vs %d entries)"):format(depth, #t, shape[depth]), 4) end
    for i = 1, #t do
      local v = t[i]
      if depth < #shape then
        if type(v) ~= "table" then error("shard.tensor: ragged nesting at depth " .. depth, 4) end
        walk(v, depth + 1)
      else
        if type(v) == "boolean" then v = v and 1 or 0 end
        if type(v) ~= "number" then error("shard.tensor: expected a number, got " .. type(v), 4) end
        flat[#flat + 1] = v
      end
    end
  end
  walk(data, 1)
  local dtype, device = opts_of(opts)
  local host = M.empty(shape, { dtype = dtype, device = "cpu" })
  local buf = ffi.new("double[?]", math.max(#flat, 1))
  for i = 1, #flat do buf[i - 1] = flat[i] end
  check(C.sh_tensor_write_f64(host.p, buf), 2)
  if device == -1 then return host end
  local t = host:to(M.device_name(device))
  host:free()
  return t
end

function M.is_tensor(x) return ffi.istype(Handle, x) end

---------------------------------------------------------------------------------------------
-- queries

function Tensor:shape()
  local p, s = self.p, {}
  for d = 0, p.ndim - 1 do s[d + 1] = tonumber(p.shape[d]) end
  return s
end
function Tensor:size(d)
  local p = self.p
  if d < 0 then d = d + p.ndim + 1 end
  if d < 1 or d > p.ndim then error(("size: dim %d out of range for %d dims"):format(d, p.ndim), 2) end
  return tonumber(p.shape[d - 1])
end
function Tensor:stride()
  local p, s = self.p, {}
  for d = 0, p.ndim - 1 do s[d + 1] = tonumber(p.stride[d]) end
  return s
end
function Tensor:dim() return self.p.ndim end
function Tensor:numel() return tonumber(C.sh_tensor_numel(self.p)) end
function Tensor:dtype() return DTYPES[self.p.dtype] end
function Tensor:device() return M.device_name(self.p.device) end
function Tensor:is_cuda() return self.p.device >= 0 end
function Tensor:is_contiguous() return C.sh_tensor_is_contiguous(self.p) == 1 end
function Tensor:is_freed() return self.p.storage == nil end
function Tensor:data_ptr() check(C.sh_tensor_check(self.p, "data_ptr"), 2); return C.sh_tensor_data(self.p) end
function Tensor:describe()
  local buf = ffi.new("char[200]")
  C.sh_tensor_describe(self.p, buf, 200)
  return ffi.string(buf)
end

-- A device tensor is copied to the host first (a synchronising read; a meta tensor reads 0).
local function on_host(t)
  if t.p.device == -1 then return t, false end
  return t:to("cpu"), true
end

function Tensor:item()
  local host, copied = on_host(self)
  local v = ffi.new("double[1]")
  local rc = C.sh_tensor_item(host.p, v)
  if copied then host:free() end
  check(rc, 2)
  return v[0]
end

-- Every element as a flat Lua array of numbers (row-major); moves to the CPU if needed.
function Tensor:tolist_flat()
  local src = self.p.device ~= -1 and self:to("cpu") or self
  local n = src:numel()
  local buf = ffi.new("double[?]", math.max(n, 1))
  check(C.sh_tensor_read_f64(src.p, buf), 2)
  local out = {}
  for i = 1, n do out[i] = buf[i - 1] end
  if src ~= self then src:free() end
  return out
end

-- Nested Lua tables in the tensor's shape.
function Tensor:tolist()
  local flat, shape = self:tolist_flat(), self:shape()
  if #shape == 0 then return flat[1] end
  local pos = 0
  local function build(d)
    local t = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; t[i] = flat[pos] else t[i] = build(d + 1) end
    end
    return t
  end
  return build(1)
end

---------------------------------------------------------------------------------------------
-- lifetime

-- t.grad: a borrowed view of the gradient t owns (the C struct's .grad).
-- Each tensor handle caches one alias of its grad, made on the first t.grad and handed out
-- again while it still views that grad. The alias is ended (sh_tensor_release: its storage
-- reference is dropped at once) when t is freed, when the grad is replaced or dropped
-- (t.grad = g, zero_grad, shard.flatparam taking the parameters' grads: grad_changed), or
-- when whoever holds it frees it; a later t.grad makes a fresh one. So a view kept past any
-- of these fails with SH_ERR_FREED on use and never holds the gradient's memory, and
-- nothing but the alias's small host struct is left to the GC, as for any handle.
-- Why an alias and not a borrowed handle of the grad struct itself: that struct is
-- destroyed whenever the grad is replaced or t is freed, so a handle to it kept by the
-- caller would read freed host memory; the alias struct lives as long as its handle and is
-- only ever emptied. Why cached: a new alias per access would hold the grad's storage
-- until the GC found it.
local grad_views = setmetatable({}, { __mode = "k" })   -- tensor handle -> its grad view

local function end_grad_view(t)
  local v = grad_views[t]
  if v then grad_views[t] = nil; C.sh_tensor_release(v.p) end
end

-- t's C-side grad was replaced or dropped behind t.grad's back: end the view.
M.grad_changed = end_grad_view

local function same_view(a, b)
  if a.storage ~= b.storage or a.offset ~= b.offset or a.dtype ~= b.dtype or a.ndim ~= b.ndim then return false end
  for d = 0, a.ndim - 1 do
    if a.shape[d] ~= b.shape[d] or a.stride[d] ~= b.stride[d] then return false end
  end
  return true
end

local function grad_view(t)
  local g, v = t.p.grad, grad_views[t]
  if v and g ~= nil and v.p.storage ~= nil and same_view(v.p, g) then return v end
  if v then end_grad_view(t) end
  if g == nil then return nil end
  v = new_from(C.sh_tensor_alias, g)
  grad_views[t] = v
  return v
end

-- Sets (a view of g) or clears t's C-side grad.
function M.set_grad(t, g)
  check(C.sh_tensor_set_grad(t.p, g and g.p or nil), 3)
  end_grad_view(t)
end

-- Drops the storage (and grad) now; the handle stays, and a later use is an error.
function Tensor:free()
  if grad_views[self] then end_grad_view(self) end
  C.sh_tensor_release(self.p)
  return nil
end

function Tensor:alias() return new_from(C.sh_tensor_alias, self.p) end

---------------------------------------------------------------------------------------------
-- views: the bindings of the sh_view_* calls (and contiguous/reshape, which copy only when
-- they must). They record nothing; shard.functional makes the Tensor methods (t:view(...),
-- t:narrow(...), ...) of them, differentiable.

local V = {}
M.views = V
function V.view(t, ...) local n, s = shape_args(...); return new_from(C.sh_view_reshape, t.p, n, s) end
function V.reshape(t, ...) local n, s = shape_args(...); return new_from(C.sh_tensor_reshape, t.p, n, s) end
function V.expand(t, ...) local n, s = shape_args(...); return new_from(C.sh_view_expand, t.p, n, s) end
-- Dims and indices are 1-based in Lua (negative counts from the end), 0-based in C. The
-- checks are made here, so a message names them as the caller wrote them (C's would be
-- 0-based). `extra` widens the range by one for unsqueeze (a new dim may go last).
-- `level` is error's, counted from cdim's caller (default 3: the caller of a view's caller).
local function cdim(t, d, op, extra, level)
  local n = t.p.ndim + (extra or 0)
  level = (level or 3) + 1
  if type(d) ~= "number" or d % 1 ~= 0 then error(("%s: dim must be an integer, got %s"):format(op, tostring(d)), level) end
  if d == 0 or d > n or d < -n then
    error(("%s: dim %d is out of range for %s (dims are 1-based: 1..%d or -%d..-1)"):format(op, d, t:describe(), n, n), level)
  end
  return d < 0 and d + n or d - 1
end
M.cdim = cdim

local function int_arg(op, what, v)
  if type(v) ~= "number" or v % 1 ~= 0 then error(("%s: %s must be an integer, got %s"):format(op, what, tostring(v)), 4) end
end

function V.narrow(t, dim, start, length)
  local d = cdim(t, dim, "narrow")
  int_arg("narrow", "start", start); int_arg("narrow", "length", length)
  local n = tonumber(t.p.shape[d])
  if start < 1 or length < 0 or start + length - 1 > n then
    error(("narrow: elements %d..%d are out of range for dim %d of size %d in %s (indices are 1-based)"):format(
      start, start + length - 1, dim, n, t:describe()), 3)
  end
  return new_from(C.sh_view_narrow, t.p, d, start - 1, length)
end
function V.select(t, dim, index)
  local d = cdim(t, dim, "select")
  int_arg("select", "index", index)
  local n = tonumber(t.p.shape[d])
  if index == 0 or index > n or index < -n then
    error(("select: index %d is out of range for dim %d of size %d in %s (indices are 1-based: 1..%d or -%d..-1)"):format(
      index, dim, n, t:describe(), n, n), 3)
  end
  return new_from(C.sh_view_select, t.p, d, index < 0 and index + n or index - 1)
end
function V.transpose(t, d0, d1) return new_from(C.sh_view_transpose, t.p, cdim(t, d0, "transpose"), cdim(t, d1, "transpose")) end
function V.unsqueeze(t, dim) return new_from(C.sh_view_unsqueeze, t.p, cdim(t, dim, "unsqueeze", 1)) end
function V.squeeze(t, dim)
  local d = cdim(t, dim, "squeeze")
  if t.p.shape[d] ~= 1 then
    error(("squeeze: dim %d of %s has size %d, not 1"):format(dim, t:describe(), tonumber(t.p.shape[d])), 3)
  end
  return new_from(C.sh_view_squeeze, t.p, d)
end
function V.permute(t, ...)
  local order = type((...)) == "table" and (...) or { ... }
  if #order ~= t.p.ndim then error(("permute: %d dims given for %s"):format(#order, t:describe()), 3) end
  local perm, seen = ffi.new("int[8]"), {}
  for i = 1, #order do
    local d = cdim(t, order[i], "permute")
    if seen[d] then error(("permute: dim %d is given twice in {%s}"):format(d + 1, table.concat(order, ", ")), 3) end
    seen[d] = true
    perm[i - 1] = d
  end
  return new_from(C.sh_view_permute, t.p, perm)
end
function V.contiguous(t) return new_from(C.sh_tensor_contiguous, t.p) end

---------------------------------------------------------------------------------------------
-- copies and conversions

-- t:to("bf16"), t:to("cuda"), t:to{dtype = "f32", device = "cpu"}
function Tensor:to(what)
  local dtype, device = self.p.dtype, self.p.device
  if type(what) == "table" then
    if what.dtype then dtype = M.dtype_id(what.dtype) end
    if what.device then device = M.device_id(what.device) end
  elseif type(what) == "string" and (what == "cpu" or what:match("^meta") or what:match("^cuda")) then
    device = M.device_id(what)
  else
    dtype = M.dtype_id(what)
  end
  return new_from(C.sh_tensor_to, self.p, dtype, device)
end
function Tensor:float() return self:to("f32") end
function Tensor:double() return self:to("f64") end
function Tensor:clone() return new_from(C.sh_tensor_to, self.p, self.p.dtype, self.p.device) end
function Tensor:copy_(src) check(C.sh_tensor_copy_(self.p, src.p), 2); return self end

-- t:get{i, j} or t:get(i, j); t:set({i, j}, value). Indices are 1-based, negative from the
-- end; each is checked here so the message names it as the caller wrote it.
local index_buf = ffi.new("int64_t[8]")
local function fill_index(t, op, idx)
  if type(idx) ~= "table" then
    error(("%s: expected a table of indices such as {1, 2}, got %s"):format(op, type(idx)), 3)
  end
  local p = t.p
  if #idx ~= p.ndim then error(("%s: index has %d entries for %s"):format(op, #idx, t:describe()), 3) end
  for i = 1, #idx do
    local v, n = idx[i], tonumber(p.shape[i - 1])
    if type(v) ~= "number" or v % 1 ~= 0 then
      error(("%s: index entry %d must be an integer, got %s"):format(op, i, tostring(v)), 3)
    end
    if v == 0 or v > n or v < -n then
      error(("%s: index %d is out of range for dim %d of size %d in %s (indices are 1-based: 1..%d or -%d..-1)"):format(
        op, v, i, n, t:describe(), n, n), 3)
    end
    index_buf[i - 1] = v < 0 and v + n or v - 1
  end
end
function Tensor:get(idx, ...)
  if type(idx) == "number" then idx = { idx, ... } end
  fill_index(self, "get", idx)
  local host, copied = on_host(self)
  local v = ffi.new("double[1]")
  local rc = C.sh_tensor_get(host.p, index_buf, v)
  if copied then host:free() end
  check(rc, 2)
  return v[0]
end
function Tensor:set(idx, value)
  fill_index(self, "set", idx)
  if type(value) == "boolean" then value = value and 1 or 0 end
  if type(value) ~= "number" then error(("set: the value must be a number, got %s"):format(type(value)), 2) end
  check(C.sh_tensor_set(self.p, index_buf, value), 2)
  return self
end

---------------------------------------------------------------------------------------------
-- the metatype

local mt = {}
local complete = false   -- the modules defining the other methods are loaded
function mt.__index(self, k)
  local m = Tensor[k]
  if m ~= nil then return m end
  if not complete then
    complete = true
    require("shard.ops")
    require("shard.functional")
    m = Tensor[k]
    if m ~= nil then return m end
  end
  if type(k) == "number" then            -- t[i]: a view of row i, or a number for 1-D t
    local p = self.p
    if p.ndim == 0 then error("cannot index a 0-dim tensor; use :item()", 2) end
    local n = tonumber(p.shape[0])
    local i = k < 0 and k + n + 1 or k
    if i < 1 or i > n then error(("index %d out of range for dim 1 of size %d in %s"):format(k, n, self:describe()), 2) end
    if p.ndim == 1 then return self:get({ i }) end
    return self:select(1, i)
  end
  if k == "grad" then
    return grad_view(self)
  elseif k == "requires_grad" then
    return self.p.requires_grad ~= 0
  end
  return nil
end
function mt.__newindex(self, k, v)
  if type(k) == "number" then
    local p = self.p
    if p.ndim == 1 then return self:set({ k }, v) end
    local row = self:select(1, k)
    if type(v) == "number" then check(C.sh_tensor_fill_(row.p, v), 2) else row:copy_(v) end
    row:free()
  elseif k == "grad" then
    M.set_grad(self, v)
  elseif k == "requires_grad" then
    self.p.requires_grad = v and 1 or 0
  else
    error("cannot set field '" .. tostring(k) .. "' on a tensor", 2)
  end
end
function mt.__gc(self) C.sh_tensor_destroy(self.p) end
function mt.__len(self) return self.p.ndim > 0 and tonumber(self.p.shape[0]) or 0 end
function mt.__tostring(self) return require("shard.print").tensor(self) end
-- Arithmetic operators forward to methods that shard.ops (and autograd) define.
function mt.__add(a, b) return M.binary("add", a, b) end
function mt.__sub(a, b) return M.binary("sub", a, b) end
function mt.__mul(a, b) return M.binary("mul", a, b) end
function mt.__div(a, b) return M.binary("div", a, b) end
function mt.__pow(a, b) return M.binary("pow", a, b) end
function mt.__unm(a) return a:neg() end

-- a OP b where either side may be a number: tensor OP scalar, or scalar OP tensor.
function M.binary(op, a, b)
  if M.is_tensor(a) then return a[op](a, b) end
  return Tensor["r" .. op](b, a)
end

ffi.metatype(Handle, mt)
return M
