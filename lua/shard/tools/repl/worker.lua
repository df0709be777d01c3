-- shard.tools.repl.worker: one rank of `shard repl --nproc N`. shard.tools.repl.ranks starts the ranks
-- with `shard launch` (so their world is the comm of recipes) running this file; each rank
-- connects to the prompt's socket ($SHARD_REPL_SOCKET), says who it is, and then runs what
-- it is sent, with the globals `shard`, `world` (the world group) and `rank` defined:
--   { "run", src }       -> { "ok", output } or { "error", output, message }
--   { "complete", text } -> { "ok", completions joined by "\n" }
--   { "quit" }           ends the rank
-- A chunk's output (Lua's and C's, stdout and stderr) is captured into a file while it runs
-- and sent back whole with its printed values. Ctrl-C reaches a rank as a SIGINT from the
-- prompt and interrupts its chunk as in the one-process REPL.
local ffi = require("ffi")
local chunk = require("shard.tools.repl.chunk")
local show = require("shard.show")
local complete = require("shard.tools.repl.complete")
local interrupt = require("shard.tools.repl.interrupt")
local wire = require("shard.tools.repl.wire")
local sys = require("shard.tools.sys")

local C = sys.C
local SEEK_SET, SEEK_END = 0, 2

local M = {}

-- A file that stands in for fds 1 and 2 while a chunk runs.
local function capture_file()
  local template = ffi.new("char[?]", 64, (os.getenv("TMPDIR") or "/tmp") .. "/shard-repl-XXXXXX")
  local fd = C.mkstemp(template)
  if fd < 0 then error("repl: cannot create a capture file in " .. ffi.string(template)) end
  C.unlink(template)
  return fd
end

-- Runs f() with fds 1 and 2 going to fd; returns f's results and the text written.
local function captured(fd, f)
  io.stdout:flush(); io.stderr:flush(); C.fflush(nil)
  C.ftruncate(fd, 0)
  C.lseek(fd, 0, SEEK_SET)
  local saved1, saved2 = C.dup(1), C.dup(2)
  C.dup2(fd, 1); C.dup2(fd, 2)
  local results = { f() }
  io.stdout:flush(); io.stderr:flush(); C.fflush(nil)
  C.dup2(saved1, 1); C.dup2(saved2, 2)
  C.close(saved1); C.close(saved2)
  local size = tonumber(C.lseek(fd, 0, SEEK_END))
  C.lseek(fd, 0, SEEK_SET)
  local buf = ffi.new("char[?]", size + 1)
  local got = size > 0 and tonumber(C.read(fd, buf, size)) or 0
  return ffi.string(buf, math.max(got, 0)), unpack(results)
end

-- The reply to { "run", src }.
local function run(fd, src)
  local text, ok, n, values = captured(fd, function()
    local fn, packed = chunk.compile(src)
    if not fn then return false, packed end
    local ok, n, values = chunk.run(fn, packed)
    if ok then io.stdout:write(show.values(n, values)) end
    return ok, n, values
  end)
  if ok then return { "ok", text } end
  return { "error", text, n }
end

function M.main()
  local path = os.getenv("SHARD_REPL_SOCKET")
  if not path then error("shard.tools.repl.worker: SHARD_REPL_SOCKET is not set (it is started by shard repl --nproc N)") end
  _G.shard = require("shard")
  _G.world = shard.comm.init()
  _G.rank = world:rank()
  interrupt.install()
  local conn = wire.connect(path)
  conn:send { "hello", tostring(rank), tostring(world:size()), tostring(C.getpid()) }
  local fd = capture_file()
  interrupt.take()
  while true do
    local m = conn:recv()
    if not m or m[1] == "quit" then break end
    if m[1] == "run" then
      -- a Ctrl-C from here on is for this chunk; one that comes once it has replied is late
      local reply = run(fd, m[2])
      interrupt.take()
      conn:send(reply)
    elseif m[1] == "complete" then
      local ok, list = pcall(complete.candidates, m[2], _G)
      conn:send { "ok", ok and table.concat(list, "\n") or "" }
    else
      conn:send { "error", "", "repl worker: unknown request '" .. tostring(m[1]) .. "'" }
    end
  end
  conn:close()
  C.close(fd)
end

-- `shard run worker.lua` (from shard launch) runs it; require returns the module.
if ... ~= "shard.tools.repl.worker" then return M.main() end
return M
