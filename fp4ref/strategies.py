"""Hypothesis strategies: float32 inputs where a format's rounding is delicate.

Every point is derived from the FormatSpec row (quantum, emin, emax, max
finite), then nudged by a few float32 ulps and given a random sign:
- ``near_ties``: midpoints between neighbouring grid values (the overflow tie
  above max included);
- ``binade_edges``: powers of two across the format's range;
- ``subnormal_boundary``: min subnormal, half of it (the tie with zero), min
  normal and its neighbours;
- ``overflow_threshold``: max finite, max + half a step, the next grid value.
``interesting_float32`` mixes them with specials and arbitrary floats;
``float32_tensors`` builds torch tensors of them.
"""
from __future__ import annotations

import math
import struct
from fractions import Fraction

from hypothesis import strategies as st

from reference.exact import pow2
from reference.formats import get_format

__all__ = ["near_ties", "binade_edges", "subnormal_boundary", "overflow_threshold",
           "specials", "interesting_float32", "float32_tensors", "float32_near",
           "grid_points", "tie_points", "float32_neighbourhood", "HARD_BLOCKS", "hard_block",
           "hard_block_tensors"]

_F32_MAX_BITS = 0x7F7FFFFF


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def _to_f32(v: Fraction) -> float:
    """Nearest float32 to a non-negative exact value (saturating at float32 max)."""
    f = float(v)  # correctly rounded to binary64, then to binary32 below
    if f > 3.4028234663852886e38:
        return _from_bits(_F32_MAX_BITS)
    try:
        return struct.unpack("<f", struct.pack("<f", f))[0]
    except OverflowError:
        return _from_bits(_F32_MAX_BITS)


@st.composite
def float32_near(draw, point, ulps: int = 2) -> float:
    """``point`` (exact, >= 0) as float32, moved by up to ``ulps`` ulps, random sign."""
    b = _f32_bits(_to_f32(Fraction(point)))
    b = min(max(b + draw(st.integers(-ulps, ulps)), 0), _F32_MAX_BITS)
    v = _from_bits(b)
    return -v if draw(st.booleans()) else v


def _e_range(fmt):
    lo = fmt.emin - 1 if fmt.subnormals else fmt.emin - 3  # e8m0: a few binades below min
    return lo, fmt.emax + 1                                 # one binade above: the overflow tie


@st.composite
def _tie_point(draw, fmt) -> Fraction:
    lo, hi = _e_range(fmt)
    e = draw(st.integers(lo, hi))
    m = fmt.man_bits
    if fmt.subnormals and e < fmt.emin:      # the subnormal range [0, min_normal)
        q = fmt.quantum(fmt.emin)
        k = draw(st.integers(0, (1 << m) - 1))
    else:
        q = fmt.quantum(e)
        k = draw(st.integers(1 << m, (2 << m) - 1))
    return (k + Fraction(1, 2)) * q


def near_ties(fmt, ulps: int = 2):
    fmt = get_format(fmt)
    return _tie_point(fmt).flatmap(lambda p: float32_near(p, ulps))


def binade_edges(fmt, ulps: int = 2):
    fmt = get_format(fmt)
    lo, hi = _e_range(fmt)
    lo -= fmt.man_bits + 1
    return st.integers(lo, hi + 1).flatmap(lambda e: float32_near(pow2(e), ulps))


def _subnormal_points(fmt):
    pts = [fmt.min_normal, fmt.min_normal / 2, fmt.min_normal * 2]
    if fmt.min_subnormal is not None:
        s = fmt.min_subnormal
        pts += [s, s / 2, s * Fraction(3, 2), fmt.min_normal - s, fmt.min_normal - s / 2]
    else:  # no subnormals (e8m0): the range below min normal
        pts += [fmt.min_normal / 4, fmt.min_normal * Fraction(3, 4), fmt.min_normal * Fraction(3, 2)]
    return pts


def subnormal_boundary(fmt, ulps: int = 2):
    fmt = get_format(fmt)
    return st.sampled_from(_subnormal_points(fmt)).flatmap(lambda p: float32_near(p, ulps))


def _overflow_points(fmt):
    q = fmt.quantum(fmt.emax)
    return [fmt.max_finite, fmt.max_finite - q / 2, fmt.max_finite + q / 2, fmt.max_finite + q,
            pow2(fmt.emax + 1), pow2(fmt.emax + 1) + q]


def overflow_threshold(fmt, ulps: int = 2):
    fmt = get_format(fmt)
    return st.sampled_from(_overflow_points(fmt)).flatmap(lambda p: float32_near(p, ulps))


def specials():
    nan_bits = st.sampled_from([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FA00000])
    return st.one_of(st.sampled_from([0.0, -0.0, math.inf, -math.inf]), nan_bits.map(_from_bits))


def interesting_float32(fmt, ulps: int = 2):
    fmt = get_format(fmt)
    return st.one_of(near_ties(fmt, ulps), binade_edges(fmt, ulps), subnormal_boundary(fmt, ulps),
                     overflow_threshold(fmt, ulps), specials(), st.floats(width=32))


def float32_tensors(fmt, min_size: int = 1, max_size: int = 64, ulps: int = 2):
    """1-D float32 torch tensors of ``interesting_float32(fmt)`` values."""
    import torch
    return st.lists(interesting_float32(fmt, ulps), min_size=min_size, max_size=max_size).map(
        lambda xs: torch.tensor(xs, dtype=torch.float32))


# --- exhaustive point lists (formats of <= 16 bits) -------------------------------------
def grid_points(fmt) -> list[Fraction]:
    """Every non-negative finite value, plus the first grid value past max."""
    fmt = get_format(fmt)
    pts = [v for _, v in fmt.finite_values]
    return pts + [fmt.max_finite + fmt.quantum(fmt.emax)]


def tie_points(fmt, below: int = 24) -> list[Fraction]:
    """Every midpoint between neighbouring grid values (the overflow tie above max
    included); for formats without subnormals also ``below`` binades under min."""
    fmt = get_format(fmt)
    g = grid_points(fmt)
    if not fmt.subnormals:
        g = [pow2(fmt.emin - k) for k in range(below, 0, -1)] + g
    return [(a + b) / 2 for a, b in zip(g, g[1:])]


def float32_neighbourhood(points, ulps: int = 2, signed: bool = True):
    """float32 torch tensor: each point (rounded to float32) and its +-ulps neighbours."""
    import torch
    base = torch.tensor([_f32_bits(_to_f32(Fraction(p))) for p in points], dtype=torch.int64)
    b = (base[:, None] + torch.arange(-ulps, ulps + 1)[None, :]).reshape(-1)
    b = b.clamp(0, _F32_MAX_BITS)
    if signed:
        b = torch.cat([b, b | (1 << 31)])
    b = torch.where(b >= 1 << 31, b - (1 << 32), b)
    return b.to(torch.int32).view(torch.float32)


# --- hard blocks for block-scaled recipes and GEMMs -------------------------------------------
BF16_MAX = 3.3895313892515355e38          # 0x7F7F
BF16_MIN_SUB = 2.0 ** -133                # 0x0001
HARD_BLOCKS = ("scale_tie", "bf16_subnormal", "bf16_max", "nan_inf", "all_zero", "cancel")


def hard_block(kind: str, B: int, k: int, picks: list[int]) -> list[float]:
    """One block of ``kind`` (values exact in bfloat16, so the same in float32 and bf16):
    scale_tie: block max 6 * 2**k * (1 + (2i+1)/16), an e4m3 scale midpoint (ties of the
    scale rounding); bf16_subnormal: multiples of 2**-133 below 2**-126; bf16_max: +-0x7F7F
    and its neighbours; nan_inf: NaN / +-inf with ordinary values; all_zero: +-0 only;
    cancel: x and -x pairs (sums cancel exactly).  ``picks``: integers that choose values."""
    at = lambda i: picks[i % len(picks)]  # noqa: E731
    if kind == "scale_tie":
        v = [at(i) % 13 * 2.0 ** (k - 2) * (-1) ** at(i + 1) for i in range(B)]
        v[at(0) % B] = 6 * 2.0 ** k * (1 + (2 * (at(1) % 8) + 1) / 16)
        return v
    if kind == "bf16_subnormal":
        return [(at(i) % 128) * BF16_MIN_SUB * (-1) ** at(i + 3) for i in range(B)]
    if kind == "bf16_max":
        near = (BF16_MAX, BF16_MAX - 2.0 ** 120, BF16_MAX / 2, 2.0 ** 127)   # 0x7F7F, 0x7F7E, ..
        return [near[at(i) % 4] * (-1) ** at(i + 1) for i in range(B)]
    if kind == "nan_inf":
        sp = (math.nan, math.inf, -math.inf, 1.5, -0.5, 0.0)
        return [sp[at(i) % 6] for i in range(B)]
    if kind == "all_zero":
        return [-0.0 if at(i) % 2 else 0.0 for i in range(B)]
    if kind == "cancel":
        h = [(at(i) % 7 + 1) * 2.0 ** (k - at(i + 2) % 4) for i in range(B // 2)]
        return h + [-x for x in reversed(h)] + ([0.0] if B % 2 else [])
    raise ValueError(f"kind: unknown value {kind!r}; valid choices: {', '.join(HARD_BLOCKS)}")


def hard_block_tensors(rows, cols, block: int = 16, kinds=HARD_BLOCKS):
    """(kinds drawn, float32 [rows, cols] tensor with one hard block kind per block); each
    kind drawn is recorded as a hypothesis ``event`` (see --hypothesis-show-statistics)."""
    import torch
    from hypothesis import event

    @st.composite
    def strat(draw):
        R = draw(st.sampled_from(rows)) if isinstance(rows, (list, tuple)) else rows
        C = draw(st.sampled_from(cols)) if isinstance(cols, (list, tuple)) else cols
        vals, seen = [], []
        for _ in range(R):
            for c0 in range(0, C, block):
                kind = draw(st.sampled_from(kinds))
                seen.append(kind)
                picks = draw(st.lists(st.integers(0, 1 << 16), min_size=1, max_size=8))
                vals += hard_block(kind, min(block, C - c0), draw(st.integers(-8, 8)), picks)
        for kind in sorted(set(seen)):
            event(f"hard block: {kind}")
        return sorted(set(seen)), torch.tensor(vals, dtype=torch.float32).reshape(R, C)
    return strat()
