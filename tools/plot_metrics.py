#!/usr/bin/python3
"""Turns a troupe metrics log (JSONL, written by troupe::train::Status) into a PNG.

    tools/plot_metrics.py digits.jsonl                # writes digits.png beside it
    tools/plot_metrics.py digits.jsonl -o curve.png

One panel per kind of metric against the optimizer step: losses (every key with
"loss" in its name), accuracies ("acc"), and samples/s; any other numeric metric gets
a panel of its own. A resumed run appends to the same log, so steps may repeat: the
last record for a step wins, as it is the one the surviving run wrote.

Needs Debian's python3-matplotlib (scripts/setup installs it).
"""
import argparse
import json
import os
import sys

RESERVED = {"step", "epoch", "wall_s"}


def read_records(path):
    records = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot_metrics: {path}:{number}: not JSON ({e.msg})")
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise SystemExit(f"plot_metrics: {path}:{number}: a record needs an integer \"step\"")
            records[record["step"]] = record
    if not records:
        raise SystemExit(f"plot_metrics: {path} holds no records")
    return [records[s] for s in sorted(records)]


def panels(records):
    """Groups metric names into panels: losses, accuracies, rate, then the rest."""
    names = []
    for r in records:
        for k, v in r.items():
            if k not in RESERVED and k not in names and (isinstance(v, (int, float)) or v is None):
                names.append(k)
    groups = {"loss": [], "accuracy": [], "samples/s": []}
    others = []
    for n in names:
        if "loss" in n:
            groups["loss"].append(n)
        elif "acc" in n:
            groups["accuracy"].append(n)
        elif n == "samples_per_s":
            groups["samples/s"].append(n)
        else:
            others.append(n)
    out = [(title, keys) for title, keys in groups.items() if keys]
    out += [(n, [n]) for n in others]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="metrics JSONL file")
    parser.add_argument("-o", "--output", help="PNG to write (default: the log's name with .png)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_metrics: needs matplotlib (apt-get install python3-matplotlib, or scripts/setup)")

    if not os.path.exists(args.log):
        raise SystemExit(f"plot_metrics: {args.log}: no such file")
    records = read_records(args.log)
    groups = panels(records)
    if not groups:
        raise SystemExit(f"plot_metrics: {args.log} has no metrics besides step/epoch/wall_s")
    output = args.output or os.path.splitext(args.log)[0] + ".png"

    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 2.6 * len(groups)), sharex=True, squeeze=False)
    for ax, (title, keys) in zip(axes[:, 0], groups):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="." if len(points) < 60 else None, label=key)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if len(keys) > 1:
            ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(os.path.basename(args.log))
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"plot_metrics: wrote {output} ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
