#!/usr/bin/env python3
"""Draws a troupe timeline (the trace.json that --trace writes) as a PNG.

    tools/plot_timeline.py DIR/trace.json            # writes DIR/trace.png
    tools/plot_timeline.py trace.json -o steps.png --steps 4-5

One band per rank, one row per thread or collective track, as in Perfetto; a span is
a bar coloured by what it is (forward, backward, optimizer, data, collective, wait,
checkpoint, actor call, GPU time), a step a grey frame behind its parts. Spans nested in a row
(a wait inside a backward) are drawn thinner, on top. Needs python3-matplotlib.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "optimizer": "#55A868",
    "data": "#8172B3",
    "collective": "#C44E52",
    "wait": "#9A9A9A",
    "checkpoint": "#937860",
    "actor": "#DA8BC3",
    "gpu": "#64B5CD",
}


def colour(event: dict) -> str:
    name, category = event["name"], event.get("cat", "")
    if category == "compute":
        for key in ("forward", "backward", "optimizer"):
            if name.startswith(key):
                return COLOURS[key]
    return COLOURS.get(category, "#CCB974")


def parse_steps(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    return int(first), int(last or first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("-o", "--output", type=Path, help="the PNG (default: beside the trace, .png)")
    parser.add_argument("--steps", help="only steps FIRST-LAST of the trace (default: all)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("plot_timeline.py: needs matplotlib (Debian: python3-matplotlib)", file=sys.stderr)
        return 2
    try:
        trace = json.loads(args.trace.read_text())
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot_timeline.py: {args.trace} is not a Chrome trace: {e}", file=sys.stderr)
        return 1

    spans = [e for e in events if e.get("ph") == "X"]
    if args.steps:
        first, last = parse_steps(args.steps)
        steps = [e for e in spans if e.get("cat") == "step" and first <= e.get("args", {}).get("step", -1) <= last]
        if not steps:
            print(f"plot_timeline.py: no steps {args.steps} in {args.trace}", file=sys.stderr)
            return 1
        begin = min(e["ts"] for e in steps)
        end = max(e["ts"] + e["dur"] for e in steps)
        spans = [e for e in spans if e["ts"] < end and e["ts"] + e["dur"] > begin]
    if not spans:
        print(f"plot_timeline.py: {args.trace} has no spans", file=sys.stderr)
        return 1
    origin = min(e["ts"] for e in spans)

    # Rows in the order the trace sorts them: ranks, then each rank's threads and tracks.
    names, order = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        key = (e["pid"], e.get("tid"))
        if e["name"] in ("process_name", "thread_name"):
            names[key] = e["args"]["name"]
        elif e["name"] in ("process_sort_index", "thread_sort_index"):
            order[key] = e["args"]["sort_index"]
    rows = sorted({(e["pid"], e["tid"]) for e in spans},
                  key=lambda k: (order.get((k[0], None), k[0]), order.get(k, 1 << 40), k[1]))

    fig_height = 1.4 + 0.36 * len(rows)
    fig, ax = plt.subplots(figsize=(13, fig_height))
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    for row in rows:
        in_row = sorted((e for e in spans if (e["pid"], e["tid"]) == row), key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []  # ends of the open enclosing spans
        for e in in_row:
            start, dur = (e["ts"] - origin) / 1000.0, e["dur"] / 1000.0
            while stack and stack[-1] <= start + 1e-9:
                stack.pop()
            depth = len(stack)
            y = y_of[row]
            if e.get("cat") == "step":
                ax.broken_barh([(start, dur)], (y - 0.45, 0.9), facecolors="#EEEEEE", edgecolors="#888888", linewidth=0.6)
                ax.text(start + dur / 2, y + 0.36, e["name"], ha="center", va="center", fontsize=6, color="#555555")
            else:
                height = max(0.2, 0.7 - 0.2 * max(0, depth - 1))
                ax.broken_barh([(start, dur)], (y - height / 2, height), facecolors=colour(e), edgecolors="none")
            stack.append(start + dur)
    ax.set_yticks([y_of[r] for r in rows])
    ax.set_yticklabels([f"{names.get((r[0], None), f'rank {r[0]}')}: {names.get(r, r[1])}" for r in rows], fontsize=7)
    ax.set_xlabel("ms")
    other = trace.get("otherData", {})
    steps = other.get("steps")
    title = f"{other.get('program', 'troupe')}: steps {steps[0]}-{steps[1]}" if steps else "troupe timeline"
    ax.set_title(title + f", {other.get('ranks', '?')} ranks", fontsize=9, pad=22)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()] + [Patch(color="#EEEEEE", label="step")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=9, fontsize=7, frameon=False)
    ax.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    out = args.output or args.trace.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"plot_timeline.py: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
