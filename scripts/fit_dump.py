"""Score GEMM models on raw outputs recorded by scripts/gpu_dump.py (offline, on a CPU).

    python scripts/fit_dump.py --dump DIR_OR_NPZ... --model 'DEVICE=JSON' ... --out FILE.json

Operands are regenerated from the recorded seeds (the SHA-256 digest stored with each GEMM
must match, or the GEMM is refused).  For each device and GEMM: the shape, operand kind,
the kernel cuBLAS/Triton launched, and the bit-exact agreement of the model.  This is how
a family extension is checked against hardware outputs between GPU sessions.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from probes.device import Capabilities  # noqa: E402
from probes.sim import output_bits, simulate_gemm  # noqa: E402
from probes.validate import random_operands  # noqa: E402
from reference.gemm import GemmModel  # noqa: E402


def caps_for(name: str) -> Capabilities:
    """The capabilities each recorded device declared (probes/backends/cuda.py, triton_fp8.py)."""
    big = dict(probe_mn=64, max_batch=64, max_k=16384)
    if name.startswith("cuda-cublas-"):
        fmt = {"bfloat16": "bfloat16", "float16": "float16", "tf32": "tf32", "fp32": "float32"}[name[12:]]
        return Capabilities(fmt, fmt, "float32", **big)
    if name.startswith("triton-dot-e4m3"):
        return Capabilities("float8_e4m3fn", "float8_e4m3fn", "float32", k_multiple=128, mn_multiple=64, **big)
    if name.startswith("cuda-scaled_mm-e4m3"):
        out = "float32" if name.endswith(("floa", "float32")) else "bfloat16"
        return Capabilities("float8_e4m3fn", "float8_e4m3fn", out, alpha="rowwise" if "rowwise" in name
                            else "tensorwise", k_multiple=16, mn_multiple=16, **big)
    raise ValueError(f"device: unknown recorded device {name!r}")


def gemms(path: str):
    """(info, kind, kernel, a, b, alpha, observed) per recorded random GEMM."""
    name = os.path.basename(path)[:-4]
    caps = caps_for(name)
    z = np.load(path)
    i = 0
    while f"r{i}_info" in z:
        M, N, K = (int(v) for v in z[f"r{i}_info"])
        kind = str(z[f"r{i}_kind"])
        a, b, _, _ = random_operands(caps, M, N, K, np.random.default_rng(int(z[f"r{i}_seed"])), kind)
        if hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest() != str(z[f"r{i}_sha"]):
            raise RuntimeError(f"{path} r{i}: regenerated operands differ from the recorded digest")
        alpha = None
        if f"r{i}_sa" in z:
            alpha = (z[f"r{i}_sa"], z[f"r{i}_sb"])
        elif caps.alpha == "tensorwise":
            alpha = (1.0, 1.0)
        elif caps.alpha == "rowwise":
            alpha = (np.ones(M), np.ones(N))
        kern = str(z[f"r{i}_kernels"]).split("|")
        kern = [k.strip() for k in kern if "Memcpy" not in k]
        yield (M, N, K), kind, kern, a, b, alpha, z[f"r{i}_c"].astype(np.float64)
        i += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", nargs="+", required=True, help=".npz files or folders of them")
    ap.add_argument("--model", action="append", default=[], help="DEVICE=JSON (GemmModel.to_dict fields)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-k", type=int, default=1 << 30, help="skip GEMMs with a larger K (time)")
    ap.add_argument("--try-splits", action="store_true",
                    help="as validation does: where a shape's first GEMM misses, search the per-shape "
                         "split-K schedules on it, then score every GEMM of that shape with the result")
    args = ap.parse_args(argv)
    models = {}
    for spec in args.model:
        dev, _, js = spec.partition("=")
        models[dev] = GemmModel.from_dict(json.loads(js))
    files = []
    for p in args.dump:
        files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".npz")) if os.path.isdir(p) else [p]
    out = {"schema": "fp4ref.dump-fit", "schema_version": 1, "devices": []}
    for path in files:
        name = os.path.basename(path)[:-4]
        if name not in models:
            continue
        m = models[name]
        caps = caps_for(name)
        rows, tot, ok = [], 0, 0
        m = m.replace(output=caps.output)
        per_shape: dict = {}
        for shape, kind, kern, a, b, alpha, obs in gemms(path):
            if shape[2] > args.max_k:
                continue
            got = output_bits(obs, caps.output)
            here = per_shape.get(shape, m)
            exp = simulate_gemm(here, a, b, alpha=alpha)
            if args.try_splits and shape not in per_shape and not np.array_equal(exp, got):
                from probes.validate import _try_splits
                fit = _try_splits(m, a, b, None, None, caps, alpha, got)
                per_shape[shape] = here = fit or m
                exp = simulate_gemm(here, a, b, alpha=alpha)
            per_shape.setdefault(shape, here)
            match = int((exp == got).sum())
            row = {"shape": list(shape), "kind": kind, "kernels": kern, "outputs": int(got.size),
                   "matches": match}
            if here is not m:
                row["schedule"] = {"split_k": here.split_k, "split_tile": here.split_tile,
                                   "group_size": here.group_size}
            rows.append(row)
            tot += got.size
            ok += match
            print(f"{name} {shape} {kind}: {100 * match / got.size:.2f}%  {' | '.join(kern)[:90]}", flush=True)
        out["devices"].append({"name": name, "model": m.to_dict(), "outputs": int(tot), "matches": int(ok),
                               "gemms": rows})
    from fp4ref.harness.io import write_json_atomic
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
