"""Triton kernels of ``fp4ref.gemm_fast``'s two recurrences: one launch runs every fused
step of a block of lanes (the torch loop issues ~25 launches per step).  The arithmetic is
the torch loop's, op for op (see fp4ref/gemm_fast.py for why it is exact), in float64 with
int64 bit casts; only the integer rounding of aligned terms is spelled differently:
RTZ by the float64 -> int64 cast (truncation), RNE by adding and subtracting 1.5 * 2**52
(exact for |x| < 2**51: the add rounds x to an integer, ties to even).

Imported lazily (``gemm_fast._triton``); the kernels run compiled on CUDA and in the
interpreter with TRITON_INTERPRET=1 (tests/test_gemm_emulator.py, marker triton_interpret).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["aligned_lanes", "chain_lanes"]

_BLOCK = 128
_MAGIC = 6755399441055744.0  # 1.5 * 2**52


@triton.jit
def _round32(t, RTZ: tl.constexpr):
    """float64 t (exact) -> the FP32 value RNE / RTZ, as float64."""
    y = t.to(tl.float32)  # fptrunc: RNE, subnormals, overflow to Inf
    if RTZ:
        yb = y.to(tl.int32, bitcast=True)
        up = tl.abs(y.to(tl.float64)) > tl.abs(t)  # the cast went up in magnitude
        y = tl.where(up, yb - 1, yb).to(tl.float32, bitcast=True)  # -1: one ulp down (any sign)
    return y.to(tl.float64)


@triton.jit
def _add_round32(x, y, RTZ: tl.constexpr):
    """x + y rounded once to FP32: two-sum, round to odd at 53 bits, then to FP32."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    bits = s.to(tl.int64, bitcast=True)
    fin = tl.abs(s) < float("inf")
    fix = (e != 0) & ((bits & 1) == 0) & fin
    step = tl.where((e > 0) == (s > 0), 1, -1).to(tl.int64)
    s = tl.where(fix, bits + step, bits).to(tl.float64, bitcast=True)
    return _round32(s, RTZ)


@triton.jit
def _chain_kernel(P, OUT, S, RL, RTZ: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = lanes < RL
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    s = tl.full((), 0, tl.int64)
    while s < S:  # (a while loop: the interpreter cannot range() over a runtime int here)
        p = tl.load(P + s * RL + lanes, mask=mask, other=0.0)
        acc = _add_round32(acc, p, RTZ)
        s += 1
    tl.store(OUT + lanes, acc, mask=mask)


@triton.jit
def _aligned_kernel(P, XB, SPEC, NEGZ, OUT, S, RL, AB: tl.constexpr, F: tl.constexpr,
                    RTZ_ALIGN: tl.constexpr, RTZ: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = lanes < RL
    fcol = tl.arange(0, F)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    s = tl.full((), 0, tl.int64)
    while s < S:
        base = s * RL
        p = tl.load(P + (base + lanes[:, None]) * F + fcol[None, :], mask=mask[:, None], other=0.0)
        xb = tl.load(XB + base + lanes, mask=mask, other=0)
        spec = tl.load(SPEC + base + lanes, mask=mask, other=0.0)
        negz = tl.load(NEGZ + base + lanes, mask=mask, other=0)
        bits = acc.to(tl.int64, bitcast=True)
        eb = tl.minimum(tl.maximum((bits >> 52) & 0x7FF, xb), 2045)  # as the torch loop
        inv = ((2046 + AB - eb) << 52).to(tl.float64, bitcast=True)
        q = ((eb - AB) << 52).to(tl.float64, bitcast=True)
        tp = p * inv[:, None]
        ta = acc * inv
        if RTZ_ALIGN:
            tp = tp.to(tl.int64).to(tl.float64)
            ta = ta.to(tl.int64).to(tl.float64)
        else:
            tp = (tp + _MAGIC) - _MAGIC
            ta = (ta + _MAGIC) - _MAGIC
        t = tl.sum(tp, axis=1) + ta
        y = _round32(t * q, RTZ)
        negzero = (acc == 0) & (bits < 0) & (negz != 0)    # acc -0 and every product -0
        y = tl.where(t == 0, (negzero.to(tl.int64) << 63).to(tl.float64, bitcast=True), y)
        z = acc + spec
        acc = tl.where(tl.abs(z) < float("inf"), y, z)
        s += 1
    tl.store(OUT + lanes, acc, mask=mask)


def chain_lanes(P: torch.Tensor, rtz: bool) -> torch.Tensor:
    """P [S, lanes] float64 products -> the lanes' FP32 chains (float64)."""
    S, RL = P.shape
    out = torch.empty(RL, dtype=torch.float64, device=P.device)
    _chain_kernel[(triton.cdiv(RL, _BLOCK),)](P.contiguous(), out, S, RL, RTZ=rtz, BLOCK=_BLOCK)
    return out


def aligned_lanes(P, Xb, spec, negz, align_bits: int, rtz_align: bool, rtz: bool) -> torch.Tensor:
    """P [S, lanes, F] (F a power of two; -0.0 padding), Xb [S, lanes] int64 biased step
    exponents, spec [S, lanes] float64, negz [S, lanes] bool -> the lanes' FP32 results."""
    S, RL, F = P.shape
    out = torch.empty(RL, dtype=torch.float64, device=P.device)
    _aligned_kernel[(triton.cdiv(RL, _BLOCK),)](
        P.contiguous(), Xb.contiguous(), spec.contiguous(), negz.to(torch.int8).contiguous(), out,
        S, RL, AB=align_bits, F=F, RTZ_ALIGN=rtz_align, RTZ=rtz, BLOCK=_BLOCK)
    return out
