"""The toy training job of tests/supervisor/toy_trainer.cpp, in PyTorch, for torchrun's
restart to be timed next to troupe-run's (bench/supervisor_restart.py).

Each step sleeps STEP_MS, then all-reduces one int64 over gloo; rank 0 saves
(step, value) to $CKPT_DIR/torch-step.txt every SAVE_EVERY steps and a launch resumes
from it. TROUPE_FAULT-like: rank FAULT_RANK kills itself with SIGKILL at FAULT_STEP on
the first launch (TORCHELASTIC_RESTART_COUNT=0). Rank 0 prints the time of its first
step, and the faulting rank the time of the fault, in toy_trainer's format.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    steps, save_every, step_ms = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    fault_rank, fault_step = int(sys.argv[4]), int(sys.argv[5])
    ckpt = os.environ["CKPT_DIR"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    state = torch.tensor([0, 1], dtype=torch.int64)
    path = os.path.join(ckpt, "torch-step.txt")
    if rank == 0 and os.path.exists(path):
        state = torch.tensor([int(x) for x in open(path).read().split()], dtype=torch.int64)
    dist.broadcast(state, 0)
    start, value = int(state[0]), int(state[1])
    for step in range(start, steps):
        if rank == 0 and step == start:
            print(f"toy_trainer: first step {step} at t={time.time():.6f} ({dist.get_world_size()} ranks)", flush=True)
        if restart == 0 and rank == fault_rank and step == fault_step:
            print(f"troupe fault: crash on rank {rank} at step {step} (pid {os.getpid()}, t={time.time():.6f})",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(step_ms / 1000)
        contribution = torch.tensor([value + rank + step], dtype=torch.int64)
        dist.all_reduce(contribution)
        value = (value * 31 + int(contribution[0])) % 1000003
        if rank == 0 and (step + 1) % save_every == 0:
            with open(path + ".tmp", "w") as f:
                f.write(f"{step + 1} {value}\n")
            os.replace(path + ".tmp", path)
    dist.barrier()
    if rank == 0:
        print(f"toy_trainer: finished {steps} steps, value {value}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
