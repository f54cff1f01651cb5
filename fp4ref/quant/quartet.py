"""Quartet quantizers, torch, bit-identical to ``reference.recipes.quartet``."""
from __future__ import annotations

import torch

from reference.recipes.quartet import QUEST_C, QUEST_EPS
from reference.rounding import Mode, Policy
from fp4ref import cast
from . import _elem as E
from ._common import check_input, check_rbits
from .blocked import BlockScaledTensor
from .hadamard import fwht_f32

__all__ = ["quest_forward", "quartet_backward"]

_SAT = Policy.make(overflow="satfinite", inf="saturate", nan="to_zero")
_E2M1_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _blocks(x):
    check_input(x)
    R, C = x.shape
    if C % 32:
        raise ValueError(f"x: last dimension {C} is not a multiple of the block 32 "
                         "(Quartet does not pad; valid: multiples of 32)")
    return x.to(torch.float32).reshape(R, C // 32, 32), R, C


def quest_forward(x: torch.Tensor) -> BlockScaledTensor:
    g, R, C = _blocks(x)
    y = fwht_f32(g)
    acc = torch.zeros(y.shape[:-1], dtype=torch.float32, device=x.device)
    for i in range(32):  # sequential FP32 sum, index order
        acc = acc + y[..., i] * y[..., i]
    ms = acc / 32.0
    rms = ms.to(torch.float64).sqrt().to(torch.float32)  # correctly rounded (torch f32 sqrt is not)
    v = ((rms * float(QUEST_C)) / 6.0) + float(QUEST_EPS)
    ok = torch.isfinite(v)
    vs = torch.where(ok, v, torch.ones_like(v))
    e = torch.frexp(vs.to(torch.float64)).exponent.to(torch.int64) - 1
    e = torch.clamp(e, -127, 127)
    sc = torch.where(ok, e + 127, torch.full_like(e, 0xFF)).to(torch.uint8)
    q = y.to(torch.float64) * torch.ldexp(torch.ones_like(e, dtype=torch.float64), -e)[..., None]
    q = torch.where(ok[..., None], q, torch.zeros_like(q))
    rtz = cast.quantize(q, "float4_e2m1fn", Mode.RTZ, _SAT)
    rne = cast.quantize(q, "float4_e2m1fn", Mode.RNE, _SAT)
    a = q.abs()
    tie = torch.zeros_like(a, dtype=torch.bool)
    for m in _E2M1_MID:
        tie |= a == m
    codes = torch.where(tie, rtz, rne)
    mask = (a < 6) & ok[..., None]
    return BlockScaledTensor((R, C), codes.reshape(R, C).contiguous(), "float4_e2m1fn",
                             sc, "float8_e8m0fnu", (1, 32), profile="quartet_fwd",
                             meta={"mask": mask.reshape(R, C)})


def quartet_backward(x: torch.Tensor, signs, rbits, nbits: int) -> BlockScaledTensor:
    if len(signs) != 32 or any(s not in (1, -1) for s in list(signs)):
        raise ValueError("signs: expected 32 values, each +1 or -1")
    g, R, C = _blocks(x)
    rb = check_rbits(rbits, nbits, (R, C), True, "SR")
    y = fwht_f32(g, list(signs))
    amax = E.canon_nan(torch.amax(torch.abs(y), -1))
    fin = torch.isfinite(amax)
    pos = fin & (amax > 0)
    safe = torch.where(pos, amax, torch.ones_like(amax))
    k = torch.frexp(safe.to(torch.float64)).exponent - 1
    p2 = torch.ldexp(torch.ones_like(safe, dtype=torch.float64), k).to(torch.float32)
    s = torch.where(pos, p2 / 3.0, torch.ones_like(safe))
    s = torch.where(fin, s, torch.full_like(s, float("nan")))
    q = y / s[..., None]
    codes = cast.quantize(q.reshape(R, C), "float4_e2m1fn", Mode.SR, _SAT, rbits=rb, nbits=nbits)
    codes = torch.where((~fin).repeat_interleave(32, -1), torch.zeros_like(codes), codes)
    return BlockScaledTensor((R, C), codes.contiguous(), "float4_e2m1fn", E.f32_bits(s),
                             "float32", (1, 32), profile="quartet_bwd")
