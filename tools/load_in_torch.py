#!/usr/bin/env python3
"""Turn a troupe checkpoint (HDF5) into a PyTorch state_dict with nothing but h5py.

    from load_in_torch import load_state_dict
    model.load_state_dict(load_state_dict("ckpt/ckpt-000001200.h5"))

or from the shell, to save a torch file:  load_in_torch.py CKPT.h5 out.pt [--section model]

Every dataset under /<section> becomes one entry, named by its path below the section
("layers.0.weight", "layers.0.weight/exp_avg" in /optimizer), in the order troupe wrote
them. f16 datasets are HDF5 IEEE half (numpy float16); bf16 ones are uint16 words with
the attribute dtype="bf16", reinterpreted here as torch.bfloat16 without conversion.
See docs/CHECKPOINT_FORMAT.md.
"""
from __future__ import annotations

import argparse
import sys
from collections import OrderedDict

import h5py
import numpy as np


def _children(group: h5py.Group) -> list[str]:
    """Link names in creation order (troupe tracks it), else in name order."""
    names: list[str] = []
    try:
        group.id.links.iterate(lambda n: names.append(n.decode()), idx_type=h5py.h5.INDEX_CRT_ORDER)
    except Exception:  # a file that does not track creation order
        names = sorted(group.keys())
    return names


def read_arrays(path: str, section: str = "model") -> "OrderedDict[str, tuple[np.ndarray, str]]":
    """name -> (numpy array, troupe dtype name); bf16 stays as its uint16 words."""
    out: "OrderedDict[str, tuple[np.ndarray, str]]" = OrderedDict()
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") != "troupe-checkpoint":
            raise ValueError(f"{path}: not a troupe checkpoint (format={f.attrs.get('format')!r})")

        def walk(group: h5py.Group, prefix: str) -> None:
            for name in _children(group):
                item = group[name]
                if isinstance(item, h5py.Group):
                    walk(item, prefix + name + "/")
                else:
                    dtype = item.attrs.get("dtype", str(item.dtype))
                    out[prefix + name] = (item[()], dtype)

        walk(f[section], "")
    return out


def load_state_dict(path: str, section: str = "model") -> "OrderedDict":
    import torch

    state = OrderedDict()
    for name, (array, dtype) in read_arrays(path, section).items():
        array = np.ascontiguousarray(array)
        if dtype == "bf16":
            state[name] = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            state[name] = torch.from_numpy(array)
    return state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("output", help="where torch.save writes the state_dict")
    parser.add_argument("--section", default="model")
    args = parser.parse_args()
    import torch

    state = load_state_dict(args.checkpoint, args.section)
    torch.save(state, args.output)
    print(f"{len(state)} tensors from /{args.section} of {args.checkpoint} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
