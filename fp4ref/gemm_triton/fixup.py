"""Step 5, fix up: what the kernels' checks do not cover (non-finite scales, tiles whose
bounds fail, MX exponents out of range) is recomputed by the exact torch emulator
``fp4ref.gemm.emulate``, without the lattice (the epilogue applies it to every output)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from reference.gemm import GemmModel

from .decode import Operand
from .options import Route

__all__ = ["Specials", "specials", "fixup"]


class Specials(NamedTuple):
    """What the fix-up recomputes."""
    rows: torch.Tensor | None   # A rows holding a non-finite scale (None: none)
    cols: torch.Tensor | None   # B rows (output columns) holding one
    any_fix: bool               # some tile routed FIX


def specials(A: Operand, B: Operand, mode: torch.Tensor) -> Specials:
    """Looked up from the operands and the tile modes (one host sync per item)."""
    return Specials(A.bad.nonzero().squeeze(1), B.bad.nonzero().squeeze(1),
                    bool((mode == Route.FIX).any()))


def fixup(c, model: GemmModel, A: Operand, B: Operand, block, mode, BM, BN,
          info: Specials | None = None):
    """Recompute (exactly, torch emulator) special rows/columns and FIX tiles of ``c`` in
    place.  ``info``: found by ``prepare`` (None: look here)."""
    from fp4ref.gemm import emulate
    raw = model.replace(lattice=None)

    def em(ri, ci):
        return emulate(raw, A.values(ri), B.values(ci).t(), scales_a=A.scales[ri],
                       scales_b=B.scales[ci].t(), block=block)
    M, N = c.shape
    rows, cols, any_fix = specials(A, B, mode) if info is None else info
    if rows is None and cols is None and not any_fix:
        return c
    allr = torch.arange(M, device=c.device)
    allc = torch.arange(N, device=c.device)
    if rows is not None and rows.numel():
        c[rows] = em(rows, allc)
    if cols is not None and cols.numel():
        c[:, cols] = em(allr, cols)
    if any_fix:
        fix = (mode == Route.FIX)
        tm = fix.any(1).nonzero().squeeze(1)
        tn = fix.any(0).nonzero().squeeze(1)
        ri = (tm[:, None] * BM + torch.arange(BM, device=c.device)).reshape(-1)
        ci = (tn[:, None] * BN + torch.arange(BN, device=c.device)).reshape(-1)
        ri, ci = ri[ri < M], ci[ci < N]
        sub = em(ri, ci)
        keep = fix[ri // BM][:, ci // BN]
        c[ri[:, None], ci[None, :]] = torch.where(keep, sub, c[ri][:, ci])
    return c
