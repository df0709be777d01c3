-- shard.tools.repl.interrupt: Ctrl-C for the REPL, through the SIGINT trap of runtime/host.c.
--   interrupt.install()          the trap, for the whole session (a plain luajit has none:
--                                 then Ctrl-C ends the process as usual)
--   interrupt.run(fn, handler)   xpcall(fn, handler) with Ctrl-C raising "interrupted" in fn
--                                 (at once when one came since the last take())
--   interrupt.take()             the Ctrl-Cs seen since the last call (at the prompt, waiting)
-- LuaJIT runs no hooks inside compiled traces, so a chunk's own loops would not stop: run()
-- turns the JIT off for fn and every function defined in it (jit.off(fn, true)); the
-- functions of shard's modules stay compiled and stop at the next instruction they run in the
-- interpreter (a return into the chunk, a call that leaves the trace).
local ffi = require("ffi")

pcall(ffi.cdef, [[
int shard_sigint_trap(int on);
void shard_sigint_arm(int on);
int shard_sigint_take(void);
]])

local M = {}

local trap = pcall(function() return ffi.C.shard_sigint_trap end)

function M.install()
  if trap then ffi.C.shard_sigint_trap(1) end
  return trap
end

function M.uninstall()
  if trap then ffi.C.shard_sigint_trap(0) end
end

function M.take()
  return trap and ffi.C.shard_sigint_take() or 0
end

M.MESSAGE = "interrupted"

-- True when err is the error the trap raises ("interrupted", with or without a position).
function M.is_interrupt(err)
  return type(err) == "string" and (err == M.MESSAGE or err:match(": interrupted$") ~= nil)
end

local function pack(...) return select("#", ...), { ... } end

-- Calls fn() with Ctrl-C armed; returns true, n, { the n values } or false and handler(err).
function M.run(fn, handler)
  jit.off(fn, true)
  local C = trap and ffi.C
  local function protected()
    local n, values = pack(fn())
    if C then C.shard_sigint_arm(0) end
    return n, values
  end
  local function on_error(err)
    if C then C.shard_sigint_arm(0) end
    return handler(err)
  end
  if C then C.shard_sigint_arm(1) end
  if C and C.shard_sigint_take() > 0 then   -- a Ctrl-C came before the chunk started
    C.shard_sigint_arm(0)
    return false, handler(M.MESSAGE)
  end
  local ok, a, b = xpcall(protected, on_error)
  if C then C.shard_sigint_arm(0); C.shard_sigint_take() end   -- that Ctrl-C is spent
  return ok, a, b
end

return M
