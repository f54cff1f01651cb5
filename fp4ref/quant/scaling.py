"""FP8 tensor-scaling formulas (SPEC 3.6), torch, bit-identical to
``reference.recipes.scaling`` (whose state objects hold the lifecycles; they
accept torch scalars directly)."""
from __future__ import annotations

import torch

from reference.errors import check_choice
from reference.recipes.scaling import (FP8_MAX, CalibratedFrozen, CurrentScaling, SampleAndHold,
                                       TEDelayedScaling)
from . import _elem as E
from ._common import FLT_MAX

__all__ = ["te_current_scale", "te_delayed_scale", "SampleAndHold", "CurrentScaling",
           "CalibratedFrozen", "TEDelayedScaling"]


def te_current_scale(amax: torch.Tensor, fmt: str = "float8_e4m3fn", *, pow2: bool = False,
                     variant: str = "kernel", eps: float = 0.0, x_dtype_max=None) -> torch.Tensor:
    check_choice("variant", variant, ("kernel", "ref"))
    fmax = float(FP8_MAX[check_choice("fmt", fmt, FP8_MAX)])
    a = amax.to(torch.float32)
    # torch evaluates float / tensor as reciprocal(tensor) * float (two roundings):
    # divide tensor by tensor
    if variant == "kernel":
        s = torch.full_like(a, fmax) / a
        s = torch.where(torch.isinf(s), torch.full_like(s, FLT_MAX), s)
        if pow2:
            s = E.from_f32_bits(E.f32_bits(s) & 0xFF800000)
        bad = torch.isnan(a) | torch.isinf(a) | (a == 0)
        return torch.where(bad, torch.ones_like(s), s)
    a = E.canon_nan(torch.maximum(a, torch.full_like(a, eps)))
    s = torch.full_like(a, fmax) / a
    big = float(x_dtype_max) if x_dtype_max is not None else FLT_MAX
    s = torch.where(s == float("inf"), torch.full_like(s, big), s)
    if pow2:  # frexp/ldexp: 2**(exponent-1); frexp of NaN / 0 gives exponent 0 -> 0.5
        fin = torch.isfinite(s) & (s != 0)
        s = torch.where(fin, E.from_f32_bits(E.f32_bits(s) & 0xFF800000), torch.full_like(s, 0.5))
        s = torch.where(a == float("inf"), torch.zeros_like(s), s)
    return torch.where(a == 0, torch.ones_like(s), s)


def te_delayed_scale(amax: torch.Tensor, prev_scale: torch.Tensor, fmt: str = "float8_e4m3fn",
                     margin: int = 0) -> torch.Tensor:
    """TE ``_default_sf_compute`` on an amax already taken from the history."""
    fmax = float(FP8_MAX[check_choice("fmt", fmt, FP8_MAX)])
    sf = (torch.full_like(amax, fmax) / amax) / float(2 ** margin)
    sf = torch.where(amax > 0.0, sf, prev_scale)
    sf = torch.where(torch.isfinite(amax), sf, prev_scale)
    return torch.where(torch.isinf(sf), torch.full_like(sf, FLT_MAX), sf)
