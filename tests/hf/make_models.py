"""tests/hf/make_models.py OUT: tiny random GPT-2 and Llama models saved by transformers'
save_pretrained, and transformers' own logits for them, for make check-hf (tests/hf/check.sh).

For each model NAME: OUT/models/NAME/ (config.json, model.safetensors or the sharded
model.safetensors.index.json and its files, as save_pretrained writes them) and
OUT/ref/NAME.safetensors: input_ids (int64 [B, T]) and logits (float64 [B, T, V], the model
run in float64 by transformers on those ids). OUT/models.json lists them for check.lua
("refused": a model shard must refuse, an untied GPT-2 head).
Weights are drawn at a scale that gives logits of a few units (transformers' own init, std
0.02, gives logits so small that any error would hide), with LayerNorm/RMSNorm gains near 1.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

B, T = 2, 16


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def main(out):
    torch.manual_seed(0)
    os.makedirs(out + "/models", exist_ok=True)
    os.makedirs(out + "/ref", exist_ok=True)
    cases = [
        # name, kind, config, max_shard_size (None: one model.safetensors)
        ("gpt2", "gpt2", GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=32, bos_token_id=0, eos_token_id=0), None),
        ("gpt2-sharded-eps", "gpt2",
         GPT2Config(n_embd=32, n_layer=3, n_head=2, vocab_size=101, n_positions=24, layer_norm_epsilon=1e-3,
                    activation_function="gelu_pytorch_tanh", bos_token_id=0, eos_token_id=0), "20KB"),
        ("llama-gqa-untied-sharded", "llama",
         LlamaConfig(hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=97, max_position_embeddings=64, rms_norm_eps=1e-5,
                     rope_theta=500000.0, tie_word_embeddings=False), "20KB"),
        ("llama-mqa-tied", "llama",
         LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                     num_key_value_heads=1, vocab_size=89, max_position_embeddings=32, rms_norm_eps=1e-6,
                     tie_word_embeddings=True), None),
        ("llama-mha", "llama",
         LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=32), None),
        # shard's GPT ties lm_head to wte: an untied GPT-2 must be refused, not loaded half-right
        ("gpt2-untied", "gpt2",
         GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=53, n_positions=16, bos_token_id=0, eos_token_id=0,
                    tie_word_embeddings=False), None),
    ]
    listed = []
    for i, (name, kind, config, shard_size) in enumerate(cases):
        config._attn_implementation = "eager"
        model = (GPT2LMHeadModel if kind == "gpt2" else LlamaForCausalLM)(config)
        randomize(model, 100 + i)
        if config.tie_word_embeddings:
            model.tie_weights()
        model.eval()
        d = f"{out}/models/{name}"
        kw = {"max_shard_size": shard_size} if shard_size else {}
        model.save_pretrained(d, **kw)
        sharded = os.path.exists(d + "/model.safetensors.index.json")
        if bool(shard_size) != sharded:
            sys.exit(f"{name}: save_pretrained wrote {'a sharded' if sharded else 'a single-file'} checkpoint")
        ids = torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(7 + i))
        with torch.no_grad():
            logits = model.double()(input_ids=ids).logits
        save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, f"{out}/ref/{name}.safetensors")
        listed.append({"name": name, "kind": kind, "dir": d, "ref": f"{out}/ref/{name}.safetensors",
                       "sharded": sharded, "tied": bool(config.tie_word_embeddings),
                       "refused": kind == "gpt2" and not config.tie_word_embeddings})
    with open(out + "/models.json", "w") as f:
        json.dump(listed, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
