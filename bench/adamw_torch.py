"""adamw_torch.py: the peer of bench/adamw_bench.c: PyTorch's torch.optim.AdamW on the CPU over
the parameters of GPT-2 124M (the same 148 tensors: 12 layers, n_embd 768, vocab 50304, block
1024, tied head; 124,475,904 elements), f32, the same hyper-parameters, with foreach off (the
single-tensor loop) and on (torch._foreach_* over the list), and fused (fused=True, PyTorch
2.x's fastest CPU AdamW; left out where this PyTorch refuses it), at each thread count of
--threads. For each setting, after one untimed step, it times ITERS steps and prints the best
one, as adamw_bench does:  step_ms_Tt_foreachF / step_ms_Tt_fused, params_per_s_... (and
torch_version V), each key followed by --tag when given.
  /usr/bin/python3 bench/adamw_torch.py [--iters 5] [--threads 1,2] [--tag _passive]
"""
import argparse
import time

import torch

LAYERS, EMBD, VOCAB, BLOCK = 12, 768, 50304, 1024


def gpt2_shapes():
    c = EMBD
    layer = [(c,), (c,), (c, 3 * c), (3 * c,), (c, c), (c,), (c,), (c,), (c, 4 * c), (4 * c,), (4 * c, c), (c,)]
    return [(VOCAB, c), (BLOCK, c)] + layer * LAYERS + [(c,), (c,)]


def best_step(opt, iters):
    """The best of iters timed steps after one untimed one, in seconds."""
    best = float("inf")
    for it in range(-1, iters):
        t0 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        if it >= 0:
            best = min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", default="1", help="thread counts, e.g. 1,2")
    ap.add_argument("--tag", default="", help="a suffix for the keys, e.g. _passive")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    if a.iters < 1 or min(threads) < 1:
        ap.error("--iters and every count of --threads must be >= 1")
    gen = torch.Generator().manual_seed(1)
    params = []
    for shape in gpt2_shapes():
        p = torch.nn.Parameter(torch.empty(shape).uniform_(-1, 1, generator=gen))
        p.grad = torch.empty(shape).uniform_(-1e-2, 1e-2, generator=gen)
        params.append(p)
    total = sum(p.numel() for p in params)
    print(f"params {total}\ntensors {len(params)}\ntorch_version {torch.__version__}", flush=True)
    hyper = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    variants = [("foreach0", dict(foreach=False)), ("foreach1", dict(foreach=True)), ("fused", dict(fused=True))]
    for name, how in variants:
        try:
            opt = torch.optim.AdamW(params, **hyper, **how)
            opt.step()
        except (RuntimeError, TypeError, ValueError) as e:   # 1.13 has no fused AdamW on the CPU
            print(f"# {name}: not in this PyTorch ({str(e).splitlines()[0]})", flush=True)
            continue
        for t in threads:
            torch.set_num_threads(t)
            best = best_step(opt, a.iters)
            key = f"{t}t_{name}{a.tag}"
            print(f"step_ms_{key} {best * 1e3:.2f}\nparams_per_s_{key} {total / best:.4g}", flush=True)
        del opt


if __name__ == "__main__":
    main()
