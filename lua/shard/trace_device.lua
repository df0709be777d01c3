-- shard.trace_device: device times for shard.trace on a CUDA device. Kernels run after the
-- host queued them, so the host's spans time the launches; these come from timing events
-- recorded on the stream each op ran on (before and after it) and, for collectives, by
-- runtime/dist/comm.c on the caller's and the collective's streams (sh_comm_event.device_events).
-- Device times become host times through one reference event recorded on an idle device:
-- t = host time at the reference + cudaEventElapsedTime(reference, event).
local ffi = require("ffi")
local rt = require("shard.ffi")
local timer = require("shard.timer")
local C, check = rt.C, rt.check

local M = {}
M.STREAMS = { [0] = "cuda: compute stream", "cuda: all-gather stream", "cuda: reduce-scatter stream", "cuda: other stream" }
M.OTHER = 3

local Recorder = {}
Recorder.__index = Recorder

local stream_box = ffi.new("sh_cuda_stream*[1]")
local function key(p) return tostring(ffi.cast("uintptr_t", p)) end

-- A recorder for cuda:device, its reference taken now (the device is synchronised first).
function M.new(device)
  local self = setmetatable({ device = device, kinds = {}, spans = {}, stack = {} }, Recorder)
  for kind = 0, 2 do
    check(C.sh_cuda_stream_get(stream_box, device, kind))
    self.kinds[key(stream_box[0])] = kind
  end
  check(C.sh_cuda_synchronize(device))
  self.ref = self:event()
  check(C.sh_cuda_stream_get(stream_box, device, 0))
  self.t_ref = timer.now()
  check(C.sh_cuda_event_record(self.ref, stream_box[0]))
  check(C.sh_cuda_event_synchronize(self.ref))
  return self
end

function Recorder:event()
  local box = ffi.new("sh_cuda_event*[1]")
  check(C.sh_cuda_event_create(box, self.device, 1))
  return box[0]
end

-- An event on the calling thread's current stream: the event, the stream, its kind.
function Recorder:stamp()
  check(C.sh_cuda_current_stream(stream_box, self.device))
  local s = stream_box[0]
  local e = self:event()
  check(C.sh_cuda_event_record(e, s))
  return e, s, self.kinds[key(s)] or M.OTHER
end

-- profile's before/after hooks: an op's events on the stream it was launched on.
function Recorder:op_begin()
  local e, s, kind = self:stamp()
  self.stack[#self.stack + 1] = { e0 = e, stream = s, kind = kind }
end

function Recorder:op_end(name, cat)
  local top = table.remove(self.stack)
  if not top then return end
  top.e1 = self:event()
  check(C.sh_cuda_event_record(top.e1, top.stream))
  top.name, top.cat = name, cat
  self.spans[#self.spans + 1] = top
end

-- A collective's device events (from the ring): it starts once the caller's stream and its
-- own both reached it.
function Recorder:collective(name, stream, events, args)
  if events[0] == nil or events[1] == nil or events[2] == nil then return end
  self.spans[#self.spans + 1] = { name = name, cat = "device.comm", kind = stream, args = args,
                                  e_caller = ffi.cast("sh_cuda_event*", events[0]), e0 = ffi.cast("sh_cuda_event*", events[1]),
                                  e1 = ffi.cast("sh_cuda_event*", events[2]) }
end

local ms = ffi.new("double[1]")
function Recorder:time(e)
  check(C.sh_cuda_event_elapsed(self.ref, e, ms))
  return self.t_ref + ms[0] / 1e3
end

-- Waits for the device; returns the spans as { name, cat, kind, t0, t1, args } in host
-- seconds, and destroys every event.
function Recorder:finish()
  check(C.sh_cuda_synchronize(self.device))
  local out = {}
  for _, s in ipairs(self.spans) do
    local t0 = self:time(s.e0)
    if s.e_caller ~= nil then t0 = math.max(t0, self:time(s.e_caller)); C.sh_cuda_event_destroy(s.e_caller) end
    out[#out + 1] = { name = s.name, cat = s.cat, kind = s.kind, t0 = t0, t1 = self:time(s.e1), args = s.args }
    C.sh_cuda_event_destroy(s.e0); C.sh_cuda_event_destroy(s.e1)
  end
  for _, s in ipairs(self.stack) do C.sh_cuda_event_destroy(s.e0) end
  C.sh_cuda_event_destroy(self.ref)
  self.spans, self.stack = {}, {}
  return out
end

return M
