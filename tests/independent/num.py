"""Integer-pair exact values and the one rounding routine (SPEC 1, 2).

A value is ``V(kind, neg, m, e)``: kind 'f' (finite: (-1)**neg * m * 2**e), 'inf' or 'nan'.
No Fraction, no float arithmetic: every step is integer shifts and compares.
"""
from __future__ import annotations

from typing import NamedTuple


class V(NamedTuple):
    kind: str          # 'f', 'inf', 'nan'
    neg: bool
    m: int = 0
    e: int = 0


NAN = V("nan", False)
PINF, NINF = V("inf", False), V("inf", True)
ZERO, NZERO = V("f", False, 0, 0), V("f", True, 0, 0)

MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "rnz")   # rnz: nearest, ties toward zero


def fin(neg, m, e=0) -> V:
    return V("f", bool(neg), m, e)


def from_float(x: float) -> V:
    """A Python float (binary64) exactly: as_integer_ratio gives m / 2**k."""
    if x != x:
        return NAN
    if x in (float("inf"), float("-inf")):
        return V("inf", x < 0)
    neg = x < 0 or (x == 0 and str(x).startswith("-"))
    n, d = abs(x).as_integer_ratio()
    return fin(neg, n, -(d.bit_length() - 1))


def is_zero(v: V) -> bool:
    return v.kind == "f" and v.m == 0


def flog2(v: V) -> int:
    """floor(log2 |v|) of a finite non-zero value, from the integer's bit length."""
    return v.e + v.m.bit_length() - 1


def align(a: V, b: V):
    """Both significands on the common exponent min(ea, eb)."""
    e = min(a.e, b.e)
    return a.m << (a.e - e), b.m << (b.e - e), e


def cmp_abs(a: V, b: V) -> int:
    x, y, _ = align(a, b)
    return (x > y) - (x < y)


def exact_sum(terms, zero_neg=False) -> V:
    """Exact sum of finite values; an exact zero gets sign ``zero_neg`` (caller's IEEE rule)."""
    if not terms:
        return fin(zero_neg, 0, 0)
    e = min(t.e for t in terms)
    s = sum((-t.m if t.neg else t.m) << (t.e - e) for t in terms)
    return fin(s < 0 if s else zero_neg, abs(s), e)


def mul(a: V, b: V) -> V:
    """Exact product with IEEE specials (0 * inf = NaN)."""
    neg = a.neg != b.neg
    if "nan" in (a.kind, b.kind):
        return NAN
    if "inf" in (a.kind, b.kind):
        return NAN if is_zero(a) or is_zero(b) else V("inf", neg)
    return fin(neg, a.m * b.m, a.e + b.e)


def round_at(v: V, q: int, mode: str) -> V:
    """Round a finite value to a multiple of 2**q (sign-magnitude, mode on |v|)."""
    if v.e >= q or v.m == 0:
        return v
    sh = q - v.e
    k, r = v.m >> sh, v.m & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    if mode == "rne":
        k += r > half or (r == half and k & 1)
    elif mode == "rna":
        k += r >= half
    elif mode == "rnz":
        k += r > half
    elif mode == "rup":
        k += r != 0 and not v.neg
    elif mode == "rdn":
        k += r != 0 and v.neg
    elif mode == "rto":
        k |= r != 0
    elif mode != "rtz":
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    return fin(v.neg, k, q)


def quantum_exp(v: V, p: int, emin: int) -> int:
    """Exponent of the grid spacing of a p-bit float with normal minimum exponent emin, in
    |v|'s binade (subnormal spacing below 2**emin)."""
    return max(flog2(v), emin) - (p - 1)


def round_float(v: V, p: int, emin: int, mode: str) -> V:
    """Round onto the p-bit float grid with unbounded exponent above (caller handles overflow)."""
    if v.kind != "f" or v.m == 0:
        return v
    return round_at(v, quantum_exp(v, p, emin), mode)


def sr_float(v: V, rbits: int, nbits: int, p: int, emin: int) -> V:
    """SPEC 2 default SR: t = |v| + (rbits / 2**nbits) * step, step from |v|'s binade, then
    truncate t toward zero onto the grid (in t's binade), sign restored."""
    if v.kind != "f" or v.m == 0:
        return v
    q = quantum_exp(v, p, emin)
    t = exact_sum([fin(False, v.m, v.e), fin(False, rbits, q - nbits)])
    return round_float(fin(v.neg, t.m, t.e), p, emin, "rtz")


def to_fraction(v: V):
    """Only for comparing with the project in tests: (kind, neg, Fraction magnitude)."""
    from fractions import Fraction
    if v.kind != "f":
        return (v.kind, v.neg if v.kind == "inf" else None, None)
    mag = Fraction(v.m) * (Fraction(2) ** v.e)
    return ("f", v.neg, mag)


def overflow_stops_at_max(mode: str, neg: bool) -> bool:
    """IEEE 754 7.4: rounding that never increases |v| (RTZ, RDN on +, RUP on -) overflows
    to max finite; round-to-odd is truncation with a sticky last bit, so it does too."""
    return mode in ("rtz", "rto") or (mode == "rdn" and not neg) or (mode == "rup" and neg)
