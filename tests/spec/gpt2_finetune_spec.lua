-- recipes/gpt2_finetune.lua end to end, small: a random GPT-2 with the tiny BPE's vocabulary
-- (tests/fixtures/make_gpt2_bpe_model.lua), a text prepared in parallel, training at world 1
-- and 2 (full_shard), a checkpoint written and resumed at another world size, the prepared
-- folder as --data, and a decoded sample.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local run, losses, quote = support.shard, support.recipe_losses, support.quote

local TEXT = "/usr/share/common-licenses/GPL-3"
local BASE = os.tmpname()
os.remove(BASE)
local MODEL = BASE .. "_model"
local ARGS = " --init_from=" .. MODEL .. " --block_size=32 --batch_size=4 --lr=2e-3 --warmup=0 --eval_interval=4"
  .. " --eval_iters=2 --log_interval=1 --sample_tokens=24 --prepare_workers=2"

local function finite(xs)
  for _, x in ipairs(xs) do if x ~= x or x == math.huge or x == -math.huge then return false end end
  return #xs > 0
end

describe("gpt2_finetune recipe", function()
  local made, made_rc = run("run tests/fixtures/make_gpt2_bpe_model.lua " .. quote(MODEL))
  local one, rc1 = run("run recipes/gpt2_finetune.lua --data=" .. TEXT .. " --out_dir=" .. BASE .. "_1 --max_iters=8"
    .. " --save_interval=4" .. ARGS)

  it("prepares the text, trains, saves and samples in one process", function()
    assert.equal(0, made_rc, made)
    assert.equal(0, rc1, one)
    assert.is_truthy(one:find("data: " .. TEXT:gsub("%p", "%%%0") .. " %-> .-: %d+ train / %d+ val tokens %(uint16%), %d+ pieces on 2 workers"), one)
    local all, train = losses(one)
    assert.is_true(finite(all), one)
    assert.is_true(train[#train] < train[1], ("train loss did not fall: %s\n%s"):format(table.concat(train, " "), one))
    assert.is_truthy(io.open(BASE .. "_1/ckpt/step-8/index.json"), "no checkpoint at step 8")
    local sample = one:match("%-%-%-%- sample %-%-%-%-\n(.-)\nmetrics ")
    assert.is_truthy(sample, one)
    assert.is_truthy(sample:find("^<|endoftext|>"), sample)   -- the default prompt, decoded
    assert.is_true(#sample > #"<|endoftext|>", sample)
  end)

  it("gives the same losses under launch --nproc 2 --strategy=full_shard", function()
    local out, rc = run("launch --nproc 2 recipes/gpt2_finetune.lua --strategy=full_shard --data=" .. TEXT
      .. " --out_dir=" .. BASE .. "_2 --max_iters=8" .. ARGS)
    assert.equal(0, rc, out)
    local a, b = losses(one), losses(out)
    assert.equal(#a, #b, out)
    for i = 1, #a do assert.is_true(math.abs(a[i] - b[i]) <= 2e-4, ("value %d: %.4f vs %.4f\n%s"):format(i, a[i], b[i], out)) end
  end)

  it("resumes the checkpoint at world 2 from the prepared folder, with a prompt", function()
    local out, rc = run("launch --nproc 2 recipes/gpt2_finetune.lua --strategy=full_shard --resume --max_iters=12"
      .. " --data=" .. BASE .. "_1/data/GPL-3 --out_dir=" .. BASE .. "_1 --prompt='The licensee'" .. ARGS)
    assert.equal(0, rc, out)
    assert.is_truthy(out:find("resumed from " .. BASE .. "_1/ckpt/step%-8 at step 8"), out)
    assert.is_falsy(out:find("data: "), out)   -- nothing prepared: the folder was given
    assert.is_truthy(out:find("iter 11 | loss"), out)
    assert.is_truthy(out:find("%-%-%-%- sample %-%-%-%-\nThe licensee"), out)
  end)

  it("names a missing model, an oversized block and a tokenizer that does not fit", function()
    local out, rc = run("run recipes/gpt2_finetune.lua --data=" .. TEXT .. " --out_dir=" .. BASE .. "_3 --max_iters=1")
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("--init_from=DIR", 1, true), out)
    out, rc = run("run recipes/gpt2_finetune.lua --data=" .. TEXT .. " --init_from=" .. BASE .. "_none --max_iters=1")
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("--init_from=" .. BASE .. "_none: no config.json there", 1, true), out)
    out, rc = run("run recipes/gpt2_finetune.lua --data=" .. TEXT .. " --out_dir=" .. BASE .. "_3" .. ARGS .. " --block_size=65")
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("--block_size=65: " .. MODEL .. " has 64 positions", 1, true), out)
    out, rc = run("run recipes/gpt2_finetune.lua --data=" .. BASE .. "_1/data/GPL-3 --out_dir=" .. BASE .. "_3" .. ARGS
      .. " --tokenizer=tests/fixtures/tokenizer/llama3")
    assert.are_not.equal(0, rc)
    assert.is_truthy(out:find("vocabulary of 657", 1, true), out)
  end)
end)
