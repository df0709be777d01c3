-- shard.data.prepare: a text and a BPE tokenizer into nanoGPT's token files. The ids must be
-- exactly one encode of the whole text, however many pieces and workers share it.
local shard = require("shard")
local ffi = require("ffi")
local cjson = require("cjson")
local P = require("shard.data.prepare")
local tokenizer = require("shard.tokenizer")

local ROOT = os.getenv("SHARD_HOME") or "."
local GPT2 = ROOT .. "/tests/fixtures/tokenizer/gpt2"
local LLAMA3 = ROOT .. "/tests/fixtures/tokenizer/llama3"
local GPL = "/usr/share/common-licenses/GPL-3"

local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end
local function write(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end
local function tmpdir() local d = os.tmpname(); os.remove(d); return d end

-- A text full of the places a careless cut would change: runs of newlines and spaces before
-- letters, CRLF, punctuation before newlines, digits, non-ASCII letters and spaces, special
-- tokens' text next to newlines, contractions.
local function tricky_text()
  local parts = {}
  local pieces = { "The end.\nNext line", "\n\nTwo newlines\n\n\nthree", "  \nspaces first\n", "x\r\nCRLF\r\nDone",
                   "it's\nThey'll\n'S", "<|endoftext|>\nAfter", "before\n<|endoftext|>Word", "123\n456\nabc\n",
                   "caf\195\169\n\195\169t\195\169", "a\194\160\nb", "tab\t\nTab", "end!\n\tindented", "(x)\nY\n" }
  for i = 1, 300 do parts[i] = pieces[(i * 7) % #pieces + 1] .. (" word%d"):format(i) end
  return table.concat(parts, "\n")
end

local function ids_bytes(ids, ctype, size)
  local buf = ffi.new(ctype .. "[?]", math.max(#ids, 1))
  for i, id in ipairs(ids) do buf[i - 1] = id end
  return ffi.string(buf, #ids * size)
end

describe("data.prepare", function()
  local gpl = read(GPL)
  local gpt2 = tokenizer.load(GPT2)

  it("picks uint16 while every id fits, else uint32", function()
    assert.equal("uint16", P.dtype_of(657))
    assert.equal("uint16", P.dtype_of(50257))
    assert.equal("uint16", P.dtype_of(65536))
    assert.equal("uint32", P.dtype_of(65537))
    assert.equal("uint32", P.dtype_of(128256))
  end)

  for _, case in ipairs { { "gpt2", GPT2 }, { "llama3", LLAMA3 } } do
    it("gives the bytes of one serial encode from any pieces and workers (" .. case[1] .. ")", function()
      local tok = tokenizer.load(case[2])
      for _, text in ipairs { gpl, tricky_text() } do
        local whole = ids_bytes(tok:encode(text), "uint16_t", 2)
        local serial, n1 = P.encode_parallel(tok, text, { workers = 1, chunk_bytes = #text + 1 })
        assert.equal(1, n1)
        assert.is_true(serial == whole)
        for _, o in ipairs { { workers = 1, chunk_bytes = 50 }, { workers = 2, chunk_bytes = 333 },
                             { workers = 3, chunk_bytes = 97 }, { workers = 4, chunk_bytes = 1 } } do
          local par, pieces, workers = P.encode_parallel(tok, text, o)
          assert.is_true(pieces > 10, "too few pieces to prove anything: " .. pieces)
          assert.equal(o.workers, workers)
          assert.is_true(par == whole, ("%d workers, %d-byte pieces: the ids differ"):format(o.workers, o.chunk_bytes))
        end
      end
    end)
  end

  it("cuts only where the splits cannot change", function()
    local text = "a.\nBc\n\nDe  \nFg\nH\n\n"
    local starts = P.boundaries(text, 1, {})
    assert.same({ 1, 4, 16 }, starts)   -- "a.\n|Bc", "g\n|H": a visible character, one newline, a letter
    assert.same({ 1 }, P.boundaries("end.\nThe", 1, { ".\nTh" }))   -- a special token across the cut
    assert.same({ 1 }, P.boundaries("no newline at all", 1, {}))
  end)

  it("writes train.bin, val.bin and meta.json: a 90/10 split that decodes to the text", function()
    local dir = tmpdir()
    local meta, current = shard.data.prepare{ text = GPL, tokenizer = GPT2, out = dir, workers = 2, chunk_bytes = 4096 }
    assert.is_false(current)
    assert.equal(2, meta.workers)
    local n = meta.tokens
    assert.equal(math.floor(n * 0.9), meta.train_tokens)
    assert.equal(n - meta.train_tokens, meta.val_tokens)
    assert.equal(2 * meta.train_tokens, #read(dir .. "/train.bin"))
    assert.equal(2 * meta.val_tokens, #read(dir .. "/val.bin"))
    local disk = cjson.decode(read(dir .. "/meta.json"))
    for _, k in ipairs { "vocab_size", "dtype", "tokenizer", "source", "tokens", "train_tokens", "val_tokens", "fingerprint" } do
      assert.equal(meta[k], disk[k], k)
    end
    assert.equal(657, disk.vocab_size)
    assert.equal("uint16", disk.dtype)
    assert.equal(gpt2.path, disk.tokenizer)
    local m, train, val = shard.data.load_prepared(dir)
    assert.equal(meta.train_tokens, train.n)
    assert.equal(meta.val_tokens, val.n)
    local ids = {}
    for i = 0, train.n - 1 do ids[#ids + 1] = train.buf[i] end
    for i = 0, val.n - 1 do ids[#ids + 1] = val.buf[i] end
    assert.equal(gpl, gpt2:decode(ids))
    assert.equal(m.fingerprint, shard.data.fingerprint(gpl))
    -- the same text again: up to date, nothing written
    local again, up = shard.data.prepare{ text = GPL, tokenizer = GPT2, out = dir }
    assert.is_true(up)
    assert.equal(meta.fingerprint, again.fingerprint)
  end)

  it("splits as val_fraction says, and writes again when it changes", function()
    local dir = tmpdir()
    local a = shard.data.prepare{ text = GPL, tokenizer = gpt2, out = dir, workers = 1 }
    local b, current = shard.data.prepare{ text = GPL, tokenizer = gpt2, out = dir, val_fraction = 0.25, workers = 3 }
    assert.is_false(current)
    assert.equal(a.tokens, b.tokens)
    assert.equal(math.floor(b.tokens * 0.75), b.train_tokens)
    local c = shard.data.prepare{ text = GPL, tokenizer = gpt2, out = dir, val_fraction = 0, workers = 2 }
    assert.equal(c.tokens, c.train_tokens)
    assert.equal(0, #read(dir .. "/val.bin"))
  end)

  it("writes uint32 for a vocabulary beyond 65536, which load_tokens reads back", function()
    local big = setmetatable({ vocab_size = 70000 }, { __index = gpt2 })
    local dir = tmpdir()
    local meta = shard.data.prepare{ text = GPL, tokenizer = big, out = dir, workers = 2, chunk_bytes = 5000 }
    assert.equal("uint32", meta.dtype)
    assert.equal(4 * meta.train_tokens, #read(dir .. "/train.bin"))
    local want = gpt2:encode(gpl)
    local _, train, val = shard.data.load_prepared(dir)
    assert.equal(#want, train.n + val.n)
    for i = 0, train.n - 1, 97 do assert.equal(want[i + 1], train.buf[i]) end
    assert.equal(want[#want], val.buf[val.n - 1])
    assert.is_true(read(dir .. "/train.bin") .. read(dir .. "/val.bin") == ids_bytes(want, "uint32_t", 4))
  end)

  it("names what is wrong with its inputs", function()
    local dir = tmpdir()
    local function fails(o, pattern)
      local ok, err = pcall(shard.data.prepare, o)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pattern), tostring(err))
    end
    fails(nil, "expected a table")
    fails({ tokenizer = GPT2 }, "text: a path")
    fails({ text = GPL }, "tokenizer: a directory")
    fails({ text = dir .. "/missing.txt", tokenizer = GPT2 }, "missing.txt")
    local empty = os.tmpname()
    write(empty, "")
    fails({ text = empty, tokenizer = GPT2 }, "is empty")
    fails({ text = GPL, tokenizer = dir .. "/no-tokenizer", out = dir }, "no%-tokenizer")
    fails({ text = GPL, tokenizer = GPT2, val_fraction = 1 }, "val_fraction")
    fails({ text = GPL, tokenizer = GPT2, workers = 0 }, "workers")
    fails({ text = GPL, tokenizer = GPT2, chunk_bytes = 0 }, "chunk_bytes")
    -- a worker's failure comes back as its message
    fails({ text = GPL, tokenizer = GPT2, out = dir, workers = 2, chunk_bytes = 4096, allowed_special = "bogus" }, "allowed_special")
    local ok, err = pcall(shard.data.load_prepared, dir .. "/nothing")
    assert.is_false(ok)
    assert.is_truthy(err:find("no meta.json"), err)
    write(dir .. ".odd", "abc")
    ok, err = pcall(shard.data.load_tokens, dir .. ".odd", "uint16")
    assert.is_false(ok)
    assert.is_truthy(err:find("3 bytes, not a whole number of uint16 tokens"), err)
  end)
end)
