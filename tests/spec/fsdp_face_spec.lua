-- FSDP's public face (shard.fsdp.state): code outside lua/shard/fsdp/ reads a wrapped model
-- through fsdp.local_slices, gather_full, mark_stale, layout, unit_name and gather_state,
-- never through a unit's fields; and Module's children through named_children(), never
-- _children. The first cases read every .lua file under lua/shard for such reads (comments and
-- strings left out) and name each one as file:line; the rest check the face's values against
-- the plain model's in one process (tests/mpi/fsdp_face.lua does so across ranks).
local shard = require("shard")
local fsdp, nn = shard.fsdp, shard.nn
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")

local ROOT = os.getenv("SHARD_HOME") or "."

-- What names a unit's or its FlatParameter's internals (lua/shard/fsdp/unit.lua, wrap.lua,
-- shard.flatparam): Lua patterns, each with what it reads.
local UNIT_READS = {
  { "all_units", "the model's units" },
  { "%.fp%f[^%w_]", "a unit's FlatParameter (.fp)" },
  { ":slot%(", "a FlatParameter's slot" },
  { ":shard_view%(", "a FlatParameter's shard view" },
  { ":init_param%(", "a FlatParameter's init_param" },
  { ":grad_shard%(", "a FlatParameter's sharded grad" },
  { "frozen_part", "a unit's frozen companion" },
  { "fsdp_unit", "the unit marker" },
  { "%.mode%.shard", "a unit's strategy mode" },
  { "%.is_root%f[^%w_]", "the root marker" },
  { "clip_state", "the root's clip buffers" },
  { "%.names%[", "the root's parameter names" },
  { "%.ignored%f[^%w_]", "the root's ignored parameters" },
  { "%.replicate%f[^%w_]", "a unit's replicate group" },
  { "unsynced", "a unit's accumulation state" },
  { "replica_owed", "a unit's accumulation state" },
  { "pending_reduces", "the root's reductions in flight" },
  { "prefetch_depth", "the root's schedule limits" },
  { "gather_limit", "the root's schedule limits" },
}
local CHILDREN_READS = { { "%._children", "Module's private _children (use named_children())" } }

-- The text's lines with comments and string literals blanked (a string becomes ""), so that
-- only code is searched; line numbers are kept.
local function code_lines(text)
  local lines, buf, i, n = {}, {}, 1, #text
  local function newline() lines[#lines + 1] = table.concat(buf); buf = {} end
  local function skip_to(j)   -- past text[i .. j - 1], keeping its line breaks
    for _ in text:sub(i, j - 1):gmatch("\n") do newline() end
    i = j
  end
  local function long_close(at)   -- the end (exclusive) of a [=*[ ... ]=*] that opens at `at`
    local eq = text:match("^%[(=*)%[", at)
    local _, e = text:find("]" .. eq .. "]", at, true)
    return (e or n) + 1
  end
  while i <= n do
    local c = text:sub(i, i)
    if c == "\n" then
      newline(); i = i + 1
    elseif text:sub(i, i + 1) == "--" then
      if text:match("^%[=*%[", i + 2) then skip_to(long_close(i + 2))
      else skip_to(text:find("\n", i, true) or n + 1) end
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = text:sub(j, j)
        if d == "\\" then j = j + 2 elseif d == c or d == "\n" then break else j = j + 1 end
      end
      buf[#buf + 1] = '""'
      skip_to(math.min(j + 1, n + 1))
    elseif c == "[" and text:match("^%[=*%[", i) then
      buf[#buf + 1] = '""'
      skip_to(long_close(i))
    else
      buf[#buf + 1] = c; i = i + 1
    end
  end
  newline()
  return lines
end

-- "file:line: what (the line)" for every line of text matching one of rules.
local function reads_in(file, text, rules)
  local out = {}
  for ln, code in ipairs(code_lines(text)) do
    for _, r in ipairs(rules) do
      if code:find(r[1]) then out[#out + 1] = ("%s:%d: %s: %s"):format(file, ln, r[2], code:match("^%s*(.-)%s*$")) end
    end
  end
  return out
end

local function lua_files()
  local p = io.popen(("cd %s && find lua/shard -name '*.lua' | sort"):format(support.quote(ROOT)))
  local files = {}
  for f in p:lines() do files[#files + 1] = f end
  p:close()
  return files
end

local function read(file)
  local f = assert(io.open(ROOT .. "/" .. file, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Every read of `rules` in the files `skip` lets through.
local function scan(rules, skip)
  local found = {}
  for _, file in ipairs(lua_files()) do
    if not skip(file) then
      for _, r in ipairs(reads_in(file, read(file), rules)) do found[#found + 1] = r end
    end
  end
  return found
end

describe("FSDP's state is read through its public face", function()
  it("no module outside lua/shard/fsdp/ reads a unit's internals", function()
    local files = lua_files()
    assert.is_true(#files > 20, "found " .. #files .. " files under lua/shard")
    -- shard.flatparam is the FlatParameter's own binding
    local found = scan(UNIT_READS, function(f) return f:find("^lua/shard/fsdp/") or f == "lua/shard/flatparam.lua" end)
    assert.are.same({}, found)
  end)

  it("no module outside nn/module.lua reads Module's _children", function()
    assert.are.same({}, scan(CHILDREN_READS, function(f) return f == "lua/shard/nn/module.lua" end))
  end)

  it("the search names a planted read by file and line, and passes over comments and strings", function()
    local text = table.concat({
      "local x = 1",
      "-- model.all_units in a comment",
      "local s = \"u.fp:slot(1)\" .. 'all_units'",
      "--[[ u.fp",
      "  model.all_units ]] local y = 2",
      "local z = [[ .fp ]]",
      "for _, u in ipairs(model.all_units) do local v = u.fp:shard_view(i) end",
      "local w = blocks._children",
    }, "\n")
    local found = reads_in("planted.lua", text, UNIT_READS)
    assert.are.same({ "planted.lua:7: the model's units: for _, u in ipairs(model.all_units) do local v = u.fp:shard_view(i) end",
                      "planted.lua:7: a unit's FlatParameter (.fp): for _, u in ipairs(model.all_units) do local v = u.fp:shard_view(i) end",
                      "planted.lua:7: a FlatParameter's shard view: for _, u in ipairs(model.all_units) do local v = u.fp:shard_view(i) end" },
                    found)
    assert.are.same({ "planted.lua:8: Module's private _children (use named_children()): local w = blocks._children" },
                    reads_in("planted.lua", text, CHILDREN_READS))
  end)
end)

---------------------------------------------------------------------------------------------
-- the face's values, one process

local CFG = { n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, block_size = 8, bias = true }

local function plain()
  shard.manual_seed(9)
  return nn.GPT(CFG)
end

local function wrapped(opts)
  local o = { policy = fsdp.policy.transformer{ nn.Block } }
  for k, v in pairs(opts or {}) do o[k] = v end
  return fsdp.wrap(plain(), o)
end

local function flat(t) return t:tolist_flat() end

local function loss_of(model)
  local x = shard.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i64" })
  return shard.no_grad(function() return model(x, x):item() end)
end

describe("fsdp.local_slices, gather_full, mark_stale", function()
  it("a wrapped model's slices are the plain model's parameters, each once, in views of its shards", function()
    local ref, model = plain(), wrapped()
    assert.is_true(fsdp.is_fsdp(model))
    assert.is_false(fsdp.is_fsdp(ref))
    local want = {}
    for _, np in ipairs(ref:named_parameters()) do want[np.name] = np.tensor end
    local seen = 0
    for _, sl in ipairs(fsdp.local_slices(model)) do
      local t = want[sl.name]
      assert.is_not_nil(t, sl.name)
      assert.are.same(t:shape(), sl.shape)
      -- one rank: it holds (and writes) every element
      assert.equal(0, sl.start)
      assert.equal(t:numel(), sl.count)
      assert.is_true(sl.owner)
      assert.is_falsy(sl.whole)
      local v = sl:view()
      assert.are.same(flat(t), flat(v))
      v:free()
      want[sl.name] = nil
      seen = seen + 1
    end
    assert.are.same({}, want)    -- lm_head's weight is wte's: one slice
    assert.equal(#ref:named_parameters(), seen)
  end)

  it("a plain model's slices are its whole parameters, so one walk serves both", function()
    local ref = plain()
    local slices = fsdp.local_slices(ref)
    assert.equal(#ref:named_parameters(), #slices)
    for i, np in ipairs(ref:named_parameters()) do
      assert.equal(np.name, slices[i].name)
      assert.is_true(slices[i].whole)
      assert.equal(np.tensor:numel(), slices[i].count)
    end
    assert.are.same({ strategy = "none" }, fsdp.layout(ref))
    fsdp.mark_stale(ref)    -- nothing to do
  end)

  it("gather_full gives the plain model's values as CPU f32 tensors, mixed precision's masters exactly", function()
    for _, opts in ipairs { {}, { strategy = "no_shard" }, { mixed_precision = { param = "bf16" } } } do
      local ref, model = plain(), wrapped(opts)
      local full = fsdp.gather_full(model)
      for _, np in ipairs(ref:named_parameters()) do
        local t = full[np.name]
        assert.equal("f32", t:dtype())
        assert.equal("cpu", t:device())
        assert.are.same(np.tensor:shape(), t:shape())
        assert.are.same(flat(np.tensor), flat(t), np.name)
        t:free()
        full[np.name] = nil
      end
      assert.are.same({}, full)
    end
    assert.equal("full_shard", fsdp.layout(wrapped()).strategy)
  end)

  it("set writes a slice, mark_stale makes the next forward gather it", function()
    local ref, model = plain(), wrapped()
    assert.equal(loss_of(ref), loss_of(model))
    -- every parameter of both models scaled by 0.5 (the wrapped one through its slices)
    for _, np in ipairs(ref:named_parameters()) do np.tensor:scale_(0.5) end
    local by_name = {}
    for _, np in ipairs(ref:named_parameters()) do by_name[np.name] = np.tensor end
    for _, sl in ipairs(fsdp.local_slices(model)) do sl:set(by_name[sl.name]) end
    fsdp.mark_stale(model)
    assert.equal(loss_of(ref), loss_of(model))
    local full = fsdp.gather_full(model)
    for name, t in pairs(by_name) do assert.are.same(flat(t), flat(full[name]), name); full[name]:free() end
  end)

  it("ignored parameters are whole slices, after the units'", function()
    local ref = plain()
    local m = plain()
    local ln_f = m.transformer.ln_f
    local model = fsdp.wrap(m, { policy = fsdp.policy.transformer{ nn.Block }, ignored_modules = { ln_f } })
    local slices = fsdp.local_slices(model)
    local last = slices[#slices]
    assert.equal("transformer.ln_f.bias", last.name)
    assert.is_true(last.whole)
    assert.equal("transformer.ln_f.weight", slices[#slices - 1].name)
    local full = fsdp.gather_full(model)
    for _, np in ipairs(ref:named_parameters()) do assert.are.same(flat(np.tensor), flat(full[np.name]), np.name) end
  end)

  it("a unit seen from a tool: its name and gather state", function()
    local model = wrapped()
    assert.equal("(root)", fsdp.unit_name(model))
    assert.equal("sharded", fsdp.gather_state(model))
  end)
end)
