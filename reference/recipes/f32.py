"""IEEE binary32 (and bfloat16) arithmetic modeled exactly.

A profile's FP32 step is "exact operation, then one rounding to float32 with
the stated mode" (IEEE 754 semantics for inf/NaN/signed zero).  Values are
``Exact``; results are the exact value of the float32 result.

NaN payloads matter to one upstream bit trick (torchao's float4/float6 cast
reads NaN bits), so a NaN ``Exact`` here keeps its float32 mantissa field in
``mag`` (0 = canonical quiet 0x400000).  Propagation is what torch 2.13 does
on x86 CPUs (measured; the conformance cells run there): with two NaN operands
add/sub/mul return the second one's bits, div the first one's; one NaN operand
propagates (quieted); an invalid operation (0/0, inf-inf, 0*inf) gives the x86
default NaN 0xFFC00000 (negative); torch.minimum/maximum give +canonical NaN;
clamp keeps its input's NaN.  CUDA's default NaN is 0x7FFFFFFF, so on a GPU
NaN payloads and signs can differ: they only matter to profiles that read NaN
bits (torchao's float4/float6 bit trick), which GPU tests feed NaN-free.
"""
from __future__ import annotations

import math
from fractions import Fraction

from ..exact import Exact, Kind, POS_INF, NEG_INF, exact, floor_log2, pow2
from ..formats import get_format
from ..rounding import Mode, parse_mode

__all__ = ["F32", "BF16", "FLT_MAX", "ZERO", "ONE", "rnd", "f32", "bf16", "add", "sub", "mul",
           "div", "sqrt", "neg", "fabs", "tmin", "tmax", "clamp", "lt", "le", "eq", "bits",
           "from_bits", "fields", "const", "is_zero", "sign_of", "nan", "widen", "DEFAULT_NAN"]

F32 = get_format("float32")
BF16 = get_format("bfloat16")
FLT_MAX = Exact(Kind.FINITE, False, F32.max_finite)
ZERO = Exact(Kind.FINITE, False, Fraction(0))
NEG_ZERO = Exact(Kind.FINITE, True, Fraction(0))
ONE = Exact(Kind.FINITE, False, Fraction(1))


def _round_mag(a: Fraction, man_bits: int, emin: int, mode: Mode, neg: bool) -> Fraction:
    e = max(floor_log2(a), emin)
    q = pow2(e - man_bits)
    n, r = divmod(a, q)
    n = int(n)
    if r == 0:
        return n * q
    if mode is Mode.RNE:
        up = 2 * r > q or (2 * r == q and n & 1)
    elif mode is Mode.RNA:
        up = 2 * r >= q
    elif mode is Mode.RTZ:
        up = False
    elif mode is Mode.RUP:
        up = not neg
    elif mode is Mode.RDN:
        up = neg
    else:
        raise ValueError(f"mode: {mode.name} is not supported for FP32 steps; valid choices: "
                         "RNE, RNA, RTZ, RUP, RDN")
    return (n + 1) * q if up else n * q


def rnd(v, fmt="float32", mode=Mode.RNE) -> Exact:
    """Round an exact value to an IEEE format (float32 / bfloat16 / float16): overflow
    follows IEEE for the mode (to inf, or to max finite when rounding toward zero)."""
    spec = get_format(fmt)
    mode = parse_mode(mode)
    v = exact(v)
    if v.is_nan and spec.name == "bfloat16":
        # torch 2.13's vectorized float->bfloat16 makes every NaN 0xFFFF (measured;
        # its scalar path gives 0x7FC0): fast paths canonicalize to 0xFFFF explicitly
        return Exact(Kind.NAN, True, Fraction(0x7F0000))
    if not v.is_finite or v.mag == 0:
        return v
    m = _round_mag(v.mag, spec.man_bits, spec.emin, mode, v.negative)
    if m > spec.max_finite:
        to_inf = mode in (Mode.RNE, Mode.RNA) or (mode is Mode.RUP and not v.negative) or \
            (mode is Mode.RDN and v.negative)
        if to_inf:
            return NEG_INF if v.negative else POS_INF
        m = spec.max_finite
    return Exact(Kind.FINITE, v.negative, m)


def f32(v, mode=Mode.RNE) -> Exact:
    return rnd(v, "float32", mode)


def bf16(v, mode=Mode.RNE) -> Exact:
    return rnd(v, "bfloat16", mode)


def const(x) -> Exact:
    """A float32 constant as written in upstream code (Python float -> float32, RNE)."""
    return f32(exact(x))


DEFAULT_NAN = Exact(Kind.NAN, True, Fraction(0))  # x86 "real indefinite" 0xFFC00000


def nan(negative: bool = False, payload: int = 0) -> Exact:
    """A float32 NaN with a mantissa payload (0 = canonical quiet)."""
    return Exact(Kind.NAN, negative, Fraction(payload))


def _quiet(o: Exact) -> Exact:
    p = int(o.mag)
    if p and not p & 0x400000:
        return Exact(Kind.NAN, o.negative, Fraction(p | 0x400000))
    return o


def _nan(*ops: Exact) -> Exact:
    # The first NaN in ``ops`` (callers order them per op) propagates quieted.
    for o in ops:
        if o.is_nan:
            return _quiet(o)
    return DEFAULT_NAN


def widen(code: int, fmt) -> Exact:
    """Decode a code of a small float format to its float32 value, NaN payload included
    (IEEE widening: the source mantissa lands at the top of the float32 mantissa)."""
    spec = get_format(fmt)
    v = spec.decode(code)
    if v.is_nan:
        p = ((code & spec.man_mask) << (23 - spec.man_bits) | 0x400000) & 0x7FFFFF
        return Exact(Kind.NAN, v.negative, Fraction(0 if p == 0x400000 else p))
    return v


def sign_of(v: Exact) -> bool:
    return v.negative


def is_zero(v: Exact) -> bool:
    return v.is_finite and v.mag == 0


def neg(a: Exact) -> Exact:
    return -a


def fabs(a: Exact) -> Exact:
    return Exact(a.kind, False, a.mag)


def add(a, b, mode=Mode.RNE, fmt="float32") -> Exact:
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return _nan(b, a)
    if a.is_inf or b.is_inf:
        if a.is_inf and b.is_inf and a.negative != b.negative:
            return DEFAULT_NAN
        return a if a.is_inf else b
    s = a.to_fraction() + b.to_fraction()
    if s == 0:
        if a.mag == 0 and b.mag == 0 and a.negative and b.negative:
            return NEG_ZERO
        # exact zero sum of non-zero terms: +0, except -0 when rounding down
        if a.mag == 0 and b.mag == 0:
            return NEG_ZERO if (a.negative and b.negative) else ZERO
        return NEG_ZERO if parse_mode(mode) is Mode.RDN else ZERO
    return rnd(exact(s), fmt, mode)


def sub(a, b, mode=Mode.RNE, fmt="float32") -> Exact:
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return _nan(b, a)  # the NaN operand's bits, unnegated
    return add(a, neg(b), mode, fmt)


def mul(a, b, mode=Mode.RNE, fmt="float32") -> Exact:
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return _nan(b, a)
    s = a.negative != b.negative
    if a.is_inf or b.is_inf:
        if is_zero(a) or is_zero(b):
            return DEFAULT_NAN
        return NEG_INF if s else POS_INF
    return rnd(Exact(Kind.FINITE, s, a.mag * b.mag), fmt, mode)


def div(a, b, mode=Mode.RNE, fmt="float32") -> Exact:
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return _nan(a, b)
    s = a.negative != b.negative
    if a.is_inf:
        if b.is_inf:
            return DEFAULT_NAN
        return NEG_INF if s else POS_INF
    if b.is_inf:
        return Exact(Kind.FINITE, s, Fraction(0))
    if b.mag == 0:
        if a.mag == 0:
            return DEFAULT_NAN
        return NEG_INF if s else POS_INF
    return rnd(Exact(Kind.FINITE, s, a.mag / b.mag), fmt, mode)


def _isqrt_frac_floor(q: Fraction, k: int) -> int:
    """floor(sqrt(q) * 2**k) exactly."""
    num, den = q.numerator, q.denominator
    # sqrt(num/den) * 2^k = sqrt(num * 4^k / den)
    if k >= 0:
        return math.isqrt((num << (2 * k)) // den)
    return math.isqrt(num // (den << (-2 * k)))


def sqrt(a, mode=Mode.RNE, fmt="float32") -> Exact:
    """Correctly rounded square root (IEEE: sqrt(-0) = -0, negative -> NaN)."""
    a = exact(a)
    spec = get_format(fmt)
    if a.is_nan:
        return _quiet(a)
    if is_zero(a):
        return a
    if a.negative:
        return DEFAULT_NAN
    if a.is_inf:
        return a
    mode = parse_mode(mode)
    # r = sqrt(a); find binade e with 2^e <= r < 2^(e+1): e = floor(floor_log2(a)/2)
    e = max(floor_log2(a.mag) // 2, spec.emin)
    k = spec.man_bits - e          # r * 2^k has man_bits+1 integer bits (normal)
    n = _isqrt_frac_floor(a.mag, k)  # floor(r * 2^k)
    q = pow2(-k)
    exact_hit = Fraction(n * n) * q * q == a.mag
    if exact_hit:
        return Exact(Kind.FINITE, False, n * q)
    # r is irrational or not on grid: never a tie (a tie would make r rational with
    # one more bit, whose square has more bits than a float's mantissa allows...)
    # decide by comparing r with the midpoint (n + 1/2) q exactly.
    mid = (Fraction(2 * n + 1, 2) * q) ** 2
    if mode is Mode.RNE or mode is Mode.RNA:
        up = a.mag > mid or (a.mag == mid and (mode is Mode.RNA or n & 1))
    elif mode in (Mode.RTZ, Mode.RDN):
        up = False
    elif mode is Mode.RUP:
        up = True
    else:
        raise ValueError(f"mode: {mode.name} is not supported for sqrt")
    return rnd(Exact(Kind.FINITE, False, (n + 1) * q if up else n * q), fmt, Mode.RTZ)


# --- torch-style comparisons / min / max (NaN propagating) --------------------
def _cmp(a: Exact, b: Exact) -> int:
    """Total order of non-NaN values (-0 == +0)."""
    def key(v):
        if v.is_inf:
            return (-1 if v.negative else 1, Fraction(0))
        return (0, v.to_fraction())
    ka, kb = key(a), key(b)
    if ka[0] != kb[0]:
        return -1 if ka[0] < kb[0] else 1
    return (ka[1] > kb[1]) - (ka[1] < kb[1])


def lt(a, b) -> bool:
    a, b = exact(a), exact(b)
    return not (a.is_nan or b.is_nan) and _cmp(a, b) < 0


def le(a, b) -> bool:
    a, b = exact(a), exact(b)
    return not (a.is_nan or b.is_nan) and _cmp(a, b) <= 0


def eq(a, b) -> bool:
    a, b = exact(a), exact(b)
    return not (a.is_nan or b.is_nan) and _cmp(a, b) == 0


def tmin(a, b) -> Exact:
    """torch.minimum: NaN gives +canonical NaN; between -0 and +0 returns -0."""
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return Exact(Kind.NAN, False, Fraction(0))
    c = _cmp(a, b)
    if c == 0:
        return a if a.negative else b
    return a if c < 0 else b


def tmax(a, b) -> Exact:
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return Exact(Kind.NAN, False, Fraction(0))
    c = _cmp(a, b)
    if c == 0:
        return b if a.negative else a
    return a if c > 0 else b


def clamp(x, lo=None, hi=None) -> Exact:
    """torch.clamp: NaN stays NaN; x below lo -> lo, above hi -> hi (x kept when equal)."""
    x = exact(x)
    if x.is_nan:
        return x
    if lo is not None and lt(x, lo):
        x = exact(lo)
    if hi is not None and lt(exact(hi), x):
        x = exact(hi)
    return x


# --- bit patterns --------------------------------------------------------------
def bits(v, fmt="float32") -> int:
    """IEEE bit pattern of a value representable in fmt (NaN: canonical quiet, with sign)."""
    spec = get_format(fmt)
    v = exact(v)
    sbit = 1 << (spec.nbits - 1)
    s = sbit if v.negative else 0
    if v.is_nan:
        if spec.name == "float32" and v.mag:
            return s | 0x7F800000 | int(v.mag)
        return s | spec.nan_code
    if v.is_inf:
        return s | spec.inf_code
    return s | spec.encode_magnitude(v.mag)


def from_bits(b: int, fmt="float32") -> Exact:
    spec = get_format(fmt)
    v = spec.decode(b)
    if v.is_nan and spec.name == "float32":
        p = b & 0x7FFFFF
        return Exact(Kind.NAN, v.negative, Fraction(0 if p == 0x400000 else p))
    return v


def fields(v, fmt="float32") -> tuple[int, int, int]:
    """(sign, biased exponent field, mantissa field) of a representable value."""
    return get_format(fmt).fields(bits(v, fmt))
