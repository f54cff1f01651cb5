"""Test / conformance inputs for block quantizers: hypothesis strategies and seeded
random tensors, concentrated where block-scaled rounding is delicate.

Each block (1 x B along a row) is one of:
  ties       elements 2**k * m for E2M1 midpoints m (and E2M1 grid points), with the
             block amax 6 * 2**k (so x / scale lands exactly on ties), some nudged 1 ulp
  amax_edge  block amax at a binade edge 2**k (1 +- ulp), 6 * 2**k (1 +- ulp), or at
             6 x an e4m3 scale midpoint (where scale-order variants split)
  zero / tiny / huge   all +-0, float32 subnormals, near FLT_MAX
  special    NaN / +-Inf / -0 sprinkled into an ordinary block
  normal / heavy       N(0, s) or lognormal-scaled (heavy-tailed) values
A "global" element 2688 * 2**j may be planted so the per-tensor scale is a power of two.
"""
from __future__ import annotations

import math
import struct

import torch

__all__ = ["BLOCK_KINDS", "block_tensors", "random_tensor", "crafted_tensors", "to_dtype"]

BLOCK_KINDS = ("ties", "amax_edge", "zero", "tiny", "huge", "special", "normal", "heavy")
# fixed-point inputs (multiples of 2**-8, |x| <= 2**6): any FP32 summation order of a
# 16-term Hadamard group is exact (used where upstream's summation order is unknown)
GRID_KINDS = ("ties", "zero", "grid")
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E4M3_MIDS = tuple(1 + (2 * i + 1) / 16 for i in range(8))


def _f32(v: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(3.4028234663852886e38, v)


def _nudge(v: float, ulps: int) -> float:
    if v == 0 or not math.isfinite(v):
        return v
    b = struct.unpack("<I", struct.pack("<f", _f32(v)))[0]
    b = max(1, min(0x7F7FFFFF, (b & 0x7FFFFFFF) + ulps)) | (b & 0x80000000)
    return struct.unpack("<f", struct.pack("<I", b))[0]


def to_dtype(vals, rows: int, cols: int, dtype) -> torch.Tensor:
    t = torch.tensor(vals, dtype=torch.float64).reshape(rows, cols)
    return t.to(torch.float32).to(dtype)  # float32 first: values are float32 by design


def _block(kind: str, B: int, rnd, k_range=(-12, 12)) -> list[float]:
    """rnd: an object with .integers(lo, hi), .choice(seq), .normal(), .boolean()."""
    k = rnd.integers(*k_range)
    s = 2.0 ** k
    if kind == "grid":
        return [rnd.integers(-(1 << 14), 1 << 14) * 2.0 ** -8 for _ in range(B)]
    if kind == "ties":
        v = [rnd.choice((-1, 1)) * s * rnd.choice(_MIDS + _GRID) for _ in range(B)]
        v[rnd.integers(0, B - 1)] = rnd.choice((-1, 1)) * 6 * s
        if k_range != (-12, 12):
            return v
        return [_nudge(x, rnd.choice((0, 0, 0, -1, 1))) for x in v]
    if kind == "amax_edge":
        v = [rnd.normal() * s for _ in range(B)]
        edge = rnd.choice((1.0, 6.0, 6.0 * rnd.choice(_E4M3_MIDS), 4.0, 448.0 * 6))
        v[rnd.integers(0, B - 1)] = rnd.choice((-1, 1)) * _nudge(edge * s, rnd.choice((-1, 0, 1)))
        return v
    if kind == "zero":
        return [rnd.choice((0.0, -0.0)) for _ in range(B)]
    if kind == "tiny":
        return [rnd.choice((-1, 1)) * rnd.integers(0, 1 << 12) * 2.0 ** -149 for _ in range(B)]
    if kind == "huge":
        return [rnd.choice((-1, 1)) * _nudge(3.4028234663852886e38, -rnd.integers(0, 1 << 20))
                for _ in range(B)]
    if kind == "special":
        v = [rnd.normal() * s for _ in range(B)]
        v[rnd.integers(0, B - 1)] = rnd.choice((math.nan, math.inf, -math.inf, -0.0))
        return v
    if kind == "heavy":
        return [rnd.normal() * math.exp(3 * rnd.normal()) * s for _ in range(B)]
    if kind == "normal":
        return [rnd.normal() * s for _ in range(B)]
    raise ValueError(f"kind: unknown value {kind!r}; valid choices: {', '.join(BLOCK_KINDS)}, grid")


class _Rng:
    def __init__(self, g: torch.Generator):
        self.g = g

    def integers(self, lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=self.g))

    def choice(self, seq):
        return seq[self.integers(0, len(seq) - 1)]

    def normal(self):
        return float(torch.randn((), generator=self.g, dtype=torch.float64))

    def boolean(self):
        return self.integers(0, 1) == 1


class _Draw:
    def __init__(self, draw):
        from hypothesis import strategies as st
        self.draw, self.st = draw, st

    def integers(self, lo, hi):
        return self.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        return self.draw(self.st.sampled_from(seq))

    def normal(self):
        return self.draw(self.st.floats(-4.0, 4.0, allow_nan=False, width=32))

    def boolean(self):
        return self.draw(self.st.booleans())


def _assemble(rnd, rows, cols, B, kinds, allow_special=True, plant_global=True):
    grid = "grid" in kinds
    k_range = (-2, 2) if grid else (-12, 12)
    vals = []
    for r in range(rows):
        for c0 in range(0, cols, B):
            kind = rnd.choice(kinds if allow_special else tuple(k for k in kinds if k != "special"))
            vals += _block(kind, min(B, cols - c0), rnd, k_range)
    if plant_global and not grid and rnd.boolean():
        vals[rnd.integers(0, len(vals) - 1)] = 2688.0 * 2.0 ** rnd.integers(-8, 8)
    return [_f32(v) for v in vals]


def block_tensors(rows, cols, block: int = 16, dtypes=(torch.float32, torch.bfloat16),
                  kinds=BLOCK_KINDS, allow_special: bool = True):
    """Hypothesis strategy of (tensor) with per-block kinds (shrinks toward 'ties' blocks)."""
    from hypothesis import strategies as st

    @st.composite
    def strat(draw):
        R = draw(st.sampled_from(rows)) if isinstance(rows, (list, tuple)) else rows
        C = draw(st.sampled_from(cols)) if isinstance(cols, (list, tuple)) else cols
        dt = draw(st.sampled_from(dtypes))
        vals = _assemble(_Draw(draw), R, C, block, kinds, allow_special)
        return to_dtype(vals, R, C, dt)
    return strat()


def random_tensor(rows, cols, block, dtype, seed: int, kinds=BLOCK_KINDS,
                  allow_special: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return to_dtype(_assemble(_Rng(g), rows, cols, block, kinds, allow_special), rows, cols, dtype)


def crafted_tensors(rows, cols, dtype, seed: int = 0):
    """Plain random normal and heavy-tailed tensors (no block structure)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randn(rows, cols, generator=g)
    h = torch.randn(rows, cols, generator=g) * torch.exp(3 * torch.randn(rows, cols, generator=g))
    return [n.to(dtype), h.to(dtype)]
