"""Exploration for issue 13: what Triton's fp8 ``tl.dot`` runs with max_num_imprecise_acc=0.

Writes the MMA instructions of the compiled kernel (from its PTX and SASS) for each setting
and random e4m3 operands with the outputs, for offline model fitting:
    python scripts/triton_dump.py --out /tmp/tdump
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re

import numpy as np
import torch

from probes.backends import triton_fp8


def e4m3(rng, shape, heavy):
    x = rng.standard_normal(shape) * (np.exp(2 * rng.standard_normal(shape)) if heavy else 7.0)
    return torch.from_numpy(np.clip(x, -448, 448)).float().to(torch.float8_e4m3fn)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kern = triton_fp8._kernel()
    rng = np.random.default_rng(0)
    dumps, info = {}, {}
    for imp in (0, 32, -1):
        for K in (128, 256, 1024, 4096):
            for heavy in (False, True):
                A = e4m3(rng, (64, K), heavy).cuda()
                Bn = e4m3(rng, (64, K), heavy).cuda()
                C = torch.empty(64, 64, dtype=torch.float32, device="cuda")
                ck = kern[(1, 1)](A, Bn, C, 64, 64, K, A.stride(0), Bn.stride(0), C.stride(0),
                                  BM=64, BN=64, BK=128, IMPRECISE=imp)
                torch.cuda.synchronize()
                tag = f"imp{imp}|K{K}|{'heavy' if heavy else 'gauss'}"
                dumps[tag + "|a"] = A.float().cpu().numpy()
                dumps[tag + "|b"] = Bn.float().cpu().numpy().T.copy()
                dumps[tag + "|out"] = C.cpu().numpy()
                if imp not in info and ck is not None and hasattr(ck, "asm"):
                    asm = ck.asm
                    ins = collections.Counter()
                    for key in ("ptx", "sass"):
                        txt = asm.get(key, "") if hasattr(asm, "get") else ""
                        for m in re.findall(r"\b((?:wgmma|mma|HGMMA|HMMA|QGMMA|IMMA)[\w.]*)", str(txt)):
                            ins[f"{key}:{m}"] += 1
                    info[imp] = dict(ins)
                    with open(os.path.join(args.out, f"ptx_imp{imp}.txt"), "w") as f:
                        f.write(str(asm.get("ptx", ""))[:400000])
    np.savez_compressed(os.path.join(args.out, "triton_dumps.npz"), **dumps)
    with open(os.path.join(args.out, "triton_mma.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
