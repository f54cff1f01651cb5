"""Two-level (per-tensor FP32 + per-block scale) FP4 quantization: the UE5M3 recipe (SPEC 3.3)
and, with an E4M3 scale and no zero-scale correction, the NVFP4 rule it reuses (SPEC 3.1).

Operation order (SPEC 3.3 prints no formula; our reading, matching the ``ue5m3`` profile's
summary string, which is that profile's spec): every ``fl`` is one float32 RNE rounding.
  S_enc = min(fl(fl(T*6) / amax), FLT_MAX); S_enc = 1 when amax == 0 or S_enc == 0
  s     = fl(vec_max * fl(S_enc * fl(1/6))), clamped to the scale format's max, RNE
  UE5M3: a scale that rounds to code 0 is replaced by 1.0 (zero-scale correction)
  enc   = min(fl(1 / fl(s * fl(1/S_enc))), FLT_MAX);  q = e2m1(clamp(fl(x * enc), -6, 6))
  tensor (decode) scale = fl(1/S_enc)
"""
from __future__ import annotations

from . import f32
from .formats import decode, encode
from .num import V, from_float, is_zero

SIX = from_float(6.0)
ONE = from_float(1.0)


def tensor_scale(amax: V, target: V) -> V:
    """S_enc from the (cached) amax."""
    if is_zero(amax):
        return ONE
    s = f32.div(f32.mul(target, SIX), amax)
    if s.kind == "f" and f32.lt(f32.FLT_MAX, s) or s.kind == "inf":
        s = f32.FLT_MAX
    return ONE if is_zero(s) else s


def block_scale_code(vec_max: V, s_enc: V, scale_fmt: str, zero_fix: bool) -> int:
    s = f32.mul(vec_max, f32.mul(s_enc, f32.div(ONE, SIX)))
    cap = decode(encode(from_float(1e300), scale_fmt, "rne", "sat"), scale_fmt)  # max finite
    if s.kind != "nan" and f32.lt(cap, s):
        s = cap
    code = encode(s, scale_fmt, "rne", "sat")
    if zero_fix and code == 0:
        code = encode(ONE, scale_fmt)
    return code


def elem_code(x: V, enc: V, mode: str, rbits=None, nbits=None) -> int:
    v = f32.mul(x, enc)
    if v.kind == "nan":                     # NaN element: +6 (the profile's documented cast)
        v = SIX
    elif f32.lt(SIX, f32.absv(v)):
        v = V("f", v.neg, SIX.m, SIX.e)
    return encode(v, "float4_e2m1fn", mode, "sat", rbits, nbits)


def quantize(x, *, tile=(1, 16), target=448.0, amax=None, scale_fmt="ue5m3", zero_fix=True,
             mode="rne", rbits=None, nbits=None):
    """x: rows of V (shape a multiple of the tile). Returns (codes, scale_codes, decode scale)."""
    rows, cols = len(x), len(x[0])
    bm, bk = tile
    a = f32.amax(v for r in x for v in r) if amax is None else amax
    s_enc = tensor_scale(a, from_float(float(target)))
    inv = f32.div(ONE, s_enc)
    codes = [[0] * cols for _ in range(rows)]
    scodes = []
    for i0 in range(0, rows, bm):
        srow = []
        for j0 in range(0, cols, bk):
            blk = [(i, j) for i in range(i0, i0 + bm) for j in range(j0, j0 + bk)]
            sc = block_scale_code(f32.amax(x[i][j] for i, j in blk), s_enc, scale_fmt, zero_fix)
            srow.append(sc)
            enc = f32.div(ONE, f32.mul(decode(sc, scale_fmt), inv))
            if enc.kind == "inf" or f32.lt(f32.FLT_MAX, enc):
                enc = f32.FLT_MAX
            for i, j in blk:
                rb = None if rbits is None else rbits[i][j]
                codes[i][j] = elem_code(x[i][j], enc, mode, rb, nbits)
        scodes.append(srow)
    return codes, scodes, inv
