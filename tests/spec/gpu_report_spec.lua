-- tools/gpu_report.lua (make gpu-report, issue 35 item 6): the occupancy arithmetic against
-- cases worked by hand from the sm_90 limits, the ptxas report's parsing, and the checks that
-- fail the report (a spill in a guarded file, a kernel without a launch size, a stale entry).
local report = dofile("tools/gpu_report.lua")

describe("gpu_report", function()
  it("computes blocks per SM on an H100 as the occupancy calculator does", function()
    -- { regs, smem (static + dynamic), threads, blocks }, each worked by hand:
    local cases = {
      { 32, 0, 256, 8 },        -- 8 warps: 64 warps per SM allow 8 blocks; regs 1 KiB/warp allow 64 warps
      { 128, 0, 256, 2 },       -- 4096 regs/warp: 4 warps per sub-partition, 16 per SM
      { 96, 0, 32, 20 },        -- 3072 regs/warp: 5 per sub-partition = 20 (65536 / 3072 = 21 without sub-partitions)
      { 40, 48 * 1024, 128, 4 },-- 49152 + 1 KiB reserved = 50176 B: 233472 / 50176 = 4
      { 64, 0, 1024, 1 },       -- 32 warps of 2048 regs: the whole register file's half, 64 warps by count: 1 by regs
      { 65, 0, 1024, 0 },       -- 2304 regs/warp x 32 warps > 65536: cannot launch
      { 16, 0, 64, 32 },        -- the 32-block cap
      { 103, 46080, 128, 4 },   -- attention forward at D 64: 3328 regs/warp, 4 per sub-partition; smem 47104 B
      { 32, 100 * 1024, 128, 2 },  -- 103424 B per block: 2
      { 32, 227 * 1024 + 1, 128, 0 },  -- past the 227 KiB a block may have
      { 32, 0, 1025, 0 },       -- past 1024 threads
      { 255, 0, 32, 8 },        -- 8192 regs/warp (255 x 32 = 8160 rounded up): 2 per sub-partition
    }
    for _, c in ipairs(cases) do
      assert.equal(c[4], report.blocks_per_sm(c[1], c[2], c[3]), ("regs %d smem %d threads %d"):format(c[1], c[2], c[3]))
    end
  end)

  it("reads entry functions from ptxas -v, not the device functions between them", function()
    local text = table.concat({
      "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'",
      "ptxas info    : Function properties for _Z3fooPf",
      "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads",
      "ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem, 360 bytes cmem[0]",
      "ptxas info    : Function properties for _Z6helperv",
      "    16 bytes stack frame, 100 bytes spill stores, 100 bytes spill loads",
      "ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'",
      "ptxas info    : Function properties for _Z3barv",
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
      "ptxas info    : Used 12 registers, used 0 barriers, 352 bytes cmem[0]",
    }, "\n")
    local k = report.parse_ptxas(text)
    assert.equal(2, #k)
    assert.same({ symbol = "_Z3fooPf", regs = 40, smem = 512, spills = 12 }, k[1])
    assert.same({ symbol = "_Z3barv", regs = 12, smem = 0, spills = 0 }, k[2])
  end)

  it("takes a block size from __launch_bounds__ through the file's enums", function()
    local src = "enum { LN_WARPS = 8, X = 2 };\n" ..
      "__global__ void __launch_bounds__(LN_WARPS * 32, 3) norm_fwd_kernel(const T *x) {}\n" ..
      "__global__ void __launch_bounds__(128) other_kernel(int n) {}\n"
    assert.same({ norm_fwd_kernel = 256, other_kernel = 128 }, report.launch_bounds(src))
  end)

  -- attention's F_THREADS = 32 * F_WARPS once read as 32: its blocks per SM came out 3 for 2
  it("evaluates an enum defined by an expression of earlier ones, and refuses one it cannot", function()
    local src = "enum { FT = 64, F_WARPS = 4, F_THREADS = 32 * F_WARPS, AUTO, ODD = sizeof(int) };\n" ..
      "__global__ void __launch_bounds__(F_THREADS) fwd_kernel(int n) {}\n"
    assert.same({ fwd_kernel = 128 }, report.launch_bounds(src))
    local bad = "enum { ODD = sizeof(int) };\n__global__ void __launch_bounds__(ODD) k_kernel(int n) {}\n"
    assert.has_error(function() report.launch_bounds(bad) end,
      "gpu_report: ODD in __launch_bounds__ of k_kernel is not an enum constant")
  end)

  it("fails on a spill in a guarded file, a kernel with no launch size and an entry naming no kernel", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    local function write(name, text)
      local f = assert(io.open(dir .. "/" .. name, "w")); f:write(text); f:close()
    end
    local spill = "ptxas info    : Compiling entry function '_Z15adamw_mt_kernelv' for 'sm_90a'\n" ..
      "ptxas info    : Function properties for _Z15adamw_mt_kernelv\n" ..
      "    0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n" ..
      "ptxas info    : Used 255 registers, used 0 barriers, 352 bytes cmem[0]\n"
    write("optim.ptxas", spill)
    write("random.ptxas", (spill:gsub("15adamw_mt_kernel", "14unlisted_kernl")))
    local saved = report.LAUNCH
    report.LAUNCH = { adamw_mt_kernel = { threads = 256 }, gone_kernel = { threads = 64 } }
    local lines, failures, checks = report.report({ dir .. "/optim.ptxas", dir .. "/random.ptxas" }, function() return "" end)
    report.LAUNCH = saved
    os.execute("rm -rf " .. dir)
    assert.same({ "kernel adamw_mt_kernel regs 255 smem_static 0 smem_dynamic 0 spills 8 blocks_per_sm 1" }, lines)
    assert.equal(4, checks)
    table.sort(failures)
    assert.same({
      "LAUNCH entry gone_kernel names no kernel of the build",
      "adamw_mt_kernel (optim.cu) spills 8 bytes",
      "unlisted_kernl (random.cu) has no launch bound and no LAUNCH entry in tools/gpu_report.lua",
    }, failures)
  end)
end)
