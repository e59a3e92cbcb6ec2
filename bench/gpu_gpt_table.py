#!/usr/bin/env python3
"""Pairs gpu_gpt_bench's JSON with torch_gpu_gpt.py's: issues 24 and 54's GPU table.

    python3 bench/gpu_gpt_table.py --troupe JSON... --torch JSON... [--versions JSON]
                                   [--peak-tflops BF16,TF32,F32] [--json ROWS]

Rows pair on (case, model, precision, tf32, batch, vocab; steps for the same-work
check). Several torch runs may hold the same key set up differently (eager, or
nanoGPT's settings: torch.compile and fused AdamW): each torch setup gets its own
row. Each figure is the lower median of the runs given (each program run once per
round, alternately); the rows keep every timing window of every run.

- attention: forward + backward against torch's scaled_dot_product_attention; bf16
  against flash, target <= 1.1x (issue 54); f32 without a target (flash takes no f32).
- step: against PyTorch eager at GPT-2's real vocabulary with TF32 off, <= 1.0x
  (issue 24); against torch.compile with nanoGPT's settings, <= 1.0x for bf16, for f32
  with TF32 (torch with allow_tf32) and for strict f32 (issue 54). tokens/s and MFU
  (nanoGPT's estimate_mfu: flops_per_token x tokens/s over the device's dense peak for
  the precision: bf16, TF32 for f32 with TF32, f32 for strict f32) on both sides.
- same work: the largest relative difference between the two sides' losses over the
  first steps from the same weights and batches; <= 1e-4 in strict f32, <= 5e-3 with
  TF32, <= 2e-2 in bf16.

A table on stdout; --json writes the rows in bench/results' schema
(bench/results/gpu-gpt.json), each with --versions' contents (driver, CUDA, cuBLAS,
torch, its CUDA and cuDNN) under "versions". Exits 1 if an input is missing or broken.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from pathlib import Path

import report  # bench/report.py, next to this script

REAL_VOCAB = {"gpt2-small": 50257, "tiny": 65}
MODEL_NAMES = {"gpt2-small": "GPT-2-small", "tiny": "tiny GPT"}
# Dense peaks, FLOP/s (NVIDIA's H100 SXM datasheet, without sparsity; the H200 has the
# same compute): bf16, TF32 and f32 (non-tensor-core FMA).
SXM_PEAKS = {"bf16": 989.4e12, "tf32": 494.7e12, "f32": 66.9e12}
# Relative tolerances, shown in parts per million (the report prints two decimals).
SAME_WORK_TOLERANCE = {"f32": (1e-4, "<= 100 ppm (1e-4)"), "tf32": (5e-3, "<= 5000 ppm (5e-3)"),
                       "bf16": (2e-2, "<= 20000 ppm (2e-2)")}


def precision_label(precision: str, tf32: bool) -> str:
    if precision == "bf16":
        return "bf16"
    return "f32 with TF32" if tf32 else "f32 (strict)"


def peak_kind(precision: str, tf32: bool) -> str:
    """Which of the device's peaks a row's MFU is taken against."""
    return "bf16" if precision == "bf16" else ("tf32" if tf32 else "f32")


def device_peaks(device: str | None, override: dict | None = None) -> dict | None:
    """{"bf16", "tf32", "f32"} -> FLOP/s: --peak-tflops, else the H100/H200 SXM figures
    for those devices, else None (MFU left null)."""
    if override:
        return override
    name = device or ""
    if "H200" in name or ("H100" in name and "PCIe" not in name and "NVL" not in name):
        return SXM_PEAKS
    return None


def peak_text(kind: str, flops: float) -> str:
    return f"{kind}{' dense' if kind != 'f32' else ''} {flops / 1e12:.0f} TFLOP/s"


def key_of(row: dict) -> tuple:
    """What the two sides pair on."""
    key = (row["case"], row.get("model", "gpt2-small"), row["precision"], bool(row.get("tf32")), int(row["batch"]))
    if row["case"] in ("step", "same work"):
        key += (int(row["vocab"]),)
    if row["case"] == "same work":
        key += (int(row["steps"]),)
    return key


def setup_of(row: dict) -> tuple[bool, bool]:
    """A torch row's setup: (torch.compile ran, fused AdamW ran)."""
    return bool(row.get("compile")), bool(row.get("fused_adamw"))


def setup_name(compiled: bool, fused: bool, vocab: int | None = None, model: str = "gpt2-small",
               tf32: bool = False) -> str:
    name = f"PyTorch {'torch.compile' if compiled else 'eager'}, AdamW ({'fused' if fused else 'foreach'})"
    if compiled and fused and vocab is not None and vocab != REAL_VOCAB.get(model):
        name = f"PyTorch with nanoGPT's settings (torch.compile, fused AdamW, V {vocab})"
    return name + (", allow_tf32" if tf32 else "")


def merged(rows: list[dict], by_setup: bool) -> dict:
    """The timing rows (attention, step) of any number of runs, one per key (and per
    torch setup for steps when by_setup): ms = the lower median of the runs' figures,
    runs_ms = those figures, rounds_ms = every window of every run."""
    groups: dict = {}
    for row in rows:
        if row.get("case") not in ("attention", "step"):
            continue
        setup = setup_of(row) if by_setup and row["case"] == "step" else None
        groups.setdefault((key_of(row), setup), []).append(row)
    out = {}
    for k, runs in groups.items():
        ms = [r["ms"] for r in runs]
        out[k] = {**runs[-1], "ms": statistics.median_low(ms), "runs_ms": ms,
                  "rounds_ms": [t for r in runs for t in r.get("rounds_ms", [r["ms"]])]}
    return out


def tokens_per_s(row: dict) -> float:
    return row["batch"] * row["time"] / (row["ms"] / 1e3)


def timing_rows(ours: list[dict], theirs: list[dict], peaks: dict | None = None) -> list[dict]:
    """The attention and step rows: troupe's runs against each torch setup's."""
    mine, base = merged(ours, by_setup=False), merged(theirs, by_setup=True)
    rows = []
    for (key, _), row in sorted(mine.items(), key=lambda kv: (kv[0][0][0] != "attention", kv[0][0])):
        case, model, precision, tf32, batch = key[:5]
        label = precision_label(precision, tf32)
        for (theirs_key, setup), b in sorted(base.items(), key=lambda kv: (kv[0][1] or (False, False))):
            if theirs_key != key:
                continue
            out = {"model": model, "precision": precision, "tf32": tf32, "batch": batch}
            if case == "attention":
                name = (f"causal attention forward + backward, B {batch}, T {row['time']}, {row['heads']} heads "
                        f"of {row['head_dim']}, {label}")
                baseline = f"torch scaled_dot_product_attention ({b.get('backend', 'default')} backend)"
                target, limit = ("<= 1.1x", 1.1) if precision == "bf16" else ("", None)
                out.update(calls=row.get("calls"), baseline_calls=b.get("calls"))
            else:
                vocab = key[5]
                compiled, fused = setup
                mixed = " (troupe: bf16 model + f32 master weights; PyTorch: autocast)" if precision == "bf16" else ""
                name = (f"{MODEL_NAMES.get(model, model)} train step ({row['params'] / 1e6:.0f}M params, V {vocab}), "
                        f"B {batch}, T {row['time']}, {label}{mixed}")
                baseline = setup_name(compiled, fused, vocab, model, tf32)
                eager_issue24 = not compiled and not fused and vocab == REAL_VOCAB.get(model) and not tf32
                target, limit = ("<= 1.0x", 1.0) if (compiled or eager_issue24) else ("", None)
                kind = peak_kind(precision, tf32)
                peak = peaks.get(kind) if peaks else None
                t_ours, t_base = tokens_per_s(row), tokens_per_s(b)
                out.update(vocab=vocab, params=row["params"], flops_per_token=row["flops_per_token"],
                           troupe_tokens_per_s=round(t_ours), baseline_tokens_per_s=round(t_base),
                           troupe_mfu=round(row["flops_per_token"] * t_ours / peak, 4) if peak else None,
                           baseline_mfu=round(b["flops_per_token"] * t_base / peak, 4) if peak else None,
                           mfu_peak=peak_text(kind, peak) if peak else None,
                           troupe_loss=row.get("loss"), baseline_loss=b.get("loss"),
                           baseline_compile=compiled, baseline_fused_adamw=fused)
            ratio = row["ms"] / b["ms"]
            rows.append({"case": name, "unit": "ms", "better": "lower", "troupe": round(row["ms"], 4),
                         "baseline": baseline, "baseline_value": round(b["ms"], 4), "ratio": round(ratio, 3),
                         "target": target, "met": (ratio <= limit) if limit else None, **out,
                         "troupe_runs_ms": row["runs_ms"], "baseline_runs_ms": b["runs_ms"],
                         "troupe_rounds_ms": row["rounds_ms"], "baseline_rounds_ms": b["rounds_ms"]})
    return rows


def max_relative_difference(ours: list[float], theirs: list[float]) -> float:
    """max over steps of |ours - theirs| / |theirs|; NaN when any loss is not finite."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.nan
        worst = max(worst, abs(a - b) / abs(b) if b else abs(a - b))
    return worst


def same_work_rows(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """One row per troupe same-work run and torch setup that ran the same key: the
    largest relative loss difference, judged against the precision's tolerance. A troupe
    run that no torch run matched gets a row with its baseline missing."""
    mine = {}
    for row in ours:
        if row.get("case") == "same work":
            mine.setdefault(key_of(row), row)
    base: dict = {}
    for row in theirs:
        if row.get("case") == "same work":
            base.setdefault((key_of(row), setup_of(row)), row)
    rows = []
    for key, row in sorted(mine.items()):
        _, model, precision, tf32, batch, vocab, steps = key
        tol, target = SAME_WORK_TOLERANCE[peak_kind(precision, tf32)]
        name = (f"same work: first {steps} losses from the same weights and batches, "
                f"{MODEL_NAMES.get(model, model)} V {vocab}, B {batch}, {precision_label(precision, tf32)}")
        common = {"case": name, "unit": "ppm (largest relative difference)", "better": "lower", "baseline_value": None,
                  "ratio": None, "target": target, "model": model, "precision": precision, "tf32": tf32,
                  "batch": batch, "vocab": vocab, "steps": steps, "troupe_losses": row["losses"]}
        matches = sorted((s, b) for (k, s), b in base.items() if k == key)
        if not matches:
            rows.append({**common, "troupe": None, "baseline": "PyTorch (no run with this key)", "met": None,
                         "baseline_missing": True, "baseline_losses": None})
            continue
        for (compiled, fused), b in matches:
            problem = None
            if not (len(row["losses"]) == len(b["losses"]) == steps):
                problem = f"troupe gave {len(row['losses'])} losses, torch {len(b['losses'])}, want {steps}"
            diff = max_relative_difference(row["losses"], b["losses"])
            met = problem is None and diff <= tol  # False for NaN
            out = {**common, "troupe": float(f"{diff * 1e6:.3g}") if math.isfinite(diff) else None,
                   "baseline": setup_name(compiled, fused, vocab, model, tf32), "met": met,
                   "baseline_compile": compiled, "baseline_fused_adamw": fused, "baseline_losses": b["losses"]}
            if problem:
                out["problem"] = problem
            rows.append(out)
    return rows


def value_text(v, unit: str) -> str:
    if v is None:
        return "—"
    return f"{v:g} {unit}" if unit == "ms" else f"{v:.2g}"


def table_lines(rows: list[dict]) -> list[str]:
    lines = ["| case | troupe | baseline | baseline value | ratio | target | met | tokens/s troupe / baseline "
             "| MFU troupe / baseline |",
             "|---|---:|---|---:|---:|---|---|---:|---:|"]
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.3f}x"
        tokens = mfu = ""
        if "troupe_tokens_per_s" in r:
            tokens = f"{r['troupe_tokens_per_s']:,} / {r['baseline_tokens_per_s']:,}"
            if r.get("troupe_mfu") is not None:
                mfu = f"{r['troupe_mfu']:.1%} / {r['baseline_mfu']:.1%} of {r['mfu_peak']}"
        lines.append(f"| {r['case']} | {value_text(r['troupe'], r['unit'])} | {r['baseline']} | "
                     f"{value_text(r['baseline_value'], r['unit'])} | {ratio} | {r['target']} | {met} | {tokens} | "
                     f"{mfu} |")
    return lines


def load_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        data = json.load(open(path))
        if not isinstance(data, list):
            raise ValueError(f"{path}: want a JSON list of rows, got {type(data).__name__}")
        rows += data
    return rows


def parse_peaks(text: str | None) -> dict | None:
    if not text:
        return None
    values = [float(v) * 1e12 for v in text.split(",")]
    if len(values) != 3:
        raise ValueError(f"--peak-tflops wants BF16,TF32,F32, got '{text}'")
    return dict(zip(("bf16", "tf32", "f32"), values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--troupe", nargs="+", required=True)
    parser.add_argument("--torch", nargs="+", required=True)
    parser.add_argument("--versions", help="a JSON object of driver/CUDA/cuBLAS/torch versions, copied into each row")
    parser.add_argument("--peak-tflops", help="BF16,TF32,F32 dense peaks, for a device this script does not know")
    parser.add_argument("--json", help="the rows, in bench/results' schema")
    args = parser.parse_args()
    try:
        ours, theirs = load_rows(args.troupe), load_rows(args.torch)
        versions = json.load(open(args.versions)) if args.versions else {}
        override = parse_peaks(args.peak_tflops)
        any_torch = next((r for r in theirs if "device" in r), {})
        device = any_torch.get("device") or next((r.get("device") for r in ours if "device" in r), None)
        rows = timing_rows(ours, theirs, device_peaks(device, override)) + same_work_rows(ours, theirs)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"gpu_gpt_table.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for field, name in (("torch", "torch"), ("cuda", "torch_cuda"), ("cudnn", "torch_cudnn")):
        if any_torch.get(field) is not None:
            versions.setdefault(name, any_torch[field])
    stamp = {"machine": f"{device or '?'}, PyTorch {any_torch.get('torch', '?')}",
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             **(report.provenance(Path(__file__).resolve().parent.parent, "gpu-gpt")
                or ({"commit": os.environ["TROUPE_BENCH_COMMIT"]} if os.environ.get("TROUPE_BENCH_COMMIT") else {}))}
    rows = [{**r, "versions": versions, **stamp} for r in rows]
    print(f"Device: {stamp['machine']}; versions: {json.dumps(versions)}")
    print("\n".join(table_lines(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
