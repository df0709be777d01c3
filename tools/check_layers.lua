-- make check-layers: runtime/'s layers, checked from the sources and the built objects.
--   luajit tools/check_layers.lua BUILD
-- runtime/ stacks core < cpu < ops < dist < io (host.c, bin/shard, above them all); kernels/
-- sits beside cpu (a backend the ops dispatch to), except comm_nccl.cu, which is dist's NCCL
-- backend. Three rules, each failure one line naming the files:
--   1. no file includes a header of a higher layer (its #include lines);
--   2. no object calls a function defined by a higher layer (nm: a symbol one object needs and
--      another defines is a call from the first file to the second);
--   3. no circle of calls among runtime/ files is longer than two files (strongly connected
--      components of that call graph).
-- Then one line per layer: files, and the arrows that leave it, for the note and docs.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path   -- shard's modules, from the root
local files = require("shard.files")

local M = {}

M.RANK = { core = 0, cpu = 1, kernels = 1, ops = 2, dist = 3, io = 4, host = 5 }

-- The layer of a source path (runtime/ops/x.c, kernels/y.cu, runtime/host.c).
function M.layer_of(path)
  if path:match("^kernels/comm_nccl") then return "dist" end
  if path:match("^kernels/") then return "kernels" end
  if path == "runtime/host.c" then return "host" end
  return path:match("^runtime/(%a+)/")
end

local function sources()
  return files.lines_of("ls runtime/*/*.c runtime/*/*.h runtime/host.c kernels/*.cu kernels/*.cuh 2>/dev/null")
end

-- The folder a quoted include resolves to: "dir/x.h" names it, a bare "x.h" is beside the file.
local function include_layer(from, inc)
  local dir = inc:match("^(%a+)/[^/]+$")
  if dir and M.RANK[dir] then return dir end
  if inc:find("/") then return nil end
  return M.layer_of(from)
end

-- Rule 1: lines "FILE includes HEADER of layer L above its own layer K"; and how many
-- includes were checked.
function M.include_violations(files, read)
  local bad, checked = {}, 0
  for _, f in ipairs(files) do
    local mine = M.layer_of(f)
    for inc in read(f):gmatch('#include "([^"]+)"') do
      checked = checked + 1
      local theirs = include_layer(f, inc)
      if mine and theirs and M.RANK[theirs] > M.RANK[mine] then
        bad[#bad + 1] = string.format("%s (%s) includes %s of the higher layer %s", f, mine, inc, theirs)
      end
    end
  end
  return bad, checked
end

-- The call graph of the built objects: edges[a][b] = a symbol a needs that b defines.
function M.call_graph(objects, nm)
  local defines, needs = {}, {}
  for _, o in ipairs(objects) do
    needs[o.src] = {}
    for _, l in ipairs(nm(o.path)) do
      local kind, sym = l:match("^%s*%x*%s+(%a)%s+(%S+)$")
      if kind == "U" then needs[o.src][#needs[o.src] + 1] = sym
      elseif kind and kind:match("[TDBR]") then defines[sym] = o.src end
    end
  end
  local edges = {}
  for a, syms in pairs(needs) do
    edges[a] = edges[a] or {}
    for _, s in ipairs(syms) do
      local b = defines[s]
      if b and b ~= a then edges[a][b] = edges[a][b] or s end
    end
  end
  return edges
end

-- Rule 2: lines "A (layer) calls B (higher layer): SYMBOL"; and how many calls were checked.
function M.call_violations(edges)
  local bad, checked = {}, 0
  for a, to in pairs(edges) do
    for b, sym in pairs(to) do
      checked = checked + 1
      local la, lb = M.layer_of(a), M.layer_of(b)
      if la and lb and M.RANK[lb] > M.RANK[la] then
        bad[#bad + 1] = string.format("%s (%s) calls %s of the higher layer %s (%s)", a, la, sym, b, lb)
      end
    end
  end
  table.sort(bad)
  return bad, checked
end

-- Strongly connected components (Tarjan) of the edges restricted to keep(file).
function M.components(edges, keep)
  local index, low, on, stack, comps, n = {}, {}, {}, {}, {}, 0
  local function visit(v)
    n = n + 1; index[v], low[v] = n, n
    stack[#stack + 1] = v; on[v] = true
    for w in pairs(edges[v] or {}) do
      if keep(w) then
        if not index[w] then visit(w); low[v] = math.min(low[v], low[w])
        elseif on[w] then low[v] = math.min(low[v], index[w]) end
      end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat local w = table.remove(stack); on[w] = nil; comp[#comp + 1] = w until w == v
      table.sort(comp)
      comps[#comps + 1] = comp
    end
  end
  local names = {}
  for v in pairs(edges) do if keep(v) then names[#names + 1] = v end end
  table.sort(names)
  for _, v in ipairs(names) do if not index[v] then visit(v) end end
  return comps
end

-- Rule 3: lines naming each circle of more than two runtime/ files; and how many components.
function M.circle_violations(edges)
  local bad = {}
  local comps = M.components(edges, function(f) return f:match("^runtime/") ~= nil end)
  for _, c in ipairs(comps) do
    if #c > 2 then bad[#bad + 1] = string.format("a circle of %d files: %s", #c, table.concat(c, " ")) end
  end
  return bad, #comps
end

local function read_file(path) return assert(files.read_file(path)) end

-- The objects of BUILD whose sources exist (a stale object of a moved file is left out).
local function objects_of(build)
  local out = {}
  for _, src in ipairs(sources()) do
    local stem = src:match("^(.*)%.cu?$")
    if stem and src ~= "runtime/host.c" then
      local path = build .. "/" .. stem .. ".o"
      local f = io.open(path, "rb")
      if f then f:close(); out[#out + 1] = { src = src, path = path } end
    end
  end
  return out
end

function M.main(args)
  local build = args[1] or "build"
  local srcs = sources()
  local objects = objects_of(build)
  if #objects == 0 then
    io.stderr:write("check_layers: no objects under " .. build .. "/runtime (run make first)\n")
    return 1
  end
  local edges = M.call_graph(objects, function(p) return files.lines_of("nm " .. p) end)
  local bad, checked = {}, 0
  for _, rule in ipairs({ function() return M.include_violations(srcs, read_file) end,
                          function() return M.call_violations(edges) end,
                          function() return M.circle_violations(edges) end }) do
    local list, n = rule()
    checked = checked + n
    for _, l in ipairs(list) do bad[#bad + 1] = l end
  end
  local per = {}
  for _, f in ipairs(srcs) do local l = M.layer_of(f); per[l] = (per[l] or 0) + 1 end
  for _, l in ipairs({ "core", "cpu", "kernels", "ops", "dist", "io" }) do
    print(string.format("layer %-8s %3d files", l, per[l] or 0))
  end
  for _, l in ipairs(bad) do print("not ok " .. l) end
  print(string.format("check_layers: %d files, %d objects", #srcs, #objects))
  print(string.format("C check_layers: %d passed, %d failed", checked - #bad, #bad))
  return #bad == 0 and 0 or 1
end

if arg and arg[0] and arg[0]:match("check_layers%.lua$") then os.exit(M.main(arg)) end
return M
