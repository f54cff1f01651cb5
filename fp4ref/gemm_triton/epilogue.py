"""Step 6, epilogue: the lattice and the per-tensor factors alpha, applied after the kernels
and the fix-up in FP32 (exact IEEE ops, or the emulator's exact products for tensor alpha).

A scalar alpha is premultiplied exactly as ``reference.gemm`` does (fp32(f0), then
fp32(al * f)) and, when nothing follows the kernels (no fix-up, no lattice), goes into the
kernels' store instead (``gemm.prepare``)."""
from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch

from reference.gemm import GemmModel

__all__ = ["Alpha", "alpha_list", "alpha_scalars", "alpha_premul", "alpha_deferred",
           "alpha_values", "epilogue"]


class Alpha(NamedTuple):
    """alpha as the epilogue applies it."""
    scalar: float | None            # the premultiplied FP32 factor (all factors scalars)
    factors: list[torch.Tensor]     # tensor factors: the emulator's exact products


def alpha_list(alpha, M, N, dev) -> Alpha:
    """Scalar factors stay Python scalars (no [M, N] tensors); others go through the
    emulator's checks (broadcast, finite)."""
    from fp4ref.gemm import _alpha_factors
    if alpha is None:
        return Alpha(None, [])
    items = alpha_scalars(alpha)
    if items is not None:
        return Alpha(alpha_premul([float(f) for f in items]), [])
    return Alpha(None, _alpha_factors(alpha, M, N, dev))


def alpha_scalars(alpha):
    """The factors as a list when each is a number or a one-element tensor, else None."""
    items = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
    if all(isinstance(f, (int, float)) and not isinstance(f, bool)
           or (isinstance(f, torch.Tensor) and f.numel() == 1) for f in items):
        return items
    return None


def alpha_premul(vals) -> float:
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:
        raise ValueError(f"alpha: non-finite value {bad[0]}; valid choices: finite numbers")
    # premultiplied alpha, exactly as reference.gemm: fp32(f0), then fp32(al * f)
    from reference.exact import exact
    from reference.gemm import mul_exact, round_fp32
    al = round_fp32(exact(vals[0]))
    for v in vals[1:]:
        al = round_fp32(mul_exact(al, exact(v)))
    return float(al)


def alpha_deferred(alpha, dev):
    """Scalar alphas read back in the caller's one host sync: (items, int32 parts to read).
    A float tensor on ``dev`` becomes its float64 bits (exact, as float(t)); the caller
    passes the read words to ``alpha_values``.  None: not all scalars (``alpha_list``)."""
    items = None if alpha is None else alpha_scalars(alpha)
    if items is None:
        return None, []
    parts = [f.detach().reshape(1).to(torch.float64).view(torch.int32) for f in items
             if _alpha_read(f, dev)]
    return items, parts


def _alpha_read(f, dev) -> bool:
    return isinstance(f, torch.Tensor) and f.device == dev and f.dtype.is_floating_point


def alpha_values(items, words, dev):
    """Python floats of the scalar factors; ``words``: int32 pairs read back for the tensors
    that ``alpha_deferred`` chose (float64 bits in native byte order)."""
    vals, i = [], 0
    for f in items:
        if _alpha_read(f, dev):
            vals.append(struct.unpack("=d", struct.pack("=ii", words[i], words[i + 1]))[0])
            i += 2
        else:
            vals.append(float(f))
    return vals


def epilogue(c: torch.Tensor, model: GemmModel, alpha: Alpha) -> torch.Tensor:
    scalar, factors = alpha
    if model.lattice is not None:
        L = float(model.lattice)
        fin = torch.isfinite(c) & (c.abs() < 2.0 ** 20)
        c = torch.where(fin, torch.round(c * (1 / L)) * L, c)  # exact scalings, RNE to integer
    if scalar is not None:
        c = c * torch.tensor(scalar, dtype=torch.float32, device=c.device)  # FP32 RNE product
    if factors:  # tensor factors: the emulator's exact products
        from fp4ref.gemm import apply_alpha
        c = apply_alpha(model, c, factors)
    return c
