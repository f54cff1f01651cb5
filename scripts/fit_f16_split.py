"""Fit the split-K schedules of two cuBLAS fp16 GEMMs on the H200 (session 15 dumps).

    .venv/bin/python scripts/fit_f16_split.py [--npz /tmp/dumps15/f16.npz] [--verify]

Own numpy emulation of the cutlass_75 s1688 mainloop ("F=8 align=25:RTZ:esum acc=23:RTZ",
k-tile 32, partial tile first), per split-K slice, then the slice partials combined under
several candidate reduction rules.  ``--verify`` checks the numpy step against
fp4ref.gemm.emulate on random fp16 operands (bit for bit).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TC = "F=8 align=25:RTZ:esum acc=23:RTZ G=- out=float32:RNE"


# ---------------------------------------------------------------------------
# the mainloop: one fused step = acc + 8 products, aligned to 2**(emax - 25) by
# truncation (products' exponents = sum of the factors' exponents), exact sum,
# rounded to a 24-bit significand toward zero
# ---------------------------------------------------------------------------
def _flog2(x):
    """floor(log2|x|) (x != 0), as int64; arbitrary where x == 0."""
    _, e = np.frexp(x)
    return e.astype(np.int64) - 1


def _rtz24(S, q):
    """S * 2**q (S int64 exact) rounded toward zero to a 24-bit significand, as float64."""
    mag = np.abs(S)
    _, bl = np.frexp(mag.astype(np.float64))   # bit length (mag < 2**53 exact)
    bl = bl.astype(np.int64)
    # frexp of an int near 2**k rounds in float conversion only when mag >= 2**53: not here
    sh = np.maximum(bl - 24, 0)
    m = (mag >> sh) * np.sign(S)
    return np.ldexp(m.astype(np.float64), (q + sh).astype(np.int64))


def mma_chain(a, b, acc=None, F=8, p=25):
    """a [R, L], b [R, L] (float64 fp16 values, pairs per output row), L % F == 0: the
    accumulator after L / F fused steps starting from ``acc`` (float64 holding fp32), each
    step's terms truncated ``p`` bits below its largest exponent."""
    R, L = a.shape
    acc = np.zeros(R) if acc is None else acc.copy()
    P = a * b  # exact: 11 x 11 bits
    nz = (a != 0) & (b != 0)
    X = np.where(nz, _flog2(np.where(a != 0, a, 1.0)) + _flog2(np.where(b != 0, b, 1.0)), -10 ** 6)
    BIG = -10 ** 6
    for s in range(0, L, F):
        pp = P[:, s:s + F]
        x = X[:, s:s + F]
        ea = np.where(acc != 0, _flog2(np.where(acc != 0, acc, 1.0)), BIG)
        emax = np.maximum(x.max(1), ea)
        live = emax > BIG // 2
        q = np.where(live, emax - p, 0)
        sc = np.ldexp(1.0, -q)
        tp = np.trunc(pp * sc[:, None]).astype(np.int64)
        ta = np.trunc(acc * sc).astype(np.int64)
        S = ta + tp.sum(1)
        new = _rtz24(S, q)
        acc = np.where(live, new, acc)
    return acc


def residue_first_pad(lo, hi, k_tile=32):
    """Padded index of slice [lo, hi): partial tile first, zero-filled (-1), then whole tiles."""
    r = (hi - lo) % k_tile
    if r:
        return np.concatenate([np.arange(lo, lo + r), np.full(k_tile - r, -1), np.arange(lo + r, hi)])
    return np.arange(lo, hi)


def residue_last_pad(lo, hi, k_tile=32):
    n = hi - lo
    pad = (-n) % 8
    return np.concatenate([np.arange(lo, hi), np.full(pad, -1)])


def slice_partials(A, B, bounds, pad=residue_first_pad):
    """A [16, K], B [K, 16]: the fp32 partial of every slice, [S, 256] (output (i, j) at i*16+j)."""
    I, J = np.meshgrid(np.arange(A.shape[0]), np.arange(B.shape[1]), indexing="ij")
    I, J = I.ravel(), J.ravel()
    out = []
    for lo, hi in bounds:
        idx = pad(lo, hi)
        k = np.maximum(idx, 0)
        z = idx < 0
        a = np.where(z[None], 0.0, A[:, k].astype(np.float64))[I]
        b = np.where(z[:, None], 0.0, B[k, :].astype(np.float64)).T[J]
        out.append(mma_chain(a, b))
    return np.array(out)


def f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def reduce_seq(parts, order=None):
    """fp32 RNE sum of the slice partials, first to last (or in ``order``)."""
    idx = range(len(parts)) if order is None else order
    s = None
    for i in idx:
        s = f32(parts[i]) if s is None else (s + f32(parts[i])).astype(np.float32)
    return s


def reduce_tree(parts):
    p = [f32(x) for x in parts]
    while len(p) > 1:
        q = [(p[i] + p[i + 1]).astype(np.float32) for i in range(0, len(p) - 1, 2)]
        if len(p) % 2:
            q.append(p[-1])
        p = q
    return p[0]


def reduce_f16_serial(parts, order=None):
    """Serial split-K: each slice adds its partial to D (rounded to fp16 after each slice)."""
    idx = list(range(len(parts))) if order is None else order
    s = None
    for n, i in enumerate(idx):
        s = f32(parts[i]) if s is None else (s + f32(parts[i])).astype(np.float32)
        s = s.astype(np.float16).astype(np.float32) if n < len(idx) - 1 else s
    return s


def bits_equal(x, want):
    return int((f32(x).reshape(want.shape).view(np.int32) == want.view(np.int32)).sum())


def bounds_from_lengths(lens):
    out, lo = [], 0
    for n in lens:
        out.append((lo, lo + n))
        lo += n
    return out


def verify(seed=0):
    import torch
    from fp4ref.gemm import emulate
    from reference.notation import parse_short
    rng = np.random.default_rng(seed)
    K = 200
    A = rng.standard_normal((16, K)).astype(np.float16).astype(np.float32)
    B = rng.standard_normal((K, 16)).astype(np.float16).astype(np.float32)
    A[0, :5] = 0
    A[1, :] *= 2.0 ** -14  # subnormal fp16 factors
    A = A.astype(np.float16).astype(np.float32)
    idx = residue_first_pad(0, K)
    k, z = np.maximum(idx, 0), idx < 0
    Ap = np.where(z[None], 0, A[:, k]).astype(np.float32)
    Bp = np.where(z[:, None], 0, B[k, :]).astype(np.float32)
    ref = emulate(parse_short(TC), torch.from_numpy(Ap), torch.from_numpy(Bp)).numpy()
    mine = slice_partials(A, B, [(0, K)])[0]
    n = bits_equal(mine, ref)
    print(f"verify: numpy step vs fp4ref.gemm.emulate: {n}/256 bit-exact")
    return n == 256


def load(npz, shape):
    d = np.load(npz, allow_pickle=True)
    k = f"cuda-cublas-float16|{shape}|"
    return d[k + "a"], d[k + "b"], d[k + "out"], d[k + "out1"]


def cutlass_align(K, elem_bytes, k_contiguous=True):
    """CUTLASS 2.x GemmUniversal's kAlignK (kernel/params_universal_base.h, init_grid_tiled_shape,
    modes kGemm = serial and kGemmSplitKParallel): 16 bytes of the operand, or a 128-byte cache
    line when an operand contiguous in K (A row-major or B column-major) has K a multiple of the
    cache line's elements.  gemm_k_size = round_up(ceil(K / S), kAlignK), grid k = ceil(K / gemm_k_size).
    For cuBLAS "nn" kernels called from torch.mm (row-major operands) the K-contiguous operand is
    torch's A: 64 elements for bf16/f16 at K % 64 == 0 (else 8), 32 for tf32/fp32 at K % 32 == 0 (else 4)."""
    line = 128 // elem_bytes
    return max(16 // elem_bytes, line if (k_contiguous and K % line == 0) else 1)


REDUCTIONS = {
    "seq": lambda p: reduce_seq(p),
    "reverse": lambda p: reduce_seq(p, list(range(len(p)))[::-1]),
    "tree": reduce_tree,
    "f16-serial": lambda p: reduce_f16_serial(p),
}


def fit_shape(npz, shape, S_pred, S_range):
    from reference.schedule import split_bounds
    A, B, W, W1 = load(npz, shape)
    K = A.shape[1]
    same = bits_equal(W1, W)
    print(f"\n== {shape}: K={K}, cuBLASLt heuristic S={S_pred}; out1 == out on {same}/256; "
          f"cutlass_align(K, 2) = {cutlass_align(K, 2)}")
    print("no split:", bits_equal(slice_partials(A, B, [(0, K)])[0], W), "/ 256")
    seen = set()
    for S in S_range:
        for al in (8, 32, 64):
            bd = tuple(split_bounds(K, S, al))
            if bd in seen or len(bd) == 1:
                continue
            seen.add(bd)
            for pad in (residue_first_pad, residue_last_pad):
                parts = slice_partials(A, B, bd, pad)
                r = {n: bits_equal(f(parts), W) for n, f in REDUCTIONS.items()}
                L = bd[0][1] - bd[0][0]
                print(f"S={S:3d} align={al:2d}: {len(bd)} slices {L} .. {bd[-1][1] - bd[-1][0]}"
                      f" ({pad.__name__[:-4]}): " + ", ".join(f"{n} {v}" for n, v in r.items()))


def project_path(npz, shape, S):
    """The rule through the project's own objects: KLayout(32, S, cutlass_align).pad + emulate."""
    import torch
    from fp4ref.gemm import emulate
    from fp4ref.native import KLayout
    from reference.notation import parse_short, short
    A, B, W, _ = load(npz, shape)
    K = A.shape[1]
    for al in sorted({cutlass_align(K, 2), 32 if K % 32 == 0 else 8}):
        lay = KLayout(32, S, al)
        a2, b2 = lay.pad(torch.from_numpy(A), torch.from_numpy(B))
        m = lay.model(parse_short(TC), K)
        n = bits_equal(emulate(m, a2, b2).numpy(), W)
        print(f"project path {shape}: KLayout(32, {S}, {al}) + emulate({short(m)}): {n}/256")


def excerpts_with_rule():
    """Replay tests/data/kernel_dumps.npz (the committed H200 excerpts) with slice_align replaced
    by the CUTLASS rule (k-tiled rows): every excerpt must still be bit-exact."""
    import probes.kernels as pk
    from probes.sim import output_bits, simulate_gemm
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    z = np.load(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                             "kernel_dumps.npz"))
    old = pk.slice_align

    def new(row, K):
        dev = row.devices[0]
        eb = 2 if dev.endswith(("float16", "bfloat16")) else 4
        return cutlass_align(K, eb) if row.k_tile else (row.split_align or 1)

    tot = ok = 0
    try:
        for rule, fn in (("current", old), ("cutlass", new)):
            pk.slice_align = fn
            tot = ok = 0
            n = 0
            while f"e{n}_device" in z:
                p = f"e{n}_"
                ex = {k[len(p):]: z[k] for k in z.files if k.startswith(p)}
                n += 1
                rows = pk.kernel_models(str(ex["device"]), str(ex["kernels"]).split("\n"))
                a, b, model = pk.kernel_operands(rows[0], ex["a"].astype(np.float64), ex["b"].astype(np.float64),
                                                 int(ex["split_k"]))
                got = simulate_gemm(model, a, b)
                want = output_bits(ex["out"].astype(np.float64), "float32")
                tot += want.size
                ok += int((got == want).sum())
            print(f"committed excerpts ({n}), slice_align {rule}: {ok}/{tot} outputs bit-exact")
    finally:
        pk.slice_align = old


# (element bytes, K, S, k_tile, first slice length seen on the H200): docs/kernels.md and the
# probes/kernels.py evidence strings, plus this script's two shapes
SEEN = [(2, 4416, 5, 32, 896), (4, 8192, 3, 32, 2752), (2, 2272, 3, 32, 760), (2, 12213, 88, 32, 144),
        (2, 13671, 19, 32, 720), (2, 8375, 3, 32, 2792), (2, 14955, 3, 32, 4992), (2, 14955, 4, 32, 3744),
        (2, 15905, 3, 32, 5304), (2, 2872, 13, 32, 224), (2, 14600, 6, 64, 2440), (4, 6334, 33, 32, 192),
        (4, 13412, 33, 32, 408), (4, 8870, 44, 32, 204), (4, 13067, 44, 32, 300), (4, 2872, 13, 32, 224),
        (4, 14955, 4, 32, 3740), (4, 8375, 3, 32, 2792), (4, 15905, 3, 32, 5304)]


def slice_rules():
    """First-slice length under the current slice_align (whole k-tiles at K % k_tile == 0, else
    16 bytes) and under CUTLASS's kAlignK, against the lengths seen."""
    rnd = lambda K, S, al: -(-(-(-K // S)) // al) * al
    cur = cut = 0
    for eb, K, S, kt, L in SEEN:
        c = rnd(K, S, kt if K % kt == 0 else 16 // eb)
        n = rnd(K, S, cutlass_align(K, eb))
        cur += c == L
        cut += n == L
        if c != L or n != L:
            print(f"  K={K} S={S} ({eb}-byte): seen {L}, current rule {c}, CUTLASS kAlignK {n}")
    print(f"slice lengths seen ({len(SEEN)}): current rule {cur}, CUTLASS kAlignK {cut}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npz", default="/tmp/dumps15/f16.npz")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--quick", action="store_true", help="only the heuristic's S and its neighbours")
    args = ap.parse_args()
    if args.verify:
        verify()
    r1 = [85, 88] if args.quick else list(range(70, 100))
    r2 = [3] if args.quick else list(range(2, 7))
    fit_shape(args.npz, "48x330x12213", 88, r1)
    fit_shape(args.npz, "2607x1559x2272", 3, r2)
    project_path(args.npz, "48x330x12213", 88)
    project_path(args.npz, "2607x1559x2272", 3)
    excerpts_with_rule()
    slice_rules()


if __name__ == "__main__":
    main()
