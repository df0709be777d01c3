-- shard.cuda_graph: a training step captured once as a CUDA graph and replayed every step
-- after, so the host issues one launch per step instead of one per kernel.
--   local step = shard.cuda_graph.step(function(x, y)
--     local loss = model(x, y); loss:backward(); opt:step(); opt:zero_grad(true); return loss
--   end, { optimizer = opt, model = model })
--   for it = 1, n do local loss = step(x, y); print(loss:item()) end
-- The first `warmup` calls (default 2) run the function eagerly, so that the caching allocator
-- holds every block the step needs and the optimizer has its state; the next call copies the
-- batch into the graph's own input tensors, captures the function on them (the compute
-- stream, and FSDP's collective streams as they join it through events), and launches the
-- graph, which runs that step; every later call copies the batch in and launches again. The
-- loss returned is the graph's own output tensor, rewritten by each launch: read it (loss:item())
-- after the call, not inside the function.
-- Handled: the optimizer's lr (set it before each call, as a schedule does: each launch runs
-- with the lr of its step) and step count (AdamW's bias correction): AdamW and SGD read them
-- from a buffer of the graph the host fills before each launch (kernels/optim.cu), so a
-- replayed step gives the bits of the eager one; clipping (its coefficient stays on the
-- device), activation checkpointing, FSDP's collectives, memory (blocks of the step stay the
-- graph's: runtime/core/cuda.h).
-- Refused by name: a host read or a host batch inside the function (loss:item(), x:to("cuda")),
-- a batch of another shape or dtype, FSDP CPU offload of the model given (its copies run on a
-- stream outside the capture), a CPU device, fp16's grad scaler (it skips a step by reading
-- the host: amp.GradScaler asks M.capturing()).
-- Replay speed is unmeasured on a real GPU: the emulator (tests/cuda_emu) checks correctness
-- and counts launches, not time.
local ffi = require("ffi")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

local M = {}

-- A captured graph: launch() replays it, free() releases it (also when collected).
local Graph = {}
Graph.__index = Graph

function Graph:launch() check(C.sh_cuda_graph_launch(self.p), 2) end
-- The lr of the step the next launches run (cuda.h's sh_cuda_graph_set_lr).
function Graph:set_lr(lr) check(C.sh_cuda_graph_set_lr(self.p, lr), 2) end
function Graph:launches() return tonumber(C.sh_cuda_graph_launches(self.p)) end
function Graph:free()
  if self.p ~= nil then C.sh_cuda_graph_destroy(ffi.gc(self.p, nil)); self.p = nil end
end

local function cuda_index(device, what)
  local index = type(device) == "string" and tonumber(device:match("^cuda:(%d+)$") or (device == "cuda" and "0"))
  if not index then
    error(("%s: a CUDA graph needs a CUDA device (cuda or cuda:N), got %s"):format(what, tostring(device)), 3)
  end
  if rt.cuda_device_count() == 0 then error(what .. ": no CUDA device (built without CUDA, or no GPU)", 3) end
  return index
end

local capturing = false
-- True while M.capture runs its function: what must not be captured asks, to refuse by name.
function M.capturing() return capturing end

-- Captures what fn() queues on `device` (cuda:N) as a graph; fn's results are returned after
-- the graph. Nothing fn queues runs until the graph is launched.
function M.capture(device, fn)
  local index = cuda_index(device, "cuda_graph.capture")
  check(C.sh_cuda_graph_begin(index), 2)
  capturing = true
  local ok, a, b, c = pcall(fn)
  capturing = false
  local box = ffi.new("sh_cuda_graph*[1]")
  local rc = C.sh_cuda_graph_end(index, box)
  if not ok then
    if rc == 0 then C.sh_cuda_graph_destroy(box[0]) end
    error(a, 0)
  end
  check(rc, 2)
  return setmetatable({ p = ffi.gc(box[0], C.sh_cuda_graph_destroy), device = device }, Graph), a, b, c
end

local function shape_text(t) return ("%s [%s]"):format(t:dtype(), table.concat(t:shape(), ", ")) end

local function same_layout(a, b) return shape_text(a) == shape_text(b) end

-- The step helper (above). opts: warmup (eager calls before the capture, default 2, >= 1),
-- optimizer (its lr goes to each launch and its step count goes on), model (refused
-- when FSDP offloads it: its copies, prefetched across steps on a stream of their own, are
-- outside any capture). Returns a callable: step(inputs...) -> the function's results.
function M.step(fn, opts)
  opts = opts or {}
  if type(fn) ~= "function" then error("cuda_graph.step: expected a function, got " .. type(fn), 2) end
  local warmup = opts.warmup or 2
  if type(warmup) ~= "number" or warmup < 1 or warmup % 1 ~= 0 then
    error(("cuda_graph.step: warmup must be a whole number >= 1 (eager steps before the capture), got %s"):format(
      tostring(warmup)), 2)
  end
  if opts.model and require("shard.fsdp").offloaded(opts.model) then
    error("cuda_graph.step: FSDP CPU offload copies on a stream of its own, prefetched across steps, outside the " ..
          "captured step; a CUDA graph of the step needs offload off", 2)
  end
  local self = { calls = 0, optimizer = opts.optimizer }

  local function copy_in(args)
    for i, t in ipairs(args) do
      local s = self.inputs[i]
      if not s or not same_layout(s, t) then
        error(("cuda_graph.step: input %d is %s, the captured step's is %s: a graph replays fixed shapes " ..
               "(make a new step for another shape)"):format(i, shape_text(t), s and shape_text(s) or "absent"), 3)
      end
      check(C.sh_cuda_copy_async(s.p, t:contiguous().p), 3)   -- a copy on the compute stream, not a kernel
    end
  end

  local function capture(args)
    local device = args[1] and args[1]:device()
    cuda_index(device, "cuda_graph.step")
    self.inputs = {}
    for i, t in ipairs(args) do
      if t:device() ~= device then
        error(("cuda_graph.step: input %d is on %s, input 1 on %s"):format(i, t:device(), device), 3)
      end
      self.inputs[i] = t:clone()
    end
    self.graph, self.results = (function(g, ...) return g, { ... } end)(M.capture(device, function()
      return fn(unpack(self.inputs))
    end))
  end

  return setmetatable(self, { __call = function(_, ...)
    local args = { ... }
    self.calls = self.calls + 1
    if self.calls <= warmup then return fn(...) end
    if not self.graph then
      capture(args)
    else
      copy_in(args)
      if self.optimizer then self.optimizer.step_count = self.optimizer.step_count + 1 end
    end
    if self.optimizer then self.graph:set_lr(self.optimizer.lr) end
    self.graph:launch()
    return unpack(self.results)
  end })
end

return M
