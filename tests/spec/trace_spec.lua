-- shard.trace at world 1: the trace file against the counters the runtime keeps on its own
-- (collective counts and bytes, seconds blocked in waits, the allocator's peak), spans that
-- nest, a summary that adds up, and the memory timeline.
local shard = require("shard")
local T = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/trace_check.lua")

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)

describe("shard.trace", function()
  local path, png = dir .. "/t.json", dir .. "/mem.png"
  local F = shard.F
  local linear, backward = F.linear, require("shard.autograd").backward
  local run = T.run(shard, path, { png = png })
  local doc = T.load(path)

  it("writes valid trace events whose spans nest on every track", function()
    assert.same({}, T.field_problems(doc))
    assert.same({}, T.nesting_problems(doc))
    local steps = {}
    for _, n in ipairs(T.names(doc, 0, "step")) do if n:match("^step ") then steps[#steps + 1] = n end end
    table.sort(steps)
    assert.same({ "step 1", "step 2" }, steps)
  end)

  it("has every collective the counters saw, with its bytes", function()
    local counts, bytes = T.collectives(doc, 0)
    local seen = 0
    for k, n in pairs(run.counts) do
      assert.equal(n, counts[k] or 0, k .. " count")
      assert.equal(run.bytes[k], bytes[k] or 0, k .. " bytes")
      seen = seen + n
    end
    assert.is_true(seen >= 2 * 3 * 2, "a gather and a reduce per unit and step")
  end)

  it("shows ops forward and backward, FSDP unit phases, data and the optimizer", function()
    local ops, bwd, fsdp, loop = T.names(doc, 0, "op"), T.names(doc, 0, "op.bwd"), T.names(doc, 0, "fsdp"), T.names(doc, 0, "loop")
    local function has(list, name) for _, n in ipairs(list) do if n == name then return true end end return false end
    assert.is_true(has(ops, "linear") and has(bwd, "linear backward"))
    for _, n in ipairs { "unshard transformer.h.0", "reshard transformer.h.1", "pre-backward transformer.h.1",
                         "post-backward (root)", "forward (root)" } do
      assert.is_true(has(fsdp, n), n)
    end
    assert.is_true(has(loop, "data") and has(loop, "optimizer"))
  end)

  it("prints a summary that adds up and matches the blocked time sh_comm_wait counted", function()
    local sum = run.result.summary[1]
    assert.near(sum.step, sum.compute + sum.exposed + sum.other, 1e-9)
    assert.is_true(sum.compute > 0 and sum.compute <= sum.step and sum.other >= 0)
    assert.is_true(sum.exposed <= sum.comm + 1e-6 and sum.overlap >= 0 and sum.overlap <= 1)
    assert.near(run.wait * 1e3, sum.exposed, 1e-3)
    local by_unit = 0
    for _, ms in pairs(sum.exposed_by_unit) do by_unit = by_unit + ms end
    assert.near(sum.exposed, by_unit, 1e-9)
    assert.same(run.result.summary, shard.trace.summarize(doc.traceEvents))
  end)

  it("draws the memory timeline with the allocator's peak", function()
    assert.is_true(T.is_png(png))
    assert.equal(run.peak, run.result.timeline_peak)
  end)

  it("leaves the ops and hooks as they were", function()
    assert.equal(linear, F.linear)
    assert.equal(backward, require("shard.autograd").backward)
    assert.is_false(shard.trace.recording())
  end)

  it("names a bad step range and a trace it cannot write, before any step", function()
    assert.has_error(function() shard.trace.parse_steps("5:3") end,
      "trace: --trace_steps=5:3; expected FIRST:LAST (e.g. 3:5) or one step, FIRST <= LAST")
    assert.has_error(function() shard.trace.setup{ path = dir .. "/no/such/dir/t.json" } end,
      "trace: cannot write the trace " .. dir .. "/no/such/dir/t.json (" .. dir .. "/no/such/dir/t.json: No such file or directory)")
    shard.trace.setup{}
  end)
end)

describe("--trace on the recipe", function()
  it("writes one file for 2 ranks, its summary, and each rank's memory timeline", function()
    local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
    local out, code = support.shard("launch --nproc 2 recipes/gpt_shakespeare_char.lua --data=/usr/share/common-licenses/GPL-3" ..
      " --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=4 --max_iters=4 --eval_interval=100" ..
      " --eval_iters=1 --sample_tokens=0 --device=cpu --strategy=full_shard --out_dir=" .. dir .. "/run" ..
      " --trace=" .. dir .. "/r.json --trace_steps=1:2 --memory_timeline=" .. dir .. "/m.png")
    assert.equal(0, code, out)
    assert.matches("trace summary over steps 1%-2", out)
    assert.matches("trace: 2 ranks, steps 1%-2", out)
    local doc = T.load(dir .. "/r.json")
    assert.same({}, T.nesting_problems(doc))
    for pid = 0, 1 do
      local loop = table.concat(T.names(doc, pid, "loop"), ",")
      assert.equal("data,clip grad norm,optimizer,data,clip grad norm,optimizer", loop)
      assert.is_true(#T.names(doc, pid, "comm") > 0)
    end
    assert.is_true(T.is_png(dir .. "/m.png") and T.is_png(dir .. "/m.rank1.png"))
    -- rank 0's line (the one a launch shows) names rank 1's file too
    assert.is_truthy(out:find(("memory timeline: rank 0, peak %%d+%%.%%d [KM]iB %%-> %s/m%%.png; rank 1: %s/m%%.rank1%%.png\n"):format(
      dir:gsub("%p", "%%%0"), dir:gsub("%p", "%%%0"))), out)
    -- the summary: ms to one decimal and the overlap in percent, in aligned columns
    local head = assert(out:match("\n(rank +step +compute +comm +exposed +overlap +other +clock)\n"), out)
    local rows = 0
    for row in out:gmatch("\n( +%d [^\n]+)") do
      rows = rows + 1
      assert.equal(#head, #row, row)
      assert.is_truthy(row:match("^ +%d( +%d+%.%d)( +%d+%.%d)( +%d+%.%d)( +%d+%.%d) +%d+%.%d%% +%-?%d+%.%d +%a+$"), row)
    end
    assert.equal(2, rows, out)
  end)
end)

describe("the runtime's event rings", function()
  it("keep the newest events when full and count the ones dropped", function()
    local ffi, C = require("ffi"), shard.C
    local g = shard.comm.world()
    C.sh_comm_trace_start(4)
    for _ = 1, 6 do g:barrier() end
    local buf = ffi.new("sh_comm_event[8]")
    local n = C.sh_comm_trace_read(buf, 8)
    assert.equal(4, n)
    assert.equal(2, tonumber(C.sh_comm_trace_dropped()))
    for i = 0, 3 do
      assert.equal(C.SH_COLL_BARRIER, buf[i].kind)
      assert.equal(tonumber(buf[0].seq) + i, tonumber(buf[i].seq))   -- the newest four, in order
    end
    assert.equal(0, C.sh_comm_trace_read(buf, 8))
    C.sh_comm_trace_start(0)
    C.sh_mem_trace_start(3)
    local ts = {}
    for i = 1, 5 do ts[i] = shard.zeros({ 100 * i }) end
    local mbuf = ffi.new("sh_mem_event[8]")
    assert.equal(3, C.sh_mem_trace_read(mbuf, 8))
    assert.equal(2, tonumber(C.sh_mem_trace_dropped()))
    assert.same({ 1216, 1600, 2048 }, { tonumber(mbuf[0].bytes), tonumber(mbuf[1].bytes), tonumber(mbuf[2].bytes) })
    C.sh_mem_trace_start(0)
    for _, t in ipairs(ts) do t:free() end
  end)
end)

describe("shard.memory.timeline", function()
  it("replays to the allocator's peak and its final allocation", function()
    local memory = shard.memory
    local kept
    local tl = memory.timeline(function()
      local a = shard.zeros({ 1000 })
      local b = memory.with_tag("grad", function() return shard.zeros({ 3000 }) end)
      memory.mark("free a")
      a:free()
      kept = b
    end)
    local series = memory.timeline_series(tl)
    local s = memory.stats()
    assert.equal(s.peak, series.peak.bytes)
    assert.equal(s.allocated, series.points[#series.points].total)
    assert.equal(s.by_tag.grad, series.points[#series.points].by_tag.grad)
    assert.equal(1, #tl.marks)
    assert.equal(0, tl.dropped)
    kept:free()
  end)

  -- issue 31, item 12: the PNG's rotated labels piled on each other, and "comm" stood in the
  -- key without a band
  it("draws a band only for tags that hold bytes, and labels only marks that have room", function()
    local memory = shard.memory
    local tl = memory.timeline(function()
      for i = 1, 60 do   -- 60 marks in a few ms: most too close together to label
        local a = shard.zeros({ 1000 })
        memory.mark("unshard unit " .. i)
        a:free()
      end
      local deadline = require("shard.timer").now() + 0.005
      while require("shard.timer").now() < deadline do end
      memory.mark("last, alone")
    end)
    local layout = memory.timeline_layout(tl)
    for _, tag in ipairs(layout.tags) do
      local held = false
      for _, p in ipairs(layout.series.points) do held = held or p.by_tag[tag] ~= 0 end
      assert.is_true(held, tag .. " has a band but never holds a byte")
    end
    assert.is_falsy(table.concat(layout.tags, ","):find("comm"), "no collective ran: no comm band")
    local xs = {}
    for i in pairs(layout.labelled) do xs[#xs + 1] = (tl.marks[i].t - tl.t0) * 1e3 end
    table.sort(xs)
    assert.is_true(#xs >= 2 and #xs < 60, #xs .. " of 61 labelled")
    assert.is_true(layout.labelled[1] and layout.labelled[61], "the first and the lone last mark are labelled")
    -- 11 pixels of a 950-pixel plot between labels: rotated 7-point text does not overlap
    for i = 2, #xs do assert.is_true(xs[i] - xs[i - 1] >= layout.span * 11 / 950, "labels closer than their width") end
    local png = os.tmpname() .. ".png"
    memory.timeline_png(tl, png)
    assert.is_true(T.is_png(png))
    os.remove(png)
  end)

  -- issue 34: on the first GPU node (no gnuplot) the PNG was silently not drawn, though the
  -- line "memory timeline: ... -> mem.png" said it was: LuaJIT's popen close reports no status
  it("without gnuplot: setup refuses the timeline before any step, and drawing fails by name", function()
    local ffi = require("ffi")
    pcall(ffi.cdef, "int setenv(const char *, const char *, int);")
    local path = os.getenv("PATH")
    local tl = shard.memory.timeline(function() shard.zeros({ 10 }):free() end)
    local png = os.tmpname() .. ".png"
    ffi.C.setenv("PATH", "/nonexistent", 1)
    local ok_setup, setup_err = pcall(shard.trace.setup, { memory_timeline = png })
    local ok_draw, draw_err = pcall(shard.memory.timeline_png, tl, png)
    ffi.C.setenv("PATH", path, 1)
    shard.trace.setup{}
    assert.is_false(ok_setup)
    assert.equal("trace: the memory timeline " .. png .. " is drawn by gnuplot, which is not installed "
                 .. "(make deps installs gnuplot-nox)", tostring(setup_err):gsub("^.-:%d+: ", ""))
    assert.is_false(ok_draw)
    assert.truthy(tostring(draw_err):find("gnuplot failed on", 1, true), draw_err)
    assert.is_nil(io.open(png, "r"))
  end)

  it("reads a command's exit status, which LuaJIT's popen close does not give", function()
    local rt = require("shard.ffi")
    assert.same({ "out", 0 }, { rt.shell("echo out") })
    assert.same({ "", 3 }, { rt.shell("exit 3") })
    local _, status = rt.shell("no_such_command_for_shard_spec")
    assert.equal(127, status)
    assert.is_true(rt.have_command("sh"))
    assert.is_false(rt.have_command("no_such_command_for_shard_spec"))
  end)
end)
