#!/usr/bin/python3
"""The peer of bench/cpu_train.lua: nanoGPT's model and training step in PyTorch on the CPU,
same configuration, hyperparameters and threads. Runs under Debian's torch 1.13 (attention
written out) and under PyTorch 2.x from bench/venv.sh (F.scaled_dot_product_attention, causal).
Prints "tokens_per_s N" like the Lua side, with "torch_version V" and "torch_isa I" (the
kernels ATen dispatches to: ATEN_CPU_CAPABILITY or the CPU's best).
    /usr/bin/python3 bench/peers/nanogpt_cpu.py --iters 50
--bf16: the forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (f32 master
weights and optimizer), the peer of cpu_train.lua --dtype=bf16.
--compile: the model under torch.compile (inductor, C++ for the CPU; PyTorch 2.x). If it cannot
compile, prints one "compile_failed REASON" line and exits 3, which make bench reads as "no
compiled peer on this machine", never as a failed run."""
import argparse, math, os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=50)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
ap.add_argument("--bf16", action="store_true")
ap.add_argument("--compile", action="store_true")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(1337)
L, H, E, T, B, V = 4, 4, 128, 64, 12, 65


class Attention(nn.Module):
    def __init__(s):
        super().__init__()
        s.c_attn, s.c_proj = nn.Linear(E, 3 * E, bias=False), nn.Linear(E, E, bias=False)

    def forward(s, x):
        b, t, c = x.shape
        q, k, v = s.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(F, "scaled_dot_product_attention") else \
            ((q @ k.transpose(-2, -1) / math.sqrt(c // H)).masked_fill(torch.ones(t, t).tril() == 0, float("-inf")).softmax(-1) @ v)
        return s.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln_1, s.attn, s.ln_2 = nn.LayerNorm(E), Attention(), nn.LayerNorm(E)
        s.c_fc, s.c_proj = nn.Linear(E, 4 * E, bias=False), nn.Linear(4 * E, E, bias=False)

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.c_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, E), nn.Embedding(T, E)
        s.h = nn.ModuleList([Block() for _ in range(L)])
        s.ln_f = nn.LayerNorm(E)

    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)
        return F.cross_entropy(logits.view(-1, V), targets.reshape(-1))


def cpu_isa():
    """ATen's kernel set: 2.x asks it; 1.13 names it in its build summary ("CPU capability usage")."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        for line in torch.__config__.show().splitlines():
            if "CPU capability usage" in line:
                return line.split(":", 1)[1].strip()
    return "unknown"


def inductor_isa():
    """The vector ISA inductor generates C++ for (it follows ATEN_CPU_CAPABILITY where set)."""
    try:
        from torch._inductor import cpu_vec_isa
        return str(cpu_vec_isa.pick_vec_isa()) or "none"
    except Exception:
        return "unknown"


def compile_failed(err):
    why = " ".join(f"{type(err).__name__}: {err}".split()).split(" Set TORCHDYNAMO_VERBOSE")[0]
    print("compile_failed " + why[:160])
    sys.exit(3)


model = GPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
rest = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99))


run = model
if args.compile:
    if not hasattr(torch, "compile"):
        compile_failed(RuntimeError(f"torch {torch.__version__} has no torch.compile"))
    run = torch.compile(model)


def step():
    ids = torch.randint(0, V, (B, T + 1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        loss = run(ids[:, :-1], ids[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


# The first step compiles (forward and backward): a failure there means no compiled peer.
for i in range(max(args.warmup, 1 if args.compile else 0)):
    try:
        step()
    except Exception as err:
        if not args.compile or i > 0:
            raise
        compile_failed(err)
t0 = time.perf_counter()
for _ in range(args.iters):
    step()
dt = time.perf_counter() - t0
print(f"torch_version {torch.__version__}")
print(f"torch_isa {cpu_isa()}" + (f" inductor:{inductor_isa()}" if args.compile else ""))
print(f"tokens_per_s {args.iters * B * T / dt:.1f}")
print(f"ms_per_iter {dt / args.iters * 1000:.3f}")
