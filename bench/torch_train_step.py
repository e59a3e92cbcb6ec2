#!/usr/bin/python3
"""PyTorch eager baseline for bench/train_bench.cpp: one SGD training step, samples/s.

    /usr/bin/python3 bench/torch_train_step.py [--hidden N]... [--batch N] [--repeats N] [--min-time S]

The same step as train_bench (zero_grad, forward, cross-entropy, backward, SGD with
momentum 0.9, lr 0.05) on the same model (64-H-H-10 with ReLU, PyTorch's default
initialisation, which troupe's Linear copies), batch, data (16 batches of inputs
uniform in [0, 1) and labels uniform in 0..9, cycled) and thread count (1), timed the
same way (20 warm-up steps, the last 10 sizing a repeat to about --min-time; median
of --repeats repeats in process CPU time), printing the same JSON. Keep the two in
step; train_bench.cpp's header says why they are two programs.

zero_grad(set_to_none=True) is spelled out: it is troupe's default and PyTorch's
from 2.0 on, but Debian's PyTorch 1.13 defaults to zeroing the gradients in place.

Exits with status 3 when torch cannot be imported, so that bench/run can report the
baseline as skipped rather than failed.
"""
import argparse
import json
import os
import statistics
import sys
import time

# One thread, as train_bench. torch.set_num_threads(1) (below) covers OpenMP and
# torch's own kernels, but Debian's torch does its matrix products in OpenBLAS,
# whose thread pool (one thread per core) it leaves alone: on the 2-core machine this
# was written on that pool spun a second thread during the 64-512-512-10 step. Its
# size can only be set before the library loads, hence here, before `import torch`.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

try:
    import torch
except ImportError as e:
    print(f"torch_train_step.py: cannot import torch ({e}); on Debian: apt install python3-torch",
          file=sys.stderr)
    sys.exit(3)

INPUTS, CLASSES = 64, 10
BATCHES, WARMUP_STEPS = 16, 20
LR, MOMENTUM = 0.05, 0.9


def time_model(hidden: int, batch: int, repeats: int, min_time: float) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUTS, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = [(torch.rand(batch, INPUTS), torch.randint(0, CLASSES, (batch,))) for _ in range(BATCHES)]

    steps = 0
    loss = None

    def step():
        nonlocal steps, loss
        inputs, labels = batches[steps % BATCHES]
        steps += 1
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()

    for _ in range(WARMUP_STEPS // 2):
        step()
    start = time.process_time()
    for _ in range(WARMUP_STEPS - WARMUP_STEPS // 2):
        step()
    per_step = (time.process_time() - start) / (WARMUP_STEPS - WARMUP_STEPS // 2)

    steps_per_repeat = max(10, int(min_time / max(per_step, 1e-9)))
    rates = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(steps_per_repeat):
            step()
        rates.append(batch * steps_per_repeat / (time.process_time() - start))
    samples_per_s = statistics.median_low(rates)
    return {"model": f"{INPUTS}-{hidden}-{hidden}-{CLASSES}", "batch": batch,
            "samples_per_s": round(samples_per_s, 1), "step_us": round(1e6 * batch / samples_per_s, 2),
            "repeats": [round(r, 1) for r in rates], "steps_per_repeat": steps_per_repeat,
            "loss": loss.item(), "torch": torch.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, action="append", help="hidden width (repeatable; default 256 and 512)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repeat")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [time_model(h, args.batch, args.repeats, args.min_time) for h in (args.hidden or [256, 512])]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
