"""Issue 17: the chain's GENERAL path on the GPU, a grid of GENERAL-capable kernel shapes
(FP4REF_CHAIN_CONFIG's full_warps / full_split) x group-dot modes (FP4REF_CHAIN_GENERAL),
timed side by side with the Gaussian operands and cuBLAS bf16 of the same run (public
``fp4ref.scaled_mm``, as fp4ref.harness.bench_chain times it).  Prints one JSON line per row.

    python scripts/gpu_chain_grid.py --size 8192 --configs "128,128,8,3,8,8,1;128,128,8,3,8,4,2"
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--configs", default="128,128,8,3,8,8,1")
    ap.add_argument("--modes", default="tma")
    ap.add_argument("--sets", default="nvfp4_gaussian,nvfp4_wide_scales_nan,nvfp4_heavy_tails,"
                    "mxfp4_gaussian,mxfp4_wide_scales_nan")
    ap.add_argument("--exps", default="0", help="FP4REF_CHAIN_EXP values (ablations)")
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
        grid = [("128,128,8,3,8,8,1", "tma")] if name.endswith("gaussian") else [
            (c, m) for c in args.configs.split(";") for m in args.modes.split(",")]
        exps = ["0"] if name.endswith("gaussian") else args.exps.split(",")
        for cfg, mode, exp in [(c, m, e) for c, m in grid for e in exps]:
            os.environ["FP4REF_CHAIN_CONFIG"], os.environ["FP4REF_CHAIN_GENERAL"] = cfg, mode
            os.environ["FP4REF_CHAIN_EXP"] = exp
            sec = median_seconds(lambda: scaled_mm(*ops, alpha=al, out_dtype=torch.bfloat16),
                                 dev, 3)
            rows.append({"set": name, "config": cfg, "mode": mode, "exp": exp, "seconds": sec,
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
