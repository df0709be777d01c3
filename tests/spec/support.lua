-- tests/spec/support.lua: what the specs that drive bin/shard from the outside share
-- (loaded with dofile; not a spec itself). tests/run.sh exports SHARD_BIN (bin/shard, or
-- bin/shard-asan under make test-asan).
local S = {}

S.ROOT = os.getenv("SHARD_HOME") or "."
S.BIN = os.getenv("SHARD_BIN") or (S.ROOT .. "/bin/shard")
if not S.BIN:match("^/") then S.BIN = S.ROOT .. "/" .. S.BIN end

function S.quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function slurp(path)
  local f = assert(io.open(path)); local s = f:read("*a"); f:close(); os.remove(path); return s
end

-- Runs a shell command line (with `input` on its stdin); returns exit code, stdout, stderr.
function S.sh(cmd, input)
  local out, err = os.tmpname(), os.tmpname()
  local full = cmd .. " >" .. out .. " 2>" .. err
  if input then
    local inp = os.tmpname()
    local f = assert(io.open(inp, "w")); f:write(input); f:close()
    full = full .. " <" .. inp
  end
  local p = assert(io.popen(full .. "; echo $?"))
  local code = tonumber(p:read("*a"):match("(%d+)%s*$"))
  p:close()
  return code, slurp(out), slurp(err)
end

-- A command line's stdout and stderr together, its exit code and its wall seconds.
function S.run(cmd)
  local t0 = os.time()
  local code, out, err = S.sh(cmd)
  return out .. err, code, os.time() - t0
end

-- The same for bin/shard with these arguments.
function S.shard(args) return S.run(S.quote(S.BIN) .. " " .. args) end

-- Writes a Lua script to a temporary file; returns its path.
function S.script(text)
  local path = os.tmpname() .. ".lua"
  local f = assert(io.open(path, "w")); f:write(text); f:close()
  return path
end

-- The losses a recipe's output shows, in order: each progress line's loss, then each
-- evaluation's train and val loss; and the evaluations' train losses alone.
function S.recipe_losses(out)
  local t, train = {}, {}
  for loss in out:gmatch("iter %d+ | loss ([%d%.]+)") do t[#t + 1] = tonumber(loss) end
  for tl, vl in out:gmatch("iter %d+ | train_loss ([%d%.]+) | val_loss ([%d%.]+)") do
    t[#t + 1] = tonumber(tl); t[#t + 1] = tonumber(vl)
    train[#train + 1] = tonumber(tl)
  end
  return t, train
end

return S
