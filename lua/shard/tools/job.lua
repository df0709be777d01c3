-- shard.tools.job: a process tree that shard launch starts, watches and ends.
--   local j = job.start(cmd, marker)   /bin/sh -c cmd in a process group of its own, stdin
--                                      /dev/null, stdout and stderr into one pipe; cmd should
--                                      exec its main process (then j.pid is that process)
--   j:read(ms) -> { lines }, or nil     the whole lines that came within ms (nil: the pipe ended)
--   j:rest() -> { lines }               what is left in the pipe once j.pid has ended
--   j:exited() -> status or nil         { code = N } or { signal = N } once j.pid has ended
--   j:processes() -> { pid, ... }       every local process whose environment holds
--                                      SHARD_LAUNCH_JOB=marker (cmd must set it): Open MPI
--                                      puts each rank in a process group of its own, and an
--                                      orphan leaves the tree, but the environment is inherited
--   j:signal(sig)                       sig to each of them
-- job.trap(on), job.take() -> sig or nil: SIGTERM, SIGINT and SIGHUP counted instead of
-- ending this process (runtime/host.c), so that the launcher ends its job first.
local ffi = require("ffi")
local sys = require("shard.tools.sys")
local files = require("shard.files")

local C = sys.C
local POSIX_SPAWN_SETPGROUP, POSIX_SPAWN_SETSIGMASK = 2, 8
local O_RDONLY, O_CLOEXEC, WNOHANG = 0, 524288, 1
local SIGNALS = { 15, 2, 1 }   -- SIGTERM, SIGINT, SIGHUP

local M = {}

local function fail(what) sys.fail("shard launch", what) end

local Job = {}
Job.__index = Job

function M.start(cmd, marker)
  local fds = ffi.new("int[2]")
  if C.pipe2(fds, O_CLOEXEC) ~= 0 then fail("pipe") end
  local attr, actions = ffi.new("shard_spawnattr"), ffi.new("shard_spawn_actions")
  local mask = ffi.new("shard_sigset")
  C.sigemptyset(mask)
  C.posix_spawnattr_init(attr)
  C.posix_spawnattr_setflags(attr, POSIX_SPAWN_SETPGROUP + POSIX_SPAWN_SETSIGMASK)
  C.posix_spawnattr_setpgroup(attr, 0)
  C.posix_spawnattr_setsigmask(attr, mask)
  C.posix_spawn_file_actions_init(actions)
  C.posix_spawn_file_actions_addopen(actions, 0, "/dev/null", O_RDONLY, 0)
  C.posix_spawn_file_actions_adddup2(actions, fds[1], 1)
  C.posix_spawn_file_actions_adddup2(actions, fds[1], 2)
  local args = { "sh", "-c", cmd }
  local argv = ffi.new("char *[4]")
  for i, a in ipairs(args) do argv[i - 1] = ffi.cast("char *", a) end
  local pid = ffi.new("int[1]")
  local rc = C.posix_spawn(pid, "/bin/sh", actions, attr, argv, C.environ)
  C.posix_spawn_file_actions_destroy(actions)
  C.posix_spawnattr_destroy(attr)
  C.close(fds[1])
  if rc ~= 0 then C.close(fds[0]); ffi.errno(rc); fail("cannot start /bin/sh") end
  return setmetatable({ pid = pid[0], fd = fds[0], marker = marker, buf = "", args = args }, Job)
end

-- Appends what the pipe holds to the buffer; false at its end.
Job.fill = sys.fill

function Job:take_lines(all)
  local lines = {}
  for line in self.buf:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  self.buf = self.buf:match("[^\n]*$")
  if all and self.buf ~= "" then lines[#lines + 1] = self.buf; self.buf = "" end
  return lines
end

function Job:read(ms)
  if self.ended then return nil end
  if sys.poll({ self.fd }, ms)[self.fd] and not self:fill() then
    self.ended = true
    C.close(self.fd)
    return self:take_lines(true)
  end
  return self:take_lines(false)
end

-- Once j.pid has ended: the lines still in the pipe (a process it left behind may hold the
-- pipe open: what came within a moment of silence).
function Job:rest()
  local lines = {}
  repeat
    local more = self:read(200)
    for _, l in ipairs(more or {}) do lines[#lines + 1] = l end
  until not more or #more == 0
  if not self.ended then
    for _, l in ipairs(self:take_lines(true)) do lines[#lines + 1] = l end
    self.ended = true
    C.close(self.fd)
  end
  return lines
end

function Job:exited(block)
  if self.status then return self.status end
  local st = ffi.new("int[1]")
  local r = C.waitpid(self.pid, st, block and 0 or WNOHANG)
  if r ~= self.pid then return nil end
  local s = st[0]
  local sig = s % 128
  self.status = sig == 0 and { code = math.floor(s / 256) % 256 } or { signal = sig }
  return self.status
end

function Job:processes()
  local pids = {}
  for _, line in ipairs(files.lines_of(("grep -lzxF %s /proc/[0-9]*/environ 2>/dev/null"):format(
      files.shell_quote("SHARD_LAUNCH_JOB=" .. self.marker)))) do
    pids[#pids + 1] = tonumber(line:match("^/proc/(%d+)/"))
  end
  return pids
end

function Job:signal(sig)
  for _, pid in ipairs(self:processes()) do C.kill(pid, sig) end
end

function M.trap(on)
  for _, sig in ipairs(SIGNALS) do C.shard_signal_trap(sig, on and 1 or 0) end
end

function M.take()
  local got
  for _, sig in ipairs(SIGNALS) do
    if C.shard_signal_take(sig) > 0 then got = got or sig end
  end
  return got
end

function M.sleep(ms) C.poll(nil, 0, ms) end

function M.pid() return C.getpid() end

-- Ends this process by sig, as if it had never been trapped (a shell sees 128 + sig).
function M.reraise(sig)
  io.stdout:flush(); io.stderr:flush()
  C.shard_signal_trap(sig, 0)
  C.kill(C.getpid(), sig)
end

return M
