"""Step 5, fix up: what the kernels do not cover (non-finite scales, MX exponents out of
range, forced FIX, WIDE tiles flagged by their kernel), without the lattice (the epilogue
applies it to every output).

Special rows / columns (a NaN or Inf block scale in a row of A or of B) are decided by counts
of their non-finite products (``special_values``); FIX tiles, and special outputs the proof
below does not cover, are recomputed by the exact torch emulator ``fp4ref.gemm.emulate``.

Why counts suffice (``reference.gemm``, models with block scales at the products, no
product_format, no alignment, FP32 output: every model the Triton path takes).  e2m1 values
are finite, so a product p_k = (a_k b_k)(sa sb) is non-finite only through a scale: NaN if a
scale of block(k) is NaN, or one is Inf while a_k b_k or the other scale is zero
(``mul_exact``); else +-Inf (sign of a_k b_k sa sb) if a scale is Inf.  In a row whose scales
hold a NaN or Inf, every product of that block is non-finite, so every output of the row has
one.  Every fused step, group add, cross-group add and split-K add returns
``special_sum`` of its terms as soon as one is non-finite, and NaN / Inf pass through the FP32
roundings unchanged: the result is ``special_sum`` of all non-finite products and of any
finite intermediate that overflowed to +-Inf.  No finite intermediate overflows when
K * max|finite product| * (1 + 2**-f)**(3K + 8) < 2**127 (each of at most 3K + 8 roundings to
f fraction bits grows a magnitude by at most that factor; the IEEE overflow threshold is above
2**127): then the output is NaN if a product is NaN or both infinities occur, else the Inf of
the present sign.  A NaN product, or both infinities, give NaN even with overflows (NaN absorbs
every later step).  Outputs with Inf products only that fail the bound keep the emulator
(UE5M3, the only Inf scale: max finite scale 61440, so only for K above 2**89)."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from reference.errors import check_choice
from reference.gemm import GemmModel, ScalePoint

from .decode import Operand
from .options import Route

__all__ = ["Specials", "specials", "fixup", "special_values", "counts_apply", "METHODS"]

METHODS = ("counts", "emulate")   # how special rows / columns are recomputed
_LIMIT = 2.0 ** 127               # finite intermediates stay below this: no overflow to Inf
_CHUNK = 1 << 22                  # elements of one side per count chunk (its gathers: 8 floats each)


class Specials(NamedTuple):
    """What the fix-up recomputes."""
    rows: torch.Tensor | None   # A rows holding a non-finite scale (None: none)
    cols: torch.Tensor | None   # B rows (output columns) holding one
    any_fix: bool               # some tile routed FIX


def specials(A: Operand, B: Operand, mode: torch.Tensor) -> Specials:
    """Looked up from the operands and the tile modes (one host sync per item)."""
    return Specials(A.bad.nonzero().squeeze(1), B.bad.nonzero().squeeze(1),
                    bool((mode == Route.FIX).any()))


def _emulator(model: GemmModel, A: Operand, B: Operand, block):
    from fp4ref.gemm import emulate
    raw = model.replace(lattice=None)

    def em(ri, ci):
        return emulate(raw, A.values(ri), B.values(ci).t(), scales_a=A.scales[ri],
                       scales_b=B.scales[ci].t(), block=block)
    return em


def fixup(c, model: GemmModel, A: Operand, B: Operand, block, mode, BM, BN,
          info: Specials | None = None, method: str = "counts"):
    """Recompute (exactly) special rows/columns and FIX tiles of ``c`` in place.  ``info``:
    found by ``prepare`` (None: look here).  ``method``: "counts" (special rows / columns by
    ``special_values``), "emulate" (all by the torch emulator; tests)."""
    check_choice("method", method, METHODS)
    em = _emulator(model, A, B, block)
    M, N = c.shape
    rows, cols, any_fix = specials(A, B, mode) if info is None else info
    if rows is None and cols is None and not any_fix:
        return c
    allr = torch.arange(M, device=c.device)
    allc = torch.arange(N, device=c.device)
    if rows is not None and rows.numel():
        c[rows] = (em(rows, allc) if method == "emulate" else
                   special_values(model, A, B, block, rows, allc, em))
    if cols is not None and cols.numel():
        c[:, cols] = (em(allr, cols) if method == "emulate" else
                      special_values(model, A, B, block, allr, cols, em))
    if any_fix:
        _fix_tiles(c, em, mode, BM, BN)
    return c


def _fix_tiles(c, em, mode, BM, BN) -> None:
    M, N = c.shape
    fix = (mode == Route.FIX)
    tm = fix.any(1).nonzero().squeeze(1)
    tn = fix.any(0).nonzero().squeeze(1)
    ri = (tm[:, None] * BM + torch.arange(BM, device=c.device)).reshape(-1)
    ci = (tn[:, None] * BN + torch.arange(BN, device=c.device)).reshape(-1)
    ri, ci = ri[ri < M], ci[ci < N]
    sub = em(ri, ci)
    keep = fix[ri // BM][:, ci // BN]
    c[ri[:, None], ci[None, :]] = torch.where(keep, sub, c[ri][:, ci])


# ------------------------------------------------------------------ special rows / columns
def counts_apply(model: GemmModel, K: int) -> bool:
    """Whether the module docstring's proof covers ``model`` (else: the emulator)."""
    return (model.scale_point is ScalePoint.PRODUCT and model.product_format is None
            and model.align_bits is None and model.output == "float32" and K < 2 ** 40)


def _indicators(v: torch.Tensor, s: torch.Tensor) -> list:
    """0/1 indicators of one side's factor x = v * s (v: e2m1 value, s: its block scale):
    G (no NaN from this side alone: not a NaN scale, not an Inf scale times v = 0), I (Inf
    scale, v != 0), Z (finite and zero: v = 0 or s = 0), IP / IM (I, positive / negative),
    FP / FM (finite nonzero, positive / negative)."""
    nan, inf = torch.isnan(s), torch.isinf(s)
    vz = v == 0
    fin = ~nan & ~inf
    Z = fin & (vz | (s == 0))
    I = inf & ~vz
    F = fin & ~Z
    neg = torch.signbit(v) ^ torch.signbit(s)
    return [I | Z | F, I, Z, I & ~neg, I & neg, F & ~neg, F & neg]


@functools.lru_cache(maxsize=8)
def _tables(dev: torch.device) -> tuple:
    """Per element class (6 scale kinds x v's sign x v = 0, ``_kind``): float32 rows to gather.
    Output (i, j), summed over k: L3 . R3 = products not NaN, L4 . R4[0] = +Inf products,
    L4 . R4[1] = -Inf products (pairs (I, Z) and (Z, I) are Inf * 0 = NaN)."""
    s = torch.tensor([1.0, -1.0, 0.0, math.inf, -math.inf, math.nan]).repeat_interleave(4)
    v = torch.tensor([1.0, 0.0, -1.0, -0.0]).repeat(6)
    G, I, Z, IP, IM, FP, FM = (x.to(torch.float32) for x in _indicators(v, s))
    L3 = torch.stack((G, I, Z), 1)
    R3 = torch.stack((G, -Z, -I), 1)
    L4 = torch.stack((IP, IM, FP, FM), 1)
    R4 = torch.stack((torch.stack((IP + FP, IM + FM, IP, IM), 1),
                      torch.stack((IM + FM, IP + FP, IM, IP), 1)))
    return tuple(t.to(dev) for t in (L3, R3, L4, R4))


def _kind(v: torch.Tensor, sc: torch.Tensor, block: int) -> torch.Tensor:
    """int32 class per element [R, K] (``_tables``' row): scale kind * 4 + sign(v) * 2 + (v = 0);
    scale kinds 0 / 1 finite nonzero +/-, 2 zero, 3 / 4 +/-Inf, 5 NaN."""
    sg = torch.signbit(sc).long()
    sk = torch.where(torch.isnan(sc), 5, torch.where(torch.isinf(sc), 3 + sg,
                                                     torch.where(sc == 0, 2, sg)))
    k = sk.repeat_interleave(block, 1) * 4 + torch.signbit(v).long() * 2 + (v == 0).long()
    return k.to(torch.int32)


def _counts(kl: torch.Tensor, kr: torch.Tensor, tabs):
    """float32 [r, c] (products not NaN, +Inf products, -Inf products) over the columns of the
    class chunks kl [r, k], kr [c, k]; exact: entries in {-1, 0, 1}, at most 4k <= 2**22 terms,
    so every partial sum is an integer below 2**24."""
    L3, R3, L4, R4 = tabs
    r, c = kl.shape[0], kr.shape[0]
    good = L3[kl].view(r, -1) @ R3[kr].view(c, -1).t()
    inf = L4[kl].view(r, -1) @ R4[:, kr].view(2 * c, -1).t()
    return good, inf[:, :c], inf[:, c:]


def _count_all(va, sa, vb, sb, block: int):
    """float64 [r, c] counts of ``_counts`` over all of K (values va [r, K], vb [c, K], scales
    sa, sb), in chunks of K of about _CHUNK elements of the larger side (bounded memory)."""
    r, c, K = va.shape[0], vb.shape[0], va.shape[1]
    tabs = _tables(va.device)
    good = torch.zeros(r, c, dtype=torch.float64, device=va.device)
    pinf, ninf = good.clone(), good.clone()
    step = min(max(block, _CHUNK // max(1, r, c) // block * block), 1 << 20)  # sums < 2**24
    for k0 in range(0, K, step):
        k1, b0, b1 = k0 + step, k0 // block, (k0 + step) // block
        g, p, n = _counts(_kind(va[:, k0:k1], sa[:, b0:b1], block),
                          _kind(vb[:, k0:k1], sb[:, b0:b1], block), tabs)
        good += g
        pinf += p
        ninf += n
    return good, pinf, ninf


def _row_bound(v: torch.Tensor, sc: torch.Tensor, block: int) -> torch.Tensor:
    """float64 [R]: max over the row of |v_k * s| with finite s (0: none)."""
    if not sc.numel():
        return torch.zeros(v.shape[0], dtype=torch.float64, device=v.device)
    vm = v.abs().view(v.shape[0], -1, block).amax(-1).to(torch.float64)
    s = sc.to(torch.float64)
    return torch.where(torch.isfinite(s), vm * s.abs(), 0.0).amax(1)


def special_values(model: GemmModel, A: Operand, B: Operand, block: int, ri: torch.Tensor,
                   ci: torch.Tensor, em=None) -> torch.Tensor:
    """float32 [len(ri), len(ci)]: outputs (ri x ci) that each have a non-finite product (a row of
    ``ri`` or a column of ``ci`` with a NaN / Inf scale), before lattice and alpha, bit-identical
    to ``fp4ref.gemm.emulate``; outputs outside the proof go to ``em(rows, cols)``."""
    K = A.K
    em = em or _emulator(model, A, B, block)
    if not counts_apply(model, K):
        return em(ri, ci)
    va, sa, vb, sb = A.values(ri), A.scales[ri], B.values(ci), B.scales[ci]
    good, pinf, ninf = _count_all(va, sa, vb, sb, block)
    nan = (good < K) | ((pinf > 0) & (ninf > 0))
    out = torch.where(nan, math.nan, torch.where(pinf > 0, math.inf, -math.inf)).to(torch.float32)
    f = model.acc_frac_bits
    growth = math.exp(min(700.0, (3 * K + 8) * 2.0 ** -f)) * (1 + 1e-9)
    big = (K * growth) * _row_bound(va, sa, block)[:, None] * _row_bound(vb, sb, block)[None, :]
    # a NaN product, or both infinities, decide NaN whatever overflows (NaN absorbs)
    undecided = ~nan & ((big >= _LIMIT) | ((pinf == 0) & (ninf == 0)))
    if bool(undecided.any()):   # outside the proof: the emulator on the rows x columns hit
        r = undecided.any(1).nonzero().squeeze(1)
        cc = undecided.any(0).nonzero().squeeze(1)
        sub = em(ri[r], ci[cc])
        blk = out[r[:, None], cc[None, :]]
        out[r[:, None], cc[None, :]] = torch.where(undecided[r][:, cc], sub, blk)
    return out
