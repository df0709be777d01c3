-- shard.nn: modules.
local L = require("shard.nn.layers")
local G = require("shard.nn.gpt")
local Llama = require("shard.nn.llama")
local Loss = require("shard.nn.loss")

local nn = {
  Module = require("shard.nn.module"),
  F = require("shard.functional"),
}
for k, v in pairs(L) do nn[k] = v end
for k, v in pairs(G) do nn[k] = v end
for k, v in pairs(Llama) do nn[k] = v end
for k, v in pairs(Loss) do nn[k] = v end
return nn
