-- shard.checkpoint: resumable sharded training checkpoints (the full state dict in one file is
-- shard.io.state_dict, shard.save; activation checkpointing is nn.Module.checkpoint).
--   checkpoint.save(dir, { model =, optim =, step =, data =, config =, extra =, keep =, async = })
--   local info = checkpoint.load(dir, { model =, optim =, data = })   -- info.step, info.extra, ...
-- Every rank calls both. A checkpoint is a directory DIR/step-N holding one safetensors file per
-- rank (rank-RRRRR-of-WWWWW.safetensors) with just the slices that rank owns, and index.json:
--   params  name -> { shape, dtype, pieces = { { file, tensor, start, count, crc32c }, ... } }:
--           where each element range [start, start + count) of the flattened f32 master lives,
--           and the CRC32C of the piece's bytes (8 hex digits; checksum = "crc32c" says so)
--   optim   { kind, step_count, hyper, state = { exp_avg = { name -> pieces }, ... } }
--   ranks   per rank: { rng = shard.random state, data = loader position, extra = rank_extra }
--   step, lr, world = { size, strategy, hybrid_group }, config, extra
-- (the idea of PyTorch's distributed-checkpoint metadata). Tensors in a rank file are named
-- "param/<name>@<start>" and "optim/<state>/<name>@<start>". Nobody gathers the model: each
-- rank copies its own slices (device memory grows by nothing; on a GPU each slice is copied
-- to the host). Loading at any world size or strategy computes, for every slice this rank
-- holds, the saved pieces that overlap it and preads just those byte ranges.
--
-- Atomic: files go to DIR/.tmp-step-N/ (each written to a temporary name, fsynced, renamed);
-- rank 0 waits for every rank's file, writes index.json, renames the directory to step-N,
-- then replaces DIR/latest (a one-line file, written and renamed), then prunes to `keep`
-- step directories. A process killed at any moment leaves `latest` naming a complete one.
-- async = true: the slices are copied to host memory at the call (the step boundary) and a
-- background thread (runtime/io/ckpt_io.h) writes them while training goes on; the next save,
-- checkpoint.wait() or the process's end waits for it.
-- Checksums: every piece's CRC32C is taken from the bytes handed to the writer (at memory
-- speed, runtime/io/checksum.h) and a load checks every piece it reads from against it, the
-- whole piece even when it needs a part (a rank of another layout), so a changed byte is
-- refused naming the file and the tensor. A checkpoint without them (written before they were
-- kept) loads unverified, with a note; load's verify = false or SHARD_VERIFY_CHECKSUMS=0
-- skips the check.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local safetensors = require("shard.io.safetensors")
-- Our own JSON module, not lua-cjson: Debian's lua-cjson writes numbers with at most 14
-- significant digits, which cannot carry the exact integers and doubles a bitwise resume needs.
local json = require("shard.io.json")
local random = require("shard.random")
local fsdp = require("shard.fsdp")
local files = require("shard.files")
local C, check = rt.C, rt.check

local M = { FORMAT = "shard.checkpoint", VERSION = 1, timeout_s = 600 }

local CHECKSUM = "crc32c"   -- what index.json's pieces carry

local function rank_file(r, world) return ("rank-%05d-of-%05d.safetensors"):format(r, world) end

local function where()
  local env = rawget(require("shard"), "env")
  if env then return env.rank, env.world, env.group end
  return 0, 1, nil
end

local function barrier(group) if group and group:size() > 1 then group:barrier() end end

local function exists(path) return C.sh_ckpt_exists(path) ~= 0 end

local function read_text(path)
  local s, err = files.read_file(path)
  if not s then error("checkpoint: cannot open " .. path .. ": " .. tostring(err), 0) end
  return s
end

local function elem_size(dtype) return tonumber(C.sh_dtype_size(tensor.dtype_id(dtype))) end

---------------------------------------------------------------------------------------------
-- what a rank holds

-- Every parameter slice this rank holds (shard.fsdp's local_slices: name, shape, start,
-- count, owner, view): elements [start, start + count) of the flattened parameter; view()
-- gives a live 1-D alias (the caller frees it); owner: this rank is the one that writes the
-- slice (under hybrid sharding or no_shard several ranks hold the same slice, and the first
-- replica writes). A whole parameter (an unwrapped model's, or one fsdp.wrap ignored) is one
-- slice that rank 0 writes and every rank loads.
local function held_slices(model)
  local out = {}
  for _, sl in ipairs(fsdp.local_slices(model)) do
    if sl.whole or sl.count > 0 then out[#out + 1] = sl end
  end
  return out
end

-- tensor -> name for an unwrapped model's optimizer entries (FSDP entries carry their name).
local function name_of(model)
  local by_ptr = {}
  if model and not fsdp.is_fsdp(model) then
    for _, np in ipairs(model:named_parameters()) do by_ptr[tostring(ffi.cast("void*", np.tensor.p))] = np.name end
  end
  return function(t) return by_ptr[tostring(ffi.cast("void*", t.p))] end
end

local function slice_key(name, start) return name .. "@" .. start end

-- Each rank's string, on every rank (two all-gathers: lengths, then the padded bytes).
local function gather_strings(group, s)
  if not group or group:size() == 1 then return { s } end
  local n = group:size()
  local dev = tensor.default_device or "cpu"
  local temps = {}
  local function on(t, device)   -- t on device (a copy when it is elsewhere)
    if t:device() == device then return t end
    local c = t:to{ device = device }
    temps[#temps + 1] = c
    return c
  end
  local len = tensor.tensor({ #s }, { dtype = "f64", device = "cpu" })
  temps[1] = len
  local lens_d = group:all_gather(on(len, dev))
  temps[#temps + 1] = lens_d
  local lens_h = on(lens_d, "cpu")
  local lens, max = {}, 1
  for i = 1, n do lens[i] = lens_h:get({ i }); max = math.max(max, lens[i]) end
  local buf = tensor.zeros({ max }, { dtype = "u8", device = "cpu" })
  temps[#temps + 1] = buf
  ffi.copy(C.sh_tensor_data(buf.p), s, #s)
  local all_d = group:all_gather(on(buf, dev))
  temps[#temps + 1] = all_d
  local all = on(all_d, "cpu")
  local base = ffi.cast("const char*", C.sh_tensor_data(all.p))
  local out = {}
  for i = 1, n do out[i] = ffi.string(base + (i - 1) * max, lens[i]) end
  for _, t in ipairs(temps) do t:free() end
  return out
end

---------------------------------------------------------------------------------------------
-- the background writer

local pending = nil   -- { job =, keep = { host tensors and strings the job points into }, name = }

local function finish(p)
  local rc = C.sh_ckpt_job_wait(p.job)
  local msg = rc ~= 0 and ffi.string(C.sh_last_error()) or nil
  C.sh_ckpt_job_destroy(ffi.gc(p.job, nil))
  for _, t in ipairs(p.tensors) do t:free() end
  p.tensors, p.strings = nil, nil
  if msg then error(("checkpoint: saving %s failed on rank %d: %s"):format(p.name, p.rank, msg), 0) end
end

-- Waits for an asynchronous save in flight (no-op when none); raises its error if it failed.
-- With barrier = true (default), every rank returns once the checkpoint is committed.
function M.wait(opts)
  local p = pending
  pending = nil
  if p then finish(p) end
  if not (opts and opts.barrier == false) then
    local _, _, group = where()
    barrier(group)
  end
end

-- True while an asynchronous save of this rank is still writing.
function M.busy() return pending ~= nil and C.sh_ckpt_job_done(pending.job) == 0 end

---------------------------------------------------------------------------------------------
-- save

-- The save's arguments, checked; rank 0 makes dir and an empty temporary directory for it.
local function begin_save(dir, s)
  if type(dir) ~= "string" or dir == "" then error("checkpoint.save: dir must be a path", 3) end
  if type(s) ~= "table" or not s.model then error("checkpoint.save: expected { model =, step =, ... }", 3) end
  local step = s.step
  if type(step) ~= "number" or step ~= math.floor(step) or step < 0 then
    error("checkpoint.save: step must be a whole number >= 0, got " .. tostring(step), 3)
  end
  local rank, world, group = where()
  if pending then M.wait{ barrier = false } end
  local name = "step-" .. step
  local tmpdir, final = dir .. "/.tmp-" .. name, dir .. "/" .. name
  if exists(final) and M.latest(dir) == final then error(("checkpoint.save: %s already exists and is the latest (rank %d)"):format(final, rank), 3) end
  if rank == 0 then
    check(C.sh_ckpt_mkdirs(dir))
    check(C.sh_ckpt_remove_tree(final))    -- renamed by a save killed before `latest` moved to it
    check(C.sh_ckpt_remove_tree(tmpdir))   -- what a killed save left
    check(C.sh_ckpt_mkdirs(tmpdir))
  end
  barrier(group)
  return { dir = dir, step = step, name = name, tmpdir = tmpdir, final = final, rank = rank, world = world, group = group }
end

-- This rank's slices (the parameters it owns, then their optimizer states): entries describing
-- them for the index and the tensors to write, live views or host copies when the write goes
-- on in the background (or the slice is not host memory). Also the optimizer's metadata.
-- held = true (shard.snapshot) takes every slice this rank holds, owned or a replica (each rank
-- restores from its own), not just the ones it writes once for all, live on their device with
-- no checksum: the snapshot copies them, off the step's path, and checksums its copy. Where a
-- slice is a whole contiguous tensor (an optimizer state, a plain model's parameter) it is that
-- tensor itself, not a view (making and freeing 81 views took 0.5 ms of a 100 ms step), and
-- borrowed[i] says so: the caller frees the others only.
local function collect_slices(s, held)
  local entries, tensors, borrowed = {}, {}, {}
  local function add(key, view, desc, whole)
    local t = view
    if held and whole and view:is_contiguous() then
      borrowed[#tensors + 1] = true
    elseif not view:is_contiguous() or not held and (s.async or view:device() ~= "cpu") then
      t = tensor.empty({ view:numel() }, { dtype = view:dtype(), device = "cpu" })
      t:copy_(view)
      if not whole then view:free() end
    end
    tensors[#tensors + 1] = t
    desc.tensor, desc.dtype, desc.crc32c = key, t:dtype(), not held and safetensors.crc32c(t) or nil
    entries[#entries + 1] = desc
  end
  local owned = {}
  for _, sl in ipairs(held_slices(s.model)) do
    if sl.owner or held then
      owned[slice_key(sl.name, sl.start)] = true
      local whole = held and sl.whole
      add("param/" .. slice_key(sl.name, sl.start), whole and sl.tensor or sl:view(),
          { kind = "param", name = sl.name, shape = sl.shape, start = sl.start, count = sl.count }, whole)
    end
  end
  if not s.optim then return entries, tensors, nil, borrowed end
  local sd = s.optim:state_dict(name_of(s.model))
  for _, e in ipairs(sd.entries) do
    if owned[slice_key(e.name, e.start)] then
      local states = {}
      for k in pairs(e.state) do states[#states + 1] = k end
      table.sort(states)
      for _, k in ipairs(states) do
        local st = e.state[k]
        add(("optim/%s/%s"):format(k, slice_key(e.name, e.start)), held and st or st:view({ st:numel() }),
            { kind = "optim", state = k, name = e.name, start = e.start, count = e.numel }, held)
      end
    end
  end
  return entries, tensors, { kind = sd.kind, step_count = sd.step_count, hyper = sd.hyper }, borrowed
end

-- What resume restores beyond the slices, this rank's: RNG state, data position, extras.
local function rank_state(s)
  return { rng = random.get_state(), data = s.data and s.data:state() or nil, extra = s.rank_extra }
end

-- The state a resume restores, as this rank holds it, for another store of it
-- (shard.snapshot): collect_slices's entries, tensors and optimizer metadata, rank_state, and
-- which tensors are borrowed (live ones the caller must not free).
function M.collect(s, held)
  local entries, tensors, optim_meta, borrowed = collect_slices(s, held)
  return entries, tensors, optim_meta, rank_state(s), borrowed
end

-- The rank file's chunks: the safetensors header (runtime/io/safetensors.c builds it), then
-- the slices' bytes in the order it gives (by name). Returns the header string (kept alive
-- until written) and the chunk pointers and sizes.
local function rank_file_chunks(sv, entries, tensors)
  local n = #tensors
  local names_c, tensors_c = ffi.new("const char*[?]", math.max(n, 1)), ffi.new("sh_tensor*[?]", math.max(n, 1))
  for i, e in ipairs(entries) do names_c[i - 1], tensors_c[i - 1] = e.tensor, tensors[i].p end
  local meta = { format = M.FORMAT, rank = tostring(sv.rank), step = tostring(sv.step), world = tostring(sv.world) }
  local mkeys, mvalues, nmeta = ffi.new("const char*[4]"), ffi.new("const char*[4]"), 0
  for _, k in ipairs { "format", "rank", "step", "world" } do
    mkeys[nmeta], mvalues[nmeta] = k, meta[k]
    nmeta = nmeta + 1
  end
  local out, len, order = ffi.new("char*[1]"), ffi.new("int64_t[1]"), ffi.new("int32_t[?]", math.max(n, 1))
  check(C.sh_st_header(rank_file(sv.rank, sv.world), n, names_c, tensors_c, nmeta, mkeys, mvalues, out, len, order))
  local head = ffi.string(out[0], len[0])
  C.sh_st_free(out[0])
  local ptrs, sizes = ffi.new("const void*[?]", n + 1), ffi.new("int64_t[?]", n + 1)
  ptrs[0], sizes[0] = head, #head
  for k = 0, n - 1 do
    local t = tensors[order[k] + 1]
    ptrs[k + 1], sizes[k + 1] = C.sh_tensor_data(t.p), t:numel() * elem_size(t:dtype())
  end
  return head, n + 1, ptrs, sizes
end

-- Rank 0's index: every rank's pieces (from descs, one JSON string per rank) by parameter and
-- by optimizer state, every rank's own state, the layout and the caller's config and extras.
-- Waits for each rank's file as it goes, so the index is written after every piece it names.
local function build_index(sv, s, descs, optim_meta, job)
  local index = { format = M.FORMAT, version = M.VERSION, step = sv.step, checksum = CHECKSUM, files = {}, params = {},
                  ranks = {}, world = fsdp.layout(s.model), config = s.config, extra = s.extra,
                  lr = s.optim and s.optim.lr or nil }
  index.world.size = sv.world
  if optim_meta then optim_meta.state = {}; index.optim = optim_meta end
  for r = 0, sv.world - 1 do
    local d = json.decode(descs[r + 1])
    index.files[r + 1] = rank_file(r, sv.world)
    index.ranks[r + 1] = d.state
    for _, e in ipairs(d.pieces) do
      local piece = { file = rank_file(r, sv.world), tensor = e.tensor, start = e.start, count = e.count, crc32c = e.crc32c }
      if e.kind == "param" then
        local p = index.params[e.name]
        if not p then p = { shape = e.shape, dtype = e.dtype, pieces = {} }; index.params[e.name] = p end
        table.insert(p.pieces, piece)
      else
        local by_name = optim_meta.state[e.state] or {}
        optim_meta.state[e.state] = by_name
        by_name[e.name] = by_name[e.name] or {}
        table.insert(by_name[e.name], piece)
      end
    end
    if r > 0 then check(C.sh_ckpt_job_wait_file(job, sv.tmpdir .. "/" .. rank_file(r, sv.world), M.timeout_s)) end
  end
  return index
end

-- Queues rank 0's last writes on job: the index, the rename of the temporary directory to its
-- final name, `latest`, and the pruning to s.keep step directories. Returns their strings,
-- which must stay alive until written.
local function queue_index(sv, s, job, index)
  local itext, latest = json.encode(index), sv.name .. "\n"
  check(C.sh_ckpt_job_write(job, sv.tmpdir .. "/index.json", 1, ffi.new("const void*[1]", { itext }), ffi.new("int64_t[1]", { #itext })))
  check(C.sh_ckpt_job_rename(job, sv.tmpdir, sv.final))
  check(C.sh_ckpt_job_write(job, sv.dir .. "/latest", 1, ffi.new("const void*[1]", { latest }), ffi.new("int64_t[1]", { #latest })))
  check(C.sh_ckpt_job_prune(job, sv.dir, s.keep or 0, sv.name))
  return itext, latest
end

-- s: model (required), optim, step (required, a whole number), data (a loader with
-- :state()), config, extra (JSON-able tables stored in the index), rank_extra (per rank),
-- keep (prune to this many step directories; nil or 0 keeps all), async.
function M.save(dir, s)
  local sv = begin_save(dir, s)
  local entries, tensors, optim_meta = collect_slices(s, false)
  local head, nchunks, ptrs, sizes = rank_file_chunks(sv, entries, tensors)
  local strings = { head }
  -- what every rank holds and its own state, gathered for the index
  local descs = gather_strings(sv.group, json.encode{ pieces = entries, state = rank_state(s) })
  local box = ffi.new("sh_ckpt_job*[1]")
  check(C.sh_ckpt_job_create(box))
  local job = ffi.gc(box[0], C.sh_ckpt_job_destroy)
  check(C.sh_ckpt_job_write(job, sv.tmpdir .. "/" .. rank_file(sv.rank, sv.world), nchunks, ptrs, sizes))
  if sv.rank == 0 then
    strings[2], strings[3] = queue_index(sv, s, job, build_index(sv, s, descs, optim_meta, job))
  end
  -- host copies, or live views of the shards (aliases: nothing copied), freed once written
  pending = { job = job, tensors = tensors, strings = strings, name = sv.final, rank = sv.rank }
  check(C.sh_ckpt_job_run(job, s.async and 1 or 0))
  if not s.async then M.wait() end
  return sv.final
end

---------------------------------------------------------------------------------------------
-- load

-- Whether a load of this index checks checksums: unless verify is false (or
-- SHARD_VERIFY_CHECKSUMS=0), when the index has them; an index written before they were kept
-- loads unverified, with a note from rank 0.
local function checks_checksums(index, index_path, verify, rank)
  if not safetensors.verifying(verify) then return false end
  if index.checksum == nil then
    if rank == 0 then io.stderr:write(("checkpoint.load: %s carries no checksums (written before they were kept): loaded unverified\n"):format(index_path)) end
    return false
  end
  if index.checksum ~= CHECKSUM then
    error(("checkpoint.load: %s: checksum kind '%s' is not %s (rank %d)"):format(index_path, tostring(index.checksum), CHECKSUM, rank), 0)
  end
  return true
end

-- The checkpoint directory dir names: dir itself when it holds index.json, else the one
-- dir/latest names; nil when there is none.
function M.latest(dir)
  if exists(dir .. "/index.json") then return dir end
  local f = io.open(dir .. "/latest", "rb")
  if not f then return nil end
  local name = (f:read("*l") or ""):match("^%s*(.-)%s*$")
  f:close()
  if name == "" then return nil end
  return dir .. "/" .. name
end

-- s: model, optim, data (each optional; the model is needed for an optimizer), strict
-- (default true: every saved parameter must be in the model), verify (default true unless
-- SHARD_VERIFY_CHECKSUMS=0: check the checksums of what is read). Returns the index: step, lr,
-- config, extra, world, and rank_extra (this rank's, or rank 0's when the saved world was
-- smaller).
-- The newest complete checkpoint under dir: its path and its decoded index (errors blame the
-- caller of M.load).
local function open_index(dir, rank)
  local path = M.latest(dir)
  if not path then error(("checkpoint.load: %s holds no checkpoint (no index.json, no latest) (rank %d)"):format(dir, rank), 3) end
  local index_path = path .. "/index.json"
  if not exists(index_path) then
    error(("checkpoint.load: %s/latest names %s, which is not a complete checkpoint (no index.json) (rank %d)"):format(dir, path, rank), 3)
  end
  local ok, index = pcall(json.decode, read_text(index_path))
  if not ok then error(("checkpoint.load: %s: %s (rank %d)"):format(index_path, tostring(index), rank), 3) end
  if index.format ~= M.FORMAT then error(("checkpoint.load: %s is not a shard checkpoint index (rank %d)"):format(index_path, rank), 3) end
  return path, index_path, index
end

-- Reads saved pieces into live slices: the rank files opened once each (validated safetensors
-- handles), every piece's checksum checked when verifying.
local Reader = {}
Reader.__index = Reader

-- open(name): the handle of file `name` of the index (:info, :read, :read_crc32c, :close as
-- shard.io.safetensors's); by default the safetensors file in path.
local function reader(path, verify, rank, open)
  open = open or function(name) return safetensors.open(path .. "/" .. name) end
  return setmetatable({ path = path, verify = verify, rank = rank, files = {}, open = open }, Reader)
end

function Reader:file(name)
  if not self.files[name] then self.files[name] = self.open(name) end
  return self.files[name]
end

function Reader:close() for _, h in pairs(self.files) do h:close() end end

-- Reads elements [first, first + n) of piece p from its file h into dst, checking the whole
-- piece's checksum when verifying.
function Reader:read(h, p, dst, first, n)
  if not self.verify then return h:read(p.tensor, dst, first, n) end
  local _, got = h:read_crc32c(p.tensor, dst, first, n)
  if got ~= p.crc32c then
    error(("checkpoint.load: %s/%s: tensor '%s' fails its checksum (its bytes give CRC32C %s, index.json says %s): the file "
      .. "is corrupt; checkpoint.load(dir, { verify = false, ... }) or SHARD_VERIFY_CHECKSUMS=0 loads it anyway (rank %d)")
      :format(self.path, p.file, p.tensor, got, tostring(p.crc32c), self.rank), 0)
  end
end

-- The handle of piece p's file, checked against the index's element count.
function Reader:piece_file(p)
  local h = self:file(p.file)
  local info = h:info(p.tensor)
  if not info then error(("checkpoint.load: %s/%s has no tensor %s (rank %d)"):format(self.path, p.file, p.tensor, self.rank), 0) end
  if info.numel ~= p.count then
    error(("checkpoint.load: %s/%s: tensor %s has %d elements, the index says %d (rank %d)"):format(self.path, p.file,
      p.tensor, info.numel, p.count, self.rank), 0)
  end
  return h, info
end

-- Fills dst (a live 1-D slice of count elements, holding [start, start + count) of `what`)
-- from the saved pieces that overlap it, reading just their byte ranges.
function Reader:fill(what, pieces, dst, start, count)
  local covered, stop = 0, start + count
  local direct = dst:device() == "cpu" and dst:is_contiguous()
  for _, p in ipairs(pieces) do
    local a, b = math.max(start, p.start), math.min(stop, p.start + p.count)
    if a < b then
      local h, info = self:piece_file(p)
      local n, first = b - a, a - p.start
      local sub = dst:narrow(1, a - start + 1, n)
      if direct and info.dtype == dst:dtype() then
        self:read(h, p, sub, first, n)
      else
        local tmp = tensor.empty({ n }, { dtype = info.dtype, device = "cpu" })
        self:read(h, p, tmp, first, n)
        sub:copy_(tmp)
        tmp:free()
      end
      sub:free()
      covered = covered + n
    end
  end
  if covered ~= count then
    error(("checkpoint.load: %s: %s elements [%d, %d) are not all in the checkpoint (found %d of %d) (rank %d)"):format(
      self.path, what, start, stop, covered, count, self.rank), 0)
  end
end

-- The model's slices from the index's parameters; strict (the default) refuses parameters the
-- model lacks.
local function load_params(rd, index, model, strict)
  local path, rank = rd.path, rd.rank
  for _, sl in ipairs(held_slices(model)) do
    local p = index.params[sl.name]
    if not p then error(("checkpoint.load: %s has no parameter '%s' (rank %d)"):format(path, sl.name, rank), 3) end
    local a, b = table.concat(p.shape, "x"), table.concat(sl.shape, "x")
    if a ~= b then error(("checkpoint.load: %s: '%s' is %s in the checkpoint but %s in the model (rank %d)"):format(path, sl.name, a, b, rank), 3) end
    local v = sl:view()
    rd:fill(sl.name, p.pieces, v, sl.start, sl.count)
    v:free()
  end
  fsdp.mark_stale(model)
  if strict == false then return end
  -- every parameter's name: a rank may hold no element of a small parameter
  local known = {}
  for _, sl in ipairs(fsdp.local_slices(model)) do known[sl.name] = true end
  local extra = {}
  for nm in pairs(index.params) do if not known[nm] then extra[#extra + 1] = nm end end
  table.sort(extra)
  if #extra > 0 then error(("checkpoint.load: %s holds parameters the model lacks: %s (rank %d)"):format(path, table.concat(extra, ", "), rank), 3) end
end

-- The optimizer's state for the slices this rank holds, then its step count and hyper-parameters.
local function load_optim(rd, index, optim, model)
  local path, rank, o = rd.path, rd.rank, index.optim
  if not o then error(("checkpoint.load: %s holds no optimizer state (rank %d)"):format(path, rank), 3) end
  local sd = optim:state_dict(name_of(model))
  if o.kind ~= sd.kind then error(("checkpoint.load: %s holds %s state, the optimizer is %s (rank %d)"):format(path, tostring(o.kind), sd.kind, rank), 3) end
  for _, e in ipairs(sd.entries) do
    for k, t in pairs(e.state) do
      local pieces = o.state[k] and o.state[k][e.name]
      if not pieces then error(("checkpoint.load: %s has no optimizer state %s for '%s' (rank %d)"):format(path, k, e.name, rank), 3) end
      local v = t:view({ t:numel() })
      rd:fill(k .. " of " .. e.name, pieces, v, e.start, e.numel)
      v:free()
    end
  end
  optim:load_state_dict{ kind = o.kind, step_count = o.step_count, hyper = o.hyper }
end

-- Loads into s (as M.load) the state an index describes, its pieces read from rd.
local function restore(rd, index, s, rank)
  if s.model then load_params(rd, index, s.model, s.strict) end
  if s.optim then load_optim(rd, index, s.optim, s.model) end
  local mine = index.ranks[rank + 1] or index.ranks[1] or {}
  if mine.rng and s.rng ~= false then random.set_state(mine.rng) end
  if s.data and mine.data then s.data:set_state(mine.data) end
  index.rank_extra = mine.extra
  rd:close()
  return index
end

function M.load(dir, s)
  s = s or {}
  local rank = where()
  local path, index_path, index = open_index(dir, rank)
  local rd = reader(path, checks_checksums(index, index_path, s.verify, rank), rank)
  index.path = path
  return restore(rd, index, s, rank)
end

-- M.load from an index built elsewhere (shard.snapshot's, from memory): its pieces' files are
-- what open(name) returns, described as `path` in messages; checksums are the caller's.
function M.load_index(index, s, path, open)
  local rank = where()
  index.path = path
  return restore(reader(path, false, rank, open), index, s or {}, rank)
end

return M
