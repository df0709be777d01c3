-- Per-step throughput people compare (issue 19, item 8): the recipe's progress line carries
-- tokens/s, the model TFLOP/s per rank, MFU against the peak, the memory peak and the exposed
-- communication; the same figures go to the run's JSONL file. Checked against figures
-- computed here from the model's own parameter count and the formula in the recipe (6 FLOPs
-- per parameter per token plus attention's 12 * layers * width * context), not read back
-- from shard.train.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local cjson = require("cjson")
local shard = require("shard")
local TEXT = "/usr/share/common-licenses/GPL-3"
local L, H, C, T = 2, 2, 32, 16
local ARGS = (" --data=%s --n_layer=%d --n_head=%d --n_embd=%d --block_size=%d --batch_size=4"
  .. " --max_iters=4 --eval_interval=4 --eval_iters=1 --log_interval=1 --sample_tokens=0 --warmup=2"):format(TEXT, L, H, C, T)

local function records(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = cjson.decode(line) end
  return out
end

local function close(a, b, rel) return math.abs(a - b) <= rel * math.max(math.abs(a), math.abs(b)) end

-- A progress line's values, each checked against its kind's one format (shard.units):
-- ms to 1 decimal, tokens/s whole and thousands-separated, the learning rate in 3 significant
-- digits, TFLOP/s to 3 decimals, MFU a percentage to 1 decimal, MiB to 1 decimal.
local FORMATS = { loss = "^%d+%.%d%d%d%d$", ms_per_iter = "^%d+%.%d$", tokens_per_s = "^%d%d?%d?[,%d]*$",
                  lr = "^%d%.%d%de[-+]%d%d$", tflops = "^%d+%.%d%d%d$", mfu = "^%d+%.%d%%$",
                  peak_mib = "^%d+%.%d$", exposed_comm_ms = "^%d+%.%d$" }
local function progress_fields(line)
  local t = {}
  for field in (line .. " | "):gmatch("(.-) | ") do
    local key, value = field:match("^([%w_]+) (.*)$")
    if key ~= "iter" then
      assert.is_truthy(FORMATS[key], line)
      assert.is_truthy(value:match(FORMATS[key]), ("%s: %q in %s"):format(key, value, line))
      t[key] = tonumber((value:gsub("[,%%]", "")))
    end
  end
  for key in pairs(FORMATS) do assert.is_truthy(t[key], ("%s missing in %s"):format(key, line)) end
  return t
end

describe("the training loop's throughput figures", function()
  for _, world in ipairs { 1, 2 } do
    it(("at world %d: progress line and JSONL agree with FLOPs counted here"):format(world), function()
      local dir = "/tmp/shard_train_metrics_" .. world
      local cmd = world == 1 and "run recipes/gpt_shakespeare_char.lua" or "launch --nproc 2 recipes/gpt_shakespeare_char.lua --strategy=full_shard"
      local out, code = support.shard(("%s --out_dir=%s%s"):format(cmd, dir, ARGS))
      assert.equal(0, code, out)
      local recs = records(dir .. "/train.jsonl")
      local start = recs[1]
      assert.equal("start", start.event, out)
      -- the vocabulary is the corpus's characters: read it from the prepared data (data/CORPUS)
      local vocab = shard.data.load_meta(dir .. "/data/GPL-3/meta.lua").vocab_size
      local n = shard.nn.GPT{ n_layer = L, n_head = H, n_embd = C, block_size = T, vocab_size = vocab, bias = false }:num_params()
      assert.equal(n, start.n_params)
      assert.equal(6 * n + 12 * L * C * T, start.flops_per_token)
      assert.equal(4 * T, start.tokens_per_step)
      assert.is_true(start.peak_tflops > 0, out)
      local steps = 0
      for _, r in ipairs(recs) do
        if r.tokens_per_s then
          steps = steps + 1
          local per_rank = r.tokens_per_s * start.flops_per_token / world
          assert.is_true(close(r.tflops, per_rank / 1e12, 1e-9), cjson.encode(r))
          assert.is_true(close(r.mfu, r.tflops / start.peak_tflops, 1e-9), cjson.encode(r))
          assert.is_true(close(r.tokens_per_s, start.tokens_per_step / (r.ms_per_iter / 1000), 1e-9), cjson.encode(r))
          assert.is_true(r.peak_bytes > 0 and r.exposed_comm_ms >= 0, cjson.encode(r))
          if world == 1 then assert.equal(0, r.exposed_comm_ms) end
          -- the progress line shows the same step's figures, each kind in one format
          local line = out:match(("iter %d | loss [^\n]*"):format(r.iter))
          assert.is_truthy(line, out)
          local shown = progress_fields(line)
          assert.is_true(math.abs(shown.ms_per_iter - r.ms_per_iter) <= 0.05 + 1e-9, line)
          assert.is_true(math.abs(shown.tokens_per_s - r.tokens_per_s) <= 0.5 + 1e-9, line)
          assert.is_true(close(shown.lr, r.lr, 5e-3), line)
          assert.is_true(math.abs(shown.tflops - r.tflops) <= 5e-4 + 1e-12, line)
          assert.is_true(math.abs(shown.mfu - 100 * r.mfu) <= 0.05 + 1e-9, line)   -- a percentage
          assert.is_true(math.abs(shown.peak_mib - r.peak_bytes / 2 ^ 20) <= 0.05 + 1e-9, line)
          assert.is_true(math.abs(shown.exposed_comm_ms - r.exposed_comm_ms) <= 0.05 + 1e-9, line)
        end
      end
      assert.equal(4, steps, out)
      -- the metrics line: the median of the windows after the first (the first step alone)
      local rates = {}
      for _, r in ipairs(recs) do if r.tokens_per_s and r.iter > 0 then rates[#rates + 1] = r.tokens_per_s end end
      table.sort(rates)
      assert.equal(3, #rates, out)
      local metrics = cjson.decode((assert(out:match("metrics (%b{})"), out)))
      assert.is_true(close(metrics.tokens_per_s, rates[2], 1e-9),
                     ("metrics %s, windows after the first %s"):format(metrics.tokens_per_s, table.concat(rates, " ")))
    end)
  end

  -- Fewer steps than --log_interval (50): the last step's line is printed (it covers the steps
  -- after the first) and the metrics line's medians leave the first step out, as README says.
  it("prints the last step's progress line and leaves the first step out of short runs' medians", function()
    local dir = "/tmp/shard_train_metrics_short"
    local args = ARGS:gsub("%-%-max_iters=4", "--max_iters=5"):gsub(" %-%-log_interval=1", "")
    local out, code = support.shard(("run recipes/gpt_shakespeare_char.lua --out_dir=%s%s"):format(dir, args))
    assert.equal(0, code, out)
    local iters = {}
    for it in out:gmatch("iter (%d+) | loss ") do iters[#iters + 1] = tonumber(it) end
    assert.same({ 0, 4 }, iters)
    local last
    for _, r in ipairs(records(dir .. "/train.jsonl")) do if r.tokens_per_s then last = r end end
    assert.equal(4, last.iter)
    local metrics = cjson.decode((assert(out:match("metrics (%b{})"), out)))
    assert.is_true(close(metrics.tokens_per_s, last.tokens_per_s, 1e-9),
                   ("metrics %s, steps 1-4 %s"):format(metrics.tokens_per_s, last.tokens_per_s))
  end)
end)
