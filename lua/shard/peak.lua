-- shard.peak: what a device can do at best, the denominator of MFU.
--   peak.of(device, dtype) -> { flops = FLOP/s, source = "...", name = "..." } or nil
-- On a CUDA device the figures are the vendor's dense tensor-core peaks from the table below,
-- matched by the device's name. On the CPU nobody publishes a figure that this machine reaches,
-- so the peak is measured: the best of a few f32 GEMMs of a square large enough to run at the
-- BLAS's full rate, with the threads the run uses (measured once per process).
local ffi = require("ffi")
local rt = require("shard.ffi")

local M = {}

-- Dense (no sparsity) peaks of the SXM parts, FLOP/s; tf32 is what f32 matmuls use there.
-- HBM and NVLink are per GPU, bytes/s, for bounds on memory- and communication-bound work.
M.DEVICES = {
  { match = "H200", name = "H200 SXM", bf16 = 989e12, f16 = 989e12, f32 = 494e12, hbm = 4.8e12, nvlink = 450e9 },
  { match = "H100", name = "H100 SXM", bf16 = 989e12, f16 = 989e12, f32 = 494e12, hbm = 3.35e12, nvlink = 450e9 },
}

function M.device_row(name)
  for _, row in ipairs(M.DEVICES) do
    if name:find(row.match, 1, true) then return row end
  end
end

local function cuda_name(device)
  local index = tonumber(device:match("^cuda:(%d+)$")) or 0
  local info = ffi.new("sh_cuda_device_info")
  if rt.C.sh_cuda_device_info_get(index, info) ~= 0 then return nil end
  return ffi.string(info.name)
end

local cpu_measured
-- The CPU's f32 GEMM rate: best of `rounds` products of two n x n matrices. 20 rounds (about
-- 30 ms at 2 threads here): with 5 (8 ms), a burst of other load once halved the figure, and
-- `make run` printed an MFU of 1.32.
function M.measure_cpu(n, rounds)
  local timer, ops = require("shard.timer"), require("shard.ops")
  n, rounds = n or 512, rounds or 20
  local a = ops.randn({ n, n }, { device = "cpu" })
  local b = ops.randn({ n, n }, { device = "cpu" })
  local best = math.huge
  for _ = 0, rounds do            -- the first product warms up the BLAS's threads and caches
    local t0 = timer.now()
    local c = ops.matmul(a, b)
    local dt = timer.now() - t0
    c:free()
    best = math.min(best, dt)
  end
  a:free(); b:free()
  return 2 * n * n * n / best
end

function M.of(device, dtype)
  device = device or "cpu"
  if device == "cpu" then
    cpu_measured = cpu_measured or M.measure_cpu()
    return { flops = cpu_measured, name = "cpu", source = "measured f32 GEMM peak (512^3)" }
  end
  if not device:match("^cuda") then return nil end   -- the meta device (dry runs) computes nothing
  local name = cuda_name(device)
  local row = name and M.device_row(name)
  if not row then return nil end
  local key = (dtype == "bf16" or dtype == "f16") and dtype or "f32"
  return { flops = row[key], name = row.name, source = ("%s dense %s peak"):format(row.name, key) }
end

return M
