"""Parses a .safetensors file by its published layout (no safetensors package needed) and
compares every tensor with the checkpoint read through h5py. Exits non-zero on mismatch."""
import json
import struct
import sys

import h5py
import numpy as np

out, ckpt = sys.argv[1], sys.argv[2]
DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": np.uint16,
      "I32": np.int32, "I64": np.int64, "U8": np.uint8}
with open(out, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    assert n % 8 == 0, n
    header = json.loads(f.read(n))
    data = f.read()
meta = header.pop("__metadata__")
assert meta["format"] == "pt" and meta["step"] == "5", meta
assert list(header) == ["fc.weight", "fc.bias", "steps"], list(header)
end = 0
with h5py.File(ckpt, "r") as h:
    for name, e in header.items():
        b, x = e["data_offsets"]
        assert b == end, (name, b, end)  # back to back, no holes
        end = x
        arr = np.frombuffer(data[b:x], dtype=DT[e["dtype"]]).reshape(e["shape"])
        ref = h["model"][name][()]
        assert arr.tobytes() == ref.tobytes(), name
    assert h["model"]["fc.bias"].attrs["dtype"] == b"bf16" and header["fc.bias"]["dtype"] == "BF16"
assert end == len(data), (end, len(data))
print("safetensors OK")
