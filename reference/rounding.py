"""Exact rounding of any real into any FormatSpec (SPEC section 2).

One function, ``encode``: unpack the input to ``Exact``, locate the two grid
neighbours by integer arithmetic, choose one by the rounding ``Mode``, then
apply the overflow / underflow / special-value ``Policy``.  The mode and the
policy are explicit arguments; stochastic rounding takes explicit random bits.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fractions import Fraction

from .errors import parse_enum
from .exact import Exact, Kind, exact, floor_log2, pow2
from .formats import FormatSpec, Specials, get_format

__all__ = ["Mode", "Overflow", "InfPolicy", "NanPolicy", "Subnormal", "NoZero", "Negative",
           "Policy", "Flags", "Encoded", "encode", "round_exact", "sr", "default_policy",
           "parse_mode", "DETERMINISTIC_MODES"]


class Mode(enum.Enum):
    RNE = "rne"  # nearest, ties to even
    RNA = "rna"  # nearest, ties away from zero
    RTZ = "rtz"  # toward zero
    RUP = "rup"  # toward +inf
    RDN = "rdn"  # toward -inf
    RTO = "rto"  # round to odd (truncate, then set the last bit if inexact)
    SR = "sr"    # stochastic: add rbits/2**nbits of a step, then truncate

    @classmethod
    def _missing_(cls, value):  # Mode("XYZ"): name the valid choices, as every boundary does
        raise ValueError(f"Mode: unknown value {value!r}; valid choices: "
                         + ", ".join(f"{m.name} ({m.value!r})" for m in cls))


DETERMINISTIC_MODES = tuple(m for m in Mode if m is not Mode.SR)


class Overflow(enum.Enum):
    """Finite inputs whose rounded magnitude exceeds max finite."""
    SATFINITE = "satfinite"  # clamp to +-max finite
    IEEE = "ieee"            # nearest/SR -> inf (NaN if no inf); RTZ/RTO -> max; RUP/RDN by sign
    NAN = "nan"              # always NaN (NaN-on-overflow)


class InfPolicy(enum.Enum):
    PROPAGATE = "propagate"  # inf stays inf, or NaN in a format without inf
    SATURATE = "saturate"    # +-max finite


class NanPolicy(enum.Enum):
    CANONICAL = "canonical"          # the format's positive canonical NaN code
    PRESERVE_SIGN = "preserve_sign"  # canonical payload, input's sign
    TO_ZERO = "to_zero"              # +0 (formats without NaN)
    TO_NEG_ZERO = "to_neg_zero"      # -0 whatever the NaN's sign
    TO_MAX = "to_max"                # +max finite
    RAISE = "raise"                  # ValueError
    TO_ZERO_FLIP_SIGN = "to_zero_flip_sign"  # zero with the NaN's sign inverted (ml_dtypes 0.6 float4/float6)
    SIGNED_ALL_ONES = "signed_all_ones"      # all-ones magnitude, input's sign (torch float8_e5m2: 0x7F/0xFF)


class Subnormal(enum.Enum):
    KEEP = "keep"
    FLUSH = "flush"   # results below min normal become signed zero (FTZ)
    # Formats without zero (e8m0): the smallest code stands in for 0 when
    # rounding, as in casts that treat exponent field 0 as a subnormal binade
    # (torch, ml_dtypes): below 2*min_normal the grid is {0, 2*min_normal},
    # min_normal itself stays exact, and a 0 result follows the no_zero policy.
    MIN_AS_ZERO = "min_as_zero"


class NoZero(enum.Enum):
    """Zero or a result below min normal in a format without zero (e8m0fnu)."""
    NAN = "nan"        # zero and results below min normal -> NaN
    TO_MIN = "to_min"  # both -> the smallest code (torch float8_e8m0fnu)
    NAN_IF_ZERO = "nan_if_zero"  # exact zero -> NaN, non-zero results below min -> smallest code (ml_dtypes)


class Negative(enum.Enum):
    """Negative non-zero inputs to an unsigned format."""
    NAN = "nan"
    RAISE = "raise"
    TO_ZERO = "to_zero"
    ABS = "abs"        # drop the sign, encode |x| (torch float8_e8m0fnu)


_NAN_CODE_POLICIES = (NanPolicy.CANONICAL, NanPolicy.PRESERVE_SIGN, NanPolicy.SIGNED_ALL_ONES)
_NAN_ZERO_POLICIES = (NanPolicy.TO_ZERO, NanPolicy.TO_NEG_ZERO, NanPolicy.TO_ZERO_FLIP_SIGN)


@dataclass(frozen=True)
class Policy:
    overflow: Overflow = Overflow.SATFINITE
    inf: InfPolicy = InfPolicy.SATURATE
    nan: NanPolicy = NanPolicy.CANONICAL
    subnormal: Subnormal = Subnormal.KEEP
    no_zero: NoZero = NoZero.NAN
    negative: Negative = Negative.NAN

    @classmethod
    def make(cls, **kw) -> "Policy":
        """Build from enum members or their names, validating each field."""
        types = {"overflow": Overflow, "inf": InfPolicy, "nan": NanPolicy,
                 "subnormal": Subnormal, "no_zero": NoZero, "negative": Negative}
        for k in kw:
            if k not in types:
                raise ValueError(f"policy field: unknown name {k!r}; valid choices: {', '.join(types)}")
        return cls(**{k: parse_enum(f"policy.{k}", v, types[k]) for k, v in kw.items()})

    def validate(self, fmt: FormatSpec) -> None:
        """Reject policies the format cannot express (no silent substitutes)."""
        def bad(what, val, choices):
            raise ValueError(f"policy.{what}: {val.name} is not possible for {fmt.name} "
                             f"(specials: {fmt.specials.value}); valid choices: {choices}")
        if not fmt.has_nan:
            if self.overflow in (Overflow.NAN,) or (self.overflow is Overflow.IEEE and not fmt.has_inf):
                bad("overflow", self.overflow, "SATFINITE")
            if self.inf is InfPolicy.PROPAGATE:
                bad("inf", self.inf, "SATURATE")
            if self.nan in _NAN_CODE_POLICIES:
                bad("nan", self.nan, "TO_ZERO, TO_NEG_ZERO, TO_ZERO_FLIP_SIGN, TO_MAX, RAISE")
            if self.negative is Negative.NAN and not fmt.signed:
                bad("negative", self.negative, "RAISE, TO_ZERO, ABS")
        if not fmt.has_zero:
            if self.subnormal is Subnormal.FLUSH:
                bad("subnormal", self.subnormal, "KEEP, MIN_AS_ZERO")
            if self.nan in _NAN_ZERO_POLICIES:  # code 0 is not zero there
                bad("nan", self.nan, "CANONICAL, PRESERVE_SIGN, SIGNED_ALL_ONES, TO_MAX, RAISE")
        elif self.subnormal is Subnormal.MIN_AS_ZERO:
            bad("subnormal", self.subnormal, "KEEP, FLUSH")


def default_policy(fmt: "str | FormatSpec") -> Policy:
    """Natural policy of a format: IEEE formats behave as IEEE 754; NaN-only
    formats saturate (OCP MX / PTX satfinite convention) and keep NaN; formats
    with no specials saturate and raise on NaN."""
    fmt = get_format(fmt)
    if fmt.specials is Specials.IEEE:
        return Policy(Overflow.IEEE, InfPolicy.PROPAGATE, NanPolicy.CANONICAL)
    if fmt.specials is Specials.NAN_ALL_ONES:
        return Policy(Overflow.SATFINITE, InfPolicy.SATURATE, NanPolicy.CANONICAL)
    return Policy(Overflow.SATFINITE, InfPolicy.SATURATE, NanPolicy.RAISE, negative=Negative.RAISE)


@dataclass(frozen=True)
class Flags:
    inexact: bool = False
    overflow: bool = False
    underflow: bool = False
    invalid: bool = False


@dataclass(frozen=True)
class Encoded:
    code: int
    flags: Flags = field(default_factory=Flags)


def parse_mode(mode) -> Mode:
    return parse_enum("mode", mode, Mode)


def _check_sr_bits(mode: Mode, rbits, nbits) -> None:
    if mode is Mode.SR:
        if nbits is None or rbits is None:
            raise ValueError("rbits/nbits: mode SR needs explicit random bits (rbits) and their "
                             "width (nbits); stochastic rounding is a pure function of them")
        if not isinstance(nbits, int) or isinstance(nbits, bool) or not 1 <= nbits <= 64:
            raise ValueError(f"nbits: {nbits!r} is not an int in [1, 64]")
        if not isinstance(rbits, int) or isinstance(rbits, bool) or not 0 <= rbits < (1 << nbits):
            raise ValueError(f"rbits: {rbits!r} is not an int in [0, 2**{nbits})")
    elif rbits is not None or nbits is not None:
        raise ValueError(f"rbits/nbits: random bits are only used by mode SR, not {mode.name}")


def _code_parity(fmt: FormatSpec, n: int, e: int) -> int:
    """Parity of the (possibly hypothetical) code of n * quantum(e).

    With mantissa bits, the code's last bit is n's last bit (normal and
    subnormal alike).  With none (e8m0), it is the biased exponent's; n == 0
    (the zero below MIN_AS_ZERO's step) counts as even."""
    if fmt.man_bits > 0 or n == 0:
        return n & 1
    return (e + fmt.bias) & 1


def round_exact(x, fmt: "str | FormatSpec", mode, *, rbits=None, nbits=None) -> tuple[Fraction, bool]:
    """Round a finite non-zero magnitude onto fmt's grid, exponent range unbounded above.

    Returns (rounded magnitude, inexact).  Sign-dependent modes use x's sign.
    """
    fmt = get_format(fmt)
    mode = parse_mode(mode)
    v = exact(x)
    if not v.is_finite or v.mag == 0:
        raise ValueError("round_exact: x must be finite and non-zero")
    return _round_mag(fmt, mode, v.negative, v.mag, rbits, nbits)


def _round_mag(fmt, mode, neg, a, rbits, nbits, min_as_zero=False):
    e = floor_log2(a)
    if fmt.subnormals:
        e = max(e, fmt.emin)
    elif min_as_zero and e < fmt.emin + 1 and a != fmt.min_normal:
        # Subnormal.MIN_AS_ZERO: one step {0, 2*min_normal}; 0 is an even code.
        e = fmt.emin + 1
    q = pow2(e - fmt.man_bits)
    n, r = divmod(a, q)        # n = floor(a / q) exactly; r = a - n*q
    n = int(n)
    if r == 0:
        return n * q, False
    if mode is Mode.SR:
        t = a + Fraction(rbits, 1 << nbits) * q
        if t < q:              # only below the first step (MIN_AS_ZERO): truncates to 0
            return Fraction(0), True
        et = floor_log2(t)
        qt = fmt.quantum(et)
        return (t // qt) * qt, True
    up: bool
    if mode is Mode.RTZ:
        up = False
    elif mode is Mode.RUP:
        up = not neg
    elif mode is Mode.RDN:
        up = neg
    elif mode is Mode.RNA:
        up = 2 * r >= q
    elif mode is Mode.RNE:
        up = 2 * r > q or (2 * r == q and _code_parity(fmt, n, e) == 1)
    elif mode is Mode.RTO:
        up = _code_parity(fmt, n, e) == 0
    else:  # pragma: no cover
        raise AssertionError(mode)
    return (n + 1) * q if up else n * q, True


def encode(x, fmt: "str | FormatSpec", mode=Mode.RNE, policy: Policy | None = None, *,
           rbits: int | None = None, nbits: int | None = None) -> Encoded:
    """Round the exact value of ``x`` into ``fmt``; return its code and IEEE-style flags."""
    fmt = get_format(fmt)
    mode = parse_mode(mode)
    if policy is None:
        policy = default_policy(fmt)
    elif not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a Policy, got {type(policy).__name__}")
    policy.validate(fmt)
    _check_sr_bits(mode, rbits, nbits)
    v = exact(x)
    if v.is_nan:
        return _encode_nan(fmt, policy, v)
    if v.negative and not fmt.signed and not v.is_zero:
        if policy.negative is not Negative.ABS:
            return _encode_negative(fmt, policy, v)
        v = Exact(v.kind, False, v.mag)       # ABS: drop the sign, encode |x|
    if v.is_inf:
        if policy.inf is InfPolicy.SATURATE:
            return Encoded(_signed(fmt, v.negative, fmt.max_code_magnitude),
                           Flags(inexact=True, overflow=True))
        if fmt.has_inf:
            return Encoded(_signed(fmt, v.negative, fmt.inf_code))
        return Encoded(_nan_code(fmt, policy, v.negative), Flags(invalid=True))
    if v.mag == 0:
        if fmt.has_zero:
            return Encoded(_signed(fmt, v.negative, 0))
        if policy.no_zero in (NoZero.NAN, NoZero.NAN_IF_ZERO):
            return Encoded(fmt.nan_code, Flags(invalid=True))
        return Encoded(0, Flags(inexact=True, underflow=True))
    return _encode_finite(fmt, mode, policy, v, rbits, nbits)


def _signed(fmt: FormatSpec, neg: bool, mag_code: int) -> int:
    return (fmt.sign_mask if (neg and fmt.signed) else 0) | mag_code


def _nan_code(fmt: FormatSpec, policy: Policy, neg: bool) -> int:
    """The code of any NaN result (NaN input, overflow or inf to NaN): its sign and payload
    follow the nan policy; other nan policies give the canonical code."""
    if policy.nan is NanPolicy.PRESERVE_SIGN:
        return _signed(fmt, neg, fmt.nan_code)
    if policy.nan is NanPolicy.SIGNED_ALL_ONES:
        return _signed(fmt, neg, (1 << (fmt.nbits - fmt.sign_bits)) - 1)
    return fmt.nan_code


def _encode_nan(fmt: FormatSpec, policy: Policy, v: Exact) -> Encoded:
    p = policy.nan
    if p is NanPolicy.RAISE:
        raise ValueError(f"x: NaN cannot be encoded in {fmt.name} under nan policy RAISE; "
                         "valid choices: " + ", ".join(m.name for m in NanPolicy))
    if p in _NAN_CODE_POLICIES:
        return Encoded(_nan_code(fmt, policy, v.negative))
    if p is NanPolicy.TO_ZERO:
        return Encoded(0, Flags(invalid=True))
    if p is NanPolicy.TO_NEG_ZERO:
        return Encoded(_signed(fmt, True, 0), Flags(invalid=True))
    if p is NanPolicy.TO_ZERO_FLIP_SIGN:
        return Encoded(_signed(fmt, not v.negative, 0), Flags(invalid=True))
    if p is NanPolicy.TO_MAX:
        return Encoded(fmt.max_code_magnitude, Flags(invalid=True))
    raise AssertionError(p)  # pragma: no cover  (every NanPolicy member is handled above)


def _encode_negative(fmt: FormatSpec, policy: Policy, v: Exact) -> Encoded:
    """A negative non-zero input to an unsigned format (policy.negative other than ABS)."""
    p = policy.negative
    if p is Negative.RAISE:
        raise ValueError(f"x: negative value {v} cannot be encoded in unsigned {fmt.name} "
                         "under negative policy RAISE; valid choices: "
                         + ", ".join(m.name for m in Negative))
    if p is Negative.NAN:
        return Encoded(fmt.nan_code, Flags(invalid=True))
    if p is Negative.TO_ZERO:  # zero, or e8m0's smallest code
        return Encoded(0, Flags(inexact=True, invalid=True))
    raise AssertionError(p)  # pragma: no cover  (ABS is the caller's)


def _overflow_code(fmt: FormatSpec, mode: Mode, policy: Policy, neg: bool) -> Encoded:
    """A finite input whose rounded magnitude exceeds max finite."""
    flags = Flags(inexact=True, overflow=True)
    o = policy.overflow
    to_inf: bool
    if o is Overflow.SATFINITE:
        to_inf = False
    elif o is Overflow.NAN:
        return Encoded(_nan_code(fmt, policy, neg), flags)
    else:  # IEEE
        if mode in (Mode.RNE, Mode.RNA, Mode.SR):
            to_inf = True
        elif mode in (Mode.RTZ, Mode.RTO):
            to_inf = False
        elif mode is Mode.RUP:
            to_inf = not neg
        else:
            to_inf = neg
    if not to_inf:
        return Encoded(_signed(fmt, neg, fmt.max_code_magnitude), flags)
    if fmt.has_inf:
        return Encoded(_signed(fmt, neg, fmt.inf_code), flags)
    return Encoded(_nan_code(fmt, policy, neg), flags)


def _encode_finite(fmt: FormatSpec, mode: Mode, policy: Policy, v: Exact, rbits, nbits):
    """A finite non-zero input: round its magnitude, then overflow / underflow policy."""
    rounded, inexact = _round_mag(fmt, mode, v.negative, v.mag, rbits, nbits,
                                  policy.subnormal is Subnormal.MIN_AS_ZERO)
    tiny = v.mag < fmt.min_normal
    flags = Flags(inexact=inexact, underflow=tiny and inexact)
    if rounded > fmt.max_finite:
        return _overflow_code(fmt, mode, policy, v.negative)
    if rounded < fmt.min_normal:
        if not fmt.has_zero:
            if policy.no_zero is NoZero.NAN:
                return Encoded(fmt.nan_code, Flags(inexact=True, underflow=True, invalid=True))
            return Encoded(0, Flags(inexact=True, underflow=True))
        if policy.subnormal is Subnormal.FLUSH and rounded != 0:
            return Encoded(_signed(fmt, v.negative, 0), Flags(inexact=True, underflow=True))
    return Encoded(_signed(fmt, v.negative, fmt.encode_magnitude(rounded)), flags)


def sr(x, rbits: int, nbits: int, fmt: "str | FormatSpec", policy: Policy | None = None) -> Encoded:
    """Stochastic rounding (SPEC default: add-then-truncate) with explicit random bits."""
    return encode(x, fmt, Mode.SR, policy, rbits=rbits, nbits=nbits)


def quantize_exact(x, fmt, mode=Mode.RNE, policy: Policy | None = None, **kw) -> Exact:
    """encode then decode: the exact value that ``x`` becomes in ``fmt``."""
    fmt = get_format(fmt)
    return fmt.decode(encode(x, fmt, mode, policy, **kw).code)


__all__.append("quantize_exact")
_ = Kind
