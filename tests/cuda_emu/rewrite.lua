-- rewrite.lua: the CUDA emulator's build-time rewrite of a .cu/.cuh file into C++ that g++
-- compiles against tests/cuda_emu/include. Usage: luajit rewrite.lua IN OUT [SHOWN_NAME]
-- It keeps every line where it was (a `#line 1 "SHOWN_NAME"` comes first, a multi-line launch
-- stays multi-line), so diagnostics and __LINE__ name the original source. Three forms change:
--   k<<<grid, block[, smem[, stream]]>>>(args)   ->  ::emu::launch(k, "k", __FILE__, __LINE__, grid, block, smem, stream)(args)
--     (k may be a template-id, k<T, U>; the configuration and the arguments may span lines)
--   extern __shared__ [__align__(n)] T name[];  ->  T *name = (T *)::emu::dynamic_shared();
--   __shared__ [__align__(n)] T a[N], b[M];     ->  T (&a)[N] = ::emu::shared_var<T[N], n>([]{}), (&b)[M] = ...;
-- Anything else around `<<<` or `__shared__` (a launch without its argument list, a
-- __shared__ at namespace scope or with an initializer) stops the build with file:line.
local inpath, outpath, shown = arg[1], arg[2], arg[3] or arg[1]
if not inpath or not outpath then
  io.stderr:write("usage: luajit rewrite.lua IN OUT [SHOWN_NAME]\n")
  os.exit(2)
end

local f = assert(io.open(inpath, "rb"))
local text = f:read("*a")
f:close()

-- The code view: same length as the text, comments and literal contents blanked.
local function code_view(t)
  local out, i, n, state = {}, 1, #t, "code"
  while i <= n do
    local c = t:sub(i, i)
    if state == "code" then
      local two = t:sub(i, i + 1)
      if two == "//" then state = "line"; out[#out + 1] = "  "; i = i + 2
      elseif two == "/*" then state = "block"; out[#out + 1] = "  "; i = i + 2
      elseif c == '"' then state = "str"; out[#out + 1] = c; i = i + 1
      elseif c == "'" then state = "chr"; out[#out + 1] = c; i = i + 1
      else out[#out + 1] = c; i = i + 1 end
    elseif state == "line" then
      if c == "\n" then state = "code" end
      out[#out + 1] = c == "\n" and "\n" or " "
      i = i + 1
    elseif state == "block" then
      if t:sub(i, i + 1) == "*/" then state = "code"; out[#out + 1] = "  "; i = i + 2
      else out[#out + 1] = c == "\n" and "\n" or " "; i = i + 1 end
    else
      local q = state == "str" and '"' or "'"
      if c == "\\" then out[#out + 1] = "  "; i = i + 2
      elseif c == q then state = "code"; out[#out + 1] = c; i = i + 1
      else out[#out + 1] = c == "\n" and "\n" or " "; i = i + 1 end
    end
  end
  return table.concat(out)
end

local view = code_view(text)
assert(#view == #text)

local function line_of(pos)
  local _, n = text:sub(1, pos):gsub("\n", "")
  return n + 1
end

local function die(pos, msg)
  io.stderr:write(string.format("%s:%d: tests/cuda_emu/rewrite.lua: %s\n", shown, line_of(pos), msg))
  os.exit(1)
end

local function count_nl(s)
  local _, n = s:gsub("\n", "")
  return n
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Brace depth before each position (namespace scope is depth 0).
local depth_at = {}
do
  local d = 0
  for i = 1, #view do
    depth_at[i] = d
    local c = view:sub(i, i)
    if c == "{" then d = d + 1 elseif c == "}" then d = d - 1 end
  end
end

local edits = {}   -- {from, to, replacement} over the original text, inclusive

-- ---- launches -------------------------------------------------------------------------
local pos = 1
while true do
  local p = view:find("<<<", pos, true)
  if not p then break end
  -- the kernel expression before it: identifier (with ::) and optional template arguments
  local j = p - 1
  while j >= 1 and view:sub(j, j):match("%s") do j = j - 1 end
  if view:sub(j, j) == ">" then
    local d = 0
    while j >= 1 do
      local c = view:sub(j, j)
      if c == ">" then d = d + 1 elseif c == "<" then d = d - 1 end
      if d == 0 then break end
      j = j - 1
    end
    if j < 1 then die(p, "unbalanced template arguments before <<<") end
    j = j - 1
    while j >= 1 and view:sub(j, j):match("%s") do j = j - 1 end
  end
  local e = j
  while j >= 1 and view:sub(j, j):match("[%w_:]") do j = j - 1 end
  local kstart = j + 1
  if kstart > e or not view:sub(kstart, e):match("^[:%a_]") then die(p, "cannot find the kernel name before <<<") end
  -- the configuration up to >>> at bracket depth 0
  local q, d = p + 3, 0
  while q <= #view do
    local c = view:sub(q, q)
    if d == 0 and view:sub(q, q + 2) == ">>>" then break end
    if c == "(" or c == "[" or c == "{" then d = d + 1 elseif c == ")" or c == "]" or c == "}" then d = d - 1 end
    if d < 0 then die(p, "unbalanced brackets in the launch configuration") end
    q = q + 1
  end
  if q > #view then die(p, "no >>> closes this launch configuration") end
  local r = q + 3
  while r <= #view and view:sub(r, r):match("%s") do r = r + 1 end
  if view:sub(r, r) ~= "(" then die(p, "a launch must be followed by its argument list") end
  local kexpr = text:sub(kstart, p - 1)
  local config = text:sub(p + 3, q - 1)
  if trim(config) == "" then die(p, "empty launch configuration") end
  local name = trim(kexpr:gsub("%s+", " "))
  edits[#edits + 1] = {kstart, q + 2, "::emu::launch(" .. kexpr .. ", \"" .. name .. "\", __FILE__, __LINE__, " .. config .. ")"}
  pos = q + 3
end

-- ---- __shared__ declarations --------------------------------------------------------------
-- Splits s at commas outside (), [], {} and <>.
local function split_top(s)
  local parts, d, start = {}, 0, 1
  for i = 1, #s do
    local c = s:sub(i, i)
    if c == "(" or c == "[" or c == "{" or c == "<" then d = d + 1
    elseif c == ")" or c == "]" or c == "}" or c == ">" then d = d - 1
    elseif c == "," and d == 0 then parts[#parts + 1] = s:sub(start, i - 1); start = i + 1 end
  end
  parts[#parts + 1] = s:sub(start)
  return parts
end

-- Splits "T *name[A][B]" (or "*name[A]" for a later declarator) into prefix, name, dims.
local function declarator(s, at)
  s = trim(s)
  local dims = ""
  while true do
    local before, dim = s:match("^(.-)%s*(%b[])$")
    if not before then break end
    dims = dim .. dims
    s = before
  end
  local prefix, name = s:match("^(.-)([%a_][%w_]*)$")
  if not name then die(at, "cannot parse the __shared__ declarator '" .. s .. "'") end
  return trim(prefix), name, dims
end

pos = 1
while true do
  local p, pe = view:find("%f[%w_]__shared__%f[^%w_]", pos)
  if not p then break end
  -- the end of the declaration: ';' outside brackets
  local q, d = pe + 1, 0
  while q <= #view do
    local c = view:sub(q, q)
    if c == "(" or c == "[" or c == "{" then d = d + 1 elseif c == ")" or c == "]" or c == "}" then d = d - 1 end
    if c == ";" and d == 0 then break end
    q = q + 1
  end
  if q > #view then die(p, "no ';' ends this __shared__ declaration") end
  if depth_at[p] == 0 then die(p, "__shared__ at namespace scope is not supported by the emulator") end
  local decl = text:sub(pe + 1, q - 1)
  local nl = count_nl(text:sub(p, q - 1))
  local align = "0"
  decl = decl:gsub("__align__%s*(%b())", function(a) align = trim(a:sub(2, -2)); return " " end)
  decl = decl:gsub("alignas%s*(%b())", function(a) align = trim(a:sub(2, -2)); return " " end)
  if decl:find("=", 1, true) then die(p, "a __shared__ variable cannot have an initializer") end
  -- an `extern` just before makes it the dynamic shared memory
  local b = p - 1
  while b >= 1 and view:sub(b, b):match("%s") do b = b - 1 end
  local ext = b >= 6 and view:sub(b - 5, b) == "extern" and not view:sub(b - 6, b - 6):match("[%w_]")
  local out
  if ext then
    local prefix, name, dims = declarator(decl, p)
    if dims:gsub("%s", "") ~= "[]" then die(p, "extern __shared__ must be an unsized array, got '" .. trim(decl) .. "'") end
    out = prefix .. " *" .. name .. " = (" .. prefix .. " *)::emu::dynamic_shared()"
    p = b - 5
  else
    local parts = split_top(decl)
    local base, name, dims = declarator(parts[1], p)
    if base == "" then die(p, "no type in this __shared__ declaration") end
    local stars0 = ""
    local btype = base:gsub("[%*%s]+$", function(s) stars0 = s:gsub("%s", ""); return "" end)
    local pieces = {}
    local function one(stars, nm, dm)
      local ty = btype .. (stars ~= "" and " " .. stars or "") .. dm
      return "(" .. stars .. "&" .. nm .. ")" .. dm .. " = ::emu::shared_var<" .. ty .. ", " .. align .. ">([]{})"
    end
    pieces[1] = btype .. " " .. one(stars0, name, dims)
    for k = 2, #parts do
      local stars, rest = trim(parts[k]):match("^([%*%s]*)(.*)$")
      local _, nm, dm = declarator(rest, p)
      pieces[k] = one(stars:gsub("%s", ""), nm, dm)
    end
    out = table.concat(pieces, ", ")
  end
  edits[#edits + 1] = {p, q - 1, out .. string.rep("\n", nl)}
  pos = q + 1
end

table.sort(edits, function(a, b) return a[1] < b[1] end)
local res, last = {}, 1
for _, e in ipairs(edits) do
  if e[1] < last then die(e[1], "overlapping rewrites") end
  res[#res + 1] = text:sub(last, e[1] - 1)
  res[#res + 1] = e[3]
  last = e[2] + 1
end
res[#res + 1] = text:sub(last)
local out = table.concat(res)
assert(count_nl(out) == count_nl(text), "rewrite.lua: line count changed")

local o = assert(io.open(outpath, "wb"))
o:write('#line 1 "' .. shown .. '"\n')
o:write(out)
o:close()
