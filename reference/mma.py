"""One tensor-core MMA instruction, exactly: D = A*B + C for one tile (issue 17).

The exact truth for ``fp4ref.mma``.  Every kind follows the published instruction-level
model of Xie et al., "MMA-Sim" (arXiv 2511.10909), as quoted in SPEC 4.1 and issue 17,
literally; Hopper ``wgmma`` follows what ``make probe`` inferred on the H200 (README).
docs/mma.md lists each rule with the sentence it comes from, and the assumptions.

Operands are raw codes (Python ints): ``a`` [M][K], ``b`` [K][N], scales as raw bytes
``scale_a`` [M][K/block], ``scale_b`` [K/block][N], ``c`` [M][N] as float32 bit patterns.
Results are float32 bit patterns.  Values are exact (``Exact`` / ``Fraction``); nothing
here is computed in floating point and nothing is vectorised: one output at a time.

The fused add shared by all kinds (``_fused_add``): every addend t (C and the product or
group terms) carries an alignment exponent e(t); E = max e(t); each addend is truncated
toward zero to a multiple of 2^(E - W); the truncated addends are summed exactly; the sum
is rounded toward zero to FP32 (``out_frac_bits`` fraction bits, FP32 exponent range,
subnormals kept); |sum| >= 2^128 gives +-Inf.  An exponent is the format's exponent of the
value, and a subnormal or zero enters with the format's minimum normal exponent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Sequence

from .errors import check_choice
from .exact import Exact, Kind, NAN, floor_log2, pow2
from .formats import get_format

__all__ = ["ARCH_KINDS", "ELEMENT_FORMATS", "SCALE_BLOCKS", "FORMAT_ALIASES", "Instr", "resolve",
           "CANONICAL_NAN", "dot_mxf4nvf4", "dot_mxf8f6f4", "dot_f8f6f4", "dot_f16", "dot_tf32",
           "dot_wgmma", "mma"]

CANONICAL_NAN = 0x7FFFFFFF  # the NaN every kind writes (issue 17: "the canonical NaN 0x7FFFFFFF")
_SIGN = 0x80000000
_INF = 0x7F800000

ARCH_KINDS = {"blackwell": ("mxf4nvf4", "mxf8f6f4", "f8f6f4", "f16", "tf32"),
              "hopper": ("wgmma",)}
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_F8F6F4 = _FP8 + ("float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn")
_HALF = ("float16", "bfloat16")
ELEMENT_FORMATS = {"mxf4nvf4": ("float4_e2m1fn",), "mxf8f6f4": _F8F6F4, "f8f6f4": _F8F6F4,
                   "f16": _HALF, "tf32": ("tf32",), "wgmma": _FP8 + _HALF}
# scale format -> allowed block sizes (issue 17: "ue8m0 with block 16 or 32, ue4m3 with block 16";
# mxf8f6f4: "ue8m0 block 32").  The first entry of each tuple is the default block.
SCALE_BLOCKS = {"mxf4nvf4": {"ue4m3": (16,), "ue8m0": (32, 16)},
                "mxf8f6f4": {"ue8m0": (32,)}}
FORMAT_ALIASES = {"e2m1": "float4_e2m1fn", "e2m3": "float6_e2m3fn", "e3m2": "float6_e3m2fn",
                  "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "fp16": "float16",
                  "bf16": "bfloat16", "e8m0": "ue8m0", "float8_e8m0fnu": "ue8m0"}


@dataclass(frozen=True)
class Instr:
    """One resolved instruction: its shape, operand formats and fused-add parameters."""
    kind: str
    arch: str
    k: int                    # K of one instruction
    a_format: str
    b_format: str
    scale_format: str | None  # None: unscaled kind
    block: int | None
    width: int                # fraction bits kept below the alignment exponent
    out_frac_bits: int        # fraction bits of the result (23 = FP32)


def _choose_format(param: str, value, kind: str, choices: Sequence[str]) -> str:
    if value is None and len(choices) == 1:
        return choices[0]
    if value is None:
        raise ValueError(f"{param}: kind {kind!r} needs an element format; valid choices: "
                         + ", ".join(choices))
    return _check(f"{param} (kind {kind!r})", value, choices)


def _check(param: str, value, choices) -> str:
    """check_choice after the short aliases (e4m3, bf16, ...); the message shows ``value``."""
    name = FORMAT_ALIASES.get(value, value) if isinstance(value, str) else value
    if name in choices:
        return name
    return check_choice(param, value, choices)  # raises, naming the value as given


def _choose_scales(kind: str, scale_format, block) -> tuple[str | None, int | None]:
    table = SCALE_BLOCKS.get(kind)
    if table is None:
        for param, val in (("scale_format", scale_format), ("block", block)):
            if val is not None:
                raise ValueError(f"{param}: kind {kind!r} takes no scales, got {val!r}; "
                                 "valid choices: None")
        return None, None
    sf = next(iter(table)) if scale_format is None else scale_format
    sf = _check(f"scale_format (kind {kind!r})", sf, table)
    blocks = table[sf]
    if block is None:
        return sf, blocks[0]
    if isinstance(block, bool) or block not in blocks:
        raise ValueError(f"block: unknown value {block!r} for kind {kind!r} with scale_format "
                         f"{sf!r}; valid choices: " + ", ".join(map(str, sorted(blocks))))
    return sf, int(block)


def resolve(kind, *, arch="blackwell", a_format=None, b_format=None, scale_format=None,
            block=None) -> Instr:
    """Check the choices of one instruction and fill in the defaults."""
    arch = check_choice("arch", arch, ARCH_KINDS)
    kind = check_choice(f"kind (arch {arch!r})", kind, ARCH_KINDS[arch])
    fmts = ELEMENT_FORMATS[kind]
    af = _choose_format("a_format", a_format, kind, fmts)
    # f8f6f4 kinds mix any two formats; wgmma mixes e4m3/e5m2; 16-bit kinds take one format
    b_choices = fmts if kind in ("mxf8f6f4", "f8f6f4") else _FP8 if af in _FP8 else (af,)
    bf = _choose_format("b_format", af if b_format is None else b_format, kind, b_choices)
    sf, blk = _choose_scales(kind, scale_format, block)
    if kind == "mxf4nvf4":
        k, width, out = 64, 35, 23
    elif kind == "wgmma" and af in _FP8:
        k, width, out = 32, 13, 13   # H200: F32 W13:RTZ:esum p13:RTZ
    elif kind == "wgmma":
        k, width, out = 16, 25, 23   # H200: F16 W25:RTZ:esum p23:RTZ
    else:
        k, width, out = {"mxf8f6f4": 32, "f8f6f4": 32, "f16": 16, "tf32": 8}[kind], 25, 23
    return Instr(kind, arch, k, af, bf, sf, blk, width, out)


# --- exact values with their alignment exponents ---------------------------------

@lru_cache(maxsize=None)
def _element(fmt: str, code: int) -> tuple[Exact, int]:
    """(value, exponent): a subnormal or zero enters with the minimum normal exponent."""
    spec = get_format(fmt)
    v = spec.decode(code)
    if not v.is_finite:
        return v, 0  # never aligned: a NaN or infinite addend decides the result
    if v.mag >= spec.min_normal:
        return v, floor_log2(v.mag)
    return v, spec.emin


def _scale(scale_format: str, byte: int) -> tuple[Exact, int]:
    if scale_format == "ue4m3":
        return _element("ue4m3", byte & 0x7F)  # the MMA ignores the e4m3 byte's sign bit
    return _element("float8_e8m0fnu", byte)


def _mul(x: Exact, y: Exact) -> Exact:
    """IEEE product: NaN for NaN or inf * 0, the sign the exclusive or of the signs."""
    if x.is_nan or y.is_nan:
        return NAN
    neg = x.negative != y.negative
    if x.is_inf or y.is_inf:
        return NAN if x.is_zero or y.is_zero else Exact(Kind.INF, neg)
    return Exact(Kind.FINITE, neg, x.mag * y.mag)


def _exact_sum(values: Sequence[Exact]) -> Exact:
    """Exact sum of finite values; an exact zero is -0 only when every value is -0 (IEEE)."""
    s = sum((v.to_fraction() for v in values), Fraction(0))
    if s == 0:
        return Exact(Kind.FINITE, all(v.negative and v.is_zero for v in values))
    return Exact(Kind.FINITE, s < 0, abs(s))


# --- the fused add and the FP32 result ---------------------------------------

def _special(values: Sequence[Exact]) -> int | None:
    """Bits of the result when an addend is NaN or infinite, else None."""
    if any(v.is_nan for v in values):
        return CANONICAL_NAN
    infs = {v.negative for v in values if v.is_inf}
    if len(infs) == 2:
        return CANONICAL_NAN  # inf - inf
    if infs:
        return _INF | (_SIGN if infs.pop() else 0)
    return None


def _round_rz(total: Fraction, out_frac_bits: int) -> int:
    """Float32 bits of ``total`` rounded toward zero to ``out_frac_bits`` fraction bits."""
    sign = _SIGN if total < 0 else 0
    mag = abs(total)
    if mag >= pow2(128):
        return sign | _INF  # "A final result beyond the FP32 range is +-Inf"
    e = max(floor_log2(mag), -126)            # FP32 subnormals kept
    quantum = pow2(e - out_frac_bits)
    kept = (mag // quantum) * quantum         # toward zero
    if kept == 0:
        return sign
    return sign | get_format("float32").encode_magnitude(kept)


def _fused_add(addends: Sequence[tuple[Exact, int]], width: int, out_frac_bits: int) -> int:
    """Align to the largest exponent, truncate at ``width`` fraction bits, sum, RZ to FP32."""
    special = _special([v for v, _ in addends])
    if special is not None:
        return special
    top = max(e for _, e in addends)
    step = pow2(top - width)
    kept = [math.trunc(v.to_fraction() / step) * step for v, _ in addends]
    total = sum(kept, Fraction(0))
    if total == 0:
        # assumption (docs/mma.md): -0 only when every addend is -0, as IEEE addition gives
        return _SIGN if all(v.is_zero and v.negative for v, _ in addends) else 0
    return _round_rz(total, out_frac_bits)


# --- one output element per kind ---------------------------------------------

def dot_mxf4nvf4(a_row, b_col, c_bits, sa_row, sb_col, *, scale_format: str, block: int) -> int:
    """kind::mxf4nvf4: 4 groups of 16 E2M1 products, aligned at the scale-exponent sums, W 35."""
    sa = [_scale(scale_format, s) for s in sa_row]
    sb = [_scale(scale_format, s) for s in sb_col]
    c = _element("float32", c_bits)
    if c[0].is_nan or any(v.is_nan for v, _ in sa + sb):
        return CANONICAL_NAN  # any NaN scale (data zero or not) or NaN C
    addends = [c]
    for g in range(4):
        ks = range(16 * g, 16 * g + 16)
        group = _exact_sum([_mul(_element("float4_e2m1fn", a_row[k])[0],
                                 _element("float4_e2m1fn", b_col[k])[0]) for k in ks])
        (va, ea), (vb, eb) = sa[16 * g // block], sb[16 * g // block]
        addends.append((_mul(_mul(group, va), vb), ea + eb))  # exponent: the scales' alone
    return _fused_add(addends, 35, 23)


def _products(a_row, b_col, c_bits, a_format, b_format, width, out_frac_bits,
              scales=None) -> int:
    """C plus K products a*b (times the scales), each aligned at exp(a)+exp(b)(+scale exps)."""
    addends = [_element("float32", c_bits)]
    for k, (ca, cb) in enumerate(zip(a_row, b_col)):
        (va, ea), (vb, eb) = _element(a_format, ca), _element(b_format, cb)
        v, e = _mul(va, vb), ea + eb
        if scales is not None:
            (vsa, esa), (vsb, esb) = scales[k]
            v, e = _mul(_mul(v, vsa), vsb), e + esa + esb
        addends.append((v, e))
    return _fused_add(addends, width, out_frac_bits)


def dot_mxf8f6f4(a_row, b_col, c_bits, sa_row, sb_col, *, a_format: str, b_format: str,
                 block: int = 32) -> int:
    """kind::mxf8f6f4: 32 scaled products plus C, 25 fraction bits."""
    scales = [(_scale("ue8m0", sa_row[k // block]), _scale("ue8m0", sb_col[k // block]))
              for k in range(len(a_row))]
    return _products(a_row, b_col, c_bits, a_format, b_format, 25, 23, scales)


def dot_f8f6f4(a_row, b_col, c_bits, *, a_format: str, b_format: str) -> int:
    """kind::f8f6f4 (unscaled): 32 products plus C, 25 fraction bits."""
    return _products(a_row, b_col, c_bits, a_format, b_format, 25, 23)


def dot_f16(a_row, b_col, c_bits, *, a_format: str, b_format: str) -> int:
    """kind::f16 (fp16 or bf16): 16 products plus C, 25 fraction bits."""
    return _products(a_row, b_col, c_bits, a_format, b_format, 25, 23)


def dot_tf32(a_row, b_col, c_bits, *, a_format: str = "tf32", b_format: str = "tf32") -> int:
    """kind::tf32: 8 products plus C, 25 fraction bits."""
    return _products(a_row, b_col, c_bits, a_format, b_format, 25, 23)


def dot_wgmma(a_row, b_col, c_bits, *, a_format: str, b_format: str) -> int:
    """Hopper wgmma: fp8 32 products + C, W 13, result cut to 13 fraction bits; fp16/bf16
    16 products + C, W 25 (the H200 findings)."""
    if a_format in _FP8:
        return _products(a_row, b_col, c_bits, a_format, b_format, 13, 13)
    return _products(a_row, b_col, c_bits, a_format, b_format, 25, 23)


def mma(kind, a, b, c, scale_a=None, scale_b=None, *, block=None, scale_format=None,
        a_format=None, b_format=None, arch="blackwell") -> list[list[int]]:
    """D = A*B + C as float32 bit patterns; nested lists of raw codes in (see module doc)."""
    ins = resolve(kind, arch=arch, a_format=a_format, b_format=b_format,
                  scale_format=scale_format, block=block)
    if any(len(row) != ins.k for row in a) or len(b) != ins.k:
        raise ValueError(f"a, b: kind {ins.kind!r} multiplies [M, {ins.k}] by [{ins.k}, N]")
    if (scale_a is None) != (ins.scale_format is None) or (scale_b is None) != (ins.scale_format is None):
        raise ValueError(f"scale_a, scale_b: kind {ins.kind!r} "
                         + ("needs both" if ins.scale_format else "takes none"))
    cols = list(zip(*b))
    scols = list(zip(*scale_b)) if scale_b is not None else None
    out = []
    for i, row in enumerate(a):
        out.append([_dot(ins, row, cols[j], c[i][j], scale_a and scale_a[i], scols and scols[j])
                    for j in range(len(cols))])
    return out


def _dot(ins: Instr, a_row, b_col, c_bits, sa_row, sb_col) -> int:
    fm = {"a_format": ins.a_format, "b_format": ins.b_format}
    if ins.kind == "mxf4nvf4":
        return dot_mxf4nvf4(a_row, b_col, c_bits, sa_row, sb_col,
                            scale_format=ins.scale_format, block=ins.block)
    if ins.kind == "mxf8f6f4":
        return dot_mxf8f6f4(a_row, b_col, c_bits, sa_row, sb_col, block=ins.block, **fm)
    return {"f8f6f4": dot_f8f6f4, "f16": dot_f16, "tf32": dot_tf32,
            "wgmma": dot_wgmma}[ins.kind](a_row, b_col, c_bits, **fm)
