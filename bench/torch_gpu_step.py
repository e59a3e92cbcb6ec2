#!/usr/bin/env python3
"""PyTorch eager baseline for bench/gpu_bench.cpp: one training step on a CUDA GPU.

    python3 bench/torch_gpu_step.py [--model mlp25m|deep67m]... [--precision f32|bf16]...
                                    [--batch N] [--repeats N] [--steps N]

A step is zero_grad(set_to_none), forward, cross-entropy, backward, Adam (lr 1e-3,
PyTorch's default foreach implementation, and the fused one as a second row) on the
models of bench/sharding_bench.cpp: mlp25m 1024-4096-4096-1024 and deep67m
16 x Linear(2048, 2048), ReLU between layers, batch 256 of inputs uniform in [0, 1)
and labels uniform over the output width, 8 batches resident on the GPU and cycled.

Precision: f32 is plain f32 with TF32 off (torch's default for matmul); bf16 is
automatic mixed precision, torch.autocast(dtype=bfloat16): f32 weights and optimizer,
bf16 matrix products. gpu_bench.cpp's bf16 is troupe's scheme instead: a bf16 model
with f32 master weights (train/master_weights.hpp); both do the matrix products in
bf16 with f32 accumulation and step f32 weights.

Timing: 20 warm-up steps, then --repeats repeats of --steps steps, each timed with
CUDA events around the steps (the GPU's time, launch gaps included); the median
repeat is reported. Prints one JSON list, one object per (model, precision, optimizer).
Exits with status 3 when torch or a CUDA device is missing.
"""
import argparse
import json
import statistics
import sys

try:
    import torch
except ImportError as e:
    print(f"torch_gpu_step.py: cannot import torch ({e})", file=sys.stderr)
    sys.exit(3)

MODELS = {"mlp25m": [1024, 4096, 4096, 1024], "deep67m": [2048] * 17}
BATCHES, WARMUP = 8, 20


def build(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def time_step(model_name, precision, fused, batch, repeats, steps):
    torch.manual_seed(0)
    widths = MODELS[model_name]
    model = build(widths)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused, foreach=None if fused else True)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = [(torch.rand(batch, widths[0], device="cuda"),
             torch.randint(0, widths[-1], (batch,), device="cuda")) for _ in range(BATCHES)]
    count = 0

    def step():
        nonlocal count
        x, y = data[count % BATCHES]
        count += 1
        optimizer.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(WARMUP):
        loss = step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    params = sum(p.numel() for p in model.parameters())
    return {"model": model_name, "precision": precision, "optimizer": "adam fused" if fused else "adam foreach",
            "batch": batch, "params": params, "step_ms": round(statistics.median_low(times), 4),
            "repeats_ms": [round(t, 4) for t in times], "loss": loss.item(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--precision", action="append", choices=["f32", "bf16"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu_step.py: no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = [time_step(m, p, fused, args.batch, args.repeats, args.steps)
               for m in args.model or ["mlp25m", "deep67m"] for p in args.precision or ["f32", "bf16"]
               for fused in (False, True)]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
