#!/usr/bin/env python3
"""Turn a troupe checkpoint (HDF5) into a PyTorch state_dict with nothing but h5py.

    from load_in_torch import load_state_dict
    model.load_state_dict(load_state_dict("ckpt/ckpt-000001200.h5"))

or from the shell, to save a torch file:  load_in_torch.py CKPT.h5 out.pt [--section model]

or, for a train_gpt checkpoint, to print the validation loss troupe's train_gpt reports
(the last 10% of TEXT_FILE, its first N windows; the model of torch_gpt.py, beside this
file):  load_in_torch.py CKPT.h5 --gpt-val-loss TEXT_FILE [--eval-samples N]

Every dataset under /<section> becomes one entry, named by its path below the section
("layers.0.weight", "layers.0.weight/exp_avg" in /optimizer), in the order troupe wrote
them. f16 datasets are HDF5 IEEE half (numpy float16); bf16 ones are uint16 words with
the attribute dtype="bf16", reinterpreted here as torch.bfloat16 without conversion.
See docs/CHECKPOINT_FORMAT.md.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import zlib
from collections import OrderedDict

import h5py
import numpy as np


def _text(value) -> str:
    """Format 2 stores strings fixed-length, which h5py returns as bytes; 1.x as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


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
        if _text(f.attrs.get("format")) != "troupe-checkpoint":
            raise ValueError(f"{path}: not a troupe checkpoint (format={f.attrs.get('format')!r})")

        def walk(group: h5py.Group, prefix: str) -> None:
            for name in _children(group):
                item = group[name]
                if isinstance(item, h5py.Group):
                    walk(item, prefix + name + "/")
                else:
                    dtype = _text(item.attrs.get("dtype", str(item.dtype)))
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


def read_text_ids(path: str, vocab: str) -> np.ndarray:
    """A text file's characters as ids (positions in `vocab`), as examples/char_corpus.cpp
    reads it: gzip or plain, UTF-8. ValueError naming the file for anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{path}: compressed data is corrupt or truncated ({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 ({e})") from None
    index = {c: i for i, c in enumerate(vocab)}
    try:
        return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
    except KeyError as e:
        c = e.args[0]
        raise ValueError(f"{path}: character {c!r} (U+{ord(c):04X}) at character offset {text.index(c)} "
                         "is not in the checkpoint's vocab") from None


def gpt_val_loss(checkpoint: str, text_file: str, eval_samples: int = 0, batch: int = 64) -> "tuple[float, int]":
    """(mean cross-entropy, windows) over train_gpt's validation windows: the characters
    from numel * 9 / 10 on, tiled by block_size-long windows (stride block_size), the
    first eval_samples of them when > 0."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_gpt.py is beside this file
    from torch_gpt import gpt_from_checkpoint

    model, vocab, args = gpt_from_checkpoint(checkpoint)
    ids = read_text_ids(text_file, vocab)
    val = torch.from_numpy(ids[len(ids) * 9 // 10:])
    T = args["block_size"]
    if len(val) < T + 1:
        raise ValueError(f"{text_file}: its validation part has {len(val)} characters, one window needs {T + 1}")
    windows = (len(val) - T - 1) // T + 1
    if eval_samples > 0:
        windows = min(windows, eval_samples)
    offsets = torch.arange(T)
    total = 0.0  # a Python float: f64, as troupe sums its per-batch losses
    with torch.no_grad():
        for begin in range(0, windows, batch):
            starts = torch.arange(begin, min(windows, begin + batch)) * T
            x = val[starts[:, None] + offsets]
            y = val[starts[:, None] + offsets + 1]
            logits = model(x)
            total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item() * len(starts)
    return total / windows, windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("output", nargs="?", help="where torch.save writes the state_dict")
    parser.add_argument("--section", default="model")
    parser.add_argument("--gpt-val-loss", metavar="TEXT_FILE",
                        help="print train_gpt's validation loss of the checkpoint on this text instead")
    parser.add_argument("--eval-samples", type=int, default=0, metavar="N",
                        help="with --gpt-val-loss: only the first N windows (0: all)")
    args = parser.parse_args()
    if (args.output is None) == (args.gpt_val_loss is None):
        parser.error("give either an output file or --gpt-val-loss TEXT_FILE")
    if args.gpt_val_loss is not None:
        try:
            loss, _ = gpt_val_loss(args.checkpoint, args.gpt_val_loss, args.eval_samples)
        except (ValueError, OSError) as e:
            print(f"load_in_torch.py: {e}", file=sys.stderr)
            return 1
        print(f"val loss {loss:.6f}")
        return 0
    import torch

    state = load_state_dict(args.checkpoint, args.section)
    torch.save(state, args.output)
    print(f"{len(state)} tensors from /{args.section} of {args.checkpoint} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
