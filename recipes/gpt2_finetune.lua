-- Fine-tune a Hugging Face GPT-2 on any text: its weights (nn.GPT.from_pretrained), its
-- byte-level BPE tokenizer (shard.tokenizer) and token files prepared in parallel
-- (shard.data.prepare: nanoGPT's train.bin / val.bin, uint16 or uint32, and meta.json).
--   shard run recipes/gpt2_finetune.lua --init_from=gpt2 --data=input.txt
--   shard launch --nproc 4 recipes/gpt2_finetune.lua --init_from=gpt2 --data=input.txt --strategy=full_shard
-- --init_from: a directory with config.json and model.safetensors (and tokenizer.json, unless
-- --tokenizer names another); --data: a text file (prepared into OUT_DIR/data/NAME/ once, by
-- rank 0 with --prepare_workers processes) or a folder shard.data.prepare wrote; --prompt:
-- the sample's start (default: the tokenizer's end-of-text token, else a newline). The loop,
-- --strategy (FSDP at any world size), checkpoints (--save_interval, --resume), evaluation,
-- the progress lines and the sample at the end are shard.train's.
local shard = require("shard")
local nn = shard.nn

local function usage(fmt, ...) error({ usage = fmt:format(...) }, 0) end

-- The tokenizer for the sample: decode, the prompt's ids, the vocabulary size.
local function sampler(tok, cfg)
  local prompt
  if cfg.prompt ~= "" then prompt = tok:encode(cfg.prompt)
  elseif tok.eos_id then prompt = { tok.eos_id }
  else prompt = tok:encode("\n") end
  if #prompt == 0 then prompt = { 0 } end
  return {
    vocab_size = tok.vocab_size, prompt = prompt, bpe = tok,
    decode = function(ids)
      local known = {}
      for i, id in ipairs(ids) do known[i] = id < tok.vocab_size and id or (tok.eos_id or 0) end
      return tok:decode(known)
    end,
  }
end

shard.train.run{
  defaults = { init_from = "", tokenizer = "", prompt = "", dropout = 0.0, val_fraction = 0.1, prepare_workers = 0,
               out_dir = "out/gpt2_finetune", lr = 3e-5, min_lr = 3e-6, warmup = 0, max_iters = 200,
               batch_size = 8, block_size = 128, eval_interval = 50, log_interval = 10, sample_tokens = 100 },
  spec = { init_from = { help = "a Hugging Face GPT-2 directory (config.json, model.safetensors)" },
           tokenizer = { help = 'a tokenizer.json or its directory; "": the --init_from directory' },
           data = { help = "a text file, or a folder shard.data.prepare wrote" },
           prompt = { help = 'the sample starts with it; "": the end-of-text token' },
           dropout = { min = 0, below = 1 }, val_fraction = { min = 0, below = 1 },
           prepare_workers = { min = 0, help = "processes encoding the text; 0: the CPUs online" } },
  block = nn.Block,

  data = function(cfg, env)
    if cfg.init_from == "" then usage("--init_from=DIR: a Hugging Face GPT-2 directory is needed") end
    if not require("shard.files").readable(cfg.init_from .. "/config.json") then
      usage("--init_from=%s: no config.json there (a Hugging Face GPT-2 directory is needed)", cfg.init_from)
    end
    local tok = require("shard.tokenizer").load(cfg.tokenizer ~= "" and cfg.tokenizer or cfg.init_from)
    local dir = cfg.data
    if not require("shard.files").readable(dir .. "/meta.json") then   -- a text: rank 0 prepares, the others wait
      dir = shard.data.corpus_dir(cfg.out_dir .. "/data", cfg.data)
      if env.rank == 0 then
        local meta, current = shard.data.prepare{ text = cfg.data, tokenizer = tok, out = dir, val_fraction = cfg.val_fraction,
                                                  workers = cfg.prepare_workers > 0 and cfg.prepare_workers or nil }
        print(("data: %s -> %s: %d train / %d val tokens (%s)%s"):format(cfg.data, dir, meta.train_tokens, meta.val_tokens,
              meta.dtype, current and " (up to date)" or (", %d pieces on %d workers"):format(meta.pieces, meta.workers)))
      end
      env.barrier()
    end
    local meta, train, val = shard.data.load_prepared(dir)
    if meta.vocab_size ~= tok.vocab_size then
      error(("%s: its tokens come from a vocabulary of %d, the tokenizer %s has %d"):format(dir, meta.vocab_size, tok.path, tok.vocab_size), 0)
    end
    return sampler(tok, cfg), train, val
  end,

  from_pretrained = function(cfg, wrap, vocab_size)
    local model = nn.GPT.from_pretrained(cfg.init_from, { dropout = cfg.dropout, fsdp = wrap })
    local c = model.config
    if c.vocab_size < vocab_size then
      error(("--init_from=%s has %d embeddings, fewer than the tokenizer's %d ids"):format(cfg.init_from, c.vocab_size, vocab_size), 0)
    end
    if cfg.block_size > c.block_size then
      usage("--block_size=%d: %s has %d positions", cfg.block_size, cfg.init_from, c.block_size)
    end
    return model
  end,

  flops_per_token = function(_, n_params) return 6 * n_params end,   -- the matmuls' (attention's left out)
}
