-- shard.tools.sys: what the tools share beneath them. The C library's calls they make through
-- the FFI (processes and signals for shard launch, pipes and poll, Unix sockets and capture
-- files for the REPL's ranks), declared here once; the message of a failed call; poll and
-- read into a buffer; a table's keys in order.
--   local sys = require("shard.tools.sys")
--   local C = sys.C
--   if C.listen(fd, 64) ~= 0 then sys.fail("repl", "listen") end   -- "repl: listen: <strerror>"
-- Each declaration is tried on its own, so one made already (by LuaJIT or another module) is
-- no error; sys.declare{ ... } does the same for a module's own (readline's, in the REPL).
local ffi = require("ffi")

local M = {}

function M.declare(list)
  for _, decl in ipairs(list) do pcall(ffi.cdef, decl) end
end

M.declare {
  -- files and descriptors
  "ssize_t read(int fd, void *buf, size_t n);",
  "ssize_t write(int fd, const void *buf, size_t n);",
  "int close(int fd);",
  "int dup(int fd);",
  "int dup2(int from, int to);",
  "int pipe2(int fds[2], int flags);",
  "int mkstemp(char *template);",
  "int ftruncate(int fd, long length);",
  "long lseek(int fd, long offset, int whence);",
  "int unlink(const char *path);",
  "long readlink(const char *path, char *buf, size_t size);",
  "int isatty(int fd);",
  "int fflush(void *stream);",
  "struct shard_pollfd { int fd; short events; short revents; };",
  "int poll(struct shard_pollfd *fds, unsigned long nfds, int timeout);",
  -- memory and errors
  "void free(void *ptr);",
  "void *malloc(size_t size);",
  "char *strdup(const char *s);",
  "char *strerror(int errnum);",
  -- processes and signals
  "typedef struct { long _[64]; } shard_spawnattr;",          -- glibc: 336 bytes
  "typedef struct { long _[32]; } shard_spawn_actions;",      -- glibc: 80 bytes
  "typedef struct { unsigned long _[16]; } shard_sigset;",
  "int posix_spawnattr_init(shard_spawnattr *a);",
  "int posix_spawnattr_destroy(shard_spawnattr *a);",
  "int posix_spawnattr_setflags(shard_spawnattr *a, short flags);",
  "int posix_spawnattr_setpgroup(shard_spawnattr *a, int pgroup);",
  "int posix_spawnattr_setsigmask(shard_spawnattr *a, const shard_sigset *set);",
  "int posix_spawn_file_actions_init(shard_spawn_actions *f);",
  "int posix_spawn_file_actions_destroy(shard_spawn_actions *f);",
  "int posix_spawn_file_actions_addopen(shard_spawn_actions *f, int fd, const char *path, int flags, unsigned mode);",
  "int posix_spawn_file_actions_adddup2(shard_spawn_actions *f, int fd, int newfd);",
  "int posix_spawn(int *pid, const char *path, const shard_spawn_actions *f, const shard_spawnattr *a, char *const argv[], char *const envp[]);",
  "int sigemptyset(shard_sigset *set);",
  "extern char **environ;",
  "int waitpid(int pid, int *status, int options);",
  "int kill(int pid, int sig);",
  "int getpid(void);",
  "int shard_signal_trap(int sig, int on);",   -- runtime/host.c
  "int shard_signal_take(int sig);",
  -- Unix sockets
  "struct shard_sockaddr_un { unsigned short family; char path[108]; };",
  "int socket(int domain, int type, int protocol);",
  "int bind(int fd, const void *addr, unsigned len);",
  "int listen(int fd, int backlog);",
  "int accept(int fd, void *addr, void *len);",
  "int connect(int fd, const void *addr, unsigned len);",
}

M.C = ffi.C
M.POLLIN = 1

-- The last failed call's reason (strerror of errno).
function M.strerror() return ffi.string(M.C.strerror(ffi.errno())) end

-- Raises "who: what: reason" for the call that just failed; level as error's (0: no position).
function M.fail(who, what, level)
  error(("%s: %s: %s"):format(who, what, M.strerror()), level and level + 1 or 0)
end

-- The fds among fds that have input (or ended), waiting up to ms (-1: no limit); {} when a
-- signal interrupted the wait.
function M.poll(fds, ms)
  local p = ffi.new("struct shard_pollfd[?]", #fds)
  for i, fd in ipairs(fds) do p[i - 1].fd, p[i - 1].events = fd, M.POLLIN end
  local ready = {}
  if M.C.poll(p, #fds, ms) > 0 then
    for i = 0, #fds - 1 do if p[i].revents ~= 0 then ready[p[i].fd] = true end end
  end
  return ready
end

local chunk = ffi.new("char[65536]")

-- Reads once from obj.fd, appending what came to obj.buf: true when bytes came or a signal
-- interrupted the read (EINTR), false at the end of input. Job:fill and Conn:fill.
function M.fill(obj)
  local n = tonumber(M.C.read(obj.fd, chunk, 65536))
  if n > 0 then obj.buf = obj.buf .. ffi.string(chunk, n); return true end
  return n < 0 and ffi.errno() == 4
end

-- t's keys, sorted.
function M.sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

return M
