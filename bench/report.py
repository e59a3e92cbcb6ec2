#!/usr/bin/env python3
"""Regenerates docs/BENCHMARKS.md from every bench/results/<area>.json.

bench/run calls this after each run; run it alone (bench/report.py) after editing or
copying in a results file. Each results file is a list of rows in the schema of
"Benchmarks" in DESIGN.md: case, unit, better, troupe, baseline, baseline_value, ratio
(troupe / baseline), target, met, machine, date; bench/run adds quick (a --quick run,
or a row the area always times briefly), commit and dirty (`git rev-parse HEAD` and
whether the tree had changes then), dirty_sources ({path: blob} of the area's own
sources that differed from that commit), baseline_missing where a baseline could not
run, and for_information on a target shown but not counted. Standard library and git
only; without git nothing is flagged stale.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Areas in the order the document lists them; any other results file follows, by name.
AREA_ORDER = ["tensor", "train", "gpt", "sharding", "parallel", "gpu", "gpu-gpt", "actors", "collectives", "checkpoint", "supervisor",
              "trace", "cluster", "chaos"]

# The sources each area measures: its libraries, the ones they build on where the timed
# path runs, and its bench programs and baseline scripts (not bench/run, report.py or
# the area drivers that only pick targets). An area whose results were measured before
# the last change to any of these is flagged stale.
_LIB = ["core/", "tensor/", "mpi/"]
# The CPU areas never call the CUDA backend (tensor/src/cuda/, the .cu kernels, the
# switches of cuda_math.hpp): a change there makes only the gpu areas stale.
_NOT_CUDA = [":(exclude)tensor/src/cuda/", ":(exclude,glob)**/*.cu", ":(exclude,glob)**/*.cuh",
             ":(exclude)tensor/include/troupe/tensor/cuda_math.hpp",
             ":(exclude,glob)collectives/src/nccl_*",  # the NCCL backend: GPU programs only
             # the staged backend and what it shares with NCCL: CUDA buffers only
             ":(exclude,glob)collectives/src/staged_*", ":(exclude,glob)collectives/src/reissue.*",
             ":(exclude)collectives/include/troupe/collectives/staged_communicator.hpp"]
# The tensor, collectives and checkpoint areas never run the layers' math (activation
# gradients, the loss, LayerNorm, attention's softmax, the Adam step): a change there
# leaves them current.
_NOT_NN_MATH = [":(exclude)tensor/src/nn_ops.cpp", ":(exclude)tensor/src/math_loops.cpp",
                ":(exclude)tensor/src/math_loops.hpp"]
# The data-parallel areas (DDP, ZeRO, FSDP and the programs on them) build no pipeline
# and split no layer: parallel/'s pipeline and tensor-parallel sources leave them current.
_DATA_PARALLEL = ["parallel/", ":(exclude,glob)parallel/**/pipeline*", ":(exclude,glob)parallel/**/tensor_parallel*",
                  ":(exclude,glob)parallel/**/sequence_parallel*"]
# Commits whose source changes were checked to leave the machine code of what the CPU
# areas run as it was (objdump -d of the libraries and programs they touch, built before
# and after, identical): they make no area stale. Full hash -> what changed, how checked.
SAME_CODE = {
    "84beefaa15d89e7ae2829cf4e7ca330b2ffafe48":
        "actors' call.hpp: the over-aligned Call's delete calls the unsized aligned delete (for clang); "
        "libtroupe_actors, libtroupe_checkpoint_actor, train_gpt, ping_pong, actors_scale identical",
}
AREA_PATHS = {
    "tensor": ["core/", "tensor/", "bench/tensor_bench.cpp", *_NOT_NN_MATH],
    "train": [*_LIB, "nn/", "collectives/", "train/", *_DATA_PARALLEL, "bench/train_bench.cpp", "bench/ddp_bench.cpp",
              "bench/torch_train_step.py", "bench/torch_ddp.py"],
    "gpt": [*_LIB, "nn/", "collectives/", "train/", *_DATA_PARALLEL, "checkpoint/", "examples/train_gpt.cpp",
            "examples/char_corpus", "bench/gpt_bench.cpp", "bench/random_ids.hpp", "bench/torch_gpt_step.py",
            "tools/torch_gpt.py", "tests/nn/gpt_parity_test.py"],
    "sharding": [*_LIB, "nn/", "collectives/", "train/", *_DATA_PARALLEL, "checkpoint/", "bench/sharding_bench.cpp",
                 "bench/torch_zero.py"],
    "parallel": [*_LIB, "nn/", "collectives/", "parallel/", "bench/gpt_bench.cpp", "bench/mesh_bench.cpp",
                 "bench/random_ids.hpp", "bench/torch_gpt_step.py", "tools/torch_gpt.py"],
    "gpu": [*_LIB, "nn/", "collectives/", "train/", *_DATA_PARALLEL, "bench/gpu_bench.cpp", "bench/torch_gpu_step.py"],
    "gpu-gpt": [*_LIB, "nn/", "train/", *_DATA_PARALLEL, "bench/gpu_gpt_bench.cpp", "bench/torch_gpu_gpt.py",
                "bench/gpu_gpt_table.py", "tools/torch_gpt.py"],
    "actors": ["core/", "mpi/", "actors/", "bench/actors_bench.cpp", "bench/actors_objects.cpp",
               "bench/actors_bench_rows.hpp", "bench/caf_bench.cpp"],
    "collectives": [*_LIB, "collectives/", "bench/collectives_bench.cpp", "bench/torch_collectives.py", *_NOT_NN_MATH],
    "checkpoint": [*_LIB, "actors/", "checkpoint/", "bench/checkpoint_bench.cpp", "bench/checkpoint_parallel_bench.cpp",
                   "bench/checkpoint_state.hpp", "bench/checkpoint_baselines.py", *_NOT_NN_MATH],
    "supervisor": ["core/", "mpi/", "supervisor/", "tests/supervisor/", "bench/supervisor_bench.cpp",
                   "bench/supervisor_restart.py", "bench/torch_restart_job.py"],
    "cluster": ["core/", "mpi/", "actors/", "collectives/", "supervisor/", "tests/supervisor/",
                "tests/actors/scale_main.cpp", "scripts/cluster", "bench/cluster_area.py",
                "bench/collectives_bench.cpp", "bench/torch_restart_job.py"],
}
AREA_PATHS["trace"] = [*_LIB, "nn/", "collectives/", "parallel/", "actors/", "train/", "checkpoint/",
                       "examples/train_gpt.cpp", "examples/train_gpt_flags.cpp", "examples/char_corpus"]
AREA_PATHS["chaos"] = ["core/", "mpi/", "actors/", "collectives/", "checkpoint/", "train/", "supervisor/",
                       "examples/train_digits.cpp", "scripts/cluster", "scripts/chaos", "tests/storage_fault/"]
for _area, _paths in AREA_PATHS.items():
    if not _area.startswith("gpu"):
        _paths += _NOT_CUDA

# What a reader needs to know to read an area's table: how work is counted and where
# a target comes from. Kept here, beside the table, rather than in each program.
AREA_NOTES = {
    "parallel": """\
Issue 51's parallelisms. Activation checkpointing (`GPT::checkpoint_blocks(1)`: every
block keeps only its input in forward and recomputes in backward what its backward
reads, all but the MLP's last product) on the gpt
area's `small` model and step, one thread: `bench/gpt_bench.cpp --checkpoint-every 1`
against the same program with 0. Peak activation memory is the most host memory
(`tensor::host_memory_stats`) one step holds beyond what was live before it (parameters,
gradients, AdamW state; the previous step's caches released), on a step after warm-up.
Step time and tokens/s as in the gpt area. The PyTorch row runs nanoGPT's model
(`bench/torch_gpt_step.py --checkpoint-every 1`) with every block under
`torch.utils.checkpoint(use_reentrant=False)`. 3 rounds alternate which troupe run goes
first; each row shows the round with its median ratio. Targets: issue 51's (<= 0.4x
memory, <= 1.35x step time).

Tensor and pipeline parallelism: `bench/mesh_bench.cpp` under mpirun, the world being
the tp group or the pp group: train_gpt's default-preset model (4 layers, 4 heads,
C = 128, T = 128, 89 characters) at batch 16, dropout 0, train_gpt's step (clipping,
AdamW; the vocabulary-parallel cross-entropy under tp, 8 micro-batches under pp, each
stage keeping its in-flight micro-batches' activations, nothing recomputed), one
thread per rank. Step time in wall time (the ranks wait for each other), the lower
median of 5 repeats of 4 steps after 3 warm-up steps; time waiting in collectives from
the communicator's own count; a stage's idle fraction is 1 - its compute time / the
step's wall time, the mean over stages and a repeat's steps, the lower median of the
repeats; the state per rank from the tensors (parameters, gradients, AdamW moments;
under pp the largest stage's, a gradient counted for every parameter, the first stage's
tied table included, which the last stage steps); the memory a step holds beyond the
state (activations in flight, outputs still being sent, gradients being made), the
worst stage's, measured as in the activation-checkpointing rows. tp 1 and tp 2 take
turns for 3 rounds, and so do pp 2's gpipe, 1f1b, interleaved and zero-bubble; each
shows its median round. The others run once, and 4 ranks share 2 cores, so their times
and idle fractions are for the record only (their memory is exact). Interleaved (2
stages a rank, v = 2) cuts the 4 blocks one a stage; zero-bubble (ZB-H1: 1F1B with the
weights' gradients put off to fill the waits) is held to 1F1B's theory. Targets: issue
51's (state <= 1.1/k of one rank's; idle within 1.1x of the schedule's (p - 1) /
(m + p - 1), (p - 1) / (v m + p - 1) interleaved); the step times have none (the issue
asks for the ratio and the collective time). 1F1B's memory target is ours: a stage
keeps at most p micro-batches of 1/p of the model, so 1.1/m of one rank's at the whole
batch, as Megatron-LM's schedule promises; so is zero-bubble's idle below 1F1B's
theory, which is what the schedule is for.""",
    "gpt": """\
One training step of troupe's GPT (`nn::GPT`, nanoGPT's shape: GELU tanh, tied
lm_head, dropout 0) on the CPU: `zero_grad`, forward, cross-entropy over (B, T, V),
backward, clipping at 1.0, AdamW (0.9/0.95, decay 0.1 on matrices), on 4 batches of
random character ids (V = 65) cycled. `small` is nanoGPT's shakespeare_char model
(6 layers, 6 heads, C = 384, T = 256) at batch 4; `tiny` is 2 layers, 4 heads,
C = 128, T = 64 at batch 16. troupe's `bench/gpt_bench.cpp` against PyTorch eager
running nanoGPT's own model code (`bench/torch_gpt_step.py`, the model of
`tests/nn/gpt_parity_test.py`, which checks the two agree to 1e-6 per layer;
Debian's torch 1.13 has no fused attention, so its attention is the explicit masked
softmax).

- One thread on both sides, as the train area. tokens/s = B × T × steps / process
  CPU time, the median of 3 repeats of about 3 s after 4 warm-up steps. Separate
  processes started by `bench/run` one after the other; each round runs both, taking
  turns at going first, and the round with the median ratio is shown.
- Target: issue 24's ">= 1.2x PyTorch eager at 1 rank", judged on the rows marked
  `OPENBLAS_CORETYPE unset`. Some of these machines' environments pin OpenBLAS to its
  AVX2 (Haswell) kernels; PyTorch does its products in that OpenBLAS, troupe in its
  own AVX-512 kernel. Where the variable is set the area runs twice: as the
  environment is (rows marked `=Haswell`, shown for information) and with the variable
  removed for both commands, OpenBLAS's own choice for this CPU, which the baseline
  column names (it read the name from the OpenBLAS that torch loaded).
- `examples/train_gpt` end to end under mpirun: the final validation loss of its
  presets (first 90% of Moby-Dick's characters train, the rest validate) against a
  unigram model of the training text (targets: quick <= 2.0, default <= 1.60 nats per
  character), and its tokens/s (training time only, the median of its evaluation
  chunks after the first) at 1 and 2 ranks and in every sharding mode at 2 ranks
  (targets: 2 ranks >= 1.7x 1 rank, every mode >= 0.8x ddp). 1 rank and ddp at 2
  take turns for 3 rounds and each shows its median; the other modes run once. The
  default preset runs only without `--quick`.""",
    "cluster": """\
Issue 21's figures, across the 3 nodes of the virtual cluster (`scripts/cluster`: a
network + UTS namespace a node on one bridge, on this 2-core machine), from
`bench/cluster_area.py`. The job is the toy of tests/supervisor (20 ms steps, an int64
all-reduce a step, a save every 5 steps), one rank a node, and its PyTorch twin under
torchrun; a node is killed with `scripts/cluster kill` once step 40 is saved, and
"first resumed step" is the wall-clock time the relaunched rank 0 prints, minus the
time of the kill. Every job, troupe's and its baseline's, is a job of its own started
by `bench/run` on the same cluster: 3 runs of one, then 3 of the other, the median of
each. "Node killed" relaunches on the same 3 nodes (troupe-run, or a shell loop
rerunning mpirun when it exits); "node lost for good" goes on with 2 ranks
(troupe-run `--exclude-after 1 --min-ranks 2`, torchrun `--nnodes 2:3` with a c10d
rendezvous on node1 and an agent a node). "Link down" cuts node3's link (no FIN) and
heals it once troupe-run reports the failure. "Node back" runs train_digits (troupe-run
grows back after a checkpoint of troupe's own, which the toy does not write): node3 is
lost, the job shrinks to 2 ranks, the link heals, and the times run from the heal to
the probe's answer and to the first step on 3 ranks (`--regrow --probe-interval 1`).
"Slow node" holds node3 to 10% of a core under train_digits with batches of 384 and
times the straggler report from the throttle. The control plane rows run 16, 32 and 64
ranks oversubscribed on the 2 cores (tests/actors/scale_main.cpp); the allreduce and
allgather rows are one 3-node job of `collectives_bench --quick` (one round; marked
quick), troupe next to the direct MPI call in the same job.""",
    "chaos": """\
Issue 49's campaign, from `scripts/chaos` (docs/CLUSTER.md, "A chaos campaign"): one train_digits
job, a rank on each of the virtual cluster's 3 nodes, under troupe-run (`--backoff 0`),
takes a seeded random mix of faults one at a time -- kill -9 of a rank, kill of a node,
a link cut healed after 0.5-3 s, a slow node, a failing read while the next launch
resumes (the storage-fault shim), a full disk for a while, SIGTERM to troupe-run and a
new troupe-run on the same folder -- and must end with the parameter hash of a run that
never failed, its last checkpoint in place and no process left on any node. Recovery
of a fault runs from its injection to troupe-run's next resume event (or the new
troupe-run's first step), or, when the job went on without a relaunch, to the next
checkpoint written after the fault was lifted. There is no baseline: the figures are
counts and times against the issue's targets.""",
    "gpu": """\
Issue 11's figures on one NVIDIA GPU, from `scripts/gpu-check` on the GPU machine
(not `bench/run`: this machine has no GPU), which runs `bench/gpu_bench.cpp` and its
baseline `bench/torch_gpu_step.py` as separate processes, one after the other, in
alternating rounds (3 unless `TROUPE_GPU_ROUNDS` says otherwise; the last run had 3),
and pairs them with `bench/gpu_table.py` into `bench/results/gpu.json`: each figure,
troupe's and PyTorch's alike, is the median of its own rounds.

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
  synchronisations (troupe) or CUDA events (PyTorch); the median repeat. troupe's
  figures move by under 10% between rounds and machines; PyTorch's bf16 steps move
  more (the 25M MLP's: 1.17-2.33 ms on machines of the same kind), so troupe's bf16
  ratio has ranged 0.35-0.88x across runs and versions. The f32 ratios held at
  0.84-0.96x (H100 and H200) before the bias epilogue below, 0.77-0.89x since (H200).
- The target (issue 11) is PyTorch eager's default step. Against PyTorch's fused Adam,
  troupe's f32 step was 1.01-1.17x slower until troupe's f32 Linears added their bias
  in cuBLASLt's epilogue, as PyTorch's do; since then it is 0.91-0.98x (its bf16 step
  0.40-0.47x). troupe's Adam is one launch for the whole model too (the list form).""",
    "gpu-gpt": """\
Issues 24 and 54's GPU figures, from `scripts/gpu-check` on the GPU machine:
`bench/gpu_gpt_bench.cpp` and its baseline `bench/torch_gpu_gpt.py` run as separate
processes, alternately for 3 rounds; `bench/gpu_gpt_table.py` pairs them. Each figure
is the median of its runs; each row keeps every timing window and the driver, CUDA,
cuBLAS (troupe's from the toolkit, PyTorch's from its wheel) and cuDNN versions.

- Attention: causal forward + backward on GPT-2 small's shapes (T = 1024, 12 heads of
  64) from one [B, T, 3C] qkv tensor, against `scaled_dot_product_attention`: flash in
  bf16 (target <= 1.1x); in f32 torch's choice (memory-efficient, 3xTF32 as troupe's
  f32 kernel). Windows of 100 calls, the median of 3.
- Step: GPT-2 small (tied head, dropout 0) at B 8 and B 32 (64 with
  `TROUPE_GPU_GPT_BATCHES`): zero_grad, forward, cross-entropy, backward, clipping at
  1.0, AdamW (decay on matrices); 3 windows of 3 steps after 3 warm-up steps. Eager rows
  (issue 24, <= 1.0x): V = 50,257 on both sides, torch's foreach AdamW. nanoGPT's
  settings (issue 54, <= 1.0x): V padded to 50,304 on both sides (ids stay below
  50,257), `torch.compile` of the model with the loss inside, fused AdamW. nanoGPT turns
  TF32 on in every run; here it is its own flag: strict f32 and bf16 rows run without
  it, the TF32 rows (`gpu_gpt_bench --tf32`) against torch's `allow_tf32` (matmul, cuDNN).
- tokens/s = B T / step time. MFU is nanoGPT's `estimate_mfu` (6 N + 12 L H Q T FLOPs a
  token, N without the position table) over the H100/H200 SXM dense peak of the row's
  arithmetic: bf16 989.4, TF32 494.7, strict f32 66.9 TFLOP/s.
- Same work: `gpu_gpt_bench --same-work` writes its initial f32 weights and 10 batches
  (B 8) to HDF5 and trains 10 steps; `torch_gpu_gpt.py --same-work` loads them
  (`load_state_dict(strict=True)`) and trains the same steps with its settings. A row is
  the largest |loss_troupe - loss_torch| / |loss_torch| in parts per million: <= 100
  (1e-4) strict f32, <= 5,000 TF32, <= 20,000 bf16. `bench/gpu_gpt_same_work_test.py` checks it on the CPU.
- bf16 differs between the sides. troupe's bf16 model keeps parameters, gradients,
  activations, the residual stream and the logits in bf16, with f32 masters and f32
  AdamW state (`parallel::MasterWeights`); LayerNorm statistics in double, attention
  accumulating in f32. Its cross-entropy reads the bf16 logits, sums each row in f32,
  keeps the log-sum-exp and the mean in double and rounds the loss to bf16 (0.0625
  steps near 11). torch's autocast keeps f32 weights and AdamW state, runs the linear
  layers (lm_head too) and attention in bf16, and LayerNorm, softmax and cross-entropy
  (on the bf16 logits, upcast) in f32; its residual stream stays f32.
- `gpu_gpt_bench --breakdown` times each phase of troupe's step, `--ops` each kind of
  layer alone (`torch_gpu_gpt.py --ops` the same in PyTorch).""",
    "actors": """\
Issue 4's runtime (`bench/actors_bench.cpp`) on 2 ranks, one `mpirun` job over shared
memory (`--mca btl self,vader`) and one over TCP (`--mca btl self,tcp`), each case next
to raw MPI in the same processes. The "within a rank" rows are against CAF
(`bench/caf_bench.cpp`, Debian's libcaf-dev), a process of its own that `bench/run`
starts after the two jobs.

- Threads per rank: the main thread (the caller, which drives MPI progress itself
  while it waits on a future), the progress thread, one pool thread
  (`RuntimeOptions::threads`, default 1) and the liveness thread, which sleeps
  between heartbeats; so at most three threads can run at once on this 2-core
  machine, and none spins while idle: an idle rank's receiving thread sleeps on a
  doorbell that a message from a rank of its node rings (`actors/src/doorbell.hpp`).
  CAF runs 2 scheduler threads plus its `scoped_actor` caller.
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
- Tasks (issue 52): `map<&noop>` of 100,000 ints with 1,000 in flight, placed over
  both ranks by load (median of 5); CAF's figure is requests to a round-robin
  `actor_pool` of two stateless actors from an event-based driver, 1,000 in flight,
  in one process (`caf_bench`). troupe/CAF ranged 0.57-1.08 in the runs before
  2026-11-30's cache-line change and 0.70-1.32 in four runs after it: the troupe
  side is two MPI processes on these two busy vCPUs, CAF's one.
- Cancel: an ask queued behind a 20 ms call, from `cancel()` to `Cancelled` at the
  asker (median of 40). The 20 ms call holds the rank's receiving thread, so a
  pool thread stands in, asleep on its doorbell after 2 ms without a message, and is
  woken for the cancel. The baseline is an ask in that same state: to another actor
  of the busy rank, 2 ms after the last message, in the same loop, the two going
  first by turns; an ask to the idle actor in the same loop is a second, untargeted
  row. Before 2026-12-01 that idle ask was the baseline (35-290 us across runs,
  since the rank's threads may all be asleep); the cancel was 2.6-3.1x it.
- Control group: `ping()` in a "control" concurrency group asked 500 times while a
  100 s `nap()` runs in the default group, against the same 500 asks with the actor
  idle (medians).
- Object references (`actors_bench --objects`, a third job of 3 ranks over shared
  memory): an actor on rank 1 holds a ready 64 MB `Bytes`; driven by rank 0, it goes
  to the actor on rank 2 through an `ObjectRef` (`ask_ref`, then rank 2 fetches from
  rank 1), and fetched by the driver and sent on; the baseline is one raw MPI transfer
  from rank 1 to rank 2 in the same job, started and acknowledged by rank 0, its
  receive buffer reused (the raw transfer itself took 9.7-16.8 ms across runs). Each of
  7 rounds times the raw transfer, then both actor paths; medians of the 7. The
  driver's peak RSS growth (VmHWM after `clear_refs`) is the worst round of each path.
- Idle CPU: process CPU time over 1 s of a runtime with nothing to do, worst rank.
- These VMs are noisy, and the small-message rows swing most: the 8 B ask over shared
  memory took 1.98-4.05 us in six runs within two hours (raw MPI 0.51-1.16 us),
  and the standalone loop behind it 1.77 us median over 20 alternated runs at a
  quiet moment, 2.1-3.9 us at a busy one. Raw MPI's blocking ping-pongs ran at
  1.86 M/s in the run of 2026-11-29 and at 0.81 M/s in that of 2026-11-30.""",
    "collectives": """\
Issue 5's communicator (`bench/collectives_bench.cpp`, nccl-tests' algbw and busbw) on 2
ranks, over shared memory (`--mca btl self,vader`: troupe's shared-memory path) and
over TCP (`--mca btl self,tcp`: troupe's ring for allreduce and reduce_scatter of 1 MB
and more, MPI's own calls otherwise), one `mpirun` job a transport, each call next to
the same MPI call made directly in the same processes. Each size: 5 rounds alternating
troupe and MPI, about 0.05 s of calls each (0.3 s from 64 MB); the round with the
median ratio is shown. The "vs gloo" rows: PyTorch's gloo (`bench/torch_collectives.py`,
Debian's python3-torch) is a separate python3 process that `bench/run` starts after the
two jobs, with 2 ranks of its own over loopback TCP, each size the median of 5 timings,
against troupe's shared-memory figure from the first job.

- The two vCPUs of these VMs sit either in one cache complex or in two, as the
  hypervisor moves them every few seconds (a cache-line round trip of about 110 ns vs
  530 ns; `build/bench/core_placement_probe` shows which, a line a second). In the
  second placement a plain copy into memory the other core has read runs 2-5 GB/s
  instead of 10-20; the slot writer (`collectives/src/slot_writer.hpp`) switches to
  streaming stores there, which keeps the 8 MB allreduce at 1.71-2.12x MPI and the
  8 MB broadcast at 2.31-3.29x in that placement. Which placement a run met moves
  the shared-memory rows from one run to the next.
- Small blocking calls (<= 4 KB) over shared memory make no MPI call: their data
  rides in the signature board's entries (docs/COLLECTIVES.md), one cache-line write
  and one read per peer. A broadcast's root publishes and returns, as MPI's eager
  root does, and compares its peers' entries in batches of up to 8, so a loop of
  broadcasts is pipelined on both sides.
- Over TCP the runs swing by up to 2x from one to the next (loopback TCP on two busy
  cores: sys time is most of the CPU), so a single row there says little.
- "signature check" rows: the same call on two communicators, one with
  `check_signatures` on (the default) and one with it off, alternating in rounds as
  above. Over shared memory the check is the signature board (a store before the call,
  a read of each peer's line after it), and a small call with the check on carries its
  data on the board too, so it is compared with MPI's own call there; over TCP, a
  non-blocking all-reduce beside the call, which costs a second round trip on small
  calls (docs/COLLECTIVES.md).""",
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
  rounds: expect noise of 10-20% on a quiet machine, more on a shared one. Every mode
  is next to troupe's DDP job run just before it on the same model and ranks; zero1
  also next to PyTorch's ZeRO-1 (`bench/torch_zero.py`: Debian's python3-torch,
  `DistributedDataParallel` + `torch.distributed.optim.ZeroRedundancyOptimizer` over
  AdamW, gloo, one thread), an `mpirun` job of its own right after troupe's four.
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
    "checkpoint": """\
Checkpoint save and load of ~100 f32 tensors of mixed sizes, ~300 MB (median of 5
rounds) and ~1 GB (3 rounds), in a temporary folder on this machine's disk; every save
is fsync'd, every load is from a cold cache (`posix_fadvise(DONTNEED)` after fsync).

- Save, load, async stall, memory: `bench/checkpoint_bench.cpp` times troupe and its
  raw-disk baselines in the same process, on the same tensors, taking turns at going
  first each round: `write(2)` + fsync of the same bytes to one file rewritten, and to
  a new file each round with the previous one kept; `read(2)` of the raw file, cold.
  A save (keep_last 1) returns once the new checkpoint is durable and `latest` names
  it; the previous checkpoint is deleted on a thread after that
  (docs/CHECKPOINT_FORMAT.md), which the bench waits for, untimed, before the next
  figure, as it deletes the raw baseline's previous file untimed. h5py, torch.save and
  the rewritten raw file truncate the old file inside their timing.
- h5py and torch.save/torch.load: `bench/checkpoint_baselines.py`, a separate python3
  process that `bench/run` starts right after, on the same tensor sizes in the same
  folder, as many rounds; then `dd conv=fsync` of the same bytes, once.
- Parallel save: `bench/checkpoint_parallel_bench.cpp`, one `mpirun -np 2` job timing the
  parallel save next to the gathered save and the raw writes, in turns each round.
- The inspector: `troupe-ckpt ls` and `h5ls -r` on one ~5 MB checkpoint that
  `checkpoint_bench --keep 1` leaves, 7 runs each, alternating, the median wall time
  and peak RSS (`wait4`) of each; warm cache. Targets (issue 50): within 2x h5ls's time,
  under 40 MB.
- Targets: save >= 0.8x a raw write+fsync of a rewritten file, >= 0.9x one of a new
  file (what a save that keeps the previous checkpoint writes) and >= 1.0x h5py and
  torch.save. The disk's write+fsync rate bounds any format, and h5py and torch.save
  write the same bytes to the same disk, so a fixed margin over them (1.4x was asked)
  holds only while they run well below the disk's rate.""",
    "trace": """\
What a timeline (`--trace`) costs a training job: `train_gpt --preset quick` at 2 ranks
(ddp), 100 steps, tokens/s as the median of its four progress chunks after the first
(steps 21-100). Three ways, each a job of its own, taking turns over 5 rounds (the
median of each): without `--trace`; with `--trace` and a window past the run's end,
so the tracer is attached to every communicator, the model wrappers and the runtime
but never records; and recording steps 21-100 (about 40 spans a step), written to
trace.json at step 100.""",
    "supervisor": """\
Recovery from a dead rank under troupe-run, 2 ranks on this machine, from
`bench/supervisor_restart.py`. The job is the toy of tests/supervisor (20 ms steps, an
int64 all-reduce a step, a save every 5 steps); rank 1 kills itself at step 23 and the
job resumes from step 20. It
runs under troupe-run, under a plain `mpirun` relaunched as soon as it exits, and as
its PyTorch twin (`bench/torch_restart_job.py`) under torchrun: each a job of its own,
5 runs of one and then 5 of the next, the median of each. Each job prints the
wall-clock time of the fault and of its first resumed step, so all three are timed
the same way; troupe-run's events log splits its part into detection, teardown and
relaunch. The train_digits row times the main example the same way (fault to
troupe-run's `resume` event), with no baseline. The heartbeat rows come from
`bench/supervisor_bench.cpp`, one process: CPU time with and without a client
heartbeating, the per-step report calls, and a step timed with and without them.""",
    "tensor": """\
One thread for troupe and for OpenBLAS alike (`set_num_threads(1)`); each case and its
baseline run in the same process (`bench/tensor_bench.cpp`, Google Benchmark), on the
same buffers, back to back for 0.1 s each. 5 rounds, each a run of the program; the
round with the median ratio is shown.

- `matmul MxNxK`: C[M,N] = op(A)[M,K] op(B)[K,N] through `matmul_out`, against
  `cblas_sgemm` called directly with the same arguments; GFLOP/s = 2·M·N·K / time.
  `fc in->out batch B` rows are the three products of one linear layer: forward
  `x Wᵀ`, the weight gradient `gyᵀ x` and the input gradient `gy W`. Each result is
  checked once to match cblas's to 1e-5 of its largest element before it is timed.
- On a CPU with AVX-512, as this one, troupe's side is its own AVX-512 kernel
  (`tensor/src/host_gemm.hpp`); elsewhere it is the same cblas call plus argument
  checks. Some of these machines' environments set `OPENBLAS_CORETYPE=Haswell`, which
  runs the baseline on OpenBLAS's AVX2 kernels; there the products run twice: as the
  environment is (rows marked `=Haswell`, shown for information) and with the
  variable removed for that command alone, where OpenBLAS picks its own kernels for
  this CPU. The baseline column names the kernels each ran (`openblas_get_corename`).
  The EPYC VMs these runs get differ: with the same Cooperlake kernels, OpenBLAS's
  1024³ product has run at 182 GFLOP/s on one and 100 on another, troupe's alike, so
  compare ratios across runs, not rates.
- Target: "our wrappers should cost under 5% over the library they wrap at sizes
  >= 256", read as troupe >= 0.95x OpenBLAS wherever M·N·K >= 256³, judged on the
  `unset` rows; smaller products are shown without a target.
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
- The products: PyTorch's run in OpenBLAS (on AVX2 kernels where the environment sets
  `OPENBLAS_CORETYPE=Haswell`, else OpenBLAS's own choice); troupe's f32 products run
  its own AVX-512 kernel (the tensor area's matmul rows).
- samples/s = 64 × steps / process CPU time, the median of 5 repeats of about 0.2 s
  after 20 warm-up steps, timed the same way in both programs. They are separate
  processes, started by `bench/run` one after the other: each of 5 rounds runs both,
  taking turns at going first, and the round with the median ratio is shown.
- Target: issue 6 asks one rank to reach ">= 1.0x PyTorch's samples/s (plain, no
  DDP)"; the ratio is shown against that line on 64-512-512-10 for information and
  not counted as met or missed yet.
- DDP rows: `bench/ddp_bench.cpp` and `bench/torch_ddp.py` (PyTorch plain at 1 rank,
  DDP over gloo at 2), each an `mpirun` job of its own at 1 and at 2 ranks, taking
  turns at going first; of 5 rounds, the one with the median 2-rank troupe/PyTorch
  ratio gives all of a model's rows. "vs troupe 1 rank" divides that round's 2-rank
  troupe job by its 1-rank one; the ceiling row runs two 1-rank troupe jobs at once.
  "All-reduce hidden" comes from the 2-rank troupe job alone: 1 - (the time a step
  waits for its all-reduces after backward) / (the same buckets all-reduced alone).""",
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


# ---- verdicts: what a row says about its target ----

def baseline_missing(r: dict) -> bool:
    """A baseline that could not run (PyTorch or CAF not installed, a failed job):
    bench/run says so in baseline_missing; a row with a target to judge and neither a
    baseline value nor a verdict is read the same way."""
    if r.get("baseline_missing"):
        return True
    return r.get("baseline_value") is None and r.get("met") is None and bool(r.get("target")) \
        and not r.get("for_information")


def counted(r: dict) -> bool:
    """Whether a row counts towards "N of M targets met": every row with a verdict, and
    every row with a target whose baseline is missing (as not met), except targets set
    for information."""
    if r.get("for_information"):
        return False
    return r.get("met") is not None or (baseline_missing(r) and bool(r.get("target")))


def is_met(r: dict) -> bool:
    return counted(r) and not baseline_missing(r) and r.get("met") is True


def ratio(r: dict) -> str:
    if baseline_missing(r):
        return "baseline missing"
    if r.get("ratio") is None:
        return "—"
    # Three decimals, so a ratio just under a 0.95 threshold never prints as 0.95.
    return f"{r['ratio']:.3f}"


def met(r: dict) -> str:
    if not counted(r):
        return ""
    return "yes" if is_met(r) else "**no**"


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
            value(r.get("troupe"), unit) + (" (quick)" if r.get("quick") else ""),
            cell(r.get("baseline", "")),
            value(r.get("baseline_value"), unit),
            ratio(r),
            cell(r.get("target") or ""),
            met(r),
        ]) + " |")
    return lines


def counts(rows: list[dict]) -> tuple[int, int]:
    """(targets met, targets counted)."""
    judged = [r for r in rows if counted(r)]
    return sum(is_met(r) for r in judged), len(judged)


def summary(rows: list[dict]) -> str:
    met_n, total = counts(rows)
    if not total:
        return f"{len(rows)} cases, none with a target."
    text = f"{len(rows)} cases; {met_n} of {total} targets met."
    names = [r["case"] for r in rows]

    def name(r: dict) -> str:  # a case timed against several baselines names the one missed
        text = f"`{r['case']}`" + (f" vs {r.get('baseline')}" if names.count(r["case"]) > 1 else "")
        return text + (" (baseline missing)" if baseline_missing(r) else "")
    missed = [name(r) for r in rows if counted(r) and not is_met(r)]
    if missed:
        text += " Missed: " + ", ".join(missed) + "."
    quick = sum(bool(r.get("quick")) for r in rows)
    if quick:
        text += (" All rows come from a `--quick` run (fewer, shorter rounds): not figures to quote."
                 if quick == len(rows) else f" {quick} rows, marked (quick), are timed in a single short round.")
    return text


# ---- staleness: results older than the code they measure ----

def git(root: Path, *args: str) -> str | None:
    """git's output in `root`, or None where git is missing or fails."""
    try:
        p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def pathspecs(paths: list[str]) -> list[str]:
    # Build files are left out: the libraries' CMakeLists.txt change with install and
    # packaging rules, and the flags that matter are set at the top level for everything.
    return ["--", *paths, ":(exclude,glob)**/CMakeLists.txt"]


def provenance(root: Path, area: str, area_paths: dict[str, list[str]] | None = None) -> dict:
    """What bench/run stamps on an area's rows: the commit measured, whether the tree
    had changes, and the blob of each of the area's own sources that differed from the
    commit (None: deleted), so that committing exactly what was measured later does
    not make the results stale. Empty without git."""
    head = git(root, "rev-parse", "HEAD")
    if not head:
        return {}
    out: dict = {"commit": head, "dirty": bool(git(root, "status", "--porcelain"))}
    paths = (AREA_PATHS if area_paths is None else area_paths).get(area)
    if out["dirty"] and paths:
        changed = (git(root, "diff", "--name-only", "HEAD", *pathspecs(paths)) or "").splitlines()
        changed += (git(root, "ls-files", "--others", "--exclude-standard", *pathspecs(paths)) or "").splitlines()
        dirty = {}
        for f in sorted(set(filter(None, changed))):
            dirty[f] = git(root, "hash-object", "--", f) if (root / f).exists() else None
        if dirty:
            out["dirty_sources"] = dirty
    return out


def _short(commit: str) -> str:
    return commit[:7]


def _touched(paths: list[str], files: list[str]) -> str:
    """The area's path entries that hold the changed files: 'supervisor/, tests/supervisor/'."""
    hit = [p for p in paths if any(f == p or (p.endswith("/") and f.startswith(p)) for f in files)]
    return ", ".join(f"`{p}`" for p in hit or files)


def _changed_since(root: Path, commit: str, paths: list[str], dirty: dict) -> tuple[list[str], list[str]]:
    """(files of the area changed in commits after `commit`, files measured with
    uncommitted changes that HEAD does not have), leaving out a file whose committed
    content is what was measured."""
    diff = git(root, "diff", "--name-only", commit, "HEAD", *pathspecs(paths))
    if diff is None:
        return [], []
    since = []
    for f in filter(None, diff.splitlines()):
        if f in dirty and dirty[f] == git(root, "rev-parse", "-q", "--verify", f"HEAD:{f}"):
            continue  # measured with this change before it was committed
        touched = set((git(root, "log", "--format=%H", f"{commit}..HEAD", "--", f) or "").split())
        if touched and touched <= SAME_CODE.keys():
            continue  # changed only by commits that left the machine code as it was
        since.append(f)
    uncommitted = [f for f, blob in dirty.items() if f not in diff.splitlines()
                   and blob != git(root, "rev-parse", "-q", "--verify", f"HEAD:{f}")]
    return since, uncommitted


def freshness(root: Path | None, area: str, rows: list[dict],
              area_paths: dict[str, list[str]] | None = None) -> str | None:
    """A line flagging an area whose results are older than the code they measure, or
    whose commit is unknown; None when they are current, or git cannot tell."""
    if root is None or not rows or git(root, "rev-parse", "-q", "--verify", "HEAD") is None:
        return None
    paths = (AREA_PATHS if area_paths is None else area_paths).get(area)
    commit = next((r["commit"] for r in rows if r.get("commit")), None)
    if commit is None:
        # Not recorded: the commit that first committed this run's rows bounds it.
        date = max(str(r.get("date", "")) for r in rows)
        found = git(root, "log", "--reverse", "--format=%H", f"-S{date}", "--",
                    f"bench/results/{area}.json") if date else None
        bound = found.splitlines()[0] if found else None
        if not bound or not paths:
            return "**Measured at an unknown commit.**"
        since, _ = _changed_since(root, bound, paths, {})
        where = f"measured at an unknown commit, no later than {_short(bound)} (which committed these results)"
        if since:
            newest = git(root, "log", "-1", "--format=%H", f"{bound}..HEAD", "--", *since) or ""
            return f"**Stale:** {where}; {_touched(paths, since)} changed since, last in {_short(newest)}."
        return f"**{where[0].upper()}{where[1:]}**; its sources have not changed since."
    if git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return f"**Stale:** measured at {_short(commit)}, a commit this repository does not have."
    if not paths:
        return None
    dirty = next((r["dirty_sources"] for r in rows if r.get("dirty_sources")), {})
    since, uncommitted = _changed_since(root, commit, paths, dirty)
    parts = []
    if since:
        newest = git(root, "log", "-1", "--format=%H", f"{commit}..HEAD", "--", *since) or ""
        parts.append(f"{_touched(paths, since)} changed since, last in {_short(newest)}")
    if uncommitted:
        parts.append(f"measured with uncommitted changes to {', '.join(f'`{f}`' for f in uncommitted)} "
                     "that HEAD does not have")
    if not parts:
        return None
    return f"**Stale:** measured at {_short(commit)}; " + "; ".join(parts) + "."


def measured_at(rows: list[dict]) -> str:
    commit = next((r["commit"] for r in rows if r.get("commit")), None)
    if commit is None:
        return ""
    return f" Commit: {_short(commit)}" + (" with uncommitted changes." if any(r.get("dirty") for r in rows) else ".")


# ---- the document ----

def render(results: dict[str, list[dict]], root: Path | None = None,
           area_paths: dict[str, list[str]] | None = None) -> str:
    """The markdown for `results` (area -> rows); `root`, a git checkout, lets it flag
    stale areas."""
    flags = {area: freshness(root, area, rows, area_paths) for area, rows in results.items()}
    out = [
        "# Benchmarks",
        "",
        "Generated by `bench/report.py` from `bench/results/*.json`; do not edit by hand.",
        "",
        "Re-run everything with `bench/run` (builds what it needs in `build/`, Release), or",
        "one area with `bench/run tensor`. `bench/run --quick tensor` is a smoke test with",
        "fewer and shorter rounds; its rows are marked (quick) and are not figures to quote.",
        "Each area's run replaces its `bench/results/<area>.json`, stamped with the commit it",
        "measured; this file is rebuilt from all of them.",
        "",
        "Every troupe figure stands next to its baseline, measured on the same machine in the",
        "same run (`bench/run`; gpu: `scripts/gpu-check`), but not always in the same process.",
        "Baselines in C or raw MPI (OpenBLAS, `memcpy`, direct MPI calls, raw disk writes and",
        "reads, a CUDA copy) run in troupe's own process or MPI job, on the same data.",
        "PyTorch, h5py, CAF, torchrun and a plain mpirun, and troupe's own runs at another",
        "rank count or mode, are processes or jobs of their own, run one after the other with",
        "troupe's. Each area's note says which, and how its rounds are paired. `ratio` is",
        "troupe / baseline: above 1 is troupe ahead where higher is better (rates), below 1",
        "where lower is better (times). Figures depend on the machine and on whatever else",
        "it is doing; compare ratios rather than absolute numbers across machines.",
        "",
        "A target whose baseline could not run (e.g. PyTorch not installed) shows \"baseline",
        "missing\" and counts as not met. An area is flagged **Stale** when the sources it",
        "measures (libraries, bench programs, baseline scripts) changed after the commit it",
        "was measured at, or the commit was not recorded. A commit checked to leave the",
        "machine code as it was (`SAME_CODE` in bench/report.py) stales nothing.",
    ]
    if not results:
        out += ["", "No results yet: run `bench/run`."]
        return "\n".join(out) + "\n"
    met_all = total_all = 0
    overview = ["", "| area | targets met | run | flag |", "|---|---:|---|---|"]
    for area, rows in results.items():
        met_n, total = counts(rows)
        met_all, total_all = met_all + met_n, total_all + total
        flag = flags[area] or ""
        short_flag = ("stale" if flag.startswith("**Stale") else "unknown commit" if flag else "")
        if any(r.get("quick") for r in rows):
            short_flag = ", ".join(filter(None, [short_flag, "quick rows"]))
        dates = ", ".join(sorted({str(r.get("date", "?")) for r in rows}))
        overview.append(f"| [{area}](#{area}) | {met_n} of {total} | {dates} | {short_flag} |")
    out += ["", f"**{met_all} of {total_all} targets met** across the areas:"] + overview
    for area, rows in results.items():
        machines = sorted({r.get("machine", "?") for r in rows})
        dates = sorted({r.get("date", "?") for r in rows})
        out += ["", f"## {area}", ""]
        if flags[area]:
            out += [flags[area], ""]
        out += [f"Machine: {'; '.join(machines)}. Run: {', '.join(dates)}.{measured_at(rows)} {summary(rows)}"]
        if area in AREA_NOTES:
            out += ["", AREA_NOTES[area]]
        out += [""] + table(rows)
    return "\n".join(out) + "\n"


def write(root: Path) -> Path:
    path = root / "docs" / "BENCHMARKS.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(load(root), root))
    return path


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print(f"bench/report.py: wrote {write(root).relative_to(root)}", file=sys.stderr)
