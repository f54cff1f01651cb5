"""The frozen FormatSpec table: the single source of truth for every format.

Every property (max finite, min normal, min subnormal, the finite values, the
code classes) is derived from the fields of one row; a new format is one row.
Names follow ml_dtypes / LLVM: ``fn`` = finite (no inf), ``u`` = unsigned.

Code layout (SPEC section 1): sign bit on top (if any), then exponent, then
mantissa.  ``nbits`` is the payload width; ue4m3 is a 7-bit payload whose
8-bit storage has the sign bit 0.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Mapping

from .exact import Exact, Kind, NAN, pow2
from .errors import check_choice

__all__ = ["Specials", "CodeClass", "FormatSpec", "FORMATS", "get_format", "decode",
           "classify", "format_names"]


class Specials(enum.Enum):
    NONE = "none"                  # every code is finite (e2m1, e2m3, e3m2)
    NAN_ALL_ONES = "nan_all_ones"  # the all-ones magnitude is NaN, no inf (e4m3fn, ue4m3, e8m0fnu)
    IEEE = "ieee"                  # top exponent field: inf (mantissa 0) and NaN


class CodeClass(enum.Enum):
    ZERO = "zero"
    SUBNORMAL = "subnormal"
    NORMAL = "normal"
    INF = "inf"
    NAN = "nan"


@dataclass(frozen=True)
class FormatSpec:
    name: str
    sign_bits: int      # 0 or 1
    exp_bits: int
    man_bits: int
    bias: int
    specials: Specials
    subnormals: bool = True   # False: exponent field 0 is an ordinary binade (e8m0fnu)
    storage_bits: int = 0     # container width; 0 means nbits rounded up to 8/16/32

    # --- layout ---------------------------------------------------------
    @property
    def nbits(self) -> int:
        return self.sign_bits + self.exp_bits + self.man_bits

    @property
    def container_bits(self) -> int:
        if self.storage_bits:
            return self.storage_bits
        for w in (8, 16, 32):
            if self.nbits <= w:
                return w
        raise AssertionError(self.nbits)

    @property
    def signed(self) -> bool:
        return self.sign_bits == 1

    @property
    def exp_max_field(self) -> int:
        return (1 << self.exp_bits) - 1

    @property
    def man_mask(self) -> int:
        return (1 << self.man_bits) - 1

    @property
    def sign_mask(self) -> int:
        return (1 << (self.nbits - 1)) if self.signed else 0

    @property
    def has_inf(self) -> bool:
        return self.specials is Specials.IEEE

    @property
    def has_nan(self) -> bool:
        return self.specials is not Specials.NONE

    @property
    def has_zero(self) -> bool:
        return self.subnormals  # without subnormals the all-zero code is 2**-bias

    # --- exponent range ---------------------------------------------------
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max_code_fields(self) -> tuple[int, int]:
        """(exponent field, mantissa field) of the largest finite magnitude."""
        if self.specials is Specials.NONE:
            return self.exp_max_field, self.man_mask
        if self.specials is Specials.IEEE:
            return self.exp_max_field - 1, self.man_mask
        # NaN_ALL_ONES: one code below all-ones
        if self.man_bits == 0:
            return self.exp_max_field - 1, 0
        return self.exp_max_field, self.man_mask - 1

    @property
    def emax(self) -> int:
        return self.max_code_fields[0] - self.bias

    # --- derived values (exact) ------------------------------------------
    @cached_property
    def max_finite(self) -> Fraction:
        e, m = self.max_code_fields
        return self.decode_magnitude(e, m)

    @cached_property
    def min_normal(self) -> Fraction:
        return pow2(self.emin)

    @cached_property
    def min_subnormal(self) -> Fraction | None:
        if not self.subnormals or self.man_bits == 0:
            return None
        return pow2(self.emin - self.man_bits)

    @cached_property
    def min_positive(self) -> Fraction:
        return self.min_subnormal if self.min_subnormal is not None else self.min_normal

    @property
    def max_code_magnitude(self) -> int:
        e, m = self.max_code_fields
        return (e << self.man_bits) | m

    def decode_magnitude(self, e_field: int, m_field: int) -> Fraction:
        if e_field == 0 and self.subnormals:
            return pow2(self.emin - self.man_bits) * m_field
        return pow2(e_field - self.bias - self.man_bits) * ((1 << self.man_bits) + m_field)

    def quantum(self, e: int) -> Fraction:
        """Grid spacing in binade [2**e, 2**(e+1)), subnormal range included."""
        if self.subnormals:
            e = max(e, self.emin)
        return pow2(e - self.man_bits)

    # --- codes ------------------------------------------------------------
    @property
    def ncodes(self) -> int:
        return 1 << self.nbits

    def fields(self, code: int) -> tuple[int, int, int]:
        self.check_code(code)
        s = (code >> (self.nbits - 1)) & 1 if self.signed else 0
        e = (code >> self.man_bits) & self.exp_max_field
        m = code & self.man_mask
        return s, e, m

    def check_code(self, code: int) -> None:
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code < self.ncodes:
            raise ValueError(
                f"code: {code!r} is not a valid {self.name} code; valid codes are "
                f"integers in [0, {self.ncodes - 1}] ({self.nbits}-bit payload"
                + ("" if self.signed else ", unsigned: sign bit must be 0") + ")")

    def classify(self, code: int) -> CodeClass:
        s, e, m = self.fields(code)
        mag = code & ~self.sign_mask
        if self.specials is Specials.IEEE and e == self.exp_max_field:
            return CodeClass.INF if m == 0 else CodeClass.NAN
        if self.specials is Specials.NAN_ALL_ONES and mag == (1 << (self.nbits - self.sign_bits)) - 1:
            return CodeClass.NAN
        if e == 0 and self.subnormals:
            return CodeClass.ZERO if m == 0 else CodeClass.SUBNORMAL
        return CodeClass.NORMAL

    def decode(self, code: int) -> Exact:
        cls = self.classify(code)
        s, e, m = self.fields(code)
        if cls is CodeClass.NAN:
            return Exact(Kind.NAN, bool(s))
        if cls is CodeClass.INF:
            return Exact(Kind.INF, bool(s))
        return Exact(Kind.FINITE, bool(s), self.decode_magnitude(e, m))

    def encode_magnitude(self, mag: Fraction) -> int:
        """Code magnitude of an exactly representable finite value >= 0."""
        from .exact import floor_log2
        if mag == 0:
            if not self.has_zero:
                raise ValueError(f"{self.name} has no zero")
            return 0
        e = floor_log2(mag)
        if self.subnormals and e < self.emin:
            m = mag / pow2(self.emin - self.man_bits)
            ef = 0
        else:
            m = (mag / pow2(e) - 1) * (1 << self.man_bits)
            ef = e + self.bias
        if m.denominator != 1 or not (0 <= ef <= self.exp_max_field):
            raise ValueError(f"{mag} is not representable in {self.name}")
        code = (ef << self.man_bits) | int(m)
        if code > self.max_code_magnitude:
            raise ValueError(f"{mag} exceeds the max finite value of {self.name}")
        return code

    @property
    def nan_code(self) -> int:
        """Canonical (positive) NaN: IEEE quiet NaN, else the all-ones magnitude."""
        if not self.has_nan:
            raise ValueError(f"{self.name} has no NaN encoding")
        if self.specials is Specials.IEEE:
            return (self.exp_max_field << self.man_bits) | (1 << (self.man_bits - 1))
        return (1 << (self.nbits - self.sign_bits)) - 1

    @property
    def inf_code(self) -> int:
        if not self.has_inf:
            raise ValueError(f"{self.name} has no infinity")
        return self.exp_max_field << self.man_bits

    @cached_property
    def finite_values(self) -> tuple[tuple[int, Fraction], ...]:
        """All non-negative finite (code, value) pairs, ascending (<= 16-bit formats)."""
        if self.nbits > 16:
            raise ValueError(f"{self.name} has {self.nbits}-bit codes: too many to list")
        out = []
        for c in range(self.max_code_magnitude + 1):
            out.append((c, self.decode(c).mag))
        return tuple(out)

    def __str__(self) -> str:
        return self.name


def _row(name, sign, e, m, bias, specials, **kw) -> FormatSpec:
    return FormatSpec(name, sign, e, m, bias, specials, **kw)


_S = Specials
FORMATS: Mapping[str, FormatSpec] = {f.name: f for f in (
    _row("float4_e2m1fn", 1, 2, 1, 1, _S.NONE),
    _row("float6_e2m3fn", 1, 2, 3, 1, _S.NONE),
    _row("float6_e3m2fn", 1, 3, 2, 3, _S.NONE),
    _row("float8_e4m3fn", 1, 4, 3, 7, _S.NAN_ALL_ONES),
    _row("float8_e5m2", 1, 5, 2, 15, _S.IEEE),
    _row("ue4m3", 0, 4, 3, 7, _S.NAN_ALL_ONES, storage_bits=8),
    _row("ue5m3", 0, 5, 3, 15, _S.IEEE),
    _row("float8_e8m0fnu", 0, 8, 0, 127, _S.NAN_ALL_ONES, subnormals=False),
    _row("bfloat16", 1, 8, 7, 127, _S.IEEE),
    _row("float16", 1, 5, 10, 15, _S.IEEE),
    _row("tf32", 1, 8, 10, 127, _S.IEEE, storage_bits=32),
    _row("float32", 1, 8, 23, 127, _S.IEEE),
)}


def format_names() -> tuple[str, ...]:
    return tuple(FORMATS)


def get_format(fmt: "str | FormatSpec") -> FormatSpec:
    if isinstance(fmt, FormatSpec):
        return fmt
    return FORMATS[check_choice("fmt", fmt, FORMATS)]


def decode(fmt: "str | FormatSpec", code: int) -> Exact:
    return get_format(fmt).decode(code)


def classify(fmt: "str | FormatSpec", code: int) -> CodeClass:
    return get_format(fmt).classify(code)


def small_formats() -> tuple[FormatSpec, ...]:
    """Formats of 8 bits or fewer (exhaustively sweepable)."""
    return tuple(f for f in FORMATS.values() if f.nbits <= 8)


__all__.append("small_formats")
_ = NAN  # re-exported convenience
