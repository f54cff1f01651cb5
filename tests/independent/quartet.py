"""Quartet forward quantizer (SPEC 3.4, QuEST): per block of 32 along the row,
y = H32 x (float32 FWHT, orthonormal), scale 2**floor(log2(std * 2.92247856 / 6 + 1e-8)),
elements to E2M1 nearest with ties toward zero, trust mask |y / s| < 6.

FP32 order (SPEC gives the formula only; the quartet_fwd summary string fixes it):
rms = sqrt_f32(fl(sum_f32(fl(y_i*y_i)) / 32)), index order from +0; v = fl(fl(fl(rms*c)/6)+eps)
with c, eps the float32 constants; exponent clamped to [-127, 127] (an E8M0 code).
Our choices: a block holding NaN or Inf gets scale 0xFF, codes +0, mask False.
"""
from __future__ import annotations

from . import f32
from .formats import e8m0_code, encode
from .hadamard import fwht
from .num import ZERO, V, flog2, from_float

C = f32.const(2.92247856)
EPS = f32.const(1e-8)


def block_exponent(y) -> int:
    ss = ZERO
    for v in y:
        ss = f32.add(ss, f32.mul(v, v))
    rms = f32.sqrt(f32.div(ss, from_float(32.0)))
    v = f32.add(f32.div(f32.mul(rms, C), from_float(6.0)), EPS)
    if v.kind == "inf":             # sum of squares overflowed FP32: log2(inf) clamps to 127
        return 127
    return max(-127, min(127, flog2(v)))


def forward_block(xs, order="small_first"):
    """One block of 32 V -> (codes, e8m0 scale code, mask)."""
    if any(v.kind != "f" for v in xs):
        return [0] * 32, 0xFF, [False] * 32
    y = fwht(xs, order=order)
    k = block_exponent(y)
    codes, mask = [], []
    for v in y:
        t = V("f", v.neg, v.m, v.e - k)               # y / 2**k, exact
        codes.append(encode(t, "float4_e2m1fn", "rnz", "sat"))
        mask.append(f32.lt(f32.absv(t), from_float(6.0)))
    return codes, e8m0_code(k), mask


def forward(x, order="small_first"):
    codes, scales, masks = [], [], []
    for row in x:
        cr, sr, mr = [], [], []
        for j in range(0, len(row), 32):
            c, s, m = forward_block(row[j:j + 32], order)
            cr += c
            sr.append(s)
            mr += m
        codes.append(cr)
        scales.append(sr)
        masks.append(mr)
    return codes, scales, masks
