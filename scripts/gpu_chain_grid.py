"""Issue 17: the chain's GENERAL path on the GPU, a grid of GENERAL-capable kernel shapes
(FP4REF_CHAIN_CONFIG's full_warps / full_split) x group-dot modes (FP4REF_CHAIN_GENERAL),
timed side by side with the Gaussian operands and cuBLAS bf16 of the same run (public
``fp4ref.scaled_mm``, as fp4ref.harness.bench_chain times it).  Prints one JSON line per row.

    python scripts/gpu_chain_grid.py --size 8192 --configs "128,128,8,3,8,8,1;128,128,8,3,8,4,2" \
        --modes masked,slices --out grid.json
    python scripts/gpu_chain_grid.py --pick grid.json   # (config, mode) of least worst slowdown
    python scripts/gpu_chain_grid.py --table grid.json  # the rows, one line each
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp4ref.harness import bench_chain as B  # noqa: E402
from fp4ref.harness.timing import median_seconds  # noqa: E402
from fp4ref.scaled_gemm import scaled_mm  # noqa: E402


def pick(path: str) -> str:
    """'config mode' of the grid row set with the least worst slowdown against the Gaussian
    operands of its format (same run)."""
    rows = json.loads(Path(path).read_text())["rows"]
    gauss = {r["set"].split("_")[0]: r["seconds"] for r in rows if r["set"].endswith("gaussian")}
    worst: dict = {}
    for r in rows:
        if "config" in r and not r["set"].endswith("gaussian"):
            k = (r["config"], r["mode"])
            worst[k] = max(worst.get(k, 0.0), r["seconds"] / gauss[r["set"].split("_")[0]])
    best = min(worst, key=worst.get)
    print(f"# worst slowdown per (config, mode): {worst}", file=sys.stderr)
    return " ".join(best)


def table(path: str) -> str:
    """The grid's rows, one line each: set, config, mode, milliseconds."""
    return "\n".join(f"{r['set'][:22]:22s} {r.get('config', ''):18s} {r.get('mode', ''):7s} "
                     f"{r['seconds'] * 1e3:8.2f} ms"
                     for r in json.loads(Path(path).read_text())["rows"])


def main() -> int:
    if sys.argv[1:2] in (["--pick"], ["--table"]):
        print((pick if sys.argv[1] == "--pick" else table)(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--configs", default="128,128,8,3,8,8,1")
    ap.add_argument("--modes", default="slices")
    ap.add_argument("--sets", default="nvfp4_gaussian,nvfp4_wide_scales_nan,nvfp4_heavy_tails,"
                    "mxfp4_gaussian,mxfp4_wide_scales_nan")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    S, dev = args.size, torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(S, S, generator=gen).to(dev, torch.bfloat16) for _ in "ab"]
    rows = [{"set": "cublas_bf16", "seconds": median_seconds(lambda: x[0] @ x[1], dev, 5)}]
    print(json.dumps(rows[-1]), flush=True)
    del x
    for name in args.sets.split(","):
        fmt, ac, asc, bc, bsc, al = B._operands(name, S, gen)
        ops = B._packed(ac, asc, bc, bsc, fmt, dev)
        # Gaussian operands never reach the GENERAL-capable kernel: the default times them
        grid = [("", "")] if name.endswith("gaussian") else [
            (c, m) for c in args.configs.split(";") for m in args.modes.split(",")]
        for cfg, mode in grid:
            for var, val in (("FP4REF_CHAIN_CONFIG", cfg), ("FP4REF_CHAIN_GENERAL", mode)):
                os.environ.pop(var, None) if not val else os.environ.__setitem__(var, val)
            sec = median_seconds(lambda: scaled_mm(*ops, alpha=al, out_dtype=torch.bfloat16),
                                 dev, 3)
            rows.append({"set": name, "config": cfg, "mode": mode, "seconds": sec,
                         "fraction_of_cublas_bf16": rows[0]["seconds"] / sec,
                         "paths": B._paths(ops, fmt, dev)})
            print(json.dumps(rows[-1]), flush=True)
        del ops
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "size": S, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
