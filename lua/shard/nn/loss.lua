-- shard.nn.global_loss: the loss over the global batch under gradient accumulation and data
-- parallelism. A model's loss is the mean over its micro-batch's valid target tokens (those
-- not ignore_index). Averaging those means over micro-batches and ranks weighs a token of a
-- short micro-batch more than one of a long one, so the gradient is not one process's on the
-- whole batch. Instead each micro-batch's mean is scaled by n_i * R / N (n_i its valid
-- tokens, N the valid tokens of every micro-batch of every rank, R the data-parallel ranks
-- whose gradients FSDP averages): the scaled losses, summed over the micro-batches and
-- averaged over the ranks, are sum(token losses) / N, and so are their gradients.
--   local gl = nn.global_loss({ y1, y2, y3 })              -- this rank's micro-batches' targets
--   for i = 1, 3 do gl:scale(model(x[i], y[i]), i):backward() end
--   gl:mean(sum of the scaled losses' values)              -- the global batch's loss
-- Counting is done on the device; the counts of all micro-batches go in one all-reduce.
local tensor = require("shard.tensor")
local ops = require("shard.ops")

local GlobalLoss = {}
GlobalLoss.__index = GlobalLoss

-- Valid target tokens of targets (a tensor of ids) as a 0-dim i64 tensor.
local function count_tensor(targets, ignore_index)
  local eq = ops.raw.eq(targets, ignore_index)
  local ignored = ops.reduce(ops.REDUCE.sum, eq)
  eq:free()
  local n = targets:numel() - ignored:item()
  ignored:free()
  return n
end

-- targets: this rank's micro-batches' target tensors (the same order as scale's i).
-- opts.ignore_index (default -1, what nn.GPT ignores); opts.group, the data-parallel group
-- whose average FSDP takes (default: the world).
local function global_loss(targets, opts)
  opts = opts or {}
  if type(targets) ~= "table" or tensor.is_tensor(targets) or #targets == 0 then
    error("nn.global_loss: expected a list of this rank's micro-batch target tensors, got " ..
          (tensor.is_tensor(targets) and "one tensor (wrap it in { })" or type(targets)), 2)
  end
  local ignore = opts.ignore_index or -1
  local group = opts.group or require("shard.comm").world()
  local self = setmetatable({ ignore_index = ignore, group = group, ranks = group:size(), counts = {} }, GlobalLoss)
  local mine = 0
  for i, t in ipairs(targets) do
    if not tensor.is_tensor(t) then
      error(("nn.global_loss: micro-batch %d's targets are a %s, not a tensor"):format(i, type(t)), 2)
    end
    self.counts[i] = count_tensor(t, ignore)
    mine = mine + self.counts[i]
  end
  local total = tensor.tensor({ mine }, { dtype = "f64" })
  group:all_reduce(total, "sum")
  self.local_tokens, self.tokens = mine, total:get({ 1 })
  total:free()
  return self
end

-- Micro-batch i's share of the global batch's mean: n_i * R / N (0 when no rank has a valid token).
function GlobalLoss:factor(i)
  local n = self.counts[i]
  if n == nil then
    error(("nn.global_loss: micro-batch %s: micro-batch index out of range 1..%d"):format(tostring(i), #self.counts), 3)
  end
  return self.tokens > 0 and n * self.ranks / self.tokens or 0
end

-- Micro-batch i's mean loss scaled to its share of the global batch's mean (a new tensor).
function GlobalLoss:scale(loss, i) return loss * self:factor(i) end

-- The global batch's mean loss from this rank's sum of scaled loss values (one all-reduce).
function GlobalLoss:mean(local_sum)
  local t = tensor.tensor({ local_sum }, { dtype = "f64" })
  self.group:all_reduce(t, "sum")
  local v = t:get({ 1 }) / self.ranks
  t:free()
  return v
end

return { global_loss = global_loss, GlobalLoss = GlobalLoss }
