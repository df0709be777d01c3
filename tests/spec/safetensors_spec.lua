-- shard.io.safetensors from Lua: the S.open handle against files assembled byte by byte here
-- (the format is the reference), the issue's malformed offsets refused with the file and
-- tensor named, and shard.load all or nothing: a file that fails any check leaves the model
-- exactly as it was.
local shard = require("shard")
local S = require("shard.io.safetensors")
local ffi = require("ffi")

local function u64le(n)
  local out = {}
  for k = 1, 8 do out[k] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(out)
end

local function f32le(values)
  local buf = ffi.new("float[?]", #values)
  for i, v in ipairs(values) do buf[i - 1] = v end
  return ffi.string(buf, 4 * #values)
end

local function write(path, header, body)
  local f = assert(io.open(path, "wb"))
  f:write(u64le(#header), header, body or "")
  f:close()
  return path
end

local function tmp() return os.tmpname() .. ".safetensors" end

describe("safetensors", function()
  it("opens a file built by hand and reads names, info, metadata and element ranges", function()
    local path = write(tmp(),
      '{"__metadata__":{"format":"pt","who":"\\u00e9"},'
      .. '"w":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},'
      .. '"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
      .. '"q":{"dtype":"I8","shape":[2],"data_offsets":[32,34]}}  ',
      f32le{ -1, -2 } .. f32le{ 1, 2, 3, 4, 5, 6 } .. "\1\2")
    local f = S.open(path)
    assert.same({ "b", "q", "w" }, f:names())
    assert.same({ dtype = "f32", shape = { 2, 3 }, numel = 6, nbytes = 24 }, f:info("w"))
    assert.same({ dtype = "i8", shape = { 2 }, numel = 2, nbytes = 2 }, f:info("q"))
    assert.is_nil(f:info("nope"))
    assert.same({ format = "pt", who = "\195\169" }, f:metadata())
    local dst = shard.empty({ 3 })
    f:read("w", dst, 2, 3)
    assert.same({ 3, 4, 5 }, dst:tolist_flat())
    local whole = shard.empty({ 2, 3 })
    f:read("w", whole)
    assert.same({ 1, 2, 3, 4, 5, 6 }, whole:tolist_flat())
    assert.has_error(function() f:read("w", dst, 4, 3) end,
      ("safetensors: %s: tensor 'w': 3 elements from element 4 are outside its 6"):format(path))
    assert.has_error(function() f:read("q", shard.empty({ 2 }), 0, 2) end,
      ("safetensors: %s: tensor 'q': dtype I8 has no shard equivalent"):format(path))
    local ok, err = pcall(f.read, f, "w", shard.empty({ 3 }, { dtype = "bf16" }), 0, 3)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("needs a contiguous cpu f32 tensor of 3 elements, got bf16[3] cpu", 1, true))
    assert.has_error(function() f:read("zz", dst) end, ("safetensors: %s: no tensor 'zz'"):format(path))
    f:close()
    f:close()
    assert.has_error(function() f:names() end, ("safetensors: %s is closed"):format(path))
    -- S.load refuses the whole file for the I8 tensor it cannot hold
    ok, err = pcall(S.load, path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tensor 'q': dtype I8 has no shard equivalent", 1, true))
    os.remove(path)
  end)

  it("refuses the issue's negative and out-of-range offsets, naming file and tensor", function()
    local body = f32le{ 1, 2 }
    for _, case in ipairs{
      { "[-1099511627776,-1099511627768]", "tensor 'x': data_offsets begin -1099511627776 is negative" },
      { "[-8,0]", "tensor 'x': data_offsets begin -8 is negative" },
      { "[0,-8]", "tensor 'x': data_offsets end -8 is negative" },
      { "[4,12]", "tensor 'x': data_offsets [4, 12] run past the data section's 8 bytes" },
      { "[0,4]", "tensor 'x': F32[2] is 8 bytes but data_offsets [0, 4] hold 4" },
      { "[1e3,1008]", "tensor 'x': data_offsets begin 1e3 is not an integer" },
    } do
      local path = write(tmp(), '{"x":{"dtype":"F32","shape":[2],"data_offsets":' .. case[1] .. '}}', body)
      for _, fn in ipairs{ S.open, S.load } do
        local ok, err = pcall(fn, path)
        assert.is_false(ok)
        assert.truthy(tostring(err):find("safetensors: " .. path .. ": " .. case[2], 1, true), tostring(err))
      end
      os.remove(path)
    end
  end)

  it("round-trips every shard dtype through S.save / S.load with metadata", function()
    local path = tmp()
    local src = {}
    for _, dt in ipairs{ "f64", "f32", "bf16", "f16", "i64", "i32", "u8", "bool" } do
      src[dt] = shard.tensor({ { 1, 0 }, { 1, 1 } }, { dtype = dt })
    end
    src.empty = shard.empty({ 0, 5 })
    src.strided = shard.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):t()
    S.save(path, src, { format = "pt", note = "a \"quoted\"\nline" })
    local back, meta = S.load(path)
    assert.same({ format = "pt", note = "a \"quoted\"\nline" }, meta)
    for name, t in pairs(src) do
      assert.equal(t:dtype(), back[name]:dtype())
      assert.same(t:shape(), back[name]:shape())
      assert.same(t:tolist_flat(), back[name]:tolist_flat())
    end
    os.remove(path)
  end)

  it("removes the temporaries of a save killed before its rename, and only those", function()
    local path = tmp()
    -- pid 4194305 is above Linux's largest pid (2^22): that process is gone
    local stale, live = path .. ".tmp.4194305.1", path .. ".tmp.1.1"   -- pid 1 is alive
    for _, p in ipairs { stale, live } do local f = io.open(p, "wb"); f:write("partial"); f:close() end
    S.save(path, { x = shard.ones({ 2 }) })
    assert.is_nil(io.open(stale, "rb"))
    local f = io.open(live, "rb")
    assert.is_truthy(f)
    f:close()
    os.remove(live); os.remove(path)
  end)

  describe("shard.load is all or nothing", function()
    local CFG = { n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 5, block_size = 4 }

    local function snapshot(model)
      local out = {}
      for _, np in ipairs(model:named_parameters()) do out[np.name] = np.tensor:tolist_flat() end
      return out
    end

    -- A state dict of `donor` with `edit(dict, names)` applied, saved; returns the path.
    local function file_from(donor, edit)
      local dict = require("shard.io.state_dict").state_dict(donor)
      local names = {}
      for _, np in ipairs(donor:named_parameters()) do names[#names + 1] = np.name end
      edit(dict, names)
      local path = tmp()
      S.save(path, dict)
      return path
    end

    local function refused_untouched(path, want)
      shard.manual_seed(2)
      local model = shard.nn.GPT(CFG)
      local before = snapshot(model)
      local ok, err = pcall(shard.load, model, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(want, 1, true), tostring(err))
      assert.same(before, snapshot(model))
      os.remove(path)
    end

    it("leaves the model untouched when the last parameter has the wrong shape", function()
      shard.manual_seed(1)
      local donor = shard.nn.GPT(CFG)
      local last
      local path = file_from(donor, function(dict, names)
        last = names[#names]
        dict[last] = shard.zeros({ 3 })
      end)
      refused_untouched(path, ("'%s' is 3 in the file but"):format(last))
    end)

    it("leaves the model untouched when a parameter is missing or one is extra", function()
      shard.manual_seed(1)
      local donor = shard.nn.GPT(CFG)
      local gone
      refused_untouched(file_from(donor, function(dict, names) gone = names[#names]; dict[gone] = nil end),
        ("no tensor '%s'"):format(gone))
      refused_untouched(file_from(donor, function(dict) dict["zz.extra"] = shard.zeros({ 1 }) end),
        "holds tensors the model lacks: zz.extra")
    end)

    it("leaves the model untouched when a dtype cannot be loaded", function()
      shard.manual_seed(1)
      local donor = shard.nn.GPT(CFG)
      local last
      refused_untouched(file_from(donor, function(dict, names)
        last = names[#names]
        dict[last] = dict[last]:to("i32")
      end), ("'%s' is i32 in the file but f32 in the model"):format(last))
    end)

    it("leaves the model untouched when the header is malformed", function()
      local path = write(tmp(), '{"transformer.wte.weight":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}', f32le{ 1, 2 })
      refused_untouched(path, "data_offsets begin -8 is negative")
    end)
  end)
end)
