#!/usr/bin/env python3
"""Pairs gpu_gpt_bench's JSON with torch_gpu_gpt.py's: issue 24's GPU table.

    python3 bench/gpu_gpt_table.py --troupe JSON... --torch JSON... [--json ROWS]

One row per case and precision, each figure the median over the rounds given (each
program run once per round, alternately). Targets (issue 24): attention forward +
backward <= 1.25x torch's flash scaled_dot_product_attention (bf16: flash takes no f32,
so the f32 row is shown against the backend torch picks, without a target); the
GPT-2-small step <= 1.0x PyTorch eager, f32 and bf16. A table on stdout; --json writes
the rows in bench/results' schema (bench/results/gpu-gpt.json). Exits 1 if an input is
missing or broken.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import report  # bench/report.py, next to this script


def merged(rounds):
    """{(case, precision): row with ms = the median over rounds, rounds_ms kept}."""
    out = {}
    for row in rounds[0]:
        key = (row["case"], row["precision"])
        values = [r["ms"] for rnd in rounds for r in rnd if (r["case"], r["precision"]) == key]
        out[key] = {**row, "ms": statistics.median_low(values), "rounds_ms": values}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--troupe", nargs="+", required=True)
    parser.add_argument("--torch", nargs="+", required=True)
    parser.add_argument("--json", help="the rows, in bench/results' schema")
    args = parser.parse_args()
    try:
        ours = merged([json.load(open(f)) for f in args.troupe])
        theirs = merged([json.load(open(f)) for f in args.torch])
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"gpu_gpt_table.py: {e}", file=sys.stderr)
        return 1
    any_torch = next(iter(theirs.values()), {})
    stamp = {"machine": f"{any_torch.get('device', '?')}, PyTorch {any_torch.get('torch', '?')}",
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             **(report.provenance(Path(__file__).resolve().parent.parent, "gpu-gpt")
                or ({"commit": os.environ["TROUPE_BENCH_COMMIT"]} if os.environ.get("TROUPE_BENCH_COMMIT") else {}))}
    rows = []
    for key, row in ours.items():
        base = theirs.get(key)
        if base is None:
            continue
        case, precision = key
        if case == "attention":
            name = (f"causal attention forward + backward, B {row['batch']}, T {row['time']}, "
                    f"{row['heads']} heads of {row['head_dim']}, {precision}")
            baseline = f"torch scaled_dot_product_attention ({base.get('backend', 'default')} backend)"
            target = "<= 1.25x" if precision == "bf16" else ""
            limit = 1.25
        else:
            mixed = " (troupe: bf16 model + f32 master weights; PyTorch: autocast)" if precision == "bf16" else ""
            name = f"GPT-2-small train step ({row['params'] / 1e6:.0f}M params), B {row['batch']}, T {row['time']}, {precision}{mixed}"
            baseline, target, limit = "PyTorch eager, AdamW (foreach)", "<= 1.0x", 1.0
        ratio = row["ms"] / base["ms"]
        rows.append({"case": name, "unit": "ms", "better": "lower", "troupe": round(row["ms"], 4),
                     "baseline": baseline, "baseline_value": round(base["ms"], 4), "ratio": round(ratio, 3),
                     "target": target, "met": (ratio <= limit) if target else None, **stamp})
    print(f"Device: {stamp['machine']}")
    print("| case | troupe ms | baseline | baseline ms | ratio | target | met |")
    print("|---|---:|---|---:|---:|---|---|")
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        print(f"| {r['case']} | {r['troupe']:g} | {r['baseline']} | {r['baseline_value']:g} | {r['ratio']:.2f}x | "
              f"{r['target']} | {met} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
