-- shard.tools.launch: `shard launch --nproc N [--all] FILE [--key=value ...]` starts N local ranks
-- of `shard run FILE ...` through mpirun. It prints rank 0's output (every rank's, prefixed
-- "[rank R] ", with --all), keeps the others' last lines, and when a rank fails mpirun stops
-- the rest within a second or so (a failing rank skips MPI_Finalize, see comm.h); launch
-- then shows that rank's last lines and returns a non-zero exit code.
--
-- Across hosts, two ways:
--   --hosts a:2,b:2 or --hostfile FILE (lines "host [slots=N]"), with --nproc_per_node N for
--   hosts given without a count: one mpirun over every host (its remote-shell agent, ssh by
--   default, starts a daemon on each; ranks talk TCP across hosts and shared memory inside
--   one; --net CIDR|IFACE pins both to a network; --map-by slot (default: each host's ranks
--   consecutive) or node (round robin)). Each rank learns its node and local rank from MPI.
--   When a host is lost mpirun's daemon there stops answering: launch names the node and its
--   ranks, and stops mpirun if it has not ended GRACE seconds after the first failure.
--   --nnodes M > 1 with --node-rank, --master-addr, --master-port: each node's launch starts
--   its N ranks directly with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
--   LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT). CUDA collectives then
--   rendezvous over TCP (NCCL); CPU collectives need --hosts (one mpirun) instead.
--
-- --max_restarts N (torchrun's elastic semantics): when a rank exits non-zero, is killed or
-- times out (--timeout), the job is ended as above and started again, up to N times; the
-- ranks of a restart (SHARD_RESTART=1, 2, ...; SHARD_JOB_ID the same each time) go on from
-- the newest state every rank can restore (shard.snapshot: in-memory snapshots, else the
-- newest checkpoint). Once the restarted job completes its first step, launch prints one
-- line: which rank failed and how, the step restored, the steps lost, and the seconds from
-- the failure to that step. The job's snapshot files (/dev/shm) go when launch ends.
-- --min_nodes M (with --hosts/--hostfile): when a host is lost and at least M hosts remain,
-- the restart leaves it out; the ranks, fewer now, reshard the newest state from the copies
-- that survive (shard.snapshot's buddies on the other hosts, --snapshot_replicas=1).
local argv = require("shard.argv")
local job = require("shard.tools.job")
local timer = require("shard.timer")
local files = require("shard.files")

local M = {}

local USAGE = "usage: shard launch --nproc N [--hosts H:N,H:N | --hostfile FILE] [--net CIDR|IFACE] [--map-by slot|node] [--nnodes M --node-rank R --master-addr A --master-port P] [--all] [--timeout SECONDS] [--max_restarts N [--min_nodes M]] FILE [--key=value ...]"
-- Seconds mpirun gets to end the job after the first sign of a failure before launch stops it
-- (a lost host's daemon never answers mpirun's order to stop its ranks).
local GRACE = tonumber(os.getenv("SHARD_LAUNCH_GRACE") or "") or 10
local TAIL = 40          -- lines kept per rank for the failure report

local function fail_usage(msg)
  io.stderr:write("shard launch: ", msg, "\n", USAGE, "\n")
  return 2
end

local quote = require("shard.ffi").shell_quote

-- The shard executable to start the ranks with: this one when it is bin/shard-like,
-- else $SHARD_HOME/bin/shard.
function M.shard_exe()
  local ffi, C = require("ffi"), require("shard.tools.sys").C
  local buf = ffi.new("char[4096]")
  local ok, n = pcall(function() return tonumber(C.readlink("/proc/self/exe", buf, 4095)) end)
  local exe = ok and n > 0 and ffi.string(buf, n) or nil
  if exe and exe:match("shard[^/]*$") then return exe end
  return require("shard.ffi").root .. "/bin/shard"
end

local OPTIONS = {
  { "nproc", "count", aliases = { "nproc-per-node" } }, { "nnodes", "count", default = 1 },
  { "node-rank", "count", default = 0 }, { "master-addr", "string", default = "127.0.0.1" },
  { "master-port", "count", default = 29500 }, { "hosts", "string", aliases = { "-H" }, key = "hosts_arg" },
  { "hostfile", "string" }, { "net", "string" }, { "map-by", "choice", oneof = { "slot", "node" } },
  { "all", "flag", default = false }, { "timeout", "seconds" },
  { "max_restarts", "count", default = 0 }, { "min_nodes", "count", min = 1 },
}

-- The options; FILE and its arguments are o.file and o.rest.
function M.parse(args)
  local o, pos = argv.parse(args, { options = OPTIONS, stop = true, where = "before FILE" })
  o.file, o.rest = pos[1], { unpack(pos, 2) }
  if o.hosts_arg and o.hostfile then error({ usage = "give --hosts or --hostfile, not both" }) end
  if (o.hosts_arg or o.hostfile) and o.nnodes > 1 then
    error({ usage = "--hosts/--hostfile start every node through one mpirun; --nnodes is for torchrun-style starts, one launch per node" })
  end
  if o.min_nodes and not (o.hosts_arg or o.hostfile) then error({ usage = "--min_nodes is for --hosts/--hostfile" }) end
  if o.hosts_arg or o.hostfile then
    M.parse_hosts(o)
    if o.min_nodes and o.min_nodes > #o.hosts then
      error({ usage = ("--min_nodes %d is more than the %d hosts given"):format(o.min_nodes, #o.hosts) })
    end
    if not o.file then error({ usage = "missing FILE" }) end
    return o
  end
  if not o.nproc or o.nproc < 1 then error({ usage = "--nproc N (N >= 1) is required" }) end
  if o.nnodes < 1 or o.node_rank >= o.nnodes then error({ usage = ("--node-rank %d is not below --nnodes %d"):format(o.node_rank, o.nnodes) }) end
  if not o.file then error({ usage = "missing FILE" }) end
  return o
end

-- The hosts of --hosts "a:2,b" or --hostfile (Open MPI's format: "host slots=N", # comments):
-- o.hosts = { { name =, slots = } }, a count given with the host or else --nproc_per_node.
function M.parse_hosts(o)
  local entries = {}
  if o.hosts_arg then
    for item in o.hosts_arg:gmatch("[^,]+") do
      local name, n = item:match("^([^:]+):(.*)$")
      entries[#entries + 1] = { name = name or item, count = n, what = "--hosts entry '" .. item .. "'" }
    end
  else
    local f = io.open(o.hostfile, "r")
    if not f then error({ usage = "cannot open hostfile " .. o.hostfile }) end
    local ln = 0
    for line in f:lines() do
      ln = ln + 1
      line = line:gsub("#.*", "")
      local name = line:match("^%s*(%S+)")
      if name then
        entries[#entries + 1] = { name = name, count = line:match("slots%s*=%s*(%S+)"),
                                  what = ("%s line %d"):format(o.hostfile, ln) }
      end
    end
    f:close()
  end
  if #entries == 0 then error({ usage = "no hosts in " .. (o.hostfile or "--hosts") }) end
  o.hosts = {}
  local seen = {}
  for _, e in ipairs(entries) do
    local n = e.count and tonumber(e.count) or o.nproc
    if o.nproc and o.hostfile then n = o.nproc end   -- --nproc_per_node overrides slots=
    if not n or n < 1 or n % 1 ~= 0 then
      error({ usage = e.what .. (e.count and (" has '" .. e.count .. "' ranks; expected a whole number >= 1")
                                  or " gives no rank count: add :N (slots=N) or --nproc_per_node N") })
    end
    if seen[e.name] then error({ usage = "host " .. e.name .. " is listed twice" }) end
    seen[e.name] = true
    o.hosts[#o.hosts + 1] = { name = e.name, slots = n }
  end
end

-- rank -> host name for the hosts as mpirun maps them (--map-by slot: each host's ranks
-- consecutive; node: one per host in turn). nil on one host.
function M.layout(o)
  if not o.hosts then return nil end
  local host_of, left = {}, {}
  for i, h in ipairs(o.hosts) do left[i] = h.slots end
  local rank = 0
  if o.map_by == "node" then
    local more = true
    while more do
      more = false
      for i, h in ipairs(o.hosts) do
        if left[i] > 0 then host_of[rank] = h.name; rank = rank + 1; left[i] = left[i] - 1; more = true end
      end
    end
  else
    for _, h in ipairs(o.hosts) do
      for _ = 1, h.slots do host_of[rank] = h.name; rank = rank + 1 end
    end
  end
  return host_of
end

local function world_size(o)
  if not o.hosts then return o.nproc * o.nnodes end
  local n = 0
  for _, h in ipairs(o.hosts) do n = n + h.slots end
  return n
end

local function is_root() return files.lines_of("id -u 2>/dev/null")[1] == "0" end

-- The ranks' command; --timeout reaches every rank's collectives as SHARD_COMM_TIMEOUT, and
-- each rank keeps its flight record (comm.h) in the launch's directory.
local function run_args(o)
  local parts = { quote(M.shard_exe()), "run", quote(o.file) }
  local env = { "env", "SHARD_FLIGHT_DIR=" .. quote(o.flight_dir), "SHARD_JOB_ID=" .. quote(o.job_id),
                "SHARD_RESTART=" .. (o.restart or 0), "SHARD_MAX_RESTARTS=" .. o.max_restarts }
  if o.timeout then env[#env + 1] = "SHARD_COMM_TIMEOUT=" .. o.timeout end
  local snap_dir = os.getenv("SHARD_SNAPSHOT_DIR")   -- the same on every host
  if snap_dir then env[#env + 1] = "SHARD_SNAPSHOT_DIR=" .. quote(snap_dir) end
  table.insert(parts, 1, table.concat(env, " "))
  for _, a in ipairs(o.rest) do parts[#parts + 1] = quote(a) end
  return table.concat(parts, " ")
end

-- The command that starts every local rank; its output lines are tagged with the rank.
local function mpirun_command(o)
  local cmd = { "mpirun", "--tag-output", "-np", o.nproc, "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1" }
  if o.hosts then
    local list = {}
    for _, h in ipairs(o.hosts) do list[#list + 1] = h.name .. ":" .. h.slots end
    -- TCP between hosts, shared memory inside one
    cmd = { "mpirun", "--tag-output", "-np", world_size(o), "-H", quote(table.concat(list, ",")), "--map-by", o.map_by or "slot",
            "--mca", "btl", "self,vader,tcp", "--mca", "pml", "ob1" }
    -- mpirun reaches the other hosts through launch's agent, which runs the user's (ssh by
    -- default, or OMPI_MCA_plm_rsh_agent) and says which host's daemon ended badly: when a
    -- host's processes die mpirun only says a daemon failed, not where.
    if o.agent then
      cmd[#cmd + 1] = "--mca plm_rsh_agent " .. quote(o.agent) .. " --mca plm_rsh_no_tree_spawn 1"
    end
    if o.net then
      for _, k in ipairs { "btl_tcp_if_include", "oob_tcp_if_include" } do
        cmd[#cmd + 1] = "--mca " .. k .. " " .. quote(o.net)
      end
    end
  end
  if is_root() then table.insert(cmd, 2, "--allow-run-as-root") end
  -- a job that will be restarted: its survivors are killed at once rather than a second after
  -- mpirun's SIGTERM (Open MPI's odls_base_sigkill_timeout), which the restart would wait for
  if o.max_restarts > 0 then cmd[#cmd + 1] = "--mca odls_base_sigkill_timeout 0" end
  return table.concat(cmd, " ") .. " " .. run_args(o)
end

-- Multi-node: N ranks started directly with torchrun-style variables; bash's wait -n stops
-- the rest as soon as one fails. Output lines are tagged like mpirun's.
local function env_command(o)
  local world = o.nproc * o.nnodes
  local lines = { "pids=''" }
  for i = 0, o.nproc - 1 do
    local rank = o.node_rank * o.nproc + i
    lines[#lines + 1] = ("( RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d GROUP_RANK=%d MASTER_ADDR=%s MASTER_PORT=%d %s 2>&1 | sed -u 's/^/[1,%d]<stdout>:/'; exit ${PIPESTATUS[0]} ) & pids=\"$pids $!\"")
      :format(rank, world, i, o.nproc, o.node_rank, quote(o.master_addr), o.master_port, run_args(o), rank)
  end
  lines[#lines + 1] = "n=" .. o.nproc .. "; rc=0"
  lines[#lines + 1] = "while [ $n -gt 0 ]; do wait -n; r=$?; n=$((n-1)); if [ $r -ne 0 ]; then rc=$r; kill $pids 2>/dev/null; break; fi; done"
  lines[#lines + 1] = "wait; exit $rc"
  return "bash -c " .. quote(table.concat(lines, "\n"))
end

-- mpirun's lines that say the job is failing: from here it has GRACE seconds to end.
local FAILING = { "Primary job%s+terminated normally, but", "mpirun noticed that process rank", "ORTE has lost communication",
                  "exited on signal", "MPI_ABORT was invoked", "An ORTE daemon has unexpectedly failed", "mpirun has exited due to" }
local function failing(line)
  for _, pat in ipairs(FAILING) do if line:find(pat) then return true end end
  return false
end

-- mpirun --tag-output puts "[job,rank]<stream>:" before each write of a rank, not each line:
-- a write without a newline runs on into the next write, of any rank, on the same line.
local TAG = "%[%d+,(%d+)%]<(%a+)>:"
local FRAME = ("-"):rep(74)   -- the frame of Open MPI's messages, glued to a rank's partial line

-- A line of mpirun's output: the text before any tag (mpirun's own) and the tagged writes,
-- { rank =, stream =, text = } each.
function M.split(line)
  local writes, pos = {}, 1
  local s = line:find(TAG)
  local head = line:sub(1, (s or #line + 1) - 1)
  while s do
    local _, e, r, name = line:find(TAG, s)
    local nxt = line:find(TAG, e + 1)
    writes[#writes + 1] = { rank = tonumber(r), stream = name, text = line:sub(e + 1, (nxt or #line + 1) - 1) }
    s = nxt
  end
  return head, writes
end

-- Open MPI's own words inside a rank's output that say nothing to the user: the shared-memory
-- copy from a peer that just died ("Read -1, expected 393728, errno = 3").
local function noise(text) return text:find("^%[[^%]]*%] Read %-?%d+, expected %d+, errno = %d+$") ~= nil end

-- Routes mpirun's lines: each rank's writes joined into whole lines, kept (the last TAIL of
-- each rank) and shown (rank 0's, or every rank's with --all); mpirun's own lines kept apart.
local Router = {}
Router.__index = Router

function M.router(o, out, err)
  return setmetatable({ o = o, out = out or io.stdout, err = err or io.stderr, kept = {}, partial = {},
                        untagged = {}, signal = {} }, Router)
end

function Router:show(r, name, text)
  if noise(text) then return end
  if self.o.watch then self.o.watch(r, text) end
  local k = self.kept[r] or {}
  self.kept[r] = k
  k[#k + 1] = text
  if #k > TAIL then table.remove(k, 1) end
  -- Open MPI's handler names the signal a rank received; the abort that may follow in its
  -- backtrace is what mpirun then reports
  local sig, num = text:match("^%[[^%]]*%] Signal: (.-) %((%d+)%)$")
  if sig and not self.signal[r] then self.signal[r] = ("signal %s (%s)"):format(num, sig) end
  local f
  if self.o.all then f = self.out; text = "[rank " .. r .. "] " .. text
  elseif r == 0 then f = name == "stderr" and self.err or self.out end
  if f then f:write(text, "\n"); f:flush() end
end

function Router:line(line)
  local head, writes = M.split(line)
  if head ~= "" then self.untagged[#self.untagged + 1] = head end
  for i, w in ipairs(writes) do
    local key = w.rank .. w.stream
    local text = (self.partial[key] or "") .. w.text
    self.partial[key] = nil
    if i < #writes then
      self.partial[key] = text
    elseif #text > #FRAME and text:sub(-#FRAME) == FRAME then
      self:show(w.rank, w.stream, text:sub(1, -#FRAME - 1))
      self.untagged[#self.untagged + 1] = FRAME
    else
      self:show(w.rank, w.stream, text)
    end
  end
end

-- The writes still waiting for their newline when the job ended, as lines.
function Router:finish()
  local keys = {}
  for key in pairs(self.partial) do keys[#keys + 1] = key end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local r, name = key:match("^(%d+)(%a+)$")
    self:show(tonumber(r), name, self.partial[key])
  end
  self.partial = {}
end

-- Seconds the job gets to end after a signal forwarded to it, before it is killed.
local SIGNAL_GRACE = tonumber(os.getenv("SHARD_LAUNCH_SIGNAL_GRACE") or "") or 5
local SIGTERM, SIGKILL = 15, 9

-- Sends sig to every process of the job, routes its output while it ends, and kills what is
-- left after `grace` seconds.
local function end_job(j, sig, grace, route)
  j:signal(sig)
  local deadline = timer.now() + grace
  while not j:exited() and timer.now() < deadline do route(j:read(100)) end
  j:signal(SIGKILL)
  j:exited(true)
  route(j:rest())
  -- ranks that outlive mpirun (a stopped one, one that ignores sig) hold no pipe of ours
  deadline = timer.now() + grace
  while #j:processes() > 0 and timer.now() < deadline do j:signal(SIGKILL); job.sleep(100) end
end

-- Runs cmd, routing its lines; returns mpirun's exit code (128 + N when a signal ended it)
-- and the router. A signal to the launcher (job.trap) is forwarded to the whole job: o.signal
-- says which. When mpirun has not ended GRACE seconds after the first failure, launch stops it
-- (o.stopped).
local function stream(cmd, o)
  local j = job.start(cmd, o.flight_dir)
  local router = M.router(o)
  local stop_at
  local function route(lines)
    for _, line in ipairs(lines or {}) do
      -- a rank's collective timeout counts too: after a cut link mpirun may say nothing at all
      if not stop_at and (failing(line) or line:find("timed out after", 1, true)) then
        stop_at = timer.now() + GRACE
        o.failed_at = o.failed_at or timer.now()
      end
      router:line(line)
    end
  end
  while not j:exited() do
    local lines = j:read(200)
    route(lines)
    if not lines then j:exited(true) end
    o.signal = job.take()
    if o.signal then end_job(j, o.signal, SIGNAL_GRACE, route) end
    if stop_at and timer.now() > stop_at and not o.stopped then
      o.stopped = true
      end_job(j, SIGTERM, 3, route)
    end
  end
  route(j:rest())
  router:finish()
  local st = j:exited()
  local rc = st.code or 128 + st.signal
  if rc ~= 0 then o.failed_at = o.failed_at or timer.now() end
  return rc, router
end

-- The rank mpirun names as the first to fail, and the signal that ended it when one did
-- ("mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).").
local function failed_rank(untagged)
  for _, line in ipairs(untagged) do
    local r, sig, name = line:match("process rank (%d+) with PID %d+ on node %S+ exited on signal (%d+) %(([^)]*)%)")
    if r then return tonumber(r), ("signal %s (%s)"):format(sig, name) end
    r = line:match("Process name:%s*%[%[%d+,%d+%],(%d+)%]")
    if r then return tonumber(r) end
  end
end

-- The host whose daemon mpirun lost ("Remote daemon: [[5,0],1] on node b", or the agent's
-- report), if any.
local function lost_node(untagged)
  local lost = false
  for _, line in ipairs(untagged) do
    local h = line:match("^__shard_launch_host_lost=(%S+)")
    if h then return h end
    if line:find("ORTE has lost communication") or line:find("daemon has unexpectedly failed") then lost = true end
    local host = lost and line:match("Remote daemon:.-on node (%S+)")
    if host then return host end
  end
end

local function list(ranks) table.sort(ranks); return table.concat(ranks, ",") end

-- "node b (ranks 2,3)" for a host of the layout.
local function node_ranks(layout, host)
  local ranks = {}
  for r, h in pairs(layout or {}) do if h == host then ranks[#ranks + 1] = r end end
  return ("node %s (rank%s %s)"):format(host, #ranks == 1 and "" or "s", list(ranks))
end

-- The launcher's one-line verdict on a failed job.
local function verdict(rank, signal, rc, o, untagged)
  local layout = M.layout(o)
  local host = layout and not rank and lost_node(untagged)
  if host then
    return ("shard launch: lost %s: mpirun lost its daemon there (the host went down, or the network to it)"):format(node_ranks(layout, host))
  end
  local where = layout and rank and layout[rank] and (" on " .. node_ranks(layout, layout[rank])) or ""
  if rank and signal then return ("shard launch: rank %d was killed by %s%s"):format(rank, signal, where) end
  if rank then return ("shard launch: rank %d failed%s"):format(rank, where) end
  -- no rank named but mpirun died of a signal: Open MPI's own teardown (seen when a host's
  -- network is cut: PMIx_Finalize in mpirun faults while its daemon there is unreachable)
  if rc > 128 and rc < 160 then
    return ("shard launch: mpirun itself ended on signal %d while stopping the job (exit code %d)"):format(rc - 128, rc)
  end
  return ("shard launch: exit code %d"):format(rc)
end

---------------------------------------------------------------------------------------------
-- the diagnosis of a hang, from the ranks' flight records

local MAGIC = "shflt03"

-- The record in bytes at offset, or nil.
local function parse_record(bytes, offset)
  local ffi = require("ffi")
  local size = ffi.sizeof("sh_flight_record")
  if not bytes or #bytes < offset + size then return nil end
  local buf = ffi.new("uint8_t[?]", size)
  ffi.copy(buf, bytes:sub(offset + 1, offset + size), size)
  local rec = ffi.cast("sh_flight_record *", buf)
  local kind_name = require("shard.comm").kind_name   -- the runtime's names of the collective kinds
  if ffi.string(rec.magic, 7) ~= MAGIC then return nil end
  local groups = {}
  for i = 0, rec.n_groups - 1 do
    local g = rec.groups[i]
    groups[ffi.string(g.name)] = { issued = tonumber(g.issued), kind = kind_name(g.last_kind), size = g.size }
  end
  return { groups = groups, wait_state = rec.wait_state, wait_group = ffi.string(rec.wait_group),
           wait_seq = tonumber(rec.wait_seq), wait_kind = kind_name(rec.wait_kind), wait_for = rec.wait_for,
           wait_since = rec.wait_since, active_at = rec.active_at, node = ffi.string(rec.node_name) }
end

local function slurp(path) return (files.read_file(path)) end

-- Every rank's record: as the first rank to time out copied them (timeout.flight, before the
-- job's teardown resumed a stopped rank or moved any other), else as the rank left it.
local function read_records(dir, world)
  local ffi = require("ffi")
  require("shard.ffi")                        -- declares sh_flight_record
  local size = ffi.sizeof("sh_flight_record")
  local snapshot = slurp(dir .. "/timeout.flight")
  local recs = {}
  for r = 0, world - 1 do
    recs[r] = parse_record(snapshot, r * size) or parse_record(slurp(("%s/rank%d.flight"):format(dir, r)), 0)
  end
  return recs
end

-- "2,3" on one host; "0,1 on node a, 2 on node b" across hosts.
local function by_node(ranks, node_of)
  if not node_of then return list(ranks) end
  local groups, order = {}, {}
  for _, r in ipairs(ranks) do
    local h = node_of[r] or "?"
    if not groups[h] then groups[h] = {}; order[#order + 1] = h end
    table.insert(groups[h], r)
  end
  table.sort(order, function(a, b) return math.min(unpack(groups[a])) < math.min(unpack(groups[b])) end)
  local parts = {}
  for _, h in ipairs(order) do parts[#parts + 1] = list(groups[h]) .. " on node " .. h end
  return table.concat(parts, ", ")
end

local function wait_key(rec) return ("%s\0%d\0%s"):format(rec.wait_group, rec.wait_seq, tostring(rec.wait_kind)) end

-- Each host of a record (node_of: rank -> host, from the records where they say, else layout),
-- and the hosts at least one record came from; nil, {} on one host.
local function hosts_of(recs, world, layout)
  if not layout then return nil, {} end
  local node_of, recorded = {}, {}
  for r = 0, world - 1 do node_of[r] = recs[r] and recs[r].node ~= "" and recs[r].node or layout[r] end
  for r = 0, world - 1 do if recs[r] then recorded[node_of[r]] = true end end
  return node_of, recorded
end

-- The newest moment a record moved, per host (each host's clock: the records were read at
-- about then), and whether any rank timed out.
local function latest_by_host(recs, world)
  local latest, timed_out = {}, false
  for r = 0, world - 1 do
    local rec = recs[r]
    if rec then latest[rec.node] = math.max(latest[rec.node] or 0, rec.active_at) end
    timed_out = timed_out or (rec ~= nil and rec.wait_state == 2)
  end
  return latest, timed_out
end

-- The stuck collective's record: the collective most waiting ranks are in (ties: the longest
-- wait), so that a rank waiting in another one is the one out of step, not the other way round.
local function stuck_record(recs, world, seconds_waited)
  local votes = {}
  for r = 0, world - 1 do
    local rec = recs[r]
    if rec and rec.wait_state >= 1 then votes[wait_key(rec)] = (votes[wait_key(rec)] or 0) + 1 end
  end
  local stuck, best
  for r = 0, world - 1 do
    local rec = recs[r]
    if rec and rec.wait_state >= 1 then
      local v = votes[wait_key(rec)]
      if not stuck or v > best or (v == best and seconds_waited(rec) > seconds_waited(stuck)) then stuck, best = rec, v end
    end
  end
  return stuck
end

-- Sorts every rank by where it stands against the stuck collective (kind #n on group g):
-- waited (reached it), behind (never did), ahead (finished it and went on), unknown (no
-- record from its host), and lines for the others; also the longest wait in it.
local function classify_ranks(c)
  local recs, stuck, g, n, kind = c.recs, c.stuck, c.stuck.wait_group, c.stuck.wait_seq, c.stuck.wait_kind
  local out = { waited = {}, behind = {}, other = {}, unknown = {}, ahead = {}, longest = 0 }
  for r = 0, c.world - 1 do
    local rec = recs[r]
    local mine = rec and rec.groups[g]
    local idle = rec and c.still(rec)
    local in_it = rec and rec.wait_state >= 1 and rec.wait_group == g and rec.wait_seq == n and rec.wait_kind == kind
    -- issued the same collective without waiting in it yet (an async one) when the records
    -- were copied: it reached it
    local issued_it = not in_it and mine and mine.issued == n and mine.kind == kind
    if not rec and c.node_of and not c.recorded[c.node_of[r]] then
      out.unknown[#out.unknown + 1] = r
    elseif (in_it or issued_it) and not idle then
      out.waited[#out.waited + 1] = r
      if in_it then out.longest = math.max(out.longest, c.seconds_waited(rec)) end
    elseif not rec or (mine and mine.issued < n) or (not mine and c.world == (stuck.groups[g] or {}).size) then
      out.behind[#out.behind + 1] = r
    elseif idle then
      out.other[#out.other + 1] = ("rank %d %s %s #%d on group %s but its record has not moved for %.3g s: it is stopped, or busy outside collectives"):format(
        r, in_it and "waits in" or "issued", kind, n, g, idle)
    elseif mine and mine.issued > n and rec.wait_seq ~= n then
      out.ahead[#out.ahead + 1] = r       -- finished it and went on
    elseif mine and mine.issued == n and rec.wait_seq ~= n then
      out.other[#out.other + 1] = ("rank %d issued %s #%d on %s instead"):format(r, mine.kind, n, g)
    elseif mine and mine.issued == n and mine.kind ~= kind then
      out.other[#out.other + 1] = ("rank %d issued %s #%d on %s"):format(r, mine.kind, n, g)
    end
  end
  return out
end

-- The hosts of the ranks that reached the collective, and of those that finished it on other
-- hosts; apart when some finished it only on hosts none of the waiting ones is on.
local function split_hosts(k, node_of)
  local hosts, seen = {}, {}
  for _, r in ipairs(k.waited) do
    local h = node_of and node_of[r]
    if h and not seen[h] then seen[h] = true; hosts[#hosts + 1] = h end
  end
  local ahead_hosts, apart = {}, #k.ahead > 0 and node_of ~= nil
  for _, r in ipairs(k.ahead) do
    local h = node_of and node_of[r]
    if seen[h] then apart = false elseif h and not ahead_hosts[h] then ahead_hosts[h] = true; ahead_hosts[#ahead_hosts + 1] = h end
  end
  table.sort(hosts); table.sort(ahead_hosts)
  return hosts, ahead_hosts, apart
end

-- The diagnosis line from the classified ranks.
local function diagnosis_line(k, node_of, kind, n, g)
  local parts = {}
  if #k.behind > 0 then
    parts[#parts + 1] = ("rank%s %s never reached %s #%d on group %s"):format(#k.behind > 1 and "s" or "", by_node(k.behind, node_of), kind, n, g)
  end
  for _, line in ipairs(k.other) do parts[#parts + 1] = line end
  if #k.unknown > 0 then
    parts[#parts + 1] = ("no flight record from rank%s %s (SHARD_FLIGHT_DIR is not shared with that host)"):format(
      #k.unknown > 1 and "s" or "", by_node(k.unknown, node_of))
  end
  local hosts, ahead_hosts, apart = split_hosts(k, node_of)
  -- ranks that finished the collective on other nodes than the ones still in it: its last
  -- data did not get from those nodes to these
  if #parts == 0 and apart then
    return ("ranks %s finished %s #%d on group %s and went on, ranks %s still waited %.3g s in it: its data did not get between them; check the network between nodes %s and %s"):format(
      by_node(k.ahead, node_of), kind, n, g, by_node(k.waited, node_of), k.longest, table.concat(ahead_hosts, ", "), table.concat(hosts, ", "))
  end
  if #k.ahead > 0 then
    parts[#parts + 1] = ("rank%s %s finished %s #%d on group %s and went on"):format(#k.ahead > 1 and "s" or "", by_node(k.ahead, node_of), kind, n, g)
  end
  if #parts == 0 and #hosts > 1 then
    -- everyone arrived and still nothing moved: the data did not get between the nodes
    return ("ranks %s all reached %s #%d on group %s and timed out after %.3g s: no rank is behind, so its data did not get between them; check the network between nodes %s"):format(
      by_node(k.waited, node_of), kind, n, g, k.longest, table.concat(hosts, " and "))
  end
  if #parts == 0 then parts[1] = ("no rank is behind %s #%d on group %s"):format(kind, n, g) end
  return ("%s; rank%s %s waited %.3g s in it"):format(table.concat(parts, "; "), #k.waited > 1 and "s" or "", by_node(k.waited, node_of), k.longest)
end

-- One line naming the rank that never reached (or mismatched) the collective the others
-- timed out in, as PyTorch's desync debug does; nil when no rank timed out.
-- Across hosts (layout: rank -> host) ranks are named with their nodes; a node none of whose
-- ranks left a record (SHARD_FLIGHT_DIR not shared with that host) is said to be unknown
-- rather than behind, and when every rank reached the collective, the network between the
-- nodes is named.
function M.diagnose(dir, world, layout)
  local recs = read_records(dir, world)
  local node_of, recorded = hosts_of(recs, world, layout)
  local latest, timed_out = latest_by_host(recs, world)
  if not timed_out then return nil end
  -- How long a rank had waited in its collective then: its whole wait if it timed out, else
  -- up to that moment (the first rank to time out copies the records while the others wait).
  local function seconds_waited(rec)
    return rec.wait_state == 2 and rec.wait_for or math.max(0, (latest[rec.node] or 0) - rec.wait_since)
  end
  local stuck = stuck_record(recs, world, seconds_waited)
  -- Seconds since a rank's record last moved, when on the stuck rank's host (the clock is the
  -- host's): a rank that waits polls its record every millisecond, so one still for a second
  -- or more is stopped, or busy outside any collective.
  local now = latest[stuck.node]
  local function still(rec)
    local idle = rec.node == stuck.node and rec.active_at > 0 and now - rec.active_at
    return idle and idle >= 1 and idle or nil
  end
  local k = classify_ranks{ recs = recs, world = world, stuck = stuck, node_of = node_of, recorded = recorded,
                            still = still, seconds_waited = seconds_waited }
  return diagnosis_line(k, node_of, stuck.wait_kind, stuck.wait_seq, stuck.wait_group)
end

-- The agent wrapper (see mpirun_command), written into the launch's directory.
local AGENT = [[#!/bin/sh
# written by shard launch: runs the remote-shell agent and reports a daemon that ended badly
host=""
for a in "$@"; do case $a in -*) ;; *) host=$a; break ;; esac; done
$SHARD_LAUNCH_AGENT "$@"
rc=$?
[ $rc -eq 0 ] || echo "__shard_launch_host_lost=$host $rc" >&2
exit $rc
]]

local function write_agent(o)
  local real = os.getenv("OMPI_MCA_plm_rsh_agent")
  if not real or real == "" then real = "ssh" end
  real = real:match("^([^:]-)%s*:") or real            -- "ssh : rsh": the first
  local path = o.flight_dir .. "/agent.sh"
  local f = io.open(path, "w")
  if not f then return end
  f:write(AGENT)
  f:close()
  os.execute("chmod +x " .. quote(path))
  o.agent = path
  o.real_agent = real
end

local function temp_dir() return files.lines_of("mktemp -d 2>/dev/null")[1] end

-- The command that starts the job: its main process (mpirun, or bash for --nnodes) exec'd,
-- every process of it marked with the launch's directory (job.lua) and told the launcher's pid
-- (a rank whose launcher is gone ends itself, comm.c).
local function job_command(o)
  local cmd = o.nnodes > 1 and env_command(o) or mpirun_command(o)
  local env = { "exec env", "SHARD_LAUNCH_JOB=" .. quote(o.flight_dir), "SHARD_LAUNCH_PID=" .. job.pid() }
  if o.real_agent then env[#env + 1] = "SHARD_LAUNCH_AGENT=" .. quote(o.real_agent) end
  return table.concat(env, " ") .. " " .. cmd
end

local function remove_dir(o, world)
  for rank = 0, world - 1 do os.remove(("%s/rank%d.flight"):format(o.flight_dir, rank)) end
  os.remove(o.flight_dir .. "/timeout.flight")
  if o.agent then os.remove(o.agent) end
  os.remove(o.flight_dir)
end

-- What the launcher says about a job that failed; returns the launcher's exit status: 128 + the
-- signal the failed rank received where its output names one (mpirun's own status is then the
-- abort of Open MPI's handler that followed it), else mpirun's.
local function report(rc, router, o, world)
  local untagged, kept = router.untagged, router.kept
  local r, signal = failed_rank(untagged)
  local received = r and router.signal[r]
  if received then signal = received end
  o.verdict = verdict(r, signal, rc, o, untagged)
  o.lost_host = M.layout(o) and not r and lost_node(untagged) or nil
  io.stderr:write(o.verdict, "\n")
  if o.stopped then
    io.stderr:write(("shard launch: mpirun had not ended %g s after the first failure (a host it cannot reach?); stopped it\n"):format(GRACE))
  end
  local diagnosis = M.diagnose(o.flight_dir, world, M.layout(o))
  if diagnosis then io.stderr:write("shard launch: ", diagnosis, "\n") end
  if r and kept[r] and (o.all == false and r ~= 0) then
    for _, line in ipairs(kept[r]) do io.stderr:write("[rank ", r, "] ", line, "\n") end
  elseif not r and #untagged > 0 then
    for _, line in ipairs(untagged) do
      if not line:find("^__shard_launch") then io.stderr:write(line, "\n") end
    end
  end
  return received and 128 + tonumber(received:match("^signal (%d+)")) or rc
end

local SIGNAL_NAME = { [1] = "SIGHUP", [2] = "SIGINT", [15] = "SIGTERM" }

-- The restart line, once the restarted job's rank 0 says what it restored ("restart: restored
-- step S from ..., L steps lost") and that it completed a step ("restart: step N completed"):
-- the seconds from the failure (the first line of mpirun's that says so) to that step, and
-- where they went: the failed job's end, the new one's start up to its restore, its first step.
local function watch_restart(o, failure)
  local restored, restored_at
  return function(r, text)
    if r ~= 0 then return end
    local what = text:match("^restart: (restored step %d+ from .*)$")
    if what then restored, restored_at = what, timer.now() end
    local n = text:match("^restart: step (%d+) completed$")
    if n and failure then
      local now = timer.now()
      restored_at = restored_at or now
      io.stderr:write(("shard launch: restart %d of %d: %s; %s; step %s completed %.1f s after the failure "
        .. "(the job ended in %.1f s, the new one started and restored in %.1f s, its first step took %.1f s)\n"):format(
        o.restart, o.max_restarts, failure.what, restored or "restored nothing", n, now - failure.at,
        failure.ended - failure.at, restored_at - failure.ended, now - restored_at))
      io.stderr:flush()
      failure = nil
    end
  end
end

-- Runs the job, and again after a failure while --max_restarts allows (not after a signal to
-- the launcher); returns the exit status of the last run.
-- A lost host left out of the next start, when --min_nodes allows it.
local function drop_lost_host(o)
  if not (o.lost_host and o.min_nodes and #o.hosts - 1 >= o.min_nodes) then return end
  local left = {}
  for _, h in ipairs(o.hosts) do if h.name ~= o.lost_host then left[#left + 1] = h end end
  o.hosts = left
  io.stderr:write(("shard launch: going on without node %s: %d host%s, %d ranks (--min_nodes %d)\n"):format(
    o.lost_host, #left, #left == 1 and "" or "s", world_size(o), o.min_nodes))
end

local function run_restarting(o)
  local failure
  for restart = 0, o.max_restarts do
    o.restart, o.failed_at, o.verdict, o.lost_host = restart, nil, nil, nil
    o.watch = restart > 0 and watch_restart(o, failure) or nil
    local rc, router = stream(job_command(o), o)
    if rc == 0 or o.signal then return rc end
    rc = report(rc, router, o, world_size(o))
    if restart == o.max_restarts then return rc end
    failure = { what = (o.verdict or ""):gsub("^shard launch: ", ""), at = o.failed_at or timer.now(), ended = timer.now() }
    io.stderr:write(("shard launch: restarting the job (restart %d of %d)\n"):format(restart + 1, o.max_restarts))
    drop_lost_host(o)
  end
end

-- The job's snapshot files on this host (the ranks remove theirs after a run that ends well).
local function remove_snapshots(o)
  local dir = os.getenv("SHARD_SNAPSHOT_DIR") or "/dev/shm"
  for _, name in ipairs(files.lines_of("ls " .. quote(dir) .. " 2>/dev/null")) do
    if name:sub(1, #("shard-" .. o.job_id .. "-")) == "shard-" .. o.job_id .. "-" then os.remove(dir .. "/" .. name) end
  end
end

function M.main(args)
  local ok, o = pcall(M.parse, args)
  if not ok then
    if type(o) == "table" and o.usage then return fail_usage(o.usage) end
    error(o, 0)
  end
  local f = io.open(o.file, "r")
  if not f then return fail_usage("cannot open " .. o.file) end
  f:close()
  local world = world_size(o)
  o.flight_dir = temp_dir()
  if not o.flight_dir then io.stderr:write("shard launch: mktemp -d failed\n"); return 1 end
  o.job_id = ("%d-%s"):format(job.pid(), o.flight_dir:match("([^/.]+)$") or "job")
  if o.hosts then write_agent(o) end
  job.trap(true)
  local rc = run_restarting(o)
  job.trap(false)
  remove_snapshots(o)
  if o.signal then
    io.stderr:write(("shard launch: %s: stopped the job\n"):format(SIGNAL_NAME[o.signal]))
    remove_dir(o, world)
    job.reraise(o.signal)
    return 128 + o.signal
  end
  remove_dir(o, world)
  return rc
end

return M
