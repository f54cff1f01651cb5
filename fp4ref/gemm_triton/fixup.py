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
the present sign.  Outputs failing the bound (huge MX scales) keep the emulator."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from reference.errors import check_choice
from reference.gemm import GemmModel, ScalePoint

from .decode import Operand
from .options import Route

__all__ = ["Specials", "specials", "fixup", "special_values", "METHODS"]

METHODS = ("counts", "emulate")   # how special rows / columns are recomputed
_CHUNK = 2048                     # K per count matmul: 4 * 2048 < 2**24, exact float32 sums


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


class _Classes(NamedTuple):
    """0/1 float32 indicators per element [R, K] of one operand's factor x_k = v_k * s_b(k)."""
    G: torch.Tensor    # no NaN from this side alone (not: NaN scale, or Inf scale times v = 0)
    I: torch.Tensor    # Inf scale, v != 0
    Z: torch.Tensor    # finite, zero (v = 0 or scale 0)
    IP: torch.Tensor   # Inf factor, positive
    IM: torch.Tensor
    FP: torch.Tensor   # finite nonzero factor, positive
    FM: torch.Tensor


def _classes(v: torch.Tensor, sc: torch.Tensor, block: int, k0: int, k1: int) -> _Classes:
    """Of values ``v`` [R, K] and scales ``sc`` [R, K / block], columns k0:k1."""
    v = v[:, k0:k1]
    s = sc[:, k0 // block:k1 // block].repeat_interleave(block, 1)
    nan, inf = torch.isnan(s), torch.isinf(s)
    vz = v == 0
    fin = ~nan & ~inf
    Z = fin & (vz | (s == 0))
    I = inf & ~vz
    F = fin & ~Z
    neg = torch.signbit(v) ^ torch.signbit(s)

    def f(x):
        return x.to(torch.float32)
    return _Classes(f(I | Z | F), f(I), f(Z), f(I & ~neg), f(I & neg), f(F & ~neg), f(F & neg))


def _counts(L: _Classes, R: _Classes):
    """Per output [r, c]: (products not NaN, +Inf products, -Inf products), float32 exact
    (integers below 2**24: entries in {-1, 0, 1, 2}, K <= _CHUNK terms per stack)."""
    mm = torch.matmul
    good = mm(torch.cat((L.G, L.I, L.Z), 1), torch.cat((R.G, -R.Z, -R.I), 1).t())
    P = torch.cat((L.IP, L.IM, L.FP, L.FM), 1)
    pinf = mm(P, torch.cat((R.IP + R.FP, R.IM + R.FM, R.IP, R.IM), 1).t())
    ninf = mm(P, torch.cat((R.IM + R.FM, R.IP + R.FP, R.IM, R.IP), 1).t())
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
    good = torch.zeros(ri.numel(), ci.numel(), dtype=torch.float64, device=va.device)
    pinf, ninf = good.clone(), good.clone()
    step = max(block, _CHUNK // block * block)
    for k0 in range(0, K, step):
        k1 = min(K, k0 + step)
        g, p, n = _counts(_classes(va, sa, block, k0, k1), _classes(vb, sb, block, k0, k1))
        good += g
        pinf += p
        ninf += n
    nan = (good < K) | ((pinf > 0) & (ninf > 0))
    out = torch.where(nan, math.nan, torch.where(pinf > 0, math.inf, -math.inf)).to(torch.float32)
    f = model.acc_frac_bits
    growth = math.exp(min(700.0, (3 * K + 8) * 2.0 ** -f)) * (1 + 1e-9)
    big = (K * growth) * _row_bound(va, sa, block)[:, None] * _row_bound(vb, sb, block)[None, :]
    undecided = (big >= 2.0 ** 127) | (~nan & (pinf == 0) & (ninf == 0))
    if bool(undecided.any()):   # outside the proof: the emulator on the rows x columns hit
        r = undecided.any(1).nonzero().squeeze(1)
        cc = undecided.any(0).nonzero().squeeze(1)
        sub = em(ri[r], ci[cc])
        blk = out[r[:, None], cc[None, :]]
        out[r[:, None], cc[None, :]] = torch.where(undecided[r][:, cc], sub, blk)
    return out
