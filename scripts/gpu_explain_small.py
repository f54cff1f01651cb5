"""Exploration for issue 13: explain the validation shapes `make probe` left uncovered for
cuBLAS tf32 (cutlass_80 s1688 align4 + splitKreduce) with a longer budget, and print what
each candidate search found (model, matches, time).

    python scripts/gpu_explain_small.py REPORT.json [BUDGET_S]
"""
from __future__ import annotations

import json
import sys

from probes.backends import detect
from probes.explain import explain_shape
from reference.gemm import GemmModel
from reference.notation import short


def main() -> int:
    rep = json.load(open(sys.argv[1]))
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    for d in rep["devices"]:
        if d["name"] != "cuda-cublas-tf32":
            continue
        base = GemmModel.from_dict(d["model"])
        dev = detect(include=lambda s: s.name == d["name"])[0].device
        for u in d["extra"]["unfitted_kernels"]:
            shape = tuple(u["shape"])
            if shape[0] == 1:
                continue
            e = explain_shape(dev, shape, base_model=base, outputs=4096, budget_s=budget)
            print(shape, short(e.model), e.layout, f"{e.matches}/{e.checked_outputs}",
                  f"{e.wall_s:.1f} s", e.family, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
