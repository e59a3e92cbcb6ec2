"""bench/run's checkpoint area: runs bench/checkpoint_bench (troupe and the raw disk, one
process), bench/checkpoint_baselines.py (h5py, torch.save/torch.load) and dd conv=fsync
on the same bytes and disk, and bench/checkpoint_parallel_bench under mpirun at 2 ranks
(the parallel save next to the gathered save and raw writes, one job), and turns them
into rows against the issue's targets."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

TORCH_PYTHON = "/usr/bin/python3"


def _json_of(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _dd_MBps(nbytes: int, folder: str) -> float | None:
    """dd of the same number of bytes with conv=fsync; dd reports its own rate."""
    count = max(1, nbytes // (4 << 20))
    target = os.path.join(folder, "dd.bin")
    p = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={count}", "conv=fsync"],
                       stderr=subprocess.PIPE, text=True)
    os.remove(target)
    m = re.search(r"copied, ([0-9.]+) s", p.stderr)
    return count * (4 << 20) / 1e6 / float(m.group(1)) if m else None


def run(build: Path, root: Path, quick: bool, row, mpirun) -> list[dict]:
    # The two sizes: ~300 MB (5 rounds) and ~1 GB (3 rounds, to bound the run).
    sizes = [("64", "1")] if quick else [("300", "5"), ("1000", "3")]
    rows = []
    for mb, rounds in sizes:
        rows += _run_size(build, root, mb, rounds, row)
    # The parallel save at the first size only: it needs no second figure.
    rows += _run_parallel(build, *sizes[0], row, mpirun)
    rows += _run_inspect(build, quick, row)
    return rows


def _time_and_rss(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one run of `cmd`, its output discarded. The RSS
    comes from GNU time: a child's own ru_maxrss, as wait4 reports it to Python, counts
    the Python pages it was forked with, so it is never below this interpreter's."""
    with tempfile.NamedTemporaryFile(mode="r") as usage:
        start = time.monotonic()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", usage.name, *cmd], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        seconds = time.monotonic() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}")
        return seconds, int(usage.read().split()[-1]) / 1024


def _run_inspect(build: Path, quick: bool, row) -> list[dict]:
    """troupe-ckpt ls against h5ls -r on one ~5 MB checkpoint (issue 50: an inspector
    should start like h5ls, CUDA or not): the median of 7 runs each, alternating."""
    rounds = 3 if quick else 7
    with tempfile.TemporaryDirectory(prefix="troupe-ckpt-bench-", dir=os.environ.get("TROUPE_BENCH_DIR")) as d:
        _json_of([str(build / "bench" / "checkpoint_bench"), "--mb", "5", "--rounds", "1", "--dir", d + "/t",
                  "--keep", "1"])
        path = str(sorted(Path(d, "t").rglob("ckpt-*.h5"))[-1])
        ours, theirs = [], []
        for _ in range(rounds):
            ours.append(_time_and_rss([str(build / "tools" / "troupe-ckpt"), "ls", path]))
            theirs.append(_time_and_rss(["h5ls", "-r", path]))
    s_ours, s_theirs = (statistics.median(t for t, _ in runs) for runs in (ours, theirs))
    m_ours, m_theirs = (statistics.median(m for _, m in runs) for runs in (ours, theirs))
    name = "troupe-ckpt ls of a 5 MB checkpoint"
    return [
        row(name, "s", "lower", s_ours, "h5ls -r of the same file", s_theirs, "<= 2x h5ls -r", s_ours <= 2 * s_theirs),
        row(name + ": peak RSS", "MB", "lower", m_ours, "h5ls -r of the same file", m_theirs, "< 40 MB", m_ours < 40),
    ]


def _run_parallel(build: Path, mb: str, rounds: str, row, mpirun) -> list[dict]:
    """Parallel save (every rank writes its slices through MPI-IO) at 2 ranks, against the
    gathered save (CheckpointActor) and raw writes of the same bytes, in one job."""
    with tempfile.TemporaryDirectory(prefix="troupe-ckpt-bench-", dir=os.environ.get("TROUPE_BENCH_DIR")) as d:
        p = _json_of([*mpirun(2), str(build / "bench" / "checkpoint_parallel_bench"), "--mb", mb,
                      "--rounds", rounds, "--dir", d + "/p"])
    size = f"{p['bytes'] / 1e6:.0f} MB ({p['tensors']} f32 tensors)"
    name = f"parallel save {size}, {p['ranks']} ranks, fsync'd"
    save, raw = p["parallel_save_MBps"], p["raw_write_fsync_MBps"]
    return [
        row(name, "MB/s", "higher", save, "gathered save (CheckpointActor)", p["gathered_save_MBps"], "", None),
        row(name, "MB/s", "higher", save, "raw write+fsync, one writer", raw, ">= 0.8x raw write+fsync",
            save >= 0.8 * raw),
        row(name, "MB/s", "higher", save, "raw pwrite+fsync, each rank its slices",
            p["raw_parallel_write_fsync_MBps"], "", None),
        row(name, "MB/s", "higher", save, "the same with MPI-IO collective buffering",
            p["parallel_save_collective_buffering_MBps"], "", None),
    ]


def _run_size(build: Path, root: Path, mb: str, rounds: str, row) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="troupe-ckpt-bench-", dir=os.environ.get("TROUPE_BENCH_DIR")) as d:
        t = _json_of([str(build / "bench" / "checkpoint_bench"), "--mb", mb, "--rounds", rounds, "--dir", d + "/t"])
        b = _json_of([TORCH_PYTHON, str(root / "bench" / "checkpoint_baselines.py"), "--mb", mb, "--rounds", rounds,
                      "--dir", d + "/b"])
        dd = _dd_MBps(t["bytes"], d)
    size = f"{t['bytes'] / 1e6:.0f} MB ({t['tensors']} f32 tensors)"
    rows = []
    save, load = t["troupe_save_MBps"], t["troupe_load_cold_MBps"]
    rows.append(row(f"save {size}, fsync'd", "MB/s", "higher", save, "raw write+fsync (one file, rewritten)",
                    t["raw_write_fsync_MBps"], ">= 0.8x raw write+fsync", save >= 0.8 * t["raw_write_fsync_MBps"]))
    if "raw_write_fsync_new_file_MBps" in t:
        new_file = t["raw_write_fsync_new_file_MBps"]
        rows.append(row(f"save {size}, fsync'd", "MB/s", "higher", save,
                        "raw write+fsync to a new file, the previous kept (as a crash-safe save must)", new_file,
                        ">= 0.9x raw write+fsync of a new file", save >= 0.9 * new_file))
    if dd:
        rows.append(row(f"save {size}, fsync'd", "MB/s", "higher", save, "dd conv=fsync", dd, "", None))
    # The disk's write+fsync rate bounds every format, and h5py and torch.save write the
    # same bytes to the same disk: the save is held to the raw new-file write above and
    # to at least matching them, not to a fixed margin over them.
    for key, name in (("h5py_write_MBps", "h5py write+fsync"), ("torch_save_MBps", "torch.save+fsync")):
        theirs = b.get(key)  # absent: that library is not installed
        rows.append(row(f"save {size}, fsync'd", "MB/s", "higher", save, name if theirs else f"{name}: not installed",
                        theirs, f">= 1.0x {name}", None if theirs is None else save >= theirs))
    rows.append(row(f"load {size}, cold cache, checksums verified", "MB/s", "higher", load, "raw read, cold",
                    t["raw_read_cold_MBps"], ">= 0.6x raw cold read", load >= 0.6 * t["raw_read_cold_MBps"]))
    for key, name in (("h5py_read_MBps", "h5py read, cold"), ("torch_load_MBps", "torch.load, cold")):
        theirs = b.get(key)
        rows.append(row(f"load {size}, cold cache, checksums verified", "MB/s", "higher", load,
                        name if theirs else f"{name}: not installed", theirs, f">= 2x {name}",
                        None if theirs is None else load >= 2 * theirs))
    verify_s, plain_s = t["bytes"] / 1e6 / load, t["bytes"] / 1e6 / t["troupe_load_noverify_cold_MBps"]
    rows.append(row(f"load {size} with checksum verification", "s", "lower", verify_s, "troupe load without",
                    plain_s, "<= 1.3x without", verify_s <= 1.3 * plain_s))
    if "troupe_load_while_restoring_cold_MBps" in t:
        one_pass_s = t["bytes"] / 1e6 / t["troupe_load_while_restoring_cold_MBps"]
        rows.append(row(f"load {size} verified while restoring (Verify::while_restoring)", "s", "lower", one_pass_s,
                        "troupe load without", plain_s, "<= 1.3x without", one_pass_s <= 1.3 * plain_s))
    rows.append(row(f"async save stall, {size}", "ms", "lower", t["async_stall_ms"], "synchronous save",
                    t["sync_save_ms"], "<= 0.1x synchronous save", t["async_stall_ms"] <= 0.1 * t["sync_save_ms"]))
    bound = t["largest_bytes"] / 1e6 + 64
    rows.append(row(f"saving process peak extra memory, {size}", "MB", "lower", t["peak_extra_MB"],
                    "largest tensor + 64 MB", bound, "<= largest tensor + 64 MB", t["peak_extra_MB"] <= bound))
    return rows
