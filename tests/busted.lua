-- tests/busted.lua: runs busted inside bin/shard, so specs see the same LuaJIT, FFI symbols and
-- package path as recipes:  bin/shard run tests/busted.lua [busted options] tests/spec
-- shard is loaded once up front: busted restores package.loaded after each file, and the FFI
-- declarations and metatypes can only be made once per process.
require("shard")
-- Called through pcall, busted sees no script file as its caller and ends with os.exit
-- itself (status 1 if anything failed); a runner error lands here.
local ok, err = pcall(require("busted.runner"), { standalone = false })
if not ok then
  if err ~= nil then io.stderr:write(tostring(err), "\n") end
  io.stdout:flush()
  os.exit(1)
end
