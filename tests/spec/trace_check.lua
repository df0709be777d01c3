-- tests/spec/trace_check.lua: what the trace tests share (loaded with dofile; not a spec):
-- a few FSDP steps of a small GPT traced through shard.trace, with the counters they are
-- checked against taken independently (shard.comm's collective counters, the seconds
-- sh_comm_wait blocked, the allocator's stats), and checks of the trace file itself.
local cjson = require("cjson")
local T = {}

-- Steps 0..3 of a 2-layer GPT wrapped full_shard, tracing `steps` (default 1:2) into path.
-- Returns { counts, bytes (per collective kind over the traced steps), wait (seconds blocked
-- over them), peak (stats().peak since the first traced step, at the finish), result
-- (trace.finish's) }.
function T.run(shard, path, opts)
  opts = opts or {}
  local trace, comm, nn = shard.trace, shard.comm, shard.nn
  local device = opts.device or "cpu"
  shard.manual_seed(1)
  local model = shard.fsdp.wrap(function()
    return nn.GPT{ n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = false }
  end, { policy = shard.fsdp.policy.transformer{ nn.Block }, strategy = "full_shard" })
  local opt = shard.optim.AdamW(model, { lr = 1e-3 })
  trace.setup{ path = path, steps = opts.steps or "1:2", memory_timeline = opts.png, device = device }
  local first, last = trace.parse_steps(opts.steps or "1:2")
  local out = { counts = {}, bytes = {} }
  local wait0
  for it = 0, last + 1 do
    if it == first then comm.reset_counts(); wait0 = comm.wait_seconds(); shard.memory.reset_peak(device) end
    trace.begin_step(it)
    local x = trace.span("data", function()
      return shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 }, { 8, 7, 6, 5, 4, 3, 2, 1 } }, { dtype = "i64", device = device })
    end)
    local loss = model(x, x)
    loss:backward()
    trace.span("optimizer", function() opt:step(); opt:zero_grad(true) end)
    loss:free(); x:free()
    if it == last then        -- before end_step, which finishes the trace (a barrier)
      out.wait = comm.wait_seconds() - wait0
      for k in pairs(comm.KINDS) do out.counts[k], out.bytes[k] = comm.count(k), comm.bytes(k) end
    end
    out.result = trace.end_step(it) or out.result
    if it == last then out.peak = shard.memory.stats(device).peak end
  end
  return out
end

function T.load(path)
  local f = assert(io.open(path, "r"), "no trace file at " .. path)
  local doc = cjson.decode(f:read("*a"))
  f:close()
  assert(type(doc.traceEvents) == "table", "the trace has no traceEvents list")
  return doc
end

-- Problems with the events' fields (empty when none).
function T.field_problems(doc)
  local bad = {}
  for i, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then
      if type(e.ts) ~= "number" or type(e.dur) ~= "number" or e.dur < 0 or type(e.pid) ~= "number"
         or type(e.tid) ~= "number" or type(e.name) ~= "string" or type(e.cat) ~= "string" then
        bad[#bad + 1] = ("event %d: %s"):format(i, cjson.encode(e))
      end
    elseif e.ph == "C" then
      if type(e.ts) ~= "number" or type(e.args) ~= "table" then bad[#bad + 1] = ("counter %d: %s"):format(i, cjson.encode(e)) end
    elseif e.ph ~= "M" then
      bad[#bad + 1] = ("event %d has phase %s"):format(i, tostring(e.ph))
    end
  end
  return bad
end

-- Spans of one track that overlap without nesting (empty when every track nests).
function T.nesting_problems(doc)
  local tracks = {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" then
      local key = e.pid .. "/" .. e.tid
      tracks[key] = tracks[key] or {}
      table.insert(tracks[key], e)
    end
  end
  local bad = {}
  for key, list in pairs(tracks) do
    table.sort(list, function(a, b) if a.ts ~= b.ts then return a.ts < b.ts end return a.dur > b.dur end)
    local stack = {}
    for _, e in ipairs(list) do
      while #stack > 0 and stack[#stack].ts + stack[#stack].dur <= e.ts do stack[#stack] = nil end
      local top = stack[#stack]
      if top and e.ts + e.dur > top.ts + top.dur + 1e-6 then
        bad[#bad + 1] = ("track %s: %s [%.3f, %.3f] crosses %s [%.3f, %.3f]"):format(key, e.name, e.ts, e.ts + e.dur,
          top.name, top.ts, top.ts + top.dur)
      end
      stack[#stack + 1] = e
    end
  end
  return bad
end

-- Per kind, the count and bytes of rank pid's collectives in the trace, and the seconds of
-- its waits.
-- (FSDP's schedule check group is left out, as the process-wide counters leave it out:
-- Group:set_counted(false); its waits stay in, as sh_comm_wait_seconds counts them.)
function T.collectives(doc, pid)
  local counts, bytes, wait = {}, {}, 0
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" and e.pid == pid and e.cat == "comm" and e.args.group ~= "fsdp schedule check" then
      local k = e.name:match("^(%S+)")
      counts[k] = (counts[k] or 0) + 1
      bytes[k] = (bytes[k] or 0) + e.args.bytes
    elseif e.ph == "X" and e.pid == pid and e.cat == "comm.wait" then
      wait = wait + e.dur / 1e6
    end
  end
  return counts, bytes, wait
end

-- Names of rank pid's spans of category cat.
function T.names(doc, pid, cat)
  local out = {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" and e.pid == pid and e.cat == cat then out[#out + 1] = e.name end
  end
  return out
end

function T.is_png(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local head = f:read(8)
  f:close()
  return head == "\137PNG\r\n\26\n"
end

return T
