-- shard.tools.repl.merge: what N ranks printed for one chunk, as one text, each line labelled with
-- the ranks that printed it:
--   [0-3] 42                    every rank printed 42
--   [0,2] even  /  [1,3] odd
--   [1] error: stdin:1: boom    rank 1 raised an error
-- Ranks whose outputs have as many lines are merged line by line, so that a table that
-- differs in one field shows that field per rank and the rest once:
--   [0-1] {
--   [0]     rank = 0,
--   [1]     rank = 1,
--   [0-1]   shard_numel = 400
--   [0-1] }
-- Other outputs are shown whole per group of ranks that printed the same. Groups come in the
-- order of their lowest rank; a rank that printed nothing shows nothing; errors come last.
local M = {}

-- "0-3", "0,2", "0-1,3" for a sorted list of ranks.
function M.label(ranks)
  local parts, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and ranks[i] .. "-" .. ranks[j] or tostring(ranks[i])
    i = j + 1
  end
  return table.concat(parts, ",")
end

local function lines_of(text)
  local lines = {}
  for line in (text:sub(-1) == "\n" and text or text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  return lines
end

-- Groups the ranks of list by key(rank); the groups in the order of their lowest rank, each
-- { key =, ranks = { ... } }.
local function group(list, key)
  local by, order = {}, {}
  for _, r in ipairs(list) do
    local k = key(r)
    if not by[k] then by[k] = { key = k, ranks = {} }; order[#order + 1] = by[k] end
    table.insert(by[k].ranks, r)
  end
  return order
end

-- Adds { label, line } entries for lines to parts.
local function labelled(parts, lines, label)
  for _, line in ipairs(lines) do parts[#parts + 1] = { "[" .. label .. "]", line } end
  return parts
end

-- The entries as text, the labels padded to one width so that the lines align.
local function text(parts, width)
  local out = {}
  for i, p in ipairs(parts) do out[i] = p[1] .. (" "):rep(width - #p[1] + 1) .. p[2] .. "\n" end
  return table.concat(out)
end

-- The labelled lines of the ranks in list (outs[r]: its lines), as entries.
local function outputs(list, outs)
  local n = #outs[list[1]]
  local same_length = true
  for _, r in ipairs(list) do same_length = same_length and #outs[r] == n end
  local parts = {}
  if same_length then
    for i = 1, n do
      for _, g in ipairs(group(list, function(r) return outs[r][i] end)) do
        labelled(parts, { g.key }, M.label(g.ranks))
      end
    end
  else
    for _, g in ipairs(group(list, function(r) return table.concat(outs[r], "\n") end)) do
      labelled(parts, outs[g.ranks[1]], M.label(g.ranks))
    end
  end
  return parts
end

-- replies[r] = { output = text, error = message or nil } for the ranks r that answered (0 to
-- world - 1). Returns the pieces to print in order: { { text =, error = true|nil }, ... }.
function M.merge(replies, world)
  local printed, failed, outs = {}, {}, {}
  for r = 0, world - 1 do
    local rep = replies[r]
    if rep and rep.output ~= "" then printed[#printed + 1] = r; outs[r] = lines_of(rep.output) end
    if rep and rep.error then failed[#failed + 1] = r end
  end
  local out = #printed > 0 and outputs(printed, outs) or {}
  local errs = {}
  for _, g in ipairs(group(failed, function(r) return replies[r].error end)) do
    labelled(errs, lines_of("error: " .. g.key), M.label(g.ranks))
  end
  local width = 0
  for _, p in ipairs(out) do width = math.max(width, #p[1]) end
  for _, p in ipairs(errs) do width = math.max(width, #p[1]) end
  local pieces = {}
  if #out > 0 then pieces[1] = { text = text(out, width) } end
  if #errs > 0 then pieces[#pieces + 1] = { text = text(errs, width), error = true } end
  return pieces
end

return M
