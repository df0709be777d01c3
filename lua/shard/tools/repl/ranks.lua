-- shard.tools.repl.ranks: `shard repl --nproc N`, one prompt driving N ranks. The ranks are started
-- by `shard launch --nproc N` (mpirun, the comm of recipes) in a session of their own, so the
-- terminal's Ctrl-C reaches only the prompt, which passes it on. Each rank runs
-- shard.tools.repl.worker and connects back over a Unix socket (shard.tools.repl.wire).
-- Each chunk runs on every rank; their output comes back labelled by rank, identical outputs
-- shown once (shard.tools.repl.merge). An error on a rank is shown with its rank and the session
-- goes on. Ctrl-C sends SIGINT to every busy rank: a rank running Lua stops with
-- "interrupted"; a rank waiting inside a collective whose peers were interrupted cannot stop
-- (it waits in C until they come or the collective's timeout). After GRACE seconds (or a
-- second Ctrl-C) the prompt comes back and says which ranks are still busy: the ranks are
-- out of step, and chunks are refused until they finish (:wait, or a reply seen at the next
-- chunk or command) or :restart starts every rank again. A rank that dies is reported with the launcher's last lines; :restart again.
local wire = require("shard.tools.repl.wire")
local merge = require("shard.tools.repl.merge")
local terminal = require("shard.tools.repl.terminal")
local interrupt = require("shard.tools.repl.interrupt")
local timer = require("shard.timer")
local launch = require("shard.tools.launch")
local sys = require("shard.tools.sys")
local files = require("shard.files")
local sorted = sys.sorted_keys

local C = sys.C
local SIGINT, SIGKILL = 2, 9

local M = {}

M.GRACE = tonumber(os.getenv("SHARD_REPL_GRACE") or "") or 3   -- seconds ranks get to stop after Ctrl-C
local START = 120            -- seconds the ranks get to connect
local LOG_TAIL = 20

local COMMANDS = [[
:ranks     each rank's process and state
:wait      wait for busy ranks to finish their chunk (Ctrl-C stops waiting)
:restart   stop every rank and start them again (their values are lost)
:help      this text]]

local quote = files.shell_quote

local function shell_line(cmd) return files.lines_of(cmd)[1] end

local function alive(pid) return pid and C.kill(pid, 0) == 0 end

local function say(msg) io.stdout:flush(); io.stderr:write(msg, "\n"); io.stderr:flush() end

local Session = {}
Session.__index = Session

function Session:log_tail()
  local f = io.open(self.log, "r")
  if not f then return "" end
  local lines = {}
  for line in f:lines() do
    lines[#lines + 1] = line
    if #lines > LOG_TAIL then table.remove(lines, 1) end
  end
  f:close()
  return table.concat(lines, "\n")
end

-- Starts the ranks and waits for each to connect; returns nil and why on failure.
function Session:start()
  self.dir = shell_line("mktemp -d 2>/dev/null")
  if not self.dir then return nil, "mktemp -d failed" end
  self.log = self.dir .. "/launch.log"
  local sock = self.dir .. "/sock"
  self.server = wire.listen(sock)
  local worker = package.searchpath("shard.tools.repl.worker", package.path)
  local cmd = ("setsid env SHARD_REPL_SOCKET=%s %s launch --nproc %d --all%s %s >%s 2>&1 </dev/null & echo $!")
    :format(quote(sock), quote(launch.shard_exe()), self.world, self.timeout and (" --timeout " .. self.timeout) or "",
            quote(worker), quote(self.log))
  self.launch_pid = tonumber(shell_line(cmd))
  self.conns, self.pids, self.busy, self.dead = {}, {}, {}, {}
  local deadline, n = timer.now() + START, 0
  while n < self.world do
    local ready = wire.poll({ self.server }, 200)
    if interrupt.take() > 0 then return nil, "interrupted while the ranks started" end
    if ready[self.server] then
      local conn = wire.accept(self.server)
      local hello = conn and conn:recv()
      if hello and hello[1] == "hello" then
        local r = tonumber(hello[2])
        self.conns[r], self.pids[r] = conn, tonumber(hello[4])
        n = n + 1
      end
    elseif not alive(self.launch_pid) or timer.now() > deadline then
      return nil, ("the ranks did not start (%d of %d connected); shard launch said:\n%s"):format(n, self.world, self:log_tail())
    end
  end
  return true
end

function Session:stop()
  for r, conn in pairs(self.conns or {}) do
    if not self.busy[r] and not self.dead[r] then conn:send { "quit" } end
  end
  local deadline = timer.now() + 5
  while alive(self.launch_pid) and timer.now() < deadline and not next(self.busy) do wire.poll({}, 50) end
  if alive(self.launch_pid) then C.kill(-self.launch_pid, SIGKILL) end
  for _, pid in pairs(self.pids or {}) do if alive(pid) then C.kill(pid, SIGKILL) end end
  for _, conn in pairs(self.conns or {}) do conn:close() end
  if self.server then C.close(self.server); self.server = nil end
  if self.dir then os.remove(self.dir .. "/sock"); os.remove(self.log); os.remove(self.dir) end
  self.conns, self.busy, self.dead = {}, {}, {}
end

-- Takes the replies that came from busy ranks within ms into replies (rank -> reply); a rank
-- whose connection ended is marked dead.
function Session:receive(replies, ms)
  local fds, rank_of = {}, {}
  for r in pairs(self.busy) do fds[#fds + 1] = self.conns[r].fd; rank_of[self.conns[r].fd] = r end
  for fd in pairs(wire.poll(fds, ms)) do
    local r = rank_of[fd]
    local conn = self.conns[r]
    if not conn:fill() then
      self.dead[r], self.busy[r] = true, nil
    end
    local m = conn:take()
    if m then
      replies[r] = { output = m[2] or "", error = m[1] == "error" and (m[3] or "?") or nil }
      self.busy[r] = nil
    end
  end
end

-- Prints the replies, identical ones once; returns whether every one was a success.
function Session:show(replies)
  local ok = true
  for _, piece in ipairs(merge.merge(replies, self.world)) do
    if piece.error then ok = false end
    local out = piece.error and io.stderr or io.stdout
    io.stdout:flush()
    out:write(piece.text)
    out:flush()
  end
  return ok
end

-- Waits for the busy ranks' replies and prints them. Ctrl-C is passed on to the busy ranks;
-- GRACE seconds later (or at a second Ctrl-C) the wait ends with the ranks still busy.
-- Returns whether every reply was a success.
function Session:collect()
  local replies, since, second = {}, nil, false
  while next(self.busy) do
    -- at most a quarter second at a time: a Ctrl-C just before poll() would not wake it
    local ms = since and math.max(0, math.floor((since + M.GRACE - timer.now()) * 1000)) or 250
    -- replies first: a poll that a Ctrl-C cut short may have left some unread
    self:receive(replies, math.min(ms, 250))
    self:receive(replies, 0)
    local interrupts = interrupt.take()
    if interrupts > 0 and since then second = true; break end
    if interrupts > 0 then
      since = timer.now()
      for r in pairs(self.busy) do C.kill(self.pids[r], SIGINT) end
    end
    if since and timer.now() >= since + M.GRACE then break end
  end
  local ok = self:show(replies)
  if next(self.dead) then
    ok = false
    local dead = sorted(self.dead)
    say(("rank%s %s ended; :restart starts the ranks again. shard launch's last lines:\n%s"):format(
      #dead > 1 and "s" or "", merge.label(dead), self:log_tail()))
  elseif next(self.busy) then
    ok = false
    local busy = sorted(self.busy)
    local when = second and ("at the second Ctrl-C (%.1f s after the first)"):format(timer.now() - since)
                 or ("%g s after Ctrl-C"):format(M.GRACE)
    say(("rank%s %s still running %s: waiting inside a collective that the interrupted ranks left? The ranks are out of step; :wait waits for %s, :restart starts every rank again (values are lost)."):format(
      #busy > 1 and "s" or "", merge.label(busy), when, #busy > 1 and "them" or "it"))
  end
  return ok
end

-- Shows the replies of busy ranks that finished since the prompt came back: they are in step
-- again.
function Session:reap()
  if not next(self.busy) then return end
  local replies = {}
  self:receive(replies, 0)
  if next(replies) then self:show(replies) end
end

-- Why a chunk cannot run now, or nil.
function Session:blocked()
  if next(self.dead) then return "ranks " .. merge.label(sorted(self.dead)) .. " ended: :restart" end
  if next(self.busy) then return "the ranks are out of step (" .. merge.label(sorted(self.busy)) .. " still busy): :wait or :restart" end
end

function Session:run(src)
  self:reap()
  local why = self:blocked()
  if why then say(why); return false end
  for r = 0, self.world - 1 do
    if self.conns[r]:send { "run", src } then self.busy[r] = true else self.dead[r] = true end
  end
  return self:collect()
end

function Session:complete(text)
  if self:blocked() then return {} end
  local conn = self.conns[0]
  if not conn:send { "complete", text } then return {} end
  local m = conn:recv()
  if not m then self.dead[0] = true; return {} end
  local list = {}
  for name in (m[2] or ""):gmatch("[^\n]+") do list[#list + 1] = name end
  return list
end

function Session:command(line)
  self:reap()
  local cmd = line:match("^:(%a+)%s*$")
  if cmd == "help" then print(COMMANDS)
  elseif cmd == "ranks" then
    for r = 0, self.world - 1 do
      local state = self.dead[r] and "ended" or self.busy[r] and "busy" or "idle"
      print(("rank %d: pid %s, %s"):format(r, tostring(self.pids[r]), state))
    end
  elseif cmd == "wait" then
    if next(self.busy) then return self:collect() end
    print("no rank is busy")
  elseif cmd == "restart" then
    self:stop()
    local ok, err = self:start()
    if not ok then say("shard repl: " .. err); return false end
    print(("restarted %d ranks"):format(self.world))
  else
    say("unknown command " .. line .. "\n" .. COMMANDS)
    return false
  end
  return true
end

function M.main(o)
  local s = setmetatable({ world = o.nproc, timeout = o.timeout }, Session)
  local interactive = terminal.is_terminal()
  interrupt.install()
  local ok, err = s:start()
  if not ok then
    s:stop()
    say("shard repl: " .. err)
    return 1
  end
  local term = terminal.open { complete = function(text) return s:complete(text) end }
  if interactive then
    print(("shard repl on %d ranks (`rank`, `world` defined) -- Ctrl-C interrupts every rank, :help lists commands, Ctrl-D exits"):format(s.world))
  end
  local failed = false
  local repl = require("shard.tools.repl")
  repl.loop(term, function(src)
    if not s:run(src) then failed = true end
  end, function(msg)
    say(msg)
    failed = true
  end, nil, function(line)
    if not s:command(line) then failed = true end
  end)
  term.close()
  s:stop()
  interrupt.uninstall()
  if interactive then io.write("\n") end
  return (failed and not interactive) and 1 or 0
end

return M
