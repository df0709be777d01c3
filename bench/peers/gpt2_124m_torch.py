"""bench/peers/gpt2_124m_torch.py: the PyTorch peer of bench/gpt2_124m.lua.

The same model and step: nanoGPT's GPT-2 124M (12 layers, 12 heads, n_embd 768, vocab 50304,
T 1024, biases, tied lm_head, no dropout), random tokens, AdamW (betas 0.9/0.95, wd 0.1,
fused), grad clip 1, bf16 autocast, SDPA flash attention, torch.compile, and FSDP2
fully_shard at world 1 (per block, then the root) with bf16 params and f32 reduction.
Prints the same lines as the Lua benchmark: tokens_per_s, ms_per_iter, matmul_tflops (bf16
8192^3, measured in this run), mfu (6N + 6 L C T flops per token over that peak), peak_bytes.
    python3 bench/peers/gpt2_124m_torch.py [--batch_size 32] [--iters 20]
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.n_head = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def matmul_peak(dev):
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b.t()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b.t()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return 2 * n ** 3 / (times[5] / 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no_compile", action="store_true")
    args = ap.parse_args()
    L, H, C, V, T = 12, 12, 768, 50304, 1024

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1337)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = GPT(L, H, C, V, T).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.h:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = model if args.no_compile else torch.compile(model)

    n_params = sum(p.numel() for p in model.parameters()) - T * C   # tied wte once, no wpe
    flops_per_token = 6 * n_params + 6 * L * C * T

    def step():
        ids = torch.randint(0, V, (args.batch_size, T + 1), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step().item()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(args.iters):
        loss = step()
    e.record()
    e.synchronize()
    ms = s.elapsed_time(e) / args.iters
    peak_bytes = torch.cuda.max_memory_allocated(dev)
    peak = matmul_peak(dev)
    tps = args.batch_size * T / (ms / 1e3)
    print(f"loss {loss.item():.4f}")
    print(f"tokens_per_s {tps:.1f}")
    print(f"ms_per_iter {ms:.3f}")
    print(f"matmul_tflops {peak / 1e12:.1f}")
    print(f"mfu {tps * flops_per_token / peak:.4f}")
    print(f"peak_bytes {peak_bytes}")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
