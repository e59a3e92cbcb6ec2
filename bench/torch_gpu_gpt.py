#!/usr/bin/env python3
"""PyTorch baseline for bench/gpu_gpt_bench.cpp: the same cases, shapes, timing and JSON.

    python3 bench/torch_gpu_gpt.py [--precision f32|bf16]... [--batch N]... [--repeats N] [--steps N]
        [--attention-calls N] [--vocab-pad M] [--tf32] [--model gpt2-small|tiny] [--device cuda|cpu]
        [--compile] [--fused-adamw] [--settings eager|nanogpt] [--same-work DIR | --ops]

- attention: F.scaled_dot_product_attention(q, k, v, is_causal=True) forward and
  backward on q, k, v split from one [B, T, 3C] tensor as nanoGPT does; bf16 pinned to
  the flash backend (issue 54's baseline), f32 on the backend torch picks (flash takes
  no f32; it picks the memory-efficient one). Windows of --attention-calls calls.
- step: nanoGPT's model (tools/torch_gpt.py's, with nanoGPT's scaled_dot_product_attention
  path where torch has it, the loss inside forward as nanoGPT computes it), AdamW with
  decay on matrices, clip_grad_norm_ at 1.0; bf16 is torch.autocast(dtype=bfloat16)
  over f32 weights. --settings nanogpt is nanoGPT's own configuration: --compile
  (torch.compile of the model), --fused-adamw and --vocab-pad 64 (GPT-2's 50257 words
  padded to 50304). TF32 is its own flag (--tf32: allow_tf32 for matmuls and cuDNN;
  off otherwise, as troupe's strict f32). Data ids are always below the real vocabulary.
- --same-work DIR: no timing; the model and batches gpu_gpt_bench --same-work wrote to
  DIR, trained for the file's steps per precision with this run's settings, printing
  each step's loss (issue 54 item 2; bench/gpu_gpt_table.py compares the two sides).
- --ops times each kind of layer alone, as gpu_gpt_bench --ops does (same names, same
  shapes; the layers in the given dtype, not under autocast), one JSON line per dtype.

Timing: 3 warm-up calls (a compiled model compiles in them), then --repeats windows of
--steps calls (--attention-calls for attention), each window between CUDA events
(time.perf_counter on the CPU); "ms" is the lower median of the windows' ms per call,
"rounds_ms" every window's. --device cpu with --model tiny is the plumbing check for a
machine without a GPU. Exits 3 when torch or the device is missing.
"""
import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"torch_gpu_gpt.py: cannot import torch ({e})", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import torch_gpt  # noqa: E402

# Real vocabularies: data ids are drawn below these, whatever the padding.
MODELS = {
    "gpt2-small": dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768),
    "tiny": dict(block_size=32, vocab_size=65, n_layer=2, n_head=2, n_embd=64),
}
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0; Debian's 1.13 has none


def attention(q, k, v):
    """nanoGPT's attention: scaled_dot_product_attention where torch has it, else its
    explicit masked softmax."""
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1) ** 0.5)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).tril().logical_not(), float("-inf"))
    return F.softmax(att, dim=-1) @ v


def attention_forward(self, x):  # nanoGPT's flash path
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = attention(q, k, v)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def gpt_forward(self, idx, targets):  # positions on the ids' device; nanoGPT's loss inside forward
    pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
    x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
    for block in self.transformer.h:
        x = block(x)
    logits = self.lm_head(self.transformer.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class Run:
    """One process's setup: the device, the model's shape and what torch actually runs."""

    def __init__(self, args):
        self.device = args.device
        self.config = dict(MODELS[args.model])
        self.real_vocab = self.config["vocab_size"]
        if args.vocab_pad > 0:
            m = args.vocab_pad
            self.config["vocab_size"] = (self.real_vocab + m - 1) // m * m
        self.model_name = args.model
        self.tf32 = args.tf32
        self.compile = bool(args.compile and hasattr(torch, "compile") and self.device == "cuda")
        self.want_fused = args.fused_adamw
        self.fused_adamw = False  # what the last optimizer built actually runs
        self.repeats, self.steps, self.attention_calls = args.repeats, args.steps, args.attention_calls

    def fields(self, precision, batch, time_):
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # a build without cuDNN
            cudnn = None
        return {"precision": precision, "tf32": self.tf32, "batch": batch, "time": time_, "model": self.model_name,
                "device": torch.cuda.get_device_name() if self.device == "cuda" else "cpu",
                "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn}

    def autocast(self, precision):
        if precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=torch.bfloat16)

    def synchronize(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def windows_ms(self, f, calls):
        """ms per call of each of --repeats windows of `calls` calls, after 3 warm-up calls."""
        for _ in range(3):
            f()
        self.synchronize()
        times = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    f()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / calls)
            else:
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                times.append((time.perf_counter() - start) * 1e3 / calls)
        return times

    def model(self, config=None):
        torch.manual_seed(0)
        model = torch_gpt.GPT(config or self.config).to(self.device)
        return model, (torch.compile(model) if self.compile else model)

    def optimizer(self, model, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.fused_adamw = False
        if self.want_fused:
            try:  # fused=True: torch >= 2.0 on CUDA (and the CPU from 2.4)
                opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
                self.fused_adamw = True
                return opt
            except (TypeError, RuntimeError, ValueError):
                pass
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)  # torch's default: foreach on CUDA

    def train_step(self, model, opt, precision, clip=1.0):
        """One step on (x, y): zero_grad, forward + loss, backward, clipping, AdamW."""
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with self.autocast(precision):
                loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            return loss
        return step


def attention_backend(precision):
    """The context that picks scaled_dot_product_attention's backend, and its name:
    flash for bf16 (the issue's baseline), torch's own choice for f32."""
    if not HAS_SDPA:
        return contextlib.nullcontext, "explicit masked softmax (no scaled_dot_product_attention)"
    if precision == "bf16" and hasattr(torch.nn, "attention"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)), "flash"
    return contextlib.nullcontext, "default"


def dtype_of(precision):
    return torch.bfloat16 if precision == "bf16" else torch.float32


def time_attention(run, precision, batch):
    dtype = dtype_of(precision)
    B, T, H, C = batch, run.config["block_size"], run.config["n_head"], run.config["n_embd"]
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * C, device=run.device, dtype=dtype, requires_grad=True)
    gy = torch.randn(B, H, T, C // H, device=run.device, dtype=dtype)
    ctx, backend = attention_backend(precision)

    def call():
        with ctx():
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
            attention(q, k, v).backward(gy)
        qkv.grad = None

    windows = run.windows_ms(call, run.attention_calls)
    # scaled_dot_product_attention is called directly: nothing compiled, no optimizer.
    return {"case": "attention", **run.fields(precision, B, T), "compile": False, "fused_adamw": False,
            "heads": H, "head_dim": C // H, "calls": run.attention_calls,
            "ms": round(statistics.median_low(windows), 4), "rounds_ms": [round(t, 4) for t in windows],
            "backend": backend}


def flops_per_token(model, c):
    """nanoGPT's estimate_mfu: 6 N + 12 L H Q T, N the parameters less the position table."""
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * c["n_layer"] * c["n_head"] * (c["n_embd"] // c["n_head"]) * c["block_size"]


def time_step(run, precision, batch):
    model, compiled = run.model()
    opt = run.optimizer(model)
    g = torch.Generator().manual_seed(1)
    T = run.config["block_size"]
    batches = [tuple(torch.randint(0, run.real_vocab, (batch, T), generator=g).to(run.device) for _ in range(2))
               for _ in range(2)]
    step = run.train_step(compiled, opt, precision)
    state = {"n": 0, "loss": None}

    def call():
        x, y = batches[state["n"] % 2]
        state["n"] += 1
        state["loss"] = step(x, y)

    windows = run.windows_ms(call, run.steps)
    return {"case": "step", **run.fields(precision, batch, T), "compile": run.compile,
            "fused_adamw": run.fused_adamw, "vocab": run.config["vocab_size"],
            "params": sum(p.numel() for p in model.parameters()),  # parameters() lists the tied table once
            "flops_per_token": flops_per_token(model, run.config),
            "ms": round(statistics.median_low(windows), 4), "rounds_ms": [round(t, 4) for t in windows],
            "loss": float(state["loss"].item())}


def same_work(run, directory, precisions):
    """The same-work check: troupe's initial weights and batches from
    DIR/same-work-<model>-v<vocab>.h5, trained here for the file's steps."""
    import h5py

    path = Path(directory) / f"same-work-{run.model_name}-v{run.config['vocab_size']}.h5"
    if not path.exists():
        raise SystemExit(f"torch_gpu_gpt.py: {path} does not exist; run gpu_gpt_bench --same-work {directory} "
                         f"first (with the same --model and --vocab-pad)")
    with h5py.File(path, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        c = {k: int(attrs[k]) for k in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")}
        if c != run.config:
            raise SystemExit(f"torch_gpu_gpt.py: {path} holds a model of {c}, --model {run.model_name} with "
                             f"this --vocab-pad is {run.config}")
        init = {}

        def visit(name, item):
            if isinstance(item, h5py.Dataset):
                init[name] = torch.from_numpy(item[()])

        f["init"].visititems(visit)
        xs = torch.from_numpy(f["batches/x"][()])
        ys = torch.from_numpy(f["batches/y"][()])
    steps = int(attrs["steps"])
    if xs.shape[0] != steps or ys.shape != xs.shape:
        raise SystemExit(f"torch_gpu_gpt.py: {path}: batches x {tuple(xs.shape)}, y {tuple(ys.shape)} for "
                         f"{steps} steps")
    hyper = dict(lr=float(attrs["lr"]), betas=(float(attrs["beta1"]), float(attrs["beta2"])),
                 eps=float(attrs["eps"]), weight_decay=float(attrs["weight_decay"]))
    rows = []
    for precision in precisions:
        model = torch_gpt.GPT(c)
        model.load_state_dict(init, strict=True)  # the tied table under both of torch's names
        model.to(run.device)
        compiled = torch.compile(model) if run.compile else model
        step = run.train_step(compiled, run.optimizer(model, **hyper), precision, clip=float(attrs["clip"]))
        # Step i's loss is batch i's before its update, as troupe records it.
        losses = [float(step(xs[i].to(run.device), ys[i].to(run.device)).item()) for i in range(steps)]
        rows.append({"case": "same work", **run.fields(precision, int(xs.shape[1]), c["block_size"]),
                     "compile": run.compile, "fused_adamw": run.fused_adamw, "vocab": c["vocab_size"],
                     "steps": steps, "losses": losses})
        del model, compiled
        if run.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def time_ops(run, precision, batch):
    dtype = dtype_of(precision)
    dev = run.device
    T, C, V = run.config["block_size"], run.config["n_embd"], run.config["vocab_size"]
    N = batch * T
    torch.manual_seed(0)

    def rows(cols, grad=False):
        return torch.randn(N, cols, device=dev, dtype=dtype, requires_grad=grad)

    times = {}

    def time_(name, f):
        times[name] = round(statistics.median_low(run.windows_ms(f, run.steps)), 3)

    def forward_and_backward(name, module, x, gy):
        def forward():
            with torch.no_grad():
                module(x)

        def both():
            module(x).backward(gy)
            x.grad = None

        time_(name + " forward", forward)
        time_(name + " forward+backward", both)

    for name, i, o in [("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C),
                       ("mlp.c_proj", 4 * C, C)]:
        forward_and_backward(name, torch.nn.Linear(i, o, device=dev, dtype=dtype), rows(i, True), rows(o))
    forward_and_backward("lm_head", torch.nn.Linear(C, V, bias=False, device=dev, dtype=dtype), rows(C, True),
                         rows(V))
    with torch.no_grad(), attention_backend(precision)[0]():
        H = run.config["n_head"]
        q, k, v = (t.view(batch, T, H, C // H).transpose(1, 2) for t in rows(3 * C).split(C, dim=1))
        time_("attention forward", lambda: attention(q, k, v))
    with torch.no_grad():
        y, bias = rows(3 * C), torch.randn(3 * C, device=dev, dtype=dtype)
        time_("bias add [N, 3C] + [3C]", lambda: y.add_(bias))
        a, b = rows(C), rows(C)
        time_("residual add [N, C]", lambda: a + b)
    gelu = torch.nn.GELU(approximate="tanh")
    forward_and_backward("gelu (tanh) [N, 4C]", gelu, rows(4 * C, True), rows(4 * C))
    forward_and_backward("layer norm [N, C]", torch.nn.LayerNorm(C, device=dev, dtype=dtype), rows(C, True),
                         rows(C))
    ids = torch.randint(0, run.real_vocab, (batch, T), device=dev)
    wte = torch.nn.Embedding(V, C, device=dev, dtype=dtype)
    gy = torch.randn(batch, T, C, device=dev, dtype=dtype)

    def embedding_forward():
        with torch.no_grad():
            wte(ids)

    def embedding_both():
        wte(ids).backward(gy)
        wte.weight.grad = None

    time_("embedding [B, T] -> [B, T, C] forward", embedding_forward)
    time_("embedding [B, T] -> [B, T, C] forward+backward", embedding_both)
    logits, targets = rows(V, True), torch.randint(0, run.real_vocab, (N,), device=dev)

    def loss_forward():
        with torch.no_grad():
            F.cross_entropy(logits, targets)

    def loss_both():
        F.cross_entropy(logits, targets).backward()
        logits.grad = None

    time_("cross entropy [N, V] forward", loss_forward)
    time_("cross entropy [N, V] forward+backward", loss_both)
    return {"ops": "torch " + precision, "batch": batch, "vocab": V, "tf32": run.tf32, "ms_per_call": times}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", action="append", choices=["f32", "bf16"], help="repeatable; default both")
    parser.add_argument("--batch", type=int, action="append", help="repeatable; default 8")
    parser.add_argument("--repeats", type=int, default=5, help="timing windows")
    parser.add_argument("--steps", type=int, default=5, help="step calls per window")
    parser.add_argument("--attention-calls", type=int, default=100, help="attention calls per window")
    parser.add_argument("--vocab-pad", type=int, default=0, help="pad the vocabulary to a multiple of M (0: none)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 in f32 matmuls and cuDNN")
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-small")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model where torch has it")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) where supported")
    parser.add_argument("--settings", choices=["eager", "nanogpt"], default="eager",
                        help="nanogpt = --compile --fused-adamw --vocab-pad 64")
    parser.add_argument("--same-work", metavar="DIR", help="run the same-work check against DIR instead of timing")
    parser.add_argument("--ops", action="store_true", help="time each kind of layer alone")
    args = parser.parse_args(argv)
    if args.settings == "nanogpt":
        args.compile = args.fused_adamw = True
        args.vocab_pad = args.vocab_pad or 64
    args.precision = args.precision or ["f32", "bf16"]
    args.batch = args.batch or [8]
    if min(args.batch) < 1 or args.repeats < 1 or args.steps < 1 or args.attention_calls < 1 or args.vocab_pad < 0:
        parser.error("--batch, --repeats, --steps and --attention-calls must be >= 1, --vocab-pad >= 0")
    return args


def main():
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpu_gpt.py: no CUDA device", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch_gpt.CausalSelfAttention.forward = attention_forward
    torch_gpt.GPT.forward = gpt_forward
    run = Run(args)
    if run.compile:  # a model per precision and batch, each its own graph
        from torch import _dynamo  # not `import torch._dynamo`, which would make torch local here
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(_dynamo.config, name):
                setattr(_dynamo.config, name, max(getattr(_dynamo.config, name), 64))
    empty_cache = torch.cuda.empty_cache if args.device == "cuda" else (lambda: None)
    if args.ops:
        for b in args.batch:
            for p in args.precision:
                print(json.dumps(time_ops(run, p, b)))
                empty_cache()
        return 0
    if args.same_work:
        print(json.dumps(same_work(run, args.same_work, args.precision), indent=1))
        return 0
    out = []
    for b in args.batch:
        for p in args.precision:
            out.append(time_attention(run, p, b))
            empty_cache()
    for b in args.batch:
        for p in args.precision:
            out.append(time_step(run, p, b))
            empty_cache()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
