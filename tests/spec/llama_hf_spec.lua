-- nn.Llama.from_pretrained against tests/fixtures/hf_llama_tiny (written by
-- tests/fixtures/make_llama_fixture.py: a Llama by hand in PyTorch 1.13, saved as
-- LlamaForCausalLM lays it out, in two shards with model.safetensors.index.json, and the
-- logits of a batch).
local shard = require("shard")
local S = require("shard.io.safetensors")
local json = require("cjson")
local nn = shard.nn

local FIXTURE = "tests/fixtures/hf_llama_tiny"
local TMP = os.getenv("SHARD_TEST_TMP") or "/tmp"

local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end
local function write(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end

local n_dirs = 0
local function fresh_dir()
  n_dirs = n_dirs + 1
  local d = ("%s/shard_llama_hf_spec_%d_%d"):format(TMP, os.time() % 100000, n_dirs)
  os.execute("rm -rf '" .. d .. "' && mkdir -p '" .. d .. "'")
  return d
end

-- Every fixture tensor in one dict (both shards).
local function all_tensors()
  local dict = {}
  for _, f in ipairs { "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" } do
    for k, v in pairs(S.load(FIXTURE .. "/" .. f)) do dict[k] = v end
  end
  return dict
end

-- A single-file copy of the fixture, tensors through edit(dict), config through edit_config.
local function variant(edit, edit_config)
  local d = fresh_dir()
  local dict = all_tensors()
  if edit then edit(dict) end
  S.save(d .. "/model.safetensors", dict)
  local cfg = json.decode(read(FIXTURE .. "/config.json"))
  if edit_config then edit_config(cfg) end
  write(d .. "/config.json", json.encode(cfg))
  return d
end

local function max_diff(a, b)
  local x, y = a:tolist_flat(), b:tolist_flat()
  assert.equal(#y, #x)
  local m = 0
  for i = 1, #x do m = math.max(m, math.abs(x[i] - y[i])) end
  return m
end

describe("nn.Llama.from_pretrained", function()
  local ref = S.load(FIXTURE .. "/reference.safetensors")

  it("loads the sharded Hugging Face layout and reproduces PyTorch's logits", function()
    local model = nn.Llama.from_pretrained(FIXTURE)
    assert.equal(2, model.config.n_kv_head)
    assert.equal(96, model.config.ffn_dim)
    local logits = shard.no_grad(function() return model:logits(ref.x) end)
    local err = max_diff(logits, ref.logits)
    assert.is_true(err <= 2e-5, "logits max error " .. err)
  end)

  it("loads the single-file layout the same way", function()
    local model = nn.Llama.from_pretrained(variant())
    local logits = shard.no_grad(function() return model:logits(ref.x) end)
    assert.is_true(max_diff(logits, ref.logits) <= 2e-5)
  end)

  it("ignores the rotary inv_freq buffers older files hold", function()
    local d = variant(function(dict) dict["model.layers.0.self_attn.rotary_emb.inv_freq"] = shard.zeros({ 4 }) end)
    assert.is_table(nn.Llama.from_pretrained(d))
  end)

  it("names missing, extra and misshapen tensors", function()
    local d = variant(function(dict)
      dict["model.layers.1.mlp.up_proj.weight"] = nil
      dict["model.layers.0.self_attn.k_proj.weight"] = shard.zeros({ 32, 32 })
      dict["model.extra.weight"] = shard.zeros({ 2 })
    end)
    local ok, err = pcall(nn.Llama.from_pretrained, d)
    assert.is_false(ok)
    assert.matches("missing tensors: model.layers.1.mlp.up_proj.weight", err, 1, true)
    assert.matches("'model.layers.0.self_attn.k_proj.weight' is 32x32 in the file but the model needs 16x32", err, 1, true)
    assert.matches("tensors the model does not have: model.extra.weight", err, 1, true)
  end)

  it("refuses configs it would compute differently", function()
    local d = variant(nil, function(c) c.rope_scaling = { type = "llama3", factor = 8 } end)
    assert.has_error(function() nn.Llama.from_pretrained(d) end,
      "hf: " .. d .. "/config.json: rope_scaling is set (only plain rotary embeddings are supported); shard's Llama cannot load it")
    d = variant(nil, function(c) c.hidden_act = "gelu" end)
    assert.has_error(function() nn.Llama.from_pretrained(d) end,
      "hf: " .. d .. "/config.json: hidden_act is 'gelu' (SwiGLU's silu only); shard's Llama cannot load it")
  end)

  it("reads rope_theta from the rope_parameters transformers 5 writes", function()
    local function no_theta(rp) return function(c) c.rope_theta = nil; c.rope_parameters = rp end end
    local model = nn.Llama.from_pretrained(variant(nil, no_theta({ rope_type = "default", rope_theta = 10000.0 })))
    assert.equal(10000, model.config.rope_theta)
    local logits = shard.no_grad(function() return model:logits(ref.x) end)
    assert.is_true(max_diff(logits, ref.logits) <= 2e-5)
    -- a theta other than the default is the one the model gets (it used to fall back to 10000)
    model = nn.Llama.from_pretrained(variant(nil, no_theta({ rope_type = "default", rope_theta = 500000.0 })))
    assert.equal(500000, model.config.rope_theta)
    local err = select(2, pcall(nn.Llama.from_pretrained, variant(nil, no_theta({ rope_type = "llama3", rope_theta = 1e4, factor = 8 }))))
    assert.matches("rope_parameters.rope_type is 'llama3'", err, 1, true)
    err = select(2, pcall(nn.Llama.from_pretrained, variant(nil, no_theta({ rope_type = "default", rope_theta = 1e4, partial_rotary_factor = 0.5 }))))
    assert.matches("rope_parameters.partial_rotary_factor is 0.5", err, 1, true)
    err = select(2, pcall(nn.Llama.from_pretrained, variant(nil, function(c) c.rope_parameters = { rope_theta = 20000 } end)))
    assert.matches("rope_theta 10000 and rope_parameters.rope_theta 20000 differ", err, 1, true)
  end)

  it("exports with shard.export_hf as LlamaForCausalLM lays it out, and loads back the same", function()
    local a = nn.Llama.from_pretrained(FIXTURE)
    local d = fresh_dir() .. "/out"
    shard.export_hf(a, d)
    local cfg = json.decode(read(d .. "/config.json"))
    assert.same({ "LlamaForCausalLM" }, cfg.architectures)
    assert.same({ "llama", 32, 96, 2, 4, 2, 8, 65, 16, 1e-5, 10000, false, "silu" },
      { cfg.model_type, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.max_position_embeddings, cfg.rms_norm_eps,
        cfg.rope_theta, cfg.tie_word_embeddings, cfg.hidden_act })
    assert.same({ rope_type = "default", rope_theta = 10000 }, cfg.rope_parameters)
    local got, want = S.load(d .. "/model.safetensors"), all_tensors()
    for name, t in pairs(want) do assert.same(t:tolist_flat(), got[name]:tolist_flat(), name) end
    for name in pairs(got) do assert.is_truthy(want[name], name) end
    local b = nn.Llama.from_pretrained(d)
    local logits = shard.no_grad(function() return b:logits(ref.x) end)
    assert.is_true(max_diff(logits, ref.logits) <= 2e-5)
    -- a tied head is embed_tokens alone in the file, tie_word_embeddings true
    shard.manual_seed(5)
    local tied = nn.Llama{ n_layer = 1, n_head = 2, dim = 8, ffn_dim = 12, vocab_size = 11, max_seq_len = 8,
                           tie_embeddings = true, rope_theta = 500000 }
    shard.export_hf(tied, d .. "2")
    cfg = json.decode(read(d .. "2/config.json"))
    assert.is_true(cfg.tie_word_embeddings)
    assert.is_nil(S.load(d .. "2/model.safetensors")["lm_head.weight"])
    local back = nn.Llama.from_pretrained(d .. "2")
    assert.is_true(back.config.tie_embeddings)
    assert.equal(500000, back.config.rope_theta)
  end)

  it("refuses an index that disagrees with its shards", function()
    local d = fresh_dir()
    os.execute(("cp %s/* '%s'"):format(FIXTURE, d))
    local index = json.decode(read(d .. "/model.safetensors.index.json"))
    index.weight_map["lm_head.weight"] = "model-00001-of-00002.safetensors"
    write(d .. "/model.safetensors.index.json", json.encode(index))
    local ok, err = pcall(nn.Llama.from_pretrained, d)
    assert.is_false(ok)
    assert.matches("hf: model-00002-of-00002.safetensors holds 'lm_head.weight' but " .. d
      .. "/model.safetensors.index.json maps it to model-00001-of-00002.safetensors", err, 1, true)
    index.weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    index.weight_map["model.extra.weight"] = "model-00001-of-00002.safetensors"
    write(d .. "/model.safetensors.index.json", json.encode(index))
    ok, err = pcall(nn.Llama.from_pretrained, d)
    assert.is_false(ok)
    assert.matches("maps 'model.extra.weight' to model-00001-of-00002.safetensors, which lacks it", err, 1, true)
  end)

  it("refuses a model of another size in load_llama_into", function()
    local model = nn.Llama { n_layer = 2, n_head = 4, n_kv_head = 4, dim = 32, ffn_dim = 96, vocab_size = 65,
                             max_seq_len = 16, norm_eps = 1e-5 }
    assert.has_error(function() require("shard.io.hf").load_llama_into(model, FIXTURE) end,
      "hf: " .. FIXTURE .. "/config.json says n_kv_head = 2 but the model has 4")
  end)
end)
