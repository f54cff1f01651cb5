"""Record raw GEMM outputs of the native devices for offline model fitting.

For each available CUDA device: crafted single-dot probes (a big term plus small terms at
chosen positions and exponent gaps, both signs) and random GEMMs at several shapes and
operand kinds.  Operands and outputs go to one compressed .npz per device, so the family
can be extended and re-fitted on a CPU without the GPU.  Not part of `make probe`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from probes.backends import detect  # noqa: E402
from probes.device import Runner  # noqa: E402
from probes.sim import Operands  # noqa: E402
from probes.validate import random_operands  # noqa: E402

SHAPES = ((256, 256, 64), (128, 128, 256), (64, 64, 1024), (16, 16, 4096), (8, 8, 8192),
          (1, 64, 2048), (96, 80, 48), (64, 64, 100), (64, 64, 1023), (192, 192, 512),
          (64, 64, 16), (64, 64, 32), (64, 64, 128), (64, 64, 2048), (64, 64, 8192), (33, 47, 129),
          (64, 64, 63), (64, 64, 65), (384, 384, 256), (128, 128, 16384))


def crafted(caps, K):
    """(name, a, b) single dots: big product at p0, small product(s) at p1, gap j."""
    small_fmt = caps.a_format.startswith("float8")
    big_e = 10 if small_fmt else 20
    out = []
    poss = [p for p in (1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 511, 512)
            if p < K]
    for p0, p1s in ((0, poss), (K - 1, [0, 1, 16, 32, 64, 128])):
        for p1 in p1s:
            if p1 == p0 or p1 >= K:
                continue
            for j in range(1, 30 if small_fmt else 40):
                for sgn in (1, -1):
                    for nsmall in (1, 3):
                        a = np.zeros(K)
                        b = np.zeros(K)
                        ea = big_e // 2
                        a[p0], b[p0] = 2.0 ** ea, 2.0 ** (big_e - ea)
                        es = big_e - j
                        if small_fmt and es < -18:
                            continue
                        ea = es // 2
                        for t in range(nsmall):
                            q = p1 + t
                            if q >= K or q == p0:
                                continue
                            a[q], b[q] = sgn * 2.0 ** ea, 2.0 ** (es - ea)
                        out.append((f"p0={p0} p1={p1} j={j} s={sgn} n={nsmall}", a, b))
    return out


def _pack(x, fmt):
    """Exact, compact storage of decoded operands (unpack: float32 view / float16)."""
    if fmt == "bfloat16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if fmt.startswith("float8") or fmt == "float16":
        return x.astype(np.float16)
    return x.astype(np.float32)


def _kernels(dev, a, b, alpha):
    """Names of the CUDA kernels one call launches (which kernel cuBLAS picked)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
        if not torch.cuda.is_available():
            return ""
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dev(a, b, alpha=alpha)
        names = {e.name for e in prof.events() if "device_type" in dir(e) and str(e.device_type).endswith("CUDA")}
        return " | ".join(sorted(n for n in names if "copy" not in n.lower() and "elementwise" not in n.lower()))[:2000]
    except Exception as e:  # profiling is a nicety
        return f"profiler failed: {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--random-alpha", action="store_true", help="random per-row/column or tensor scales")
    ap.add_argument("--few", action="store_true", help="three small shapes only, no crafted probes")
    ap.add_argument("--modules", default="probes.backends.cuda,probes.backends.triton_fp8")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dets = detect(tuple(args.modules.split(",")))
    for d in dets:
        if d.device is None:
            print("skip", d.name, d.status, d.reason[:200])
            continue
        if args.only and args.only not in d.name:
            continue
        dev = d.device
        caps = dev.caps
        t0 = time.time()
        rec = {}
        rng = np.random.default_rng(1)
        K = max(256, caps.k_step())
        cr = [] if args.few else crafted(caps, K)
        ops = [Operands(a, b) for _, a, b in cr]
        try:
            outs = Runner(dev).run(ops)
        except Exception as e:
            print("crafted failed", d.name, e)
            outs = np.full(len(ops), np.nan)
        rec["crafted_names"] = np.array([n for n, _, _ in cr])
        nz = [np.flatnonzero(a)[:4] for _, a, _ in cr]
        rec["crafted_K"] = np.array(K)
        rec["crafted_idx"] = np.array([np.pad(z, (0, 4 - len(z)), constant_values=-1) for z in nz])
        rec["crafted_a"] = np.array([np.pad(a[z], (0, 4 - len(z))) for z, (_, a, _) in zip(nz, cr)])
        rec["crafted_b"] = np.array([np.pad(b[z], (0, 4 - len(z))) for z, (_, _, b) in zip(nz, cr)])
        rec["crafted_out"] = outs.astype(np.float32)
        n = 0
        for (M, N, Kx) in (((64, 64, 64), (128, 128, 256), (64, 64, 1024)) if args.few else SHAPES):
            step = caps.k_step() if caps.k_multiple > 1 else 1
            if Kx % step or (caps.a_format in ("float32", "tf32") and M * N * Kx > 1 << 21):
                continue
            mm = caps.mn_multiple
            M2, N2 = -(-M // mm) * mm, -(-N // mm) * mm
            for kind in ("normal", "heavy", "cancel"):
                seed = 1000 + n
                a, b, sa, sb = random_operands(caps, M2, N2, Kx, np.random.default_rng(seed), kind)
                alpha = None
                if caps.alpha == "tensorwise":
                    alpha = (1.0, 1.0)
                if args.random_alpha and caps.alpha != "none":
                    from probes.validate import _random_alpha
                    alpha = _random_alpha(caps, M2, N2, np.random.default_rng(seed + 7))
                    rec[f"r{n}_sa"] = np.asarray(alpha[0], np.float64)
                    rec[f"r{n}_sb"] = np.asarray(alpha[1], np.float64)
                try:
                    c = dev(a, b, alpha=alpha)
                    c2 = dev(a, b, alpha=alpha)
                except Exception as e:
                    print("shape failed", d.name, (M2, N2, Kx), e)
                    continue
                key = f"r{n}"
                rec[key + "_kernels"] = np.array(_kernels(dev, a, b, alpha))
                # operands are regenerated offline from the seed; the digest proves it
                rec[key + "_seed"] = np.array(seed)
                rec[key + "_sha"] = np.array(hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest())
                rec[key + "_c"] = c.astype(np.float32)
                rec[key + "_det"] = np.array(np.array_equal(np.nan_to_num(c, nan=7.0), np.nan_to_num(c2, nan=7.0)))
                rec[key + "_info"] = np.array([M2, N2, Kx])
                rec[key + "_kind"] = np.array(kind)
                n += 1
        np.savez_compressed(os.path.join(args.out, d.name + ".npz"), **rec)
        print(f"{d.name}: {len(cr)} crafted, {n} random GEMMs, {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
