-- shard.tools.repl.wire: the messages between `shard repl --nproc N` and its ranks, over a Unix
-- socket. A message is a list of strings, sent as "<count>\n" then "<length>\n<bytes>" each.
--   local server = wire.listen(path)        local conn = wire.connect(path)
--   local conn = wire.accept(server)        conn:send{ "run", src }
--   conn:recv() -> fields, or nil at end    conn:fill() reads what has come (false at end),
--   conn:take() -> a whole message or nil   wire.poll({ fd, ... }, ms) -> { [fd] = true }
-- A read or poll that a signal interrupts returns; the caller then looks at its Ctrl-C count.
local ffi = require "ffi"

for _, decl in ipairs {
  "struct shard_sockaddr_un { unsigned short family; char path[108]; };",
  "struct shard_pollfd { int fd; short events; short revents; };",
  "int poll(struct shard_pollfd *fds, unsigned long nfds, int timeout);",
  "int socket(int domain, int type, int protocol);",
  "int bind(int fd, const void *addr, unsigned len);",
  "int listen(int fd, int backlog);",
  "int accept(int fd, void *addr, void *len);",
  "int connect(int fd, const void *addr, unsigned len);",
  "ssize_t read(int fd, void *buf, size_t n);",
  "ssize_t write(int fd, const void *buf, size_t n);",
  "int close(int fd);",
  "int unlink(const char *path);",
  "char *strerror(int errnum);",
} do pcall(ffi.cdef, decl) end

local C = ffi.C
local AF_UNIX, SOCK_STREAM, POLLIN, EINTR = 1, 1, 1, 4

local M = {}

local function fail(what)
  error(("repl: %s: %s"):format(what, ffi.string(C.strerror(ffi.errno()))), 3)
end

local function address(path)
  if #path >= 108 then error("repl: socket path too long: " .. path, 3) end
  local a = ffi.new("struct shard_sockaddr_un")
  a.family = AF_UNIX
  ffi.copy(a.path, path)
  return a
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

local chunk = ffi.new("char[65536]")

-- Reads once: true when bytes came or a signal interrupted, false at end of input.
function Conn:fill()
  local n = tonumber(C.read(self.fd, chunk, 65536))
  if n > 0 then self.buf = self.buf .. ffi.string(chunk, n); return true end
  return n < 0 and ffi.errno() == EINTR
end

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
  local fd = C.socket(AF_UNIX, SOCK_STREAM, 0)
  if fd < 0 then fail("socket") end
  local a = address(path)
  if C.bind(fd, a, ffi.sizeof(a)) ~= 0 then fail("bind " .. path) end
  if C.listen(fd, 64) ~= 0 then fail("listen") end
  return fd
end

function M.accept(fd)
  local c = C.accept(fd, nil, nil)
  if c < 0 then return nil end
  return conn(c)
end

function M.connect(path)
  local fd = C.socket(AF_UNIX, SOCK_STREAM, 0)
  if fd < 0 then fail("socket") end
  local a = address(path)
  if C.connect(fd, a, ffi.sizeof(a)) ~= 0 then fail("connect " .. path) end
  return conn(fd)
end

-- The fds among fds that have input (or ended), waiting up to ms (-1: no limit); {} when a
-- signal interrupted the wait.
function M.poll(fds, ms)
  local p = ffi.new("struct shard_pollfd[?]", #fds)
  for i, fd in ipairs(fds) do p[i - 1].fd, p[i - 1].events = fd, POLLIN end
  local ready = {}
  if C.poll(p, #fds, ms) > 0 then
    for i = 0, #fds - 1 do if p[i].revents ~= 0 then ready[p[i].fd] = true end end
  end
  return ready
end

return M
