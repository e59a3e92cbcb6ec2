"""troupe's GPT in PyTorch: nanoGPT's model code (torch.nn), the model that
tests/nn/gpt_parity_test.py checks against troupe's nn::GPT and bench/torch_gpt_step.py times.

    from torch_gpt import GPT, gpt_from_checkpoint
    model, vocab, model_args = gpt_from_checkpoint("runs/gpt/ckpt-000001000.h5")

As troupe's: bias everywhere, GELU with the tanh approximation, lm_head tied to wte,
dropout off. Attention is nanoGPT's explicit masked softmax, as Debian's torch 1.13 has
no scaled_dot_product_attention. A config `c` is a dict of block_size, vocab_size,
n_layer, n_head and n_embd (a checkpoint's `model_args`).
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_head = c["n_head"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # nanoGPT's path without scaled_dot_product_attention (Debian's torch is 1.13).
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=nn.LayerNorm(c["n_embd"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(idx.size(1), dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt_from_checkpoint(path: str) -> "tuple[GPT, str, dict]":
    """(model in eval mode, vocab, model_args) from a train_gpt checkpoint. The vocab's
    i-th character has id i. ValueError when the file is not a GPT checkpoint."""
    import h5py

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from load_in_torch import _text, load_state_dict  # beside this file; needs h5py, so only here

    with h5py.File(path, "r") as f:
        if "model_args" not in f.attrs or "vocab" not in f.attrs:
            raise ValueError(f"{path}: no model_args or vocab attribute (not a train_gpt checkpoint)")
        args = json.loads(_text(f.attrs["model_args"]))
        vocab = _text(f.attrs["vocab"])
    if len(vocab) != args["vocab_size"]:
        raise ValueError(f"{path}: vocab has {len(vocab)} characters, model_args says {args['vocab_size']}")
    model = GPT(args)
    # troupe stores the tied weight under both names, as torch's state_dict() lists it.
    model.load_state_dict(load_state_dict(path), strict=True)
    model.eval()
    return model, vocab, args
