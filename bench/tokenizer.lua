-- Tokenizer encode throughput, shard's side: bench/tokenizer.sh runs it beside tiktoken.
--   bin/shard run bench/tokenizer.lua TOKENIZER_DIR TEXT_FILE ROUNDS
-- Each round encodes the whole file once on one thread with a freshly loaded tokenizer (its word
-- cache empty: "cold") and once more with the same one ("warm"); prints MB/s (10^6 bytes) of
-- the best round and the spread over rounds, and the number of ids.
local T = require("shard.tokenizer")
local timer = require("shard.timer")
local dir, file, rounds = arg[1], arg[2], tonumber(arg[3] or 5)
local f = assert(io.open(file, "rb"))
local text = f:read("*a")
f:close()
local cold, warm, n = {}, {}, 0
for r = 1, rounds do
  local tok = T.load(dir)
  for _, times in ipairs { cold, warm } do
    local t0 = timer.now()
    local _, count = tok:encode_raw(text, { allowed_special = "none" })
    times[r] = timer.now() - t0
    n = count
  end
end
local function line(what, times)
  table.sort(times)
  local mb = #text / 1e6
  print(("shard     %-5s %7.2f MB/s best, %6.2f-%6.2f over %d rounds, %d ids, %.2f M tokens/s best"):format(what,
    mb / times[1], mb / times[#times], mb / times[1], #times, n, n / times[1] / 1e6))
end
line("cold", cold)
line("warm", warm)
