-- shard.data: token files and batches.
-- Token files are nanoGPT's format: raw little-endian uint16 token ids (train.bin, val.bin;
-- uint32 from shard.data.prepare for a vocabulary beyond 65536). The character corpus's have
-- meta.lua holding the vocabulary, its source and the text's fingerprint; a run keeps
-- them in OUT_DIR/data/CORPUS (corpus_dir), one folder per corpus. Batches draw random windows whose offsets come from
-- the counter-based generator keyed by (seed, rank, step), so a run is reproducible and
-- every rank draws different windows.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local files = require("shard.files")
local C, check = rt.C, rt.check

local D = {}

local function read_file(path)
  local s, err = files.read_file(path)
  if not s then error("data: cannot read " .. tostring(err), 0) end   -- err names the path
  return s
end

local function write_file(path, s)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("data: cannot write " .. tostring(err), 0) end
  f:write(s)
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then error("data: cannot write " .. path .. ": " .. tostring(rerr), 0) end
end

-- Character-level tokenizer over the sorted unique bytes of a text (nanoGPT's shakespeare_char).
function D.char_tokenizer(text)
  local seen, chars = {}, {}
  for i = 1, #text do
    local c = text:sub(i, i)
    if not seen[c] then seen[c] = true; chars[#chars + 1] = c end
  end
  table.sort(chars)
  local stoi = {}
  for i, c in ipairs(chars) do stoi[c] = i - 1 end
  return {
    vocab_size = #chars, itos = chars, stoi = stoi,
    encode = function(s)
      local out = {}
      for i = 1, #s do
        local id = stoi[s:sub(i, i)]
        if not id then error(("tokenizer: character %q is not in the vocabulary"):format(s:sub(i, i)), 2) end
        out[i] = id
      end
      return out
    end,
    decode = function(ids)
      local out = {}
      for i, id in ipairs(ids) do out[i] = chars[id + 1] or "?" end
      return table.concat(out)
    end,
  }
end

-- A short fingerprint of a text (FNV-1a, 64-bit), hex: tells one corpus's token files from
-- another's, and a corpus edited since its files were written.
function D.fingerprint(text)
  local h = 0xcbf29ce484222325ULL
  for i = 1, #text do h = bit.bxor(h, text:byte(i)) * 0x100000001b3ULL end
  return bit.tohex(h)
end

-- A corpus in memory: its tokenizer and its train / val token arrays (the first 90% / the
-- last 10%, nanoGPT's split), as load_tokens gives them. Nothing is written: a dry run
-- reads its corpus through this.
function D.char_corpus(text_path)
  local text = read_file(text_path)
  if #text == 0 then error(("data: %s is empty: no characters to train on"):format(text_path), 2) end
  local tok = D.char_tokenizer(text)
  local n = #text
  local split = math.floor(n * 0.9)
  local buf = ffi.new("uint16_t[?]", n)
  for i = 1, n do buf[i - 1] = tok.stoi[text:sub(i, i)] end
  return { tok = tok, fingerprint = D.fingerprint(text), buf = buf,   -- buf owns both halves
           train = { buf = buf, n = split, path = text_path .. " (train)" },
           val = { buf = buf + split, n = n - split, path = text_path .. " (val)" } }
end

-- Where a corpus's token files go under root: one folder per corpus, named after its file,
-- so that preparing one corpus never replaces another's files.
function D.corpus_dir(root, text_path)
  local name = text_path:match("([^/]+)$"):gsub("%.[^.]*$", ""):gsub("[^%w_.-]", "_")
  return root .. "/" .. (name ~= "" and name or "corpus")
end

local function read_meta(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  f:close()
  local ok, meta = pcall(dofile, path)
  return ok and type(meta) == "table" and meta or nil
end

-- Writes train.bin, val.bin and meta.lua for a text file into dir (corpus_dir names it).
-- Returns the tokenizer, the token counts and whether the files were already up to date
-- (the same text, by its fingerprint, whatever path reached it: nothing is written). A text
-- changed since is written again; dir holding another file's different text is an error
-- naming both, never a silent replacement.
function D.prepare_char(text_path, dir)
  local corpus = D.char_corpus(text_path)
  local ntrain, nval = corpus.train.n, corpus.val.n
  local old = read_meta(dir .. "/meta.lua")
  if old and old.fingerprint == corpus.fingerprint then return corpus.tok, ntrain, nval, true end
  if old and old.source ~= text_path then
    error(("data: %s holds the token files of %s, not of %s; pass another --out_dir"):format(dir, tostring(old.source), text_path), 2)
  end
  rt.check(rt.C.sh_ckpt_mkdirs(dir), 2)   -- mkdir -p through mkdir(2): no shell sees the path
  write_file(dir .. "/train.bin", ffi.string(corpus.train.buf, ntrain * 2))
  write_file(dir .. "/val.bin", ffi.string(corpus.val.buf, nval * 2))
  local q = {}
  for i, c in ipairs(corpus.tok.itos) do q[i] = ("%q"):format(c) end
  -- meta.lua last: it marks the files complete
  write_file(dir .. "/meta.lua", ("return { vocab_size = %d, source = %q, fingerprint = %q, itos = { %s } }\n")
    :format(corpus.tok.vocab_size, text_path, corpus.fingerprint, table.concat(q, ", ")))
  return corpus.tok, ntrain, nval, false
end

-- The tokenizer described by a meta.lua.
function D.load_meta(path)
  local meta = dofile(path)
  local text = table.concat(meta.itos)
  local tok = D.char_tokenizer(text)
  assert(tok.vocab_size == meta.vocab_size, "data: meta vocabulary is not sorted unique characters")
  return tok
end

-- A token file (dtype "uint16", the default, or "uint32"), memory-mapped read-only: the
-- pages come from the file as the batches touch them (unmapped when the table is collected).
for _, decl in ipairs { "void *mmap(void *addr, size_t len, int prot, int flags, int fd, long off);",
                        "int munmap(void *addr, size_t len);", "int open(const char *path, int flags, ...);",
                        "int close(int fd);" } do
  pcall(ffi.cdef, decl)   -- one declared already (by another module) is no error
end
function D.load_tokens(path, dtype)
  dtype = dtype or "uint16"
  local size = ({ uint16 = 2, uint32 = 4 })[dtype]
  if not size then error(("data: dtype %s: expected uint16 or uint32"):format(tostring(dtype)), 2) end
  local f, err = io.open(path, "rb")
  if not f then error("data: cannot read " .. tostring(err), 2) end
  local bytes = f:seek("end")
  f:close()
  if bytes % size ~= 0 then
    error(("data: %s has %d bytes, not a whole number of %s tokens"):format(path, bytes, dtype), 2)
  end
  local ctype = dtype == "uint16" and "uint16_t*" or "uint32_t*"
  if bytes == 0 then return { buf = ffi.new(ctype:sub(1, -2) .. "[1]"), n = 0, path = path, dtype = dtype } end
  local fd = C.open(path, 0)   -- O_RDONLY
  if fd < 0 then error("data: cannot open " .. path, 2) end
  local p = C.mmap(nil, bytes, 1, 2, fd, 0)   -- PROT_READ, MAP_PRIVATE
  C.close(fd)
  if ffi.cast("intptr_t", p) == -1 then error("data: cannot map " .. path, 2) end
  local map = ffi.gc(ffi.cast("char*", p), function(q) C.munmap(q, bytes) end)
  return { buf = ffi.cast(ctype, map), map = map, n = bytes / size, path = path, dtype = dtype }
end

-- shard.data.prepare{ text = PATH, tokenizer = DIR, ... }: BPE token files (shard.data.prepare).
function D.prepare(o) return require("shard.data.prepare").prepare(o) end

-- A folder written by prepare: its meta (meta.json) and its train and val tokens, mapped.
function D.load_prepared(dir)
  local meta = require("shard.data.prepare").read_meta(dir)
  if not meta then error(("data: %s has no meta.json: not a folder shard.data.prepare wrote"):format(dir), 2) end
  return meta, D.load_tokens(dir .. "/train.bin", meta.dtype), D.load_tokens(dir .. "/val.bin", meta.dtype)
end

-- Random windows of `block` tokens: x = tokens[o, o+block), y = tokens[o+1, o+block+1).
-- opts: path or tokens, block, batch (the global batch), seed, rank and world (default 0 and
-- 1), device. Every rank draws the same global batch from (seed, step) and keeps its own
-- batch / world rows, so N ranks see exactly the windows one process would.
function D.tokens(opts)
  local toks = opts.tokens or D.load_tokens(opts.path)
  local block, world, rank = opts.block, opts.world or 1, opts.rank or 0
  if opts.batch % world ~= 0 then
    error(("data: the global batch %d does not split over %d ranks"):format(opts.batch, world), 2)
  end
  local global, batch = opts.batch, opts.batch / world
  if toks.n <= block + 1 then
    error(("data: %s has %d tokens, too few for block %d"):format(toks.path or "tokens", toks.n, block), 2)
  end
  local self = { tokens = toks, block = block, batch = batch, seed = opts.seed or 1337,
                 rank = rank, world = world, step = 0, device = opts.device }
  local u = tensor.empty({ global }, { dtype = "f64", device = "cpu" })   -- read through a host pointer
  local ubuf = ffi.cast("double*", C.sh_tensor_data(u.p))
  -- This rank's window offsets at a step: generator key = seed, counter = the step.
  function self:offsets(step)
    check(C.sh_random_uniform_(u.p, self.seed, step * math.ceil(global / 4) * 4, 0, 1))
    local out = {}
    for b = 1, batch do out[b] = math.floor(ubuf[rank * batch + b - 1] * (toks.n - block - 1)) end
    return out
  end
  function self:batch_at(step)
    local offs = self:offsets(step)
    local x = tensor.empty({ batch, block }, { dtype = "i64", device = "cpu" })
    local y = tensor.empty({ batch, block }, { dtype = "i64", device = "cpu" })
    local xp = ffi.cast("int64_t*", C.sh_tensor_data(x.p))
    local yp = ffi.cast("int64_t*", C.sh_tensor_data(y.p))
    local src = toks.buf
    for b = 0, batch - 1 do
      local o, row = offs[b + 1], b * block
      for t = 0, block - 1 do
        xp[row + t] = src[o + t]
        yp[row + t] = src[o + t + 1]
      end
    end
    if self.device and self.device ~= "cpu" then
      local xd, yd = x:to(self.device), y:to(self.device)
      x:free(); y:free()
      return xd, yd
    end
    return x, y
  end
  function self:next()
    self.step = self.step + 1
    return self:batch_at(self.step)
  end
  -- The position, for a checkpoint: batches depend only on (seed, step), so setting it back
  -- resumes the same stream, at any world size.
  function self:state() return { step = self.step, seed = self.seed } end
  function self:set_state(s)
    if type(s) ~= "table" or type(s.step) ~= "number" then error("data: set_state expects { step = N, seed = S }", 2) end
    self.step = s.step
    if s.seed then self.seed = s.seed end
  end
  return self
end

return D
