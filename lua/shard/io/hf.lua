-- shard.io.hf: Hugging Face GPT-2 checkpoints (a directory with config.json and
-- model.safetensors, or the sharded model.safetensors.index.json and its files, as
-- transformers' GPT2LMHeadModel writes and reads them) in and out of nn.GPT. make check-hf
-- (tests/hf/check.sh) checks both directions against transformers itself.
--
--   local model = nn.GPT.from_pretrained("gpt2-dir", { dropout = 0.1 })       -- plain
--   local model = nn.GPT.from_pretrained("gpt2-dir", { fsdp = { strategy = "full_shard" } })
--   hf.load_into(model, "gpt2-dir")          -- a model built (and maybe wrapped) already
--   shard.export_hf(model, "out-dir")        -- every rank calls it under FSDP; rank 0 writes
--
-- The two layouts differ in three ways, all handled here:
--   * names: the file's keys may carry the "transformer." prefix (GPT2LMHeadModel) or not
--     (GPT2Model, and the hub's original gpt2 files); shard's always do.
--   * Conv1D: HF's attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are [in, out]
--     (y = x @ W + b); nn.Linear's are [out, in], so they are transposed both ways.
--   * extras: the attn.bias / attn.masked_bias buffers (the causal mask) of older files are
--     ignored; lm_head.weight is tied to wte in shard's GPT, so a file may omit it or hold
--     an exact copy of wte, and an export omits it (as save_pretrained does for tied weights).
-- Everything (config, names, shapes, dtypes, the lm_head tie) is checked before anything is
-- copied, so a refused file leaves the model as it was.
--
-- Llama (nn.Llama.from_pretrained, M.load_llama_into): LlamaForCausalLM directories, with
-- model.safetensors or the sharded form (model.safetensors.index.json naming a file per
-- tensor); the rotary base is config.json's rope_theta or, as transformers 5 writes it,
-- rope_parameters.rope_theta. Names are HF's own (shard's Llama uses them), weights
-- [out, in] as nn.Linear, and q_proj/k_proj rows in HF's rotate_half order, which shard's
-- rope uses: nothing is renamed, transposed or permuted. The rotary_emb.inv_freq buffers of
-- older files are computed, not read. shard.export_hf writes an nn.Llama back out in the same
-- layout (model.safetensors, a tied head as embed_tokens alone, config.json for
-- LlamaForCausalLM). Under FSDP each rank reads just the byte range of its
-- slice (a Conv1D weight, whose slice is strided in the file, is read whole, one tensor at a
-- time).
local ffi = require("ffi")
local files = require("shard.files")
local tensor = require("shard.tensor")
local S = require("shard.io.safetensors")
local fsdp = require("shard.fsdp")
local json = require("cjson").new()     -- a private instance: its settings stay ours
local NULL = json.null
local V = tensor.views

local M = {}

local CONV1D = { ["attn.c_attn.weight"] = true, ["attn.c_proj.weight"] = true,
                 ["mlp.c_fc.weight"] = true, ["mlp.c_proj.weight"] = true }
local FLOATS = { f32 = true, f64 = true, f16 = true, bf16 = true }
-- GELU's tanh form, which GPT-2 uses under these names (shard's gelu is that form).
local TANH_GELU = { gelu_new = true, gelu_pytorch_tanh = true }

-- True when `name` (a shard or HF name) is a Conv1D weight, stored [in, out] by HF.
function M.is_conv1d(name)
  local tail = name:match("h%.%d+%.(.*)$")
  return tail ~= nil and CONV1D[tail] == true
end

-- The attention-mask buffers older GPT-2 files hold; they are not parameters.
local function is_buffer(name)
  return name:match("^h%.%d+%.attn%.bias$") ~= nil or name:match("^h%.%d+%.attn%.masked_bias$") ~= nil
end

---------------------------------------------------------------------------------------------
-- files and config

local exists = files.readable
-- A file or a directory.
local function present(path) return os.rename(path, path) ~= nil end

local function read_all(path)
  local s, err = files.read_file(path)
  if not s then error(("hf: cannot read %s: %s"):format(path, tostring(err)), 0) end
  return s
end

-- path: a checkpoint directory, or its .safetensors file (config.json beside it).
-- Returns the weights file (a directory's model.safetensors, else its sharded
-- model.safetensors.index.json) and the config.json path.
function M.resolve(path)
  if type(path) ~= "string" or path == "" then error("hf: expected a checkpoint directory or .safetensors file, got " .. tostring(path), 0) end
  local file, dir
  if path:match("%.safetensors$") then
    file = path
    dir = path:match("^(.*)/[^/]*$") or "."
  else
    dir = path:gsub("/+$", "")
    file = dir .. "/model.safetensors"
  end
  if not exists(file) and not path:match("%.safetensors$") and exists(dir .. "/model.safetensors.index.json") then
    file = dir .. "/model.safetensors.index.json"    -- the sharded form save_pretrained writes
  end
  if not exists(file) then
    local hint = ""
    if exists(dir .. "/pytorch_model.bin") then
      hint = " (it holds pytorch_model.bin; convert it to safetensors, e.g. with transformers' save_pretrained(safe_serialization=True))"
    end
    error(("hf: no weights file %s%s"):format(file, hint), 0)
  end
  return file, dir .. "/config.json"
end

-- Reads config.json into a table (the file's own fields; JSON null stays cjson.null, so an
-- export written from it keeps them).
function M.read_config(path)
  local ok, cfg = pcall(json.decode, read_all(path))
  if not ok then error(("hf: %s is not valid JSON: %s"):format(path, tostring(cfg)), 0) end
  if type(cfg) ~= "table" then error(("hf: %s does not hold a JSON object"):format(path), 0) end
  return cfg
end

-- A config.json table (raw) read for shard's `model` (GPT, Llama): its fields less the nulls;
-- need(k, default), field k (default when absent) as a positive whole number; refuse(what),
-- the error that the model cannot load it. A model_type other than `model_type` is refused.
local function config_fields(raw, where, model, model_type)
  local hc = {}
  for k, v in pairs(raw) do if v ~= NULL then hc[k] = v end end
  local function need(k, default)
    local v = hc[k] == nil and default or hc[k]
    if type(v) ~= "number" or v ~= math.floor(v) or v < 1 then
      error(("hf: %s: %s must be a positive whole number, got %s"):format(where, k, tostring(v)), 0)
    end
    return v
  end
  local function refuse(what) error(("hf: %s: %s; shard's %s cannot load it"):format(where, what, model), 0) end
  if hc.model_type ~= nil and hc.model_type ~= model_type then
    refuse(("model_type is '%s', not '%s'"):format(tostring(hc.model_type), model_type))
  end
  return hc, need, refuse
end

-- A Hugging Face GPT2Config table -> nn.GPT's config. Refuses what nn.GPT cannot compute
-- the same way (another activation, an MLP width other than 4 n_embd, unscaled attention...).
function M.config_from_hf(raw, where)
  where = where or "config.json"
  local hc, need, refuse = config_fields(raw, where, "GPT", "gpt2")
  local act = hc.activation_function or "gelu_new"
  if not TANH_GELU[act] then refuse(("activation_function is '%s' (only GPT-2's tanh GELU, gelu_new, is supported)"):format(tostring(act))) end
  local c = { n_layer = need("n_layer"), n_head = need("n_head"), n_embd = need("n_embd"),
              vocab_size = need("vocab_size"), block_size = need("n_positions"), bias = true }
  if c.n_embd % c.n_head ~= 0 then refuse(("n_embd %d is not a multiple of n_head %d"):format(c.n_embd, c.n_head)) end
  if hc.n_inner ~= nil and hc.n_inner ~= 4 * c.n_embd then refuse(("n_inner is %s, not 4 * n_embd = %d"):format(tostring(hc.n_inner), 4 * c.n_embd)) end
  if hc.scale_attn_weights == false then refuse("scale_attn_weights is false") end
  if hc.scale_attn_by_inverse_layer_idx == true then refuse("scale_attn_by_inverse_layer_idx is true") end
  if hc.add_cross_attention == true then refuse("add_cross_attention is true") end
  local eps = hc.layer_norm_epsilon or 1e-5
  if type(eps) ~= "number" or eps <= 0 then refuse("layer_norm_epsilon is " .. tostring(eps)) end
  c.layer_norm_epsilon = eps
  c.tie_word_embeddings = hc.tie_word_embeddings ~= false
  return c
end

-- nn.GPT's config -> GPT2Config fields for config.json. `base` (the config.json a model was
-- imported from, when there was one) keeps fields shard does not use, such as token ids.
function M.config_to_hf(c, base)
  local out = {}
  for k, v in pairs(base or {}) do out[k] = v end
  local defaults = {
    activation_function = "gelu_new", attn_pdrop = 0.0, bos_token_id = 50256, eos_token_id = 50256,
    initializer_range = 0.02, reorder_and_upcast_attn = false, scale_attn_by_inverse_layer_idx = false,
    scale_attn_weights = true, summary_activation = NULL, summary_first_dropout = 0.1,
    summary_proj_to_labels = true, summary_type = "cls_index", summary_use_proj = true, use_cache = true,
    embd_pdrop = c.dropout or 0, resid_pdrop = c.dropout or 0,
  }
  for k, v in pairs(defaults) do if out[k] == nil then out[k] = v end end
  -- GPT-2's <|endoftext|> (50256) is no id of a smaller vocabulary: null then, not a dangling id
  for _, k in ipairs { "bos_token_id", "eos_token_id" } do
    if base == nil or base[k] == nil then out[k] = c.vocab_size > 50256 and 50256 or NULL end
  end
  out.model_type = "gpt2"
  out.architectures = { "GPT2LMHeadModel" }
  out.activation_function = "gelu_new"
  out.n_layer, out.n_head, out.n_embd = c.n_layer, c.n_head, c.n_embd
  out.vocab_size, out.n_positions, out.n_ctx = c.vocab_size, c.block_size, c.block_size
  out.n_inner = NULL                                 -- null: 4 * n_embd
  out.layer_norm_epsilon = c.layer_norm_epsilon or 1e-5
  out.tie_word_embeddings = true
  out.torch_dtype = "float32"
  out.scale_attn_weights, out.scale_attn_by_inverse_layer_idx, out.add_cross_attention = true, false, nil
  return out
end

---------------------------------------------------------------------------------------------
-- reading: shard.io.safetensors' S.open validates the header up front, then each tensor (or
-- a range of its elements) is read on its own, so no rank ever holds the whole file

local function open_reader(file)
  local f = S.open(file)
  local r = { names = f:names() }
  function r.info(name) return f:info(name) end
  function r.full(name)
    local info = f:info(name)
    local t = tensor.empty(info.shape, { dtype = info.dtype, device = "cpu" })
    if t:numel() > 0 then f:read(name, t, 0, t:numel()) end
    return t
  end
  -- elements [first, first + count) of the flattened tensor, into a new CPU tensor
  function r.range(name, first, count)
    local t = tensor.empty({ count }, { dtype = f:info(name).dtype, device = "cpu" })
    if count > 0 then f:read(name, t, first, count) end
    return t
  end
  function r.close() f:close() end
  return r
end

-- open_reader's interface over the shards a model.safetensors.index.json names (below).
local open_sharded_reader
-- A reader over a weights file M.resolve gave: one safetensors file, or an index of shards.
local function open_weights(file)
  if file:match("%.index%.json$") then return open_sharded_reader(file:match("^(.*)/[^/]*$") or ".", file) end
  return open_reader(file)
end

local function dims(shape) return #shape == 0 and "a scalar" or table.concat(shape, "x") end
local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

---------------------------------------------------------------------------------------------
-- the model side

-- What a value is, in a few words: a module's class name, not its printed tree.
local function kind_of(v)
  local mt = type(v) == "table" and getmetatable(v)
  if mt and mt.__name then return "an nn." .. mt.__name end
  return "a " .. type(v)
end

local function check_gpt(model, who)
  local ok = type(model) == "table" and type(model.config) == "table" and model.transformer ~= nil
             and model.transformer.wte ~= nil and model.transformer.h ~= nil and model.lm_head ~= nil
  if not ok then error(who .. ": expected an nn.GPT (plain or FSDP-wrapped), got " .. kind_of(model), 0) end
end

-- The model's stored parameters as this rank holds them (shard.fsdp's local_slices: name,
-- tensor, shape, start, count, dtype, whole), in order.
local function model_params(model) return fsdp.local_slices(model) end

-- Sets every LayerNorm's epsilon (nn.GPT builds them with 1e-5, GPT-2's value).
local function set_layernorm_eps(model, eps)
  local LayerNorm = require("shard.nn.layers").LayerNorm
  model:apply(function(m) if getmetatable(m) == LayerNorm then m.eps = eps end end)
  model.config.layer_norm_epsilon = eps
end

---------------------------------------------------------------------------------------------
-- import

-- The file's name for shard name `name` given how the file spells names; Conv1D shapes.
local function file_shape(name, shape)
  if M.is_conv1d(name) then return { shape[2], shape[1] } end
  return shape
end

-- The first (1-based) element where a and b (same numel, freed here) differ, and both values.
local function first_difference(a, b)
  local fa, fb = a:to("f64"), b:to("f64")
  a:free(); b:free()
  local pa, pb = ffi.cast("const double*", fa:data_ptr()), ffi.cast("const double*", fb:data_ptr())
  local at
  for k = 0, fa:numel() - 1 do
    if pa[k] ~= pb[k] then at = k; break end
  end
  local r = at and { at + 1, pa[at], pb[at] } or {}
  fa:free(); fb:free()
  return r[1], r[2], r[3]
end

-- Checks file against model and returns the copy plan; raises an error listing every
-- problem (naming the file, the tensor, the shapes) otherwise.
local function plan(model, reader, file, hc)
  local problems = {}
  local function problem(s) problems[#problems + 1] = s end

  -- file names -> shard names ("transformer." added where missing)
  local by_shard, lm_head = {}, nil
  for _, fname in ipairs(reader.names) do
    local bare = fname:match("^transformer%.(.*)$")
    if fname == "lm_head.weight" then
      lm_head = fname
    elseif is_buffer(bare or fname) then
      -- the causal mask: computed, not loaded
    else
      local sname = bare and fname or ("transformer." .. fname)
      if by_shard[sname] then
        problem(("'%s' and '%s' name the same tensor"):format(by_shard[sname], fname))
      end
      by_shard[sname] = fname
    end
  end

  local params = model_params(model)
  local used, missing, steps = {}, {}, {}
  for _, p in ipairs(params) do
    local fname = by_shard[p.name]
    if not fname then
      missing[#missing + 1] = p.name
    else
      used[p.name] = true
      local info = reader.info(fname)
      local want = file_shape(p.name, p.shape)
      if not same_shape(info.shape, want) then
        local how = M.is_conv1d(p.name) and (" (Conv1D [in, out]; the model holds it as %s)"):format(dims(p.shape)) or ""
        problem(("'%s' is %s in the file but the model needs %s%s"):format(fname, dims(info.shape), dims(want), how))
      elseif not FLOATS[info.dtype] then
        problem(("'%s' has dtype %s; expected a float type (f32, f16, bf16, f64)"):format(fname, tostring(info.dtype)))
      else
        steps[#steps + 1] = { param = p, file_name = fname, dtype = info.dtype, transpose = M.is_conv1d(p.name) }
      end
    end
  end
  if #missing > 0 then problem("missing tensors: " .. table.concat(missing, ", ")) end
  local extra = {}
  for sname, fname in pairs(by_shard) do if not used[sname] then extra[#extra + 1] = fname end end
  table.sort(extra)
  if #extra > 0 then problem("tensors the model does not have: " .. table.concat(extra, ", ")) end

  -- lm_head: shard's GPT ties it to wte, so the file may only hold wte's values under it
  local wte_name = by_shard["transformer.wte.weight"]
  if lm_head then
    local li, wi = reader.info(lm_head), wte_name and reader.info(wte_name)
    if wi and not same_shape(li.shape, wi.shape) then
      problem(("'lm_head.weight' is %s but '%s' is %s: an untied lm_head, and shard's GPT ties lm_head to wte"):format(
        dims(li.shape), wte_name, dims(wi.shape)))
    elseif wi and #problems == 0 then
      local i, x, y = first_difference(reader.full(lm_head), reader.full(wte_name))
      if i then
        problem(("'lm_head.weight' differs from '%s' (element %d: %.9g vs %.9g): an untied lm_head, and shard's GPT ties lm_head to wte"):format(
          wte_name, i, x, y))
      end
    end
  elseif hc and hc.tie_word_embeddings == false then
    problem("config.json sets tie_word_embeddings false but the file has no lm_head.weight; shard's GPT ties lm_head to wte")
  end

  if #problems > 0 then
    error(("hf: %s does not fit the model:\n  %s"):format(file, table.concat(problems, "\n  ")), 0)
  end
  return steps
end

-- The file's value for a step as a full CPU tensor in the model's shape and `dtype`.
local function full_value(reader, step, dtype)
  local raw = reader.full(step.file_name)
  local v = raw
  if step.transpose then
    local tv = V.transpose(raw, 1, 2)
    v = V.contiguous(tv)
    tv:free()
  end
  if v:dtype() ~= dtype then
    local c = v:to{ dtype = dtype }
    if v ~= raw then v:free() end
    v = c
  end
  if v ~= raw then raw:free() end
  return v
end

-- Compares the model's config with config.json's (shapes alone miss n_head, epsilon...).
local function check_config(model, want, where)
  local have = model.config
  for _, k in ipairs { "n_layer", "n_head", "n_embd", "vocab_size", "block_size" } do
    if have[k] ~= want[k] then
      local hk = k == "block_size" and "n_positions" or k
      error(("hf: %s says %s %s but the model has %s %s"):format(where, hk, tostring(want[k]), k, tostring(have[k])), 0)
    end
  end
  if have.bias == false then error(("hf: %s is GPT-2 (with biases) but the model was built with bias = false"):format(where), 0) end
end

-- Copies the planned tensors from reader into the model's parameters; under FSDP each rank
-- writes its own slice (the call sites reshard afterwards).
local function copy_steps(reader, steps)
  for _, s in ipairs(steps) do
    local p = s.param
    if not p.whole and p.count > 0 and not s.transpose then
      -- just this rank's elements: a contiguous byte range of the file
      local part = reader.range(s.file_name, p.start, p.count)
      local view = p:view()
      view:copy_(part)
      view:free(); part:free()
    elseif p.whole or p.count > 0 then
      local v = full_value(reader, s, p.dtype)
      p:set(v)
      v:free()
    end
  end
end

-- Loads a Hugging Face GPT-2 checkpoint (directory or .safetensors file) into model, an
-- nn.GPT built already, plain or FSDP-wrapped. Under FSDP every rank copies only its slice.
-- Returns model.
function M.load_into(model, path)
  check_gpt(model, "hf.load_into")
  local file, config_path = M.resolve(path)
  local hc, cfg
  if exists(config_path) then
    hc = M.read_config(config_path)
    cfg = M.config_from_hf(hc, config_path)
    check_config(model, cfg, config_path)
  end
  local reader = open_weights(file)
  local ok, err = pcall(function() copy_steps(reader, plan(model, reader, file, hc)) end)
  reader.close()
  if not ok then error(err, 0) end
  fsdp.mark_stale(model)    -- the full parameters are stale now
  if cfg then
    set_layernorm_eps(model, cfg.layer_norm_epsilon)
    model.config.hf_config = hc
  end
  return model
end

-- The model class(cfg) for from_pretrained: plain, or, given fsdp.wrap's options, built
-- sharded (each rank initialises only its shard) with policy transformer{ block } unless
-- the options name one.
local function build(class, cfg, wrap_opts, block)
  if not wrap_opts then return class(cfg) end
  local wrap = {}
  for k, v in pairs(wrap_opts) do wrap[k] = v end
  wrap.policy = wrap.policy or fsdp.policy.transformer{ block }
  return fsdp.wrap(function() return class(cfg) end, wrap)
end

-- nn.GPT.from_pretrained: builds the model config.json describes and loads the weights.
-- opts: dropout (default 0), fsdp (fsdp.wrap's options: the model is built sharded, with
-- policy fsdp.policy.transformer{ nn.Block } unless given).
function M.from_pretrained(GPT, path, opts)
  opts = opts or {}
  local _, config_path = M.resolve(path)
  if not exists(config_path) then error(("hf: no %s beside the weights (GPT-2's sizes come from it)"):format(config_path), 0) end
  local hc = M.read_config(config_path)
  local c = M.config_from_hf(hc, config_path)
  local cfg = { n_layer = c.n_layer, n_head = c.n_head, n_embd = c.n_embd, vocab_size = c.vocab_size,
                block_size = c.block_size, bias = true, dropout = opts.dropout or 0 }
  return M.load_into(build(GPT, cfg, opts.fsdp, require("shard.nn.gpt").Block), path)
end

---------------------------------------------------------------------------------------------
-- Llama import

-- A Hugging Face LlamaConfig table -> nn.Llama's config. Refuses what nn.Llama cannot compute
-- the same way (another activation, rope scaling, biases, a head size other than dim / heads).
function M.llama_config_from_hf(raw, where)
  local hc, need, refuse = config_fields(raw, where, "Llama", "llama")
  local act = hc.hidden_act or "silu"
  if act ~= "silu" then refuse(("hidden_act is '%s' (SwiGLU's silu only)"):format(tostring(act))) end
  if hc.rope_scaling ~= nil then refuse("rope_scaling is set (only plain rotary embeddings are supported)") end
  -- transformers 5 writes rope_parameters { rope_type, rope_theta } in place of rope_theta
  local rp, rope_theta = hc.rope_parameters, nil
  if rp ~= nil then
    if type(rp) ~= "table" then refuse("rope_parameters is not an object") end
    local rtype = rp.rope_type or rp.type or "default"
    if rtype ~= "default" then refuse(("rope_parameters.rope_type is '%s' (only plain rotary embeddings, 'default', are supported)"):format(tostring(rtype))) end
    -- the default type reads rope_theta and partial_rotary_factor alone, as transformers does
    local prf = rp.partial_rotary_factor
    if prf ~= nil and prf ~= NULL and prf ~= 1 then
      refuse(("rope_parameters.partial_rotary_factor is %s (only 1 is supported)"):format(tostring(prf)))
    end
    if rp.rope_theta ~= NULL then rope_theta = rp.rope_theta end
    if rope_theta ~= nil and hc.rope_theta ~= nil and rope_theta ~= hc.rope_theta then
      refuse(("rope_theta %s and rope_parameters.rope_theta %s differ"):format(tostring(hc.rope_theta), tostring(rope_theta)))
    end
  end
  if hc.partial_rotary_factor ~= nil and hc.partial_rotary_factor ~= 1 then
    refuse(("partial_rotary_factor is %s (only 1 is supported)"):format(tostring(hc.partial_rotary_factor)))
  end
  if hc.attention_bias == true then refuse("attention_bias is true") end
  if hc.mlp_bias == true then refuse("mlp_bias is true") end
  local c = { n_layer = need("num_hidden_layers"), n_head = need("num_attention_heads"), dim = need("hidden_size"),
              ffn_dim = need("intermediate_size"), vocab_size = need("vocab_size"),
              max_seq_len = need("max_position_embeddings", 2048) }
  c.n_kv_head = need("num_key_value_heads", c.n_head)
  if hc.head_dim ~= nil and hc.head_dim * c.n_head ~= c.dim then
    refuse(("head_dim %s is not hidden_size / num_attention_heads = %s"):format(tostring(hc.head_dim), tostring(c.dim / c.n_head)))
  end
  c.rope_theta = hc.rope_theta or rope_theta or 10000
  c.norm_eps = hc.rms_norm_eps or 1e-6
  if type(c.rope_theta) ~= "number" or c.rope_theta <= 0 then refuse("rope_theta is " .. tostring(c.rope_theta)) end
  if type(c.norm_eps) ~= "number" or c.norm_eps <= 0 then refuse("rms_norm_eps is " .. tostring(c.norm_eps)) end
  c.tie_embeddings = hc.tie_word_embeddings == true
  return c
end

-- One reader (open_reader's interface) over the shards a model.safetensors.index.json names;
-- the index and the shards must agree tensor for tensor.
function open_sharded_reader(dir, index_path)
  local map = M.read_config(index_path).weight_map
  if type(map) ~= "table" then error(("hf: %s has no weight_map object"):format(index_path), 0) end
  local readers, owner, names = {}, {}, {}
  local ok, err = pcall(function()
    for name, fname in pairs(map) do
      if type(fname) ~= "string" or fname:find("/", 1, true) then
        error(("hf: %s maps '%s' to %s, not a file name in %s"):format(index_path, name, tostring(fname), dir), 0)
      end
      readers[fname] = readers[fname] or open_reader(dir .. "/" .. fname)
      owner[name] = readers[fname]
    end
    local files, held = {}, {}
    for fname in pairs(readers) do files[#files + 1] = fname end
    table.sort(files)   -- the first problem named is the same every run
    for _, fname in ipairs(files) do
      for _, n in ipairs(readers[fname].names) do
        held[n] = true
        if map[n] ~= fname then
          error(("hf: %s holds '%s' but %s maps it to %s"):format(fname, n, index_path, tostring(map[n])), 0)
        end
      end
    end
    for name, fname in pairs(map) do
      if not held[name] then error(("hf: %s maps '%s' to %s, which lacks it"):format(index_path, name, fname), 0) end
    end
  end)
  if not ok then
    for _, r in pairs(readers) do r.close() end
    error(err, 0)
  end
  for name in pairs(map) do names[#names + 1] = name end
  table.sort(names)
  return {
    names = names,
    info = function(name) return owner[name].info(name) end,
    full = function(name) return owner[name].full(name) end,
    range = function(name, first, count) return owner[name].range(name, first, count) end,
    close = function() for _, r in pairs(readers) do r.close() end end,
  }
end

-- A reader over a Llama directory's weights and what to call them in errors.
local function open_llama_weights(dir)
  local single, index = dir .. "/model.safetensors", dir .. "/model.safetensors.index.json"
  if exists(single) then return open_reader(single), single end
  if exists(index) then return open_sharded_reader(dir, index), index end
  error(("hf: %s holds neither model.safetensors nor model.safetensors.index.json"):format(dir), 0)
end

-- Checks the file's tensors against the Llama's parameters (same names, shapes, float dtypes)
-- and returns the copy plan; raises an error listing every problem otherwise.
local function plan_llama(model, reader, where)
  local problems, in_file, used, steps, missing = {}, {}, {}, {}, {}
  for _, n in ipairs(reader.names) do
    if not n:match("%.rotary_emb%.inv_freq$") then in_file[n] = true end
  end
  for _, p in ipairs(model_params(model)) do
    if not in_file[p.name] then
      missing[#missing + 1] = p.name
    else
      used[p.name] = true
      local info = reader.info(p.name)
      if not same_shape(info.shape, p.shape) then
        problems[#problems + 1] = ("'%s' is %s in the file but the model needs %s"):format(p.name, dims(info.shape), dims(p.shape))
      elseif not FLOATS[info.dtype] then
        problems[#problems + 1] = ("'%s' has dtype %s; expected a float type"):format(p.name, tostring(info.dtype))
      else
        steps[#steps + 1] = { param = p, file_name = p.name, dtype = info.dtype }
      end
    end
  end
  if #missing > 0 then problems[#problems + 1] = "missing tensors: " .. table.concat(missing, ", ") end
  local extra = {}
  for n in pairs(in_file) do
    -- a tied model's lm_head is embed_tokens: a file may hold a copy of it
    if not used[n] and not (n == "lm_head.weight" and model.config.tie_embeddings) then extra[#extra + 1] = n end
  end
  table.sort(extra)
  if #extra > 0 then problems[#problems + 1] = "tensors the model does not have: " .. table.concat(extra, ", ") end
  if #problems > 0 then error(("hf: %s does not fit the model:\n  %s"):format(where, table.concat(problems, "\n  ")), 0) end
  return steps
end

local LLAMA_KEYS = { "n_layer", "n_head", "n_kv_head", "dim", "ffn_dim", "vocab_size", "rope_theta", "norm_eps",
                     "tie_embeddings" }

-- Loads a Hugging Face Llama directory into model, an nn.Llama built already (plain or
-- FSDP-wrapped; under FSDP every rank copies only its slice). Returns model.
function M.load_llama_into(model, path)
  local ok_model = type(model) == "table" and type(model.config) == "table" and model.model ~= nil
                   and model.config.n_kv_head ~= nil
  if not ok_model then error("hf.load_llama_into: expected an nn.Llama (plain or FSDP-wrapped), got " .. kind_of(model), 0) end
  if type(path) ~= "string" or path == "" then error("hf: expected a Llama checkpoint directory, got " .. tostring(path), 0) end
  local dir = path:gsub("/+$", "")
  local config_path = dir .. "/config.json"
  if exists(config_path) then
    local want = M.llama_config_from_hf(M.read_config(config_path), config_path)
    for _, k in ipairs(LLAMA_KEYS) do
      if model.config[k] ~= want[k] then
        error(("hf: %s says %s = %s but the model has %s"):format(config_path, k, tostring(want[k]), tostring(model.config[k])), 0)
      end
    end
  end
  local reader, where = open_llama_weights(dir)
  local ok, err = pcall(function() copy_steps(reader, plan_llama(model, reader, where)) end)
  reader.close()
  if not ok then error(err, 0) end
  fsdp.mark_stale(model)    -- the full parameters are stale now
  if exists(config_path) then model.config.hf_config = M.read_config(config_path) end
  return model
end

-- nn.Llama.from_pretrained: builds the model config.json describes and loads the weights.
-- opts: fsdp (fsdp.wrap's options: built sharded, policy transformer{ nn.LlamaBlock } unless given).
function M.from_pretrained_llama(Llama, path, opts)
  opts = opts or {}
  if type(path) ~= "string" or path == "" then error("hf: expected a Llama checkpoint directory, got " .. tostring(path), 0) end
  local config_path = path:gsub("/+$", "") .. "/config.json"
  if not exists(config_path) then error(("hf: no %s (the Llama's sizes come from it)"):format(config_path), 0) end
  local cfg = M.llama_config_from_hf(M.read_config(config_path), config_path)
  return M.load_llama_into(build(Llama, cfg, opts.fsdp, require("shard.nn.llama").LlamaBlock), path)
end

---------------------------------------------------------------------------------------------
-- export

local function mkdir(path)
  local C = require("shard.ffi").C
  if C.sh_ckpt_mkdirs(path) ~= 0 then error("hf: cannot create directory " .. path .. ": " .. require("ffi").string(C.sh_last_error()), 0) end
end

-- A temporary name beside path that no other process uses: this process's pid and a count
-- (not math.random, which gives every process the same sequence).
pcall(ffi.cdef, "int getpid(void);")
local temps = 0
local function temp_name(path)
  temps = temps + 1
  return ("%s.tmp.%d.%d"):format(path, ffi.C.getpid(), temps)
end

local function write_atomic(path, text)
  local tmp = temp_name(path)
  local f, err = io.open(tmp, "wb")
  if not f then error(("hf: cannot write %s: %s"):format(tmp, tostring(err)), 0) end
  f:write(text)
  if not f:close() then os.remove(tmp); error("hf: cannot finish writing " .. path, 0) end
  return tmp
end

-- The HF tensors (name -> CPU f32 tensor, Conv1D [in, out], no lm_head) for a state dict of
-- shard names; biases a bias-free model lacks are written as zeros (the same function).
function M.hf_tensors(dict, c)
  local out = {}
  local function put(name, shape)
    local t = dict[name]
    if t then
      if M.is_conv1d(name) then
        local tv = V.transpose(t, 1, 2)
        out[name] = V.contiguous(tv)
        tv:free()
      else
        out[name] = t:alias()
      end
    elseif name:match("%.bias$") then
      out[name] = tensor.zeros(shape, { dtype = "f32", device = "cpu" })
    else
      error("export_hf: the model has no parameter " .. name, 0)
    end
  end
  local C, P, Vn = c.n_embd, c.block_size, c.vocab_size
  put("transformer.wte.weight", { Vn, C })
  put("transformer.wpe.weight", { P, C })
  for i = 0, c.n_layer - 1 do
    local h = "transformer.h." .. i .. "."
    put(h .. "ln_1.weight", { C }); put(h .. "ln_1.bias", { C })
    put(h .. "attn.c_attn.weight", { C, 3 * C }); put(h .. "attn.c_attn.bias", { 3 * C })
    put(h .. "attn.c_proj.weight", { C, C }); put(h .. "attn.c_proj.bias", { C })
    put(h .. "ln_2.weight", { C }); put(h .. "ln_2.bias", { C })
    put(h .. "mlp.c_fc.weight", { C, 4 * C }); put(h .. "mlp.c_fc.bias", { 4 * C })
    put(h .. "mlp.c_proj.weight", { 4 * C, C }); put(h .. "mlp.c_proj.bias", { C })
  end
  put("transformer.ln_f.weight", { C }); put("transformer.ln_f.bias", { C })
  local unknown = {}
  for name in pairs(dict) do if not out[name] then unknown[#unknown + 1] = name end end
  if #unknown > 0 then
    table.sort(unknown)
    for _, t in pairs(out) do t:free() end
    error("export_hf: parameters with no GPT-2 counterpart: " .. table.concat(unknown, ", "), 0)
  end
  return out
end

-- nn.Llama's config -> LlamaConfig fields for config.json (base: the imported config.json,
-- whose other fields, such as token ids, are kept). The rotary base goes in both spellings:
-- rope_theta (transformers 4) and rope_parameters (transformers 5); shard reads either.
function M.llama_config_to_hf(c, base)
  local out = {}
  for k, v in pairs(base or {}) do out[k] = v end
  out.model_type = "llama"
  out.architectures = { "LlamaForCausalLM" }
  out.hidden_act = "silu"
  out.hidden_size, out.intermediate_size, out.num_hidden_layers = c.dim, c.ffn_dim, c.n_layer
  out.num_attention_heads, out.num_key_value_heads, out.head_dim = c.n_head, c.n_kv_head, c.dim / c.n_head
  out.vocab_size, out.max_position_embeddings = c.vocab_size, c.max_seq_len
  out.rms_norm_eps = c.norm_eps
  out.rope_theta = c.rope_theta
  out.rope_parameters = { rope_type = "default", rope_theta = c.rope_theta }
  out.rope_scaling = nil
  out.tie_word_embeddings = c.tie_embeddings == true
  out.attention_bias, out.mlp_bias = false, false
  out.torch_dtype = "float32"
  if out.dtype ~= nil then out.dtype = "float32" end
  return out
end

-- The HF tensors of a Llama's state dict: the same names (shard's Llama uses HF's), f32 CPU
-- aliases; a tied head is embed_tokens alone, as save_pretrained writes it.
local function llama_hf_tensors(dict)
  local out = {}
  for name, t in pairs(dict) do out[name] = t:alias() end
  return out
end

local function is_llama(model)
  return type(model) == "table" and type(model.config) == "table" and model.model ~= nil
         and model.config.n_kv_head ~= nil
end

-- Writes dir/model.safetensors and dir/config.json for transformers' GPT2LMHeadModel, or,
-- for an nn.Llama, LlamaForCausalLM.
-- A new dir is built under a temporary name and renamed into place; into an existing dir
-- (say one holding tokenizer files) both files are written under temporary names first and
-- then renamed. Under FSDP every rank calls it (the shards are gathered); rank 0 writes, and
-- every rank returns once the files are there (or raises the writer's error).
function M.export(model, dir)
  local llama = is_llama(model)
  if not llama then
    local ok = pcall(check_gpt, model, "export_hf")
    if not ok then error("export_hf: expected an nn.GPT or nn.Llama (plain or FSDP-wrapped), got " .. kind_of(model), 0) end
  end
  if type(dir) ~= "string" or dir == "" then error("export_hf: expected a directory, got " .. tostring(dir), 0) end
  dir = dir:gsub("/+$", "")
  local c = model.config
  local dict = require("shard.io.state_dict").state_dict(model)
  local env = rawget(require("shard"), "env")
  local ok, err = true, nil
  if not env or env.rank == 0 then
    ok, err = pcall(function()
      local tensors = llama and llama_hf_tensors(dict) or M.hf_tensors(dict, c)
      local config = json.encode((llama and M.llama_config_to_hf or M.config_to_hf)(c, c.hf_config)) .. "\n"
      local fresh = not present(dir)
      local target = dir
      if fresh then
        target = temp_name(dir)
      end
      mkdir(target)
      local wok, werr = pcall(function()
        S.save(target .. "/model.safetensors.tmp", tensors, { format = "pt" })
        local ctmp = write_atomic(target .. "/config.json", config)
        assert(os.rename(target .. "/model.safetensors.tmp", target .. "/model.safetensors"))
        assert(os.rename(ctmp, target .. "/config.json"))
      end)
      for _, t in pairs(tensors) do t:free() end
      if not wok then
        os.remove(target .. "/model.safetensors.tmp")
        if fresh then os.remove(target .. "/model.safetensors"); os.remove(target .. "/config.json"); os.remove(target) end
        error(("export_hf: writing %s failed: %s"):format(dir, tostring(werr)), 0)
      end
      if fresh and not os.rename(target, dir) then
        error(("export_hf: cannot rename %s to %s"):format(target, dir), 0)
      end
    end)
  end
  for _, t in pairs(dict) do t:free() end
  if env and env.world > 1 then
    local all_ok = env.all_true(ok)
    if not all_ok then error(ok and "export_hf: rank 0 failed to write " .. dir or err, 0) end
  elseif not ok then
    error(err, 0)
  end
  return dir
end

return M
