"""tests/hf/check_shard_files.py OUT: what shard wrote (tests/hf/check.lua export), read by the
reference libraries, for make check-hf. One line per check, "ok   what (numbers)" or
"FAIL what (why)"; tests/hf/check.sh counts them.

  * OUT/export-wW/NAME (shard.export_hf of a GPT, a GQA Llama with an untied head and a tied
    Llama trained by shard, one process and FSDP world 2) loads with transformers' AutoModelForCausalLM.from_pretrained with no missing,
    unexpected or mis-shaped tensors, as the class config.json names, and its logits (run in
    float64) on the ids of OUT/export-wW/NAME.safetensors are shard's within TOL
  * OUT/export-w2/ckpt (shard.checkpoint.save at FSDP world 2): every rank file opens with the
    safetensors reference library (safe_open), its metadata and every tensor readable; each
    piece's CRC32C is index.json's; every parameter and AdamW moment reassembled from the
    pieces covers each element once, and the parameters equal shard.save's full state dict
    (OUT/export-w2/full.safetensors, itself opened with safe_open, its CRC32C metadata checked)
"""
import json
import os
import sys
import traceback

import numpy as np
import torch
from safetensors import safe_open

TOL = float(os.environ.get("CHECK_HF_TOL", "1e-5"))
results = []


def report(ok, what, detail):
    print(("ok   " if ok else "FAIL ") + f"{what} ({detail})", flush=True)
    results.append(ok)


def check(what, fn):
    try:
        ok, detail = fn()
    except Exception as e:  # a check that cannot run fails, with the reason on its line
        ok, detail = False, f"{type(e).__name__}: {e}".replace("\n", " | ")
        traceback.print_exc(file=sys.stderr)
    report(ok, what, detail)


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def raw_bytes(t):
    return t.contiguous().numpy().tobytes()


EXPORTS = ("gpt2", "llama-gqa-untied", "llama-tied")   # tests/hf/check.lua's MODELS


def check_export(out, world, name):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    d = f"{out}/export-w{world}"
    where = "one process" if world == 1 else f"FSDP full_shard world {world}"

    def run():
        model, info = AutoModelForCausalLM.from_pretrained(f"{d}/{name}", output_loading_info=True)
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            return False, f"loading info {bad}"
        with safe_open(f"{d}/{name}.safetensors", "pt") as f:
            ids, want = f.get_tensor("input_ids"), f.get_tensor("logits")
        model = model.double().eval()
        with torch.no_grad():
            got = model(input_ids=ids).logits
        err = (got - want).abs().max().item()
        detail = (f"{type(model).__name__}, max |logit - shard's| = {err:.2e}, "
                  f"max |logit| {want.abs().max().item():.2f}")
        return err <= TOL, detail + ("" if err <= TOL else f" > {TOL:g}")

    check(f"transformers AutoModelForCausalLM.from_pretrained(export_hf of {name} trained {where})", run)


def check_checkpoint(out):
    base = f"{out}/export-w2"
    with open(base + "/ckpt/latest") as f:
        step_dir = f"{base}/ckpt/{f.read().strip()}"
    index = json.load(open(step_dir + "/index.json"))
    handles = {}

    def open_ranks():
        world = index["world"]["size"]
        names = sorted(p for p in os.listdir(step_dir) if p.endswith(".safetensors"))
        want = [f"rank-{r:05d}-of-{world:05d}.safetensors" for r in range(world)]
        if names != want:
            return False, f"rank files {names}, expected {want}"
        n = 0
        for r, name in enumerate(names):
            f = safe_open(f"{step_dir}/{name}", "pt")
            handles[name] = f
            meta = f.metadata()
            if meta.get("format") != "shard.checkpoint" or meta.get("rank") != str(r) or meta.get("world") != str(world):
                return False, f"{name}: metadata {meta}"
            for k in f.keys():
                f.get_tensor(k)
                n += 1
        return True, f"{len(names)} rank files, {n} tensors, metadata {sorted(handles[names[0]].metadata())}"

    check("safetensors.safe_open reads shard.checkpoint.save's rank files (FSDP world 2)", open_ranks)
    if not handles:
        return

    def assemble(entry, what):
        """A tensor from index pieces: (flat float64 array, pieces, CRC mismatches)."""
        numel = int(np.prod(entry["shape"])) if entry["shape"] else 1
        flat = np.zeros(numel, dtype=np.float64)
        seen = np.zeros(numel, dtype=np.int64)
        crc_bad = []
        for p in entry["pieces"]:
            t = handles[p["file"]].get_tensor(p["tensor"]).reshape(-1)
            if t.numel() != p["count"]:
                raise ValueError(f"{what}: piece {p['tensor']} holds {t.numel()} elements, index says {p['count']}")
            flat[p["start"]:p["start"] + p["count"]] = t.double().numpy()
            seen[p["start"]:p["start"] + p["count"]] += 1
            if "crc32c" in p and int(p["crc32c"], 16) != crc32c(raw_bytes(t)):
                crc_bad.append(p["tensor"])
        if not (seen == 1).all():
            raise ValueError(f"{what}: pieces cover {int((seen == 0).sum())} elements never and {int((seen > 1).sum())} twice")
        return flat, len(entry["pieces"]), crc_bad

    def params():
        full = safe_open(base + "/full.safetensors", "pt")
        crcs = json.loads(full.metadata().get("crc32c", "{}"))
        worst, pieces, bad_crc, n = 0.0, 0, [], 0
        if set(full.keys()) != set(index["params"]):
            return False, f"index params {sorted(set(index['params']) ^ set(full.keys()))} differ from full.safetensors"
        for name, entry in index["params"].items():
            flat, k, crc_bad = assemble(entry, name)
            bad_crc += crc_bad
            pieces += k
            ref = full.get_tensor(name)
            if list(ref.shape) != entry["shape"]:
                return False, f"{name}: shape {entry['shape']} in index.json, {list(ref.shape)} in full.safetensors"
            if name in crcs and int(crcs[name], 16) != crc32c(raw_bytes(ref)):
                bad_crc.append("full.safetensors:" + name)
            worst = max(worst, float(np.abs(flat - ref.double().numpy().reshape(-1)).max(initial=0)))
            n += 1
        if bad_crc:
            return False, f"CRC32C differs for {bad_crc[:4]}"
        ok = worst == 0
        return ok, (f"{n} parameters from {pieces} pieces equal shard.save's full state dict"
                    if ok else f"max |difference| {worst:.3g}") + ", every CRC32C matches"

    check("checkpoint pieces reassembled = shard.save's full state dict (safe_open both)", params)

    def moments():
        state, n, pieces, bad_crc = index["optim"]["state"], 0, 0, []
        for kind, per_name in state.items():
            for name, entry in per_name.items():
                e = entry if "pieces" in entry else {"pieces": entry, "shape": index["params"][name]["shape"]}
                if "shape" not in e:
                    e = dict(e, shape=index["params"][name]["shape"])
                flat, k, crc_bad = assemble(e, f"{kind}/{name}")
                if not np.isfinite(flat).all():
                    return False, f"{kind}/{name} holds non-finite values"
                n, pieces, bad_crc = n + 1, pieces + k, bad_crc + crc_bad
        if bad_crc:
            return False, f"CRC32C differs for {bad_crc[:4]}"
        return n > 0, f"{n} AdamW moments ({', '.join(sorted(state))}) from {pieces} pieces, each element once, every CRC32C matches"

    check("checkpoint optimizer state reassembled from the rank files", moments)


def main(out):
    for world in (1, 2):
        for name in EXPORTS:
            check_export(out, world, name)
    check_checkpoint(out)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
