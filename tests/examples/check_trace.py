#!/usr/bin/env python3
"""Checks a trace.json written by --trace (StepTrace): its shape, what each step holds,
and that the ranks' clocks line up.

    check_trace.py TRACE --ranks N --steps FIRST-LAST [--expect NAME,...]
                   [--per-step NAME=COUNT,...] [--track NAME] [--no-stray-nesting]
"""
import argparse
import json
import sys
from collections import defaultdict


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--steps", required=True)
    p.add_argument("--expect", default="", help="span names every rank must have in every step")
    p.add_argument("--per-step", default="", help="NAME=COUNT: exactly COUNT such spans per step and rank")
    p.add_argument("--track", action="append", default=[], help="a row every rank must have")
    args = p.parse_args()
    first, _, last = args.steps.partition("-")
    first, last = int(first), int(last or first)

    with open(args.trace) as f:
        doc = json.load(f)  # Perfetto and chrome://tracing read this JSON
    other = doc["otherData"]
    if other["ranks"] != args.ranks or other["steps"] != [first, last]:
        fail(f"otherData says ranks {other['ranks']}, steps {other['steps']}")
    if other["dropped"] != 0:
        fail(f"{other['dropped']} spans dropped")
    offsets = other["clock_offsets_ns"]
    if len(offsets) != args.ranks or offsets[0] != 0 or any(abs(o) > 5_000_000 for o in offsets):
        fail(f"clock offsets {offsets}: one host's ranks share a clock")

    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"].endswith("_name")}
    for e in spans:
        if e["ts"] < 0 or e["dur"] < 0:
            fail(f"negative time in {e}")
    if {e["pid"] for e in spans} != set(range(args.ranks)):
        fail(f"spans from ranks {sorted({e['pid'] for e in spans})}")

    # A row's spans nest (Perfetto's rule for complete events on one thread).
    rows = defaultdict(list)
    for e in spans:
        rows[(e["pid"], e["tid"])].append(e)
    for row, row_spans in rows.items():
        open_ends = []
        for e in sorted(row_spans, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1] + 1e-3:
                fail(f"{names.get(row)} on rank {row[0]}: '{e['name']}' overlaps its enclosing span's end")
            open_ends.append(e["ts"] + e["dur"])

    # Every rank has every step, on its training row, with its parts inside.
    steps = {(e["pid"], e["args"]["step"]): e for e in spans if e["cat"] == "step"}
    expected = [n for n in args.expect.split(",") if n]
    counts = dict(item.split("=") for item in args.per_step.split(",") if item)
    for rank in range(args.ranks):
        for track in args.track:
            if track not in {n for (pid, _), n in names.items() if pid == rank}:
                fail(f"rank {rank} has no row '{track}'")
        for step in range(first, last + 1):
            s = steps.get((rank, step))
            if s is None:
                fail(f"rank {rank} has no span of step {step}")
            if names.get((rank, s["tid"])) != "training":
                fail(f"rank {rank}'s step {step} is not on its training row")
            inside = [e for e in rows[(rank, s["tid"])] if e is not s and s["ts"] <= e["ts"] and
                      e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3]
            for name in expected:
                if not any(e["name"] == name for e in inside):
                    fail(f"rank {rank}'s step {step} has no '{name}' span")
            for name, count in counts.items():
                got = sum(e["name"] == name for e in inside)
                if got != int(count):
                    fail(f"rank {rank}'s step {step} has {got} '{name}' spans, not {count}")
            # The clocks line up: a step ends with collectives every rank takes part in,
            # so rank r's step overlaps rank 0's.
            s0 = steps[(0, step)]
            if s["ts"] > s0["ts"] + s0["dur"] or s0["ts"] > s["ts"] + s["dur"]:
                fail(f"rank {rank}'s step {step} does not overlap rank 0's: clocks not aligned")
    collectives = [e for e in spans if e["cat"] == "collective"]
    if not collectives or not all(e["args"]["bytes"] >= 0 and "sequence" in e["args"] for e in collectives):
        fail("no collective spans with bytes and sequence numbers")
    print(f"PASS: {len(spans)} spans, {args.ranks} ranks, steps {first}-{last}, offsets {offsets}")


if __name__ == "__main__":
    main()
