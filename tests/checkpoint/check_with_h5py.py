"""Reads a checkpoint written by tests/checkpoint/h5py_test.cpp (one process) or
parallel_test.cpp (parallel HDF5) with plain h5py and numpy and checks every name, shape,
dtype, value and attribute. Exits non-zero on a mismatch.

    check_with_h5py.py FILE [WORLD_SIZE]     (the world_size attribute expected; 4 by default)"""
import json
import sys

import h5py
import numpy as np


def text(value) -> str:
    """Format 2 stores strings fixed-length, which h5py returns as bytes."""
    assert isinstance(value, bytes), f"{value!r} is not a fixed-length string"
    return value.decode()


path = sys.argv[1]
world_size = int(sys.argv[2]) if len(sys.argv) > 2 else 4
with h5py.File(path, "r") as f:
    a = f.attrs
    assert text(a["format"]) == "troupe-checkpoint", a["format"]
    assert text(a["format_version"]) == "2.0", a["format_version"]
    assert a["step"] == 42 and a["epoch"] == 2 and a["world_size"] == world_size, dict(a)
    assert text(a["run_id"]) == "h5py-run"
    assert json.loads(text(a["config"])) == {"model": "mlp", "lr": 0.5}
    assert a["complete"] == 1
    assert len(text(a["created_utc"])) == 20 and text(a["created_utc"]).endswith("Z")

    m = f["model"]
    assert sorted(m.keys()) == sorted(["layers.0.weight", "layers.0.bias", "half", "brain", "ids",
                                     "count", "mask", "scalar"]), list(m.keys())
    w = m["layers.0.weight"]
    assert w.dtype == np.float32 and w.shape == (3, 4)
    assert np.array_equal(w[()], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert text(w.attrs["dtype"]) == "f32" and w.attrs["xxh64"].dtype == np.uint64
    assert w.chunks is None and w.compression is None  # contiguous, uncompressed
    assert m["layers.0.bias"].dtype == np.float64
    assert np.array_equal(m["layers.0.bias"][()], np.arange(3.0))
    h = m["half"]
    assert h.dtype == np.float16 and h.shape == (2, 3) and text(h.attrs["dtype"]) == "f16"
    assert np.array_equal(h[()], np.arange(6, dtype=np.float16).reshape(2, 3))
    b = m["brain"]
    assert b.dtype == np.uint16 and text(b.attrs["dtype"]) == "bf16"
    assert list(b[()]) == [0x3F80, 0x4000, 0xBF00], [hex(x) for x in b[()]]
    assert m["ids"].dtype == np.int64 and list(m["ids"][()]) == [-2, -1, 0, 1, 2]
    assert m["count"].dtype == np.int32 and list(m["count"][()]) == [5, 6]
    assert m["mask"].dtype == np.uint8 and list(m["mask"][()]) == [250, 251, 252, 253, 254, 255]
    assert m["scalar"].shape == () and m["scalar"][()] == np.float32(7.5)

    o = f["optimizer"]
    assert o.attrs["lr"] == 0.5 and o.attrs["step"] == 9
    assert np.array_equal(o["layers.0.weight"]["exp_avg"][()], np.full((3, 4), 0.25, np.float32))
    s = f["sampler"]
    assert s.attrs["epoch"] == 2 and s.attrs["index"] == 640
print("h5py read", path, "OK")
