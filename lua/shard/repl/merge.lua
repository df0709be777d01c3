-- shard.repl.merge: what N ranks printed for one chunk, as one text. Ranks that printed the
-- same (output and error alike) are shown once, each line labelled with their ranks:
--   [0-3] 42                    every rank printed 42
--   [0,2] even  /  [1,3] odd
--   [1] error: stdin:1: boom    rank 1 raised an error
-- Groups come in the order of their lowest rank; a rank that printed nothing shows nothing.
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

local function prefix_lines(text, label)
  local out = {}
  for line in (text:sub(-1) == "\n" and text or text .. "\n"):gmatch("([^\n]*)\n") do
    out[#out + 1] = "[" .. label .. "] " .. line .. "\n"
  end
  return table.concat(out)
end

-- replies[r] = { output = text, error = message or nil } for the ranks r that answered (0 to
-- world - 1). Returns the pieces to print in order: { { text =, error = true|nil }, ... }.
function M.merge(replies, world)
  local groups, order = {}, {}
  for r = 0, world - 1 do
    local rep = replies[r]
    if rep and (rep.output ~= "" or rep.error) then
      local key = rep.output .. "\0" .. (rep.error or "")
      if not groups[key] then groups[key] = { ranks = {}, rep = rep }; order[#order + 1] = key end
      table.insert(groups[key].ranks, r)
    end
  end
  local pieces = {}
  for _, key in ipairs(order) do
    local g = groups[key]
    local label = M.label(g.ranks)
    if g.rep.output ~= "" then pieces[#pieces + 1] = { text = prefix_lines(g.rep.output, label) } end
    if g.rep.error then pieces[#pieces + 1] = { text = prefix_lines("error: " .. g.rep.error, label), error = true } end
  end
  return pieces
end

return M
