-- Loading pretrained weights without a full copy per rank (issue 19, item 6). Rank 0 writes a
-- Hugging Face GPT-2 directory of a model of FULL bytes (f32); then every rank's allocator is
-- limited to its shard plus room for the largest single tensor (a Conv1D weight is read whole
-- to transpose it) and a margin: well under the whole model from world 2 on. Under that limit
-- every rank loads the directory into a full_shard model with from_pretrained, saves a sharded
-- checkpoint, and loads it into a fresh model; both must equal the file's values. At world 1
-- the limit (half the model) must make the same load fail with an out-of-memory error that
-- says so: the limit bites. (The limit is the allocator's, --memory_limit's: it counts every
-- tensor a rank holds, not the interpreter's own memory.)
local shard = require("shard")
local env = shard.init()
local nn, fsdp, memory = shard.nn, shard.fsdp, shard.memory
local rank, world = env.rank, env.world
local S = require("shard.io.safetensors")
local DIR = (os.getenv("SHARD_TEST_TMP") or "/tmp") .. "/shard_load_limit_" .. world
local CFG = { n_layer = 6, n_head = 4, n_embd = 192, vocab_size = 512, block_size = 64, bias = true }

local function fail(fmt, ...) error(("rank %d world %d: " .. fmt):format(rank, world, ...), 0) end

if rank == 0 then os.execute("rm -rf " .. require("shard.ffi").shell_quote(DIR)) end   -- a rerun starts clean
env.barrier()
shard.manual_seed(5)
shard.export_hf(nn.GPT(CFG), DIR)          -- collective: rank 0 writes
collectgarbage(); collectgarbage()         -- the model is gone before the limit is set

local file = S.open(DIR .. "/model.safetensors")
local full, largest = 0, 0
for _, name in ipairs(file:names()) do
  local info = file:info(name)
  local bytes = 4
  for _, d in ipairs(info.shape) do bytes = bytes * d end
  full, largest = full + bytes, math.max(largest, bytes)
end

-- each rank's slice of every parameter equals the file's elements (Conv1D weights are stored
-- transposed in the file: element (o, i) of the model's [out, in] is the file's (i, o))
local hf = require("shard.io.hf")
local function check_against_file(model, what)
  for _, e in ipairs(model:optim_groups()) do
    local fname = e.name
    local mine = e.tensor:tolist_flat()
    local info = file:info(fname) or fail("%s: %s (as %s) is not in the file", what, e.name, fname)
    local want = shard.empty(info.shape, { dtype = info.dtype })
    file:read(fname, want, 0, want:numel())
    local flat = want:tolist_flat()
    local cols = info.shape[2]
    for k = 1, #mine do
      local at = e.start + k - 1                     -- 0-based in the model's flattened parameter
      local r
      if hf.is_conv1d(e.name) then
        local rows = info.shape[1]                   -- the model's [out, in] is [cols, rows]
        local o, i = math.floor(at / rows), at % rows
        r = flat[i * cols + o + 1]
      else
        r = flat[at + 1]
      end
      if mine[k] ~= r then fail("%s: %s[%d] is %.9g, the file's %.9g", what, e.name, at, mine[k], r) end
    end
    want:free(); e.tensor:free()
  end
end

local limit = world == 1 and math.floor(full / 2) or math.floor(full / world + 3 * largest + 2 ^ 20)
if world > 1 and limit >= full then fail("the limit %d is not under the model's %d bytes", limit, full) end
memory.set_limit(limit)
local policy = fsdp.policy.transformer{ nn.Block }

if world == 1 then
  local ok, err = pcall(nn.GPT.from_pretrained, DIR)
  if ok then fail("a whole copy of %d bytes loaded under a limit of %d", full, limit) end
  if not tostring(err):lower():find("out of memory") then fail("expected an out-of-memory error, got: %s", tostring(err)) end
  print(("world 1: a whole copy (%d bytes) under a limit of %d fails: %s"):format(full, limit, tostring(err):match("[^\n]*")))
else
  memory.reset_peak()
  local model = nn.GPT.from_pretrained(DIR, { fsdp = { strategy = "full_shard", policy = policy } })
  local peak = memory.stats().peak
  check_against_file(model, "from_pretrained")
  shard.checkpoint.save(DIR .. "/ckpt", { model = model, step = 1 })
  model = nil
  collectgarbage(); collectgarbage()
  -- the same budget again on top of whatever the first model still holds until collected
  local held = memory.stats().allocated
  memory.set_limit(held + limit)
  memory.reset_peak()
  local again = fsdp.wrap(function() return nn.GPT(CFG) end, { strategy = "full_shard", policy = policy })
  shard.checkpoint.load(DIR .. "/ckpt", { model = again })
  local ckpt_peak = memory.stats().peak - held
  memory.set_limit(0)
  check_against_file(again, "checkpoint")
  if rank == 0 then
    print(("world %d: model %d bytes, limit %d per rank; from_pretrained peak %d, checkpoint load peak %d")
      :format(world, full, limit, peak, ckpt_peak))
  end
end
file:close()
env.barrier()
