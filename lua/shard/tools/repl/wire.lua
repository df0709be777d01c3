-- shard.tools.repl.wire: the messages between `shard repl --nproc N` and its ranks, over a Unix
-- socket. A message is a list of strings, sent as "<count>\n" then "<length>\n<bytes>" each.
--   local server = wire.listen(path)        local conn = wire.connect(path)
--   local conn = wire.accept(server)        conn:send{ "run", src }
--   conn:recv() -> fields, or nil at end    conn:fill() reads what has come (false at end),
--   conn:take() -> a whole message or nil   wire.poll({ fd, ... }, ms) -> { [fd] = true }
-- A read or poll that a signal interrupts returns; the caller then looks at its Ctrl-C count.
local ffi = require("ffi")
local sys = require("shard.tools.sys")

local C = sys.C
local AF_UNIX, SOCK_STREAM, EINTR = 1, 1, 4

local M = {}

-- Raises "repl: what: reason" at the caller of listen or connect.
local function fail(what) sys.fail("repl", what, 4) end

-- A Unix socket at path, bound (C.bind) or connected (C.connect) there.
local function unix_socket(path, call, name)
  if #path >= 108 then error("repl: socket path too long: " .. path, 3) end
  local fd = C.socket(AF_UNIX, SOCK_STREAM, 0)
  if fd < 0 then fail("socket") end
  local a = ffi.new("struct shard_sockaddr_un")
  a.family = AF_UNIX
  ffi.copy(a.path, path)
  if call(fd, a, ffi.sizeof(a)) ~= 0 then fail(name .. " " .. path) end
  return fd
end

function M.encode(fields)
  local parts = { #fields, "\n" }
  for _, f in ipairs(fields) do
    parts[#parts + 1] = #f .. "\n"
    parts[#parts + 1] = f
  end
  return table.concat(parts)
end

local Conn = {}
Conn.__index = Conn

local function conn(fd) return setmetatable({ fd = fd, buf = "" }, Conn) end

function Conn:send(fields)
  local data = M.encode(fields)
  local p, left = ffi.cast("const char *", data), #data
  while left > 0 do
    local n = tonumber(C.write(self.fd, p, left))
    if n < 0 and ffi.errno() ~= EINTR then return false end
    if n > 0 then p, left = p + n, left - n end
  end
  return true
end

-- Reads once: true when bytes came or a signal interrupted, false at end of input.
Conn.fill = sys.fill

-- A whole message from what has come, or nil.
function Conn:take()
  local buf = self.buf
  local count, pos = buf:match("^(%d+)\n()")
  if not count then return nil end
  local fields = {}
  for i = 1, tonumber(count) do
    local len, start = buf:match("^(%d+)\n()", pos)
    if not len then return nil end
    local stop = start + tonumber(len)
    if stop - 1 > #buf then return nil end
    fields[i] = buf:sub(start, stop - 1)
    pos = stop
  end
  self.buf = buf:sub(pos)
  return fields
end

-- Waits for a whole message; nil at end of input.
function Conn:recv()
  while true do
    local m = self:take()
    if m then return m end
    if not self:fill() then return nil end
  end
end

function Conn:close()
  if self.fd >= 0 then C.close(self.fd); self.fd = -1 end
end

function M.listen(path)
  local fd = unix_socket(path, C.bind, "bind")
  if C.listen(fd, 64) ~= 0 then sys.fail("repl", "listen", 2) end
  return fd
end

function M.accept(fd)
  local c = C.accept(fd, nil, nil)
  if c < 0 then return nil end
  return conn(c)
end

function M.connect(path)
  return conn(unix_socket(path, C.connect, "connect"))
end

-- The fds among fds that have input (or ended), waiting up to ms; {} when a signal came.
M.poll = sys.poll

return M
