"""The Python baselines of bench/checkpoint_bench.cpp: h5py and torch.save/torch.load
on the same ~100 f32 tensors (same sizes, same disk), each write followed by fsync and
each read from a cold cache (posix_fadvise DONTNEED). Prints one JSON object.

    checkpoint_baselines.py [--mb 300] [--rounds 5] [--dir PATH]
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def tensor_sizes(total_mb):
    w = [1.08 ** i for i in range(100)]
    s = sum(w)
    return [max(1024, int(x / s * total_mb * 1e6 / 4)) for x in w]  # same as the C++


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None)
    a = p.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="troupe-ckpt-baseline-")
    os.makedirs(d, exist_ok=True)
    arrays = {f"layers.{i}.weight": np.arange(n, dtype=np.float32) for i, n in enumerate(tensor_sizes(a.mb))}
    nbytes = sum(x.nbytes for x in arrays.values())
    out = {"bytes": nbytes}
    times = {"h5py_write": [], "h5py_read": [], "torch_save": [], "torch_load": []}

    import h5py
    try:
        import torch
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    except ImportError:
        torch = None
    for _ in range(a.rounds):
        path = os.path.join(d, "x.h5")
        t0 = time.perf_counter()
        with h5py.File(path, "w") as f:
            g = f.create_group("model")
            for k, v in arrays.items():
                g.create_dataset(k, data=v)
        fsync(path)
        times["h5py_write"].append(time.perf_counter() - t0)
        drop_cache(path)
        t0 = time.perf_counter()
        with h5py.File(path, "r") as f:
            back = {k: f["model"][k][()] for k in f["model"]}
        times["h5py_read"].append(time.perf_counter() - t0)
        del back
        if torch is not None:
            path = os.path.join(d, "x.pt")
            t0 = time.perf_counter()
            torch.save(tensors, path)
            fsync(path)
            times["torch_save"].append(time.perf_counter() - t0)
            drop_cache(path)
            t0 = time.perf_counter()
            back = torch.load(path)
            times["torch_load"].append(time.perf_counter() - t0)
            del back
    for k, v in times.items():
        if v:
            out[k + "_MBps"] = nbytes / 1e6 / statistics.median(v)
    if not a.dir:
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
