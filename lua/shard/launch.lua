-- shard.launch: `shard launch --nproc N [--all] FILE [--key=value ...]` starts N local ranks
-- of `shard run FILE ...` through mpirun. It prints rank 0's output (every rank's, prefixed
-- "[rank R] ", with --all), keeps the others' last lines, and when a rank fails mpirun stops
-- the rest within a second or so (a failing rank skips MPI_Finalize, see comm.h); launch
-- then shows that rank's last lines and returns a non-zero exit code.
--
-- Multi-node (--nnodes M > 1, --node-rank, --master-addr, --master-port): each node's launch
-- starts its N ranks directly with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
-- LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). CUDA collectives then rendezvous over TCP
-- (NCCL); CPU collectives need one mpirun across the nodes instead (mpirun -H a:N,b:N ...).
local M = {}

local USAGE = "usage: shard launch --nproc N [--nnodes M --node-rank R --master-addr A --master-port P] [--all] [--timeout SECONDS] FILE [--key=value ...]"
local TAIL = 40          -- lines kept per rank for the failure report

local function fail_usage(msg)
  io.stderr:write("shard launch: ", msg, "\n", USAGE, "\n")
  return 2
end

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The shard executable to start the ranks with: this one when it is bin/shard-like,
-- else $SHARD_HOME/bin/shard.
function M.shard_exe()
  local ffi = require "ffi"
  pcall(ffi.cdef, "long readlink(const char *path, char *buf, size_t size);")
  local buf = ffi.new("char[4096]")
  local ok, n = pcall(function() return tonumber(ffi.C.readlink("/proc/self/exe", buf, 4095)) end)
  local exe = ok and n > 0 and ffi.string(buf, n) or nil
  if exe and exe:match("shard[^/]*$") then return exe end
  return require("shard.ffi").root .. "/bin/shard"
end

function M.parse(args)
  local o = { nproc = nil, nnodes = 1, node_rank = 0, master_addr = "127.0.0.1", master_port = 29500, all = false }
  local i = 1
  local function value(name)
    local v = args[i + 1]
    if v == nil then error({ usage = name .. " needs a value" }) end
    i = i + 1
    return v
  end
  local function number(name, v)
    local n = tonumber(v)
    if not n or n < 0 or n % 1 ~= 0 then error({ usage = name .. " expects a whole number, got '" .. tostring(v) .. "'" }) end
    return n
  end
  local function seconds(name, v)
    local n = tonumber(v)
    if not n or n <= 0 then error({ usage = name .. " expects a positive number of seconds, got '" .. tostring(v) .. "'" }) end
    return n
  end
  while i <= #args do
    local a = args[i]
    local flag, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    flag = flag or a
    local function get(name) if inline then return inline end return value(name) end
    if flag == "--nproc" or flag == "--nproc-per-node" or flag == "--nproc_per_node" then o.nproc = number(flag, get(flag))
    elseif flag == "--nnodes" then o.nnodes = number(flag, get(flag))
    elseif flag == "--node-rank" or flag == "--node_rank" then o.node_rank = number(flag, get(flag))
    elseif flag == "--master-addr" or flag == "--master_addr" then o.master_addr = get(flag)
    elseif flag == "--master-port" or flag == "--master_port" then o.master_port = number(flag, get(flag))
    elseif flag == "--all" then o.all = true
    elseif flag == "--timeout" then o.timeout = seconds(flag, get(flag))
    elseif a:sub(1, 2) == "--" then error({ usage = "unknown option " .. a .. " before FILE" })
    else
      o.file = a
      o.rest = {}
      for j = i + 1, #args do o.rest[#o.rest + 1] = args[j] end
      break
    end
    i = i + 1
  end
  if not o.nproc or o.nproc < 1 then error({ usage = "--nproc N (N >= 1) is required" }) end
  if o.nnodes < 1 or o.node_rank >= o.nnodes then error({ usage = ("--node-rank %d is not below --nnodes %d"):format(o.node_rank, o.nnodes) }) end
  if not o.file then error({ usage = "missing FILE" }) end
  return o
end

local function is_root()
  local p = io.popen("id -u 2>/dev/null")
  local uid = p and p:read("*l")
  if p then p:close() end
  return uid == "0"
end

-- The ranks' command; --timeout reaches every rank's collectives as SHARD_COMM_TIMEOUT, and
-- each rank keeps its flight record (comm.h) in the launch's directory.
local function run_args(o)
  local parts = { quote(M.shard_exe()), "run", quote(o.file) }
  local env = { "env", "SHARD_FLIGHT_DIR=" .. quote(o.flight_dir) }
  if o.timeout then env[#env + 1] = "SHARD_COMM_TIMEOUT=" .. o.timeout end
  table.insert(parts, 1, table.concat(env, " "))
  for _, a in ipairs(o.rest) do parts[#parts + 1] = quote(a) end
  return table.concat(parts, " ")
end

-- The command that starts every local rank; its output lines are tagged with the rank.
local function mpirun_command(o)
  local cmd = { "mpirun", "--tag-output", "-np", o.nproc, "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1" }
  if is_root() then table.insert(cmd, 2, "--allow-run-as-root") end
  return table.concat(cmd, " ") .. " " .. run_args(o)
end

-- Multi-node: N ranks started directly with torchrun-style variables; bash's wait -n stops
-- the rest as soon as one fails. Output lines are tagged like mpirun's.
local function env_command(o)
  local world = o.nproc * o.nnodes
  local lines = { "pids=''" }
  for i = 0, o.nproc - 1 do
    local rank = o.node_rank * o.nproc + i
    lines[#lines + 1] = ("( RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d MASTER_ADDR=%s MASTER_PORT=%d %s 2>&1 | sed -u 's/^/[1,%d]<stdout>:/'; exit ${PIPESTATUS[0]} ) & pids=\"$pids $!\"")
      :format(rank, world, i, o.nproc, quote(o.master_addr), o.master_port, run_args(o), rank)
  end
  lines[#lines + 1] = "n=" .. o.nproc .. "; rc=0"
  lines[#lines + 1] = "while [ $n -gt 0 ]; do wait -n; r=$?; n=$((n-1)); if [ $r -ne 0 ]; then rc=$r; kill $pids 2>/dev/null; break; fi; done"
  lines[#lines + 1] = "wait; exit $rc"
  return "bash -c " .. quote(table.concat(lines, "\n"))
end

-- Runs cmd, routing tagged lines; returns the exit code and the ranks' kept lines.
local function stream(cmd, o)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"__shard_launch_rc=$?\"", "r"))
  local kept, untagged, rc = {}, {}, 1
  for line in p:lines() do
    local r, stream_name, text = line:match("^%[%d+,(%d+)%]<(%a+)>:(.*)$")
    if r then
      text = text:gsub("%[%d+,%d+%]<%a+>:", "")   -- mpirun tags each write, not each line
      r = tonumber(r)
      local k = kept[r] or {}
      kept[r] = k
      k[#k + 1] = text
      if #k > TAIL then table.remove(k, 1) end
      if o.all then
        io.stdout:write("[rank ", r, "] ", text, "\n")
        io.stdout:flush()
      elseif r == 0 then
        local out = stream_name == "stderr" and io.stderr or io.stdout
        out:write(text, "\n")
        out:flush()
      end
    else
      local code = line:match("^__shard_launch_rc=(%d+)$")
      if code then rc = tonumber(code) else untagged[#untagged + 1] = line end
    end
  end
  p:close()
  return rc, kept, untagged
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

-- The launcher's one-line verdict on a failed job.
local function verdict(rank, signal, rc)
  if rank and signal then return ("shard launch: rank %d was killed by %s"):format(rank, signal) end
  if rank then return ("shard launch: rank %d failed"):format(rank) end
  return ("shard launch: exit code %d"):format(rc)
end

---------------------------------------------------------------------------------------------
-- the diagnosis of a hang, from the ranks' flight records

local KIND = { [0] = "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier" }

local function read_records(dir, world)
  local ffi = require "ffi"
  require "shard.ffi"                        -- declares sh_flight_record
  local recs = {}
  for r = 0, world - 1 do
    local f = io.open(("%s/rank%d.flight"):format(dir, r), "rb")
    local bytes = f and f:read("*a")
    if f then f:close() end
    if bytes and #bytes >= ffi.sizeof("sh_flight_record") then
      local buf = ffi.new("uint8_t[?]", #bytes)
      ffi.copy(buf, bytes, #bytes)
      local rec = ffi.cast("sh_flight_record *", buf)
      if ffi.string(rec.magic, 7) == "shflt01" then
        local groups = {}
        for i = 0, rec.n_groups - 1 do
          local g = rec.groups[i]
          groups[ffi.string(g.name)] = { issued = tonumber(g.issued), kind = KIND[g.last_kind], size = g.size }
        end
        recs[r] = { groups = groups, wait_state = rec.wait_state, wait_group = ffi.string(rec.wait_group),
                    wait_seq = tonumber(rec.wait_seq), wait_kind = KIND[rec.wait_kind], wait_for = rec.wait_for }
      end
    end
  end
  return recs
end

local function list(ranks) table.sort(ranks); return table.concat(ranks, ",") end

-- One line naming the rank that never reached (or mismatched) the collective the others
-- timed out in, as PyTorch's desync debug does; nil when no rank timed out.
function M.diagnose(dir, world)
  local recs = read_records(dir, world)
  local stuck
  for r = 0, world - 1 do
    local rec = recs[r]
    if rec and rec.wait_state == 2 and (not stuck or rec.wait_for > stuck.wait_for) then stuck = rec end
  end
  if not stuck then return nil end
  local g, n, kind = stuck.wait_group, stuck.wait_seq, stuck.wait_kind
  local waited, behind, other = {}, {}, {}
  local longest = 0
  for r = 0, world - 1 do
    local rec = recs[r]
    local mine = rec and rec.groups[g]
    if rec and rec.wait_state >= 1 and rec.wait_group == g and rec.wait_seq == n and rec.wait_kind == kind then
      waited[#waited + 1] = r
      longest = math.max(longest, rec.wait_for)
    elseif not rec or (mine and mine.issued < n) or (not mine and world == (stuck.groups[g] or {}).size) then
      behind[#behind + 1] = r
    elseif mine and mine.issued >= n and rec.wait_seq ~= n then
      other[#other + 1] = ("rank %d issued %s #%d on %s instead"):format(r, mine.issued == n and mine.kind or "more collectives",
        n, g)
    elseif mine and mine.issued == n and mine.kind ~= kind then
      other[#other + 1] = ("rank %d issued %s #%d on %s"):format(r, mine.kind, n, g)
    end
  end
  local parts = {}
  if #behind > 0 then
    parts[#parts + 1] = ("rank%s %s never reached %s #%d on group %s"):format(#behind > 1 and "s" or "", list(behind), kind, n, g)
  end
  for _, line in ipairs(other) do parts[#parts + 1] = line end
  if #parts == 0 then parts[1] = ("no rank is behind %s #%d on group %s"):format(kind, n, g) end
  return ("%s; rank%s %s waited %.3g s in it"):format(table.concat(parts, "; "), #waited > 1 and "s" or "", list(waited), longest)
end

local function temp_dir()
  local p = io.popen("mktemp -d 2>/dev/null")
  local dir = p and p:read("*l")
  if p then p:close() end
  return dir
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
  local world = o.nproc * o.nnodes
  o.flight_dir = temp_dir()
  if not o.flight_dir then io.stderr:write("shard launch: mktemp -d failed\n"); return 1 end
  local cmd = o.nnodes > 1 and env_command(o) or mpirun_command(o)
  local rc, kept, untagged = stream(cmd, o)
  local diagnosis = rc ~= 0 and M.diagnose(o.flight_dir, world)
  for rank = 0, world - 1 do os.remove(("%s/rank%d.flight"):format(o.flight_dir, rank)) end
  os.remove(o.flight_dir)
  if rc == 0 then return 0 end
  local r, signal = failed_rank(untagged)
  io.stderr:write(verdict(r, signal, rc), "\n")
  if diagnosis then io.stderr:write("shard launch: ", diagnosis, "\n") end
  if r and kept[r] and (o.all == false and r ~= 0) then
    for _, line in ipairs(kept[r]) do io.stderr:write("[rank ", r, "] ", line, "\n") end
  elseif not r and #untagged > 0 then
    for _, line in ipairs(untagged) do io.stderr:write(line, "\n") end
  end
  return rc ~= 0 and rc or 1
end

return M
