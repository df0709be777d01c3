-- shard.tokenizer: a Hugging Face tokenizer.json (byte-level BPE, as GPT-2 and Llama 3 ship it)
-- read with lua-cjson and handed to the runtime's BPE (runtime/io/tokenizer.h), which encodes
-- and decodes. tests/spec/tokenizer_spec.lua checks it against ids written by `tokenizers`.
--   local tok = require("shard.tokenizer").load("models/gpt2")   -- a directory or the file
--   local ids = tok:encode("Hello world")                        -- {15496, 995}
--   tok:decode(ids)                                              -- "Hello world"
-- Options of encode: allowed_special = "all" (the default, as `tokenizers` does: special tokens'
-- text becomes their ids) or "none" (their text is encoded as ordinary text, as tiktoken's
-- encode_ordinary); with "none", disallowed_special = "raise" makes such text an error instead
-- (tiktoken's default). tensor = true returns an i32 shard tensor instead of a Lua table.
-- A tokenizer caches words it has encoded: one per thread (Lua state) is the rule.
local ffi = require("ffi")
local cjson = require("cjson")
local rt = require("shard.ffi")
local C, check = rt.C, rt.check

local M = {}
local Tokenizer = {}
Tokenizer.__index = Tokenizer

-- The pre-tokenizer regexes the runtime implements, as tokenizer.json spells them.
local SPLITS = {
  [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]],
  [['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]],
}
local SPLIT_OF = { [SPLITS[1]] = C.SH_BPE_SPLIT_CL100K, [SPLITS[2]] = C.SH_BPE_SPLIT_GPT2 }

local function is_null(v) return v == nil or v == cjson.null end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then error("shard.tokenizer: cannot read " .. path .. ": " .. tostring(err), 3) end
  local text = f:read("*a")
  f:close()
  local ok, doc = pcall(cjson.decode, text)
  if not ok then error(("shard.tokenizer: %s: not JSON (%s)"):format(path, tostring(doc)), 3) end
  if type(doc) ~= "table" then error(("shard.tokenizer: %s: not a JSON object"):format(path), 3) end
  return doc
end

local function describe(v)
  if type(v) ~= "table" then return tostring(v) end
  return tostring(v.type or "an object without a type")
end

-- The split (SH_BPE_SPLIT_*) of a pre_tokenizer, or nil and why it is not supported.
local function byte_level_split(pre)
  if is_null(pre) then return nil, "no pre_tokenizer (byte-level BPE needs ByteLevel)" end
  local function byte_level(p, regex)
    if p.type ~= "ByteLevel" then return nil end
    if p.add_prefix_space == true then return nil, "ByteLevel with add_prefix_space = true" end
    if regex == nil and p.use_regex == false then return nil, "ByteLevel with use_regex = false and no Split before it" end
    return true
  end
  if pre.type == "ByteLevel" then
    local ok, why = byte_level(pre)
    if not ok then return nil, why end
    return C.SH_BPE_SPLIT_GPT2
  end
  local seq = pre.type == "Sequence" and pre.pretokenizers
  if type(seq) ~= "table" or #seq ~= 2 or seq[1].type ~= "Split" then
    return nil, "pre_tokenizer " .. describe(pre) .. " (known: ByteLevel, or Sequence of Split and ByteLevel)"
  end
  local split = seq[1]
  local regex = type(split.pattern) == "table" and split.pattern.Regex
  if not regex or not SPLIT_OF[regex] then
    return nil, "Split pattern " .. cjson.encode(split.pattern) .. " (known: GPT-2's and Llama 3's / cl100k's regexes)"
  end
  if split.behavior ~= "Isolated" or split.invert == true then
    return nil, ("Split behavior %s, invert %s (known: Isolated, false)"):format(tostring(split.behavior), tostring(split.invert))
  end
  local ok, why = byte_level(seq[2], regex)
  if not ok then return nil, why or ("pre_tokenizer %s after the Split (known: ByteLevel)"):format(describe(seq[2])) end
  if seq[2].use_regex ~= false then return nil, "ByteLevel with use_regex = true after a Split" end
  return SPLIT_OF[regex]
end

-- Refuses what the runtime's BPE does not do, naming the file and the field.
local function check_model(path, doc)
  local function bad(why) error(("shard.tokenizer: %s: unsupported: %s"):format(path, why), 4) end
  local model = doc.model
  if type(model) ~= "table" then bad("no model") end
  if model.type ~= "BPE" then bad("model type " .. tostring(model.type) .. " (only BPE)") end
  if type(model.vocab) ~= "table" then bad("model.vocab missing") end
  if type(model.merges) ~= "table" then bad("model.merges missing") end
  if not is_null(doc.normalizer) then bad("normalizer " .. describe(doc.normalizer)) end
  if model.byte_fallback == true then bad("byte_fallback") end
  if not is_null(model.dropout) then bad("dropout " .. tostring(model.dropout)) end
  for _, k in ipairs { "continuing_subword_prefix", "end_of_word_suffix" } do
    if not is_null(model[k]) and model[k] ~= "" then bad(k .. " " .. tostring(model[k])) end
  end
  if not is_null(doc.decoder) and doc.decoder.type ~= "ByteLevel" then bad("decoder " .. describe(doc.decoder) .. " (only ByteLevel)") end
  local split, why = byte_level_split(doc.pre_tokenizer)
  if not split then bad(why) end
  return split
end

-- A runtime status turned into an error naming the file.
local function check_in(path, rc)
  if rc ~= 0 then error(("shard.tokenizer: %s: %s"):format(path, ffi.string(C.sh_last_error())), 4) end
end

local function add_vocab(h, path, vocab)
  for token, id in pairs(vocab) do
    if type(id) ~= "number" then error(("shard.tokenizer: %s: vocab entry '%s' is not an id"):format(path, token), 4) end
    check_in(path, C.sh_bpe_add_token(h, token, #token, id))
  end
end

local function add_merges(h, path, merges)
  for i, m in ipairs(merges) do
    local a, b
    if type(m) == "string" then a, b = m:match("^([^ ]+) ([^ ]+)$")
    elseif type(m) == "table" then a, b = m[1], m[2] end
    if type(a) ~= "string" or type(b) ~= "string" then
      error(("shard.tokenizer: %s: merge %d is not \"left right\" nor [left, right]"):format(path, i), 4)
    end
    check_in(path, C.sh_bpe_add_merge(h, a, #a, b, #b))
  end
end

local function add_specials(tok, path, added)
  if is_null(added) then return end
  for _, t in ipairs(added) do
    for _, k in ipairs { "lstrip", "rstrip", "single_word" } do
      if t[k] == true then error(("shard.tokenizer: %s: unsupported: added token '%s' with %s"):format(path, t.content, k), 4) end
    end
    check_in(path, C.sh_bpe_add_special(tok.handle, t.content, #t.content, t.id))
    tok.added[t.content] = t.id
  end
end

-- The file of dir_or_file: itself, or DIR/tokenizer.json.
local function resolve(dir_or_file)
  local f = io.open(dir_or_file .. "/tokenizer.json", "rb")
  if f then f:close(); return dir_or_file .. "/tokenizer.json" end
  return dir_or_file
end

-- BOS and EOS by the names model families give them among the added tokens.
local BOS = { "<|begin_of_text|>", "<s>", "<|startoftext|>" }
local EOS = { "<|end_of_text|>", "<|endoftext|>", "</s>", "<|eot_id|>" }
local function first_of(added, names)
  for _, n in ipairs(names) do if added[n] then return added[n], n end end
end

function M.load(dir_or_file)
  local path = resolve(assert(dir_or_file, "shard.tokenizer.load: a directory or a tokenizer.json"))
  local doc = read_json(path)
  local split = check_model(path, doc)
  local pp = ffi.new("sh_bpe *[1]")
  check(C.sh_bpe_create(pp, split, doc.model.ignore_merges == true and 1 or 0), 2)
  local tok = setmetatable({ handle = ffi.gc(pp[0], C.sh_bpe_free), path = path, added = {} }, Tokenizer)
  add_vocab(tok.handle, path, doc.model.vocab)
  add_merges(tok.handle, path, doc.model.merges)
  add_specials(tok, path, doc.added_tokens)
  tok.vocab_size = tonumber(C.sh_bpe_vocab_size(tok.handle))
  tok.split = split == C.SH_BPE_SPLIT_GPT2 and "gpt2" or "cl100k"
  tok.bos_id, tok.bos = first_of(tok.added, BOS)
  tok.eos_id, tok.eos = first_of(tok.added, EOS)
  return tok
end

local function special_mode(opts)
  local allowed = opts and opts.allowed_special
  if allowed == nil or allowed == "all" then return C.SH_BPE_SPECIAL_ALLOW end
  if allowed ~= "none" and allowed ~= false then
    error("shard.tokenizer: allowed_special is \"all\" or \"none\", got " .. tostring(allowed), 3)
  end
  return opts.disallowed_special == "raise" and C.SH_BPE_SPECIAL_REFUSE or C.SH_BPE_SPECIAL_TEXT
end

-- The ids of text as an int32_t array and their count (the array holds #text + 1 slots).
function Tokenizer:encode_raw(text, opts)
  if type(text) ~= "string" then error("shard.tokenizer: encode expects a string, got " .. type(text), 2) end
  local ids, n = ffi.new("int32_t[?]", #text + 1), ffi.new("int64_t[1]")
  check(C.sh_bpe_encode(self.handle, text, #text, special_mode(opts), ids, #text + 1, n), 2)
  return ids, tonumber(n[0])
end

function Tokenizer:encode(text, opts)
  local ids, n = self:encode_raw(text, opts)
  if opts and opts.tensor then
    local t = require("shard.tensor").empty({ n }, { dtype = "i32", device = "cpu" })
    if n > 0 then ffi.copy(t:data_ptr(), ids, n * 4) end
    return t
  end
  local out = {}
  for i = 1, n do out[i] = ids[i - 1] end
  return out
end

-- ids: a Lua table of ids, or an int32_t pointer with n.
function Tokenizer:decode(ids, n)
  local buf = ids
  if type(ids) == "table" then
    n = #ids
    buf = ffi.new("int32_t[?]", math.max(n, 1))
    for i = 1, n do buf[i - 1] = ids[i] end
  end
  local cap = n * tonumber(C.sh_bpe_max_token_bytes(self.handle))
  local out, len = ffi.new("char[?]", math.max(cap, 1)), ffi.new("int64_t[1]")
  check(C.sh_bpe_decode(self.handle, buf, n, out, cap, len), 2)
  return ffi.string(out, len[0])
end

-- The id of a token given by its text (raw bytes; a special token's content too), or nil.
function Tokenizer:token_id(text)
  local id = C.sh_bpe_token_id(self.handle, text, #text)
  if id >= 0 then return tonumber(id) end
end

-- The byte offsets where the pre-tokenizer's splits of text end (special tokens not cut out).
function Tokenizer:split_ends(text)
  local ends, i = {}, 0
  while i < #text do
    i = tonumber(C.sh_bpe_split_end(self.handle, text, #text, i))
    ends[#ends + 1] = i
  end
  return ends
end

-- The raw bytes of the token id, or nil.
function Tokenizer:token(id)
  local len = ffi.new("int64_t[1]")
  local p = C.sh_bpe_token_bytes(self.handle, id, len)
  if p ~= nil then return ffi.string(p, len[0]) end
end

return M
