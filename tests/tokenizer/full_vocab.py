#!/usr/bin/env python3
"""The full-vocabulary check's reference side (tests/tokenizer/check_full.sh runs it in the venv).
From tiktoken's cl100k_base ranks (a file whose sha256 tiktoken itself pins) it writes, under the
cache folder OUT:
  cl100k/tokenizer.json   Llama 3's / cl100k's split, ignore_merges (as Llama 3 ships it)
  gpt2re/tokenizer.json   the same vocabulary behind GPT-2's ByteLevel regex, ignore_merges
  gpt2re_merges/tokenizer.json  the same without ignore_merges (pure merges, as GPT-2 ships it)
  gpt2/tokenizer.json     GPT-2 itself, from its own ranks (r50k_base) when GPT2_RANKS is given
(merges recovered from the ranks as Hugging Face's tiktoken converter does) and expected.json:
the texts (tinyshakespeare whole, the fixture corpus, a few long mixed documents) with the ids of
tiktoken (an Encoding of the same ranks and regex) and of `tokenizers` for each file.
    full_vocab.py RANKS_FILE SHAKESPEARE CORPUS_JSON OUT [GPT2_RANKS]"""
import json
import os
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import Tokenizer

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPECIAL = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
           "<|endofprompt|>": 100276}
SPECIAL_GPT2 = {"<|endoftext|>": 50256}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def split_token(ranks, token, max_rank):
    """The two parts BPE joins last to make token: byte-pair merging with ranks below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best, at = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            return parts
        parts = parts[:at] + [parts[at] + parts[at + 1]] + parts[at + 2:]


def tokenizer_json(ranks, merges, split, ignore_merges, special=SPECIAL):
    m = bytes_to_unicode()
    spell = lambda b: "".join(m[x] for x in b)
    if split == "gpt2":
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CL100K}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s, i in special.items()],
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  # the special tokens in the vocabulary too (as GPT-2's file has <|endoftext|>):
                  # without, tokenizers renumbers added tokens that leave a gap after it
                  "vocab": dict({spell(t): r for t, r in ranks.items()}, **special),
                  "merges": [[spell(a), spell(b)] for a, b in merges]},
    }


def merges_of(ranks):
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = split_token(ranks, token, rank)
            assert len(parts) == 2, (token, parts)
            merges.append(parts)
    return merges


def write_case(out, name, doc, texts, expected, tiktoken_encoding):
    os.makedirs(f"{out}/{name}", exist_ok=True)
    with open(f"{out}/{name}/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    hf = Tokenizer.from_file(f"{out}/{name}/tokenizer.json")
    expected[name + "/tokenizers"] = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    if tiktoken_encoding:
        expected[name + "/tiktoken"] = [tiktoken_encoding.encode(t, allowed_special="all") for t in texts]


def main():
    ranks_file, shakespeare, corpus, out = sys.argv[1:5]
    gpt2_file = sys.argv[5] if len(sys.argv) > 5 else None   # GPT-2's own ranks (r50k_base)
    ranks = load_tiktoken_bpe(ranks_file)
    merges = merges_of(ranks)
    with open(shakespeare, encoding="utf-8") as f:
        texts = [f.read()]
    with open(corpus, encoding="utf-8") as f:
        small = json.load(f)["texts"]
    texts += small
    texts.append("\n".join(small) * 20)
    texts.append(texts[0][:50000].replace("e", "\u00e9").replace(" the ", " \u4e16\u754c ").replace("\n", "\r\n"))
    texts.append("".join(small[i % len(small)] + " " * (i % 7) + str(10 ** (i % 25)) for i in range(2000)))
    expected = {"texts": texts, "names": []}
    for name, split, ignore in (("cl100k", "cl100k", True), ("gpt2re", "gpt2", True), ("gpt2re_merges", "gpt2", False)):
        enc = ignore and tiktoken.Encoding(name, pat_str=CL100K if split == "cl100k" else GPT2, mergeable_ranks=ranks,
                                           special_tokens=SPECIAL)
        write_case(out, name, tokenizer_json(ranks, merges, split, ignore), texts, expected, enc)
        expected["names"].append(name)
    if gpt2_file:
        # GPT-2 as it ships: its own vocabulary and merges behind its ByteLevel regex, no
        # ignore_merges, <|endoftext|> 50256; tiktoken's r50k_base is the same ranks and regex
        g_ranks = load_tiktoken_bpe(gpt2_file)
        enc = tiktoken.Encoding("r50k", pat_str=GPT2, mergeable_ranks=g_ranks, special_tokens=SPECIAL_GPT2)
        doc = tokenizer_json(g_ranks, merges_of(g_ranks), "gpt2", False, SPECIAL_GPT2)
        write_case(out, "gpt2", doc, texts, expected, enc)
        expected["names"].append("gpt2")
    with open(f"{out}/expected.json", "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
