-- shard.tools.repl: interactive Lua with shard loaded as the global `shard`.
--   shard repl              one process
--   shard repl --nproc N    one prompt driving N ranks (shard.tools.repl.ranks)
-- A line that is an expression prints its values (tensors pretty-printed, tables by their
-- contents: shard.show); a statement prints nothing; a chunk left open (a function body,
-- an unclosed call) continues on the next line; an error is printed and the prompt comes back.
-- Ctrl-C interrupts the running chunk (shard.tools.repl.interrupt) or drops the line being typed;
-- the session and its values survive. On a terminal, lines are read with readline: Tab
-- completes Lua names (shard.tools.repl.complete) and the history file is appended to as lines are
-- entered (shard.tools.repl.terminal). When stdin is not a terminal, lines are read without prompt
-- or banner, so
--   echo 'print(shard.randn{2,3})' | shard repl
-- prints just the tensor; the exit code is then 1 if any chunk raised an error.
local argv = require("shard.argv")
local chunk = require("shard.tools.repl.chunk")
local show = require("shard.show")
local terminal = require("shard.tools.repl.terminal")
local interrupt = require("shard.tools.repl.interrupt")
local complete = require("shard.tools.repl.complete")

local M = {}

local HELP = [[
usage: shard repl [--nproc N] [--timeout SECONDS]
Interactive Lua with `shard` loaded: each line (or a block, continued while incomplete) runs
and its values are printed; Ctrl-C interrupts a running chunk, Tab completes names, Ctrl-D
exits. History goes to $SHARD_HISTORY or ~/.shard_history as lines are entered. With stdin
not a terminal it reads the script from stdin and exits 1 if any chunk failed.
  --nproc N          one prompt driving N ranks started as `shard launch` starts them: each
                     chunk runs on every rank, with `rank` and `world` (the world group)
                     defined; outputs are labelled by rank, identical ones shown once
                     ([0-3] ...). Commands: :ranks, :wait, :restart (see :help).
  --timeout SECONDS  the ranks' collective timeout (as shard launch --timeout)]]

local function usage(msg)
  io.stderr:write("shard repl: ", msg, "\n", HELP, "\n")
  return 2
end

local OPTIONS = { { "nproc", "count", min = 1 }, { "timeout", "seconds" }, { "help", "flag", aliases = { "-h" } } }

-- The options (o.help for --help, -h or help), or nil and what is wrong.
function M.parse(args)
  local o, pos = argv.try(args, { options = OPTIONS })
  if not o then return nil, pos end
  for _, a in ipairs(pos) do
    if a ~= "help" then return nil, "unexpected argument '" .. a .. "'" end
    o.help = true
  end
  if o.timeout and not o.nproc then return nil, "--timeout is for the ranks of --nproc N" end
  return o
end

-- Reads complete chunks: calls on_chunk(src, fn, packed) for each, on_error(msg) for a
-- syntax error, and on_command(line) (when given) for a line ":name" typed at the first
-- prompt; Ctrl-C at the prompt drops what was typed. Returns false if the input ended inside
-- an unfinished chunk.
function M.loop(term, on_chunk, on_error, prompts, on_command)
  prompts = prompts or { "> ", ">> " }
  local buffer, n, first = nil, 0, 1   -- lines read; the line the buffer starts on
  while true do
    local line = term.read(buffer and prompts[2] or prompts[1])
    if line == nil then break end
    n = n + 1
    if not buffer then first = n end
    if line == false then
      buffer = nil
    elseif on_command and not buffer and line:match("^:%a") then
      on_command(line)
    else
      buffer = buffer and buffer .. "\n" .. line or line
      local fn, err = chunk.compile(buffer, first)
      if fn then
        local src = buffer
        buffer = nil
        on_chunk(src, fn, err)
      elseif err ~= "incomplete" then
        on_error(err)
        buffer = nil
      end
    end
  end
  if buffer then on_error("stdin: input ended inside an unfinished chunk") end
  return buffer == nil
end

local function single()
  _G.shard = require("shard")
  local interactive = terminal.is_terminal()
  interrupt.install()
  local term = terminal.open { complete = function(text) return complete.candidates(text, _G) end }
  if interactive then
    print(("shard %s (%s) -- Lua with `shard` loaded; Ctrl-C interrupts, Ctrl-D exits"):format(shard.version, jit.version))
  end
  local failed = false
  local function on_error(msg)
    io.stdout:flush()
    io.stderr:write(msg, "\n")
    failed = true
  end
  M.loop(term, function(_, fn, packed)
    local ok, n, values = chunk.run(fn, packed)
    if ok then
      io.stdout:write(show.values(n, values))
    else
      on_error(n)
    end
  end, on_error)
  term.close()
  interrupt.uninstall()
  if interactive then io.write("\n") end
  return (failed and not interactive) and 1 or 0
end

function M.main(args)
  local o, err = M.parse(args or {})
  if not o then return usage(err) end
  if o.help then print(HELP); return 0 end
  if o.nproc then return require("shard.tools.repl.ranks").main(o) end
  return single()
end

return M
