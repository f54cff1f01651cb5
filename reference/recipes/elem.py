"""Element casts used by quantization profiles, each an exact rule.

Finite values go through ``reference.rounding.encode`` (the one rounding
routine); the special-value behaviour of each upstream cast is spelled out
here because it is what the profiles differ in.
"""
from __future__ import annotations

from fractions import Fraction

from ..exact import Exact, exact
from ..formats import get_format
from ..rounding import Mode, Policy, encode, parse_mode
from . import f32 as F
from .rules import ElemCast, ElemNan, choose, unreachable

__all__ = ["ELEM_CASTS", "cast_elem", "torchao_floatx_code", "te_ref_fp4_code"]

_SAT = Policy.make(overflow="satfinite", inf="saturate", nan="to_zero")


def _sat_policy(fmt):
    spec = get_format(fmt)
    if spec.has_nan:
        return Policy.make(overflow="satfinite", inf="saturate", nan="preserve_sign")
    return _SAT


def _finite_code(v: Exact, fmt, mode, rbits=None, nbits=None) -> int:
    """Round a finite (or signed-zero) value, saturating to +-max finite."""
    return encode(v, fmt, mode, _sat_policy(fmt), rbits=rbits, nbits=nbits).code


def rne_signed(v: Exact, fmt, mode=Mode.RNE, *, rbits=None, nbits=None, nan="max") -> int:
    """Hardware-style satfinite cast (cvt.rn.satfinite): nearest (or SR), saturate, keep
    the sign of zero; +-inf -> +-max.  NaN: ``nan`` = "max" (+max, our reading of PTX
    .satfinite for e2m1x2; unverified here), "zero" (+0) or "nan" (format's NaN)."""
    spec = get_format(fmt)
    if v.is_nan:
        return _nan_code(spec, choose("nan", nan, ElemNan))
    return _finite_code(v, fmt, mode, rbits, nbits)


def _nan_code(spec, nan: ElemNan) -> int:
    if nan is ElemNan.NAN:   # +max in a format without NaN
        return spec.nan_code if spec.has_nan else spec.max_code_magnitude
    if nan is ElemNan.ZERO:
        return 0
    if nan is ElemNan.MAX:
        return spec.max_code_magnitude
    unreachable("nan", nan)


def torch_fp8_code(v: Exact, fmt) -> int:
    """torch 2.13 eager ``.to(float8_*)`` (measured): RNE; e4m3fn saturates finite
    overflow and inf to +-448; e5m2 is IEEE (overflow -> inf); NaN keeps its sign with
    the all-ones magnitude 0x7F."""
    spec = get_format(fmt)
    s = spec.sign_mask if v.negative else 0
    if v.is_nan:
        return s | 0x7F
    if spec.name == "float8_e4m3fn":
        return _finite_code(v, fmt, Mode.RNE) if not v.is_inf else s | spec.max_code_magnitude
    if spec.name == "float8_e5m2":
        return encode(v, fmt, Mode.RNE, Policy.make(overflow="ieee", inf="propagate",
                                                     nan="preserve_sign")).code
    raise ValueError(f"fmt: {spec.name!r} has no torch cast rule here; valid choices: "
                     "float8_e4m3fn, float8_e5m2")


def torchao_floatx_code(v: Exact, fmt) -> int:
    """torchao ``_f32_to_floatx_unpacked`` (custom_fp_utils.py), ported on the float32 bits.

    Finite values: RNE, saturate at max normal, sign kept (also for zero); +-inf
    saturate.  NaN is not special-cased upstream: its bits run through the normal
    branch (0x7FC00000 gives e2m1 magnitude 3, i.e. 1.5)."""
    spec = get_format(fmt)
    ebits, mbits = spec.exp_bits, spec.man_bits
    b = F.bits(v)
    sign = b & 0x80000000
    a = b ^ sign
    xa = F.from_bits(a)
    exp_bias = (1 << (ebits - 1)) - 1
    max_int = (1 << (ebits + mbits)) - 1
    max_normal = Fraction(2) ** ((1 << ebits) - 1 - exp_bias) * Fraction((1 << (mbits + 1)) - 1, 1 << mbits)
    min_normal = Fraction(2) ** (1 - exp_bias)
    sat = F.le(exact(max_normal), xa)
    den = (not sat) and F.lt(xa, exact(min_normal))
    if sat:
        code = max_int
    elif den:
        denorm_exp = (127 - exp_bias) + (23 - mbits) + 1
        dm = denorm_exp << 23
        code = ((F.bits(F.add(xa, F.from_bits(dm))) - dm) & 0xFFFFFFFF) & 0xFF
    else:  # normal branch (also NaN)
        mant_odd = (a >> (23 - mbits)) & 1
        n = a + ((exp_bias - 127) << 23) + ((1 << (23 - mbits - 1)) - 1) + mant_odd
        n &= 0xFFFFFFFF
        code = (n >> (23 - mbits)) & 0xFF
    sign_lp = (sign >> (23 + 8 - mbits - ebits)) & (1 << (ebits + mbits))
    return (code | sign_lp) & 0xFF


def te_ref_fp4_code(v: Exact) -> int:
    """Transformer Engine 2.20.2 ``cast_to_fp4x2`` (reference_nvfp4.py): interval table on
    the clamped value.  RNE on finite values, but -0 -> +0 (code 0: ``x < -0.0`` is
    false) and NaN -> 0 (no interval matches)."""
    if v.is_nan:
        return 0
    if v.is_zero:
        return 0
    q = v.to_fraction() if v.is_finite else None
    F_ = Fraction
    if q is None:
        return 7 if not v.negative else 15
    pos = [(F_(0), F_(1, 4), True, True, 0), (F_(1, 4), F_(3, 4), False, False, 1),
           (F_(3, 4), F_(5, 4), True, True, 2), (F_(5, 4), F_(7, 4), False, False, 3),
           (F_(7, 4), F_(5, 2), True, True, 4), (F_(5, 2), F_(7, 2), False, False, 5),
           (F_(7, 2), F_(5), True, True, 6)]
    a = abs(q)
    if q > 0:
        for lo, hi, lo_in, hi_in, c in pos:
            if (a > lo or (lo_in and a == lo)) and (a < hi or (hi_in and a == hi)):
                return c
        return 7
    # negative: [-0.25, -0) -> 8; (-0.75, -0.25) -> 9; [-1.25, -0.75] -> 10; ...
    for lo, hi, lo_in, hi_in, c in pos:
        if (a > lo or (lo_in and a == lo)) and (a < hi or (hi_in and a == hi)):
            return 8 + c
    return 15


# the element casts ``cast_elem`` applies (PYTORCH_TEST is MX's, in mx.py)
ELEM_CASTS = (ElemCast.RNE, ElemCast.TE_REF, ElemCast.TORCHAO, ElemCast.TORCH)


def cast_elem(v: Exact, fmt, how: str, mode=Mode.RNE, *, rbits=None, nbits=None,
              nan="max") -> int:
    """One element to a code by the named cast rule (any rule rounds SR when mode is SR)."""
    how = choose("elem_cast", how, ElemCast, ELEM_CASTS)
    mode = parse_mode(mode)
    if how is ElemCast.RNE or mode is not Mode.RNE:
        return rne_signed(v, fmt, mode, rbits=rbits, nbits=nbits, nan=nan)
    if how is ElemCast.TE_REF:
        return te_ref_fp4_code(v)
    if how is ElemCast.TORCHAO:
        return torchao_floatx_code(v, fmt)
    if how is ElemCast.TORCH:
        return torch_fp8_code(v, fmt)
    unreachable("elem_cast", how)
