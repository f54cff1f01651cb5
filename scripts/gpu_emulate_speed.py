"""Time fp4ref.gemm.emulate on CUDA before/after the fused-FMA fast path (issue 13).

For the three H200 cuBLAS models of issue 13 (bf16, tf32, fp32 split-K) at 64 x 64 outputs
(the 4096 sampled outputs of a shape) and K in --ks: "before" = ``_paths="generic"`` (the
old engine; skipped where it would take longer than --generic-max-k allows), "after" =
the default path (Triton recurrences on CUDA) and ``_paths="fast_torch"`` (the torch loop),
each checked bit for bit against the generic result where that ran, and against the CPU
fast path on the first --cpu-rows rows.  Prints a table; --out writes JSON (atomic).

    python scripts/gpu_emulate_speed.py --out $OUT/emulate_speed.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fp4ref.gemm import emulate  # noqa: E402
from fp4ref.harness.io import write_json_atomic  # noqa: E402
from reference.notation import parse_short  # noqa: E402

MODELS = {"bf16": "F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE",
          "tf32": "F=8 align=25:RTZ:esum acc=23:RTZ G=64:RNE",
          "fp32": "F=1 align=exact acc=23:RNE G=- split=16/T64 out=float32:RNE"}


def operands(name: str, M: int, N: int, K: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    if name == "bf16":
        return a.bfloat16().float(), b.bfloat16().float()
    if name == "tf32":  # keep 10 fraction bits
        return tuple((x.view(torch.int32) & ~0x1FFF).view(torch.float32) for x in (a, b))
    return a, b


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    x, y = x.cpu(), y.cpu()
    return bool(((x.view(torch.int32) == y.view(torch.int32)) | (x.isnan() & y.isnan())).all())


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    return y, time.perf_counter() - t


def one(name: str, K: int, args) -> dict:
    m = parse_short(MODELS[name])
    a, b = operands(name, args.m, args.n, K, seed=K)
    ac, bc = a.cuda(), b.cuda()
    row = {"model": name, "short": MODELS[name], "K": K, "outputs": args.m * args.n}
    emulate(m, ac[:2, :min(K, 256)], bc[:min(K, 256)], _paths="auto")  # compile the kernels
    after, row["after_s"] = timed(lambda: emulate(m, ac, bc))
    fast_torch, row["fast_torch_s"] = timed(lambda: emulate(m, ac, bc, _paths="fast_torch"))
    row["fast_torch_equal"] = same_bits(fast_torch, after)
    if K <= args.generic_max_k[name]:
        before, row["before_s"] = timed(lambda: emulate(m, ac, bc, _paths="generic"))
        row["equal_to_generic"] = same_bits(after, before)
        row["speedup"] = round(row["before_s"] / row["after_s"], 1)
    r = args.cpu_rows
    row["equal_to_cpu_rows"] = same_bits(after[:r], emulate(m, a[:r], b))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ks", default="4096,16384,12347")
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--cpu-rows", type=int, default=2)
    p.add_argument("--generic-max-k", default="bf16=16384,tf32=16384,fp32=4096",
                   help="largest K per model at which the slow generic path is timed")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.generic_max_k = {k: int(v) for k, v in (x.split("=") for x in args.generic_max_k.split(","))}
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 2
    rows, ok = [], True
    for K in (int(k) for k in args.ks.split(",")):
        for name in MODELS:
            r = one(name, K, args)
            rows.append(r)
            ok &= all(r.get(k, True) for k in ("fast_torch_equal", "equal_to_generic", "equal_to_cpu_rows"))
            print(f"{name:5s} K={K:6d} {r['outputs']} outputs: before(generic) "
                  f"{r.get('before_s', float('nan')):8.2f} s  after {r['after_s']:7.3f} s  "
                  f"(torch loop {r['fast_torch_s']:6.3f} s)  x{r.get('speedup', '-')}  "
                  f"equal: generic={r.get('equal_to_generic', '-')} torch={r['fast_torch_equal']} "
                  f"cpu={r['equal_to_cpu_rows']}", flush=True)
    if args.out:
        write_json_atomic(args.out, {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "rows": rows, "all_equal": ok})
    print("ALL BIT-IDENTICAL" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
