"""One integer-form rounding kernel for the fast paths (numpy and torch alike).

A finite value arrives in integer form: sign ``neg``, integer magnitude ``mag`` and
the exponent ``exp`` of mag's last bit, ``(-1)**neg * (mag + tail) * 2**exp`` with
``0 <= tail < 1`` and ``sticky = tail != 0``.  ``round_grid`` rounds it onto a
format's grid (normal and subnormal binades, every rounding mode, stochastic
rounding with explicit random bits) and returns the result both as a code
magnitude, unbounded above, and as ``n * 2**qexp``.  ``round_int`` adds the range
policy of the emulators (overflow to inf / max finite / NaN, flush to zero, NaN
for values an unsigned or zero-less format cannot hold) and returns the value
form.  The casts (``fp4ref.cast``) map the code onto their per-class policy codes.

Every function takes the array namespace ``xp`` (the ``numpy`` or the ``torch``
module) and uses only operators and functions both give the same meaning
(int64 shifts, ``where``, ``clip``, comparisons, bool masks); the two that differ
(int8 conversion, the float64 bit view) are the small adapters below.  The
format is a ``GridFormat`` read off the ``reference.formats`` row; no second
table.  ``reference.rounding`` stays the independent exact truth this kernel is
tested against (tests/test_gridround.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import NamedTuple, Sequence

import numpy as np

from reference.errors import parse_enum
from reference.formats import FormatSpec, get_format
from reference.rounding import Mode, Overflow

__all__ = ["GridFormat", "Grid", "Rounded", "Unpacked", "MODE_CODE", "FINITE", "INF", "NAN",
           "round_grid", "round_int", "shift_round", "unpack_ieee", "overflow_to_inf",
           "bit_length", "trailing_zeros"]

# Per-element rounding modes (an int64 array in place of one Mode) use these codes.
MODE_CODE = {Mode.RNE: 0, Mode.RTZ: 1, Mode.RDN: 2, Mode.RUP: 3, Mode.RNA: 4, Mode.RTO: 5}
_MODE_OF_CODE = {c: m for m, c in MODE_CODE.items()}
FINITE, INF, NAN = 0, 1, 2      # ``Rounded.kind``
_W = 62                          # SR: the dropped fraction in 62-bit fixed point
_MAX_SHIFT = 62                  # largest shift used (int64 stays exact below 2**63)


# ---------------------------------------------------------------------------
# the format, read off its FormatSpec row
# ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class GridFormat:
    """The integer facts of one format the kernel needs.

    ``max_finite = mmax * 2**top_q``; codes are ``(exponent field << man_bits) |
    mantissa field`` without the sign.  ``stack`` gives array-valued numeric fields
    (one entry per row) for simulators that round many formats at once; such a stack
    has no max_code if one of them is ``wide``."""
    name: str
    man_bits: int
    emin: int            # exponent of the smallest normal binade
    bias: int
    max_code: int        # code magnitude of the largest finite value
    mmax: int
    top_q: int
    subnormals: bool     # False: exponent field 0 is an ordinary binade (e8m0fnu)
    signed: bool
    has_inf: bool
    has_nan: bool
    wide: bool           # codes reach 2**60: round_grid gives no code (the accumulators)

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @classmethod
    def of(cls, fmt: "str | FormatSpec") -> "GridFormat":
        return _grid_format(get_format(fmt))

    @classmethod
    def stack(cls, fmts: Sequence["str | FormatSpec | GridFormat"]) -> "GridFormat":
        """One GridFormat whose numeric fields are int64 numpy arrays, one entry per format.

        The formats must agree on every flag (subnormals, signed, inf, NaN)."""
        gs = [f if isinstance(f, GridFormat) else cls.of(f) for f in fmts]
        if not gs:
            raise ValueError("fmts: stack needs at least one format")
        flags = {(g.subnormals, g.signed, g.has_inf, g.has_nan) for g in gs}
        if len(flags) != 1:
            raise ValueError("fmts: stacked formats must agree on subnormals, signed, inf and "
                             f"NaN; got {', '.join(g.name for g in gs)}")
        wide = any(g.wide for g in gs)
        num = {f.name: np.array([getattr(g, f.name) for g in gs], np.int64)
               for f in fields(cls) if f.type == "int" and not (wide and f.name == "max_code")}
        return replace(gs[0], name="+".join(g.name for g in gs), wide=wide,
                       **({"max_code": None} if wide else {}), **num)

    def reshape(self, *shape) -> "GridFormat":
        """Array-valued fields reshaped (e.g. to (rows, 1) to broadcast over columns)."""
        return replace(self, **{f.name: np.reshape(getattr(self, f.name), shape)
                                for f in fields(self)
                                if f.type == "int" and getattr(self, f.name) is not None})


@lru_cache(maxsize=None)
def _grid_format(f: FormatSpec) -> GridFormat:
    ef, mf = f.max_code_fields
    return GridFormat(f.name, f.man_bits, f.emin, f.bias, f.max_code_magnitude,
                      (1 << f.man_bits) | mf, ef - f.bias - f.man_bits, f.subnormals,
                      f.signed, f.has_inf, f.has_nan, f.max_code_magnitude >= 1 << 60)


# ---------------------------------------------------------------------------
# the two namespace adapters, and integer helpers on top of them
# ---------------------------------------------------------------------------
def _f64_bits(xp, x):
    """int64 bit pattern of float64(x) for int64 x."""
    if xp is np:
        return x.astype(np.float64).view(np.int64)
    return x.to(xp.float64).view(xp.int64)


def _int8(xp, x):
    return x.astype(np.int8) if xp is np else x.to(xp.int8)


def _log2_exact(xp, x):
    """floor(log2 x) for int64 x that float64 holds exactly (< 2**53, or a power of two)."""
    return (_f64_bits(xp, x) >> 52) - 1023


def bit_length(xp, x):
    """Bit length of int64 x >= 0 (0 -> 0)."""
    big = x >= (1 << 53)
    xs = xp.where(big, x >> 11, x)  # >> 11 keeps the float64 conversion exact
    return xp.where(x > 0, _log2_exact(xp, xs) + 1 + xp.where(big, 11, 0), 0)


def trailing_zeros(xp, x):
    """Trailing zero bits of int64 x (0 -> 0)."""
    return xp.where(x != 0, _log2_exact(xp, x & -x), 0)


class Unpacked(NamedTuple):
    neg: object    # bool: the sign bit (NaNs and zeros included)
    mag: object    # int64 significand (hidden bit included); 0 for zeros
    exp: object    # int64 exponent of mag's last bit
    e: object      # int64 binade: floor(log2 |x|) of finite non-zero x
    nan: object
    inf: object
    zero: object


def unpack_ieee(xp, bits, man_bits: int, exp_bits: int) -> Unpacked:
    """Integer form of IEEE floats from their sign-extended int64 bit patterns
    (float64: the int64 view; float32: the int32 view widened)."""
    bias = (1 << (exp_bits - 1)) - 1
    emask = (1 << exp_bits) - 1
    expf = (bits >> man_bits) & emask
    mant = bits & ((1 << man_bits) - 1)
    special = expf == emask
    sub = expf == 0
    mag = xp.where(sub, mant, mant | (1 << man_bits))
    exp = xp.clip(expf, 1, None) - (bias + man_bits)   # value = mag * 2**exp
    # binade of a subnormal input: the exponent of its mantissa (mant < 2**52: exact)
    e = xp.where(sub, _log2_exact(xp, mant) + exp, expf - bias)
    return Unpacked(bits < 0, mag, exp, e, special & (mant != 0), special & (mant == 0),
                    sub & (mant == 0))


# ---------------------------------------------------------------------------
# rounding onto the grid
# ---------------------------------------------------------------------------
class Grid(NamedTuple):
    """A value rounded onto a format's grid, exponent range unbounded above.

    ``code``: its code magnitude (> max_code: overflow; < 0 only for formats
    without zero: below min normal).  ``n * 2**qexp``: its value (n >= 0)."""
    code: object
    n: object
    qexp: object


def overflow_to_inf(mode: Mode) -> tuple[bool, bool]:
    """IEEE overflow: (positive goes to inf, negative goes to inf) under ``mode``;
    otherwise the result is the max finite value of that sign."""
    return {Mode.RNE: (True, True), Mode.RNA: (True, True), Mode.SR: (True, True),
            Mode.RTZ: (False, False), Mode.RTO: (False, False), Mode.RUP: (True, False),
            Mode.RDN: (False, True)}[mode]


def _scalar_mode(mode):
    """The one Mode of ``mode`` (a Mode, or an int64 array of MODE_CODE all equal), else
    None; an unknown code is an error."""
    if isinstance(mode, Mode):
        return mode
    if not hasattr(mode, "min"):
        raise TypeError(f"mode: expected a Mode or an int64 array of MODE_CODE, got "
                        f"{type(mode).__name__}")
    if (mode.numel() if hasattr(mode, "numel") else mode.size) == 0:
        return Mode.RNE  # no elements: any mode will do
    lo, hi = int(mode.min()), int(mode.max())
    if lo < 0 or hi >= len(MODE_CODE):
        raise ValueError(f"mode: codes in [{lo}, {hi}] are not all MODE_CODE values; valid "
                         "codes: " + ", ".join(f"{c} ({m.name})" for m, c in MODE_CODE.items()))
    return _MODE_OF_CODE[lo] if lo == hi else None


def round_grid(xp, neg, mag, exp, fmt: GridFormat, mode, *, e=None, sticky=None, rbits=None,
               nbits: int | None = None, min_as_zero: bool = False, coarse: bool = True,
               mag_bits: int = 62) -> Grid:
    """Round ``(-1)**neg * (mag + tail) * 2**exp`` onto ``fmt``'s grid.

    ``mode``: a Mode, or an int64 array of MODE_CODE (one per element); Mode.SR takes
    ``rbits`` (int64 in [0, 2**nbits)) and no sticky.  ``e``: the binade floor(log2 |x|)
    when the caller has it.  ``sticky`` (bool): a non-zero tail below mag's last bit;
    mag must then hold at least man_bits + 2 bits.  ``coarse=False`` promises that mag
    never has fewer bits than the grid keeps (no shift up needed).  ``mag_bits``: the
    caller's bound mag < 2**mag_bits (<= 62).  ``min_as_zero``: Subnormal.MIN_AS_ZERO
    of a format without zero; a result rounded to zero there has code -1.  Formats whose
    codes do not fit in int64 (fmt.wide) give code None."""
    m, emin = fmt.man_bits, fmt.emin
    if e is None:
        e = exp + bit_length(xp, mag) - 1
    eff, low = _binade(xp, e, mag, fmt, min_as_zero)
    qexp = eff - m
    d = qexp - exp                      # bits dropped; < 0: mag is coarser than the grid
    D = xp.clip(d, 0, _MAX_SHIFT)
    n0 = mag >> D
    n = n0 << xp.clip(-d, 0, _MAX_SHIFT) if coarse else n0
    code = None
    if not fmt.wide:
        code = ((eff - emin) << m) + n
        if not fmt.subnormals:
            code = code - (1 << m)
    up = _round_up(xp, neg, mag, n0, _parity_of(fmt, n, code), d, D, mode, sticky, rbits,
                   nbits, mag_bits)
    if up is not None:
        n = n + up
        code = None if code is None else code + up
    if low is not None:
        code = xp.where(low & (code == 0), -1, code)
    return Grid(code, n, qexp)


def shift_round(xp, neg, mag, s, mode, *, sticky=None, mag_bits: int = 62):
    """Round ``(mag + tail) / 2**s`` (s >= 0) to an integer by ``mode`` (a Mode but SR, or
    a MODE_CODE array), the sign ``neg`` steering the directed modes: the alignment
    shifts of the fused steps, with the same rule as ``round_grid``."""
    D = xp.clip(s, 0, _MAX_SHIFT)
    n0 = mag >> D
    up = _round_up(xp, neg, mag, n0, n0, s, D, mode, sticky, None, None, mag_bits)
    return n0 if up is None else n0 + up


def _binade(xp, e, mag, fmt: GridFormat, min_as_zero: bool):
    """The binade whose quantum applies (subnormals: at least emin), and MIN_AS_ZERO's
    mask of values in its one low step {0, 2*min_normal} (else None)."""
    if fmt.subnormals:
        return xp.clip(e, fmt.emin, None), None
    if not min_as_zero:
        return e, None
    is_min = (e == fmt.emin) & ((mag & (mag - 1)) == 0)   # min_normal itself stays exact
    low = (e < fmt.emin + 1) & ~is_min
    return xp.where(low, fmt.emin + 1, e), low


def _parity_of(fmt: GridFormat, n, code):
    """An array whose last bit is the code's: n's with mantissa bits; the exponent
    field's, read from the code, without (e8m0)."""
    m = fmt.man_bits
    if isinstance(m, int):
        return code if m == 0 else n
    if bool((m == 0).any()):
        raise ValueError("fmt: a stack of formats must not hold one without mantissa bits")
    return n


def _round_up(xp, neg, mag, n0, parity, d, D, mode, sticky, rbits, nbits, mag_bits):
    """The round-up-in-magnitude mask (None: never); ``parity``'s last bit is the code's
    before rounding."""
    one_mode = _scalar_mode(mode)
    if one_mode is Mode.RTZ:
        return None
    rem = mag - (n0 << D)
    if one_mode is Mode.SR:
        if sticky is not None or rbits is None or nbits is None:
            raise ValueError("rbits/sticky: mode SR needs rbits and nbits, and no sticky tail")
        R = xp.where(d <= _W, rem << (_W - D), rem >> xp.clip(d - _W, 0, 63))
        return (rbits << (_W - nbits)) + R >= (1 << _W)
    if one_mode in (Mode.RUP, Mode.RDN, Mode.RTO):
        inexact = rem != 0 if sticky is None else (rem != 0) | sticky
        if one_mode is Mode.RTO:
            return inexact & ((parity & 1) == 0)
        return inexact & (neg if one_mode is Mode.RDN else ~neg)
    twice, half = rem << 1, 1 << D
    if mag_bits >= _MAX_SHIFT:  # mag >= 2**61 with a true half of 2**62 or more: below half
        half = xp.where(d > _MAX_SHIFT, (1 << 63) - 1, half)
    if one_mode is Mode.RNA:
        return twice >= half  # a tie or more; a sticky tail cannot lift a remainder to half
    if sticky is None:
        above, tie = twice > half, twice == half
    else:
        above = (twice > half) | ((twice == half) & sticky)
        tie = (twice == half) & ~sticky
    odd = (parity & 1) == 1
    if one_mode is Mode.RNE:
        return above | (tie & odd)
    inexact = rem != 0 if sticky is None else (rem != 0) | sticky
    return _per_element_up(xp, mode, neg, inexact, above, tie, odd)


def _per_element_up(xp, mode, neg, inexact, above, tie, odd):
    up = xp.where(mode == MODE_CODE[Mode.RNE], above | (tie & odd), above | tie)  # else RNA
    up = xp.where(mode == MODE_CODE[Mode.RTZ], False, up)
    up = xp.where(mode == MODE_CODE[Mode.RUP], inexact & ~neg, up)
    up = xp.where(mode == MODE_CODE[Mode.RDN], inexact & neg, up)
    return xp.where(mode == MODE_CODE[Mode.RTO], inexact & ~odd, up)


# ---------------------------------------------------------------------------
# the emulators' range policy, in value form
# ---------------------------------------------------------------------------
class Rounded(NamedTuple):
    """``(-1)**neg * n * 2**exp`` with n odd or 0 (trailing zeros stripped; exp 0 for
    zeros and specials); ``kind``: int8 FINITE, INF or NAN."""
    n: object
    exp: object
    neg: object
    kind: object


def _to_inf(xp, mode, neg):
    """Per-element IEEE overflow direction (bool array) for a Mode or MODE_CODE array."""
    one_mode = _scalar_mode(mode)
    if one_mode is not None:
        pos_inf, neg_inf = overflow_to_inf(one_mode)
        if pos_inf == neg_inf:
            return xp.zeros_like(neg) | pos_inf
        return neg if neg_inf else ~neg
    nearest = (mode == MODE_CODE[Mode.RNE]) | (mode == MODE_CODE[Mode.RNA])
    return nearest | ((mode == MODE_CODE[Mode.RUP]) & ~neg) | ((mode == MODE_CODE[Mode.RDN]) & neg)


def round_int(xp, neg, mag, exp, fmt: GridFormat, mode, *, overflow: Overflow = Overflow.IEEE,
              flush=False, sticky=None, e=None, mag_bits: int = 62) -> Rounded:
    """Round a finite ``(-1)**neg * (mag + tail) * 2**exp`` into ``fmt`` (round_grid),
    then apply the range policy of ``reference.gemm.round_fp``:

    overflow by ``overflow`` (IEEE: inf, or max finite under RTZ/RTO and the directed
    mode away from that sign; a format without inf gives NaN there); results below min
    normal become signed zero where ``flush`` (bool, or a bool array); a negative
    non-zero value in an unsigned format, and zero or a result below min normal in a
    format without zero, are NaN."""
    overflow = parse_enum("overflow", overflow, Overflow)
    g = round_grid(xp, neg, mag, exp, fmt, mode, e=e, sticky=sticky, mag_bits=mag_bits)
    one = 1 << fmt.man_bits
    carry = g.n == (one << 1)          # rounding carried into the next binade
    n = xp.where(carry, one, g.n)
    qexp = g.qexp + carry
    nz = n != 0
    over = nz & ((qexp > fmt.top_q) | ((qexp == fmt.top_q) & (n > fmt.mmax)))
    under = nz & ((n < one) | (qexp < fmt.emin - fmt.man_bits))   # below min normal
    nan = xp.zeros_like(over)
    if not fmt.signed:
        nan = nan | (neg & (mag != 0))
    if not fmt.has_zero:
        nan = nan | (mag == 0) | under
    inf = None
    if overflow is Overflow.NAN:
        nan = nan | over
        sat = None
    elif overflow is Overflow.IEEE:
        to_inf = over & _to_inf(xp, mode, neg)
        if fmt.has_inf:
            inf = to_inf
        else:
            nan = nan | to_inf
        sat = over & ~to_inf
    else:  # SATFINITE (parse_enum rejected any other value)
        sat = over
    if sat is not None:
        n = xp.where(sat, fmt.mmax, n)
        qexp = xp.where(sat, fmt.top_q, qexp)
    if flush is not False and flush is not None and fmt.has_zero:
        n = xp.where(under & flush, 0, n)
    kind = xp.where(nan, NAN, FINITE if inf is None else xp.where(inf, INF, FINITE))
    n = xp.where(kind != FINITE, 0, n)
    tz = trailing_zeros(xp, n)
    return Rounded(n >> tz, xp.where(n != 0, qexp + tz, 0), neg & fmt.signed, _int8(xp, kind))
