-- Character data: nanoGPT's shakespeare_char preparation and the batch sampler.
local shard = require("shard")
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

  it("fingerprints a text with 64-bit FNV-1a (the published vectors)", function()
    assert.equal("cbf29ce484222325", data.fingerprint(""))
    assert.equal("af63dc4c8601ec8c", data.fingerprint("a"))
    assert.equal("85944171f73967e8", data.fingerprint("foobar"))
  end)

  it("keeps each corpus's token files in a folder of its own, and rewrites them only when the text changed", function()
    local root = dir .. "_root"
    assert.equal(root .. "/tinyshakespeare", data.corpus_dir(root, "/x/y/tinyshakespeare.txt"))
    assert.equal(root .. "/GPL-3", data.corpus_dir(root, "/usr/share/common-licenses/GPL-3"))
    assert.equal(root .. "/a_b_", data.corpus_dir(root, "/tmp/a b$.txt"))
    local a, b = dir .. "_a.txt", dir .. "_b.txt"
    write(a, "abcabcabc\n"); write(b, "xyzxyz\n")
    local da, db = data.corpus_dir(root, a), data.corpus_dir(root, b)
    assert.are_not.equal(da, db)
    local _, _, _, current = data.prepare_char(a, da)
    assert.is_false(current)
    data.prepare_char(b, db)
    assert.equal(4, data.load_meta(da .. "/meta.lua").vocab_size)   -- b's preparation left a's files alone
    local before = io.open(da .. "/train.bin", "rb"):read("*a")
    _, _, _, current = data.prepare_char(a, da)
    assert.is_true(current)                                           -- same text: nothing written
    local other_path = (a:gsub("^/tmp/", "/tmp/../tmp/"))
    _, _, _, current = data.prepare_char(other_path, da)
    assert.is_true(current)                                           -- the same file by another path
    write(a, "abcdabcd\n")
    local tok
    tok, _, _, current = data.prepare_char(a, da)
    assert.is_false(current)
    assert.equal(5, tok.vocab_size)
    assert.are_not.equal(before, io.open(da .. "/train.bin", "rb"):read("*a"))
  end)

  it("refuses to replace another corpus's token files, and refuses an empty corpus by name", function()
    local other = dir .. "_other.txt"
    write(other, "hello\n")
    local ok, err = pcall(data.prepare_char, other, dir)   -- dir holds the first test's corpus
    assert.is_false(ok)
    assert.matches("holds the token files of " .. (dir .. ".txt"):gsub("%p", "%%%0") .. ", not of", err)
    local empty = dir .. "_empty.txt"
    write(empty, "")
    ok, err = pcall(data.char_corpus, empty)
    assert.is_false(ok)
    assert.matches("is empty: no characters to train on", err)
  end)

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
