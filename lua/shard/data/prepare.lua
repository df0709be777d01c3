-- shard.data.prepare: a text file encoded by a BPE tokenizer (shard.tokenizer) into nanoGPT's
-- token files, in parallel:
--   local meta = shard.data.prepare{ text = "input.txt", tokenizer = "models/gpt2", out = "data/input" }
--   -- out/train.bin, out/val.bin: raw little-endian token ids, uint16 when every id fits
--   -- (vocab_size <= 65536), else uint32; out/meta.json: vocab_size, dtype, the counts, ...
-- Options: text (a path), tokenizer (a directory, a tokenizer.json, or a loaded tokenizer),
-- out (the folder; default: beside the text, named after it), val_fraction (0.1: the last
-- tenth of the tokens is val.bin, nanoGPT's split), workers (processes; default: the CPUs
-- online), chunk_bytes (the text's pieces; default about 4 a worker, 16 KiB to 1 MiB), allowed_special (as tok:encode's, "all").
-- Returns meta (the table meta.json holds) and whether the files were up to date already
-- (the same text by its fingerprint, the same tokenizer and split: nothing is written).
--
-- Parallelism: the text is cut into pieces of about chunk_bytes at safe boundaries, and
-- `workers` forked processes (each with its own copy of the tokenizer, as one handle per
-- thread requires) encode contiguous runs of pieces into part files, which the parent joins
-- in order. A boundary is a position whose byte is an ASCII letter, after a single "\n" after
-- a visible ASCII character (as in "end.\nNext"): both pre-tokenizers (GPT-2's and Llama 3's
-- regex) split there, and the pieces around it are the same whether the text goes on or ends
-- there (a longer run of whitespace would not be: "\n\n" before a letter is two pieces, at
-- the end of a text one), and no special token spans it. So the ids are exactly those of one
-- encode of the whole text (tests/spec/data_prepare_spec.lua compares the bytes). A text
-- without such a place is one piece, encoded by one worker.
local ffi = require("ffi")
local cjson = require("cjson")
local rt = require("shard.ffi")
local files = require("shard.files")

for _, decl in ipairs { "int fork(void);", "void _exit(int status);", "long sysconf(int name);",
                        "int waitpid(int pid, int *status, int options);", "char *strerror(int errnum);" } do
  pcall(ffi.cdef, decl)   -- one declared already (by another module) is no error
end
local C = ffi.C
local SC_NPROCESSORS_ONLN = 84   -- glibc

local M = {}

local function fail(fmt, ...) error("data.prepare: " .. fmt:format(...), 0) end

-- The dtype of the token files for a vocabulary: uint16 when every id fits, else uint32.
function M.dtype_of(vocab_size)
  return vocab_size <= 65536 and "uint16" or "uint32"
end
local CTYPE = { uint16 = "uint16_t", uint32 = "uint32_t" }
local SIZE = { uint16 = 2, uint32 = 4 }
M.CTYPE, M.SIZE = CTYPE, SIZE

-- Whether a special token's text covers both bytes pos - 1 and pos (1-based: pos starts a piece).
local function special_spans(text, pos, specials)
  for _, s in ipairs(specials) do
    local from = math.max(1, pos - #s + 1)
    local i = text:find(s, from, true)
    while i and i < pos do
      if i + #s > pos then return true end
      i = text:find(s, i + 1, true)
    end
  end
  return false
end

-- The 1-based start of each piece of text: 1, then boundaries about every chunk_bytes.
function M.boundaries(text, chunk_bytes, specials)
  local starts = { 1 }
  local want = 1 + chunk_bytes
  while want <= #text do
    local at
    local from = want - 1
    while true do
      local s = text:find("[%w%p]\n[A-Za-z]", from)
      if not s then break end
      if not special_spans(text, s + 2, specials) then at = s + 2; break end
      from = s + 1
    end
    if not at then break end
    starts[#starts + 1] = at
    want = at + chunk_bytes
  end
  return starts
end

-- The ids of text[a, b) (1-based, b exclusive) as bytes in dtype.
local function encode_bytes(tok, text, a, b, dtype, opts)
  local ids, n = tok:encode_raw(text:sub(a, b - 1), opts)
  if dtype == "uint32" then return ffi.string(ids, n * 4), n end
  local out = ffi.new("uint16_t[?]", math.max(n, 1))
  local limit = 65535
  for i = 0, n - 1 do
    local id = ids[i]
    if id > limit then fail("token id %d does not fit uint16", id) end
    out[i] = id
  end
  return ffi.string(out, n * 2), n
end

local function write_all(path, s)
  local f, err = io.open(path, "wb")
  if not f then fail("cannot write %s", tostring(err)) end
  f:write(s)
  f:close()
end

-- Encodes pieces [first, last] (indices into starts) into path; in a child, exits.
local function encode_run(tok, text, starts, first, last, dtype, opts, path)
  local f = assert(io.open(path, "wb"))
  for k = first, last do
    local b = starts[k + 1] or (#text + 1)
    f:write((encode_bytes(tok, text, starts[k], b, dtype, opts)))
  end
  f:close()
end

-- The ids of the whole text, as one string of dtype bytes, encoded by up to `workers`
-- processes. Exposed for the tests (parallel against serial).
function M.encode_parallel(tok, text, o)
  local dtype = o.dtype or M.dtype_of(tok.vocab_size)
  local specials = {}
  for content in pairs(tok.added or {}) do specials[#specials + 1] = content end
  local starts = M.boundaries(text, o.chunk_bytes or 1048576, specials)
  local enc_opts = { allowed_special = o.allowed_special }
  local workers = math.max(1, math.min(o.workers or 1, #starts))
  if workers == 1 then
    local parts = {}
    for k = 1, #starts do parts[k] = encode_bytes(tok, text, starts[k], starts[k + 1] or (#text + 1), dtype, enc_opts) end
    return table.concat(parts), #starts, 1
  end
  local tmp = (o.tmp or os.tmpname())
  local pids, paths = {}, {}
  local per = math.ceil(#starts / workers)
  io.stdout:flush(); io.stderr:flush()
  for w = 1, workers do
    local first, last = (w - 1) * per + 1, math.min(w * per, #starts)
    if first > last then break end
    paths[w] = ("%s.part%d"):format(tmp, w)
    local pid = C.fork()
    if pid < 0 then fail("fork: %s", ffi.string(C.strerror(ffi.errno()))) end
    if pid == 0 then   -- the child: encode, write, leave without running the parent's exit handlers
      collectgarbage("stop")
      local ok, err = pcall(encode_run, tok, text, starts, first, last, dtype, enc_opts, paths[w])
      if not ok then pcall(write_all, paths[w] .. ".err", tostring(err)) end
      C._exit(ok and 0 or 1)
    end
    pids[w] = pid
  end
  local st = ffi.new("int[1]")
  local errs, parts = {}, {}
  for w, pid in ipairs(pids) do
    C.waitpid(pid, st, 0)
    local status = st[0]
    if status ~= 0 then
      local msg = files.read_file(paths[w] .. ".err")
      errs[#errs + 1] = msg or ("worker %d ended with status %d"):format(w, status)
    else
      parts[w] = files.read_file(paths[w])
    end
    os.remove(paths[w]); os.remove(paths[w] .. ".err")
  end
  if o.tmp == nil then os.remove(tmp) end
  if #errs > 0 then error(errs[1], 0) end
  return table.concat(parts), #starts, #pids
end

function M.fingerprint(s)
  return require("shard.data").fingerprint(s)
end

local function dirname_stem(path)
  local dir = path:match("^(.*)/[^/]*$") or "."
  local stem = path:match("([^/]+)$"):gsub("%.[^.]*$", "")
  return dir, stem ~= "" and stem or "corpus"
end

-- Reads OUT/meta.json, or nil.
function M.read_meta(dir)
  local s = files.read_file(dir .. "/meta.json")
  if not s then return nil end
  local ok, meta = pcall(cjson.decode, s)
  if ok and type(meta) == "table" then return meta end
  fail("%s/meta.json is not JSON", dir)
end

function M.prepare(o)
  if type(o) ~= "table" then fail("expected a table { text = PATH, tokenizer = DIR }, got %s", type(o)) end
  if type(o.text) ~= "string" or o.text == "" then fail("text: a path to a text file, got %s", tostring(o.text)) end
  if o.tokenizer == nil then fail("tokenizer: a directory or tokenizer.json (or a loaded tokenizer) is needed") end
  local val = o.val_fraction == nil and 0.1 or o.val_fraction
  if type(val) ~= "number" or val < 0 or val >= 1 then fail("val_fraction: a number in [0, 1), got %s", tostring(val)) end
  local workers = o.workers or tonumber(C.sysconf(SC_NPROCESSORS_ONLN))
  if type(workers) ~= "number" or workers < 1 or workers % 1 ~= 0 then fail("workers: a whole number >= 1, got %s", tostring(workers)) end
  local chunk = o.chunk_bytes
  if chunk ~= nil and (type(chunk) ~= "number" or chunk < 1) then fail("chunk_bytes: a number >= 1, got %s", tostring(chunk)) end
  local text, err = files.read_file(o.text)
  if not text then fail("cannot read the text %s", tostring(err)) end
  if #text == 0 then fail("%s is empty: nothing to encode", o.text) end
  -- default pieces: about 4 a worker, of 16 KiB to 1 MiB
  chunk = chunk or math.max(16384, math.min(1048576, math.ceil(#text / (4 * workers))))
  local tok = o.tokenizer
  if type(tok) == "string" then tok = require("shard.tokenizer").load(tok) end
  if type(tok) ~= "table" or not tok.encode_raw then fail("tokenizer: expected a path or a shard.tokenizer, got %s", type(tok)) end
  local dir = o.out
  if not dir then local d, stem = dirname_stem(o.text); dir = d .. "/" .. stem end
  dir = dir:gsub("/+$", "")
  local dtype = M.dtype_of(tok.vocab_size)
  local fp = M.fingerprint(text)
  local old = M.read_meta(dir)
  if old and old.fingerprint == fp and old.tokenizer == tok.path and old.vocab_size == tok.vocab_size
      and old.val_fraction == val and old.dtype == dtype then
    old.dir = dir
    return old, true
  end
  rt.check(rt.C.sh_ckpt_mkdirs(dir), 2)
  os.remove(dir .. "/meta.json")   -- meta.json marks the files complete: gone while they change
  local bytes, npieces, nworkers = M.encode_parallel(tok, text, { dtype = dtype, workers = workers, chunk_bytes = chunk,
                                                                  allowed_special = o.allowed_special, tmp = dir .. "/.encode" })
  local size = SIZE[dtype]
  local n = #bytes / size
  local ntrain = math.floor(n * (1 - val))
  write_all(dir .. "/train.bin.tmp", bytes:sub(1, ntrain * size))
  write_all(dir .. "/val.bin.tmp", bytes:sub(ntrain * size + 1))
  assert(os.rename(dir .. "/train.bin.tmp", dir .. "/train.bin"))
  assert(os.rename(dir .. "/val.bin.tmp", dir .. "/val.bin"))
  local meta = { format = "nanogpt", vocab_size = tok.vocab_size, dtype = dtype, tokenizer = tok.path,
                 source = o.text, fingerprint = fp, text_bytes = #text, tokens = n, train_tokens = ntrain,
                 val_tokens = n - ntrain, val_fraction = val, pieces = npieces, workers = nworkers,
                 eos_id = tok.eos_id, bos_id = tok.bos_id }
  write_all(dir .. "/meta.json.tmp", cjson.encode(meta) .. "\n")
  assert(os.rename(dir .. "/meta.json.tmp", dir .. "/meta.json"))
  meta.dir = dir
  return meta, false
end

return M
