#!/usr/bin/python3
"""PyTorch eager baseline for bench/gpt_bench.cpp: one GPT training step, tokens/s.

    /usr/bin/python3 bench/torch_gpt_step.py [--model small|tiny]... [--repeats N] [--min-time S]
                                             [--checkpoint-every K]

The same models (nanoGPT's torch.nn code in tools/torch_gpt.py, whose outputs
tests/nn/gpt_parity_test.py checks against troupe's to 1e-6), step
(zero_grad(set_to_none=True), forward, cross-entropy, backward, clip_grad_norm_ at 1.0,
AdamW 0.9/0.95 with weight decay 0.1 on matrices, foreach=False), random batches, one
thread and timing as gpt_bench.cpp; the same JSON. Debian's torch 1.13 has no
scaled_dot_product_attention: attention is nanoGPT's explicit masked softmax, which is
what torch eager runs there. --checkpoint-every K runs every K-th block under
torch.utils.checkpoint (use_reentrant=False, PyTorch's recommended form), as gpt_bench's
flag of that name recomputes troupe's.
Exits 3 when torch cannot be imported.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before torch loads OpenBLAS (torch_train_step.py says why)
os.environ["OMP_NUM_THREADS"] = "1"
try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"torch_gpt_step.py: cannot import torch ({e}); on Debian: apt install python3-torch", file=sys.stderr)
    sys.exit(3)

# The model the parity test checks, so the baseline is the model proven equal.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from torch_gpt import GPT  # noqa: E402

MODELS = {
    "small": (dict(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384), 4),
    "tiny": (dict(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=128), 16),
}


def openblas_core():
    """The kernels of the OpenBLAS this process loaded (torch's), as OpenBLAS names them
    ("Haswell", "Cooperlake"...): OPENBLAS_CORETYPE, or its own choice for this CPU."""
    import ctypes
    for path in sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()}):
        try:
            corename = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        corename.restype = ctypes.c_char_p
        return corename().decode()
    return "no OpenBLAS loaded"


def cpu_seconds():
    return time.process_time()


def checkpoint_blocks(model, every):
    from torch.utils.checkpoint import checkpoint
    for i, block in enumerate(model.transformer.h):
        if every and i % every == 0:
            block.forward = lambda x, run=block.forward: checkpoint(run, x, use_reentrant=False)


def time_model(name, repeats, min_time, checkpoint_every):
    c, batch = MODELS[name]
    torch.manual_seed(0)
    model = GPT(c)
    checkpoint_blocks(model, checkpoint_every)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, c["vocab_size"], (batch, c["block_size"]), generator=g),
                torch.randint(0, c["vocab_size"], (batch, c["block_size"]), generator=g)) for _ in range(4)]
    state = {"n": 0, "loss": 0.0}

    def step():
        x, y = batches[state["n"] % len(batches)]
        state["n"] += 1
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["loss"] = loss.item()

    for _ in range(2):
        step()
    start = cpu_seconds()
    for _ in range(2):
        step()
    per_step = (cpu_seconds() - start) / 2
    steps = max(2, int(min_time / max(per_step, 1e-9)))
    tokens = batch * c["block_size"] * steps
    rates = []
    for _ in range(repeats):
        start = cpu_seconds()
        for _ in range(steps):
            step()
        rates.append(tokens / (cpu_seconds() - start))
    median = sorted(rates)[(len(rates) - 1) // 2]
    return {"model": name, "params": sum(p.numel() for p in model.parameters()), "batch": batch,
            "time": c["block_size"], "tokens_per_s": round(median, 1),
            "step_ms": round(1e3 * batch * c["block_size"] / median, 2), "repeats": [round(r, 1) for r in rates],
            "steps_per_repeat": steps, "loss": state["loss"], "torch": torch.__version__,
            "checkpoint_every": checkpoint_every, "blas": openblas_core()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps([time_model(m, args.repeats, args.min_time, args.checkpoint_every) for m in (args.model or ["tiny", "small"])]))


if __name__ == "__main__":
    main()
