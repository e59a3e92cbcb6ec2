#!/usr/bin/env python3
"""PyTorch eager baseline for bench/gpu_gpt_bench.cpp, on one CUDA device.

    python3 bench/torch_gpu_gpt.py [--precision f32|bf16]... [--batch N] [--repeats N] [--steps N] [--ops]

The same cases, shapes and timing as gpu_gpt_bench.cpp, printing the same JSON:
- attention: F.scaled_dot_product_attention(q, k, v, is_causal=True) forward and
  backward on q, k, v split from one [B, T, 3C] tensor as nanoGPT does; bf16 pinned to
  the flash backend (the issue's baseline), f32 on the backend torch picks (flash takes
  no f32; it picks the memory-efficient one);
- gpt2-small step: nanoGPT's model (tools/torch_gpt.py's, with nanoGPT's
  scaled_dot_product_attention path, which torch >= 2 takes), AdamW with decay on
  matrices (torch's default foreach implementation), clip_grad_norm_ at 1.0; bf16 is
  torch.autocast(dtype=bfloat16) over f32 weights. TF32 off, as troupe's f32 products.
--ops times each kind of layer alone, as gpu_gpt_bench --ops does (same names, same
shapes; the layers in the given dtype, not under autocast), one JSON line per dtype.
Timing with CUDA events around --steps calls after 3 warm-up calls; the median of
--repeats. Exits 3 when torch or a CUDA device is missing.
"""
import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"torch_gpu_gpt.py: cannot import torch ({e})", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import torch_gpt  # noqa: E402

GPT2_SMALL = dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)


def attention_forward(self, x):  # nanoGPT's flash path
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def gpt_forward(self, idx):  # positions on the ids' device
    pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
    x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
    for block in self.transformer.h:
        x = block(x)
    return self.lm_head(self.transformer.ln_f(x))


def median_ms(f, repeats, steps):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median_low(times)


def attention_backend(precision):
    """The context that picks scaled_dot_product_attention's backend, and its name:
    flash for bf16 (the issue's baseline), torch's own choice for f32."""
    if precision == "bf16" and hasattr(torch.nn, "attention"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)), "flash"
    return contextlib.nullcontext, "default"


def time_attention(precision, batch, repeats, steps):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    B, T, H, C = batch, GPT2_SMALL["block_size"], GPT2_SMALL["n_head"], GPT2_SMALL["n_embd"]
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(B, H, T, C // H, device="cuda", dtype=dtype)
    ctx, backend = attention_backend(precision)

    def call():
        with ctx():
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.backward(gy)
        qkv.grad = None

    return {"case": "attention", "precision": precision, "batch": B, "time": T, "heads": H, "head_dim": C // H,
            "ms": round(median_ms(call, repeats, steps), 4), "backend": backend}


def time_step(precision, batch, repeats, steps):
    torch.manual_seed(0)
    model = torch_gpt.GPT(GPT2_SMALL).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    V, T = GPT2_SMALL["vocab_size"], GPT2_SMALL["block_size"]
    batches = [(torch.randint(0, V, (batch, T), generator=g).cuda(), torch.randint(0, V, (batch, T), generator=g).cuda())
               for _ in range(2)]
    state = {"n": 0, "loss": None}

    def step():
        x, y = batches[state["n"] % 2]
        state["n"] += 1
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["loss"] = loss

    ms = median_ms(step, repeats, steps)
    return {"case": "gpt2-small step", "precision": precision, "batch": batch, "time": T,
            "params": sum(p.numel() for p in model.parameters()), "ms": round(ms, 4),
            "loss": float(state["loss"].item())}


def time_ops(precision, batch, repeats, steps):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    T, C, V = GPT2_SMALL["block_size"], GPT2_SMALL["n_embd"], GPT2_SMALL["vocab_size"]
    N = batch * T
    torch.manual_seed(0)

    def rows(cols, grad=False):
        return torch.randn(N, cols, device="cuda", dtype=dtype, requires_grad=grad)

    times = {}

    def time(name, f):
        times[name] = round(median_ms(f, repeats, steps), 3)

    def forward_and_backward(name, module, x, gy):
        def forward():
            with torch.no_grad():
                module(x)

        def both():
            module(x).backward(gy)
            x.grad = None

        time(name + " forward", forward)
        time(name + " forward+backward", both)

    for name, i, o in [("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C),
                       ("mlp.c_proj", 4 * C, C)]:
        forward_and_backward(name, torch.nn.Linear(i, o, device="cuda", dtype=dtype), rows(i, True), rows(o))
    forward_and_backward("lm_head", torch.nn.Linear(C, V, bias=False, device="cuda", dtype=dtype), rows(C, True),
                         rows(V))
    with torch.no_grad(), attention_backend(precision)[0]():
        H = GPT2_SMALL["n_head"]
        q, k, v = (t.view(batch, T, H, C // H).transpose(1, 2) for t in rows(3 * C).split(C, dim=1))
        time("attention forward", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    with torch.no_grad():
        y, bias = rows(3 * C), torch.randn(3 * C, device="cuda", dtype=dtype)
        time("bias add [N, 3C] + [3C]", lambda: y.add_(bias))
        a, b = rows(C), rows(C)
        time("residual add [N, C]", lambda: a + b)
    gelu = torch.nn.GELU(approximate="tanh")
    forward_and_backward("gelu (tanh) [N, 4C]", gelu, rows(4 * C, True), rows(4 * C))
    forward_and_backward("layer norm [N, C]", torch.nn.LayerNorm(C, device="cuda", dtype=dtype), rows(C, True),
                         rows(C))
    ids = torch.randint(0, V, (batch, T), device="cuda")
    wte = torch.nn.Embedding(V, C, device="cuda", dtype=dtype)
    gy = torch.randn(batch, T, C, device="cuda", dtype=dtype)

    def embedding_forward():
        with torch.no_grad():
            wte(ids)

    def embedding_both():
        wte(ids).backward(gy)
        wte.weight.grad = None

    time("embedding [B, T] -> [B, T, C] forward", embedding_forward)
    time("embedding [B, T] -> [B, T, C] forward+backward", embedding_both)
    logits, targets = rows(V, True), torch.randint(0, V, (N,), device="cuda")

    def loss_forward():
        with torch.no_grad():
            F.cross_entropy(logits, targets)

    def loss_both():
        F.cross_entropy(logits, targets).backward()
        logits.grad = None

    time("cross entropy [N, V] forward", loss_forward)
    time("cross entropy [N, V] forward+backward", loss_both)
    return {"ops": "torch " + precision, "ms_per_call": times}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", action="append", choices=["f32", "bf16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ops", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu_gpt.py: no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch_gpt.CausalSelfAttention.forward = attention_forward
    torch_gpt.GPT.forward = gpt_forward
    precisions = args.precision or ["f32", "bf16"]
    device = torch.cuda.get_device_name()
    if args.ops:
        for p in precisions:
            print(json.dumps(time_ops(p, args.batch, args.repeats, args.steps)))
            torch.cuda.empty_cache()
        return 0
    out = []
    for p in precisions:
        out.append(time_attention(p, args.batch, args.repeats, args.steps))
        torch.cuda.empty_cache()
    for p in precisions:
        out.append(time_step(p, args.batch, args.repeats, args.steps))
        torch.cuda.empty_cache()
    for row in out:
        row.update(device=device, torch=torch.__version__)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
