#!/usr/bin/env python3
"""PyTorch's gloo backend doing the collectives of bench/collectives_bench.cpp, for
bench/run's `collectives` area: 2 processes on this machine, one thread each, f32,
the same sizes and the same busbw rule (nccl-tests: allreduce x 2(n-1)/n, allgather
x (n-1)/n, broadcast x 1). Prints a JSON list of
{"collective", "bytes", "us", "busbw"} (the median of --repeats timings) on stdout.

Run with Debian's /usr/bin/python3 (python3-torch). gloo has no reduce_scatter in
this torch, so that collective is absent from its rows.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bus_factor(collective: str, n: int) -> float:
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n}.get(collective, 1.0)


def worker(rank: int, world: int, port: int, sizes: list, repeats: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for collective in ("allreduce", "allgather", "broadcast"):
        for size in sizes:
            count = max(1, size // 4)
            if collective == "allgather":
                count = max(1, count // world)
                x = torch.ones(count)
                outs = [torch.empty(count) for _ in range(world)]
                call = lambda: dist.all_gather(outs, x)  # noqa: E731
                full = count * world * 4
            else:
                x = torch.ones(count)
                call = (lambda: dist.all_reduce(x)) if collective == "allreduce" else (lambda: dist.broadcast(x, 0))
                full = count * 4
            call()
            budget = 0.3 if size >= 64 << 20 else 0.05
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                once = time.perf_counter() - t0
                t = torch.tensor([once], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                iters = int(min(20000, max(1, budget / max(t.item(), 1e-7))))
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    call()
                t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(t.item())
            per_call = statistics.median(times)
            rows.append({"collective": collective, "bytes": full, "us": per_call * 1e6,
                         "busbw": full / per_call * bus_factor(collective, world) / 1e9})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,4096,1048576,8388608,33554432",
                        help="bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    import tempfile
    import torch.multiprocessing as mp
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gloo.json")
        mp.spawn(worker, args=(args.ranks, free_port(), sizes, args.repeats, out), nprocs=args.ranks)
        with open(out) as f:
            json.dump(json.load(f), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
