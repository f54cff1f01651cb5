"""Bit-level views of codes: hex, fields, decoded values, ULP distance (the notation of a
code in reports, probe evidence and validation records).

Every decode goes through ``reference.formats`` (the FormatSpec table).
"""
from __future__ import annotations

import re
from fractions import Fraction

from reference.formats import CodeClass, FormatSpec, get_format

__all__ = ["parse_hex", "to_hex", "field_bits", "bit_diff", "decode_str", "exact_str",
           "ordinal", "ulp_distance", "HEX_RE"]

HEX_RE = re.compile(r"^0x[0-9a-fA-F]+$")


def parse_hex(s: str, fmt: "str | FormatSpec") -> int:
    """'0x3f80' -> code, checked against the format's code range."""
    spec = get_format(fmt)
    if not isinstance(s, str) or not HEX_RE.match(s):
        raise ValueError(f"bits: {s!r} is not a hex string like '0x3f80'")
    code = int(s, 16)
    spec.check_code(code)
    return code


def to_hex(code: int, fmt: "str | FormatSpec") -> str:
    """Zero-padded to the storage width: bfloat16 1.0 -> '0x3f80'."""
    spec = get_format(fmt)
    spec.check_code(code)
    return f"0x{code:0{(spec.container_bits + 3) // 4}x}"


def field_bits(code: int, fmt: "str | FormatSpec") -> list[tuple[str, str]]:
    """[('sign', '0'), ('exponent', '01111111'), ('mantissa', '0000000')]; empty fields left out."""
    spec = get_format(fmt)
    s, e, m = spec.fields(code)
    out = []
    if spec.sign_bits:
        out.append(("sign", str(s)))
    if spec.exp_bits:
        out.append(("exponent", format(e, f"0{spec.exp_bits}b")))
    if spec.man_bits:
        out.append(("mantissa", format(m, f"0{spec.man_bits}b")))
    return out


def bit_diff(code_a: int, code_b: int, fmt: "str | FormatSpec") -> list[dict]:
    """Per field: name, the bits of b, and which of them differ from a."""
    fa, fb = field_bits(code_a, fmt), field_bits(code_b, fmt)
    return [{"field": name, "bits": [(cb, cb != ca) for ca, cb in zip(bits_a, bits_b)]}
            for (name, bits_a), (_, bits_b) in zip(fa, fb)]


def exact_str(code: int, fmt: "str | FormatSpec") -> str:
    """Exact value as m*2^e with odd m ('3*2^-2'), '0', 'inf', 'nan'."""
    v = get_format(fmt).decode(code)
    if not v.is_finite or v.mag == 0:
        return str(v)
    mag: Fraction = v.mag
    num, den = mag.numerator, mag.denominator
    e = 0
    if den > 1:  # den is a power of two
        e = -(den.bit_length() - 1)
    while num % 2 == 0:
        num //= 2
        e += 1
    sign = "-" if v.negative else ""
    return f"{sign}{num}" if e == 0 else f"{sign}{num}*2^{e}"


def decode_str(code: int, fmt: "str | FormatSpec") -> str:
    """Decimal display value ('1.0078125', '-0.0', 'nan'); exact for formats up to 32 bits."""
    v = get_format(fmt).decode(code)
    if v.is_nan:
        return "nan"
    if v.is_inf:
        return "-inf" if v.negative else "inf"
    return repr(float(v))  # binary64 holds every value of these formats exactly


def ordinal(code: int, fmt: "str | FormatSpec") -> int | None:
    """Position on the number line (+0 and -0 both 0); None for NaN."""
    spec = get_format(fmt)
    if spec.classify(code) is CodeClass.NAN:
        return None
    mag = code & ~spec.sign_mask
    neg = bool(code & spec.sign_mask)
    return -mag if neg else mag


def ulp_distance(code_a: int, code_b: int, fmt: "str | FormatSpec") -> int | None:
    """Number of representable steps between two codes (inf counts as one past max); None if NaN."""
    oa, ob = ordinal(code_a, fmt), ordinal(code_b, fmt)
    if oa is None or ob is None:
        return None
    return abs(oa - ob)
