-- Checkpoints carry checksums (runtime/io/checksum.h): one data byte changed in a rank file of
-- shard.checkpoint or in a shard.save file is refused on load, naming the file and the
-- tensor; verify = false or SHARD_VERIFY_CHECKSUMS=0 loads it anyway; files written before
-- checksums were kept still load. A rank that reads only part of a piece (another layout)
-- still checks the whole piece. Clean round trips: checkpoint_spec, checkpoint_resume_spec.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local shard = require("shard")
local ck = require("shard.checkpoint")
local S = require("shard.io.safetensors")
local json = require("shard.io.json")
local ffi = require("ffi")
local C = shard.C

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  return d
end

local function tiny(seed)
  shard.manual_seed(seed)
  return shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 5, block_size = 4 }
end

local function values(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do out[np.name] = np.tensor:tolist_flat() end
  return out
end

-- Flips bit 4 of byte `byte` (0-based) of tensor `name`'s data in the safetensors file at path.
local function flip(path, name, byte)
  local f = S.open(path)
  local i = C.sh_st_find(f.h, name)
  assert(i >= 0, name .. " is not in " .. path)
  local at = tonumber(C.sh_st_data_offset(f.h) + C.sh_st_at(f.h, i).begin) + byte
  f:close()
  local h = assert(io.open(path, "r+b"))
  h:seek("set", at)
  local c = h:read(1)
  h:seek("set", at)
  h:write(string.char(bit.bxor(c:byte(), 0x10)))
  h:close()
end

describe("shard.save files carry checksums", function()
  local W = "transformer.h.0.mlp.c_fc.weight"

  it("refuses a flipped data byte naming the file and the tensor, and leaves the model as it was", function()
    local path = os.tmpname() .. ".safetensors"
    shard.save(tiny(1), path)
    flip(path, W, 5)
    local m = tiny(2)
    local before = values(m)
    local ok, err = pcall(shard.load, m, path)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find(path .. ": tensor '" .. W .. "' fails its checksum", 1, true), err)
    assert.same(before, values(m))
    os.remove(path)
  end)

  it("loads a flipped byte with verify = false or SHARD_VERIFY_CHECKSUMS=0", function()
    local path = os.tmpname() .. ".safetensors"
    local a = tiny(1)
    shard.save(a, path)
    flip(path, W, 5)
    for _, how in ipairs { "option", "env" } do
      local m = tiny(2)
      if how == "option" then shard.load(m, path, { verify = false })
      else
        ffi.C.setenv("SHARD_VERIFY_CHECKSUMS", "0", 1)
        local ok, err = pcall(shard.load, m, path)
        ffi.C.unsetenv("SHARD_VERIFY_CHECKSUMS")
        assert(ok, err)
      end
      local want, got = values(a), values(m)
      for name, v in pairs(want) do
        if name == W then assert.are_not.same(v, got[name]) else assert.same(v, got[name], name) end
      end
    end
    os.remove(path)
  end)

  it("keeps them in __metadata__ beside the caller's metadata, and loads a file without them", function()
    local path = os.tmpname() .. ".safetensors"
    local a = tiny(1)
    shard.save(a, path, { format = "pt" })
    local dict, meta = S.load(path)
    assert.equal("pt", meta.format)
    local sums = json.decode(meta.crc32c)
    for name, t in pairs(dict) do
      assert.equal(S.crc32c(t), sums[name])
      t:free()
    end
    local ok, err = pcall(shard.save, a, path, { crc32c = "mine" })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("metadata key 'crc32c' is shard's", 1, true), err)
    -- an older file: the same tensors, no checksums
    dict = require("shard.io.state_dict").state_dict(a)
    S.save(path, dict)
    local m = tiny(2)
    shard.load(m, path)
    assert.same(values(a), values(m))
    os.remove(path)
  end)
end)

describe("shard.checkpoint rank files carry checksums", function()
  local W = "transformer.h.0.mlp.c_fc.weight"
  local FILE = "rank-00000-of-00001.safetensors"

  local function saved()
    local dir = tmpdir()
    local m = tiny(1)
    local opt = shard.optim.SGD(m, { lr = 0.1, momentum = 0.9 })
    ck.save(dir, { model = m, optim = opt, step = 1 })
    return dir, m, opt
  end

  it("refuses a flipped byte of a parameter or of optimizer state, naming the file and the tensor", function()
    for _, key in ipairs { "param/" .. W .. "@0", "optim/momentum_buffer/" .. W .. "@0" } do
      local dir = saved()
      flip(dir .. "/step-1/" .. FILE, key, 17)
      local m = tiny(2)
      local ok, err = pcall(ck.load, dir, { model = m, optim = shard.optim.SGD(m, { lr = 0.1, momentum = 0.9 }) })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(dir .. "/step-1/" .. FILE .. ": tensor '" .. key .. "' fails its checksum", 1, true), err)
      assert.is_truthy(tostring(err):find("(rank 0)", 1, true), err)
      C.sh_ckpt_remove_tree(dir)
    end
  end)

  it("loads a flipped byte with verify = false, and a checkpoint from before checksums", function()
    local dir, a = saved()
    local index_path = dir .. "/step-1/index.json"
    -- the index as written before checksums were kept
    local index = json.decode(io.open(index_path, "rb"):read("*a"))
    index.checksum = nil
    for _, p in pairs(index.params) do for _, piece in ipairs(p.pieces) do piece.crc32c = nil end end
    for _, by_name in pairs(index.optim.state) do
      for _, pieces in pairs(by_name) do for _, piece in ipairs(pieces) do piece.crc32c = nil end end
    end
    local f = io.open(index_path, "wb"); f:write(json.encode(index)); f:close()
    local m = tiny(2)
    ck.load(dir, { model = m })
    assert.same(values(a), values(m))
    C.sh_ckpt_remove_tree(dir)

    dir, a = saved()
    flip(dir .. "/step-1/" .. FILE, "param/" .. W .. "@0", 17)
    m = tiny(2)
    ck.load(dir, { model = m, verify = false })
    local want, got = values(a), values(m)
    assert.are_not.same(want[W], got[W])
    want[W], got[W] = nil, nil
    assert.same(want, got)
    C.sh_ckpt_remove_tree(dir)
  end)

  it("is checked whole by a rank that reads only part of a piece (world 1 saved, world 2 loading)", function()
    -- tests/mpi/checkpoint_resume.lua's model saved whole at world 1; at world 2 under
    -- full_shard rank 0 holds c_fc.weight's head and rank 1 its tail. The flipped byte is in
    -- element 0; rank 0 skips the check, so the one refusal is rank 1's, which read only
    -- clean bytes of the piece.
    local dir = tmpdir()
    local script, bin = support.quote(support.ROOT .. "/tests/mpi/checkpoint_resume.lua"), support.quote(support.BIN)
    local out, code = support.run(("env CKPT_MODE=run CKPT_STRATEGY=none CKPT_STEPS=1 CKPT_SAVE_DIR=%s CKPT_SAVE_AT=1 %s run %s")
      :format(support.quote(dir), bin, script))
    assert(code == 0, out)
    local file = dir .. "/step-1/" .. FILE
    flip(file, "param/" .. W .. "@0", 1)
    local mpirun = "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca pml ob1"
    out, code = support.run(("env CKPT_MODE=run CKPT_STRATEGY=full_shard CKPT_STEPS=1 CKPT_FROM=%s %s -np 1 env SHARD_VERIFY_CHECKSUMS=0 %s run %s : -np 1 %s run %s")
      :format(support.quote(dir), mpirun, bin, script, bin, script))
    assert.are_not.equal(0, code)
    assert.is_truthy(out:find(file .. ": tensor 'param/" .. W .. "@0' fails its checksum", 1, true), out)
    assert.is_truthy(out:find("(rank 1)", 1, true), out)
    assert.is_falsy(out:find("(rank 0)", 1, true), out)
    C.sh_ckpt_remove_tree(dir)
  end)
end)
