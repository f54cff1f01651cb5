"""IEEE binary32 / bfloat16 arithmetic on integer pairs: exact operation, one rounding.

Division and square root keep p + 3 or more quotient bits plus a sticky bit, which rounds
correctly in every mode (the sticky bit sits below the rounding and guard positions).
"""
from __future__ import annotations

from math import isqrt

from .formats import fmt_of
from .num import (NAN, V, ZERO, cmp_abs, exact_sum, fin, from_float, is_zero, mul as xmul,
                  overflow_stops_at_max, round_float)

F32 = fmt_of("float32")
BF16 = fmt_of("bfloat16")
FLT_MAX = F32.max_finite


def rnd(v: V, mode="rne", f=F32) -> V:
    """One rounding to an IEEE format; overflow to inf, or to max finite toward zero."""
    if v.kind != "f":
        return v
    r = round_float(v, f.p, f.emin, mode)
    if r.m and cmp_abs(r, f.max_finite) > 0:
        toward_zero = overflow_stops_at_max(mode, v.neg)
        return fin(v.neg, f.max_finite.m, f.max_finite.e) if toward_zero else V("inf", v.neg)
    return r


def const(x: float) -> V:
    """A float32 constant as upstream code writes it: Python float, then RNE to float32."""
    return rnd(from_float(x))


def add(a: V, b: V, mode="rne", f=F32) -> V:
    if "nan" in (a.kind, b.kind):
        return NAN
    if a.kind == "inf" or b.kind == "inf":
        if a.kind == b.kind == "inf" and a.neg != b.neg:
            return NAN
        return a if a.kind == "inf" else b
    # IEEE 754 6.3: an exact zero sum is -0 only for (-0) + (-0), or in RDN
    s = exact_sum([a, b], zero_neg=(a.neg and b.neg) or (mode == "rdn"))
    return rnd(s, mode, f)


def mul(a: V, b: V, mode="rne", f=F32) -> V:
    return rnd(xmul(a, b), mode, f)


def div(a: V, b: V, mode="rne", f=F32) -> V:
    neg = a.neg != b.neg
    if "nan" in (a.kind, b.kind) or (a.kind == b.kind == "inf") or (is_zero(a) and is_zero(b)):
        return NAN
    if a.kind == "inf" or is_zero(b):
        return V("inf", neg)
    if b.kind == "inf" or is_zero(a):
        return fin(neg, 0, 0)
    k = max(0, f.p + 8 + b.m.bit_length() - a.m.bit_length())
    q, r = divmod(a.m << k, b.m)
    return rnd(fin(neg, (q << 1) | (r != 0), a.e - b.e - k - 1), mode, f)


def sqrt(a: V, mode="rne", f=F32) -> V:
    if a.kind == "nan" or (a.neg and not is_zero(a)):
        return NAN
    if a.kind == "inf" or is_zero(a):
        return a
    m, e = a.m, a.e
    if e & 1:
        m, e = m << 1, e - 1
    k = max(0, 2 * (f.p + 8) - m.bit_length())
    k += k & 1
    s = isqrt(m << k)
    sticky = s * s != (m << k)
    return rnd(fin(False, (s << 1) | sticky, (e - k) // 2 - 1), mode, f)


def fmin(a: V, b: V) -> V:
    """min of two non-NaN values by value."""
    return a if lt(a, b) else b


def lt(a: V, b: V) -> bool:
    """a < b for non-NaN values (-0 == +0)."""
    def key(v):
        if v.kind == "inf":
            return (1 if not v.neg else -1, 0)
        return (0, 0)
    if a.kind == "inf" or b.kind == "inf":
        return key(a) < key(b) and not (a.kind == b.kind == "inf" and a.neg == b.neg)
    d = exact_sum([a, fin(not b.neg, b.m, b.e)])
    return d.m != 0 and d.neg


def absv(v: V) -> V:
    return V(v.kind, False, v.m, v.e)


def amax(vals) -> V:
    """max |v|; any NaN gives NaN (torch.amax); empty gives +0."""
    best = ZERO
    for v in vals:
        if v.kind == "nan":
            return NAN
        if lt(best, absv(v)):
            best = absv(v)
    return best


def bits(v: V, f=F32) -> int:
    """The bit pattern of a value representable in f (NaN: canonical quiet, positive)."""
    from .formats import encode
    return encode(v, f, "rne", "ieee")
