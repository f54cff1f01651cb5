"""Fast Walsh-Hadamard transform in float32 (SPEC 3.4, 3.5): Sylvester order
H[i][j] = (-1)**popcount(i & j); signs multiplied in first (exact), then log2(n) butterfly
stages (a + b, a - b, each one float32 RNE), then one float32 multiply by RN_f32(n**-1/2).

Stage order is not in SPEC; our reading is the common in-place loop with the butterfly
span h = 1, 2, 4, ... (``order='small_first'``); ``'large_first'`` is the other choice.
"""
from __future__ import annotations

from . import f32
from .num import V, from_float

# SPEC 3.1's 16 fixed RHT signs; the 32-point fixed signs of the fusion paper are not printed
# in SPEC: we take those 16 followed by their negation (the help() signature of the project's
# h32_mxfp4 lists exactly that; documented in README as the one place we took a literal).
RHT16_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
H32_SIGNS = RHT16_SIGNS + tuple(-s for s in RHT16_SIGNS)


def norm_const(n: int) -> V:
    """RN_f32(1/sqrt(n)), correctly rounded: sqrt of the exact 1/n (n a power of two)."""
    return f32.sqrt(from_float(1.0 / n))


def fwht(xs, signs=None, order="small_first", normalize=True):
    n = len(xs)
    y = [V(v.kind, v.neg != (signs is not None and signs[i] < 0), v.m, v.e) for i, v in enumerate(xs)]
    spans = []
    h = 1
    while h < n:
        spans.append(h)
        h *= 2
    if order == "large_first":
        spans.reverse()
    for h in spans:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                a, b = y[j], y[j + h]
                y[j], y[j + h] = f32.add(a, b), f32.add(a, V(b.kind, not b.neg, b.m, b.e))
    if normalize:
        c = norm_const(n)
        y = [f32.mul(v, c) for v in y]
    return y
