-- shard.tools.repl.chunk: a REPL chunk from source to the values it returns.
--   local fn, err = chunk.compile(src, line)   -- nil, "incomplete" while the text ends too early
--   local ok, n, values = chunk.run(fn)  -- ok false: values is the error message
-- A chunk that is an expression list returns its values (printed by the REPL); statements
-- return nothing unless they `return` something. Ctrl-C interrupts a running chunk
-- (shard.tools.repl.interrupt), which then fails with the message "interrupted".
local interrupt = require("shard.tools.repl.interrupt")

local M = {}

-- The expressions become a call's arguments rather than `return expr`, so that error("x") in
-- them is not a tail call and keeps its "stdin:1:" position; the closing parenthesis goes on
-- its own line past any comment. Such a chunk returns the count and the values in a table.
local PACK = "return (function(...) return select('#', ...), {...} end)("

-- Returns fn and whether it is a packed expression list, or nil and "incomplete", or nil and
-- a syntax error. line (default 1): the input line src starts on; blank lines ahead of the
-- source make errors name that line ("stdin:12:"), as lua does for a script read from stdin.
function M.compile(src, line)
  local pad = ("\n"):rep((line or 1) - 1)
  local fn = loadstring(pad .. PACK .. src .. "\n)", "=stdin")
  if fn then return fn, true end
  local err
  fn, err = loadstring(pad .. src, "=stdin")
  if fn then return fn, false end
  -- Unfinished when the text ends too early as statements or as an expression ("1 +").
  local _, as_expr = loadstring(pad .. "return " .. src, "=stdin")
  if err:match("'<eof>'$") or as_expr:match("'<eof>'$") then return nil, "incomplete" end
  return nil, err
end

-- The error message; with SHARD_TRACEBACK=1 the traceback too.
function M.message(err)
  local msg = err == nil and "(error object is nil)" or tostring(err)
  if os.getenv("SHARD_TRACEBACK") == "1" then return debug.traceback(msg, 2) end
  return msg
end

-- Runs a compiled chunk: true, n, values, or false and the error message.
function M.run(fn, packed)
  local ok, n, values = interrupt.run(fn, M.message)
  if not ok then return false, n end
  if packed then n, values = values[1], values[2] end
  return true, n, values
end

return M
