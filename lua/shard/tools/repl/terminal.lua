-- shard.tools.repl.terminal: reading the REPL's lines. On a terminal, GNU readline (linked into
-- bin/shard) through its callback interface, so that Ctrl-C at the prompt drops the line
-- being typed and gives a new prompt; Tab completes Lua names (a completer function given
-- by the caller, never file names); every line entered is appended to the history file at
-- once. Without a terminal (or without readline), plain io.read.
--   local term = terminal.open{ complete = function(text_before_cursor) -> {...} end }
--   term.read(prompt) -> the line, nil at end of input, or false after Ctrl-C
--   term.close()
-- The history file is $SHARD_HISTORY, else ~/.shard_history, kept to HISTORY_LINES lines.
local ffi = require("ffi")
local interrupt = require("shard.tools.repl.interrupt")
local sys = require("shard.tools.sys")

local M = {}

sys.declare {   -- GNU readline, linked into bin/shard
  "void add_history(const char *line);",
  "int read_history(const char *filename);",
  "int append_history(int n, const char *filename);",
  "int history_truncate_file(const char *filename, int lines);",
  "void rl_callback_handler_install(const char *prompt, void (*handler)(char *));",
  "void rl_callback_read_char(void);",
  "void rl_callback_handler_remove(void);",
  "void rl_callback_sigcleanup(void);",
  "void rl_free_line_state(void);",
  "int rl_crlf(void);",
  "extern int rl_catch_signals;",
  "extern char *rl_line_buffer;",
  "extern int rl_attempted_completion_over;",
  "extern int rl_completion_suppress_append;",
  "extern const char *rl_readline_name;",
  "extern const char *rl_completer_word_break_characters;",
  "extern char **(*rl_attempted_completion_function)(const char *, int, int);",
}

local C = sys.C
local HISTORY_LINES = 1000

local function has_readline()
  return pcall(function() return C.rl_callback_read_char ~= nil end)
end

function M.is_terminal() return C.isatty(0) == 1 end

local function history_path()
  local path = os.getenv("SHARD_HISTORY")
  if path and path ~= "" then return path end
  local home = os.getenv("HOME")
  return home and home .. "/.shard_history"
end

local function plain()
  local interactive = M.is_terminal()
  return {
    read = function(prompt)
      if interactive then io.write(prompt); io.flush() end
      return io.read("*l")
    end,
    close = function() end,
  }
end

-- Readline's matches array: the common prefix of the list, then the list, then NULL, in
-- malloc'd memory that readline frees.
local function matches_array(list)
  local common = list[1]
  for i = 2, #list do
    local j = 0
    while j < #common and common:sub(j + 1, j + 1) == list[i]:sub(j + 1, j + 1) do j = j + 1 end
    common = common:sub(1, j)
  end
  local out = ffi.cast("char **", C.malloc(ffi.sizeof("char *") * (#list + 2)))
  out[0] = C.strdup(common)
  local first = #list == 1 and 1 or 0   -- one match: it is the array's only entry
  for i = 1 + first, #list do out[i - first] = C.strdup(list[i]) end
  out[#list + 1 - first] = nil
  return out
end

-- Anchors for what readline keeps pointers to.
local anchors = {}

local function readline_reader(complete)
  local history = history_path()
  if history then
    local f = io.open(history, "a")   -- append_history needs the file to exist
    if f then f:close() end
    C.read_history(history)
  end
  C.rl_catch_signals = 0   -- SIGINT is shard's trap's (runtime/host.c)
  anchors.name = ffi.new("char[6]", "shard")
  C.rl_readline_name = anchors.name
  local breaks = " \t\n\"'`@$><=;|&{(,)}[]+-*/%^~#"   -- not . and :, which are inside names
  anchors.breaks = ffi.new("char[?]", #breaks + 1, breaks)
  C.rl_completer_word_break_characters = anchors.breaks
  anchors.complete = ffi.cast("char **(*)(const char *, int, int)", function(_, _, stop)
    C.rl_attempted_completion_over = 1      -- no file names when nothing matches
    C.rl_completion_suppress_append = 1
    local ok, list = pcall(complete, ffi.string(C.rl_line_buffer, stop))
    if not ok or #list == 0 then return nil end
    return matches_array(list)
  end)
  C.rl_attempted_completion_function = anchors.complete

  local line, done
  anchors.handler = ffi.cast("void (*)(char *)", function(p)
    done = true
    if p ~= nil then line = ffi.string(p); C.free(p) else line = nil end
    C.rl_callback_handler_remove()
  end)
  local pfd = ffi.new("struct shard_pollfd[1]")
  pfd[0].fd, pfd[0].events = 0, sys.POLLIN

  local function read(prompt)
    line, done = nil, false
    interrupt.take()
    C.rl_callback_handler_install(prompt, anchors.handler)
    while not done do
      -- a Ctrl-C that comes just before poll() would not wake it: poll a quarter second at a time
      local n = C.poll(pfd, 1, 250)
      if interrupt.take() > 0 then          -- Ctrl-C: drop the line, a new prompt
        C.rl_free_line_state()
        C.rl_callback_sigcleanup()
        C.rl_callback_handler_remove()
        C.rl_crlf()
        return false
      end
      if n > 0 then C.rl_callback_read_char() end
    end
    if line and line:match("%S") then
      C.add_history(line)
      if history then C.append_history(1, history) end
    end
    return line
  end
  jit.off(read)   -- readline calls back into Lua: not from a compiled trace

  local function close()
    if history then C.history_truncate_file(history, HISTORY_LINES) end
  end
  return { read = read, close = close }
end

function M.open(opts)
  if not M.is_terminal() or not has_readline() then return plain() end
  return readline_reader(opts and opts.complete or function() return {} end)
end

return M
