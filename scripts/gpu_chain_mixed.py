"""MXFP4 / NVFP4 operands whose first instructions are FAST and the rest GENERAL (session 20,
call h), under gen_pct 100 / 60 / 40 (``fp4ref.chain_triton``: from which share of non-FAST
instructions a block takes the GENERAL-only kernel): output bits compared across gen_pct,
times at 8192^3 (median of 3 after one warm-up; CUDA events).  Without CUDA it runs the same
at 128^3 in the Triton interpreter (TRITON_INTERPRET=1), untimed.

    PYTHONPATH=. python scripts/gpu_chain_mixed.py [out.json]
"""
import json
import os
import sys

import torch

from fp4ref import chain_triton as CT
from fp4ref.harness.timing import median_seconds

DEV = "cuda" if torch.cuda.is_available() else "cpu"
S = 8192 if DEV == "cuda" else 128
CFG = "128,128,8,3,8,16,1,2,8,3,{}" if DEV == "cuda" else "32,32,4,1,2,4,1,2,4,2,{}"


def _bytes(g, shape, lo, hi):
    return torch.randint(lo, hi, shape, generator=g, device=DEV, dtype=torch.int32).to(torch.uint8)


def operands(sf, block, nfast, seed):
    """Random codes; the first nfast instructions' scales narrow (FAST), the rest uniform bytes."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    a, b = (_bytes(g, (S, S // 2), 0, 256) for _ in "ab")
    lo, hi = (127, 129) if sf == "ue8m0" else (48, 64)
    sa, sb = (_bytes(g, (S, S // block), 0, 256) for _ in "ab")
    j = nfast * 64 // block
    for s in (sa, sb):
        s[:, :j] = _bytes(g, (S, j), lo, hi)
    return a, b, sa, sb


def call(ops, sf, block, cnt=None):
    return CT.chain_mm(*ops, scale_format=sf, block=block, counts=cnt)


def timed(ops, sf, block, reps=3):
    """Median ms of ``reps`` calls after one warm-up (fp4ref.harness.timing); 0 on the CPU."""
    if DEV != "cuda":
        call(ops, sf, block)
        return 0.0
    return 1e3 * median_seconds(lambda: call(ops, sf, block), DEV, reps)


out = {}
NP = S // 64
for sf, block, tag in (("ue8m0", 32, "mx"), ("ue4m3", 16, "nv")):
    for name, nfast in (("allfast", NP), ("fast1", 1), ("fast40pct", NP * 4 // 10),
                        ("fast50pct", NP // 2),
                        ("fast0", 0)):
        if tag == "nv" and name in ("fast40pct", "fast0"):
            continue
        ops = operands(sf, block, nfast, 1 + nfast)
        ref = None
        for pct in (100, 60, 40):
            os.environ["FP4REF_CHAIN_CONFIG"] = CFG.format(pct)
            cnt = torch.zeros(3, dtype=torch.int32, device=DEV)
            y = call(ops, sf, block, cnt).view(torch.int32)
            diff = 0 if ref is None else int((y != ref).sum())
            ref = y if ref is None else ref
            t = timed(ops, sf, block)
            out[f"{tag}_{name}@{pct}"] = {"ms": round(t, 3), "diff_vs_pct100": diff,
                                          "counts": cnt.tolist()}
            print(f"{tag}_{name:10s} gen_pct {pct:3d}: {t:7.2f} ms  diff {diff}  counts "
                  f"{cnt.tolist()}", flush=True)
        del ops, ref
if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), indent=1)
