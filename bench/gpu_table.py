#!/usr/bin/env python3
"""Pairs gpu_bench's JSON with torch_gpu_step.py's and prints issue 11's table.

    python3 bench/gpu_table.py --troupe GPU_BENCH_JSON... --torch TORCH_JSON... [--json ROWS] [--raw ALL]

Rows: fused Adam over 100M f32 against the device-to-device copy of the same run
(target >= 0.70 of its bytes per second); each model and precision's training step,
troupe (plain, and DDP over NCCL at one rank) against PyTorch eager with its default
Adam (foreach) and with fused=True (target: troupe plain <= 1.0x PyTorch eager's
default). Given several rounds (each program run once per round, alternately), every
figure is the median over rounds: the GPU machine is shared and PyTorch's launch-bound
steps move by up to 2x between runs. A table on stdout; --json writes the rows in bench/results' schema
(bench/results/gpu.json, which bench/report.py turns into docs/BENCHMARKS.md's gpu
section), --raw both programs' own output. Exits 1 if an input is missing or broken.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import report  # bench/report.py, next to this script


def median(values):
    return statistics.median_low(values)


# One result per case, its figures the median over rounds (the rounds' values kept).
def merge_troupe(rounds):
    adam = {k: median([r["adam_100m"][k] for r in rounds]) for k in rounds[0]["adam_100m"]}
    steps = []
    for i, step in enumerate(rounds[0]["steps"]):
        values = [r["steps"][i]["step_ms"] for r in rounds]
        steps.append({**step, "step_ms": median(values), "rounds_ms": values})
    return {"adam_100m": adam, "steps": steps}


def merge_torch(rounds):
    out = []
    for i, case in enumerate(rounds[0]):
        values = [r[i]["step_ms"] for r in rounds]
        out.append({**case, "step_ms": median(values), "rounds_ms": values})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--troupe", nargs="+", required=True)
    parser.add_argument("--torch", nargs="+", required=True)
    parser.add_argument("--json", help="the rows, in bench/results' schema")
    parser.add_argument("--raw", help="both programs' own JSON")
    args = parser.parse_args()
    try:
        troupe_rounds = [json.load(open(f)) for f in args.troupe]
        torch_rounds = [json.load(open(f)) for f in args.torch]
    except (OSError, ValueError) as e:
        print(f"gpu_table.py: {e}", file=sys.stderr)
        return 1
    troupe, torch = merge_troupe(troupe_rounds), merge_torch(torch_rounds)

    device = torch[0]["device"] if torch else "?"
    stamp = {"machine": f"{device}, PyTorch {torch[0]['torch']}" if torch else device,
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             # The commit measured, for report.py's stale flag: git's, or where this tree was
             # copied without its .git, TROUPE_BENCH_COMMIT as the caller sets it.
             **(report.provenance(Path(__file__).resolve().parent.parent, "gpu")
                or ({"commit": os.environ["TROUPE_BENCH_COMMIT"]} if os.environ.get("TROUPE_BENCH_COMMIT") else {}))}
    rows = []  # bench/results schema (DESIGN.md "Benchmarks")

    def add(case, unit, better, value, baseline, baseline_value, target, met):
        rows.append({"case": case, "unit": unit, "better": better, "troupe": round(value, 4), "baseline": baseline,
                     "baseline_value": round(baseline_value, 4), "ratio": round(value / baseline_value, 3),
                     "target": target, "met": met, **stamp})

    adam = troupe["adam_100m"]
    ratio = adam["adam_GBps"] / adam["copy_GBps"]
    add("fused Adam, 100M f32 params (28 B/element)", "GB/s", "higher", adam["adam_GBps"],
        "device-to-device copy of 100M f32 (8 B/element), same run", adam["copy_GBps"], ">= 0.70x the copy",
        ratio >= 0.70)
    for step in troupe["steps"]:
        base = {t["optimizer"]: t for t in torch if t["model"] == step["model"] and t["precision"] == step["precision"]}
        precision = ("bf16 (troupe: bf16 model + f32 master weights; PyTorch: autocast)"
                     if step["precision"] == "bf16" else "f32")
        wrapper = "DDP over NCCL, 1 rank" if step["wrapper"] == "ddp-nccl" else "plain"
        case = f"{step['model']} train step, batch {step['batch']}, {precision}, {wrapper}"
        eager, fused = base.get("adam foreach"), base.get("adam fused")
        if eager:
            r = step["step_ms"] / eager["step_ms"]
            add(case, "ms", "lower", step["step_ms"], f"PyTorch eager, Adam (foreach, its default)", eager["step_ms"],
                "<= 1.0x" if wrapper == "plain" else "", r <= 1.0 if wrapper == "plain" else None)
        if fused and wrapper == "plain":
            add(case, "ms", "lower", step["step_ms"], "PyTorch eager, Adam(fused=True)", fused["step_ms"], "", None)

    print(f"Device: {stamp['machine']}; median of {len(troupe_rounds)} round(s)")
    print()
    print("| case | troupe | baseline | ratio | target | met |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        print(f"| {r['case']} | {r['troupe']:g} {r['unit']} | {r['baseline']}: {r['baseline_value']:g} | "
              f"{r['ratio']:.2f}x | {r['target']} | {met} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        if args.raw:
            with open(args.raw, "w") as f:
                json.dump({"troupe_rounds": troupe_rounds, "torch_rounds": torch_rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
