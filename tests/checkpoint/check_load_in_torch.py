"""Checks tools/load_in_torch.py's h5py part (the numpy arrays it builds); the torch part
too when torch imports."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import load_in_torch  # noqa: E402

arrays = load_in_torch.read_arrays(sys.argv[1], "model")
assert list(arrays) == ["layers.0.weight", "layers.0.bias", "half", "brain", "ids", "count",
                        "mask", "scalar"], list(arrays)  # the order troupe wrote them in
assert np.array_equal(arrays["layers.0.weight"][0], np.arange(12, dtype=np.float32).reshape(3, 4))
words, dtype = arrays["brain"]
assert dtype == "bf16" and list(words) == [0x3F80, 0x4000, 0xBF00]
opt = load_in_torch.read_arrays(sys.argv[1], "optimizer")
assert list(opt) == ["layers.0.weight/exp_avg"]
try:
    import torch
except ImportError:
    print("torch not importable; h5py part checked")
    sys.exit(0)
sd = load_in_torch.load_state_dict(sys.argv[1])
assert sd["brain"].dtype == torch.bfloat16 and sd["brain"].tolist() == [1.0, 2.0, -0.5]
assert sd["half"].dtype == torch.float16
assert torch.equal(sd["layers.0.weight"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
print("load_in_torch OK")
