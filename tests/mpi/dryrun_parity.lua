-- A dry run against the real run it stands for (issue 19, item 7), at the world size mpirun
-- gives. Each rank trains the Shakespeare recipe (small; at world 1 to 4 full_shard,
-- shard_grad_op, full_shard (uneven shards), hybrid_shard, or the strategy given after this
-- script: `shard launch --nproc 2 tests/mpi/dryrun_parity.lua --strategy=no_shard`) for 3
-- steps on the CPU under the dry run's probe, which reads comm.lua's counters and
-- shard.memory.stats() around the last step; then it runs `shard estimate --dry-run --json`
-- as the same rank of the same world in a child process and compares: every collective
-- kind's count and bytes exact, the sharded state (param, grad, optim) at the peak exact,
-- the peak within 5%.
local dryrun = require("shard.tools.dryrun")
local cjson = require("cjson")
local comm = require("shard.comm")

local RECIPE = "recipes/gpt_shakespeare_char.lua"
local world, rank = comm.size(), comm.rank()
local STRATEGY = { "full_shard", "shard_grad_op", "full_shard", "hybrid_shard" }
local args = { "--data=/usr/share/common-licenses/GPL-3", "--n_layer=2", "--n_head=2", "--n_embd=32",
               "--block_size=16", "--batch_size=12", "--strategy=" .. (STRATEGY[world] or "full_shard") }
for i = 1, #arg do args[#args + 1] = arg[i] end   -- later settings win
local strategy
for _, a in ipairs(args) do strategy = a:match("^%-%-strategy=(.*)$") or strategy end
local home = os.getenv("SHARD_HOME") or "."
local bin = os.getenv("SHARD_BIN") or (home .. "/bin/shard")
if not bin:match("^/") then bin = home .. "/" .. bin end

-- the real run
local probe = dryrun.probe("cpu")
local forced = { max_iters = 3, out_dir = ("/tmp/shard_dryrun_parity_real_%d"):format(world) }
for k, v in pairs(dryrun.DRY_SETTINGS) do forced[k] = v end
forced.device = "cpu"
dryrun.run_recipe(RECIPE, args, forced, false)
probe:remove()
local real = probe:step()

-- the dry run of this rank
local q = require("shard.ffi").shell_quote
local cmd = { q(bin), "estimate --dry-run --json", ("--world=%d --rank=%d"):format(world, rank), RECIPE }
for _, a in ipairs(args) do cmd[#cmd + 1] = q(a) end
-- the real run's directory: a dry rank other than 0 reads the data rank 0 prepared there
cmd[#cmd + 1] = "--out_dir=" .. forced.out_dir .. " 2>&1"
local p = io.popen(table.concat(cmd, " "))
local out = p:read("*a")
p:close()
local line = out:match("dryrun (%b{})")
if not line then error(("rank %d of %d: the dry run printed no result:\n%s"):format(rank, world, out), 0) end
local dry = cjson.decode(line)

local function fail(fmt, ...)
  error(("dry run vs real run, rank %d of %d, %s: "):format(rank, world, strategy) .. fmt:format(...), 0)
end
for _, kind in ipairs(dryrun.KINDS) do
  if dry.count[kind] ~= real.count[kind] or dry.bytes[kind] ~= real.bytes[kind] then
    fail("%s: dry %d x %d bytes, real %d x %d bytes", kind, dry.count[kind], dry.bytes[kind], real.count[kind], real.bytes[kind])
  end
end
for _, tag in ipairs { "param", "grad", "optim" } do
  if dry.peak_by_tag[tag] ~= real.peak_by_tag[tag] then
    fail("%s at the peak: dry %d bytes, real %d", tag, dry.peak_by_tag[tag], real.peak_by_tag[tag])
  end
end
local off = math.abs(dry.peak - real.peak) / real.peak
if off > 0.05 then fail("peak: dry %d bytes, real %d (%.1f%% apart)", dry.peak, real.peak, 100 * off) end
print(("%s, rank %d of %d: peak dry %d, real %d bytes (%.4f%% apart); %d bytes of collectives per step, equal"):format(
  strategy, rank, world, dry.peak, real.peak, 100 * off,
  real.bytes.all_gather + real.bytes.reduce_scatter + real.bytes.all_reduce + real.bytes.broadcast))
