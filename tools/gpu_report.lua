-- make gpu-report: every CUDA kernel's resources, from the ptxas reports the nvcc build keeps
-- beside its objects (BUILD/kernels/NAME.ptxas, written by -Xptxas -v), one line each:
--   kernel NAME regs R smem_static S smem_dynamic D spills P blocks_per_sm B
-- B is what CUDA's occupancy calculator gives on an H100 (sm_90) for the block size the
-- kernel is launched with (its __launch_bounds__, else LAUNCH below) and the dynamic shared
-- memory it asks for (LAUNCH). Fails (exit 1) when a kernel of a GUARDED file spills, when a
-- kernel has no LAUNCH entry or launch bound, or when an entry names no kernel (kernels of a
-- library, cub's in embedding.cu, are left out):
--   luajit tools/gpu_report.lua BUILD/kernels/*.ptxas
-- The last line is "C gpu_report: N passed, N failed" (one check per kernel and per entry),
-- as tests/run.sh counts a C test's.
local M = {}

-- Threads per block and dynamic shared memory (bytes) of each kernel's launch, by name: a
-- template instance ("attn_fwd_kernel<64>") before its base name ("attn_fwd_kernel"). Where
-- the figure depends on the shape, it is GPT-2 124M's (C 768, head dim 64). Attention's
-- entries follow kernels/attention.cu's launches (F_THREADS, flash_smem): keep them in step.
M.LAUNCH = {
  act_kernel = { threads = 256 },                        -- ACT_THREADS
  softmax_fwd_kernel = { threads = 256 },                -- 64 to 512 by C: 256 from C 256
  softmax_bwd_kernel = { threads = 256 },
  attn_dq_rowdot_kernel = { threads = 256 },
  attn_fwd_simple_kernel = { threads = 256 },
  attn_bwd_q_simple_kernel = { threads = 256 },
  attn_bwd_kv_simple_kernel = { threads = 256 },
  rope_kernel = { threads = 256 },
  attn_dq_store_kernel = { threads = 256 },
  -- flash_smem: tile = 64 (DP + 8) bf16; forward 5 tiles, dK/dV 6 tiles + 64 x 4 f32, dQ 6 tiles,
  -- the one-pass backward dK/dV's and a 64 x 72 bf16 dS^T tile
  ["attn_bwd_kernel<32>"] = { smem = 6 * 5120 + 1024 + 9216 }, ["attn_bwd_kernel<64>"] = { smem = 6 * 9216 + 1024 + 9216 },
  ["attn_bwd_kernel<128>"] = { smem = 6 * 17408 + 1024 + 9216 },
  ["attn_fwd_kernel<32>"] = { smem = 5 * 5120 }, ["attn_fwd_kernel<64>"] = { smem = 5 * 9216 },
  ["attn_fwd_kernel<128>"] = { smem = 5 * 17408 },
  ["attn_bwd_kv_kernel<32>"] = { smem = 6 * 5120 + 1024 }, ["attn_bwd_kv_kernel<64>"] = { smem = 6 * 9216 + 1024 },
  ["attn_bwd_kv_kernel<128>"] = { smem = 6 * 17408 + 1024 },
  ["attn_bwd_q_kernel<32>"] = { smem = 6 * 5120 }, ["attn_bwd_q_kernel<64>"] = { smem = 6 * 9216 },
  ["attn_bwd_q_kernel<128>"] = { smem = 6 * 17408 },
  ce_fwd_kernel = { threads = 512 },                     -- CE_THREADS
  ce_bwd_kernel = { threads = 512 },
  ce_finish_kernel = { threads = 1024 },
  stage_kernel = { threads = 256 },
  ew_general_kernel = { threads = 256 },                 -- EW_THREADS
  ew_fast_kernel = { threads = 256 },
  embedding_fwd_kernel = { threads = 128 },              -- EMB_THREADS
  embedding_keys_kernel = { threads = 256 },
  embedding_bwd_kernel = { threads = 128 },
  norm_bwd_kernel = { threads = 256, smem = 8 * 2 * 768 * 4 },   -- 8 warps, 2 f32 rows of C each
  norm_param_finish_kernel = { threads = 256 },
  adamw_mt_kernel = { threads = 256 },                   -- OPT_THREADS
  norm_mt_kernel = { threads = 256 },
  norm_total_kernel = { threads = 1024 },
  clip_coef_kernel = { threads = 1 },
  sgd_kernel = { threads = 256 },
  random_fill_kernel = { threads = 256 },                -- RNG_THREADS
  dropout_kernel = { threads = 256 },
  arange_kernel = { threads = 256 },
  reduce_rows_kernel = { threads = 256 },                -- RED_THREADS
  reduce_cols_kernel = { threads = 256 },
  reduce_finish_kernel = { threads = 256 },
  argmax_rows_kernel = { threads = 256 },
  argmax_cols_kernel = { threads = 256 },
}

-- Files whose kernels must not spill (issue 35): attention, the products (matmul, linear's epilogues), the optimizers.
M.GUARDED = { attention = true, matmul = true, linear = true, optim = true }

-- sm_90 as the occupancy calculator models it (CUDA's cuda_occupancy.h): registers are
-- allocated per warp in units of 256 within each of the 4 sub-partitions; every block also
-- takes 1 KiB of shared memory reserved by the system, and shared memory goes in 128-byte units.
M.H100 = {
  max_threads_per_block = 1024, max_warps = 64, max_blocks = 32,
  regs_per_sm = 65536, regs_per_block = 65536, reg_unit = 256, sub_partitions = 4,
  smem_per_sm = 228 * 1024, smem_per_block = 227 * 1024, smem_unit = 128, smem_reserved = 1024,
}

local function round_up(x, unit) return math.ceil(x / unit) * unit end

-- Resident blocks per SM of a kernel using `regs` registers per thread and `smem` bytes of
-- shared memory (static + dynamic) at `threads` per block; 0 when it cannot launch.
function M.blocks_per_sm(regs, smem, threads, gpu)
  gpu = gpu or M.H100
  if threads < 1 or threads > gpu.max_threads_per_block or smem > gpu.smem_per_block then return 0 end
  local warps = math.ceil(threads / 32)
  local by_warps = math.floor(gpu.max_warps / warps)
  local per_warp = round_up(math.max(regs, 1) * 32, gpu.reg_unit)
  if per_warp * warps > gpu.regs_per_block then return 0 end
  local warps_by_regs = math.floor(gpu.regs_per_sm / gpu.sub_partitions / per_warp) * gpu.sub_partitions
  local by_regs = math.floor(warps_by_regs / warps)
  local by_smem = math.floor(gpu.smem_per_sm / round_up(smem + gpu.smem_reserved, gpu.smem_unit))
  return math.min(gpu.max_blocks, by_warps, by_regs, by_smem)
end

-- Demangles a list of symbols with c++filt, in order.
local function demangle(symbols)
  if #symbols == 0 then return {} end
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "w"))
  f:write(table.concat(symbols, "\n"), "\n")
  f:close()
  local p = assert(io.popen("c++filt < " .. tmp))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  os.remove(tmp)
  return out
end

-- "void f<__nv_bfloat16, 8>(const T*, ...)" -> "f<__nv_bfloat16,8>", its base name "f".
local function short_name(demangled)
  local name = demangled:gsub("^void ", "")
  local depth, cut = 0, #name
  for i = 1, #name do
    local c = name:sub(i, i)
    if c == "<" then depth = depth + 1 elseif c == ">" then depth = depth - 1
    elseif c == "(" and depth == 0 then cut = i - 1; break end
  end
  name = name:sub(1, cut):gsub(" ", "")
  return name, name:match("^[%w_]+")
end

-- The kernels of one ptxas -v report (text): { symbol, regs, smem, spills } per entry function.
function M.parse_ptxas(text)
  local kernels, cur = {}, nil
  for line in text:gmatch("[^\n]+") do
    local sym = line:match("Compiling entry function '([^']+)'")
    if sym then cur = { symbol = sym, regs = 0, smem = 0, spills = 0 }; kernels[#kernels + 1] = cur end
    local st, ld = line:match("(%d+) bytes spill stores, (%d+) bytes spill loads")
    if cur and st and line:find("bytes stack frame") then cur.spills = cur.spills + tonumber(st) + tonumber(ld) end
    local regs = line:match("Used (%d+) registers")
    if cur and regs then
      cur.regs = tonumber(regs)
      cur.smem = tonumber(line:match("(%d+) bytes smem") or 0)
      cur = nil   -- a non-entry function's properties that follow belong to no kernel
    end
  end
  return kernels
end

-- __launch_bounds__(N) of each kernel of a .cu source, N resolved through its enums.
function M.launch_bounds(source)
  local consts = {}
  -- each NAME = EXPR of an enum, EXPR in numbers and the constants before it; one it cannot
  -- evaluate stays unknown (an error below if a bound uses it), never a partial reading
  for body in source:gmatch("enum%s*{([^}]*)}") do
    for entry in body:gmatch("[^,]+") do
      local name, expr = entry:match("^%s*([%a_][%w_]*)%s*=%s*(.-)%s*$")
      if name then
        local known = true
        local lua = expr:gsub("[%a_][%w_]*", function(id) known = known and consts[id] ~= nil; return tostring(consts[id]) end)
        local f = known and load("return " .. lua)
        local ok, v = pcall(f or error)
        consts[name] = ok and tonumber(v) or nil
      end
    end
  end
  local bounds = {}
  for expr, name in source:gmatch("__launch_bounds__%(([^,%)]+)[^%)]*%)%s*([%w_]+)%s*%(") do
    local lua = expr:gsub("[%a_][%w_]*", function(id) return tostring(consts[id] or error("gpu_report: " .. id .. " in __launch_bounds__ of " .. name .. " is not an enum constant")) end)
    bounds[name] = assert(load("return " .. lua))()
  end
  return bounds
end

local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The report of the given ptxas files: lines, and the failures (strings).
function M.report(paths, source_of)
  local lines, failures, used, checks = {}, {}, {}, 0
  for _, path in ipairs(paths) do
    local file = path:match("([^/]+)%.ptxas$")
    local kernels = M.parse_ptxas(assert(read(path), "gpu_report: cannot read " .. path))
    local bounds = M.launch_bounds(source_of(file) or "")
    local symbols = {}
    for i, k in ipairs(kernels) do symbols[i] = k.symbol end
    for i, name in ipairs(demangle(symbols)) do
      local k, full, base = kernels[i], short_name(name)
      if full:find("::") then goto continue end   -- a library's (cub's radix sort): its own launch bounds
      local entry = M.LAUNCH[full] or M.LAUNCH[base]
      if entry then used[M.LAUNCH[full] and full or base] = true end
      local threads = bounds[base] or (entry and entry.threads)
      local dsmem = entry and entry.smem or 0
      checks = checks + 1
      if not threads then
        failures[#failures + 1] = ("%s (%s.cu) has no launch bound and no LAUNCH entry in tools/gpu_report.lua"):format(full, file)
      else
        local b = M.blocks_per_sm(k.regs, k.smem + dsmem, threads)
        lines[#lines + 1] = ("kernel %s regs %d smem_static %d smem_dynamic %d spills %d blocks_per_sm %d"):format(
          full, k.regs, k.smem, dsmem, k.spills, b)
        if k.spills > 0 and M.GUARDED[file] then
          failures[#failures + 1] = ("%s (%s.cu) spills %d bytes"):format(full, file, k.spills)
        end
      end
      ::continue::
    end
  end
  for name in pairs(M.LAUNCH) do
    checks = checks + 1
    if not used[name] then failures[#failures + 1] = ("LAUNCH entry %s names no kernel of the build"):format(name) end
  end
  return lines, failures, checks
end

local function main(paths)
  if #paths == 0 then
    io.stderr:write("usage: luajit tools/gpu_report.lua BUILD/kernels/*.ptxas\n")
    return 2
  end
  local lines, failures, checks = M.report(paths, function(file) return read("kernels/" .. file .. ".cu") end)
  for _, l in ipairs(lines) do print(l) end
  for _, f in ipairs(failures) do print("FAIL " .. f) end
  print(("C gpu_report: %d passed, %d failed"):format(checks - #failures, #failures))
  return #failures == 0 and 0 or 1
end

if arg and arg[0] and arg[0]:match("gpu_report%.lua$") then os.exit(main(arg)) end
return M
