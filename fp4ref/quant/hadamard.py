"""Hadamard transforms, torch, bit-identical to ``reference.recipes.hadamard``
(elementwise float32 butterflies in the same order)."""
from __future__ import annotations

import torch

from reference.recipes.hadamard import norm_const, FUSION_H32_SIGNS

__all__ = ["fwht_f32", "hadamard_rows", "FUSION_H32_SIGNS"]


def fwht_f32(g: torch.Tensor, signs=None, normalize: bool = True) -> torch.Tensor:
    """(..., n) float32 -> (..., n): signs, butterflies (a+b, a-b), times RN_f32(n**-1/2)."""
    n = g.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: Hadamard size {n} is not a power of two")
    y = g.to(torch.float32)
    if signs is not None:
        s = torch.tensor(signs, dtype=torch.float32, device=g.device)
        y = torch.where(s < 0, -y, y)
    lead = y.shape[:-1]
    h = 1
    while h < n:
        v = y.reshape(*lead, n // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(*lead, n)
        h *= 2
    if normalize:
        y = y * float(norm_const(n))
    return y


def hadamard_rows(x: torch.Tensor, n: int, signs=None, normalize: bool = True) -> torch.Tensor:
    R, C = x.shape
    if C % n:
        raise ValueError(f"x: last dimension {C} is not a multiple of the Hadamard size {n}")
    return fwht_f32(x.reshape(R, C // n, n), signs, normalize).reshape(R, C)
