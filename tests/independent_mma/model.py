"""The published tensor-core MMA models, re-derived from issue 17's facts with Python ints.

Every real value is an exact integer count of 2^-Q (Q = 400 covers the smallest product,
e5m2 subnormal^2 * e8m0 2^-254 = 2^-286, and the coarsest truncation step is far above 2^-Q),
so no float and no Fraction is involved. Formats are decoded from their bit layouts
(SPEC.md section 1) here, not through reference.formats, so this oracle shares nothing
with the code it checks. README.md quotes the facts and lists the assumptions (A1..A9).
"""
from __future__ import annotations

from dataclasses import dataclass

from reference.errors import check_choice

Q = 400
NAN_BITS = 0x7FFFFFFF          # the canonical NaN of the facts
POS_INF, NEG_INF = 0x7F800000, 0xFF800000

# name -> (exponent bits, mantissa bits, bias, specials); SPEC.md section 1.
_ELEMENTS = {
    "float4_e2m1fn": (2, 1, 1, "none"),
    "float6_e2m3fn": (2, 3, 1, "none"),
    "float6_e3m2fn": (3, 2, 3, "none"),
    "float8_e4m3fn": (4, 3, 7, "e4m3"),   # S.1111.111 is NaN, no inf
    "float8_e5m2": (5, 2, 15, "ieee"),
}
_ALIASES = {"e2m1": "float4_e2m1fn", "e2m3": "float6_e2m3fn", "e3m2": "float6_e3m2fn",
            "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
            "ue8m0": "float8_e8m0fnu", "e8m0": "float8_e8m0fnu"}
_SCALES = ("float8_e8m0fnu", "ue4m3")

# kind -> (arch, K, fused-add fraction bits, element formats allowed)
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_F8F6F4 = _FP8 + ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
KINDS = {
    ("blackwell", "mxf4nvf4"): (64, 35, ("float4_e2m1fn",)),
    ("blackwell", "mxf8f6f4"): (32, 25, _F8F6F4),
    ("blackwell", "f8f6f4"): (32, 25, _F8F6F4),
    ("hopper", "wgmma"): (32, 13, _FP8),
    ("hopper", "f8f6f4"): (32, 13, _FP8),   # alias: Hopper wgmma fp8 (A9)
}
HOPPER_OUTPUT_FRACTION_BITS = 13


@dataclass(frozen=True)
class Val:
    """A decoded code: kind 'num' | 'inf' | 'nan'; value = (-1)^neg * mant * 2^(exp - fbits).

    ``exp`` is the exponent the hardware aligns with: a subnormal or zero enters with the
    format's minimum normal exponent and a significand below 1 (fact; zero: A1).
    """
    kind: str
    neg: bool
    mant: int
    exp: int
    fbits: int

    def units(self) -> int:
        """The exact value in units of 2^-Q."""
        shift = self.exp - self.fbits + Q
        assert shift >= 0, "Q too small for this value"
        m = self.mant << shift
        return -m if self.neg else m

    @property
    def is_zero(self) -> bool:
        return self.kind == "num" and self.mant == 0


def decode_float(code: int, ebits: int, mbits: int, bias: int, specials: str,
                 signed: bool = True) -> Val:
    """Decode one code of a binary float format straight from its bit fields."""
    width = ebits + mbits + (1 if signed else 0)
    if not isinstance(code, int) or not 0 <= code < (1 << width):
        raise ValueError(f"code: {code!r} outside the {width}-bit format's range 0..{(1 << width) - 1}")
    neg = bool(signed and (code >> (ebits + mbits)) & 1)
    ef = (code >> mbits) & ((1 << ebits) - 1)
    mf = code & ((1 << mbits) - 1)
    eall, mall = (1 << ebits) - 1, (1 << mbits) - 1
    if specials == "ieee" and ef == eall:
        return Val("inf" if mf == 0 else "nan", neg, 0, 0, 0)
    if specials == "e4m3" and ef == eall and mf == mall:
        return Val("nan", neg, 0, 0, 0)
    if ef == 0:   # subnormal or zero: minimum normal exponent, significand 0.m
        return Val("num", neg, mf, 1 - bias, mbits)
    return Val("num", neg, (1 << mbits) | mf, ef - bias, mbits)


def decode_element(code: int, fmt: str) -> Val:
    ebits, mbits, bias, specials = _ELEMENTS[fmt]
    try:
        return decode_float(code, ebits, mbits, bias, specials)
    except ValueError as exc:
        raise ValueError(f"a/b: {fmt} element {exc}") from None


def decode_scale(byte: int, fmt: str) -> Val:
    """UE8M0: 2^(byte-127), 0xFF NaN. UE4M3 at the MMA: the e4m3 byte, sign bit ignored (fact)."""
    if not isinstance(byte, int) or not 0 <= byte <= 255:
        raise ValueError(f"scale: byte {byte!r} outside 0..255")
    if fmt == "float8_e8m0fnu":
        return Val("nan", False, 0, 0, 0) if byte == 0xFF else Val("num", False, 1, byte - 127, 0)
    return decode_float(byte & 0x7F, 4, 3, 7, "e4m3", signed=False)


def decode_fp32(bits: int) -> Val:
    return decode_float(bits, 8, 23, 127, "ieee")


def fused_sum(terms: list[tuple[int, int]], frac_bits: int) -> int:
    """Align (value, exponent) terms to the largest exponent, truncate each toward zero at
    ``frac_bits`` fraction bits below it, and add the truncated terms exactly (fact)."""
    emax = max(e for _, e in terms)
    shift = emax - frac_bits + Q
    assert shift >= 0, "Q too small for this alignment"
    total = 0
    for v, _ in terms:
        t = abs(v) >> shift
        total += -t if v < 0 else t
    return total << shift


def round_rz_fp32(n: int, neg_zero: bool, cut_to: int | None = None) -> int:
    """Normalize and round toward zero to FP32 (subnormals kept); |x| >= 2^128 is +-Inf (A3).

    ``cut_to``: Hopper then clears the FP32 fraction field below ``cut_to`` bits (A8).
    """
    if n == 0:
        return 0x80000000 if neg_zero else 0
    sign = 0x80000000 if n < 0 else 0
    mag = abs(n)
    e = mag.bit_length() - 1 - Q
    if e > 127:
        return sign | POS_INF
    q = max(e - 23, -149)
    m = mag >> (q + Q)            # truncation = RZ; the leading bit stays at e
    if e < -126:
        bits = m                  # subnormal (or zero: keeps the sign of the nonzero sum)
    else:
        bits = ((e + 127) << 23) | (m - (1 << 23))
    if cut_to is not None:
        bits &= ~((1 << (23 - cut_to)) - 1)
    return sign | bits


def _special_result(vals: list[Val]) -> int | None:
    """NaN or infinite exact sum of products and C (fact, mxf8f6f4): NaN -> canonical NaN."""
    infs = set()
    for v in vals:
        if v.kind == "nan":
            return NAN_BITS
        if v.kind == "inf":
            infs.add(v.neg)
    if len(infs) == 2:
        return NAN_BITS
    if infs:
        return NEG_INF if infs.pop() else POS_INF
    return None


def _product(a: Val, b: Val) -> Val:
    """Exact product of two decoded values; exponent = exp(a) + exp(b) (fact)."""
    if a.kind == "nan" or b.kind == "nan":
        return Val("nan", False, 0, 0, 0)
    if a.kind == "inf" or b.kind == "inf":
        other = b if a.kind == "inf" else a
        if other.is_zero:
            return Val("nan", False, 0, 0, 0)   # inf * 0
        return Val("inf", a.neg != b.neg, 0, 0, 0)
    return Val("num", a.neg != b.neg, a.mant * b.mant, a.exp + b.exp, a.fbits + b.fbits)


def _mul_pow2_exact(v: int, k: int) -> int:
    """v * 2^k, asserting exactness (units are fine enough for every value here)."""
    if k >= 0:
        return v << k
    mag = abs(v)
    assert mag & ((1 << -k) - 1) == 0, "Q too small: inexact scaling"
    return (mag >> -k) * (-1 if v < 0 else 1)


def _all_negative_zero(products: list[Val], c: Val) -> bool:
    """A2: an exactly-zero sum is -0 only when C and every product are -0 (IEEE's rule)."""
    return all(p.is_zero and p.neg for p in products + [c])


def dot_mxf4nvf4(a_row, b_col, c_bits, sa_row, sb_col, block, scale_fmt) -> int:
    """One output of kind::mxf4nvf4: four exact 16-product groups, scaled, 35-bit fused add."""
    c = decode_fp32(c_bits)
    sa = [decode_scale(s, scale_fmt) for s in sa_row]
    sb = [decode_scale(s, scale_fmt) for s in sb_col]
    if c.kind == "nan" or any(s.kind == "nan" for s in sa + sb):
        return NAN_BITS            # every scale counts, even over all-zero data (fact)
    if c.kind == "inf":
        return NEG_INF if c.neg else POS_INF   # group terms are finite (A4)
    prods = [_product(decode_element(x, "float4_e2m1fn"), decode_element(y, "float4_e2m1fn"))
             for x, y in zip(a_row, b_col)]
    terms = [(c.units(), c.exp)]
    for g in range(4):
        s_a, s_b = sa[16 * g // block], sb[16 * g // block]
        group = sum(p.units() for p in prods[16 * g:16 * g + 16])   # exact, |sum| <= 576
        value = _mul_pow2_exact(group * s_a.mant * s_b.mant,
                                s_a.exp + s_b.exp - s_a.fbits - s_b.fbits)
        terms.append((value, s_a.exp + s_b.exp))   # aligned by the scale-exponent sum
    total = fused_sum(terms, 35)
    return round_rz_fp32(total, _all_negative_zero(prods, c))


def dot_f8f6f4(a_row, b_col, c_bits, sa: Val | None, sb: Val | None,
               a_fmt, b_fmt, frac_bits, cut_to) -> int:
    """One output of kind::mxf8f6f4 / f8f6f4 (Blackwell, 25 bits) or Hopper wgmma fp8 (13)."""
    c = decode_fp32(c_bits)
    prods = []
    for x, y in zip(a_row, b_col):
        p = _product(decode_element(x, a_fmt), decode_element(y, b_fmt))
        if sa is not None:
            p = _product(_product(p, sa), sb)   # exponent gains exp(sa) + exp(sb)
        prods.append(p)
    special = _special_result(prods + [c])
    if special is not None:
        return special
    terms = [(c.units(), c.exp)] + [(p.units(), p.exp) for p in prods]
    total = fused_sum(terms, frac_bits)
    return round_rz_fp32(total, _all_negative_zero(prods, c), cut_to)


def _resolve(param: str, name, choices) -> str:
    name = _ALIASES.get(name, name) if isinstance(name, str) else name
    return check_choice(param, name, choices)


def _check_matrix(param: str, m, rows: int, cols: int) -> None:
    if len(m) != rows or any(len(r) != cols for r in m):
        raise ValueError(f"{param}: expected a {rows} x {cols} list of lists, "
                         f"got {len(m)} rows of lengths {sorted({len(r) for r in m})}")


def _block_config(kind, block, scale_format):
    """Scale format and block per kind (facts): mxf4nvf4 ue8m0 16/32 or ue4m3 16; mxf8f6f4 ue8m0 32."""
    if kind == "mxf4nvf4":
        fmt = _resolve("scale_format", scale_format or "float8_e8m0fnu", _SCALES)
        allowed = ("16", "32") if fmt == "float8_e8m0fnu" else ("16",)
        default = "32" if fmt == "float8_e8m0fnu" else "16"
        return fmt, int(check_choice("block", str(block or default), allowed))
    if kind == "mxf8f6f4":
        fmt = _resolve("scale_format", scale_format or "float8_e8m0fnu", ("float8_e8m0fnu",))
        return fmt, int(check_choice("block", str(block or 32), ("32",)))
    return None, None


def mma_independent(kind, a_codes, b_codes, c_bits, scale_a=None, scale_b=None, *,
                    block=None, scale_format=None, a_format=None, b_format=None,
                    arch="blackwell"):
    """D = A*B + C for one instruction tile, as the published model computes it.

    a_codes [M][K], b_codes [K][N] raw element codes; c_bits [M][N] float32 bit patterns;
    scale_a [M][K/block], scale_b [K/block][N] raw scale bytes. Returns [M][N] float32 bits.
    """
    arch = check_choice("arch", arch, ("blackwell", "hopper"))
    kind = check_choice("kind", kind, [k for a, k in KINDS if a == arch])
    K, frac_bits, elem_fmts = KINDS[(arch, kind)]
    default_elem = elem_fmts[0]
    a_fmt = _resolve("a_format", a_format or default_elem, elem_fmts)
    b_fmt = _resolve("b_format", b_format or default_elem, elem_fmts)
    scale_fmt, blk = _block_config(kind, block, scale_format)
    M, N = len(a_codes), len(c_bits[0]) if c_bits else 0
    _check_matrix("a", a_codes, M, K)
    _check_matrix("b", b_codes, K, N)
    _check_matrix("c", c_bits, M, N)
    if blk is not None:
        if scale_a is None or scale_b is None:
            raise ValueError(f"scale_a/scale_b: kind {kind!r} needs both block scales")
        _check_matrix("scale_a", scale_a, M, K // blk)
        _check_matrix("scale_b", scale_b, K // blk, N)
    cut = HOPPER_OUTPUT_FRACTION_BITS if arch == "hopper" else None
    out = []
    for i in range(M):
        row = []
        for j in range(N):
            b_col = [b_codes[k][j] for k in range(K)]
            sb_col = [scale_b[k][j] for k in range(K // blk)] if blk else None
            if kind == "mxf4nvf4":
                row.append(dot_mxf4nvf4(a_codes[i], b_col, c_bits[i][j], scale_a[i], sb_col,
                                        blk, scale_fmt))
                continue
            sa = decode_scale(scale_a[i][0], scale_fmt) if blk else None
            sb = decode_scale(sb_col[0], scale_fmt) if blk else None
            row.append(dot_f8f6f4(a_codes[i], b_col, c_bits[i][j], sa, sb,
                                  a_fmt, b_fmt, frac_bits, cut))
        out.append(row)
    return out
