-- Character data: nanoGPT's shakespeare_char preparation and the batch sampler.
local shard = require "shard"
local data = shard.data

local function write(path, text) local f = assert(io.open(path, "wb")); f:write(text); f:close() end

describe("char data", function()
  local dir = os.tmpname() .. "_data"

  it("prepares sorted-unique vocabulary, a 90/10 split and uint16 token files", function()
    local text = "hello world\nthe quick brown fox\n"
    write(dir .. ".txt", text)
    local tok, ntrain, nval = data.prepare_char(dir .. ".txt", dir)
    assert.equal(#text, ntrain + nval)
    assert.equal(math.floor(#text * 0.9), ntrain)
    assert.equal(" ", tok.itos[2])                     -- "\n" (10) < " " (32) < letters
    assert.equal(text, tok.decode(tok.encode(text)))
    local meta = data.load_meta(dir .. "/meta.lua")
    assert.equal(tok.vocab_size, meta.vocab_size)
    local train = data.load_tokens(dir .. "/train.bin")
    assert.equal(ntrain, train.n)
    assert.equal(tok.stoi["h"], train.buf[0])
  end)

  -- The full corpus is shared with this machine but not committed (CI lacks it), so this
  -- check exists only where the file does; the counts are nanoGPT's published ones.
  local corpus = (os.getenv("SHARD_HOME") or ".") .. "/../shared/data/tinyshakespeare.txt"
  if io.open(corpus, "rb") then
    it("gives 65 characters and nanoGPT's token counts on tinyshakespeare", function()
      local tok, ntrain, nval = data.prepare_char(corpus, dir .. "_shakespeare")
      assert.equal(65, tok.vocab_size)
      assert.equal(1003854, ntrain)
      assert.equal(111540, nval)
    end)
  end

  it("samples the same windows for the same (seed, step) and splits them across ranks", function()
    local toks = data.load_tokens(dir .. "/train.bin")
    local one = data.tokens{ tokens = toks, block = 4, batch = 4, seed = 9 }
    local x1, y1 = one:batch_at(3)
    local again = data.tokens{ tokens = toks, block = 4, batch = 4, seed = 9 }
    local x2 = again:batch_at(3)
    assert.same(x1:tolist(), x2:tolist())
    -- y is x shifted by one token
    local xs, ys = x1:tolist(), y1:tolist()
    for b = 1, 4 do for t = 1, 3 do assert.equal(xs[b][t + 1], ys[b][t]) end end
    -- rank r of 2 gets rows 2r+1 .. 2r+2 of the global batch
    for r = 0, 1 do
      local part = data.tokens{ tokens = toks, block = 4, batch = 4, seed = 9, rank = r, world = 2 }:batch_at(3):tolist()
      assert.same({ xs[2 * r + 1], xs[2 * r + 2] }, part)
    end
    local other = data.tokens{ tokens = toks, block = 4, batch = 4, seed = 9 }:batch_at(4)
    assert.are_not.same(xs, other:tolist())
  end)

  it("refuses a batch that does not split over the ranks, and too little data", function()
    local toks = data.load_tokens(dir .. "/train.bin")
    assert.has_error(function() data.tokens{ tokens = toks, block = 4, batch = 3, world = 2 } end,
      "data: the global batch 3 does not split over 2 ranks")
    assert.has_error(function() data.tokens{ tokens = toks, block = 1000, batch = 1 } end)
  end)
end)
