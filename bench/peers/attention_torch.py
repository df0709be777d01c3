"""bench/peers/attention_torch.py: the PyTorch peer of bench/attention_gpu.lua.

Causal attention as nanoGPT calls it: qkv [B, T, 3C] bf16 split into H heads (views),
torch.nn.functional.scaled_dot_product_attention(is_causal=True) (flash attention on Hopper),
the output transposed back to [B, T, C] and made contiguous. Median device time of `iters`
calls with CUDA events; the same lines and FLOP counts as the Lua benchmark.
    python3 bench/peers/attention_torch.py [--batch_size 16 --block_size 1024 --n_embd 768 --n_head 12]
"""
import argparse

import torch
import torch.nn.functional as F


def median_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[(iters - 1) // 2]


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("batch_size", 16), ("block_size", 1024), ("n_embd", 768), ("n_head", 12),
                          ("iters", 20), ("warmup", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    B, T, C, H = a.batch_size, a.block_size, a.n_embd, a.n_head
    torch.manual_seed(1337)
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16)

    def attend():
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)

    def forward():
        with torch.no_grad():
            attend()

    def forward_backward():
        attend().backward(dy)
        qkv.grad = None

    fwd_flops = 2 * B * T * T * C
    fwd_ms = median_ms(forward, a.iters, a.warmup)
    all_ms = median_ms(forward_backward, a.iters, a.warmup)
    print(f"attention_fwd_ms {fwd_ms:.4f}")
    print(f"attention_fwd_bwd_ms {all_ms:.4f}")
    print(f"attention_fwd_tflops {fwd_flops / (fwd_ms / 1e3) / 1e12:.1f}")
    print(f"attention_fwd_bwd_tflops {3.5 * fwd_flops / (all_ms / 1e3) / 1e12:.1f}")


if __name__ == "__main__":
    main()
