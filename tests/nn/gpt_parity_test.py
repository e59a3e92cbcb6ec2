"""PyTorch parity of troupe's GPT: the same model in torch.nn (nanoGPT's code shape,
tools/torch_gpt.py), loaded from the HDF5 file gpt_parity wrote, fed the same batches.

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
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import torch
    import torch.nn.functional as F
except ImportError as e:  # python3-torch / python3-h5py not installed
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_gpt import GPT  # noqa: E402

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
