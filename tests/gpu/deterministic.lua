-- Deterministic mode on CUDA (issue 37): tests/fixtures/deterministic_run.lua on the GPU at
-- world 1, 2 and 3 (mpirun; NCCL, on the emulator its stand-in, whose all_to_all is a group
-- of ncclSend/ncclRecv) must print the same losses and params_sha256 in every case, bit for
-- bit, after checking the device's all_to_all against its definition. The cases: full_shard, no_shard, offload and a grad_accum split, SHARD_DETERM_STEPS
-- steps (2 unless set: the second loss and the final parameters follow the reductions).
-- Starts the ranks itself with the binary running it (bin/shard-emu under
-- tests/cuda_emu/run.sh, bin/shard on a GPU). On real GPUs NCCL takes one rank per device, so
-- the worlds stop at the device count (one GPU: world 1 alone, the cases compared).
local ffi = require("ffi")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")

ffi.cdef [[
long readlink(const char *path, char *buf, size_t size);
long shard_emu_malloc_count(void);
]]
local emulated = pcall(function() return ffi.C.shard_emu_malloc_count end)
local worlds = emulated and 3 or math.min(3, require("shard.ffi").cuda_device_count())
local buf = ffi.new("char[4096]")
local n = ffi.C.readlink("/proc/self/exe", buf, 4096)
assert(n > 0, "deterministic.lua: cannot read /proc/self/exe")
local bin = ffi.string(buf, n)

local MPIRUN = "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
local CASES = "full_shard,no_shard,full_shard_offload,full_shard_accum2"
local steps = os.getenv("SHARD_DETERM_STEPS") or "2"

local function run(np)
  local cmd = ("SHARD_DETERM_DEVICE=cuda SHARD_DETERM_CASES=%s SHARD_DETERM_STEPS=%s OMP_NUM_THREADS=1 %s -np %d " ..
               "-x SHARD_DETERM_DEVICE -x SHARD_DETERM_CASES -x SHARD_DETERM_STEPS -x OMP_NUM_THREADS '%s' run " ..
               "tests/fixtures/deterministic_run.lua 2>&1"):format(CASES, steps, MPIRUN, np, bin)
  local p = io.popen(cmd)
  local out = p:read("*a")
  local ok = p:close()
  local cases, count = {}, 0
  for name, rest in out:gmatch("case (%S+) (losses [^\n]*)") do cases[name] = rest; count = count + 1 end
  support.check(ok and count == 4, ("world %d ran %d of 4 cases%s"):format(np, count, ok and "" or ", and failed:\n" .. out))
  local wrong = out:match("all_to_all: (%d+) wrong elements")
  support.check(wrong == "0", ("world %d: the device's all_to_all: %s wrong elements"):format(np, tostring(wrong)))
  return cases
end

local ref = run(1)
for np = 2, worlds do
  local got = run(np)
  for name, line in pairs(ref) do
    support.check(got[name] == line, ("case %s at world %d differs from world 1:\n  1: %s\n  %d: %s"):format(
      name, np, line, np, tostring(got[name])))
  end
end
-- every case trains the same model from the same batches: one digest
local digest
for _, line in pairs(ref) do
  local d = line:match("sha256 (%x+)")
  digest = digest or d
  support.check(d == digest, "the cases' digests differ at world 1: " .. tostring(d) .. " and " .. tostring(digest))
end
support.finish("gpu/deterministic.lua")
