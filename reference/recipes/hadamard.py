"""Hadamard transforms with an exact FP32 operation order.

``fwht_f32``: signs applied (exact), then log2(n) butterfly stages in float32
(a + b and a - b, each RNE), then one float32 multiply by c_n = RN_f32(n**-1/2)
(exact 1/4 for n = 16).  Sylvester order: y = H x with H[i][j] = (-1)**popcount(i & j).
A fast path reproduces it bit for bit with elementwise float32 ops.
"""
from __future__ import annotations

from fractions import Fraction

from ..exact import Exact, exact
from . import f32 as F

__all__ = ["fwht_f32", "hadamard_rows", "norm_const", "FUSION_H32_SIGNS"]

# Format-aware fusion's fixed 32-point signs: the paper fixes them but does not print
# them; ours are TE's 16 RHT signs followed by the same 16 negated (our choice).
_TE16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
FUSION_H32_SIGNS = _TE16 + tuple(-s for s in _TE16)


def norm_const(n: int) -> Exact:
    """RN_f32(1/sqrt(n)) exactly."""
    return F.sqrt(exact(Fraction(1, n)))


def fwht_f32(xs: list[Exact], signs=None, normalize: bool = True) -> list[Exact]:
    n = len(xs)
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: Hadamard size {n} is not a power of two")
    y = [(-v if (signs is not None and signs[i] < 0) else v) for i, v in enumerate(xs)]
    h = 1
    while h < n:
        for s in range(0, n, 2 * h):
            for i in range(s, s + h):
                a, b = y[i], y[i + h]
                y[i], y[i + h] = F.add(a, b), F.sub(a, b)
        h *= 2
    if normalize:
        c = norm_const(n)
        y = [F.mul(v, c) for v in y]
    return y


def hadamard_rows(m: list[list[Exact]], n: int, signs=None, normalize: bool = True):
    """Apply ``fwht_f32`` to each group of n consecutive elements of each row."""
    out = []
    for row in m:
        if len(row) % n:
            raise ValueError(f"x: last dimension {len(row)} is not a multiple of the "
                             f"Hadamard size {n}")
        r = []
        for g in range(0, len(row), n):
            r += fwht_f32(row[g:g + n], signs, normalize)
        out.append(r)
    return out
