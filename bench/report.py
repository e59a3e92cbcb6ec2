#!/usr/bin/env python3
"""Regenerates docs/BENCHMARKS.md from every bench/results/<area>.json.

bench/run calls this after each run; run it alone (bench/report.py) after editing or
copying in a results file. Each results file is a list of rows in the schema of
"Benchmarks" in DESIGN.md: case, unit, better, troupe, baseline, baseline_value, ratio
(troupe / baseline), target, met, machine, date. Standard library only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# Areas in the order the document lists them; any other results file follows, by name.
AREA_ORDER = ["tensor", "train", "sharding", "gpu", "actors", "collectives", "checkpoint", "supervisor", "cluster"]

# What a reader needs to know to read an area's table: how work is counted and where
# a target comes from. Kept here, beside the table, rather than in each program.
AREA_NOTES = {
    "cluster": """\
Issue 21's figures, across the 3 nodes of the virtual cluster (`scripts/cluster`: a
network + UTS namespace a node on one bridge, on this 2-core machine), from
`bench/cluster_area.py`. The job is the toy of tests/supervisor (20 ms steps, an int64
all-reduce a step, a save every 5 steps), one rank a node, and its PyTorch twin under
torchrun; a node is killed with `scripts/cluster kill` once step 40 is saved, and
"first resumed step" is the wall-clock time the relaunched rank 0 prints, minus the
time of the kill. Median of 3 runs of each, troupe's and the baseline's one after the
other in the same bench run. "Node killed" relaunches on the same 3 nodes (troupe-run,
or a shell loop rerunning mpirun when it exits); "node lost for good" goes on with 2
ranks (troupe-run `--exclude-after 1 --min-ranks 2`, torchrun `--nnodes 2:3` with a c10d
rendezvous on node1 and an agent a node). "Link down" cuts node3's link (no FIN) and
heals it once troupe-run reports the failure. "Node back" runs train_digits (troupe-run
grows back after a checkpoint of troupe's own, which the toy does not write): node3 is
lost, the job shrinks to 2 ranks, the link heals, and the times run from the heal to
the probe's answer and to the first step on 3 ranks (`--regrow --probe-interval 1`).
"Slow node" holds node3 to 10% of a core under train_digits with batches of 384 and
times the straggler report from the throttle. The control plane rows run 16, 32 and 64
ranks oversubscribed on the 2 cores (tests/actors/scale_main.cpp); the allreduce and
allgather rows are one round (`collectives_bench --quick`) across the nodes.""",
    "gpu": """\
Issue 11's figures on one NVIDIA GPU, from `scripts/gpu-check` on the GPU machine
(not `bench/run`: this machine has no GPU), which runs `bench/gpu_bench.cpp` and its
baseline `bench/torch_gpu_step.py` one after the other and pairs them with
`bench/gpu_table.py` into `bench/results/gpu.json`.

- Fused Adam: one kernel over 100M f32 parameters, counted as 28 bytes an element
  (reads param, grad, exp_avg, exp_avg_sq; writes three back), against a
  device-to-device copy of 100M f32 in the same process (8 bytes an element); the
  median of 9 timings of 5 calls, between device synchronisations.
- Training step: zero_grad, forward, cross-entropy, backward, Adam (lr 1e-3) at batch
  256 on the 25M MLP 1024-4096-4096-1024 and the 67M MLP of 16 Linear(2048, 2048),
  ReLU between, 8 resident batches of random data. troupe's nn on CUDA, plain and
  inside DDP over an NCCL communicator of one rank; PyTorch eager with the same model,
  with its default Adam (foreach, the issue's baseline) and with fused=True. f32 is
  plain f32 on both sides (TF32 off); bf16 is a bf16 model stepping f32 master
  weights in troupe and autocast (f32 weights cast per product) in PyTorch. 20
  warm-up steps, then 5 repeats of 20 steps, each timed between device
  synchronisations (troupe) or CUDA events (PyTorch); the median repeat. gpu-check
  runs the two programs alternately for 3 rounds and reports the median round. troupe's
  figures moved by under 10% between rounds and machines; PyTorch's bf16 steps moved
  more: the 25M MLP's took 1.83-2.24 ms in this run's rounds, and 1.17-1.19 ms in
  every round of the run before, on another machine of the same kind (1.27 and
  2.33 ms in two earlier single runs), so troupe's bf16 ratio was 0.53x here and 0.88x
  there. The f32 ratios held: 0.87-0.96x in every run.
- The target (issue 11) is PyTorch eager's default step. Against PyTorch's fused
  Adam, troupe's f32 step is 1.16-1.17x slower (its bf16 step was 0.70-1.08x across
  runs). troupe's Adam is one launch for the whole model too (the list form). Adam is not the gap (troupe's fused
  Adam moves bytes as fast as a copy); the step was not profiled, and the likely
  difference is the rest of the step: PyTorch fuses each Linear's bias into cuBLAS's
  epilogue, where troupe adds it in a kernel of its own, and sums the bias gradient
  and zero-fills fresh gradients in separate kernels too.""",
    "actors": """\
Issue 4's runtime (`bench/actors_bench.cpp`) on 2 ranks, over shared memory (`--mca
btl self,vader`) and over TCP (`--mca btl self,tcp`), each next to raw MPI in the same
job; the in-process baseline is CAF (`bench/caf_bench.cpp`, Debian's libcaf-dev).

- Threads per rank: the main thread (the caller, which drives MPI progress itself
  while it waits on a future), the progress thread, one pool thread
  (`RuntimeOptions::threads`, default 1) and the liveness thread, which sleeps
  between heartbeats; so at most three threads can run at once on this 2-core
  machine, and none spins while idle. CAF runs 2 scheduler threads plus its
  `scoped_actor` caller.
- Ask round trip: `ask(&Echo::echo, Bytes)` then `get()` in a loop, the payload
  travelling both ways (as `troupe::Bytes`: inline up to 4 KB, within the message's
  MPI message up to 256 KB, as messages of their own above); raw MPI is an
  `MPI_Send`/`MPI_Recv` ping-pong of the same bytes. 20,000 asks per round up to
  1 KB, 2,000 at 64 KB, 200 at 1 MB and 40 at 16 MB; the median of 5 rounds, each
  after a barrier, alternating with the raw ping-pong.
- Asks per second: 10,000 `ask().get()` in a row (blocking) and `when_all` of 1,000
  asks at a time (pipelined); tells: 200,000 tells of an int, then one ask, whose
  answer proves every tell handled (per-sender order).
- Restart: an actor with `max_restarts` set throws `FatalError`; timed at the caller
  from the failing ask's start to the answer of the next ask, which the re-created
  actor serves (median of 50): an upper bound on "failure to first answer".
- Idle CPU: process CPU time over 1 s of a runtime with nothing to do, worst rank.
- These VMs are noisy, and the small-message rows swing most: the 8 B ask over shared
  memory took 1.98-4.05 us in six runs within two hours (raw MPI 0.51-1.16 us),
  and the standalone loop behind it 1.77 us median over 20 alternated runs at a
  quiet moment, 2.1-3.9 us at a busy one.""",
    "collectives": """\
Issue 5's communicator (`bench/collectives_bench.cpp`, nccl-tests' algbw and busbw) on 2
ranks, over shared memory (`--mca btl self,vader`: troupe's shared-memory path) and
over TCP (`--mca btl self,tcp`: troupe's ring for allreduce and reduce_scatter of 1 MB
and more, MPI's own calls otherwise), each call next to the same MPI call made directly
in the same job, and PyTorch's gloo (`bench/torch_collectives.py`, Debian's
python3-torch) in the same run. Each size: 5 rounds alternating troupe and MPI, about
0.05 s of calls each (0.3 s from 64 MB); the round with the median ratio is shown.

- The two vCPUs of these VMs sit either in one cache complex or in two, as the
  hypervisor moves them every few seconds (a cache-line round trip of about 110 ns vs
  530 ns; `build/bench/core_placement_probe` shows which, a line a second). In the
  second placement a plain copy into memory the other core has read runs 2-5 GB/s
  instead of 10-20, and before the slot writer (`collectives/src/slot_writer.hpp`)
  every shared-memory allgather and broadcast ran at 0.2-0.7x MPI while it lasted. The writer now switches to
  streaming stores there; alternated with the old build and the placement probed
  before each run, in the second placement the 8 MB allreduce went from 0.56-0.66x
  to 1.71-2.12x MPI and the 8 MB broadcast from 0.48-0.59x to 2.31-3.29x, with no
  loss in the first (2 MB allgather 0.86-1.03x with the writer, 0.76-1.08x without,
  8 alternations); DDP's gradient allreduces (`ddp_bench --model large`) took
  11.2-12.4 ms with it and 11.2-12.0 ms without, and 18.8 vs 51.3 ms in the second
  placement.
- Small calls (<= 4 KB) take 1.0-1.3x MPI's time: troupe's front end (argument
  checks, the sequence number under a lock, the backend's dispatch, the watchdog's
  two stores) adds 40-120 ns per call in these runs, on MPI calls of 0.10-0.48 us.
- Over TCP the runs swing by up to 2x from one to the next (loopback TCP on two busy
  cores: sys time is most of the CPU), so a single row there says little.""",
    "sharding": """\
Issue 10's sharding modes (`bench/sharding_bench.cpp`, one mode per `mpirun` job) on
its two models, the 25M MLP 1024-4096-4096-1024 and the 67M MLP of 16 Linear(2048,
2048), ReLU between, cross-entropy, AdamW (lr 1e-3), batch 32 per rank on random
data, one compute thread per rank, 25 MB buckets; zero2 and fsdp are
`FullyShardedDataParallel` with each Linear a unit (`shard_grad_op` and `full_shard`,
as the worker group's modes; backward prefetch `backward_post`, the default). At 1,
2 and 4 ranks, oversubscribed where the machine has fewer cores, so at 4 ranks on 2
cores each rank gets half a core: read the 4-rank figures as ratios only.

- samples/s = 32 x ranks / the median step (each step timed between barriers, after
  one warm-up step); a step of the 67M model at 4 ranks takes seconds here, so each
  job times only 5 steps (25M) or 2 (67M) and the area runs once instead of in 5
  rounds: expect noise of 10-20% on a quiet machine, more on a shared one. Every mode is next to troupe's DDP run just
  before it on the same model and ranks; zero1 also next to PyTorch's ZeRO-1
  (`bench/torch_zero.py`: Debian's python3-torch, `DistributedDataParallel` +
  `torch.distributed.optim.ZeroRedundancyOptimizer` over AdamW, gloo, one thread).
- Model state per rank: parameters + gradients + optimizer state, summed from the
  bytes of the live tensors each mode holds (the wrappers' own accessors: DDP's
  gradient buckets, `OSS::local_state_bytes`, FSDP's `parameter_bytes` -- zero2's full
  parameters, fsdp's shards -- and shard accessors), after a backward with the
  optimizer state allocated, largest over ranks; next to the ZeRO formula for Adam in
  f32 (DDP 16N, zero1 8N + 8N/W, zero2 4N + 12N/W, fsdp 16N/W). fsdp's peak in a step
  adds the most gathered parameters and full gradients that existed at once
  (`FsdpStats::peak_gathered_bytes`), against the issue's "16N/W, plus one unit's
  gathered parameters and the bucket": the largest Linear's parameters and, as many
  bytes again, its flat gradient (the bucket it reduce-scatters), which its backward
  needs at once. zero1 partitions whole parameters (OSS), so on the 25M MLP, one of
  whose tensors is 2/3 of the model, it cannot reach its formula (no target); zero2
  and fsdp split every unit element by element.
- Peak RSS: VmHWM, reset through `/proc/self/clear_refs` once the wrapper is built
  (so it covers training, not building the full model before fsdp shards it),
  largest over ranks; PyTorch's the same way.
- Save: fsdp at 4 ranks writes the 67M model's full state dict and AdamW's full
  optimizer state through `checkpoint::ParallelCheckpoint` from each rank's
  `local_model_slices`/`local_optimizer_slices` (no gathering); the peak RSS growth
  during `save()` (VmHWM reset just before, minus VmRSS then) on the worst rank,
  against the issue's bound: the rank's shard (the bytes of its slices) + the
  largest tensor + 64 MB, checked on every rank.""",
    "tensor": """\
One thread for troupe and for OpenBLAS alike (`set_num_threads(1)`); each case and its
baseline run in the same process, on the same buffers.

- `matmul MxNxK`: C[M,N] = op(A)[M,K] op(B)[K,N] through `matmul_out`, against
  `cblas_sgemm` called directly with the same arguments; GFLOP/s = 2·M·N·K / time.
  `fc in->out batch B` rows are the three products of one linear layer: forward
  `x Wᵀ`, the weight gradient `gyᵀ x` and the input gradient `gy W`. Each result is
  checked once to equal cblas's bit for bit before it is timed. As troupe's side is
  that same call plus argument checks, the spread of these ratios around 1.0, most
  of all for the small products, is the noise of the machine during the run.
- Target: "our wrappers should cost under 5% over the library they wrap at sizes
  >= 256", read as troupe >= 0.95x OpenBLAS wherever M·N·K >= 256³; smaller products
  are shown without a target.
- Elementwise and casts: GB/s = (bytes read + bytes written) / time, for f32 tensors
  of the size shown (a cast's size is its f32 side); the baseline is `memcpy` moving
  as many bytes, i.e. the streaming ceiling, not a competing implementation, so these
  ratios are for information. `add` returns a new tensor, so its figure includes
  allocating (and first touching) the result; `add_`, `axpy_` and `scale_` work in
  place, and can beat `memcpy`, which reads the source and also has to fetch each
  destination line before writing it. Casts are `dst.copy_(src)` into a preallocated
  tensor; f32 <-> f16/bf16 run troupe's AVX2 loops on a CPU that has AVX2 and its
  SSE2 ones elsewhere (one binary, picked at run time).""",
    "train": """\
One full training step of the digits MLP, `zero_grad`, forward, cross-entropy,
backward and SGD (lr 0.05, momentum 0.9), at batch 64, on random inputs in [0, 1)
and random labels (16 batches, cycled): troupe's nn module (`bench/train_bench.cpp`)
against PyTorch eager on the identical model, batch, optimizer and data
(`bench/torch_train_step.py`, Debian's python3-torch). Both zero gradients by
dropping them (`set_to_none=True`).

- One thread on both sides: `troupe::tensor::set_num_threads(1)`, which also pins
  OpenBLAS; `torch.set_num_threads(1)` plus `OPENBLAS_NUM_THREADS=1`, as Debian's
  PyTorch does its matrix products in the same OpenBLAS and leaves its pool alone.
- samples/s = 64 × steps / process CPU time, the median of 5 repeats of about 0.2 s
  after 20 warm-up steps, timed the same way in both programs. They are separate
  processes, so each round runs both, taking turns at going first, and the round
  with the median ratio is shown.
- Target: issue 6 asks one rank to reach ">= 1.0x PyTorch's samples/s (plain, no
  DDP)"; the ratio is shown against that line on 64-512-512-10 for information and
  not counted as met or missed yet.""",
}


def load(root: Path) -> dict[str, list[dict]]:
    results = {}
    for path in sorted((root / "bench" / "results").glob("*.json")):
        try:
            rows = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SystemExit(f"bench/report.py: {path}: not valid JSON: {e}")
        if not isinstance(rows, list):
            raise SystemExit(f"bench/report.py: {path}: want a list of rows, got {type(rows).__name__}")
        results[path.stem] = rows
    order = {name: i for i, name in enumerate(AREA_ORDER)}
    return dict(sorted(results.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def number(v: float | None) -> str:
    """Three significant figures or so: 104 / 38.9 / 0.71."""
    if v is None:
        return "—"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def ratio(r: dict) -> str:
    if r.get("ratio") is None:
        return "—"
    # Three decimals, so a ratio just under a 0.95 threshold never prints as 0.95.
    return f"{r['ratio']:.3f}"


def met(r: dict) -> str:
    return {True: "yes", False: "**no**"}.get(r.get("met"), "")


def cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def value(v: float | None, unit: str) -> str:
    """'104 GB/s', or a bare '—' for a value that is missing (a baseline that was skipped)."""
    return "—" if v is None else f"{number(v)} {unit}"


def table(rows: list[dict]) -> list[str]:
    lines = ["| case | troupe | baseline | baseline value | ratio | target | met |",
             "|---|---:|---|---:|---:|---|---|"]
    for r in rows:
        unit = r.get("unit", "")
        lines.append("| " + " | ".join([
            cell(r["case"]),
            value(r.get("troupe"), unit),
            cell(r.get("baseline", "")),
            value(r.get("baseline_value"), unit),
            ratio(r),
            cell(r.get("target") or ""),
            met(r),
        ]) + " |")
    return lines


def summary(rows: list[dict]) -> str:
    with_target = [r for r in rows if r.get("met") is not None]
    if not with_target:
        return f"{len(rows)} cases, none with a target."
    missed = [r["case"] for r in with_target if not r["met"]]
    text = f"{len(rows)} cases; {len(with_target) - len(missed)} of {len(with_target)} targets met."
    if missed:
        text += " Missed: " + ", ".join(f"`{c}`" for c in missed) + "."
    return text


def render(results: dict[str, list[dict]]) -> str:
    out = [
        "# Benchmarks",
        "",
        "Generated by `bench/report.py` from `bench/results/*.json`; do not edit by hand.",
        "",
        "Re-run everything with `bench/run` (builds what it needs in `build/`, Release), or",
        "one area with `bench/run tensor`; `bench/run --quick tensor` is a smoke test that",
        "times each case once, briefly. A full run times each case and its baseline back",
        "to back in 5 rounds and reports the round whose ratio is the median. Each area's",
        "run replaces its `bench/results/<area>.json`; this file is rebuilt from all of them.",
        "",
        "Every troupe figure stands next to its baseline, measured in the same process.",
        "`ratio` is troupe / baseline: above 1 is troupe ahead where higher is better",
        "(rates), below 1 where lower is better (times). Figures depend on the machine and",
        "on whatever else it is doing; compare ratios rather than absolute numbers across",
        "machines.",
    ]
    if not results:
        out += ["", "No results yet: run `bench/run`."]
    for area, rows in results.items():
        machines = sorted({r.get("machine", "?") for r in rows})
        dates = sorted({r.get("date", "?") for r in rows})
        out += ["", f"## {area}", "",
                f"Machine: {'; '.join(machines)}. Run: {', '.join(dates)}. {summary(rows)}"]
        if area in AREA_NOTES:
            out += ["", AREA_NOTES[area]]
        out += [""] + table(rows)
    return "\n".join(out) + "\n"


def write(root: Path) -> Path:
    path = root / "docs" / "BENCHMARKS.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(load(root)))
    return path


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print(f"bench/report.py: wrote {write(root).relative_to(root)}", file=sys.stderr)
