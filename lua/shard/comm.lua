-- shard.comm: process groups and collectives (runtime/dist/comm.h). Ranks and roots are 0-based,
-- as in MPI and torch.distributed. Reduce ops are "sum", "avg", "max", "min".
--
--   local comm = shard.comm
--   local world = comm.init()                 -- from mpirun / torchrun env / SLURM, else a world of one
--   world:all_reduce(t, "avg")                 -- in place
--   local full = world:all_gather(shard)       -- a new tensor of size * numel
--   local w = world:all_gather(full, shard, { async = true }); ...; w:wait()
--   local sub = world:split(color, key)        -- nil on ranks that pass a negative color
--   local node = world:split_node()            -- the ranks on this process's node
--   world:node(), world:nodes(), world:local_size(), world:node_name()
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local C, check = rt.C, rt.check

local M = {}

-- The codes of comm.h's enums.
local OPS = { sum = C.SH_RED_SUM, avg = C.SH_RED_AVG, max = C.SH_RED_MAX, min = C.SH_RED_MIN }

-- The collective kinds, read from the runtime (comm.h's sh_coll_kind and sh_comm_kind_name):
-- comm.kinds lists their names in code order, comm.KINDS maps a name to its code, and
-- comm.kind_name(code) is the name of a code found in the runtime's records (counters, trace
-- events, flight records), nil for one the runtime does not know. Tools take the names from
-- here, never from a list of their own.
local kinds, KINDS = {}, {}
for code = 0, C.SH_COLL_N - 1 do
  local name = ffi.string(C.sh_comm_kind_name(code))
  kinds[code + 1], KINDS[name] = name, code
end
M.kinds, M.KINDS = kinds, KINDS
function M.kind_name(code)
  code = tonumber(code)
  return code and kinds[code + 1]
end

local function op_id(op)
  op = op or "sum"
  local id = OPS[op]
  if not id then error("unknown reduce op '" .. tostring(op) .. "' (expected sum, avg, max or min)", 3) end
  return id
end

local function kind_id(kind)
  local id = KINDS[kind]
  if not id then
    error(("unknown collective '%s' (expected %s or %s)"):format(tostring(kind),
      table.concat(kinds, ", ", 1, #kinds - 1), kinds[#kinds]), 3)
  end
  return id
end

local function rd_id(dtype) return dtype and tensor.dtype_id(dtype) or -1 end

---------------------------------------------------------------------------------------------
-- work handles

local Work = {}
Work.__index = Work

local work_box = ffi.new("sh_comm_work*[1]")

local function new_work(fn, ...)
  work_box[0] = nil
  check(fn(work_box, ...), 3)
  return setmetatable({ p = ffi.gc(work_box[0], C.sh_comm_work_free) }, Work)
end

-- Waits for completion (or the group's timeout, raising an error naming op, group and rank).
function Work:wait()
  check(C.sh_comm_wait(self.p), 2)
  return self.result
end

function Work:test()
  local done = ffi.new("int[1]")
  check(C.sh_comm_test(self.p, done), 2)
  return done[0] ~= 0
end

function Work:free()
  if self.p ~= nil then C.sh_comm_work_free(ffi.gc(self.p, nil)); self.p = nil end
end

---------------------------------------------------------------------------------------------
-- groups

local Group = {}
Group.__index = Group
M.Group = Group

local function wrap_group(p) return setmetatable({ p = ffi.gc(p, C.sh_comm_destroy) }, Group) end

function Group:rank() return C.sh_comm_rank(self.p) end
function Group:size() return C.sh_comm_size(self.p) end
function Group:local_rank() return C.sh_comm_local_rank(self.p) end
-- The process's node: its index (0..nodes()-1), the job's node count, the ranks on it, the
-- host name, and whether every node runs as many ranks (runtime/dist/comm.h).
function Group:node() return C.sh_comm_node(self.p) end
function Group:nodes() return C.sh_comm_n_nodes(self.p) end
function Group:local_size() return C.sh_comm_local_size(self.p) end
function Group:node_name() return ffi.string(C.sh_comm_node_name(self.p)) end
function Group:nodes_uniform() return C.sh_comm_nodes_uniform(self.p) ~= 0 end
function Group:name() return ffi.string(C.sh_comm_name(self.p)) end
function Group:backend() return ffi.string(C.sh_comm_backend_name(self.p)) end
-- The backend of collectives on CUDA tensors ("nccl" when built with it).
function Group:device_backend() return ffi.string(C.sh_comm_device_backend_name(self.p)) end
function Group:set_name(name) check(C.sh_comm_set_name(self.p, name), 2); return self end
function Group:set_timeout(seconds) check(C.sh_comm_set_timeout(self.p, seconds), 2); return self end
-- false: this group's collectives stay out of shard.comm.count/bytes (its own counters still count)
function Group:set_counted(on) check(C.sh_comm_set_counted(self.p, on and 1 or 0), 2); return self end
function Group:timeout() return C.sh_comm_timeout(self.p) end
function Group:__tostring() return ("Group(%s, rank %d of %d, %s)"):format(self:name(), self:rank(), self:size(), self:backend()) end

-- Collective over self: ranks with the same color form a group ordered by key (then rank).
-- Returns nil where color < 0.
function Group:split(color, key, name)
  local box = ffi.new("sh_comm*[1]")
  check(C.sh_comm_split(box, self.p, color, key or self:rank()), 2)
  if box[0] == nil then return nil end
  local g = wrap_group(box[0])
  if name then g:set_name(name) end
  return g
end

-- Collective over self: the group of self's ranks on this process's node.
function Group:split_node(name)
  local box = ffi.new("sh_comm*[1]")
  check(C.sh_comm_split_node(box, self.p), 2)
  local g = wrap_group(box[0])
  if name then g:set_name(name) end
  return g
end

-- Runs fn(work_box, ...) blocking, or returns a Work when opts.async.
local function issue(opts, result, async_fn, sync_fn, ...)
  if opts and opts.async then
    local w = new_work(async_fn, ...)
    w.result = result
    return w
  end
  check(sync_fn(...), 3)
  return result
end

-- all_gather(out, in [, opts]) or all_gather(in [, opts]) -> a new 1-D tensor of size * numel.
function Group:all_gather(out, input, opts)
  if not tensor.is_tensor(input) then
    opts, input = input, out
    out = tensor.empty({ input:numel() * self:size() }, { dtype = input:dtype(), device = input:device() })
  end
  return issue(opts, out, C.sh_comm_all_gather_into_async, C.sh_comm_all_gather_into, self.p, out.p, input.p)
end

-- reduce_scatter(out, in, op [, opts]) or reduce_scatter(in, op [, opts]) -> a new tensor of
-- numel / size. opts.reduce_dtype runs the reduction as if in that dtype.
function Group:reduce_scatter(out, input, op, opts)
  if not tensor.is_tensor(input) then
    opts, op, input = op, input, out
    local n = input:numel()
    if n % self:size() ~= 0 then
      error(("reduce_scatter on %s: %s does not split into %d equal parts"):format(self:name(), input:describe(), self:size()), 2)
    end
    out = tensor.empty({ n / self:size() }, { dtype = input:dtype(), device = input:device() })
  end
  local rd = rd_id(opts and opts.reduce_dtype)
  if opts and opts.async then
    local w = new_work(C.sh_comm_reduce_scatter_async, self.p, out.p, input.p, op_id(op), rd)
    w.result = out
    return w
  end
  check(C.sh_comm_reduce_scatter(self.p, out.p, input.p, op_id(op), rd), 2)
  return out
end

function Group:all_reduce(t, op, opts)
  local rd = rd_id(opts and opts.reduce_dtype)
  if opts and opts.async then
    local w = new_work(C.sh_comm_all_reduce_async, self.p, t.p, op_id(op), rd)
    w.result = t
    return w
  end
  check(C.sh_comm_all_reduce(self.p, t.p, op_id(op), rd), 2)
  return t
end

function Group:broadcast(t, root, opts)
  return issue(opts, t, C.sh_comm_broadcast_async, C.sh_comm_broadcast, self.p, t.p, root or 0)
end

-- all_to_all(out, in [, opts]) or all_to_all(in [, opts]) -> a new tensor like in: block q of
-- this rank's input goes to rank q, whose output holds rank r's block at block r.
function Group:all_to_all(out, input, opts)
  if not tensor.is_tensor(input) then
    opts, input = input, out
    out = tensor.empty(input:shape(), { dtype = input:dtype(), device = input:device() })
  end
  return issue(opts, out, C.sh_comm_all_to_all_into_async, C.sh_comm_all_to_all_into, self.p, out.p, input.p)
end

function Group:barrier(opts)
  return issue(opts, nil, C.sh_comm_barrier_async, C.sh_comm_barrier, self.p)
end

-- Collectives of one kind issued on this group since the last reset, and their bytes.
function Group:count(kind) return tonumber(C.sh_comm_count(self.p, kind_id(kind))) end
function Group:bytes(kind) return tonumber(C.sh_comm_bytes(self.p, kind_id(kind))) end
function Group:counts()
  local t = {}
  for _, k in ipairs(kinds) do t[k] = self:count(k) end
  return t
end
function Group:reset_counts() C.sh_comm_reset_counts(self.p) end

---------------------------------------------------------------------------------------------
-- the process

local world

-- The world group, bootstrapped on first use.
function M.init()
  if world then return world end
  local box = ffi.new("sh_comm*[1]")
  check(C.sh_comm_init_world(box), 2)
  world = wrap_group(box[0])
  -- A launched rank's stdout is a pipe: line buffering keeps its progress lines flowing.
  if M.env().launcher ~= "none" then io.stdout:setvbuf("line") end
  return world
end
M.world = M.init

-- How this process was launched, without initialising anything.
local LAUNCHERS = { [C.SH_LAUNCH_NONE] = "none", [C.SH_LAUNCH_MPI] = "mpi", [C.SH_LAUNCH_TORCHRUN] = "torchrun",
                    [C.SH_LAUNCH_SLURM] = "slurm" }
function M.env()
  local e = ffi.new("sh_comm_env")
  check(C.sh_comm_read_env(e), 2)
  return { launcher = LAUNCHERS[e.launcher], rank = e.rank, world = e.size, size = e.size,
           local_rank = e.local_rank, local_size = e.local_size,
           node = e.node >= 0 and e.node or nil, nodes = e.n_nodes > 0 and e.n_nodes or nil }
end

local cuda_devices = require("shard.ffi").cuda_device_count

-- shard.init(): rank, world and device from the environment; initialises the world group.
-- The device is cuda:<local_rank mod #GPUs> when GPUs are present, else cpu; opts.device
-- forces one.
function M.info(opts)
  local g = M.init()
  local device = opts and opts.device
  if not device then
    local n = cuda_devices()
    device = n > 0 and ("cuda:" .. (g:local_rank() % n)) or "cpu"
  end
  return { rank = g:rank(), world = g:size(), local_rank = g:local_rank(), node = g:node(), nodes = g:nodes(),
           device = device, group = g }
end

-- Process-wide counters (every group together).
function M.count(kind) return tonumber(C.sh_comm_count(nil, kind_id(kind))) end
function M.bytes(kind) return tonumber(C.sh_comm_bytes(nil, kind_id(kind))) end
function M.counts()
  local t = {}
  for _, k in ipairs(kinds) do t[k] = M.count(k) end
  return t
end
function M.reset_counts() C.sh_comm_reset_counts(nil) end
-- Seconds this process has spent blocked waiting for collectives (exposed communication).
function M.wait_seconds() return C.sh_comm_wait_seconds() end

function M.set_timeout(seconds) return M.init():set_timeout(seconds) end

-- Convenience forms on the world group.
for _, name in ipairs { "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "barrier", "split" } do
  M[name] = function(...) local g = M.init(); return g[name](g, ...) end
end
function M.rank() return M.init():rank() end
function M.size() return M.init():size() end

return M
