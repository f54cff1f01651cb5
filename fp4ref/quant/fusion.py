"""Format-aware fusion quantizers, torch, bit-identical to ``reference.recipes.fusion``."""
from __future__ import annotations

import torch

from reference.recipes.fusion import check_cta_tile
from reference.recipes.hadamard import FUSION_H32_SIGNS
from reference.rounding import Mode, parse_mode
from . import _elem as E
from . import mx as _mx
from . import nvfp4 as _nv
from ._common import check_input, check_rbits
from .blocked import BlockScaledTensor
from .hadamard import hadamard_rows

__all__ = ["cta_nvfp4", "row_sr_mxfp4", "h32_mxfp4"]


def cta_nvfp4(x: torch.Tensor, cta_tile=(128, 128), *, mode="rne", rbits=None,
              nbits=None) -> BlockScaledTensor:
    th, tw = check_cta_tile(cta_tile)
    check_input(x)
    mode = parse_mode(mode)
    R, C = x.shape
    if C % 16:
        raise ValueError(f"x: last dimension {C} is not a multiple of 16 "
                         "(profile fusion_cta_nvfp4 does not pad)")
    rb = check_rbits(rbits, nbits, (R, C), mode is Mode.SR, mode.name)
    codes = torch.zeros((R, C), dtype=torch.uint8, device=x.device)
    sc = torch.zeros((R, C // 16), dtype=torch.uint8, device=x.device)
    nt_r, nt_c = -(-R // th), -(-C // tw)
    ts = torch.zeros((nt_r, nt_c), dtype=torch.float32, device=x.device)
    for i, r0 in enumerate(range(0, R, th)):
        for j, c0 in enumerate(range(0, C, tw)):
            sub = x[r0:r0 + th, c0:c0 + tw]
            a = E.canon_nan(torch.amax(torch.abs(sub.to(torch.float32))))
            kw = {}
            if rb is not None:
                kw = dict(rbits=rb[r0:r0 + th, c0:c0 + tw], nbits=nbits)
            q = _nv.quantize(sub, "te_nvfp4", tile=(1, 16), amax=a, mode=mode, **kw)
            codes[r0:r0 + th, c0:c0 + tw] = q.codes
            sc[r0:r0 + th, c0 // 16:c0 // 16 + q.scale_codes.shape[1]] = q.scale_codes
            ts[i, j] = q.tensor_scale.reshape(())
    return BlockScaledTensor((R, C), codes, "float4_e2m1fn", sc, "ue4m3", (1, 16), ts,
                             (th, tw), "fusion_cta_nvfp4")


def row_sr_mxfp4(dy: torch.Tensor, rbits, nbits: int) -> BlockScaledTensor:
    q = _mx.quantize(dy, "ocp_mx_floor", "float4_e2m1fn", mode="sr", rbits=rbits, nbits=nbits)
    q.profile = "fusion_row_sr_mxfp4"
    return q


def h32_mxfp4(x: torch.Tensor, *, mode="rne", rbits=None, nbits=None,
              signs=FUSION_H32_SIGNS) -> BlockScaledTensor:
    check_input(x)
    y = hadamard_rows(x.to(torch.float32), 32, signs)
    q = _mx.quantize(y, "ocp_mx_floor", "float4_e2m1fn", mode=mode, rbits=rbits, nbits=nbits)
    q.profile = "fusion_h32_mxfp4"
    return q
