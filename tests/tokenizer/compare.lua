-- tests/tokenizer/compare.lua OUT: shard.tokenizer against the ids full_vocab.py wrote
-- (tiktoken's and tokenizers', full cl100k vocabulary, and GPT-2's own r50k); prints one line per file and reference,
-- the first difference where there is one, and ends with "N passed, N failed".
local T = require("shard.tokenizer")
local cjson = require("cjson")
local out = assert(arg[1], "usage: compare.lua OUT")
local f = assert(io.open(out .. "/expected.json", "rb"))
local expected = cjson.decode(f:read("*a"))
f:close()
local passed, failed = 0, 0
for _, name in ipairs(expected.names) do
  local tok = T.load(out .. "/" .. name)
  local got, ids_total = {}, 0
  for i, text in ipairs(expected.texts) do got[i] = tok:encode(text) ; ids_total = ids_total + #got[i] end
  for _, ref in ipairs { "tiktoken", "tokenizers" } do
    local want = expected[name .. "/" .. ref]
    if want then
      local bad
      for i, text in ipairs(expected.texts) do
        local g, w = got[i], want[i]
        for k = 1, math.max(#g, #w) do
          if g[k] ~= w[k] then
            bad = ("text %d (%d bytes), id %d: shard %s, %s %s; near %q"):format(i, #text, k, tostring(g[k]), ref,
              tostring(w[k]), select(2, pcall(tok.decode, tok, { unpack(w, math.max(1, k - 3), math.min(#w, k + 3)) })))
            break
          end
        end
        if not bad and tok:decode(g) ~= text then bad = ("text %d: decode(encode(x)) ~= x"):format(i) end
        if bad then break end
      end
      if bad then failed = failed + 1 else passed = passed + 1 end
      print(("%-4s %-14s vs %-10s %d texts, %d ids%s"):format(bad and "FAIL" or "ok", name, ref, #expected.texts, ids_total,
        bad and (": " .. bad) or ""))
    end
  end
end
print(("%d passed, %d failed"):format(passed, failed))
os.exit(failed == 0 and 0 or 1)
