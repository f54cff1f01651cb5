"""Train a small byte-level transformer LM under BF16, TE-NVFP4 and UE5M3 recipes.

Same seed, same data, same batches for every run; the FP4 runs route every block linear
(qkv, attention out, fc1, fc2) through ``fp4ref.nn.Linear`` (quantized operands, GEMMs
emulated bit-exactly under a GEMM model: Triton on CUDA, the torch emulator otherwise).
Embedding and LM head stay high precision.  Data: a synthetic corpus generated here
(seeded templates over a small vocabulary), no downloads.

    python scripts/train_lm.py --out /tmp/lm                # the H200 configuration
    python scripts/train_lm.py --out /tmp/lm --tiny         # seconds on a CPU

Writes <out>/losses.json ({run: {"step": [...], "loss": [...], "seconds": s}}) and
<out>/losses.png (matplotlib) or <out>/losses.svg (fallback).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fp4ref.nn import Linear, TENVFP4Quantizer, UE5M3Quantizer  # noqa: E402

RUNS = ("bf16", "te_nvfp4", "ue5m3")


# ------------------------------------------------------------------ data
def make_corpus(n_bytes: int, seed: int = 1234) -> bytes:
    """Deterministic English-like text: templates, agreement, counting, simple facts."""
    rng = random.Random(seed)
    names = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
    things = ["apple", "book", "river", "stone", "lamp", "violin", "garden", "engine", "bridge"]
    colors = ["red", "green", "blue", "black", "white", "golden", "silver"]
    verbs = [("sees", "saw"), ("finds", "found"), ("paints", "painted"), ("moves", "moved"),
             ("builds", "built"), ("keeps", "kept")]
    numbers = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    out = []
    size = 0
    while size < n_bytes:
        r = rng.random()
        n, t, c = rng.choice(names), rng.choice(things), rng.choice(colors)
        v = rng.choice(verbs)
        if r < 0.3:
            s = f"{n} {v[0]} the {c} {t}. yesterday {n} {v[1]} a {t} too.\n"
        elif r < 0.55:
            a = rng.randrange(10)
            b = rng.randrange(10 - a)
            s = f"{numbers[a]} plus {numbers[b]} is {numbers[a + b]}.\n"
        elif r < 0.8:
            k = rng.randrange(3, 9)
            s = "count: " + " ".join(numbers[:k]) + ".\n"
        else:
            s = f"the {t} of {n} is {c}; ask {n} about the {c} {t}.\n"
        out.append(s)
        size += len(s)
    return "".join(out).encode()[:n_bytes]


# ------------------------------------------------------------------ model
class Block(nn.Module):
    def __init__(self, d, heads, make_linear):
        super().__init__()
        self.h = heads
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.qkv = make_linear(d, 3 * d)
        self.proj = make_linear(d, d)
        self.fc1 = make_linear(d, 4 * d)
        self.fc2 = make_linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, d, layers, heads, seq, make_linear):
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, make_linear) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def linear_factory(run: str, model: str, seed: int):
    counter = [0]

    def make(i, o):
        counter[0] += 1
        if run == "bf16":
            return _BF16Linear(i, o)
        if run == "te_nvfp4":
            q = TENVFP4Quantizer(seed=seed * 1000 + counter[0])
        else:
            q = UE5M3Quantizer(seed=seed * 1000 + counter[0], layer=counter[0])
        return Linear(i, o, quantizer=q, model=model)
    return make


class _BF16Linear(nn.Linear):
    """BF16 baseline: operands rounded to bfloat16, FP32 accumulation (cuBLAS / CPU)."""

    def forward(self, x):
        b = None if self.bias is None else self.bias.bfloat16()
        return F.linear(x.bfloat16(), self.weight.bfloat16(), b).float()


# ------------------------------------------------------------------ training
def dump_activations(model, x, path) -> None:
    """The last block's fc2 input (post-GELU activations, [B*T, 4d]) on batch ``x`` and its
    weight ([d, 4d]), float32, written atomically: the bench's "activations" operands
    (fp4ref.harness.bench_gemm, FP4REF_ACTIVATIONS)."""
    fc2, got = model.blocks[-1].fc2, {}

    def keep(module, inp, out):  # returns None: the output stays as it is
        got.setdefault("x", inp[0].detach())
    h = fc2.register_forward_hook(keep)
    with torch.no_grad():
        model(x)
    h.remove()
    tmp = path + ".tmp"
    torch.save({"fc2_in": got["x"].float().reshape(-1, got["x"].shape[-1]).cpu(),
                "fc2_weight": fc2.weight.detach().float().cpu()}, tmp)
    os.replace(tmp, path)


def train(run, cfg, data, device, log_every):
    torch.manual_seed(cfg["seed"])
    model = LM(cfg["d"], cfg["layers"], cfg["heads"], cfg["seq"],
               linear_factory(run, cfg["gemm_model"], cfg["seed"])).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(cfg["seed"])
    steps, losses = [], []
    t0 = time.time()
    for step in range(cfg["steps"]):
        ix = torch.randint(0, len(data) - cfg["seq"] - 1, (cfg["batch"],), generator=gen)
        x = torch.stack([data[i:i + cfg["seq"]] for i in ix]).to(device)
        y = torch.stack([data[i + 1:i + 1 + cfg["seq"]] for i in ix]).to(device)
        lr = cfg["lr"] * min(1.0, (step + 1) / cfg["warmup"]) * \
            (0.5 * (1 + math.cos(math.pi * step / cfg["steps"])) * 0.9 + 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps.append(step)
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == cfg["steps"] - 1):
            print(f"[{run}] step {step:4d} loss {losses[-1]:.4f} ({time.time() - t0:.1f}s)", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if cfg.get("dump") and run == "bf16":
        dump_activations(model, x, cfg["dump"])
        print(f"[{run}] activations of the trained model: {cfg['dump']}", flush=True)
    return {"step": steps, "loss": losses, "seconds": time.time() - t0}


def write_plot(results, out_dir) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for run, r in results.items():
            ax.plot(r["step"], r["loss"], label=run, lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/byte)")
        ax.legend()
        ax.grid(alpha=0.3)
        path = os.path.join(out_dir, "losses.png")
        fig.tight_layout()
        fig.savefig(path + ".tmp.png", dpi=120)
        os.replace(path + ".tmp.png", path)
        return path
    except ImportError:
        return _write_svg(results, out_dir)


def _write_svg(results, out_dir) -> str:
    W, H, P = 700, 400, 50
    allv = [v for r in results.values() for v in r["loss"] if math.isfinite(v)] or [0.0, 1.0]
    lo, hi = min(allv), max(allv)
    hi = hi if hi > lo else lo + 1
    n = max(max(r["step"], default=0) for r in results.values()) or 1
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">training loss</text>']
    for i, (run, r) in enumerate(results.items()):
        pts = " ".join(f"{P + (W - 2 * P) * s / n:.1f},{H - P - (H - 2 * P) * (v - lo) / (hi - lo):.1f}"
                       for s, v in zip(r["step"], r["loss"]) if math.isfinite(v))
        c = colors[i % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.2" points="{pts}"/>')
        parts.append(f'<text x="{W - P - 90}" y="{P + 16 * i}" fill="{c}" font-size="12">{run}</text>')
    parts.append(f'<text x="{P}" y="{H - 15}" font-size="11">step 0 .. {n}; loss {lo:.3f} .. {hi:.3f}</text>')
    parts.append("</svg>")
    path = os.path.join(out_dir, "losses.svg")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(parts))
    os.replace(path + ".tmp", path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="a few-second CPU configuration")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--gemm-model", default="probe_matched")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump-activations", default=None, metavar="PATH",
                    help="after the bf16 run: its last fc2 input and weight (torch.save) for "
                         "make bench's activations row (FP4REF_ACTIVATIONS=PATH)")
    args = ap.parse_args(argv)
    if args.tiny:
        cfg = dict(d=32, layers=1, heads=2, seq=16, batch=2, steps=3, lr=3e-3, warmup=2)
    else:
        cfg = dict(d=256, layers=4, heads=4, seq=128, batch=16, steps=200, lr=2e-3, warmup=20)
    if args.steps is not None:
        cfg["steps"] = args.steps
    cfg["seed"] = args.seed
    cfg["gemm_model"] = args.gemm_model
    cfg["dump"] = args.dump_activations
    runs = [check for check in args.runs.split(",") if check]
    for r in runs:
        if r not in RUNS:
            raise SystemExit(f"--runs: unknown value {r!r}; valid choices: {', '.join(RUNS)}")
    os.makedirs(args.out, exist_ok=True)
    data = torch.tensor(list(make_corpus(2_000_000 if not args.tiny else 20_000)), dtype=torch.long)
    device = torch.device(args.device)
    results = {}
    t0 = time.time()
    path = os.path.join(args.out, "losses.json")
    for r in runs:
        results[r] = train(r, cfg, data, device, log_every=max(1, cfg["steps"] // 20))
        # written after every run, so a time-boxed session keeps the finished curves
        meta = {"config": cfg, "device": str(device), "total_seconds": time.time() - t0,
                "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
        with open(path + ".tmp", "w") as f:
            json.dump({"meta": meta, "runs": results}, f)
        os.replace(path + ".tmp", path)
        plot = write_plot(results, args.out)
    print(f"wrote {path} and {plot}; total {meta['total_seconds']:.1f}s")
    for r, v in results.items():
        tail = v["loss"][-10:]
        print(f"  {r}: final loss (mean of last {len(tail)}) {sum(tail) / len(tail):.4f}, {v['seconds']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
