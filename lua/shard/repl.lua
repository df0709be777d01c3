-- shard.repl: interactive Lua with shard loaded as the global `shard`.
-- A line that is an expression prints its values (tensors pretty-printed); a chunk left open
-- (a function body, an unclosed call) continues on the next line; an error is printed and the
-- prompt comes back. Line editing and history (~/.shard_history) come from readline, which
-- bin/shard links and exports; without it (a plain luajit) lines are read with io.read.
-- When stdin is not a terminal, lines are read without prompt or banner, so
--   echo 'print(shard.randn{2,3})' | shard repl
-- prints just the tensor; the exit code is then 1 if any chunk raised an error.
local ffi = require "ffi"

local M = {}

for _, decl in ipairs {
  "int isatty(int fd);",
  "char *readline(const char *prompt);",
  "void add_history(const char *line);",
  "int read_history(const char *filename);",
  "int write_history(const char *filename);",
  "int history_truncate_file(const char *filename, int lines);",
  "void free(void *ptr);",
} do pcall(ffi.cdef, decl) end   -- another module may have declared some already

local HISTORY_LINES = 1000

local function has_readline()
  return pcall(function() return ffi.C.readline ~= nil end)
end

-- Returns read(prompt) -> line or nil at end of input, and close().
local function line_reader(interactive)
  if not interactive or not has_readline() then
    return function(prompt)
      if interactive then io.write(prompt); io.flush() end
      return io.read("*l")
    end, function() end
  end
  local home = os.getenv("HOME")
  local history = home and home .. "/.shard_history"
  if history then ffi.C.read_history(history) end
  local function read(prompt)
    local p = ffi.C.readline(prompt)
    if p == nil then return nil end
    local line = ffi.string(p)
    ffi.C.free(p)
    if line:match("%S") then ffi.C.add_history(line) end
    return line
  end
  local function close()
    if history then
      ffi.C.write_history(history)
      ffi.C.history_truncate_file(history, HISTORY_LINES)
    end
  end
  return read, close
end

-- Compiles a chunk: as an expression list to print if it is one, else as statements.
-- Returns fn (whose results are a count and the values in a table), or nil and
-- "incomplete", or nil and a syntax error. The expressions become a call's arguments
-- rather than `return expr`, so that error("x") in them is not a tail call and keeps its
-- "stdin:1:" position; the closing parenthesis goes on its own line past any comment.
local PACK = "return (function(...) return select('#', ...), {...} end)("
local function compile(src)
  local fn = loadstring(PACK .. src .. "\n)", "=stdin")
  if fn then return fn end
  local err
  fn, err = loadstring(src, "=stdin")
  if fn then return function() fn(); return 0, {} end end
  -- Unfinished when the text ends too early as statements or as an expression ("1 +").
  local _, as_expr = loadstring("return " .. src, "=stdin")
  if err:match("'<eof>'$") or as_expr:match("'<eof>'$") then return nil, "incomplete" end
  return nil, err
end

local function show(n, ...)
  if n == 0 then return end
  local parts = {}
  for i = 1, n do parts[i] = tostring((select(i, ...))) end
  print(table.concat(parts, "\t"))
end

local function traceback(err)
  local msg = err == nil and "(error object is nil)" or tostring(err)
  if os.getenv("SHARD_TRACEBACK") == "1" then return debug.traceback(msg, 2) end
  return msg
end

-- Runs one complete chunk; returns false if it raised an error.
local function execute(fn)
  local function report(ok, ...)
    if not ok then
      io.stdout:flush()
      io.stderr:write((...), "\n")
      return false
    end
    local n, values = ...
    show(n, unpack(values, 1, n))
    return true
  end
  return report(xpcall(fn, traceback))
end

local HELP = [[
usage: shard repl
Interactive Lua with `shard` loaded: each line (or a block, continued while incomplete) runs
and its values are printed; Ctrl-D exits. With stdin not a terminal it reads the script from
stdin and exits 1 if any chunk failed.]]

function M.main(args)
  if args and args[1] then
    if args[1] == "--help" or args[1] == "-h" or args[1] == "help" then print(HELP); return 0 end
    io.stderr:write("shard repl: unexpected argument '", args[1], "'\n", HELP, "\n")
    return 2
  end
  _G.shard = require "shard"
  local interactive = ffi.C.isatty(0) == 1
  local read, close = line_reader(interactive)
  if interactive then
    print(("shard %s (%s) -- Lua with `shard` loaded; Ctrl-D exits"):format(shard.version, jit.version))
  end
  local failed = false
  local buffer
  while true do
    local line = read(buffer and ">> " or "> ")
    if not line then break end
    buffer = buffer and buffer .. "\n" .. line or line
    local fn, err = compile(buffer)
    if fn then
      if not execute(fn) then failed = true end
      buffer = nil
    elseif err ~= "incomplete" then
      io.stderr:write(err, "\n")
      failed = true
      buffer = nil
    end
  end
  if buffer then
    io.stderr:write("stdin: input ended inside an unfinished chunk\n")
    failed = true
  end
  close()
  if interactive then io.write("\n") end
  return (failed and not interactive) and 1 or 0
end

return M
