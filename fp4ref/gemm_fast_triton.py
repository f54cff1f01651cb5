"""Triton kernels of ``fp4ref.gemm_fast``'s two recurrences: one launch runs every fused
step of a block of lanes (the torch loop issues ~25 launches per step).  The arithmetic is
the torch loop's, op for op (see fp4ref/gemm_fast.py for why it is exact), in float64 with
int64 bit casts; only the integer rounding of aligned terms (and of t / q in
``_round_narrow``) is spelled differently: RTZ by the float64 -> int64 cast (truncation),
RNE by adding and subtracting 1.5 * 2**52 (exact for |x| < 2**51: the add rounds x to an
integer, ties to even).  The accumulator format is a compile-time choice (FRAC fraction
bits, FLUSH); FRAC = 23 without FLUSH runs the FP32 code of before.

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
def _round_narrow(t, FRAC: tl.constexpr, RTZ: tl.constexpr, MAXB: tl.constexpr):
    """float64 t (exact) -> FRAC + 1 significant bits, FP32's exponent range (FRAC < 23;
    gemm_fast._round_narrow): t / q rounded to an integer, times q; then IEEE overflow.
    MAXB: the bits of the format's max finite value as float64."""
    bits = t.to(tl.int64, bitcast=True)
    eb = tl.minimum(tl.maximum((bits >> 52) & 0x7FF, 1023 - 126), 2046)
    q = ((eb - FRAC) << 52).to(tl.float64, bitcast=True)
    r = t * ((2046 + FRAC - eb) << 52).to(tl.float64, bitcast=True)  # exact, |r| < 2**(FRAC+1)
    if RTZ:
        r = r.to(tl.int64).to(tl.float64)  # Inf/NaN t: any value, replaced below
    else:
        r = (r + _MAGIC) - _MAGIC
    y = r * q
    yb = y.to(tl.int64, bitcast=True)
    if RTZ:
        big = tl.full(yb.shape, MAXB, tl.int64).to(tl.float64, bitcast=True)  # max finite
    else:
        big = tl.full(yb.shape, 0x7FF0000000000000, tl.int64).to(tl.float64, bitcast=True)  # Inf
    over = (yb & 0x7FFFFFFFFFFFFFFF) > MAXB
    y = tl.where(over, tl.where(t < 0, -big, big), y)
    return tl.where(tl.abs(t) < float("inf"), y, t)


@triton.jit
def _round_acc(t, FRAC: tl.constexpr, RTZ: tl.constexpr, FLUSH: tl.constexpr, MAXB: tl.constexpr):
    """float64 t (exact) -> the accumulator format (gemm_fast.round_acc), as float64."""
    if FRAC == 23:
        y = _round32(t, RTZ)
    else:
        y = _round_narrow(t, FRAC, RTZ, MAXB)
    if FLUSH:  # below 2**-126 (biased exponent < 897): a zero of y's sign (bits: y's sign bit)
        yb = y.to(tl.int64, bitcast=True)
        zero = ((yb >> 63) << 63).to(tl.float64, bitcast=True)
        y = tl.where(((yb >> 52) & 0x7FF) < 1023 - 126, zero, y)
    return y


@triton.jit
def _add_round(x, y, FRAC: tl.constexpr, RTZ: tl.constexpr, FLUSH: tl.constexpr, MAXB: tl.constexpr):
    """x + y rounded once to the accumulator: two-sum, round to odd at 53 bits, then
    ``_round_acc``."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    bits = s.to(tl.int64, bitcast=True)
    fin = tl.abs(s) < float("inf")
    fix = (e != 0) & ((bits & 1) == 0) & fin
    step = tl.where((e > 0) == (s > 0), 1, -1).to(tl.int64)
    s = tl.where(fix, bits + step, bits).to(tl.float64, bitcast=True)
    return _round_acc(s, FRAC, RTZ, FLUSH, MAXB)


@triton.jit
def _chain_kernel(P, OUT, S, RL, RTZ: tl.constexpr, FRAC: tl.constexpr, FLUSH: tl.constexpr,
                  MAXB: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = lanes < RL
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    s = tl.full((), 0, tl.int64)
    while s < S:  # (a while loop: the interpreter cannot range() over a runtime int here)
        p = tl.load(P + s * RL + lanes, mask=mask, other=0.0)
        acc = _add_round(acc, p, FRAC, RTZ, FLUSH, MAXB)
        s += 1
    tl.store(OUT + lanes, acc, mask=mask)


@triton.jit
def _aligned_kernel(P, XB, SPEC, NEGZ, OUT, S, RL, AB: tl.constexpr, F: tl.constexpr,
                    RTZ_ALIGN: tl.constexpr, RTZ: tl.constexpr, FRAC: tl.constexpr,
                    FLUSH: tl.constexpr, MAXB: tl.constexpr, BLOCK: tl.constexpr):
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
        y = _round_acc(t * q, FRAC, RTZ, FLUSH, MAXB)
        negzero = (acc == 0) & (bits < 0) & (negz != 0)    # acc -0 and every product -0
        y = tl.where(t == 0, (negzero.to(tl.int64) << 63).to(tl.float64, bitcast=True), y)
        z = acc + spec
        acc = tl.where(tl.abs(z) < float("inf"), y, z)
        s += 1
    tl.store(OUT + lanes, acc, mask=mask)


def _max_bits(frac: int) -> int:
    """The float64 bits of accumulator_format(frac)'s max finite (its FormatSpec row)."""
    from reference.gemm import accumulator_format
    top = float(accumulator_format(frac).max_finite)
    return int(torch.tensor(top, dtype=torch.float64).view(torch.int64))


def chain_lanes(P: torch.Tensor, rtz: bool, frac: int = 23, flush: bool = False) -> torch.Tensor:
    """P [S, lanes] float64 products -> the lanes' FMA chains in the accumulator (frac
    fraction bits, FP32's exponent range; flush: FTZ), as float64."""
    S, RL = P.shape
    out = torch.empty(RL, dtype=torch.float64, device=P.device)
    _chain_kernel[(triton.cdiv(RL, _BLOCK),)](P.contiguous(), out, S, RL, RTZ=rtz, FRAC=frac,
                                              FLUSH=flush, MAXB=_max_bits(frac), BLOCK=_BLOCK)
    return out


def aligned_lanes(P, Xb, spec, negz, align_bits: int, rtz_align: bool, rtz: bool,
                  frac: int = 23, flush: bool = False) -> torch.Tensor:
    """P [S, lanes, F] (F a power of two; -0.0 padding), Xb [S, lanes] int64 biased step
    exponents, spec [S, lanes] float64, negz [S, lanes] bool -> the lanes' accumulators
    (frac fraction bits, FP32's exponent range; flush: FTZ)."""
    S, RL, F = P.shape
    out = torch.empty(RL, dtype=torch.float64, device=P.device)
    _aligned_kernel[(triton.cdiv(RL, _BLOCK),)](
        P.contiguous(), Xb.contiguous(), spec.contiguous(), negz.to(torch.int8).contiguous(), out,
        S, RL, AB=align_bits, F=F, RTZ_ALIGN=rtz_align, RTZ=rtz, FRAC=frac, FLUSH=flush,
        MAXB=_max_bits(frac), BLOCK=_BLOCK)
    return out
