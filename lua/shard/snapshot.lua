-- shard.snapshot: in-memory snapshots of the training state, so that a lost rank costs the
-- seconds of a restart (shard launch --max_restarts), not the work since the last disk
-- checkpoint.
--   local snaps = snapshot.new{ model =, optim =, data =, env =, interval = K | "auto", replicas = 0 | 1 }
--   ... each step: snaps:before_update() just before opt:step(); snaps:after_step(n) once step n is done
--   snaps:close()                 -- the run ended well: its files go
--   local step, how = snapshot.restore{ model =, optim =, data =, env =, ckpt_dir = }
--
-- What: exactly what a resume from a disk checkpoint restores (shard.checkpoint.collect: every
-- slice this rank holds of the f32 master parameters and of the optimizer state, the
-- optimizer's step count and settings, the RNG state and the data position), every K steps.
-- interval "auto": every step if a snapshot costs the step at most BUDGET (3%) of its wall
-- time, else the smallest K for which it does. The cost is measured, not modelled: after
-- WARM steps, PAIRS pairs of steps, the first of each with a snapshot and the second without
-- (a snapshot every 2 steps meanwhile, which rank 0 says), give the median of the pairs'
-- differences over the median step without; the slowest rank's share decides, so that every
-- rank takes the same K; rank 0 prints the choice.
-- Where: a file per rank in /dev/shm ($SHARD_SNAPSHOT_DIR), shard-JOB-wWORLD-rRANK.snap (JOB:
-- the launch's SHARD_JOB_ID, which its restarts keep), with two slots filled in turn; a slot
-- is whole only once its head, written last, matches its checksums (runtime/io/snapshot.h).
-- When: at the step boundary a background thread copies the state into the slot while the
-- next step's forward and backward run; they read the shards and write only gradients, so
-- the state it copies is the boundary's. On the CPU the thread reads the live shards, and the
-- next optimizer step waits for the thread (before_update). On a GPU the device's state goes
-- first into pinned host staging, by device-to-host copies on a stream of their own (the
-- snapshot stream, after an event that ends the step's work on the compute stream); the
-- thread waits for their event before it reads the staging, and the next optimizer step's
-- stream waits for the same event on the device (before_update: no host wait on the step's
-- path). The cost is the copy's share of memory bandwidth and a core (and of the copy
-- engine on a GPU), and a wait only where the copy outlasts forward and backward.
-- Replicas (replicas = 1): each rank also keeps its buddy's newest slot, in
-- shard-JOB-wWORLD-rOWNER.copy: the ranks ordered by (local rank, node), so that neighbours
-- sit on different nodes where there are several, pair up; an odd last rank pairs with the
-- first as well. Once a rank's copy is done, each pair exchanges the slot whole with one
-- broadcast per member on a group of the two (asynchronous; the next snapshot waits for it).
-- Restore: every rank reads the slots of this job it can find (its own, the buddy copies its
-- host holds), skips any that fails its checksums (naming it), and the ranks agree on the
-- newest step all of them can restore (an all-reduce min, repeated until every rank has it),
-- or the newest disk checkpoint when that is newer or nothing else is whole; at another world
-- size every rank needs every old rank's slot, and the checkpoint loader reshards from them.
local ffi = require("ffi")
local rt = require("shard.ffi")
local tensor = require("shard.tensor")
local json = require("shard.io.json")
local checkpoint = require("shard.checkpoint")
local files = require("shard.files")
local fsdp = require("shard.fsdp")
local C, check = rt.C, rt.check

local M = {}

-- The file's slot after its head page is the payload; the JSON description ends it, with
-- room to grow (its numbers' digits) without resizing the file.
local META_ROOM = 64 * 1024
M.BUDGET, M.WARM, M.PAIRS = 0.03, 2, 10

function M.dir() return os.getenv("SHARD_SNAPSHOT_DIR") or "/dev/shm" end

-- The job's name in file names: shard launch's SHARD_JOB_ID (kept across its restarts), else
-- mpirun's job id, else one of this process's own (the same for the whole process): its pid and
-- start time, so two jobs started together on a host never share files (math.random is the
-- same sequence in every process).
pcall(ffi.cdef, "int getpid(void);")
local own_id
function M.job_id()
  local id = os.getenv("SHARD_JOB_ID") or os.getenv("OMPI_MCA_ess_base_jobid") or os.getenv("PMIX_NAMESPACE")
  if not id or id == "" then
    own_id = own_id or ("solo%d-%d"):format(os.time(), ffi.C.getpid())
    id = own_id
  end
  return (id:gsub("[^%w_.-]", "_"))
end

function M.path(job, world, rank, kind)
  return ("%s/shard-%s-w%d-r%d.%s"):format(M.dir(), job, world, rank, kind)
end

local function elem_size(dtype) return tonumber(C.sh_dtype_size(tensor.dtype_id(dtype))) end

local function open_file(path, slot_bytes)
  local box = ffi.new("sh_snap*[1]")
  check(C.sh_snap_open(box, path, slot_bytes, 0))
  return ffi.gc(box[0], C.sh_snap_close)
end

local function close_file(f) if f then C.sh_snap_close(ffi.gc(f, nil)) end end

-- The slot's head and JSON description when it is whole, else nil and why.
local function read_slot(f, slot)
  local head = ffi.new("sh_snap_head")
  if C.sh_snap_verify(f, slot, head) ~= 0 then return nil, ffi.string(C.sh_last_error()) end
  local payload = ffi.cast("const uint8_t*", C.sh_snap_slot(f, slot)) + 4096
  local n, meta_n = tonumber(head.payload_bytes), tonumber(head.meta_bytes)
  local ok, meta = pcall(json.decode, ffi.string(payload + n - meta_n, meta_n))
  if not ok then return nil, "its description is not JSON: " .. tostring(meta) end
  return { step = tonumber(head.step), world = head.world, rank = head.rank, meta = meta, payload = payload }
end

-- A number on every rank: the smallest of them.
local function all_min(group, v)
  local t = tensor.tensor({ v }, { dtype = "f64" })
  if group and group:size() > 1 then group:all_reduce(t, "min") end
  local r = t:get({ 1 })
  t:free()
  return r
end

---------------------------------------------------------------------------------------------
-- buddies

-- The pairs that swap snapshots, from each rank's node (nodes[r + 1]) and local rank
-- (locals[r + 1]): ranks ordered by (local rank, node), consecutive ones paired, an odd last
-- one paired with the first too. Returns the list of pairs { a, b }.
function M.pairs(nodes, locals)
  local order = {}
  for r = 0, #nodes - 1 do order[#order + 1] = r end
  table.sort(order, function(a, b)
    if locals[a + 1] ~= locals[b + 1] then return locals[a + 1] < locals[b + 1] end
    if nodes[a + 1] ~= nodes[b + 1] then return nodes[a + 1] < nodes[b + 1] end
    return a < b
  end)
  local out = {}
  for i = 1, #order - 1, 2 do out[#out + 1] = { order[i], order[i + 1] } end
  if #order % 2 == 1 and #order > 1 then out[#out + 1] = { order[#order], order[1] } end
  return out
end

-- This rank's exchange groups: { group =, peer = } for each pair it is in, in the order of
-- M.pairs (the same on every rank, so the broadcasts match).
local function buddy_groups(env)
  local group = env.group
  local mine = tensor.tensor({ group:node(), group:local_rank() }, { dtype = "f64", device = "cpu" })
  local all = group:all_gather(mine)
  local nodes, locals = {}, {}
  for r = 0, group:size() - 1 do nodes[r + 1], locals[r + 1] = all:get({ 2 * r + 1 }), all:get({ 2 * r + 2 }) end
  mine:free(); all:free()
  local pairs_ = M.pairs(nodes, locals)
  -- the disjoint pairs first, then the odd rank's extra one: two splits
  local out = {}
  for phase = 1, 2 do
    local color, peer = -1, nil
    for i, p in ipairs(pairs_) do
      local extra = #pairs_ > 1 and i == #pairs_ and group:size() % 2 == 1
      if (phase == 2) == extra then
        if p[1] == env.rank then color, peer = i, p[2] elseif p[2] == env.rank then color, peer = i, p[1] end
      end
    end
    local g = group:split(color, env.rank, "snapshot buddies")
    if g then g:set_counted(false); out[#out + 1] = { group = g, peer = peer } end
  end
  return out
end

---------------------------------------------------------------------------------------------
-- taking snapshots

local Snap = {}
Snap.__index = Snap

function M.new(o)
  local env = o.env
  local auto = o.interval == "auto"
  local self = setmetatable({ model = o.model, optim = o.optim, data = o.data, env = env, interval = auto and 1 or o.interval,
                              replicas = o.replicas or 0, job = M.job_id(), copies = {},
                              probes = auto and { on = {}, off = {}, n = 0 } or nil }, Snap)
  self.path = M.path(self.job, env.world, env.rank, "snap")
  self.strategy = fsdp.layout(o.model).strategy
  if self.replicas > 0 and env.world > 1 then self.buddies = buddy_groups(env) end
  return self
end

-- The file, opened (or grown) for a payload of `bytes`; the first slot to fill is the one not
-- holding the newest whole snapshot (a restarted job's is kept until a newer one is whole).
function Snap:file_for(bytes)
  if self.file and C.sh_snap_capacity(self.file) >= bytes then return self.file end
  close_file(self.file)
  self.file = open_file(self.path, bytes + META_ROOM)
  local a, b = read_slot(self.file, 0), read_slot(self.file, 1)
  self.slot = (a and (not b or a.step > b.step)) and 1 or 0
  return self.file
end

-- The GPU's side: device state through pinned staging on the snapshot stream.

-- What the copy thread waits for before it reads the staging: the copies' event (looked up
-- when first needed: a build without CUDA has no such symbol).
local event_wait
local function event_wait_fn()
  event_wait = event_wait or ffi.cast("sh_snap_ready_fn", C.sh_cuda_event_synchronize)
  return event_wait
end
local function aligned(n) return math.ceil(tonumber(n) / 256) * 256 end   -- each chunk's place in the staging

local function stream(device, kind)
  local box = ffi.new("sh_cuda_stream*[1]")
  if kind then check(C.sh_cuda_stream_get(box, device, kind)) else check(C.sh_cuda_current_stream(box, device)) end
  return box[0]
end

-- Staging of at least `bytes` on `device`, and the events that order the copies: `ready`
-- (the compute stream's work up to the snapshot) and `copied`.
function Snap:staging_for(device, bytes)
  if not self.gpu then
    local r, c = ffi.new("sh_cuda_event*[1]"), ffi.new("sh_cuda_event*[1]")
    check(C.sh_cuda_event_create(r, device, 0))
    check(C.sh_cuda_event_create(c, device, 0))
    self.gpu = { device = device, stream = stream(device, C.SH_STREAM_SNAPSHOT), ready = r[0], copied = c[0], bytes = 0 }
  end
  local g = self.gpu
  if g.bytes < bytes then
    if g.staging then C.sh_cuda_host_free(g.staging) end
    local box = ffi.new("void*[1]")
    check(C.sh_cuda_host_alloc(box, bytes))
    g.staging, g.bytes = box[0], bytes
  end
  return g
end

-- Queues the copies of the device chunks (tensors[i] for i in list) into the staging, on the
-- snapshot stream after the compute stream's work so far, and points ptrs there. Returns the
-- event the write waits for.
function Snap:stage(tensors, list, ptrs, sizes)
  local total = 0
  for _, i in ipairs(list) do total = total + aligned(sizes[i - 1]) end
  local g = self:staging_for(tensors[list[1]].p.device, total)
  local compute = stream(g.device)
  check(C.sh_cuda_event_record(g.ready, compute))
  check(C.sh_cuda_stream_wait_event(g.stream, g.ready))
  check(C.sh_cuda_set_stream(g.stream))
  local ok, err = pcall(function()
    local at = ffi.cast("uint8_t*", g.staging)
    for _, i in ipairs(list) do
      local t = tensors[i]
      local host = tensor.new_from(C.sh_tensor_wrap_external, at, sizes[i - 1], 1, ffi.new("int64_t[1]", t:numel()), t.p.dtype)
      local rc = C.sh_cuda_copy_async(host.p, t.p)
      host:free()
      check(rc)
      ptrs[i - 1] = at
      at = at + aligned(sizes[i - 1])
    end
    check(C.sh_cuda_event_record(g.copied, g.stream))
  end)
  check(C.sh_cuda_set_stream(compute))
  if not ok then error(err, 0) end
  return g.copied
end

-- The run ended: the staging and the events go (every copy is done by then).
function Snap:free_staging()
  local g = self.gpu
  if not g then return end
  if g.staging then C.sh_cuda_host_free(g.staging) end
  C.sh_cuda_event_destroy(g.ready); C.sh_cuda_event_destroy(g.copied)
  self.gpu = nil
end

-- Tensors of a copy in flight, freed once it is done; on to the buddy exchange.
function Snap:settle_copy()
  local c = self.inflight
  if not c then return end
  self.inflight = nil
  check(C.sh_snap_wait(self.file))
  for i, t in ipairs(c.tensors) do if not c.borrowed[i] then t:free() end end
  if self.buddies then self:exchange(c.slot, 4096 + c.bytes) end
end

-- Swaps the slot just written (used bytes: its head page and payload) with each buddy: the
-- two sizes through a small all-reduce, then one broadcast per member of the pair, the
-- receiver's landing straight in its copy file (the head comes with it, and a restore checks
-- it like any other slot).
local function wrap(ptr, n) return tensor.new_from(C.sh_tensor_wrap_external, ptr, n, 1, ffi.new("int64_t[1]", n), tensor.dtype_id("u8")) end

function Snap:exchange(slot, used)
  self:settle_exchange()
  local works = {}
  for _, b in ipairs(self.buddies) do
    local me = b.group:rank()
    local sizes = tensor.zeros({ 2 }, { dtype = "f64", device = "cpu" })
    sizes:set({ me + 1 }, used)
    b.group:all_reduce(sizes, "sum")
    local theirs_n = sizes:get({ 2 - me })
    sizes:free()
    local copy = self.copies[b.peer]
    if not copy or tonumber(C.sh_snap_slot_bytes(copy)) < theirs_n then
      close_file(copy)
      copy = open_file(M.path(self.job, self.env.world, b.peer, "copy"), theirs_n - 4096)
      self.copies[b.peer] = copy
    end
    local mine, theirs = wrap(C.sh_snap_slot(self.file, slot), used), wrap(C.sh_snap_slot(copy, slot), theirs_n)
    for root = 0, 1 do
      works[#works + 1] = b.group:broadcast(root == me and mine or theirs, root, { async = true })
    end
    works[#works + 1] = mine; works[#works + 1] = theirs
  end
  self.exchanging = works
end

function Snap:settle_exchange()
  local works = self.exchanging
  self.exchanging = nil
  for _, w in ipairs(works or {}) do
    if tensor.is_tensor(w) then w:free() else w:wait(); w:free() end
  end
end

-- interval "auto": the wall time from the last after_step to this one, on when the last took
-- a snapshot, else off; after WARM steps and PAIRS pairs, the interval: the smallest
-- K that keeps the largest share of a step that snapshots cost on any rank under BUDGET.
function Snap:probe(took)
  local p = self.probes
  local now = require("shard.timer").now()
  if p.n > M.WARM + 1 then table.insert(p.last.took and p.on or p.off, now - p.last.at) end
  p.last = { at = now, took = took }
  if #p.off < M.PAIRS then return end
  local stats = require("shard.stats")
  local lost = {}
  for i = 1, M.PAIRS do lost[i] = p.on[i] - p.off[i] end
  local share = -all_min(self.env.group, -stats.median(lost) / stats.median(p.off))   -- the most on any rank
  local k = math.max(1, math.ceil(share / M.BUDGET - 1e-9))
  self.interval, self.probes = k, nil
  if self.env.rank == 0 then
    print(("snapshot: every %d step%s (a snapshot costs %.1f%% of a step's wall time on the rank where it is most, "
      .. "the median of %d steps with one against the next without; the budget is %g%%)"):format(
      k, k == 1 and "" or "s", 100 * share, M.PAIRS, 100 * M.BUDGET))
    io.stdout:flush()
  end
end

-- Whether after_step(step) takes a snapshot: every interval steps; while the cost is measured,
-- the run's first WARM steps (counted from its start: a restarted job's too), then every other step.
function Snap:due(step)
  if not self.probes then return step % self.interval == 0 end
  local p = self.probes
  p.n = p.n + 1
  if p.n == 1 and self.env.rank == 0 then
    print(("snapshot: every 2 steps (while measuring their cost over the next %d steps)"):format(M.WARM + 2 * M.PAIRS + 1))
    io.stdout:flush()
  end
  return p.n <= M.WARM or (p.n - M.WARM) % 2 == 1
end

-- Step `step` is done: it is this rank's progress; every interval steps its state is copied.
function Snap:after_step(step)
  if self.file then C.sh_snap_set_progress(self.file, step) end
  local due = self:due(step)
  if due then self:take(step) end
  if self.probes then self:probe(due) end
end

-- The description of the pieces, as JSON: the same from one snapshot to the next unless the
-- state's layout changed (an optimizer's state made at its first step), so it is encoded
-- again only then (the JSON encoder's time was most of a small model's snapshot on the step's path).
local PIECE_FIELDS = { "tensor", "kind", "name", "state", "start", "count", "dtype", "offset" }
function Snap:pieces_json(entries)
  local c = self.pieces
  local same = c and #c.entries == #entries
  for i = 1, same and #entries or 0 do
    local a, b = c.entries[i], entries[i]
    for _, k in ipairs(PIECE_FIELDS) do same = same and a[k] == b[k] end
    if not same then break end
  end
  if not same then self.pieces = { entries = entries, json = json.encode(entries) } end
  return self.pieces.json
end

-- Starts the copy of the state at the end of step `step`.
function Snap:take(step)
  self:settle_copy()
  self:settle_exchange()
  local entries, tensors, optim_meta, state, borrowed = checkpoint.collect({ model = self.model, optim = self.optim, data = self.data }, true)
  local offset, ptrs, sizes = 0, ffi.new("const void*[?]", #tensors + 1), ffi.new("int64_t[?]", #tensors + 1)
  local on_device, host_live = {}, false
  for i, e in ipairs(entries) do
    local n = tensors[i]:numel() * elem_size(e.dtype)
    e.offset = offset
    ptrs[i - 1], sizes[i - 1] = C.sh_tensor_data(tensors[i].p), n
    if tensors[i].p.device >= 0 then on_device[#on_device + 1] = i else host_live = true end
    offset = offset + n
  end
  local ready = #on_device > 0 and self:stage(tensors, on_device, ptrs, sizes) or nil
  local meta = json.encode{ step = step, world = self.env.world, rank = self.env.rank, layout = fsdp.layout(self.model),
                            state = state, optim = optim_meta, lr = self.optim and self.optim.lr }
  meta = meta:sub(1, -2) .. ',"pieces":' .. self:pieces_json(entries) .. "}"
  ptrs[#tensors], sizes[#tensors] = meta, #meta
  local f = self:file_for(offset + #meta)
  C.sh_snap_set_progress(f, step)
  local head = ffi.new("sh_snap_head")
  head.step, head.world, head.rank, head.meta_bytes = step, self.env.world, self.env.rank, #meta
  ffi.copy(head.strategy, self.strategy, math.min(#self.strategy, 31))
  check(C.sh_snap_write(f, self.slot, head, #tensors + 1, ptrs, sizes, ready and event_wait_fn(), ready, 1))
  -- the chunks (the live state, or views of it) and the pointers stay alive until done
  self.inflight = { tensors = tensors, borrowed = borrowed, meta = meta, ptrs = ptrs, sizes = sizes, slot = self.slot, bytes = offset + #meta,
                    host_live = host_live, device_wait = ready ~= nil }
  self.slot = 1 - self.slot
end

-- The optimizer is about to write the state: a copy that reads live host memory must be done;
-- a device copy is waited for by the optimizer's stream, on the device (once per copy), and
-- settled here only if it already is.
function Snap:before_update()
  local c = self.inflight
  if not c then return end
  if c.host_live then return self:settle_copy() end
  if c.device_wait then
    local g = self.gpu
    check(C.sh_cuda_stream_wait_event(stream(g.device), g.copied))
    c.device_wait = false
  end
  if C.sh_snap_busy(self.file) == 0 then self:settle_copy() end
end

-- The run ended well: waits for what is in flight and removes this rank's files.
function Snap:close()
  self:settle_copy()
  self:settle_exchange()
  self:free_staging()
  close_file(self.file); self.file = nil
  check(C.sh_snap_remove(self.path))
  for peer, f in pairs(self.copies) do
    close_file(f)
    check(C.sh_snap_remove(M.path(self.job, self.env.world, peer, "copy")))
  end
  self.copies = {}
  for _, b in ipairs(self.buddies or {}) do b.group = nil end
end

---------------------------------------------------------------------------------------------
-- restoring

-- Every whole slot of this job's files on this host: by step, then by the rank that took it
-- (its own file preferred to a buddy's copy); the files stay open in `opened`. Also the newest
-- progress any rank recorded, and what was skipped and why.
local function scan(job)
  local pat = "^shard%-" .. job:gsub("[%-%.]", "%%%0") .. "%-w(%d+)%-r(%d+)%.(%a+)$"
  local by_step, opened, skipped, progress = {}, {}, {}, -1
  local names = files.lines_of("ls " .. files.shell_quote(M.dir()) .. " 2>/dev/null")
  local function key(name) return (name:match("%.snap$") and "0" or "1") .. name end   -- own files first
  table.sort(names, function(a, b) return key(a) < key(b) end)
  for _, name in ipairs(names) do
    local w, r, kind = name:match(pat)
    if w and (kind == "snap" or kind == "copy") then
      local path = M.dir() .. "/" .. name
      local ok, f = pcall(open_file, path, 0)
      if not ok then
        skipped[#skipped + 1] = tostring(f)
      else
        opened[#opened + 1] = f
        if kind == "snap" then progress = math.max(progress, tonumber(C.sh_snap_progress(f))) end
        for slot = 0, 1 do
          local rec, why = read_slot(f, slot)
          if rec and rec.world == tonumber(w) and rec.rank == tonumber(r) then
            rec.path, rec.slot, rec.kind = path, slot, kind
            local s = by_step[rec.step] or {}
            by_step[rec.step] = s
            s[rec.world] = s[rec.world] or {}
            s[rec.world][rec.rank] = s[rec.world][rec.rank] or rec
          elseif rec then
            skipped[#skipped + 1] = ("%s slot %d: it says world %d rank %d"):format(path, slot, rec.world, rec.rank)
          else
            skipped[#skipped + 1] = why
          end
        end
      end
    end
  end
  return by_step, opened, skipped, progress
end

-- The world whose snapshots at this step this rank can restore from: its own rank's slot at
-- the same world size, or every old rank's slot (another world size: a reshard).
local function usable(worlds, env)
  local same = worlds[env.world]
  if same and same[env.rank] then return env.world end
  for w, ranks in pairs(worlds) do
    local all = true
    for r = 0, w - 1 do all = all and ranks[r] ~= nil end
    if all then return w end
  end
end

-- One piece source over a slot's payload, as checkpoint's reader opens files.
local Source = {}
Source.__index = Source
function Source:info(name) local p = self.pieces[name]; return p and { numel = p.count, dtype = p.dtype } end
function Source:read(name, dst, first, n)
  local p = self.pieces[name]
  local esz = elem_size(p.dtype)
  ffi.copy(C.sh_tensor_data(dst.p), self.payload + p.offset + first * esz, n * esz)
end
function Source:close() end

-- A checkpoint index over the slots of one step and world (each piece once), and the opener
-- of its sources.
local function index_of(ranks, step)
  local index = { step = step, params = {}, ranks = {} }
  local sources, seen = {}, {}
  for r, rec in pairs(ranks) do
    local key = ("%s#%d"):format(rec.path, rec.slot)
    local src = setmetatable({ payload = rec.payload, pieces = {} }, Source)
    sources[key] = src
    index.ranks[r + 1] = rec.meta.state
    index.optim = index.optim or rec.meta.optim
    index.lr = index.lr or rec.meta.lr
    for _, e in ipairs(rec.meta.pieces) do
      src.pieces[e.tensor] = e
      local id = e.tensor .. "/" .. e.count
      if not seen[id] then
        seen[id] = true
        local piece = { file = key, tensor = e.tensor, start = e.start, count = e.count }
        if e.kind == "param" then
          local p = index.params[e.name] or { shape = e.shape, dtype = e.dtype, pieces = {} }
          index.params[e.name] = p
          table.insert(p.pieces, piece)
        else
          index.optim.state = index.optim.state or {}
          local by_name = index.optim.state[e.state] or {}
          index.optim.state[e.state] = by_name
          by_name[e.name] = by_name[e.name] or {}
          table.insert(by_name[e.name], piece)
        end
      end
    end
  end
  if not index.ranks[1] then for _, st in pairs(index.ranks) do index.ranks[1] = st; break end end
  return index, function(key) return sources[key] end
end

-- The step of the newest disk checkpoint in dir, or nil.
local function disk_step(dir)
  local path = dir and checkpoint.latest(dir)
  return path and files.readable(path .. "/index.json") and tonumber(path:match("step%-(%d+)$")) or nil
end

-- Restores the newest state every rank can (see the header); returns the step (0: none) and
-- how: { source = "memory" | "disk" | "none", world =, own =, copies =, lost =, skipped = }.
-- Every rank calls it.
function M.restore(o)
  local env = o.env
  local by_step, opened, skipped, progress = scan(M.job_id())
  local disk = disk_step(o.ckpt_dir)
  local steps = {}
  for s in pairs(by_step) do steps[#steps + 1] = s end
  table.sort(steps, function(a, b) return a > b end)
  local function mine_below(bound)   -- the newest step this rank can restore, at most bound
    for _, s in ipairs(steps) do if s <= bound and usable(by_step[s], env) then return s end end
    return -1
  end
  local bound, chosen = math.huge, -1
  while true do
    local best = math.max(mine_below(bound), disk and disk <= bound and disk or -1)
    chosen = all_min(env.group, best)
    if chosen < 0 then break end
    local can = chosen == disk or usable(by_step[chosen] or {}, env) ~= nil
    if all_min(env.group, can and 1 or 0) == 1 then break end
    bound = chosen - 1
  end
  local how = { source = "none", skipped = skipped, lost = progress >= 0 and chosen >= 0 and progress - chosen or nil }
  local s = { model = o.model, optim = o.optim, data = o.data }
  if chosen >= 0 and by_step[chosen] and usable(by_step[chosen], env) then
    local w = usable(by_step[chosen], env)
    local ranks = by_step[chosen][w]
    local index, open = index_of(ranks, chosen)
    checkpoint.load_index(index, s, ("snapshots of step %d"):format(chosen), open)
    how.source, how.world, how.own, how.copies = "memory", w, 0, 0
    for _, rec in pairs(ranks) do
      if rec.kind == "snap" then how.own = how.own + 1 else how.copies = how.copies + 1 end
    end
  elseif chosen >= 0 then
    checkpoint.load(o.ckpt_dir, s)
    how.source = "disk"
  end
  for _, f in ipairs(opened) do close_file(f) end
  return math.max(chosen, 0), how
end

return M
