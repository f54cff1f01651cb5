"""One-pass Triton kernel for ``fp4ref.cast.quantize`` on CUDA.

Same algorithm as the torch path (``cast._quantize_torch``), fused: read the
input once (float32, bfloat16 or float16), write uint8 codes once, plus rbits
for SR.  Used for formats of <= 8 bits; proven equal to the torch path by the
gpu tests in tests/test_cast.py.  Arithmetic is int32 (the float32 significand
has 24 bits) except SR, which needs the 62-bit fixed-point comparison.
"""
from __future__ import annotations

import torch

from reference.rounding import Mode

try:  # triton is optional (pyproject extra "gpu")
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "available", "supports", "quantize_triton"]

_IN_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_MODE = {Mode.RNE: 0, Mode.RNA: 1, Mode.RTZ: 2, Mode.RUP: 3, Mode.RDN: 4, Mode.RTO: 5, Mode.SR: 6}
BLOCK = 4096
NUM_WARPS = 8


def available() -> bool:
    return HAVE_TRITON and torch.cuda.is_available()


def supports(x: torch.Tensor, fmt) -> bool:
    return (HAVE_TRITON and x.is_cuda and x.dtype in _IN_KIND and fmt.nbits <= 8)


_CODE_ARGS = ["NAN_P", "NAN_N", "INF_P", "INF_N", "ZERO_P", "ZERO_N", "OVF_P", "OVF_N", "UNDER",
              "NEGU"]

if HAVE_TRITON:
    @triton.jit(do_not_specialize=_CODE_ARGS)  # one compile serves every policy's codes
    def _quantize_kernel(x_ptr, r_ptr, out_ptr, flag_ptr, N,
                         # policy codes: runtime ints, so policies share compiled kernels
                         NAN_P, NAN_N, INF_P, INF_N, ZERO_P, ZERO_N, OVF_P, OVF_N, UNDER, NEGU,
                         IN_KIND: tl.constexpr, MODE: tl.constexpr, NBITS: tl.constexpr,
                         MB: tl.constexpr, EMIN: tl.constexpr, SUBN: tl.constexpr,
                         MIN_AS_ZERO: tl.constexpr, MAXC: tl.constexpr, SIGNED: tl.constexpr,
                         SM: tl.constexpr, HAS_ZERO: tl.constexpr, FLUSH: tl.constexpr,
                         ABS_NEG: tl.constexpr, NEGU_ON: tl.constexpr,
                         RAISE_NAN: tl.constexpr, RAISE_NEG: tl.constexpr,
                         ZERO_SEL: tl.constexpr, INF_SEL: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        if IN_KIND == 1:    # bfloat16 bits, read as int16: exact widening by a shift
            b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.int32) << 16
        elif IN_KIND == 2:  # float16: hardware widening is exact
            b = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)
        else:               # float32 bits, read as int32
            b = tl.load(x_ptr + offs, mask=mask, other=0)
        sgn = b < 0
        if ABS_NEG:
            neg = b != b
        else:
            neg = sgn
        a = b & 0x7FFFFFFF
        expf = a >> 23
        is_nan = a > 0x7F800000
        is_inf = a == 0x7F800000
        is_zero = a == 0
        if SUBN:
            # Lean path (the common case).  A float32 subnormal lies far below
            # the target's subnormal range, so its exact binade is not needed;
            # zero comes out as code 0, inf and NaN as overflow.
            t = tl.maximum(expf, 1)
            M = tl.where(expf != 0, (a & 0x7FFFFF) | 0x800000, a)
            d = tl.maximum(EMIN + 127 - t, 0) + (23 - MB)       # bits dropped, >= 20
            D = tl.minimum(d, 25)                                # M < 2**24
            base = tl.maximum(t - (EMIN + 127), 0) << MB
            if MODE == 0:    # add half - 1 + lsb, truncate: RNE in three adds
                n = (M + (((1 << D) >> 1) - 1) + ((M >> D) & 1)) >> D
            elif MODE == 1:
                n = (M + ((1 << D) >> 1)) >> D
            elif MODE == 2:
                n = M >> D
            else:
                n = M >> D
                rem = M - (n << D)
                inexact = rem != 0
                if MODE == 3:
                    n = n + (inexact & (neg == 0)).to(tl.int32)
                elif MODE == 4:
                    n = n + (inexact & neg).to(tl.int32)
                elif MODE == 5:
                    n = n + (inexact & ((n & 1) == 0)).to(tl.int32)
                else:
                    rr = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.int64)
                    rem64 = rem.to(tl.int64)
                    dw = tl.minimum(d, 62).to(tl.int64)
                    hi = tl.minimum(tl.maximum(d - 62, 0), 63).to(tl.int64)
                    R = tl.where(d <= 62, rem64 << (62 - dw), rem64 >> hi)
                    n = n + (((rr << (62 - NBITS)) + R) >= (1 << 62)).to(tl.int32)
            code = base + n
        else:
            # General path (e8m0: no subnormals, so the exact binade matters).
            mant = a & 0x7FFFFF
            sub = expf == 0
            M = tl.where(sub, mant, mant | 0x800000)
            E = tl.maximum(expf, 1) - 150
            lz = ((mant.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
            e = tl.where(sub, lz + E, expf - 127)
            if MIN_AS_ZERO:
                is_min = (e == EMIN) & ((M & (M - 1)) == 0)
                low = (e < EMIN + 1) & (is_min == 0)
                eff = tl.where(low, EMIN + 1, e)
            else:
                eff = e
            d = (eff - MB) - E
            D = tl.minimum(tl.maximum(d, 0), 25)   # M < 2**24: 25 drops everything
            n = M >> D
            rem = M - (n << D)
            code = ((eff - EMIN) << MB) + n - (1 << MB)
            if MIN_AS_ZERO:
                code = tl.where(low, n, code)
            inexact = rem != 0
            if MODE == 0:
                twice = rem << 1
                half = (D * 0 + 1) << D
                code = code + ((twice > half) | ((twice == half) & ((code & 1) == 1))).to(tl.int32)
            elif MODE == 1:
                code = code + ((rem << 1) >= ((D * 0 + 1) << D)).to(tl.int32)
            elif MODE == 3:
                code = code + (inexact & (neg == 0)).to(tl.int32)
            elif MODE == 4:
                code = code + (inexact & neg).to(tl.int32)
            elif MODE == 5:
                code = code + (inexact & ((code & 1) == 0)).to(tl.int32)
            elif MODE == 6:
                rr = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.int64)
                rem64 = rem.to(tl.int64)
                dw = tl.minimum(tl.maximum(d, 0), 62).to(tl.int64)
                hi = tl.minimum(tl.maximum(d - 62, 0), 63).to(tl.int64)
                R = tl.where(d <= 62, rem64 << (62 - dw), rem64 >> hi)
                code = code + (((rr << (62 - NBITS)) + R) >= (1 << 62)).to(tl.int32)

        if FLUSH:
            code = tl.where((code > 0) & (code < (1 << MB)), 0, code)
        if SIGNED:
            out = code | ((b >> 31) & SM)   # ABS_NEG is for unsigned formats only
        else:
            out = code
        out = tl.where(code > MAXC, tl.where(neg, OVF_N, OVF_P), out)
        if not HAS_ZERO:
            under = code < 0
            if MIN_AS_ZERO:
                under = under | (low & (code == 0))
            out = tl.where(under, UNDER, out)
        if ZERO_SEL:
            out = tl.where(is_zero, tl.where(neg, ZERO_N, ZERO_P), out)
        if INF_SEL:
            out = tl.where(is_inf, tl.where(neg, INF_N, INF_P), out)
        if NEGU_ON:
            negu = neg & (is_zero == 0) & (is_nan == 0)
            out = tl.where(negu, NEGU, out)
            if RAISE_NEG:
                tl.atomic_max(flag_ptr + 1, tl.max((negu & mask).to(tl.int32), axis=0))
        out = tl.where(is_nan, tl.where(sgn, NAN_N, NAN_P), out)
        if RAISE_NAN:
            tl.atomic_max(flag_ptr, tl.max((is_nan & mask).to(tl.int32), axis=0))
        tl.store(out_ptr + offs, out.to(tl.uint8), mask=mask)


def quantize_triton(x: torch.Tensor, plan, r: torch.Tensor | None, nbits: int | None) -> torch.Tensor:
    """Codes of ``x`` under ``plan`` (a ``cast._Plan``), arguments already checked."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    fmt = plan.fmt
    xf = x.reshape(-1).contiguous()
    if x.dtype == torch.float32:
        xf = xf.view(torch.int32)
    elif x.dtype == torch.bfloat16:
        xf = xf.view(torch.int16)
    n = xf.numel()
    out = torch.empty(n, dtype=torch.uint8, device=x.device)
    flag = torch.zeros(2, dtype=torch.int32, device=x.device)
    rr = r.reshape(-1).contiguous() if r is not None else out
    nan = plan.nan or (0, 0)
    negu_on = (not fmt.signed) and not plan.abs_neg
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        _quantize_kernel[grid](
            xf, rr, out, flag, n,
            nan[0], nan[1], plan.inf[0], plan.inf[1], plan.zero[0], plan.zero[1],
            plan.ovf[0], plan.ovf[1], plan.under, plan.negu if plan.negu is not None else 0,
            IN_KIND=_IN_KIND[x.dtype], MODE=_MODE[plan.mode], NBITS=nbits or 1,
            MB=fmt.man_bits, EMIN=fmt.emin, SUBN=fmt.subnormals, MIN_AS_ZERO=plan.min_as_zero,
            MAXC=fmt.max_code_magnitude, SIGNED=fmt.signed, SM=fmt.sign_mask,
            HAS_ZERO=fmt.has_zero, FLUSH=plan.flush, ABS_NEG=plan.abs_neg, NEGU_ON=negu_on,
            RAISE_NAN=plan.nan is None, RAISE_NEG=negu_on and plan.negu is None,
            # zero and inf need no select where the lean path already yields
            # their codes (zero: code 0 and the sign bit; inf: the overflow code)
            ZERO_SEL=not (fmt.subnormals and plan.zero == (0, fmt.sign_mask)),
            INF_SEL=plan.inf != plan.ovf, BLOCK=BLOCK, num_warps=NUM_WARPS)
        if plan.nan is None or (negu_on and plan.negu is None):
            f0, f1 = flag.tolist()
            if f0:
                from reference.rounding import NanPolicy
                raise ValueError(f"x: NaN cannot be encoded in {fmt.name} under nan policy RAISE; "
                                 "valid choices: " + ", ".join(v.name for v in NanPolicy))
            if f1:
                from reference.rounding import Negative
                raise ValueError(f"x: negative values cannot be encoded in unsigned {fmt.name} "
                                 "under negative policy RAISE; valid choices: "
                                 + ", ".join(v.name for v in Negative))
    return out.reshape(x.shape)
