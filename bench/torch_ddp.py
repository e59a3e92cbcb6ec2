#!/usr/bin/python3
"""PyTorch baseline for bench/ddp_bench.cpp: data-parallel SGD steps, samples/s.

    mpirun -np 2 /usr/bin/python3 bench/torch_ddp.py [--model digits|large]... [--steps N] [--repeats N]

The same models (digits 64-512-512-10 at batch 64 per rank, large 1024-4096-4096-1024
at batch 32 per rank, ReLU, PyTorch's default initialisation), optimizer (SGD lr 0.01,
momentum 0.9), loss (cross-entropy), data (16 random batches per rank, cycled), one
thread per rank, and timing (warm-up, then the median of --repeats repeats of --steps
steps, wall clock between barriers) as ddp_bench. With more than one rank the model
is wrapped in torch.nn.parallel.DistributedDataParallel over gloo (bucket_cap_mb 25,
PyTorch's default); with one rank it is the plain model, no DDP. Rank and world size
come from Open MPI's environment; rank 0 prints the JSON list.

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
except ImportError as e:
    print(f"torch_ddp.py: cannot import torch ({e}); on Debian: apt install python3-torch", file=sys.stderr)
    sys.exit(3)

MODELS = {"digits": ([64, 512, 512, 10], 64), "large": ([1024, 4096, 4096, 1024], 32)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=rank, world_size=world)

    def barrier():
        if world > 1:
            dist.barrier()

    out = []
    for name in args.model or ["digits", "large"]:
        widths, batch = MODELS[name]
        torch.manual_seed(0)
        layers = []
        for i in range(len(widths) - 1):
            layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
            if i + 2 < len(widths):
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers)
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(100 + rank)
        batches = [(torch.rand(batch, widths[0], generator=g), torch.randint(0, widths[-1], (batch,), generator=g))
                   for _ in range(16)]
        large = widths[1] >= 1024
        steps = args.steps or (8 if large else 200)
        state = {"next": 0, "loss": 0.0}

        def step():
            x, y = batches[state["next"] % 16]
            state["next"] += 1
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            state["loss"] = loss.item()

        for _ in range(3 if large else 30):
            step()
        repeats = []
        for _ in range(args.repeats):
            barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            barrier()
            repeats.append(batch * world * steps / (time.perf_counter() - start))
        rate = statistics.median_low(repeats)
        out.append({"model": "-".join(map(str, widths)), "ranks": world, "batch_per_rank": batch,
                    "samples_per_s": rate, "step_ms": 1e3 * batch * world / rate, "repeats": repeats,
                    "loss": state["loss"], "torch": torch.__version__})
    if rank == 0:
        print(json.dumps(out, indent=1))
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
