-- tests/netns/busy.lua: a job that keeps the network busy until it is stopped from outside
-- (tests/netns/run.sh loses a node or cuts the link under it). Every rank all-reduces on the
-- world and all-gathers inside its node, every 20 ms, for at most 120 s; rank 0 prints
-- "ready" once every rank has been through a few rounds.
local shard = require("shard")
local ffi = require("ffi")
pcall(ffi.cdef, "int usleep(unsigned int usec);")
local w = shard.comm.init()
local node = w:split_node("node group")
local t = shard.tensor({ 1, 2, 3, 4 })
local start = os.time()
for i = 1, 1e9 do
  w:all_reduce(t, "avg")
  node:all_gather(t):free()
  if i == 10 and w:rank() == 0 then print("ready") end
  ffi.C.usleep(20000)
  if os.time() - start > 120 then break end
end
