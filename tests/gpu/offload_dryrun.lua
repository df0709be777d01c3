-- The dry run of CPU offload (issue 20) against the real offload it stands for, on the emulated
-- GPU at the world this runs in (tests/cuda_emu/run.sh: alone and as 2 ranks under mpirun).
-- Each rank trains the Shakespeare recipe (small) with --offload for 3 steps on its emulated
-- device under the dry run's probe, which reads comm.lua's counters and the device's and the
-- host's memory stats around the last step (the host's: the CPU's pool, where the offloaded
-- shards, grads and AdamW state are pinned); then it runs `shard estimate --dry-run --json
-- --offload` as the same rank of the same world in a child process and compares: every
-- collective's count and bytes exact, the sharded state on the device at its peak (param,
-- grad, optim) exact, the host's peak by tag (param, grad, optim: what offload pinned) exact,
-- the device peak within 5% once the emulated device's own blocks are taken out: what the
-- CUDA backend allocates for itself and the meta device never does (cuBLASLt's workspace,
-- tagged other; printed). Then the strategies: full_shard, shard_grad_op and (2 ranks)
-- hybrid_shard over shard groups of one; bf16 mixed precision under full_shard (the pinned
-- copy in the param dtype).
local dryrun = require("shard.tools.dryrun")
local cjson = require("cjson")
local comm = require("shard.comm")
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")

local RECIPE = "recipes/gpt_shakespeare_char.lua"
local world, rank = comm.size(), comm.rank()
local gpus = require("shard.ffi").cuda_device_count()
assert(gpus > 0, "offload_dryrun: no CUDA device")
local device = "cuda:" .. (comm.world():local_rank() % gpus)
require("shard.ffi").check(require("shard.ffi").C.sh_cuda_init(comm.world():local_rank() % gpus))   -- the probe reads its stats first
local home = os.getenv("SHARD_HOME") or "."
-- The dry runs take the binary running this script (bin/shard on a GPU, bin/shard-emu on the
-- emulator) unless SHARD_BIN names another.
local bin = os.getenv("SHARD_BIN") or require("shard.tools.launch").shard_exe()
if not bin:match("^/") then bin = home .. "/" .. bin end
local q = require("shard.ffi").shell_quote

local function check(ok, fmt, ...) support.check(ok, ("rank %d of %d: "):format(rank, world) .. fmt:format(...)) end

-- The real run of this rank under the probe: step 3's figures and the device's own blocks
-- (the "other" bytes it holds when no tensor of the run is alive).
local function real_run(args, out_dir)
  local probe = dryrun.probe(device, "cpu")
  local forced = { max_iters = 3, out_dir = out_dir }
  for k, v in pairs(dryrun.DRY_SETTINGS) do forced[k] = v end
  forced.device = "cuda"
  dryrun.run_recipe(RECIPE, args, forced, false)
  probe:remove()
  collectgarbage(); collectgarbage()
  return probe:step(), require("shard.memory").stats(device).by_tag.other
end

local function dry_run(args, out_dir, opts)
  local cmd = { q(bin), "estimate --dry-run --json", ("--world=%d --rank=%d"):format(world, rank), opts or "", RECIPE }
  for _, a in ipairs(args) do cmd[#cmd + 1] = q(a) end
  cmd[#cmd + 1] = "--out_dir=" .. out_dir .. " 2>&1"
  local p = io.popen(table.concat(cmd, " "))
  local out = p:read("*a")
  p:close()
  local line = out:match("dryrun (%b{})")
  check(line ~= nil, "the dry run printed no result:\n%s", out)
  return line and cjson.decode(line)
end

local function compare(case)
  local args = { "--data=/usr/share/common-licenses/GPL-3", "--n_layer=2", "--n_head=2", "--n_embd=32",
                 "--block_size=16", "--batch_size=12", "--offload", "--strategy=" .. case.strategy }
  for _, a in ipairs(case.args or {}) do args[#args + 1] = a end
  local name = case.strategy .. (case.args and (" " .. table.concat(case.args, " ")) or "")
  local out_dir = ("/tmp/shard_offload_dryrun_%s_%d"):format(os.getenv("PMIX_NAMESPACE") or "solo", world)
  local real_args, dry_args = { unpack(args) }, { unpack(args) }
  for _, a in ipairs(case.real or {}) do real_args[#real_args + 1] = a end
  for _, a in ipairs(case.dry or {}) do dry_args[#dry_args + 1] = a end
  local real, own = real_run(real_args, out_dir)
  comm.world():barrier()
  local dry = dry_run(dry_args, out_dir, case.dry_opts)
  if not dry then return end
  for _, kind in ipairs(dryrun.KINDS) do
    check(dry.count[kind] == real.count[kind] and dry.bytes[kind] == real.bytes[kind],
          "%s: %s: dry %d x %d bytes, real %d x %d bytes", name, kind, dry.count[kind], dry.bytes[kind],
          real.count[kind], real.bytes[kind])
  end
  for _, tag in ipairs { "param", "grad", "optim" } do
    check(dry.peak_by_tag[tag] == real.peak_by_tag[tag], "%s: device %s at the peak: dry %d bytes, real %d",
          name, tag, dry.peak_by_tag[tag], real.peak_by_tag[tag])
    check(dry.host_peak_by_tag[tag] == real.host_peak_by_tag[tag], "%s: host %s at its peak: dry %d bytes, real %d",
          name, tag, dry.host_peak_by_tag[tag], real.host_peak_by_tag[tag])
  end
  check(dry.host_peak_by_tag.optim > 0 and dry.host_peak_by_tag.grad > 0, "%s: the dry run put no optimizer state or grads on the host", name)
  check(dry.peak_by_tag.optim == 0, "%s: the dry run kept %d bytes of optimizer state on the device", name, dry.peak_by_tag.optim)
  local real_peak = real.peak - own
  local off = math.abs(dry.peak - real_peak) / real_peak
  check(off <= 0.05, "%s: device peak: dry %d bytes, real %d less the device's own %d = %d (%.1f%% apart)",
        name, dry.peak, real.peak, own, real_peak, 100 * off)
  print(("%s, rank %d of %d: device peak dry %d, real %d (%d of it the emulated device's own: %.4f%% apart without it); " ..
         "host dry param %d grad %d optim %d, real %d %d %d"):format(name, rank, world, dry.peak, real.peak, own, 100 * off,
         dry.host_peak_by_tag.param, dry.host_peak_by_tag.grad, dry.host_peak_by_tag.optim,
         real.host_peak_by_tag.param, real.host_peak_by_tag.grad, real.host_peak_by_tag.optim))
end

local cases = { { strategy = "full_shard" }, { strategy = "shard_grad_op" }, { strategy = "full_shard", args = { "--dtype=bf16" } } }
-- hybrid: shard groups of one rank, replicated across the world (the all-reduce runs before the
-- copy to the host); the dry run knows its groups from its node layout, one rank per node
if world > 1 then
  cases[#cases + 1] = { strategy = "hybrid_shard", real = { "--hybrid_group=1" }, dry = { "--hybrid_group=node" },
                        dry_opts = "--local_size=1" }
end
for _, case in ipairs(cases) do compare(case) end
support.finish(("offload_dryrun (world %d, %s)"):format(world, device))
