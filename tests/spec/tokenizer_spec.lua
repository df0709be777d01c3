-- shard.tokenizer against Hugging Face `tokenizers`: two tiny byte-level BPEs trained by
-- tests/fixtures/make_tokenizer_fixtures.py (GPT-2's pre-tokenizer; Llama 3's split regex with
-- ignore_merges) and a corpus (scripts, emoji, combining marks, Unicode spaces, whitespace runs
-- with \r\n and tabs, digits of many lengths, contractions in every case, special tokens) with
-- the ids and the pre-tokenizer splits `tokenizers` gave. The full GPT-2 and cl100k vocabularies
-- are checked outside make test (tests/tokenizer/check_full.sh).
local T = require("shard.tokenizer")
local cjson = require("cjson")

local DIR = "tests/fixtures/tokenizer/"

local function read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end
local function write(path, text)
  local f = assert(io.open(path, "wb")); f:write(text); f:close(); return path
end

local fixture = cjson.decode(read(DIR .. "corpus.json"))
local KINDS = { "gpt2", "llama3" }

-- The first index where two id lists differ, with both, for a readable failure.
local function same_ids(got, want, what)
  for k = 1, math.max(#got, #want) do
    if got[k] ~= want[k] then
      error(("%s: id %d is %s, tokenizers gives %s\n  got  %s\n  want %s"):format(what, k, tostring(got[k]),
        tostring(want[k]), table.concat(got, ","), table.concat(want, ",")), 2)
    end
  end
end

describe("tokenizer", function()
  for _, kind in ipairs(KINDS) do
    local tok = T.load(DIR .. kind)

    it(kind .. ": encode gives tokenizers' ids for every text of the corpus", function()
      for i, text in ipairs(fixture.texts) do same_ids(tok:encode(text), fixture[kind][i], ("%s text %d %q"):format(kind, i, text)) end
    end)

    it(kind .. ": with special tokens as text, encode gives the ids of the file without them", function()
      for i, text in ipairs(fixture.texts) do
        same_ids(tok:encode(text, { allowed_special = "none" }), fixture[kind .. "_ordinary"][i], ("%s text %d %q"):format(kind, i, text))
      end
    end)

    it(kind .. ": the pre-tokenizer splits where tokenizers' does", function()
      for i, text in ipairs(fixture.texts) do
        same_ids(tok:split_ends(text), fixture[kind .. "_splits"][i], ("%s splits of text %d %q"):format(kind, i, text))
      end
    end)

    it(kind .. ": decode(encode(x)) == x, invalid UTF-8 included", function()
      for _, text in ipairs(fixture.texts) do assert.equal(text, tok:decode(tok:encode(text))) end
      for _, text in ipairs { "\255\254 bytes \192\128 \237\160\128 \244\144\128\128 \226\130", "\xe2\x82\xac\xe2" } do
        assert.equal(text, tok:decode(tok:encode(text)))
        assert.equal(text, tok:decode(tok:encode(text, { allowed_special = "none" })))
      end
    end)

    it(kind .. ": the empty string, and whitespace runs of 100,000", function()
      assert.same({}, tok:encode(""))
      assert.equal("", tok:decode({}))
      for _, ws in ipairs { " ", "\n", "\t", " \n" } do
        local text = ws:rep(100000 / #ws) .. "x"
        assert.equal(text, tok:decode(tok:encode(text)))
      end
    end)

    it(kind .. ": encode as a tensor of i32", function()
      local ids = tok:encode("Hello world", { tensor = true })
      local want = tok:encode("Hello world")
      assert.equal(#want, ids:numel())
      assert.equal("i32", ids:dtype())
      ids:free()
    end)
  end

  it("names special tokens, BOS and EOS from added_tokens", function()
    local gpt2, llama = T.load(DIR .. "gpt2"), T.load(DIR .. "llama3")
    assert.equal("<|endoftext|>", gpt2.eos)
    assert.equal(gpt2:token_id("<|endoftext|>"), gpt2.eos_id)
    assert.is_nil(gpt2.bos)
    assert.equal(llama:token_id("<|begin_of_text|>"), llama.bos_id)
    assert.equal(llama:token_id("<|end_of_text|>"), llama.eos_id)
    assert.same({ llama.bos_id }, llama:encode("<|begin_of_text|>"))
    assert.equal("<|eot_id|>", llama:token(llama:token_id("<|eot_id|>")))
    assert.is_nil(llama:token_id("no such token"))
    assert.equal(657, gpt2.vocab_size)
  end)

  it("refuses special tokens when asked, naming the token and where it is", function()
    local tok = T.load(DIR .. "gpt2/tokenizer.json")
    local ok, err = pcall(tok.encode, tok, "abc <|endoftext|>", { allowed_special = "none", disallowed_special = "raise" })
    assert.is_false(ok)
    assert.matches("special token '<|endoftext|>' at byte 4", err, 1, true)
    assert.same(tok:encode("abc"), tok:encode("abc", { allowed_special = "none", disallowed_special = "raise" }))
    assert.has_error(function() tok:encode("x", { allowed_special = "some" }) end)
  end)

  it("refuses ids that are no token in decode", function()
    local tok = T.load(DIR .. "gpt2")
    local ok, err = pcall(tok.decode, tok, { 1, 5000 })
    assert.is_false(ok)
    assert.matches("id 5000 (at 1) is no token", err, 1, true)
  end)

  describe("bad files", function()
    local good = read(DIR .. "gpt2/tokenizer.json")
    local function load_text(text)
      local path = write(os.tmpname(), text)
      local ok, err = pcall(T.load, path)
      os.remove(path)
      assert.is_false(ok)
      assert.matches(path, err, 1, true)
      return err
    end
    local function edited(fn)
      local doc = cjson.decode(good)
      fn(doc)
      return cjson.encode(doc)
    end

    it("not JSON", function() assert.matches("not JSON", load_text("{ nope")) end)
    it("a missing file", function()
      assert.has_error(function() T.load("/nonexistent/tokenizer.json") end, "shard.tokenizer: cannot read /nonexistent/tokenizer.json: /nonexistent/tokenizer.json: No such file or directory")
    end)
    it("not BPE", function()
      assert.matches("model type WordPiece", load_text(edited(function(d) d.model.type = "WordPiece" end)), 1, true)
    end)
    it("missing merges", function()
      assert.matches("model.merges missing", load_text(edited(function(d) d.model.merges = nil end)), 1, true)
    end)
    it("an unknown split regex", function()
      local err = load_text(edited(function(d)
        d.pre_tokenizer = { type = "Sequence", pretokenizers = {
          { type = "Split", pattern = { Regex = "\\p{N}| ?\\p{L}+" }, behavior = "Isolated", invert = false },
          { type = "ByteLevel", add_prefix_space = false, use_regex = false } } }
      end))
      assert.matches("unsupported: Split pattern", err, 1, true)
    end)
    it("a normalizer, add_prefix_space", function()
      assert.matches("normalizer NFC", load_text(edited(function(d) d.normalizer = { type = "NFC" } end)), 1, true)
      assert.matches("add_prefix_space = true", load_text(edited(function(d) d.pre_tokenizer.add_prefix_space = true end)), 1, true)
    end)
    it("a merge whose tokens are not in the vocabulary", function()
      local err = load_text(edited(function(d) d.model.merges[3] = { "zq", "Q" } end))
      assert.matches("merge 2 ('zq' 'Q'): the left token is not in the vocabulary", err, 1, true)
    end)
  end)
end)
