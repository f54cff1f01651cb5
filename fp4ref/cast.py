"""Fast vectorized casts into every FormatSpec, bit for bit equal to ``reference``.

The float input is unpacked from its int64 bit view into integer form (sign,
significand, exponent of its last bit, binade) and rounded onto the format's grid
by the fast paths' one kernel, ``fp4ref.gridround``; the policy's special cases
(NaN, inf, zero, overflow, underflow, negatives into an unsigned format) are
per-class constant codes chosen by the input's sign.  Nothing here calls the
reference: it reads only the integer fields of the FormatSpec row and the Mode /
Policy enums.

float64 inputs round directly from the double (no float32 step).  On CUDA the
Triton kernel in ``cast_triton`` is used when it supports the call
(``backend="auto"``); it is proven equal to this torch path by tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from reference.errors import check_choice, parse_enum
from reference.formats import FormatSpec, Specials, get_format
from reference.rounding import (InfPolicy, Mode, NanPolicy, Negative, NoZero, Overflow, Policy,
                                Subnormal, default_policy)

from .gridround import GridFormat, Unpacked, overflow_to_inf, round_grid, unpack_ieee

__all__ = ["quantize", "dequantize", "round_to", "quantize_profile", "pack_fp4", "unpack_fp4",
           "as_torch_dtype", "code_dtype", "INPUT_DTYPES", "MAX_NBITS"]

INPUT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
MAX_NBITS = 62  # SR compares rbits/2**nbits with the dropped fraction in 62-bit fixed point
_BACKENDS = ("auto", "torch", "triton")


# --------------------------------------------------------------------------
# argument checking (the one boundary)
# --------------------------------------------------------------------------
def _check_x(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x: dtype {x.dtype} is not supported; valid choices: "
                        + ", ".join(str(d) for d in INPUT_DTYPES))


def _check_policy(policy, fmt: FormatSpec) -> Policy:
    if policy is None:
        policy = default_policy(fmt)
    elif isinstance(policy, dict):
        policy = Policy.make(**policy)
    elif not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a Policy, a dict of Policy field names or None, "
                        f"got {type(policy).__name__}")
    policy.validate(fmt)
    return policy


def _check_rbits(x: torch.Tensor, mode: Mode, rbits, nbits) -> torch.Tensor | None:
    if mode is not Mode.SR:
        if rbits is not None or nbits is not None:
            raise ValueError(f"rbits/nbits: random bits are only used by mode SR, not {mode.name}")
        return None
    if rbits is None or nbits is None:
        raise ValueError("rbits/nbits: mode SR needs explicit random bits (rbits, an integer tensor "
                         "shaped like x) and their width (nbits)")
    if not isinstance(nbits, int) or isinstance(nbits, bool) or not 1 <= nbits <= MAX_NBITS:
        raise ValueError(f"nbits: {nbits!r} is not an int in [1, {MAX_NBITS}]")
    if not isinstance(rbits, torch.Tensor):
        raise ValueError(f"rbits: expected an integer torch.Tensor, got {type(rbits).__name__}")
    if rbits.dtype.is_floating_point or rbits.dtype.is_complex or rbits.dtype == torch.bool:
        raise ValueError(f"rbits: dtype {rbits.dtype} is not an integer dtype; valid choices: "
                         "uint8, int8, int16, int32, int64")
    if rbits.shape != x.shape:
        raise ValueError(f"rbits: shape {tuple(rbits.shape)} does not match x's shape {tuple(x.shape)}")
    if rbits.device != x.device:
        raise ValueError(f"rbits: device {rbits.device} does not match x's device {x.device}")
    r = rbits.to(torch.int64)
    if r.numel() and (bool((r < 0).any()) or bool((r >> nbits).any())):
        raise ValueError(f"rbits: values must lie in [0, 2**{nbits}) for nbits={nbits}; got "
                         f"min {int(r.min())}, max {int(r.max())}")
    return r


def code_dtype(fmt) -> torch.dtype:
    """uint8 for formats of <= 8 bits, int32 (the bit pattern) for wider ones."""
    return torch.uint8 if get_format(fmt).container_bits == 8 else torch.int32


# --------------------------------------------------------------------------
# the per-class constant codes of a (format, mode, policy)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """Codes for every special class, for a positive and a negative input.

    ``None`` means "raise if present"; ``abs_neg`` drops the sign first."""
    fmt: FormatSpec
    mode: Mode
    nan: tuple | None
    inf: tuple
    zero: tuple
    ovf: tuple
    under: int          # non-zero result below min normal, format without zero
    negu: int | None    # negative non-zero into an unsigned format (unused if abs_neg)
    abs_neg: bool
    flush: bool
    min_as_zero: bool
    grid: GridFormat


@lru_cache(maxsize=None)
def _plan(fmt: FormatSpec, mode: Mode, policy: Policy) -> _Plan:
    sm = fmt.sign_mask
    maxc = fmt.max_code_magnitude

    def signed(neg: bool, mag: int) -> int:
        return (sm | mag) if (neg and fmt.signed) else mag

    def nan_out(neg: bool) -> int:
        if policy.nan is NanPolicy.PRESERVE_SIGN:
            return signed(neg, fmt.nan_code)
        if policy.nan is NanPolicy.SIGNED_ALL_ONES:
            return signed(neg, (1 << (fmt.nbits - fmt.sign_bits)) - 1)
        return fmt.nan_code

    def both(f):
        return (f(False), f(True))

    p = policy.nan
    if p is NanPolicy.RAISE:
        nan = None
    elif p in (NanPolicy.CANONICAL, NanPolicy.PRESERVE_SIGN, NanPolicy.SIGNED_ALL_ONES):
        nan = both(nan_out)
    elif p is NanPolicy.TO_ZERO:
        nan = (0, 0)
    elif p is NanPolicy.TO_NEG_ZERO:
        nan = (signed(True, 0),) * 2
    elif p is NanPolicy.TO_ZERO_FLIP_SIGN:
        nan = (signed(True, 0), 0)
    else:
        nan = (maxc, maxc)

    if policy.inf is InfPolicy.SATURATE:
        inf = both(lambda n: signed(n, maxc))
    elif fmt.has_inf:
        inf = both(lambda n: signed(n, fmt.inf_code))
    else:
        inf = both(nan_out)

    if fmt.has_zero:
        zero = both(lambda n: signed(n, 0))
    elif policy.no_zero in (NoZero.NAN, NoZero.NAN_IF_ZERO):
        zero = (fmt.nan_code,) * 2
    else:
        zero = (0, 0)

    def ovf_code(neg: bool) -> int:
        o = policy.overflow
        if o is Overflow.SATFINITE:
            return signed(neg, maxc)
        if o is Overflow.NAN:
            return nan_out(neg)
        if not overflow_to_inf(mode)[neg]:
            return signed(neg, maxc)
        return signed(neg, fmt.inf_code) if fmt.has_inf else nan_out(neg)

    under = 0
    if not fmt.has_zero and policy.no_zero is NoZero.NAN:
        under = fmt.nan_code
    negu = None
    if not fmt.signed:
        negu = {Negative.NAN: fmt.nan_code if fmt.has_nan else None, Negative.RAISE: None,
                Negative.TO_ZERO: 0, Negative.ABS: 0}[policy.negative]
    return _Plan(fmt, mode, nan, inf, zero, both(ovf_code), under, negu,
                 abs_neg=(not fmt.signed and policy.negative is Negative.ABS),
                 flush=policy.subnormal is Subnormal.FLUSH,
                 min_as_zero=policy.subnormal is Subnormal.MIN_AS_ZERO, grid=GridFormat.of(fmt))


# --------------------------------------------------------------------------
# torch path
# --------------------------------------------------------------------------
def _pick(neg: torch.Tensor, pair) -> torch.Tensor | int:
    lo, hi = pair
    if lo == hi:
        return lo
    return torch.where(neg, hi, lo)


# CPU: chunks small enough that each op stays in cache and below torch's
# intra-op parallel grain (parallel regions of many small ops are slow, and
# erratic on a loaded machine); measured 3-5x faster than whole-tensor ops.
_CPU_CHUNK = 1 << 15


def _quantize_torch(x: torch.Tensor, plan: _Plan, r: torch.Tensor | None, nbits: int | None):
    xf = x.reshape(-1)
    rf = r.reshape(-1) if r is not None else None
    n = xf.numel()
    if x.device.type != "cpu" or n <= _CPU_CHUNK:
        return _quantize_flat(xf, plan, rf, nbits).reshape(x.shape)
    out = torch.empty(n, dtype=code_dtype(plan.fmt))
    for s in range(0, n, _CPU_CHUNK):  # chunks, not elements
        e = min(s + _CPU_CHUNK, n)
        out[s:e] = _quantize_flat(xf[s:e], plan, None if rf is None else rf[s:e], nbits)
    return out.reshape(x.shape)


def _unpack(x: torch.Tensor) -> tuple[Unpacked, int]:
    """Integer form of the input and its significand width: float64 directly, the
    narrower floats widened to float32 exactly."""
    if x.dtype == torch.float64:
        return unpack_ieee(torch, x.contiguous().view(torch.int64), 52, 11), 53
    b = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return unpack_ieee(torch, b, 23, 8), 24


def _quantize_flat(x: torch.Tensor, plan: _Plan, r: torch.Tensor | None, nbits: int | None):
    u, p = _unpack(x)
    neg = torch.zeros_like(u.neg) if plan.abs_neg else u.neg
    # every input significand has at least the bits of the target grid (coarse=False)
    code = round_grid(torch, neg, u.mag, u.exp, plan.grid, plan.mode, e=u.e, rbits=r, nbits=nbits,
                      min_as_zero=plan.min_as_zero, coarse=False, mag_bits=p).code
    return _store(_encode(code, neg, u, plan), plan.fmt)


def _encode(code: torch.Tensor, neg: torch.Tensor, u: Unpacked, plan: _Plan) -> torch.Tensor:
    """Codes with the sign and the policy's code for every special class."""
    fmt = plan.fmt
    if plan.flush:
        code = torch.where((code > 0) & (code < (1 << fmt.man_bits)), 0, code)
    out = torch.where(neg, code | fmt.sign_mask, code) if fmt.signed else code
    out = torch.where(code > fmt.max_code_magnitude, _pick(neg, plan.ovf), out)
    if not fmt.has_zero:  # below min normal (MIN_AS_ZERO's zero step included): code < 0
        out = torch.where(code < 0, plan.under, out)
    out = torch.where(u.zero, _pick(neg, plan.zero), out)
    out = torch.where(u.inf, _pick(neg, plan.inf), out)
    if not fmt.signed and not plan.abs_neg:
        negu = neg & ~u.zero & ~u.nan
        if plan.negu is None:
            if bool(negu.any()):
                raise ValueError(f"x: negative values cannot be encoded in unsigned {fmt.name} "
                                 "under negative policy RAISE; valid choices: "
                                 + ", ".join(v.name for v in Negative))
        else:
            out = torch.where(negu, plan.negu, out)
    if plan.nan is None:
        if bool(u.nan.any()):
            raise ValueError(f"x: NaN cannot be encoded in {fmt.name} under nan policy RAISE; "
                             "valid choices: " + ", ".join(v.name for v in NanPolicy))
    else:
        out = torch.where(u.nan, _pick(u.neg, plan.nan), out)
    return out


def _store(out: torch.Tensor, fmt: FormatSpec) -> torch.Tensor:
    if fmt.container_bits == 8:
        return out.to(torch.uint8)
    # int32 holds the bit pattern; float32 codes >= 2**31 read negative
    return torch.where(out >= (1 << 31), out - (1 << 32), out).to(torch.int32)


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------
def quantize(x: torch.Tensor, fmt, mode="rne", policy=None, *, rbits=None, nbits=None,
             backend: str = "auto") -> torch.Tensor:
    """Round ``x`` into ``fmt``; return codes (uint8 for <= 8-bit formats, else int32).

    ``mode``: a Mode or its name; ``policy``: a Policy, a dict of field names, or
    None for ``default_policy(fmt)``; SR takes ``rbits`` (integer tensor shaped
    like x, values < 2**nbits).  ``backend``: auto (Triton on CUDA when it
    applies), torch, or triton.
    """
    _check_x(x)
    fmt = get_format(fmt)
    mode = parse_enum("mode", mode, Mode)
    policy = _check_policy(policy, fmt)
    backend = check_choice("backend", backend, _BACKENDS)
    r = _check_rbits(x, mode, rbits, nbits)
    plan = _plan(fmt, mode, policy)
    if backend != "torch":
        from . import cast_triton
        ok = cast_triton.supports(x, fmt)
        if backend == "triton" and not ok:
            raise ValueError(f"backend: triton needs CUDA, triton, an input of float32, bfloat16 "
                             f"or float16 and a format of <= 8 bits; got {x.dtype} on {x.device} "
                             f"into {fmt.name}; valid choices: {', '.join(_BACKENDS)}")
        if ok:
            return cast_triton.quantize_triton(x, plan, r, nbits)
    return _quantize_torch(x, plan, r, nbits)


def quantize_profile(x: torch.Tensor, profile, *, rbits=None, nbits=None) -> torch.Tensor:
    """Codes as a named third-party cast gives them (reference.profiles)."""
    from reference.profiles import get_cast_profile
    prof = get_cast_profile(profile)
    _check_x(x)
    if x.dtype == torch.float64 and prof.via_float32:
        x = x.to(torch.float32)  # the library's own double rounding
    return quantize(x, prof.fmt, prof.mode, prof.policy, rbits=rbits, nbits=nbits)


@lru_cache(maxsize=None)
def _lut_values(fmt: FormatSpec) -> tuple[float, ...]:
    m, out = fmt.man_bits, []
    all_ones = (1 << (fmt.nbits - fmt.sign_bits)) - 1
    for c in range(fmt.ncodes):  # <= 256 codes: a table, not an element loop
        neg = fmt.signed and (c >> (fmt.nbits - 1)) & 1
        mag = c & all_ones
        ef, mf = mag >> m, mag & fmt.man_mask
        if fmt.specials is Specials.IEEE and ef == fmt.exp_max_field:
            v = math.inf if mf == 0 else math.nan
        elif fmt.specials is Specials.NAN_ALL_ONES and mag == all_ones:
            v = math.nan
        elif ef == 0 and fmt.subnormals:
            v = math.ldexp(mf, fmt.emin - m)
        else:
            v = math.ldexp((1 << m) + mf, ef - fmt.bias - m)
        out.append(math.copysign(v, -1.0 if neg else 1.0))
    return tuple(out)


_LUTS: dict = {}


def _lut(fmt: FormatSpec, device) -> torch.Tensor:
    key = (fmt.name, str(device))
    t = _LUTS.get(key)
    if t is None:
        t = torch.tensor(_lut_values(fmt), dtype=torch.float64).to(torch.float32).to(device)
        _LUTS[key] = t
    return t


def _check_codes(codes, fmt: FormatSpec, hi: int, lo: int = 0) -> None:
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes: expected a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise TypeError(f"codes: dtype {codes.dtype} is not an integer dtype; valid choices: "
                        "uint8, int16, int32, int64")
    if codes.numel() == 0:
        return
    c = codes if codes.dtype == torch.int64 else codes.to(torch.int64)
    cmin, cmax = int(c.min()), int(c.max())
    if cmin < lo or cmax >= hi:
        raise ValueError(f"codes: values must lie in [{lo}, {hi}) for {fmt.name}; "
                         f"got min {cmin}, max {cmax}")


def dequantize(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Exact float32 values of ``codes`` (NaN codes -> NaN with their sign; -0 kept)."""
    fmt = get_format(fmt)
    if fmt.nbits <= 8:
        _check_codes(codes, fmt, fmt.ncodes)
        return _lut(fmt, codes.device)[codes.to(torch.int64)]
    if fmt.name == "float32":
        _check_codes(codes, fmt, 1 << 32, -(1 << 31))
        c = codes.to(torch.int64)
    elif fmt.name == "tf32":
        _check_codes(codes, fmt, 1 << 19)
        c = codes.to(torch.int64) << 13
    elif fmt.name == "bfloat16":
        _check_codes(codes, fmt, 1 << 16)
        c = codes.to(torch.int64) << 16
    elif fmt.name == "float16":
        _check_codes(codes, fmt, 1 << 16)
        c = codes.to(torch.int64)
        c = torch.where(c >= (1 << 15), c - (1 << 16), c)
        return c.to(torch.int16).view(torch.float16).to(torch.float32)
    else:  # pragma: no cover - every FORMATS row is handled above
        raise ValueError(f"fmt: {fmt.name} has no dequantize rule")
    c = torch.where(c >= (1 << 31), c - (1 << 32), c)
    return c.to(torch.int32).view(torch.float32)


def round_to(x: torch.Tensor, fmt, mode="rne", policy=None, *, rbits=None, nbits=None,
             backend: str = "auto") -> torch.Tensor:
    """quantize then dequantize: float32, or float64 for a float64 input."""
    q = quantize(x, fmt, mode, policy, rbits=rbits, nbits=nbits, backend=backend)
    y = dequantize(q, fmt)
    return y.to(torch.float64) if x.dtype == torch.float64 else y


# --------------------------------------------------------------------------
# packed FP4 and torch dtype views
# --------------------------------------------------------------------------
def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two e2m1 codes per byte along the last dim, first element in the LOW nibble."""
    _check_codes(codes, get_format("float4_e2m1fn"), 16)
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes: dtype {codes.dtype} is not uint8 (float4_e2m1fn codes)")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes: the last dimension must be even to pack two per byte; "
                         f"got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_fp4: uint8 (or float4_e2m1fn_x2) bytes -> uint8 codes, last dim x2."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"packed: expected a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype == torch.float4_e2m1fn_x2:
        packed = packed.view(torch.uint8)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed: dtype {packed.dtype} is not uint8 or float4_e2m1fn_x2")
    if packed.dim() == 0:
        raise ValueError("packed: needs at least one dimension")
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


_TORCH_DTYPES = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
    "float4_e2m1fn": torch.float4_e2m1fn_x2,  # packed bytes (pack_fp4)
}


def as_torch_dtype(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Zero-copy view of uint8 codes as the matching torch dtype.

    float4_e2m1fn takes packed bytes (``pack_fp4``) and gives float4_e2m1fn_x2."""
    name = get_format(fmt).name
    check_choice("fmt", name, _TORCH_DTYPES)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError(f"codes: expected a uint8 torch.Tensor, got "
                        f"{getattr(codes, 'dtype', type(codes).__name__)}")
    return codes.view(_TORCH_DTYPES[name])
