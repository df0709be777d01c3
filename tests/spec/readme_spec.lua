-- README.md's code blocks, run: an example in README that does not run as shown fails here.
-- Each fenced block is one test, named by its line in README. What a block holds decides how
-- it runs:
--   ```lua                 written to a file and run with `bin/shard run FILE`: exit 0
--   ```sh (commands)       each command (a trailing \ continues it; # lines are comments) in
--                          order, each to exit 0
--   $ COMMAND, then output a transcript: COMMAND runs (exit 0) and prints the lines shown;
--                          with "> " input lines it is a REPL session, typed line by line
--                          through a pseudo-terminal (tests/pty/ptyexpect; "^C" at the start
--                          of an output line is a Ctrl-C typed a second after the line before),
--                          and tests/pty/readme_session.txt must be the same text
-- An HTML comment on the line just before a block says more, in clauses split by ";":
--   not run: REASON            the block is not run here (hosts, SLURM, GPUs, the network, minutes);
--                              its test checks that REASON is given and that every tests/ file it
--                              names (where the behaviour is run instead) exists
--   run with: ARGS             ARGS go at the end of each bin/shard command of the block
--   run                        the block runs as shown (for use with the clauses below)
--   needs tinyshakespeare.txt  the block reads the corpus: where it is in neither $SHARD_DATA nor
--                              ../shared/data (a clean clone), it runs on a stand-in (GPL-3 as
--                              tinyshakespeare.txt), named in the test
--   numbers vary               a transcript's lines must appear in the output in order, numbers
--                              and the spaces between columns aside
-- A block with no way to run (no lua, no sh, no "$ ") and no "not run" fails, as does an
-- unknown clause. Transcript lines otherwise match exactly, but for numbers with a point or
-- an exponent: within 1e-4 relative (the last bits of a sum differ between CPU kernel sets).
-- Blocks run in a scratch folder with links to bin/, recipes/, tests/ and bench/ (so their
-- out/ is the scratch's), with SHARD_DATA set to the corpus's folder (or the stand-in's).
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local ROOT, BIN, quote, sh = support.ROOT, support.BIN, support.quote, support.sh

local DRIVER = (os.getenv("SHARD_BUILD") or "build") .. "/tests/pty/ptyexpect"
if not DRIVER:match("^/") then DRIVER = ROOT .. "/" .. DRIVER end
local SESSION_FILE = ROOT .. "/tests/pty/readme_session.txt"
local CORPUS_DIR = os.getenv("SHARD_DATA") or (ROOT .. "/../shared/data")
local STAND_IN = "/usr/share/common-licenses/GPL-3"
local LINKED = { "bin", "recipes", "tests", "bench" }

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function lines(text)
  local t = {}
  for l in (text .. "\n"):gmatch("(.-)\n") do t[#t + 1] = l end
  while #t > 0 and t[#t]:match("^%s*$") do t[#t] = nil end
  return t
end

-- The marker's clauses: { not_run = REASON, args = ARGS, needs_corpus = bool, vary = bool }.
local function parse_marker(comment, where)
  local m = { args = "", not_run = (comment or ""):match("^not run:%s*(.*)") }
  if m.not_run then return m end
  for clause in (comment or ""):gmatch("[^;]+") do
    clause = clause:match("^%s*(.-)%s*$")
    if clause:match("^run with:") then m.args = clause:match("^run with:%s*(.*)")
    elseif clause == "needs tinyshakespeare.txt" then m.needs_corpus = true
    elseif clause == "numbers vary" then m.vary = true
    elseif clause ~= "run" then m.error = ("%s: unknown clause '%s' in <!-- %s -->"):format(where, clause, comment) end
  end
  return m
end

-- README's fenced blocks: { line = N (the fence's), lang, text, marker }.
local function readme_blocks()
  local src = lines(read(ROOT .. "/README.md"))
  local blocks, open = {}, nil
  for i, l in ipairs(src) do
    if open then
      if l:match("^```%s*$") then
        open.text = table.concat(open.body, "\n") .. "\n"
        blocks[#blocks + 1], open = open, nil
      else
        open.body[#open.body + 1] = l
      end
    elseif l:match("^```") then
      local where = "README.md:" .. i
      local comment = (src[i - 1] or ""):match("^<!%-%-%s*(.-)%s*%-%->%s*$")
      open = { line = i, where = where, lang = l:match("^```(%w*)"), body = {}, marker = parse_marker(comment, where) }
    end
  end
  assert(not open, "README.md: the block opened at line " .. (open and open.line or 0) .. " never closes")
  return blocks
end

local function corpus_found()
  local f = io.open(CORPUS_DIR .. "/tinyshakespeare.txt", "rb")
  if f then f:close() end
  return f ~= nil
end

-- Without the corpus, a folder whose tinyshakespeare.txt is the stand-in text: the blocks that
-- read the corpus compare no figure of it exactly, so they run the same on any text.
local CORPUS_NOTE, STAND_IN_DIR = "", nil
if not corpus_found() then
  local p = io.popen("mktemp -d")
  STAND_IN_DIR = p:read("*l")
  p:close()
  write(STAND_IN_DIR .. "/tinyshakespeare.txt", read(STAND_IN))
  CORPUS_DIR, CORPUS_NOTE = STAND_IN_DIR, " (on a stand-in corpus, " .. STAND_IN .. ")"
end

-- A scratch folder with links to the project's folders that commands name; removed by cleanup.
local function scratch()
  local p = io.popen("mktemp -d")
  local dir = p:read("*l")
  p:close()
  for _, name in ipairs(LINKED) do os.execute(("ln -s %s %s"):format(quote(ROOT .. "/" .. name), quote(dir .. "/" .. name))) end
  return dir
end

local function cleanup(dir) os.execute("rm -rf " .. quote(dir)) end

-- A command line as the shell runs it in dir: bin/shard is this suite's binary, args appended
-- to each shard command.
local function command(dir, cmd, args)
  local with_bin = (" " .. cmd):gsub("([%s|;])bin/shard(%s)", function(pre, post) return pre .. quote(BIN) .. post end):sub(2)
  if with_bin ~= cmd and args ~= "" then with_bin = with_bin .. " " .. args end
  return ("cd %s && export SHARD_DATA=%s && %s"):format(quote(dir), quote(CORPUS_DIR), with_bin)
end

-- Splits a line into its text, numbers masked as #, and its numbers (strings; a number may
-- have thousands separated by commas, a fraction and an exponent: 14,313 0.5187 5.05e-04).
local function split_numbers(line)
  local parts, nums, i = {}, {}, 1
  while true do
    local s, e = line:find("%d+", i)
    if not s then break end
    while line:find("^,%d%d%d", e + 1) do e = e + 4 end
    e = select(2, line:find("^%.%d*", e + 1)) or e
    e = select(2, line:find("^[eE][-+]?%d+", e + 1)) or e
    parts[#parts + 1] = line:sub(i, s - 1)
    nums[#nums + 1] = line:sub(s, e)
    i = e + 1
  end
  parts[#parts + 1] = line:sub(i)
  return table.concat(parts, "#"), nums
end

local function same_number(a, b)
  if not (a:find("[.eE]") or b:find("[.eE]")) then return a == b end
  local x, y = tonumber(a), tonumber(b)
  return x and y and math.abs(x - y) <= 1e-4 * math.max(math.abs(x), math.abs(y))
end

-- Whether an output line matches a shown line (vary: numbers and column spacing aside).
local function line_matches(shown, got, vary)
  local ts, ns = split_numbers(shown)
  local tg, ng = split_numbers(got)
  if vary then return (ts:gsub("%s+", " ")) == (tg:gsub("%s+", " ")) end
  if ts ~= tg or #ns ~= #ng then return false end
  for i = 1, #ns do
    if not same_number(ns[i], ng[i]) then return false end
  end
  return true
end

-- Checks that the output lines are the shown ones (vary: contain them in order).
local function check_output(shown, got, vary, where)
  local full = table.concat(got, "\n")
  if vary then
    local j = 1
    for _, s in ipairs(shown) do
      while j <= #got and not line_matches(s, got[j], true) do j = j + 1 end
      assert(j <= #got, ("%s: no line like\n  %s\nin the output (in order):\n%s"):format(where, s, full))
      j = j + 1
    end
    return
  end
  for i = 1, math.max(#shown, #got) do
    assert(shown[i] and got[i] and line_matches(shown[i], got[i], false),
      ("%s: line %d of the output is\n  %s\nwhere README shows\n  %s\nthe whole output:\n%s"):format(
        where, i, tostring(got[i]), tostring(shown[i]), full))
  end
end

-- A transcript: the command ($ line and its \ continuations), the lines after it.
local function transcript(text)
  local t = lines(text)
  local cmd, i = t[1]:match("^%$ (.*)"), 2
  while cmd:match("\\$") do
    cmd = cmd:sub(1, -2) .. " " .. t[i]:match("^%s*(.-)$")
    i = i + 1
  end
  return cmd, { table.unpack(t, i) }
end

local function is_session(shown)
  for _, l in ipairs(shown) do
    if l:match("^> ") then return true end
  end
  return false
end

-- The ptyexpect script that types a session's inputs ("^C" lines: a Ctrl-C a second later).
local function session_script(shown)
  local steps = { "timeout 60", "expect \\n> " }
  for i, l in ipairs(shown) do
    local input = l:match("^> (.*)")
    if input then
      steps[#steps + 1] = "send " .. input:gsub("\\", "\\\\") .. "\\n"
      if (shown[i + 1] or ""):match("^%^C") then
        steps[#steps + 1] = "sleep 1"
        steps[#steps + 1] = "send \\x03"
      end
      steps[#steps + 1] = "expect \\n> "
    end
  end
  steps[#steps + 1] = "send \\x04"
  steps[#steps + 1] = "wait 0"
  return table.concat(steps, "\n") .. "\n"
end

local function run_session(dir, block, cmd, shown)
  assert.equal(read(SESSION_FILE), block.text,
    block.where .. ": the REPL session differs from tests/pty/readme_session.txt: keep them the same text")
  assert(cmd:match("^bin/shard repl"), block.where .. ": a session's command must be bin/shard repl")
  assert(io.open(DRIVER, "r"), DRIVER .. " is missing: make test builds it")
  local script = dir .. "/session.txt"
  write(script, session_script(shown))
  local code, out = sh(("cd %s && env TERM=dumb INPUTRC=/dev/null SHARD_HISTORY=%s %s -- %s %s < %s"):format(
    quote(dir), quote(dir .. "/history"), quote(DRIVER), quote(BIN), cmd:match("^bin/shard (.*)"), quote(script)))
  assert(code == 0, block.where .. ": the session did not run as shown:\n" .. out)
  local got, typed = {}, false
  for _, l in ipairs(lines(out)) do
    typed = typed or l:match("^> ") ~= nil
    if typed then got[#got + 1] = l end
  end
  while #got > 0 and got[#got]:match("^>?%s*$") do got[#got] = nil end
  check_output(shown, got, false, block.where)
end

local function run_transcript(dir, block)
  local cmd, shown = transcript(block.text)
  if is_session(shown) then return run_session(dir, block, cmd, shown) end
  local code, out, err = sh(command(dir, cmd, block.marker.args))
  assert(code == 0, ("%s: `%s` exited %d:\n%s%s"):format(block.where, cmd, code, out, err))
  check_output(shown, lines(out .. err), block.marker.vary, block.where)
end

local function run_lua(dir, block)
  write(dir .. "/readme_block.lua", block.text)
  local code, out, err = sh(command(dir, "bin/shard run readme_block.lua", block.marker.args))
  assert(code == 0, ("%s: the Lua block exited %d:\n%s%s"):format(block.where, code, out, err))
end

-- The commands of an sh block, a trailing \ joining a line to the next, comments dropped.
local function commands(text)
  local cmds, cur = {}, ""
  for _, l in ipairs(lines(text)) do
    if cur ~= "" or not l:match("^%s*#") then cur = cur .. " " .. l:match("^%s*(.-)%s*$") end
    if cur:match("\\$") then cur = cur:sub(1, -2)
    else
      if cur:match("%S") then cmds[#cmds + 1] = cur:gsub("%s+#.*$", ""):match("^%s*(.-)$") end
      cur = ""
    end
  end
  return cmds
end

local function run_sh(dir, block)
  for _, cmd in ipairs(commands(block.text)) do
    local code, out, err = sh(command(dir, cmd, block.marker.args))
    assert(code == 0, ("%s: `%s` exited %d:\n%s%s"):format(block.where, cmd, code, out, err))
  end
end

-- A block marked not run: its reason is given, and each tests/ file the reason names as the
-- place its behaviour runs instead is there.
local function check_not_run(block)
  local why = block.marker.not_run
  assert(why:match("%S"), block.where .. ": <!-- not run: --> gives no reason")
  for path in why:gmatch("(tests/[%w_/%.%-]+%.%a+)") do
    local f = io.open(ROOT .. "/" .. path, "r")
    assert(f, ("%s: the reason names %s, which does not exist"):format(block.where, path))
    f:close()
  end
end

-- How a block runs, or nil and why it cannot.
local function runner(block)
  if block.text:match("^%$ ") then return run_transcript end
  if block.lang == "lua" then return run_lua end
  if block.lang == "sh" then return run_sh end
  return nil, ("%s: a block with nothing to run (no lua, sh or \"$ \" transcript): mark it <!-- not run: why -->"):format(block.where)
end

describe("README.md's code blocks", function()
  local blocks = readme_blocks()
  teardown(function() if STAND_IN_DIR then cleanup(STAND_IN_DIR) end end)
  it("are found (README has blocks, each marked or runnable)", function()
    assert.is_true(#blocks >= 10, "README.md: only " .. #blocks .. " blocks found")
  end)
  for _, block in ipairs(blocks) do
    local m = block.marker
    local name = ("%s %s: %s"):format(block.where, block.lang ~= "" and block.lang or "text", (block.text:match("^[^\n]*")):sub(1, 60))
    if m.not_run then
      it(name .. " is not run here, and says why", function() check_not_run(block) end)
    else
      it(name .. (m.needs_corpus and CORPUS_NOTE or ""), function()
        assert(not m.error, m.error)
        local run, why = runner(block)
        assert(run, why)
        local dir = scratch()
        local ok, e = pcall(run, dir, block)
        cleanup(dir)
        if not ok then error(e, 0) end
      end)
    end
  end
end)
