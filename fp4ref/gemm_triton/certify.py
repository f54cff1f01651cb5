"""Step 2, certify: the pair certificate (block 16) and the special rows.

Two blocks of 16 products ("pair", one 32-wide tensor-core dot) are exact when a
Cauchy-Schwarz bound from per-block norms stays below 2**WIN units: per row and block
X = |s| * ||a_block||_2 (an upper bound), the unit 2**(e_last(s_a) + e_last(s_b) - 2) of
the products, and per 128 x 128 output tile sum_b X'_ib Y'_jb < 2**WIN over each pair
(X' = X normalized by the pair's unit).  ``pair_bounds`` computes the per-tile maxima in
one kernel pass; ``route_bounds`` is its torch twin (also the BLOCK scheme's input)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .decode import Operand, block_sq
from .launch import kernels
from .tables import scale_tables, sqrt_table

__all__ = ["WIN", "NO_UNIT", "Bounds", "side_bounds", "pair_ok", "pair_bounds", "route_bounds",
           "p2", "ceil_log2"]

WIN = 23            # tensor-core exactness window (bits): bound < 2**WIN * unit
NO_UNIT = 1 << 20   # unit exponent of a block with no live product (never the minimum)


class Bounds(NamedTuple):
    """Per-block bounds of both operands (``route_bounds``), padded to whole tiles and to
    whole groups (dead blocks: X = 0, u = NO_UNIT)."""
    XA: torch.Tensor    # float64 [Mp, nbp]: |s| * ||a_block||_2
    ua: torch.Tensor    # int64 [Mp, nbp]: unit exponent of the A side
    XB: torch.Tensor    # float64 [Np, nbp]
    ub: torch.Tensor    # int64 [Np, nbp]
    XAn: torch.Tensor   # float64 [Mt, nbp]: per-tile max of the pair-normalized XA
    XBn: torch.Tensor   # float64 [Nt, nbp]


def p2(e: torch.Tensor) -> torch.Tensor:
    """Exact float64 2**e for int64 e in [-1022, 1023]."""
    from fp4ref.gemm import _pow2
    return _pow2(e)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, e - 1, e).to(torch.int64)


def side_bounds(op: Operand, sq: torch.Tensor, block: int, T: int):
    """Per row and block: X = |s| * ||a_block||_2 (an upper bound, float64) and the unit
    exponent of the products' A side (u = 2**(e_last(s) - 1)); padded to T rows.
    ``sq``: the exact per-block sums of squares (float32 [R, nb])."""
    R, nb = op.scode.shape
    sc = op.scode.long()
    tabs = scale_tables(op.sfmt, sc.device)
    # |s| as float64 and (unit exponent - 1) by table look-ups (tables made once per code)
    X = tabs.sane64[sc] * torch.sqrt(sq.double()) * (1 + 2.0 ** -40)
    # X >= +0 and finite (|s| and sq are), so it is +0 exactly where not live
    ue = torch.where(X > 0, tabs.ue1[sc], NO_UNIT)
    pad = (-R) % T
    if pad:
        X = torch.cat([X, X.new_zeros(pad, nb)])
        ue = torch.cat([ue, ue.new_full((pad, nb), NO_UNIT)])
    return X, ue


def pair_ok(XAn: torch.Tensor, XBn: torch.Tensor) -> torch.Tensor:
    """Pair certificate per tile, bool [Mt, Nt]: sum_b X'_ib Y'_jb < 2**WIN over each pair,
    from the per-tile pair-normalized bounds XAn [Mt, nbp], XBn [Nt, nbp] (float64)."""
    (Mt, nbp), Nt = XAn.shape, XBn.shape[0]
    ok_pair = None
    step = max(1, (1 << 24) // max(1, Mt * Nt))
    for p0 in range(0, nbp // 2, step):  # [Mt, Nt, pairs] in bounded chunks
        xa = XAn.view(Mt, nbp // 2, 2)[:, p0:p0 + step]
        xb = XBn.view(Nt, nbp // 2, 2)[:, p0:p0 + step]
        tot = (xa[:, None] * xb[None]).sum(-1)
        ok = (tot < 2.0 ** WIN).all(-1)
        ok_pair = ok if ok_pair is None else ok_pair & ok
    if ok_pair is None:
        ok_pair = torch.ones(Mt, Nt, dtype=torch.bool, device=XAn.device)
    return ok_pair


def pair_bounds(A: Operand, B: Operand, block: int, BM: int, BN: int, sqa, sqb, stats, *,
                group_blocks: int):
    """One kernel pass over both operands' scale codes (and sums of squares when ``sqa`` is
    given): (XAn [Mt, nbp], XBn [Nt, nbp] as ``route_bounds`` computes them, or None; A.bad /
    B.bad set; stats[4] / [5] = number of special rows).  Table look-ups are padded: safe before
    the code-range check is read back."""
    M, N, nb = A.R, B.R, A.scode.shape[1]
    Mt, Nt = -(-M // BM), -(-N // BN)
    dev = A.codes.device
    xon = sqa is not None
    nbp = -(-nb // group_blocks) * group_blocks
    XN = torch.empty(Mt + Nt, nbp, dtype=torch.float64, device=dev) if xon else stats
    bad = torch.empty(M + N, dtype=torch.bool, device=dev)
    sqrt = sqrt_table(block, dev)
    t = scale_tables(A.sfmt, dev)
    kernels().bounds[(Mt + Nt,)](sqa if xon else A.scode, A.scode, sqb if xon else B.scode,
                                 B.scode, XN, bad.view(torch.uint8), stats, sqrt, t.sane64_256,
                                 t.ue1_256, t.nf_256, M, N, Mt, BM, BN, nb, nbp, sqrt.numel() - 1,
                                 NP=nbp // 2, TM=max(BM, BN), PC=16, XON=xon, num_warps=4)
    A.bad, B.bad = bad[:M], bad[M:]
    return (XN[:Mt], XN[Mt:]) if xon else (None, None)


def _pad_blocks(X, u, nbp):
    """Bounds and unit exponents padded with dead blocks to ``nbp`` per row."""
    nb = X.shape[1]
    if nbp == nb:
        return X, u
    return (torch.cat([X, X.new_zeros(X.shape[0], nbp - nb)], 1),
            torch.cat([u, u.new_full((u.shape[0], nbp - nb), NO_UNIT)], 1))


def route_bounds(A: Operand, B: Operand, block: int, BM: int, BN: int, sqa=None, sqb=None, *,
                 group_blocks: int) -> Bounds:
    """Block 16: per-block bounds X and unit exponents u of both sides, padded to whole tiles
    and to whole groups (``group_blocks`` blocks), and the per-tile pair-normalized maxima
    XAn [Mt, nbp], XBn [Nt, nbp] (the pair certificate's input; ``pair_bounds`` is the kernel
    twin)."""
    M, K = A.R, A.K
    N = B.R
    Mt, Nt = -(-M // BM), -(-N // BN)
    XA, ua = side_bounds(A, block_sq(A, block) if sqa is None else sqa, block, BM)
    XB, ub = side_bounds(B, block_sq(B, block) if sqb is None else sqb, block, BN)
    nb = K // block
    nbp = -(-nb // group_blocks) * group_blocks
    XA, ua = _pad_blocks(XA, ua, nbp)
    XB, ub = _pad_blocks(XB, ub, nbp)

    def pair_norm(X, u):   # X / 2**(pair unit exponent)
        up = u.view(u.shape[0], nbp // 2, 2).amin(-1)
        Xn = X.view(X.shape[0], nbp // 2, 2) * p2((-up).clamp(-1022, 1022))[..., None]
        return Xn.view(X.shape[0], nbp)
    XAn = pair_norm(XA, ua).view(Mt, BM, nbp).amax(1)          # [Mt, nbp]
    XBn = pair_norm(XB, ub).view(Nt, BN, nbp).amax(1)          # [Nt, nbp]
    return Bounds(XA, ua, XB, ub, XAn, XBn)
