-- FSDP over NCCL with the ranks started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
-- MASTER_ADDR, MASTER_PORT; no MPI) while MASTER_PORT is held, as torchrun's own store holds
-- it: the NCCL id must travel some other way. full_shard at the world the environment gives
-- must follow one process training the whole global batch on the same device (f32, 1e-5).
-- tests/cuda_emu/run.sh (and tests/run_gpu.sh) start the ranks; with SHARD_HOLD_PORT=1 this
-- script instead holds MASTER_PORT (listening, as a store would) until killed.
local ffi = require("ffi")

if os.getenv("SHARD_HOLD_PORT") == "1" then
  ffi.cdef [[
  struct hold_sockaddr_in { uint16_t family; uint16_t port; uint32_t addr; char zero[8]; };
  int socket(int domain, int type, int protocol);
  int bind(int fd, const struct hold_sockaddr_in *addr, uint32_t len);
  int listen(int fd, int backlog);
  unsigned int sleep(unsigned int seconds);
  ]]
  local port = assert(tonumber(os.getenv("MASTER_PORT")), "MASTER_PORT")
  local fd = ffi.C.socket(2, 1, 0)   -- AF_INET, SOCK_STREAM
  local sa = ffi.new("struct hold_sockaddr_in", { family = 2, port = bit.bor(bit.rshift(port, 8), bit.lshift(bit.band(port, 255), 8)), addr = 0 })
  assert(fd >= 0 and ffi.C.bind(fd, sa, ffi.sizeof(sa)) == 0 and ffi.C.listen(fd, 8) == 0, "cannot hold port " .. port)
  print("holding port " .. port)
  io.stdout:flush()
  ffi.C.sleep(600)
  os.exit(0)
end

local shard = require("shard")
local nn, optim = shard.nn, shard.optim
local support = dofile((debug.getinfo(1, "S").source:match("^@(.*[/\\])") or "") .. "support.lua")
local env = shard.init{ device = "cuda" }
local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 16, block_size = 8, bias = false, dropout = 0 }
local B_LOCAL = 2
local function build() shard.manual_seed(3); return nn.GPT(CFG) end

local plain = build()
local popt = optim.AdamW(plain, { lr = 1e-3 })
local model = shard.fsdp.wrap(build, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
local opt = optim.AdamW(model, { lr = 1e-3 })
for step = 1, 3 do
  shard.manual_seed(100 + step)
  local u = shard.rand({ B_LOCAL * env.world, CFG.block_size })
  local s = u * CFG.vocab_size
  local x = s:to("i64")
  local mine = x:narrow(1, env.rank * B_LOCAL + 1, B_LOCAL):contiguous()
  local a = plain(x, x); a:backward(); popt:step(); popt:zero_grad(true)
  local b = model(mine, mine); b:backward(); opt:step(); opt:zero_grad(true)
  -- the global loss is the mean of the ranks' means (equal batches): one all-reduce on CUDA
  local g = b:detach():clone()
  env.group:all_reduce(g, "avg")
  local want, got = a:item(), g:item()
  support.check(math.abs(want - got) <= 1e-5 * math.abs(want),
                ("step %d: fsdp %.7f vs one process %.7f (rank %d of %d)"):format(step, got, want, env.rank, env.world))
end
support.finish(("torchrun_fsdp (rank %d of %d, %s)"):format(env.rank, env.world, env.group:backend()))
