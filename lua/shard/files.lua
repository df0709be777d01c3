-- shard.files: files and shell commands from plain Lua (no FFI, no runtime), so that a tool a
-- bare luajit runs (tools/*.lua, with lua/ on package.path) shares them with shard itself.
--   files.read_file(path)   the file's bytes, or nil and io.open's message
--   files.readable(path)    whether it opens for reading
--   files.lines_of(cmd)     a shell command's stdout, line by line
--   files.shell_quote(s), files.shell(cmd)
local M = {}

-- The whole of the file at path, or nil and io.open's message ("path: No such file or directory").
function M.read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- Whether path opens for reading (a directory does too, on Linux).
function M.readable(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- The lines cmd (run by the shell) writes to stdout, as a list; empty when it cannot start.
function M.lines_of(cmd)
  local out = {}
  local p = io.popen(cmd)
  if not p then return out end
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

-- A path as one shell word ('...' with every ' escaped): no path reaches a shell unquoted.
function M.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs cmd through the shell: its output (stdout and stderr) and its exit status. LuaJIT's
-- popen close reports no status (true even when the command was not found), so it is echoed.
function M.shell(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1; echo \"$?\"")
  local out = p and p:read("*a") or ""
  if p then p:close() end
  local body, status = out:match("^(.-)\n?(%d+)%s*$")
  return body or out, tonumber(status) or -1
end

return M
