-- Saving is atomic: the file is written under a temporary name and renamed when complete, so
-- a save that fails leaves the previous file as it was and no temporary behind.
local shard = require("shard")
local S = require("shard.io.safetensors")

describe("checkpoint files", function()
  it("round-trips a model through shard.save / shard.load", function()
    local path = os.tmpname() .. ".safetensors"
    shard.manual_seed(1)
    local a = shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 5, block_size = 4 }
    shard.save(a, path)
    shard.manual_seed(2)
    local b = shard.nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 5, block_size = 4 }
    shard.load(b, path)
    for i, t in ipairs(b:parameters()) do assert.same(a:parameters()[i]:tolist_flat(), t:tolist_flat()) end
    os.remove(path)
  end)

  it("leaves the previous file intact when a save fails", function()
    local path = os.tmpname() .. ".safetensors"
    S.save(path, { x = shard.tensor({ 1, 2, 3 }) })
    local before = io.open(path, "rb"):read("*a")
    local freed = shard.tensor({ 4, 5 })
    freed:free()
    assert.has_error(function() S.save(path, { a = shard.tensor({ 9 }), b = freed }) end)
    assert.equal(before, io.open(path, "rb"):read("*a"))
    local dir, base = path:match("^(.*)/([^/]*)$")
    local p = io.popen('ls "' .. dir .. '" | grep -c "^' .. base .. '.tmp" || true')
    assert.equal("0", p:read("*l"))
    p:close()
    os.remove(path)
  end)
end)
