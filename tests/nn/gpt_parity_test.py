"""PyTorch parity of troupe's GPT: the same model in torch.nn (nanoGPT's code shape),
loaded from the HDF5 file gpt_parity wrote, fed the same batches.

Checks, all f32 on the CPU, dropout off (tolerances: max |troupe - torch| over
max |torch| per tensor):
  - block h.0 alone: output, input gradient and parameter gradients within 1e-5;
  - the whole model on batch 0: logits and every parameter's gradient within 1e-5;
  - 20 AdamW steps (decay on matrices only, clipping at 1.0, troupe's learning
    rates): each step's loss within 1e-4, every final parameter within 1e-3.

    gpt_parity_test.py GPT_PARITY_BINARY
Exits 77 (skipped) when torch or h5py is missing.
"""
import math
import subprocess
import sys
import tempfile

try:
    import h5py
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # python3-torch / python3-h5py not installed
    print(f"SKIP: {e}")
    sys.exit(77)


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


failures = []


def compare(what, ours, theirs, tol):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    theirs = theirs.detach().to(torch.float64)
    if ours.shape != theirs.shape:
        failures.append(f"{what}: shape {tuple(ours.shape)} vs torch {tuple(theirs.shape)}")
        return 0.0
    scale = theirs.abs().max().item() or 1.0
    err = (ours - theirs).abs().max().item() / scale
    if not err <= tol:
        failures.append(f"{what}: relative error {err:.3g} > {tol:g}")
    return err


def main():
    binary = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/gpt_parity.h5"
        subprocess.run([binary, path], check=True)
        f = h5py.File(path, "r")
        c = {k: int(f.attrs[k]) for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")}
        model = GPT(c)
        init = {name: torch.from_numpy(f["init"][name][()]) for name in f["init"]}
        model.load_state_dict(init, strict=True)
        names = dict(model.named_parameters())

        # Block h.0 alone.
        block = model.transformer.h[0]
        x = torch.from_numpy(f["block0/x"][()]).requires_grad_(True)
        y = block(x)
        y.backward(torch.from_numpy(f["block0/r"][()]))
        worst = compare("block0 output", f["block0/y"][()], y, 1e-5)
        worst = max(worst, compare("block0 input gradient", f["block0/dx"][()], x.grad, 1e-5))
        for name, p in block.named_parameters():
            worst = max(worst, compare(f"block0 grad {name}", f["block0/grad"][name][()], p.grad, 1e-5))
        print(f"block h.0 alone: worst relative error {worst:.3g}")
        model.zero_grad(set_to_none=True)

        # The whole model, batch 0.
        xs = torch.from_numpy(f["batches/x"][()])
        ys = torch.from_numpy(f["batches/y"][()])
        logits = model(xs[0])
        F.cross_entropy(logits.view(-1, logits.size(-1)), ys[0].view(-1)).backward()
        worst = compare("step0 logits", f["step0/logits"][()], logits, 1e-5)
        for name in f["step0/grad"]:
            worst = max(worst, compare(f"step0 grad {name}", f["step0/grad"][name][()], names[name].grad, 1e-5))
        print(f"whole model, batch 0: logits and {len(f['step0/grad'])} gradients, worst relative error {worst:.3g}")
        model.zero_grad(set_to_none=True)

        # 20 steps.
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
        ours = f["losses"][()]
        lrs = f["lrs"][()]
        worst_loss = 0.0
        for step in range(len(ours)):
            for group in opt.param_groups:
                group["lr"] = float(lrs[step])
            logits = model(xs[step])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ys[step].view(-1))
            rel = abs(ours[step] - loss.item()) / abs(loss.item())
            worst_loss = max(worst_loss, rel)
            if not rel <= 1e-4:
                failures.append(f"step {step} loss: troupe {ours[step]:.7f}, torch {loss.item():.7f} ({rel:.3g})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        print(f"{len(ours)} steps: loss {ours[0]:.5f} -> {ours[-1]:.5f}, worst relative loss difference {worst_loss:.3g}")
        worst = 0.0
        state = model.state_dict()
        for name in f["final"]:
            worst = max(worst, compare(f"final {name}", f["final"][name][()], state[name], 1e-3))
        print(f"after {len(ours)} steps: {len(f['final'])} tensors, worst relative error {worst:.3g}")
        if not math.isfinite(ours[-1]) or ours[-1] >= ours[0]:
            failures.append(f"the loss did not go down: {ours[0]} -> {ours[-1]}")

    for line in failures:
        print("FAIL:", line)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
