"""Format-aware fusion scale domains (SPEC 3.5), exact.

* CTA-local NVFP4: the per-tensor amax of ``te_nvfp4`` is replaced by the amax of
  the tile a thread block owns (tile shape a parameter; edge tiles are partial);
  each tile carries its own FP32 decode scale (``BlockScaled.tensor_tile``).
* Row-gradient SR: MXFP4 (OCP FLOOR) of gradient rows with SR elements.
* Fixed-sign 32-point Hadamard (``hadamard.FUSION_H32_SIGNS``) before MXFP4 of the
  weight-gradient GEMM operands.
"""
from __future__ import annotations

from ..blocked import BlockScaled
from ..rounding import Mode
from .common import amax as _amax, as_matrix, matrix_of_ints
from .hadamard import FUSION_H32_SIGNS, hadamard_rows
from . import mx as _mx
from .nvfp4 import NVFP4_RULES, quantize as _nvq

__all__ = ["cta_nvfp4", "row_sr_mxfp4", "h32_mxfp4", "check_cta_tile"]


def check_cta_tile(tile) -> tuple[int, int]:
    try:
        th, tw = int(tile[0]), int(tile[1])
    except Exception:
        raise ValueError(f"cta_tile: {tile!r} is not a (rows, cols) pair") from None
    if th < 1 or tw < 16 or tw % 16:
        raise ValueError(f"cta_tile: {tile!r} is invalid; valid: rows >= 1 and cols a "
                         "positive multiple of 16 (whole 1x16 blocks per tile)")
    return th, tw


def cta_nvfp4(x, cta_tile=(128, 128), *, mode=Mode.RNE, rbits=None, nbits=None,
              profile: str = "fusion_cta_nvfp4") -> BlockScaled:
    th, tw = check_cta_tile(cta_tile)
    m = as_matrix(x)
    rows, cols = len(m), (len(m[0]) if m else 0)
    if cols % 16:
        raise ValueError(f"x: last dimension {cols} is not a multiple of 16 "
                         f"(profile {profile} does not pad)")
    rb = matrix_of_ints(rbits, "rbits") if rbits is not None else None
    codes = [[0] * cols for _ in range(rows)]
    sc = [[0] * (cols // 16) for _ in range(rows)]
    ts = []
    rule = NVFP4_RULES["te_nvfp4"]
    for r0 in range(0, rows, th):
        trow = []
        for c0 in range(0, cols, tw):
            sub = [row[c0:c0 + tw] for row in m[r0:r0 + th]]
            a = _amax(v for row in sub for v in row)
            kw = {}
            if rb is not None:
                kw = dict(rbits=[row[c0:c0 + tw] for row in rb[r0:r0 + th]], nbits=nbits)
            q = _nvq(sub, rule, profile=profile, tile=(1, 16), amax=a, mode=mode, **kw)
            for i, row in enumerate(q.codes):
                codes[r0 + i][c0:c0 + len(row)] = row
            for i, row in enumerate(q.scale_codes):
                sc[r0 + i][c0 // 16:c0 // 16 + len(row)] = row
            trow.append(q.tensor_scale[0][0])
        ts.append(tuple(trow))
    return BlockScaled(shape=(rows, cols), codes=tuple(map(tuple, codes)),
                       elem_fmt="float4_e2m1fn", scale_codes=tuple(map(tuple, sc)),
                       scale_fmt="ue4m3", block=(1, 16), tensor_scale=tuple(ts),
                       tensor_tile=(th, tw), profile=profile)


def row_sr_mxfp4(dy, rbits, nbits: int, *, profile: str = "fusion_row_sr_mxfp4") -> BlockScaled:
    return _mx.quantize(dy, _mx.MX_RULES["ocp_mx_floor"], "float4_e2m1fn", profile=profile,
                        mode=Mode.SR, rbits=rbits, nbits=nbits)


def h32_mxfp4(x, *, mode=Mode.RNE, rbits=None, nbits=None, signs=FUSION_H32_SIGNS,
              profile: str = "fusion_h32_mxfp4") -> BlockScaled:
    y = hadamard_rows(as_matrix(x), 32, signs)
    return _mx.quantize(y, _mx.MX_RULES["ocp_mx_floor"], "float4_e2m1fn", profile=profile,
                        mode=mode, rbits=rbits, nbits=nbits)
