-- The cost of checkpoint checksums: CRC32C throughput per CPU kernel set, and what it adds to saves and loads.
--   shard bench checksum [--mib=256 --n_layer=6 --n_embd=384 --reps=7 --dir=/tmp/checksum_bench]
-- CRC32C (runtime/io/checksum.h) over a --mib buffer in each kernel set this CPU runs (generic is
-- the portable loop, the others the crc32 instruction), beside a copy of the same buffer (a
-- read and a write: the memory speed the checksum is measured against). Then a GPT with its
-- AdamW state: shard.checkpoint.save (synchronous: write + fsync), the CRC32C of everything it
-- writes, and checkpoint.load and shard.load with and without verification (the files in the
-- page cache); the fastest of --reps runs (the verified and unverified loads alternate), so a
-- machine shared with other jobs still gives the cost itself; world 1.
local shard = require("shard")
local cfg = shard.config({ mib = 256, n_layer = 6, n_head = 6, n_embd = 384, block_size = 64, vocab_size = 65, reps = 7,
                           dir = "/tmp/checksum_bench" }, { mib = { min = 1 }, reps = { min = 1 } })
local ffi = require("ffi")
local S = require("shard.io.safetensors")
local ck = shard.checkpoint
local timer = require("shard.timer")
local C = shard.C

-- The fastest of --reps runs of each function, run in turn.
local function fastest(...)
  local fns, best = { ... }, {}
  for _ = 1, cfg.reps do
    for k, fn in ipairs(fns) do
      local t0 = timer.now()
      fn()
      best[k] = math.min(best[k] or math.huge, timer.now() - t0)
    end
  end
  return unpack(best)
end

-- throughput
local n = cfg.mib * 2 ^ 20
local buf = shard.empty({ n / 4 })
local dst = shard.empty({ n / 4 })
local p = ffi.cast("uint32_t*", buf:data_ptr())
for i = 0, n / 4 - 1 do p[i] = i * 2654435761 % 2 ^ 32 end
local best = C.sh_cpu_isa_best()
print(("%d MiB buffer, %s"):format(cfg.mib, ffi.string(C.sh_cpu_model())))
print(("copy (read + write)      %8.0f MB/s"):format(n / fastest(function() dst:copy_(buf) end) / 1e6))
for isa = best, 0, -1 do
  assert(C.sh_cpu_set_isa(isa) == 0)
  local t = fastest(function() C.sh_crc32c(0, buf:data_ptr(), n) end)
  print(("crc32c %-17s %8.0f MB/s"):format(ffi.string(C.sh_cpu_isa_name(isa)), n / t / 1e6))
end
assert(C.sh_cpu_set_isa(best) == 0)
buf:free(); dst:free()

-- save and load
local function build(seed)
  shard.manual_seed(seed)
  return shard.nn.GPT{ n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd, block_size = cfg.block_size,
                       vocab_size = cfg.vocab_size, dropout = 0, bias = false }
end
local model = build(1)
local opt = shard.optim.AdamW(model, { lr = 1e-3 })
local x = shard.ones({ 2, cfg.block_size }, { dtype = "i64" })
local loss = model(x, x)
loss:backward(); opt:step(); opt:zero_grad(true); loss:free()   -- the moments exist

C.sh_ckpt_remove_tree(cfg.dir)
local step = 0
local t_save = fastest(function() step = step + 1; ck.save(cfg.dir, { model = model, optim = opt, step = step, keep = 1 }) end)
local written = {}   -- every tensor a save writes, as it hands them to the writer
for _, np in ipairs(model:named_parameters()) do written[#written + 1] = np.tensor end
for _, e in ipairs(opt:state_dict(function() return "" end).entries) do
  for _, t in pairs(e.state) do written[#written + 1] = t end
end
local bytes = 0
for _, t in ipairs(written) do bytes = bytes + t:numel() * 4 end
local t_crc = fastest(function() for _, t in ipairs(written) do S.crc32c(t) end end)
local other = build(2)
local other_opt = shard.optim.AdamW(other, { lr = 1e-3 })
local t_load, t_load_nv = fastest(function() ck.load(cfg.dir, { model = other, optim = other_opt }) end,
                                  function() ck.load(cfg.dir, { model = other, optim = other_opt, verify = false }) end)

local path = cfg.dir .. "/model.safetensors"
shard.save(model, path)
local t_full, t_full_nv = fastest(function() shard.load(other, path) end, function() shard.load(other, path, { verify = false }) end)
C.sh_ckpt_remove_tree(cfg.dir)

print(("GPT %d x %d, %.1fM params, checkpoint %.1f MB (parameters + AdamW moments), fastest of %d"):format(
  cfg.n_layer, cfg.n_embd, model:num_params() / 1e6, bytes / 1e6, cfg.reps))
print(("checkpoint.save           %8.1f ms, of which CRC32C %.1f ms (%.1f%%)"):format(t_save * 1e3, t_crc * 1e3, 100 * t_crc / t_save))
print(("checkpoint.load  verified %8.1f ms, unverified %.1f ms (%+.1f%%)"):format(t_load * 1e3, t_load_nv * 1e3,
  100 * (t_load - t_load_nv) / t_load_nv))
print(("shard.load       verified %8.1f ms, unverified %.1f ms (%+.1f%%), %.1f MB (parameters)"):format(t_full * 1e3,
  t_full_nv * 1e3, 100 * (t_full - t_full_nv) / t_full_nv, model:num_params() * 4 / 1e6))
