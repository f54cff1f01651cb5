"""Format-aware fusion scale domains (SPEC 3.5).

* CTA-local NVFP4: the NVFP4 rule of SPEC 3.1 (current order, see twolevel.py) with the
  per-tensor amax replaced by the amax of each cta_tile; one decode scale per tile.
* MXFP4 (SPEC 3.2 FLOOR): k = floor(log2 amax) - 2 from the integer bit length, clamped
  to [-127, 127]; elements x / 2**k rounded (RNE, or SR with explicit bits) and saturated.
  Our readings: an all-zero block takes k = -127 (log2 0 = -inf, clamped): code 0; a block
  holding NaN or Inf: scale 0xFF and codes +0.
* Row-gradient SR: the MXFP4 rule on gradient rows with SPEC 2 SR elements.
* Fixed-sign 32-point Hadamard (hadamard.H32_SIGNS) before MXFP4.
"""
from __future__ import annotations

from . import f32, twolevel
from .formats import e8m0_code, encode
from .hadamard import H32_SIGNS, fwht
from .num import V, flog2


def cta_nvfp4(x, cta_tile=(128, 128), mode="rne", rbits=None, nbits=None):
    rows, cols = len(x), len(x[0])
    tm, tn = cta_tile
    codes = [[0] * cols for _ in range(rows)]
    scodes = [[0] * (cols // 16) for _ in range(rows)]
    tscales = []
    for i0 in range(0, rows, tm):
        trow = []
        for j0 in range(0, cols, tn):
            sub = [r[j0:j0 + tn] for r in x[i0:i0 + tm]]
            rb = None if rbits is None else [r[j0:j0 + tn] for r in rbits[i0:i0 + tm]]
            c, s, inv = twolevel.quantize(sub, tile=(1, 16), scale_fmt="ue4m3", zero_fix=False,
                                          mode=mode, rbits=rb, nbits=nbits)
            for di, crow in enumerate(c):
                codes[i0 + di][j0:j0 + len(crow)] = crow
                scodes[i0 + di][j0 // 16:j0 // 16 + len(s[di])] = s[di]
            trow.append(inv)
        tscales.append(trow)
    return codes, scodes, tscales


def mx_block(xs, mode="rne", rbits=None, nbits=None):
    if any(v.kind != "f" for v in xs):
        return [0] * len(xs), 0xFF
    a = f32.amax(xs)
    k = -127 if a.m == 0 else max(-127, min(127, flog2(a) - 2))
    out = []
    for i, v in enumerate(xs):
        t = V("f", v.neg, v.m, v.e - k)
        out.append(encode(t, "float4_e2m1fn", mode, "sat", None if rbits is None else rbits[i], nbits))
    return out, e8m0_code(k)


def mxfp4(x, mode="rne", rbits=None, nbits=None):
    codes, scales = [], []
    for i, row in enumerate(x):
        cr, sr = [], []
        for j in range(0, len(row), 32):
            rb = None if rbits is None else rbits[i][j:j + 32]
            c, s = mx_block(row[j:j + 32], mode, rb, nbits)
            cr += c
            sr.append(s)
        codes.append(cr)
        scales.append(sr)
    return codes, scales


def row_sr_mxfp4(dy, rbits, nbits):
    return mxfp4(dy, "sr", rbits, nbits)


def h32_mxfp4(x, order="small_first"):
    y = [sum((fwht(r[j:j + 32], H32_SIGNS, order) for j in range(0, len(r), 32)), []) for r in x]
    return mxfp4(y)
