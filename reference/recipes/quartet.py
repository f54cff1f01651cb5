"""Quartet MXFP4 training quantizers (SPEC 3.4), with an exact FP32 op order.

Forward (QuEST): per block of 32 along the row, y = H32 x (``fwht_f32``,
orthonormal), rms = sqrt_f32(fl(sum_f32(y_i * y_i) / 32)) summed in index
order, v = fl(fl(fl(rms * c) / 6) + eps) with c = f32(2.92247856) and
eps = f32(1e-8), scale 2**e with e = floor(log2 v) (exact binade of v, clamped
to [-127, 127], an E8M0 code); elements round(y / 2**e) to E2M1 to nearest
with ties toward zero (as the reference emulation breaks them), saturating at
+-6; trust mask = |y / 2**e| < 6 (SPEC literal).  A block holding NaN or Inf: scale 0xFF, codes +0,
mask False (our choice).

Backward: y = H32 (signs * x) with caller-supplied signs (re-drawn each backward
call by the caller), amax = max|y|, scale = fl(2**floor(log2 amax) / 3)
(FP32, stored as float32 bits), elements SR_e2m1(fl(y / scale)) with explicit
random bits (SPEC add-then-truncate), saturating.  Zero block: scale 1.0,
codes +-0; NaN/Inf block: scale NaN, codes +0 (our choices).
"""
from __future__ import annotations

from ..exact import Exact, Kind, exact, floor_log2, pow2
from ..formats import get_format
from ..rounding import Mode, Policy, encode
from ..blocked import BlockScaled
from . import f32 as F
from .common import amax as _amax, as_matrix, matrix_of_ints
from .hadamard import fwht_f32

__all__ = ["quest_forward", "quartet_backward", "QUEST_C", "QUEST_EPS", "round_ties_zero"]

QUEST_C = F.const(2.92247856)
QUEST_EPS = F.const(1e-8)
_E2M1 = get_format("float4_e2m1fn")
_SAT = Policy.make(overflow="satfinite", inf="saturate", nan="to_zero")


def round_ties_zero(v: Exact, fmt=_E2M1) -> int:
    """Nearest, ties toward zero, saturating; sign of zero kept."""
    lo = encode(v, fmt, Mode.RTZ, _SAT).code
    ne = encode(v, fmt, Mode.RNE, _SAT).code
    if lo == ne:
        return lo
    a = fmt.decode(lo).mag
    b = fmt.decode(encode(v, fmt, Mode.RUP if not v.negative else Mode.RDN, _SAT).code).mag
    return lo if 2 * v.mag == a + b else ne


def _check_cols(m, n=32):
    cols = len(m[0]) if m else 0
    if cols % n:
        raise ValueError(f"x: last dimension {cols} is not a multiple of the block 32 "
                         "(Quartet does not pad; valid: multiples of 32)")
    return cols


def quest_forward(x, *, profile: str = "quartet_fwd") -> BlockScaled:
    m = as_matrix(x)
    rows, cols = len(m), _check_cols(m)
    codes = [[0] * cols for _ in range(rows)]
    sc = [[0] * (cols // 32) for _ in range(rows)]
    mask = [[False] * cols for _ in range(rows)]
    six = exact(6)
    for r in range(rows):
        for b in range(cols // 32):
            y = fwht_f32(m[r][b * 32:(b + 1) * 32])
            acc = F.ZERO
            for v in y:
                acc = F.add(acc, F.mul(v, v))
            rms = F.sqrt(F.div(acc, exact(32)))
            v = F.add(F.div(F.mul(rms, QUEST_C), six), QUEST_EPS)
            if not v.is_finite:
                sc[r][b] = 0xFF
                continue
            e = max(-127, min(127, floor_log2(v.mag)))
            sc[r][b] = e + 127
            for j, yv in enumerate(y):
                q = Exact(Kind.FINITE, yv.negative, yv.mag / pow2(e))
                codes[r][b * 32 + j] = round_ties_zero(q)
                mask[r][b * 32 + j] = q.mag < 6
    return BlockScaled(shape=(rows, cols), codes=tuple(map(tuple, codes)),
                       elem_fmt="float4_e2m1fn", scale_codes=tuple(map(tuple, sc)),
                       scale_fmt="float8_e8m0fnu", block=(1, 32), profile=profile,
                       meta={"mask": tuple(map(tuple, mask))})


def quartet_backward(x, signs, rbits, nbits: int, *, profile: str = "quartet_bwd") -> BlockScaled:
    if len(signs) != 32 or any(s not in (1, -1) for s in signs):
        raise ValueError("signs: expected 32 values, each +1 or -1")
    m = as_matrix(x)
    rows, cols = len(m), _check_cols(m)
    rb = matrix_of_ints(rbits, "rbits")
    if len(rb) != rows or any(len(r) != cols for r in rb):
        raise ValueError(f"rbits: shape must equal x's {rows}x{cols}")
    codes = [[0] * cols for _ in range(rows)]
    sc = [[0] * (cols // 32) for _ in range(rows)]
    for r in range(rows):
        for b in range(cols // 32):
            y = fwht_f32(m[r][b * 32:(b + 1) * 32], signs)
            a = _amax(y)
            if not a.is_finite:
                sc[r][b] = F.bits(Exact(Kind.NAN, False))
                continue
            if a.is_zero:
                s = F.ONE
            else:
                s = F.div(exact(pow2(floor_log2(a.mag))), exact(3))
            sc[r][b] = F.bits(s)
            for j, yv in enumerate(y):
                q = F.div(yv, s)
                codes[r][b * 32 + j] = encode(q, _E2M1, Mode.SR, _SAT, rbits=rb[r][b * 32 + j],
                                              nbits=nbits).code
    return BlockScaled(shape=(rows, cols), codes=tuple(map(tuple, codes)),
                       elem_fmt="float4_e2m1fn", scale_codes=tuple(map(tuple, sc)),
                       scale_fmt="float32", block=(1, 32), profile=profile)

