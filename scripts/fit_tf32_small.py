"""Fit the K order / split-K schedule of cuBLAS's tf32 cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4
(+ cublasLt::splitKreduce_kernel) on the H200 (session 16 dumps, /tmp/s16/tf32small.npz).

    PYTHONPATH=. .venv/bin/python scripts/fit_tf32_small.py [--npz /tmp/s16/tf32small.npz] [--top 8]
        [--verify] [--shapes 64x64x100,96x80x48,16x16x4096]

Model per slice: "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE" (also F=4, align 24/26
tried), on the slice's K in k-tiles of ``k_tile`` with the partial tile first (CUTLASS 2.x residue)
or last, optionally a permutation of k inside a tile; S slices of round_up(ceil(K / S), align)
(fp4ref.native.residue_first / reference.schedule.split_bounds); the slices' FP32 partials combined
in FP32 RNE: serial (slice order), reverse, tree (halving), pairwise (recursive halves).

The emulator is an exact numpy transcription (products of tf32 values are exact in float64, aligned
terms are integers < 2**53); ``--verify`` checks it bit for bit against fp4ref.gemm.emulate through
KLayout.pad / KLayout.model on the dumped operands.  Prints per shape the best candidates with
matches / 256, then the rule found and its check through the project's objects.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEV = "cuda-cublas-tf32"
SHAPES = ("64x64x100", "96x80x48", "16x16x4096")
NOEXP = -10 ** 6


def model_text(F=8, p=25):
    return f"F={F} align={p}:RTZ:esum acc=23:RTZ G=- out=float32:RNE"


# ----------------------------------------------------------------------------- data
def load(npz, shape):
    d = np.load(npz, allow_pickle=True)
    k = f"{DEV}|{shape}|"
    return d[k + "a"], d[k + "b"], d[k + "out"]


def tf32_check(x):
    """(values already tf32?, fraction of values with nonzero low 13 mantissa bits)."""
    low = (np.asarray(x, np.float32).view(np.uint32) & 0x1FFF) != 0
    return not low.any(), float(low.mean())


def rtz_tf32(x):
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def rne_tf32(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    return u.astype(np.uint32).view(np.float32)


# ----------------------------------------------------------------------------- exact emulation
class Pairs:
    """The 256 (row, col) outputs of a dump: products and esum exponents, [256, K]."""

    def __init__(self, A, B):
        I, J = np.meshgrid(np.arange(A.shape[0]), np.arange(B.shape[1]), indexing="ij")
        a = A.astype(np.float64)[I.ravel()]
        b = B.astype(np.float64).T[J.ravel()]
        self.P = a * b
        ea = np.frexp(a)[1] - 1
        eb = np.frexp(b)[1] - 1
        self.X = np.where((a != 0) & (b != 0), ea + eb, NOEXP)
        self._cache = {}

    def chain(self, idx, F=8, p=25):
        """FP32 accumulator (float64 holding it) after the fused steps over padded index ``idx``
        (-1: a zero product), F products a step, from +0."""
        key = (idx.tobytes(), F, p)
        if key in self._cache:
            return self._cache[key]
        n = len(idx)
        pad = (-n) % F
        idx = np.concatenate([idx, np.full(pad, -1)]) if pad else idx
        k = np.maximum(idx, 0)
        z = idx < 0
        P = np.where(z[None], 0.0, self.P[:, k])
        X = np.where(z[None], NOEXP, self.X[:, k])
        S = np.zeros(P.shape[0])
        for s in range(0, len(idx), F):
            pp, xx = P[:, s:s + F], X[:, s:s + F]
            eS = np.where(S != 0, np.frexp(S)[1] - 1, NOEXP)
            emax = np.maximum(eS, xx.max(1))
            q = emax - p
            sc = np.ldexp(1.0, -np.where(emax == NOEXP, 0, q))
            tot = np.trunc(S * sc) + np.trunc(pp * sc[:, None]).sum(1)
            m, e = np.frexp(tot)
            r = np.ldexp(np.trunc(np.ldexp(m, 24)), e - 24 + q)
            S = np.where(emax == NOEXP, S, r)
        self._cache[key] = S
        return S


def f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def slice_index(lo, hi, k_tile, where, perm=None):
    """Padded index of slice [lo, hi): k-tiles of k_tile, the partial tile zero-filled (-1)
    'first' (CUTLASS 2.x residue: k lo..lo+r-1 then the fill, then whole tiles) or 'last'
    (whole tiles, then the partial one, fill at its end); 'first-zl' puts the fill before the
    residue's values inside the first tile.  ``perm``: order of positions within each tile."""
    n = hi - lo
    r = n % k_tile
    if r == 0:
        idx = np.arange(lo, hi)
    elif where == "first":
        idx = np.concatenate([np.arange(lo, lo + r), np.full(k_tile - r, -1), np.arange(lo + r, hi)])
    elif where == "first-zl":
        idx = np.concatenate([np.full(k_tile - r, -1), np.arange(lo, lo + r), np.arange(lo + r, hi)])
    elif where == "last":
        idx = np.concatenate([np.arange(lo, hi), np.full(k_tile - r, -1)])
    else:
        raise ValueError(where)
    if perm is not None:
        idx = idx.reshape(-1, k_tile)[:, list(perm)].reshape(-1)
    return idx.astype(np.int64)


def split_bounds(K, S, align):
    from reference.schedule import split_bounds as sb
    return [tuple(x) for x in sb(K, S, align)]


# ----------------------------------------------------------------------------- combines
def c_serial(parts):
    s = f32(parts[0])
    for x in parts[1:]:
        s = (s + f32(x)).astype(np.float32)
    return s


def c_reverse(parts):
    return c_serial(parts[::-1])


def c_levels(mode):
    from reference.schedule import SplitReduce, reduce_levels

    def run(parts):
        v = [f32(x) for x in parts]
        for level in reduce_levels(mode, len(v)):
            for d, s in level:
                v[d] = (v[d] + v[s]).astype(np.float32)
        return v[0]
    return run


def combines():
    from reference.schedule import SplitReduce
    return {"serial": c_serial, "reverse": c_reverse, "tree": c_levels(SplitReduce.TREE),
            "pairwise": c_levels(SplitReduce.PAIRWISE)}


def matches(x, want):
    return int((f32(x).reshape(want.shape).view(np.int32) == want.view(np.int32)).sum())


# ----------------------------------------------------------------------------- search
PERMS16 = {
    "id": None,
    # the two k8 mma steps of a 16-tile taking k mod 8 halves interleaved by fours
    "q0213": tuple(list(range(0, 4)) + list(range(8, 12)) + list(range(4, 8)) + list(range(12, 16))),
    "evenodd": tuple(list(range(0, 16, 2)) + list(range(1, 16, 2))),
}


def candidates(K, quick=False):
    """(k_tile, where, perm name, S, align) tuples, each distinct padded slicing once."""
    out, seen = [], set()
    aligns = (1, 4, 8, 16, 32, 64)
    for k_tile in (16, 8, 32):
        for where in ("first", "last", "first-zl"):
            perms = PERMS16 if k_tile == 16 else {"id": None}
            for pn, perm in perms.items():
                for S in range(1, 65):
                    for al in aligns:
                        bd = tuple(split_bounds(K, S, al))
                        if len(bd) != S and S > 1 and len(bd) == 1:
                            continue
                        key = (k_tile, where, pn, bd)
                        if key in seen:
                            continue
                        seen.add(key)
                        out.append((k_tile, where, pn, S, al, bd))
    return out


def search(pairs, want, K, F=8, p=25, top=8, log=None):
    comb = combines()
    res = []
    for k_tile, where, pn, S, al, bd in candidates(K):
        perm = PERMS16[pn] if k_tile == 16 else None
        parts = [pairs.chain(slice_index(lo, hi, k_tile, where, perm), F, p) for lo, hi in bd]
        for cn, fn in comb.items():
            if len(bd) == 1 and cn != "serial":
                continue
            if len(bd) == 2 and cn in ("tree", "pairwise"):
                continue  # same as serial
            n = matches(fn(parts), want)
            lens = [hi - lo for lo, hi in bd]
            res.append((n, dict(F=F, p=p, k_tile=k_tile, where=where, perm=pn, S=S, align=al,
                                slices=len(bd), lens=lens, combine=cn)))
    res.sort(key=lambda r: -r[0])
    return res


def fmt(c):
    lens = c["lens"]
    ls = f"{lens[0]} x {len(lens) - 1} + {lens[-1]}" if len(lens) > 1 else str(lens[0])
    return (f"F={c['F']} p={c['p']} k_tile={c['k_tile']:2d} {c['where']:8s} perm={c['perm']:7s} "
            f"S={c['S']:2d} align={c['align']:2d} slices={c['slices']:2d} [{ls}] {c['combine']}")


# ----------------------------------------------------------------------------- project check
def project_check(A, B, W, c):
    """The candidate through the project's objects: KLayout(k_tile, S, align) + emulate (only for
    partial-tile-first, identity in-tile order, serial/tree/pairwise combines)."""
    import torch
    from fp4ref.gemm import emulate
    from fp4ref.native import KLayout
    from reference.notation import parse_short, short
    from reference.schedule import SplitReduce
    if c["where"] != "first" or c["perm"] != "id" or c["combine"] == "reverse":
        return None
    K = A.shape[1]
    lay = KLayout(c["k_tile"], c["S"], c["align"])
    a2, b2 = lay.pad(torch.from_numpy(A), torch.from_numpy(B))
    m = lay.model(parse_short(model_text(c["F"], c["p"])), K)
    if m.split_k > 1:
        m = m.replace(split_reduce={"serial": SplitReduce.SERIAL, "tree": SplitReduce.TREE,
                                    "pairwise": SplitReduce.PAIRWISE}[c["combine"]])
    n = matches(emulate(m, a2, b2).numpy(), W)
    return n, short(m), lay


def verify(npz):
    """numpy chain vs fp4ref.gemm.emulate, a few layouts per shape."""
    import torch
    from fp4ref.gemm import emulate
    from fp4ref.native import KLayout
    from reference.notation import parse_short
    ok = True
    for shape in SHAPES:
        A, B, W = load(npz, shape)
        K = A.shape[1]
        pairs = Pairs(A, B)
        for F, S, al in ((8, 1, 1), (8, 3, 4), (4, 2, 4)):
            lay = KLayout(16, S, al)
            a2, b2 = lay.pad(torch.from_numpy(A), torch.from_numpy(B))
            m = lay.model(parse_short(model_text(F)), K)
            ref = emulate(m, a2, b2).numpy()
            bd = split_bounds(K, S, al)
            mine = c_serial([pairs.chain(slice_index(lo, hi, 16, "first"), F) for lo, hi in bd])
            n = matches(mine, ref)
            ok &= n == 256
            print(f"verify {shape} F={F} KLayout(16, {S}, {al}): numpy vs emulate {n}/256")
    return ok


def summary(res):
    """The best candidate along each searched dimension (the nearest misses of each choice)."""
    for dim in ("F", "p", "combine", "perm", "k_tile", "where"):
        best = {}
        for n, c in res:
            if (c["k_tile"] != 16 and dim == "perm"):
                continue
            best.setdefault(c[dim], (n, c))
        print(f"  best per {dim}: " + "; ".join(f"{k}: {n}" for k, (n, c) in best.items()))
    top = res[0][1]
    slicing = lambda c: tuple(c["lens"])
    other = next(((n, c) for n, c in res if slicing(c) != slicing(top)), None)
    if other:
        print(f"  best other slicing: {other[0]}/256  {fmt(other[1])}")


def rule_check(npz, shapes):
    """The rule through the project's objects: KLayout(16, S, a) with a = 4 elements (16 bytes),
    or 32 (a 128-byte line) at K % 32 == 0 (probes.kernels.slice_align), the family model,
    serial combine; lists every S in 1..64 that gives the fitted slicing."""
    import torch
    from fp4ref.gemm import emulate
    from fp4ref.native import KLayout
    from reference.notation import parse_short, short
    tot = 0
    print("\n== the rule: KLayout(k_tile=16, S, 4 or 32 at K % 32 == 0), partial tile first, serial combine")
    for shape in shapes:
        A, B, W = load(npz, shape)
        K = A.shape[1]
        al = 32 if K % 32 == 0 else 4
        best = None
        same = {}
        for S in range(1, 65):
            lens = tuple(hi - lo for lo, hi in split_bounds(K, S, al))
            same.setdefault(lens, []).append(S)
        for lens, Ss in same.items():
            lay = KLayout(16, Ss[0], al)
            a2, b2 = lay.pad(torch.from_numpy(A), torch.from_numpy(B))
            m = lay.model(parse_short(model_text()), K)
            n = matches(emulate(m, a2, b2).numpy(), W)
            if best is None or n > best[0]:
                best = (n, lens, Ss, short(m))
        n, lens, Ss, m = best
        tot += n
        print(f"  {shape}: {n}/256 with {len(lens)} slices {list(lens[:1])} x {len(lens) - 1} + {lens[-1]} "
              f"(align {al}; S = {Ss[0]}..{Ss[-1]} all give it); model {m}")
    print(f"  total {tot}/{256 * len(shapes)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npz", default="/tmp/s16/tf32small.npz")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--arith", default="8:25,4:25,8:24,8:26", help="F:p pairs to search")
    args = ap.parse_args()
    if args.verify:
        verify(args.npz)
    best_all = {}
    for shape in args.shapes.split(","):
        A, B, W = load(args.npz, shape)
        K = A.shape[1]
        ta, fa = tf32_check(A)
        tb, fb = tf32_check(B)
        print(f"\n== {shape}: K={K}; A tf32-representable: {ta} ({fa:.3f} with low bits), B: {tb} ({fb:.3f})")
        pairs = Pairs(A, B)
        res = []
        for fp in args.arith.split(","):
            F, p = (int(x) for x in fp.split(":"))
            res += search(pairs, W, K, F, p)
        res.sort(key=lambda r: -r[0])
        for n, c in res[:args.top]:
            print(f"  {n:3d}/256  {fmt(c)}")
        best_all[shape] = res
        summary(res)
    rule_check(args.npz, args.shapes.split(","))
    print("\n== project path for each shape's best partial-tile-first candidate")
    for shape, res in best_all.items():
        A, B, W = load(args.npz, shape)
        for n, c in res:
            r = project_check(A, B, W, c)
            if r is not None:
                print(f"  {shape}: numpy {n}/256; KLayout({c['k_tile']}, {c['S']}, {c['align']}) + "
                      f"emulate({r[1]}): {r[0]}/256")
                break


if __name__ == "__main__":
    main()
