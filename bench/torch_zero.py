#!/usr/bin/python3
"""PyTorch baseline for bench/sharding_bench.cpp: DDP + ZeRO-1 with
torch.distributed.optim.ZeroRedundancyOptimizer (AdamW), samples/s and memory.

    mpirun -np 2 /usr/bin/python3 bench/torch_zero.py --model mlp25m|deep67m [--steps N] [--warmup N]

The same models (mlp25m 1024-4096-4096-1024, deep67m 16 x Linear(2048, 2048), ReLU
between layers, PyTorch's default initialisation), batch (32 per rank), optimizer
(AdamW lr 1e-3), loss (cross-entropy over the last width), data (4 random batches per
rank, cycled), one thread per rank, and timing (--warmup untimed steps, then each of
--steps steps timed between barriers; the median step) as sharding_bench. The model is
wrapped in torch.nn.parallel.DistributedDataParallel over gloo (bucket_cap_mb 25) at
every world size, 1 included: the setup a user picks for ZeRO-1 in PyTorch.

Memory, as sharding_bench counts it, after one more backward: parameters + gradients
+ this rank's optimizer state tensors (ZeroRedundancyOptimizer's local optimizer),
and peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is wrapped).
Rank and world size come from Open MPI's environment; rank 0 prints one JSON object
with byte counts the largest over ranks.

Exits with status 3 when torch cannot be imported, so bench/run can report it skipped.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before torch loads OpenBLAS: one thread per rank
os.environ["OMP_NUM_THREADS"] = "1"

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
except ImportError as e:
    print(f"torch_zero.py: cannot import torch ({e}); on Debian: apt install python3-torch", file=sys.stderr)
    sys.exit(3)

MODELS = {"mlp25m": [1024, 4096, 4096, 1024], "deep67m": [2048] * 17}
BATCH = 32


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return -1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp25m")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29518")
    dist.init_process_group("gloo", rank=rank, world_size=world)

    widths = MODELS[args.model]
    torch.manual_seed(0)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=25)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.rand(BATCH, widths[0], generator=g), torch.randint(0, widths[-1], (BATCH,), generator=g))
               for _ in range(4)]
    state = {"next": 0}

    def forward_backward():
        x, y = batches[state["next"] % len(batches)]
        state["next"] += 1
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.item()

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    for _ in range(args.warmup):
        forward_backward()
        step()
    times = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        forward_backward()
        step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    loss = forward_backward()
    peak_rss = status_bytes("VmHWM:")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    optim = sum(v.numel() * v.element_size() for s in opt.optim.state.values() for v in s.values()
                if torch.is_tensor(v))
    n = sum(p.numel() for p in model.parameters())
    step()

    worst = torch.tensor([params + grads + optim, params, grads, optim, peak_rss], dtype=torch.int64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    step_s = statistics.median_low(times)
    if rank == 0:
        print(json.dumps({"model": args.model, "mode": "torch_zero1", "ranks": world, "batch_per_rank": BATCH,
                          "parameters": n, "samples_per_s": BATCH * world / step_s, "step_s": step_s,
                          "state_bytes": int(worst[0]), "parameter_bytes": int(worst[1]),
                          "gradient_bytes": int(worst[2]), "optimizer_bytes": int(worst[3]),
                          "peak_rss_bytes": int(worst[4]), "loss": loss, "steps": times,
                          "torch": torch.__version__}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
