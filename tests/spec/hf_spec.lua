-- Hugging Face GPT-2 import/export against tests/fixtures/hf_gpt2_tiny (written by
-- tests/fixtures/make_hf_gpt2_fixture.py: GPT-2 by hand in PyTorch 1.13, saved in the layout
-- transformers' GPT2LMHeadModel uses, with float64 reference logits and loss).
local shard = require("shard")
local S = require("shard.io.safetensors")
local json = require("cjson")
local hf = require("shard.io.hf")
local nn = shard.nn

local FIXTURE = "tests/fixtures/hf_gpt2_tiny"
local TMP = os.getenv("SHARD_TEST_TMP") or "/tmp"
local function is_buffer(name) return name:match("^transformer%.h%.%d+%.attn%.bias$") or name:match("masked_bias$") end

local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end
local function write(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end

local n_dirs = 0
local function fresh_dir()
  n_dirs = n_dirs + 1
  local d = ("%s/shard_hf_spec_%d_%d"):format(TMP, os.time() % 100000, n_dirs)
  os.execute("rm -rf '" .. d .. "' && mkdir -p '" .. d .. "'")
  return d
end

-- A copy of the fixture with its tensors passed through edit(dict) (which may rename, drop
-- or add) and its config through edit_config(cfg).
local function variant(edit, edit_config)
  local d = fresh_dir()
  local dict = S.load(FIXTURE .. "/model.safetensors")
  if edit then edit(dict) end
  S.save(d .. "/model.safetensors", dict)
  local cfg = json.decode(read(FIXTURE .. "/config.json"))
  if edit_config then edit_config(cfg) end
  write(d .. "/config.json", json.encode(cfg))
  return d
end

local function flat_params(model)
  local out = {}
  for _, np in ipairs(model:named_parameters()) do out[np.name] = np.tensor:tolist_flat() end
  return out
end

local function assert_same_params(a, b)
  local pa, pb = flat_params(a), flat_params(b)
  for name, v in pairs(pa) do
    assert(pb[name], name)
    for i = 1, #v do
      if v[i] ~= pb[name][i] then error(("%s[%d]: %.9g vs %.9g"):format(name, i, v[i], pb[name][i])) end
    end
  end
end

local function errmsg(fn)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error")
  return tostring(err)
end

local function has(s, part)
  if not s:find(part, 1, true) then error(("expected the message to contain %q; got:\n%s"):format(part, s), 2) end
end

local ref = S.load(FIXTURE .. "/reference.safetensors")

describe("Hugging Face GPT-2 import", function()
  it("from_pretrained gives PyTorch's logits and loss", function()
    local model = nn.GPT.from_pretrained(FIXTURE)
    assert.same({ 2, 2, 16, 64, 32 }, { model.config.n_layer, model.config.n_head, model.config.n_embd,
                                        model.config.vocab_size, model.config.block_size })
    local logits = shard.no_grad(function() return model:logits(ref.input_ids) end)
    assert.same(ref.logits:shape(), logits:shape())
    local got, want = logits:tolist_flat(), ref.logits:tolist_flat()
    for i = 1, #want do
      -- f32 arithmetic alone moves these logits by ~3e-6 (the generator prints it)
      if math.abs(got[i] - want[i]) > 1e-5 * math.max(math.abs(want[i]), 1) then
        error(("logit %d: %.9g, PyTorch (f64) %.9g"):format(i, got[i], want[i]))
      end
    end
    local loss = shard.no_grad(function() return model(ref.input_ids, ref.targets):item() end)
    assert.near(ref.loss:item(), loss, 1e-5 * ref.loss:item())
  end)

  it("reads the .safetensors path as well as the directory", function()
    assert_same_params(nn.GPT.from_pretrained(FIXTURE),
                       nn.GPT.from_pretrained(FIXTURE .. "/model.safetensors"))
  end)

  it("takes keys without the transformer. prefix, and without the buffers", function()
    local d = variant(function(dict)
      for name, t in pairs(dict) do
        dict[name] = nil
        if not is_buffer(name) or name:match("h%.1%.") then dict[name:gsub("^transformer%.", "")] = t end
      end
    end)
    assert_same_params(nn.GPT.from_pretrained(FIXTURE), nn.GPT.from_pretrained(d))
  end)

  it("converts a half-precision file (bf16) to the model's f32", function()
    local d = variant(function(dict)
      for name, t in pairs(dict) do if t:dtype() == "f32" and t:dim() > 0 then dict[name] = t:to("bf16") end end
    end)
    local model = nn.GPT.from_pretrained(d)
    local want = S.load(FIXTURE .. "/model.safetensors")
    local w = want["transformer.h.1.mlp.c_fc.weight"]:to("bf16"):to("f32"):transpose(1, 2):contiguous()
    local got = nil
    for _, np in ipairs(model:named_parameters()) do
      if np.name == "transformer.h.1.mlp.c_fc.weight" then got = np.tensor end
    end
    assert.equal("f32", got:dtype())
    assert.same(w:tolist_flat(), got:tolist_flat())
  end)

  it("takes an lm_head.weight equal to wte, and refuses an untied one", function()
    local d = variant(function(dict) dict["lm_head.weight"] = dict["transformer.wte.weight"]:clone() end)
    assert_same_params(nn.GPT.from_pretrained(FIXTURE), nn.GPT.from_pretrained(d))
    d = variant(function(dict)
      local lm = dict["transformer.wte.weight"]:clone()
      lm:set({ 3, 5 }, 0.25)
      dict["lm_head.weight"] = lm
    end, function(cfg) cfg.tie_word_embeddings = false end)
    local e = errmsg(function() nn.GPT.from_pretrained(d) end)
    has(e, "'lm_head.weight' differs from 'transformer.wte.weight' (element 37")
    has(e, "ties lm_head to wte")
    d = variant(nil, function(cfg) cfg.tie_word_embeddings = false end)
    has(errmsg(function() nn.GPT.from_pretrained(d) end), "tie_word_embeddings false but the file has no lm_head.weight")
  end)

  it("names missing, extra and mis-shaped tensors, and copies nothing then", function()
    local d = variant(function(dict)
      dict["transformer.h.1.mlp.c_fc.bias"] = nil
      dict["transformer.h.0.attn.q_proj.weight"] = shard.zeros({ 16, 16 })
      -- stored [out, in] as nn.Linear would, not Conv1D's [in, out]
      local w = dict["transformer.h.0.attn.c_attn.weight"]
      dict["transformer.h.0.attn.c_attn.weight"] = w:transpose(1, 2):contiguous()
    end)
    local model = nn.GPT.from_pretrained(FIXTURE)
    local before = flat_params(model)
    local e = errmsg(function() hf.load_into(model, d) end)
    has(e, d .. "/model.safetensors does not fit the model")
    has(e, "missing tensors: transformer.h.1.mlp.c_fc.bias")
    has(e, "tensors the model does not have: transformer.h.0.attn.q_proj.weight")
    has(e, "'transformer.h.0.attn.c_attn.weight' is 48x16 in the file but the model needs 16x48 (Conv1D [in, out]; the model holds it as 48x16)")
    local after = flat_params(model)
    for name, v in pairs(before) do assert.same(v, after[name], name) end
  end)

  it("refuses a config the model does not match, or GPT-2 variants it cannot compute", function()
    local model = nn.GPT{ n_layer = 2, n_head = 4, n_embd = 16, vocab_size = 64, block_size = 32 }
    has(errmsg(function() hf.load_into(model, FIXTURE) end), "config.json says n_head 2 but the model has n_head 4")
    local d = variant(nil, function(cfg) cfg.activation_function = "relu" end)
    has(errmsg(function() nn.GPT.from_pretrained(d) end), "activation_function is 'relu'")
    d = variant(nil, function(cfg) cfg.n_inner = 32 end)
    has(errmsg(function() nn.GPT.from_pretrained(d) end), "n_inner is 32, not 4 * n_embd = 64")
    has(errmsg(function() nn.GPT.from_pretrained(TMP .. "/shard_hf_no_such_dir") end), "no weights file")
    d = fresh_dir()
    os.execute("cp " .. FIXTURE .. "/model.safetensors " .. d)
    has(errmsg(function() nn.GPT.from_pretrained(d) end), "no " .. d .. "/config.json")
  end)

  it("loads the sharded layout (model.safetensors.index.json) as save_pretrained writes it", function()
    local d = fresh_dir()
    local dict = S.load(FIXTURE .. "/model.safetensors")
    local names = {}
    for name in pairs(dict) do names[#names + 1] = name end
    table.sort(names)
    local parts, map = { {}, {} }, {}
    for i, name in ipairs(names) do
      local f = ("model-%05d-of-00002.safetensors"):format(i % 2 + 1)
      parts[i % 2 + 1][name] = dict[name]
      map[name] = f
    end
    for k = 1, 2 do S.save(("%s/model-%05d-of-00002.safetensors"):format(d, k), parts[k]) end
    write(d .. "/model.safetensors.index.json", json.encode({ metadata = { total_size = 0 }, weight_map = map }))
    write(d .. "/config.json", read(FIXTURE .. "/config.json"))
    assert_same_params(nn.GPT.from_pretrained(FIXTURE), nn.GPT.from_pretrained(d))
    -- an index and its shards that disagree are refused, naming both
    map[names[2]] = "model-00002-of-00002.safetensors"    -- names[2] is in model-00001
    write(d .. "/model.safetensors.index.json", json.encode({ weight_map = map }))
    assert.matches("maps it to model-00002-of-00002.safetensors", errmsg(function() nn.GPT.from_pretrained(d) end), 1, true)
  end)

  it("uses config.json's layer_norm_epsilon and keeps opts.dropout", function()
    local d = variant(nil, function(cfg) cfg.layer_norm_epsilon = 1e-3 end)
    local model = nn.GPT.from_pretrained(d, { dropout = 0.1 })
    assert.equal(0.1, model.config.dropout)
    assert.equal(1e-3, model.transformer.ln_f.eps)
    assert.equal(1e-3, model.transformer.h._children[2].module.ln_2.eps)
  end)
end)

describe("Hugging Face GPT-2 export", function()
  it("writes the fixture's layout: GPT2LMHeadModel keys, Conv1D shapes, f32, no lm_head", function()
    local d = fresh_dir() .. "/out"
    shard.export_hf(nn.GPT.from_pretrained(FIXTURE), d)
    local got, meta = S.load(d .. "/model.safetensors")
    local want = S.load(FIXTURE .. "/model.safetensors")
    assert.equal("pt", meta.format)   -- transformers' safetensors loader checks this
    -- save_pretrained writes no attn.bias / masked_bias (non-persistent buffers since
    -- transformers 4.31) and no lm_head (tied): everything else, name for name
    for name, t in pairs(want) do
      if not is_buffer(name) then
        local g = got[name]
        assert(g, "export lacks " .. name)
        assert.equal("f32", g:dtype(), name)
        assert.same(t:shape(), g:shape(), name)
        assert.same(t:tolist_flat(), g:tolist_flat(), name)   -- bitwise: the transposes undo
      end
    end
    for name in pairs(got) do assert(want[name] and not is_buffer(name), "unexpected " .. name) end
    local cfg = json.decode(read(d .. "/config.json"))
    assert.equal("gpt2", cfg.model_type)
    assert.same({ "GPT2LMHeadModel" }, cfg.architectures)
    assert.same({ 2, 2, 16, 64, 32, 32 }, { cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.n_positions, cfg.n_ctx })
    assert.equal("gelu_new", cfg.activation_function)
    assert.equal(1e-5, cfg.layer_norm_epsilon)
    assert.is_true(cfg.tie_word_embeddings)
  end)

  it("round-trips a trained-from-scratch model bitwise through export_hf and from_pretrained", function()
    shard.manual_seed(3)
    local a = nn.GPT{ n_layer = 3, n_head = 2, n_embd = 8, vocab_size = 13, block_size = 6 }
    local d = fresh_dir() .. "/rt"
    shard.export_hf(a, d)
    local b = nn.GPT.from_pretrained(d)
    assert.same({ 3, 2, 8, 13, 6 }, { b.config.n_layer, b.config.n_head, b.config.n_embd, b.config.vocab_size, b.config.block_size })
    assert_same_params(a, b)
    -- exporting the import gives the same bytes
    shard.export_hf(b, d .. "2")
    assert.equal(read(d .. "/model.safetensors"), read(d .. "2/model.safetensors"))
  end)

  it("writes GPT-2's token ids only where the vocabulary holds them", function()
    shard.manual_seed(5)
    local small = nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 13, block_size = 4 }
    local d = fresh_dir() .. "/ids"
    shard.export_hf(small, d)
    local cfg = json.decode(read(d .. "/config.json"))
    assert.equal(json.null, cfg.bos_token_id)
    assert.equal(json.null, cfg.eos_token_id)
    local big = hf.config_to_hf({ n_layer = 1, n_head = 1, n_embd = 8, vocab_size = 50257, block_size = 4 })
    assert.same({ 50256, 50256 }, { big.bos_token_id, big.eos_token_id })
    local kept = hf.config_to_hf({ n_layer = 1, n_head = 1, n_embd = 8, vocab_size = 13, block_size = 4 }, { eos_token_id = 12 })
    assert.equal(12, kept.eos_token_id)
  end)

  it("writes zero biases for a bias-free model", function()
    shard.manual_seed(4)
    local a = nn.GPT{ n_layer = 1, n_head = 2, n_embd = 8, vocab_size = 7, block_size = 4, bias = false }
    local d = fresh_dir() .. "/nobias"
    shard.export_hf(a, d)
    local got = S.load(d .. "/model.safetensors")
    assert.same({ 0, 0, 0, 0, 0, 0, 0, 0 }, got["transformer.ln_f.bias"]:tolist_flat())
    assert.same(24, #got["transformer.h.0.attn.c_attn.bias"]:tolist_flat())
    local b = nn.GPT.from_pretrained(d)
    for _, np in ipairs(a:named_parameters()) do
      local mine = b:named_parameters()
      for _, q in ipairs(mine) do if q.name == np.name then assert.same(np.tensor:tolist_flat(), q.tensor:tolist_flat()) end end
    end
  end)

  it("replaces the weights in an existing directory and keeps its other files", function()
    local d = fresh_dir()
    write(d .. "/tokenizer.json", "{}")
    write(d .. "/model.safetensors", "old")
    shard.export_hf(nn.GPT.from_pretrained(FIXTURE), d)
    assert.equal("{}", read(d .. "/tokenizer.json"))
    assert_same_params(nn.GPT.from_pretrained(FIXTURE), nn.GPT.from_pretrained(d))
    local p = io.popen("ls '" .. d .. "'")
    local listing = p:read("*a")
    p:close()
    assert.equal("config.json\nmodel.safetensors\ntokenizer.json\n", listing)
  end)
end)
