"""One exact wide form for every value (SoftFloat's "unpack once, round once").

An ``Exact`` is a sign, a kind (finite, inf, nan) and, for finite values, a
non-negative ``Fraction`` magnitude.  Signed zero is a finite value with
magnitude 0 and a sign.  Nothing here is computed in floating point.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral, Rational

__all__ = ["Kind", "Exact", "exact", "floor_log2", "pow2", "NAN", "POS_INF", "NEG_INF"]


class Kind(enum.Enum):
    FINITE = "finite"
    INF = "inf"
    NAN = "nan"


@dataclass(frozen=True, slots=True)
class Exact:
    kind: Kind
    negative: bool
    mag: Fraction = Fraction(0)

    # --- predicates -----------------------------------------------------
    @property
    def is_nan(self) -> bool:
        return self.kind is Kind.NAN

    @property
    def is_inf(self) -> bool:
        return self.kind is Kind.INF

    @property
    def is_finite(self) -> bool:
        return self.kind is Kind.FINITE

    @property
    def is_zero(self) -> bool:
        return self.kind is Kind.FINITE and self.mag == 0

    # --- conversions ----------------------------------------------------
    def to_fraction(self) -> Fraction:
        """Signed exact value; raises for inf/nan (they are not rationals)."""
        if self.kind is not Kind.FINITE:
            raise ValueError(f"{self} is not finite and has no rational value")
        return -self.mag if self.negative else self.mag

    def __float__(self) -> float:
        # Only for display and for handing values to float APIs; exact for
        # every value representable in binary64.
        if self.kind is Kind.NAN:
            return math.nan
        if self.kind is Kind.INF:
            return -math.inf if self.negative else math.inf
        f = float(self.mag)
        return -f if self.negative else f

    def __neg__(self) -> "Exact":
        return Exact(self.kind, not self.negative, self.mag)

    def __str__(self) -> str:
        if self.kind is Kind.NAN:
            return "nan"
        if self.kind is Kind.INF:
            return "-inf" if self.negative else "inf"
        s = "-" if self.negative else ""
        if self.mag == 0:
            return s + "0"
        return s + str(self.mag)


NAN = Exact(Kind.NAN, False)
POS_INF = Exact(Kind.INF, False)
NEG_INF = Exact(Kind.INF, True)


def exact(x) -> Exact:
    """Coerce int, Fraction, float (incl. numpy scalars), or Exact to Exact.

    Floats convert exactly (``Fraction(float)`` is exact); -0.0 keeps its sign.
    """
    if isinstance(x, Exact):
        return x
    if isinstance(x, bool):
        raise TypeError(f"x: bool {x!r} is not a number; pass int, Fraction or float")
    if isinstance(x, (Integral, Rational)):
        f = Fraction(int(x)) if isinstance(x, Integral) else Fraction(x.numerator, x.denominator)
        return Exact(Kind.FINITE, f < 0, abs(f))
    try:
        fx = float(x)
    except (TypeError, ValueError):
        raise TypeError(
            f"x: cannot convert {type(x).__name__} {x!r} to an exact value; "
            "pass int, Fraction, float or Exact") from None
    if math.isnan(fx):
        return Exact(Kind.NAN, math.copysign(1.0, fx) < 0)
    if math.isinf(fx):
        return NEG_INF if fx < 0 else POS_INF
    neg = math.copysign(1.0, fx) < 0
    return Exact(Kind.FINITE, neg, abs(Fraction(fx)))


def floor_log2(a: Fraction) -> int:
    """Largest e with 2**e <= a, for a > 0, from bit lengths (never float log2)."""
    if a <= 0:
        raise ValueError(f"floor_log2: a must be > 0, got {a}")
    p, q = a.numerator, a.denominator
    e = p.bit_length() - q.bit_length()
    if not (pow2(e) <= a):
        e -= 1
    return e


def pow2(e: int) -> Fraction:
    """Exact 2**e for any integer e."""
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)
