"""A simple block quantizer for tests and benchmarks (not a training recipe: those live in
``fp4ref.quant``)."""
from __future__ import annotations

from fractions import Fraction

import torch

from reference.formats import get_format

from .options import fmt_args
from .tables import code_values

__all__ = ["quantize_operand"]


def quantize_operand(x: torch.Tensor, fmt: str = "nvfp4", *, block: int | None = None,
                     scale_fmt: str | None = None):
    """Simple amax/6 block quantizer (RNE) for tests and benchmarks: (codes uint8 [R, K],
    scale codes uint8 [R, K/B], per-tensor factor float).  Not a training recipe."""
    from fp4ref.cast import quantize as cast_q
    sfmt, block = fmt_args(fmt, scale_fmt, block)
    R, K = x.shape
    xf = x.float()
    g = float(xf.abs().max()) if xf.numel() else 0.0
    ts = 1.0
    if fmt in ("nvfp4", "ue5m3"):   # a per-tensor factor puts amax at the top scale's 6
        ts = g / (448 * 6) if g > 0 else 1.0
    ts = float(torch.tensor(ts, dtype=torch.float32))
    xb = (xf / ts).view(R, K // block, block)
    amax = xb.abs().amax(-1)
    s = amax / 6
    sc = cast_q(s, sfmt, "rne" if sfmt != "float8_e8m0fnu" else "rup")
    sv = code_values(sfmt, x.device)[sc.long()]
    sv = torch.where(sv > 0, sv, torch.ones_like(sv))
    q = torch.where(sv[..., None] > 0, xb / sv[..., None], torch.zeros_like(xb)).clamp(-6, 6)
    codes = cast_q(q.reshape(R, K), "float4_e2m1fn", "rne")
    sc = torch.where(code_values(sfmt, x.device)[sc.long()] > 0, sc,
                     torch.full_like(sc, get_format(sfmt).encode_magnitude(Fraction(1))))
    return codes.to(torch.uint8), sc.to(torch.uint8), ts
