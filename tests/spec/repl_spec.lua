-- The REPL's parts (shard.show, shard.tools.repl.complete and .merge) against hand-written
-- expectations, and `shard repl --nproc 2` through a pipe: collectives across the ranks, an
-- error on one rank, and an FSDP-wrapped model stepped and looked at per rank. The terminal
-- (Ctrl-C, Tab, history) is tests/spec/repl_pty_spec.lua's.
local shard = require("shard")
local show = require("shard.show")
local complete = require("shard.tools.repl.complete")
local merge = require("shard.tools.repl.merge")

local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh = support.BIN, support.quote, support.sh

describe("shard.show", function()
  it("prints a chunk's values on one line, nothing for none", function()
    assert.equal("", show.values(0, {}))
    assert.equal("a\tnil\ttrue\n", show.values(3, { "a", nil, true }))
    assert.equal("nil\n", show.values(1, {}))
  end)

  it("prints tables by their contents, sorted, one line when short", function()
    assert.equal('{ 1, 2, a = { x = 1 }, b = "q\\"uote\\n" }', show.value { 1, 2, b = 'q"uote\n', a = { x = 1 } })
    assert.equal("{}", show.value {})
    assert.equal("{ [2.5] = true, f = <function> }", show.value { f = print, [2.5] = true })
    local t = { name = "loop" }
    t.self = t
    assert.equal('{ name = "loop", self = <cycle> }', show.value(t))
  end)

  it("breaks a long table into one entry per line, nested ones indented", function()
    local t = { alpha = 1111111111, beta = 2222222222, gamma = 3333333333, delta = 4444444444,
                inner = { epsilon = 5555555555, zeta = 6666666666 } }
    assert.equal(table.concat({
      "{",
      "  alpha = 1111111111,",
      "  beta = 2222222222,",
      "  delta = 4444444444,",
      "  gamma = 3333333333,",
      "  inner = { epsilon = 5555555555, zeta = 6666666666 }",
      "}" }, "\n"), show.value(t))
  end)

  it("shows a tensor inside a table by its summary line, and a long table's first entries", function()
    assert.equal("{ w = [f32 2x3, cpu] }", show.value { w = shard.zeros { 2, 3 } })
    local big = {}
    for i = 1, 50 do big[i] = i end
    local s = show.value(big)
    assert.matches("^{\n  1,\n  2,\n", s)
    assert.matches("  40,\n  %.%.%. %(10 more%)\n}$", s)
  end)

  it("prints shard.memory.stats() with its tags", function()
    local s = show.value(shard.memory.stats())
    assert.matches("by_tag = { activation = %d+, comm = %d+, grad = %d+, optim = %d+, other = %d+, param = %d+ }", s)
  end)
end)

describe("shard.tools.repl.complete", function()
  local env = setmetatable({
    shard = shard,
    t = shard.ones { 2 },
    s = "text",
    obj = setmetatable({ own = 1 }, { __index = setmetatable({ parent = 2 }, { __index = { grand = function() end } }) }),
  }, { __index = _G })

  it("completes globals, fields and keywords", function()
    assert.same({ "shard.nn.Linear" }, complete.candidates("x = shard.nn.Line", env))
    assert.same({ "print" }, complete.candidates("pri", env))
    assert.same({ "rawequal", "rawget", "rawset", "repeat", "require", "return" }, complete.candidates("r", setmetatable({}, { __index = _G })))
    assert.same({ "string.format" }, complete.candidates("string.form", env))
    assert.same({}, complete.candidates("nothing.here", env))
  end)

  it("follows metatables' __index chains; ':' offers only functions", function()
    assert.same({ "obj.grand", "obj.own", "obj.parent" }, complete.candidates("obj.", env))
    assert.same({ "obj:grand" }, complete.candidates("obj:", env))
    assert.same({ "s:upper" }, complete.candidates("s:up", env))
  end)

  it("finds a tensor's methods behind its FFI metatype", function()
    assert.same({ "t:sub", "t:sub_", "t:sum", "t:sum_to", "t:sumsq" }, complete.candidates("t:su", env))
    assert.same({ "t.shape" }, complete.candidates("t.sha", env))
  end)
end)

describe("shard.tools.repl.merge", function()
  it("labels ranks with ranges", function()
    assert.equal("0-3", merge.label { 0, 1, 2, 3 })
    assert.equal("0,2", merge.label { 0, 2 })
    assert.equal("0-1,3,5-6", merge.label { 0, 1, 3, 5, 6 })
  end)

  local function merged(replies, world)
    local out = {}
    for _, p in ipairs(merge.merge(replies, world)) do out[#out + 1] = (p.error and "E:" or "") .. p.text end
    return table.concat(out)
  end

  it("shows identical outputs once, differing lines per rank, aligned", function()
    assert.equal("[0-3] 42\n", merged({ [0] = { output = "42\n" }, { output = "42\n" }, { output = "42\n" }, { output = "42\n" } }, 4))
    assert.equal("[0-1] {\n[0]     r = 0,\n[1]     r = 1,\n[0-1] }\n",
      merged({ [0] = { output = "{\n  r = 0,\n}\n" }, { output = "{\n  r = 1,\n}\n" } }, 2))
    assert.equal("[0,2] a\n[0,2] b\n[1]   c\n",
      merged({ [0] = { output = "a\nb\n" }, { output = "c\n" }, { output = "a\nb\n" } }, 3))
  end)

  it("shows errors last, by rank, and nothing for silent ranks", function()
    assert.equal("[0] hi\nE:[1] error: stdin:1: boom\n",
      merged({ [0] = { output = "hi\n" }, { output = "", error = "stdin:1: boom" }, { output = "" } }, 3))
    assert.equal("", merged({ [0] = { output = "" }, { output = "" } }, 2))
  end)
end)

describe("shard.tools.repl.interrupt", function()
  it("stops a JIT-hot loop at SIGINT; the next chunk runs in full", function()
    local ffi = require("ffi")
    local interrupt = require("shard.tools.repl.interrupt")
    local timer = require("shard.timer")
    pcall(ffi.cdef, "int getpid(void);")
    assert.is_true(interrupt.install())
    os.execute(("(sleep 0.3; kill -INT %d) &"):format(ffi.C.getpid()))
    local t0 = timer.now()
    -- compiled, the loop would end by itself in a few seconds (and never stop at SIGINT)
    local ok, err = interrupt.run(loadstring("for i = 1, 3e9 do end"), tostring)
    local took = timer.now() - t0
    local ok2, n, values = interrupt.run(loadstring("local s = 0 for i = 1, 1e6 do s = s + 1 end return s"), tostring)
    interrupt.uninstall()
    assert.is_false(ok)
    assert.is_true(interrupt.is_interrupt(err), err)
    assert.is_true(took < 5, "took " .. took .. " s")
    assert.is_true(ok2, n)
    assert.equal(1, n)
    assert.equal(1e6, values[1])
  end)
end)

describe("shard repl --nproc 2 through a pipe", function()
  local function repl2(input) return sh(quote(BIN) .. " repl --nproc 2", input) end

  it("runs each chunk on both ranks, collectives included, and merges their output", function()
    local code, out, err = repl2("rank, world:size()\nx = rank + 1\nworld:all_reduce(shard.ones{2} * x)\nprint('same')\n")
    assert.equal(0, code, err)
    assert.equal("[0] 0\t2\n[1] 1\t2\n[0-1] [3., 3.]\n[0-1] [f32 2, cpu]\n[0-1] same\n", out)
  end)

  it("shows an error with its rank and goes on", function()
    local code, out, err = repl2("if rank == 1 then error('boom') end\nprint('after', rank)\n")
    assert.equal(1, code)
    assert.equal("[1] error: stdin:1: boom\n", err)
    assert.equal("[0] after\t0\n[1] after\t1\n", out)
  end)

  it("builds an FSDP-wrapped model, steps it and shows each rank's shard and memory", function()
    local code, out, err = repl2(table.concat({
      "cfg = { n_layer = 2, n_head = 2, n_embd = 32, vocab_size = 16, block_size = 8, bias = false, dropout = 0 }",
      "shard.manual_seed(7); ref = shard.nn.GPT(cfg)",
      "shard.manual_seed(7); model = shard.fsdp.wrap(shard.nn.GPT(cfg), { policy = shard.fsdp.policy.transformer{ shard.nn.Block } })",
      "opt = shard.optim.AdamW(model, { lr = 1e-2 })",
      "shard.manual_seed(100 + rank); x = (shard.rand{2, 8} * 16):to('i64'); y = (shard.rand{2, 8} * 16):to('i64')",
      -- the wrapped model's loss on each rank's batch is the plain model's
      "a, b = model(x, y):item(), ref(x, y):item()",
      "math.abs(a - b) < 1e-5 * math.abs(b), a ~= 0",
      "loss = model(x, y); loss:backward(); opt:step(); opt:zero_grad()",
      "model(x, y):item() < loss:item()",
      "i = model.fp:info()",
      "i.rank, i.shard_numel * i.group_size == i.padded_numel",
      "shard.memory.stats().by_tag.optim > 0",
    }, "\n") .. "\n")
    assert.equal(0, code, err)
    assert.equal("[0-1] true\ttrue\n[0-1] true\n[0] 0\ttrue\n[1] 1\ttrue\n[0-1] true\n", out)
  end)
end)
