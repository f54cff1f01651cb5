"""Fit the K order of cuBLAS f16 WMMA kernels on the H200 (session 15c dumps).

    .venv/bin/python scripts/fit_wmma.py [--npz /tmp/dumps15c/wmma.npz] [--full]

cutlass_75_wmma_tensorop_s161616gemm_f16_32x32_64x{1,2}_nn_align1 (split-K + splitKreduce) and
cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_64x1_nn_align2 (no split).  Numpy emulator from
scripts/fit_f16_split.py generalised to F (products per fused step) and the alignment width.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.fit_f16_split import f32, mma_chain, reduce_seq, reduce_tree  # noqa: E402
from scripts.fit_f16_split import residue_first_pad  # noqa: E402


def pad_first(lo, hi, kt, F):
    """Partial tile first, zero-filled after its products (fit_f16_split's, any k-tile)."""
    return residue_first_pad(lo, hi, kt)





def pad_first_front(lo, hi, kt, F):
    """partial tile first, zero fill BEFORE its products (tile aligned to the slice end)."""
    r = (hi - lo) % kt
    if r:
        return np.concatenate([np.full(kt - r, -1), np.arange(lo, hi)])
    return np.arange(lo, hi)


def pad_last(lo, hi, kt, F):
    n = hi - lo
    return np.concatenate([np.arange(lo, hi), np.full((-n) % F, -1)])


PADS = {"first": pad_first, "first-front": pad_first_front, "last": pad_last}


def partials(A, B, bounds, pad, kt, F, p=25):
    I, J = np.meshgrid(np.arange(A.shape[0]), np.arange(B.shape[1]), indexing="ij")
    I, J = I.ravel(), J.ravel()
    out = []
    for lo, hi in bounds:
        idx = pad(lo, hi, kt, F)
        k = np.maximum(idx, 0)
        z = idx < 0
        a = np.where(z[None], 0.0, A[:, k].astype(np.float64))[I]
        b = np.where(z[:, None], 0.0, B[k, :].astype(np.float64)).T[J]
        out.append(mma_chain(a, b, F=F, p=p))
    return np.array(out)


def bits(x, W):
    return int((f32(x).reshape(W.shape).view(np.int32) == W.view(np.int32)).sum())


def load(npz, shape):
    d = np.load(npz, allow_pickle=True)
    k = f"cuda-cublas-float16|{shape}|"
    return d[k + "a"], d[k + "b"], d[k + "out"]


RED = {"seq": reduce_seq, "rev": lambda p: reduce_seq(p, list(range(len(p)))[::-1]), "tree": reduce_tree}


def fit(npz, shape, S_list, aligns=(8, 16, 32, 64), Fs=(8, 16), kts=(16, 32, 64), ps=(25,)):
    from reference.schedule import split_bounds
    A, B, W = load(npz, shape)
    K = A.shape[1]
    n = W.size
    print(f"\n== {shape}: K={K}, {n} outputs")
    best = []
    seen = set()
    for S in S_list:
        for al in aligns:
            bd = tuple(split_bounds(K, S, al))
            for F in Fs:
                for kt in kts:
                    if kt % F:
                        continue
                    for pn, pad in PADS.items():
                        for p in ps:
                            key = (bd, F, kt if pn != "last" else 0, pn, p)
                            if key in seen:
                                continue
                            seen.add(key)
                            parts = partials(A, B, bd, pad, kt, F, p)
                            for rn, rf in RED.items():
                                if len(bd) == 1 and rn != "seq":
                                    continue
                                c = bits(rf(parts), W)
                                best.append((c, S, al, len(bd), bd[0][1] - bd[0][0], F, kt, pn, p, rn))
    best.sort(key=lambda t: -t[0])
    for t in best[:15]:
        c, S, al, ns, L, F, kt, pn, p, rn = t
        print(f"  {c}/{n}: S={S} align={al} -> {ns} slices of {L}; F={F} k_tile={kt} pad={pn} p={p} red={rn}")
    return best


TC16 = "F=16 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"
ROW = dict(pattern=r"cutlass_(75|80)_wmma_tensorop_s161616gemm_f16_32x32_64x[12]_nn_align[12]", model=TC16,
           k_tile=64, split_align=8)
CASES = [("64x64x100", 1), ("78x877x813", 8), ("13x1620x4139", 16)]


def scan_S(npz, shape, S_max=64):
    """The fitted rule (F=16, k-tile 64 residue-first, slices rounded to 8, seq add) at every S."""
    from reference.schedule import split_bounds
    A, B, W = load(npz, shape)
    K = A.shape[1]
    seen, hits = set(), []
    for S in range(1, S_max + 1):
        for al in (8, 64):
            bd = tuple(split_bounds(K, S, al))
            if bd in seen:
                continue
            seen.add(bd)
            c = bits(reduce_seq(partials(A, B, bd, pad_first, 64, 16)), W)
            if c > W.size // 2:
                hits.append((S, al, len(bd), c))
    print(f"{shape}: S scan (>half bit-exact): " + ", ".join(f"S={S} al={al} ({n} slices) {c}/{W.size}"
                                                           for S, al, n, c in hits))


def project_path(npz):
    """The rule through the project's objects: KLayout(64, S, 8).pad + fp4ref.gemm.emulate, and a
    probes.kernels.KernelModel row through kernel_operands + probes.sim.simulate_gemm."""
    import torch
    from fp4ref.gemm import emulate
    from fp4ref.native import KLayout
    from reference.notation import parse_short, short
    import probes.kernels as pk
    from probes.sim import output_bits, simulate_gemm
    row = pk.KernelModel(devices=pk._HALF, evidence="fit_wmma", **ROW)
    for shape, S in CASES:
        A, B, W = load(npz, shape)
        K = A.shape[1]
        al = pk.slice_align(row, K)
        lay = KLayout(64, S, al)
        a2, b2 = lay.pad(torch.from_numpy(A), torch.from_numpy(B))
        m = lay.model(parse_short(TC16), K)
        n1 = bits(emulate(m, a2, b2).numpy(), W)
        a3, b3, m3 = pk.kernel_operands(row, A.astype(np.float64), B.astype(np.float64), S)
        got = simulate_gemm(m3, a3, b3)
        n2 = int((got == output_bits(W.astype(np.float64), "float32")).sum())
        print(f"project path {shape}: KLayout(64, {S}, {al}) + emulate({short(m)}): {n1}/{W.size}; "
              f"KernelModel row + simulate_gemm: {n2}/{W.size}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npz", default="/tmp/dumps15c/wmma.npz")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--shape", default=None)
    args = ap.parse_args()
    jobs = [("64x64x100", [1]), ("78x877x813", [8] if not args.full else list(range(1, 65))),
            ("13x1620x4139", [16] if not args.full else list(range(1, 65)))]
    for sh, Ss in jobs:
        if args.shape and sh != args.shape:
            continue
        fit(args.npz, sh, Ss)
    for sh, _ in CASES[1:]:
        scan_S(args.npz, sh)
    project_path(args.npz)


if __name__ == "__main__":
    main()
