"""Format table and code <-> value (SPEC 1), written from the SPEC table's columns.

Each format is (signed, exp bits, man bits, bias, specials). Derived: p = man bits + 1,
emin = 1 - bias (subnormals below), max finite from the specials rule. Codes are ints.
"""
from __future__ import annotations

from typing import NamedTuple

from .num import NAN, V, cmp_abs, fin, flog2, overflow_stops_at_max, round_float, sr_float


class Fmt(NamedTuple):
    name: str
    signed: bool
    eb: int
    mb: int
    bias: int
    specials: str      # none | fn (all-ones = NaN) | ieee | top_exp (exp field max = inf/NaN) | e8m0

    @property
    def p(self):
        return self.mb + 1

    @property
    def emin(self):
        return 1 - self.bias

    @property
    def sign_bit(self):
        return 1 << (self.eb + self.mb) if self.signed else 0

    def max_fields(self):
        top, mall = (1 << self.eb) - 1, (1 << self.mb) - 1
        if self.specials in ("ieee", "top_exp"):
            return top - 1, mall
        if self.specials == "fn":
            return top, mall - 1
        return top, mall

    @property
    def max_finite(self) -> V:
        E, M = self.max_fields()
        return fin(False, M | (1 << self.mb), E - self.bias - self.mb)


FORMATS = {f.name: f for f in (
    Fmt("float4_e2m1fn", True, 2, 1, 1, "none"),
    Fmt("float6_e2m3fn", True, 2, 3, 1, "none"),
    Fmt("float6_e3m2fn", True, 3, 2, 3, "none"),
    Fmt("float8_e4m3fn", True, 4, 3, 7, "fn"),
    Fmt("float8_e5m2", True, 5, 2, 15, "ieee"),
    Fmt("ue4m3", False, 4, 3, 7, "fn"),
    Fmt("ue5m3", False, 5, 3, 15, "top_exp"),
    Fmt("float8_e8m0fnu", False, 8, 0, 127, "e8m0"),
    Fmt("bfloat16", True, 8, 7, 127, "ieee"),
    Fmt("float16", True, 5, 10, 15, "ieee"),
    Fmt("float32", True, 8, 23, 127, "ieee"),
)}


def fmt_of(name) -> Fmt:
    if isinstance(name, Fmt):
        return name
    if name not in FORMATS:
        raise ValueError(f"fmt={name!r}: expected one of {sorted(FORMATS)}")
    return FORMATS[name]


def decode(code: int, name) -> V:
    f = fmt_of(name)
    neg = bool(code & f.sign_bit)
    E, M = (code >> f.mb) & ((1 << f.eb) - 1), code & ((1 << f.mb) - 1)
    top = (1 << f.eb) - 1
    if f.specials == "e8m0":
        return NAN if code == 0xFF else fin(False, 1, code - 127)
    if f.specials in ("ieee", "top_exp") and E == top:
        return V("inf", neg) if M == 0 else NAN
    if f.specials == "fn" and E == top and M == (1 << f.mb) - 1:
        return NAN
    if E == 0:
        return fin(neg, M, f.emin - f.mb)
    return fin(neg, M | (1 << f.mb), E - f.bias - f.mb)


def nan_code(f: Fmt, neg=False) -> int:
    s = f.sign_bit if neg else 0
    if f.specials == "fn":
        return s | ((1 << (f.eb + f.mb)) - 1)
    if f.specials in ("ieee", "top_exp"):
        return s | (((1 << f.eb) - 1) << f.mb) | (1 << (f.mb - 1))
    if f.specials == "e8m0":
        return 0xFF
    raise ValueError(f"NaN has no code in {f.name} (specials=none)")


def fields_of(v: V, f: Fmt) -> int:
    """Code of a finite on-grid value whose magnitude is at most max finite."""
    s = f.sign_bit if v.neg else 0
    if v.m == 0:
        return s
    E = flog2(v)
    if E < f.emin:                                  # subnormal: M * 2**(emin - mb)
        return s | (v.m << (v.e - (f.emin - f.mb)))
    sig = v.m << (v.e - (E - f.mb)) if v.e >= E - f.mb else v.m >> ((E - f.mb) - v.e)
    return s | ((E + f.bias) << f.mb) | (sig - (1 << f.mb))


def _overflow(v: V, f: Fmt, mode: str, overflow: str) -> int:
    big = fields_of(fin(v.neg, f.max_finite.m, f.max_finite.e), f)
    toward_zero = overflow_stops_at_max(mode, v.neg)
    if overflow == "sat" or toward_zero:
        return big
    if f.specials == "ieee" or f.specials == "top_exp":
        return (f.sign_bit if v.neg else 0) | (((1 << f.eb) - 1) << f.mb)
    if f.specials == "fn":
        return nan_code(f, v.neg)
    return big


def encode(v: V, name, mode="rne", overflow="sat", rbits=None, nbits=None) -> int:
    """Round v into the format: mode one of num.MODES or 'sr' (with rbits, nbits).
    overflow: 'sat' (clamp to +-max) or 'ieee' (to inf, NaN where there is none, except
    that directed modes toward zero stop at max, as IEEE 754 says). Unsigned formats: a
    negative non-zero value is NaN; -0 encodes as +0."""
    f = fmt_of(name)
    if v.kind == "nan":
        return nan_code(f, v.neg)
    if not f.signed and v.neg:
        if v.kind == "f" and v.m == 0:
            return 0
        return nan_code(f)
    if v.kind == "inf":
        return _overflow(v, f, "rne", overflow)
    r = sr_float(v, rbits, nbits, f.p, f.emin) if mode == "sr" else round_float(v, f.p, f.emin, mode)
    mx = f.max_finite
    if r.m and cmp_abs(r, mx) > 0:
        return _overflow(r, f, mode, overflow)
    return fields_of(r, f)


def e8m0_code(k: int) -> int:
    """The E8M0 code of 2**k after clamping k to [-127, 127] (SPEC 3.2)."""
    return max(-127, min(127, k)) + 127
