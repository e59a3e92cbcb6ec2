#!/usr/bin/env python3
"""The same-work check's plumbing on the CPU (issue 54 item 2): gpu_gpt_bench writes a
tiny GPT's initial weights and batches, trains 10 steps from them and prints its
losses; bench/torch_gpu_gpt.py loads the same file into nanoGPT's model and trains the
same steps; bench/gpu_gpt_table.py's same_work_rows must find every pair within its
tolerance (1e-4 relative in strict f32, 2e-2 in bf16), each side with 10 losses. Once at the real
vocabulary (65) and once padded to a multiple of 64 (128).

    python3 bench/gpu_gpt_same_work_test.py GPU_GPT_BENCH_BINARY
Exits 77 (skipped) when torch or h5py is missing, 1 on a failure, naming it.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import h5py  # noqa: F401  (torch_gpu_gpt.py reads the file with it)
    import torch  # noqa: F401
except ImportError as e:  # python3-torch / python3-h5py not installed
    print(f"SKIP: {e}")
    sys.exit(77)

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gpu_gpt_table import same_work_rows  # noqa: E402

STEPS = 10


def run(what, command, failures):
    """The JSON list a program prints, or None (and a failure) when it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        failures.append(f"{what}: timed out after 600 s: {' '.join(command)}")
        return None
    if done.returncode != 0:
        failures.append(f"{what}: exit {done.returncode}: {' '.join(command)}\n{done.stderr.strip()[-2000:]}")
        return None
    try:
        rows = json.loads(done.stdout)
    except ValueError as e:
        failures.append(f"{what}: stdout is not JSON ({e}):\n{done.stdout[-2000:]}")
        return None
    return rows


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    failures = []
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for pad in ([], ["--vocab-pad", "64"]):
            common = ["--device", "cpu", "--model", "tiny", "--same-work", tmp, "--precision", "f32",
                      "--precision", "bf16", "--batch", "4", *pad]
            name = f"vocab pad {pad[1] if pad else 'none'}"
            mine = run(f"gpu_gpt_bench ({name})", [binary, *common], failures)
            if mine is None:
                continue
            base = run(f"torch_gpu_gpt.py ({name})", [sys.executable, str(BENCH / "torch_gpu_gpt.py"), *common],
                       failures)
            if base is None:
                continue
            ours += mine
            theirs += base
    rows = same_work_rows(ours, theirs)
    for r in rows:
        print(f"{r['case']}: {r['troupe']} ppm (target {r['target']}, "
              f"{'met' if r['met'] else 'NOT met'})")
        print(f"  troupe {r['troupe_losses']}\n  torch  {r['baseline_losses']}")
        if not r["met"]:
            failures.append(f"{r['case']}: {r.get('problem') or str(r['troupe']) + ' ppm'} "
                            f"against {r['baseline']}, target {r['target']}")
        for side in ("troupe_losses", "baseline_losses"):
            if r[side] is None or len(r[side]) != STEPS:
                failures.append(f"{r['case']}: {side} has {len(r[side]) if r[side] else 0} losses, want {STEPS}")
    if len(rows) != 4:
        failures.append(f"want 4 same-work rows (f32 and bf16 at vocab 65 and 128), got {len(rows)}: "
                        f"{[r['case'] for r in rows]}")
    for line in failures:
        print("FAIL:", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
