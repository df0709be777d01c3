-- shard.cli: the command line of bin/shard. runtime/host.c calls main(argv) and exits with
-- the number it returns: 0 success, 1 the recipe (or command) raised an error, 2 the command
-- line itself was wrong (unknown command, missing file).
local M = {}

local USAGE = [[
usage: shard <command> [args]

  run FILE [--key=value ...] [args]   run a recipe; --key=value overrides reach shard.config
  repl [--nproc N]                     interactive Lua with shard loaded (reads stdin when piped);
                                       --nproc N: one prompt driving N ranks (repl --help)
  launch --nproc N FILE [...]          run a recipe on N local ranks (--timeout SECONDS: collective
                                       timeout, default 600 or SHARD_COMM_TIMEOUT; --max_restarts N:
                                       restart a failed job from its in-memory snapshots)
  bench ...                            benchmarks
  estimate [--key=value ...]           per-rank memory of a GPT under FSDP
  estimate --dry-run [--world=N] RECIPE [--key=value ...]
                                       run RECIPE as one of N ranks with no data (meta tensors):
                                       peak memory by tag, bytes per collective, FLOPs per step
  sweep FILE.lua [--out DIR] [...]     run a benchmark sweep: each point its own process, results
                                       appended to JSONL (a rerun skips done points), then a
                                       Markdown/CSV table and gnuplot PNGs (sweep --help)
  cpu                                  the CPU, its kernel set in use and the sets it runs
                                       (SHARD_CPU_ISA=generic|avx2|avx512|avx512bf16 chooses)
  --version                            print the version
  help                                 this text

SHARD_TRACEBACK=1 prints a traceback with a recipe's error.]]

local function usage_error(msg)
  io.stderr:write("shard: ", msg, "\n")
  return 2
end

-- Message only by default: a recipe's author wants the line that failed, not the stack of
-- shard's own frames; SHARD_TRACEBACK=1 asks for the whole story.
local source   -- the file `shard run` runs, to name it with an error object that is not a string

-- error{ code = 1 }: the table's contents (or its __tostring), after the file that raised it.
local function describe(err)
  if err == nil then return "(error object is nil)" end
  if type(err) == "string" or type(err) == "number" then return tostring(err) end
  return ("%s raised an error %s: %s"):format(source or "shard", type(err), require("shard.show").value(err))
end

local function error_handler(err)
  local msg = describe(err)
  if os.getenv("SHARD_TRACEBACK") == "1" then return debug.traceback(msg, 2) end
  return msg
end

-- shard.config's usage and help errors are tables: they keep their shape through the handler.
local function handler(err)
  if type(err) == "table" and (err.usage or err.help) then return err end
  return error_handler(err)
end

-- Calls fn(...); on an error prints the message on stderr and returns false and the exit
-- code: 2 for a wrong command line (a usage error), 0 after --help, else 1.
local function protected(fn, ...)
  local args, n = { ... }, select("#", ...)
  local ok, result = xpcall(function() return fn(unpack(args, 1, n)) end, handler)
  if ok then return true, result end
  io.stdout:flush()
  if type(result) == "table" and result.help then print(result.help); return false, 0 end
  if type(result) == "table" then io.stderr:write("shard: ", result.usage, "\n"); return false, 2 end
  io.stderr:write(result, "\n")
  return false, 1
end

-- A command module's main returns its exit code (nil means success).
local function call_main(mod, args)
  local ok, rc = protected(function() return require(mod).main(args) end)
  if not ok then return rc end
  return type(rc) == "number" and rc or 0
end

local function run(args)
  local file = args[1]
  if not file then return usage_error("run: missing FILE (usage: shard run FILE [--key=value ...])") end
  local f = io.open(file, "r")
  if not f then return usage_error("run: cannot open " .. file) end
  local readable = f:read(0)                     -- nil for a directory
  f:close()
  if not readable and io.open(file .. "/", "r") then return usage_error("run: " .. file .. " is a directory, not a Lua file") end
  local chunk, err = loadfile(file)
  if not chunk then io.stderr:write(err, "\n"); return 1 end
  -- The script sees its arguments as plain lua would give them: arg[0] the file, arg[1..]
  -- everything after it (overrides included), and the same list as `...`.
  local script_args = { [0] = file, [-1] = "shard" }
  for i = 2, #args do script_args[i - 1] = args[i] end
  _G.arg = script_args
  local config = require("shard.config")
  local overrides, stray = config.parse_args(script_args)
  config.set_overrides(overrides, stray, file)
  source = file
  local ok, rc = protected(chunk, unpack(script_args))
  return ok and 0 or rc
end

-- Commands that live in their own modules (the tools in shard.tools.*, over the library);
-- a missing module is reported, not a crash.
local function delegate(name, mod, args)
  if not package.searchpath(mod, package.path) then
    return usage_error(name .. " is not available yet (lua/" .. mod:gsub("%.", "/") .. ".lua is missing)")
  end
  return call_main(mod, args)
end

local COMMANDS = {
  run = run,
  repl = function(args) return call_main("shard.tools.repl", args) end,
  launch = function(args) return delegate("launch", "shard.tools.launch", args) end,
  bench = function(args) return delegate("bench", "shard.bench", args) end,
  estimate = function(args) return delegate("estimate", "shard.tools.estimate", args) end,
  sweep = function(args) return delegate("sweep", "shard.tools.sweep", args) end,
  cpu = function(args) return call_main("shard.cpu", args) end,
}

function M.main(argv)
  local cmd = argv[1]
  local rest = {}
  for i = 2, #argv do rest[i - 1] = argv[i] end
  if cmd == "--version" or cmd == "version" then
    print("shard " .. require("shard").version)
    return 0
  elseif cmd == "help" or cmd == "--help" or cmd == "-h" then
    print(USAGE)
    return 0
  elseif cmd == nil then
    io.stderr:write(USAGE, "\n")
    return 2
  end
  local command = COMMANDS[cmd]
  if not command then return usage_error("unknown command '" .. cmd .. "' (try: shard help)") end
  return command(rest)
end

return M
