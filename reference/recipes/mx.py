"""MX block scaling (OCP Microscaling v1.0; SPEC 3.2), exact, with each public
implementation's scale rule and Inf/NaN block policy as a named profile.

Shared exponents come from exact binades of the FP32 amax (bit lengths,
``floor_log2``), never from a float log2 -- except where an upstream profile
itself takes a float32 ``torch.log2``; that rule is modeled exactly by
``ceil_rn_log2_f32`` (proven against torch on every near-threshold input).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from ..errors import check_choice
from ..exact import Exact, Kind, exact, floor_log2, pow2
from ..formats import get_format
from ..rounding import Mode, parse_mode
from ..blocked import BlockScaled
from . import f32 as F
from .common import amax as _amax, as_matrix, check_positive_int, matrix_of_ints, transpose
from .elem import rne_signed, torch_fp8_code, torchao_floatx_code
from .rules import (BlockSpecials, Copy, DataPath, ElemCast, Log2Rule, ScaleMode, choose,
                    unreachable)

__all__ = ["MXRule", "MX_RULES", "MX_ELEM_FORMATS", "quantize", "shared_exponent",
           "ceil_rn_log2_f32", "E8M0_NAN"]

E8M0_NAN = 0xFF
MX_ELEM_FORMATS = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn",
                   "float8_e5m2")
SCALE_MODES = tuple(ScaleMode)
# the element casts an MX rule may name
MX_ELEM_CASTS = (ElemCast.RNE, ElemCast.TORCHAO, ElemCast.PYTORCH_TEST)


@dataclass(frozen=True)
class MXRule:
    """One exact MX rule.

    scale_mode  FLOOR: floor(log2 amax) - emax_elem;  CEIL: ceil(log2 amax) - emax_elem;
                EVEN: amax rounded to the element's mantissa width (ties away) first, then
                floor;  RCEIL: ceil(log2(fl(amax / elem_max))) (cuBLAS / TE / torchao RCEIL)
    data_path   EXACT: q = round(x / 2**e), saturated (sign of zero kept);
                TORCHAO: torchao 0.18 arithmetic (FLOOR/CEIL/EVEN: fl(x / max(2**e, 2**-126))
                with the scale built from bits; RCEIL: fl(x * rcp) with rcp = 1 at code 0,
                2**-127 at code 254, NaN at code 255); PYTORCH_TEST: torch's
                ``common_quantized.to_mxfp`` (RCEIL; rcp = 1 at code 0, 2**(127-code) else)
    log2        RCEIL only: EXACT binade, or TORCH_F32 = ceil(RN_f32(log2 d)) as
                ``torch.log2`` computes it (upstream float log2: a descale just above 2**k
                can give 2**k, i.e. clamped elements)
    elem_cast   RNE: exact rounding (``rounding``); TORCHAO: torchao bit trick for
                float4/6, torch cast for float8; PYTORCH_TEST: bf16 first, then as torchao
                (read by the upstream data paths only: EXACT always rounds exactly)
    specials    NAN_SCALE: a NaN or Inf in the block gives scale 0xFF and element codes
                NaN (float8) / +0 (float4/6);  UPSTREAM: whatever ``data_path`` computes
    block       elements per scale (an integer >= 1)

    Every field is checked at construction (strings are taken for the enum fields).
    """
    scale_mode: ScaleMode = ScaleMode.FLOOR
    data_path: DataPath = DataPath.EXACT
    log2: Log2Rule = Log2Rule.EXACT
    elem_cast: ElemCast = ElemCast.RNE
    specials: BlockSpecials = BlockSpecials.NAN_SCALE
    block: int = 32

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        put("scale_mode", choose("scale_mode", self.scale_mode, ScaleMode))
        put("data_path", choose("data_path", self.data_path, DataPath))
        put("log2", choose("log2", self.log2, Log2Rule))
        put("elem_cast", choose("elem_cast", self.elem_cast, ElemCast, MX_ELEM_CASTS))
        put("specials", choose("specials", self.specials, BlockSpecials))
        check_positive_int("block", self.block)


def ceil_log2(a: Fraction) -> int:
    e = floor_log2(a)
    return e if pow2(e) == a else e + 1


def _below2(m: Fraction, t: int) -> bool:
    """m ** (2 ** t) < 2 for rational m > 1, by interval squaring (never a tie)."""
    prec = 128
    while True:
        lo = hi = m
        for _ in range(t):
            lo, hi = lo * lo, hi * hi
            el, eh = floor_log2(lo), floor_log2(hi)
            ql, qh = pow2(el - prec), pow2(eh - prec)
            lo = (lo // ql) * ql
            n = hi // qh
            hi = (n + (n * qh != hi)) * qh
            if lo >= 2:
                return False
        if hi < 2:
            return True
        prec *= 2


def ceil_rn_log2_f32(d: Fraction) -> int:
    """ceil(RN_float32(log2 d)) for finite d > 0, exactly.

    log2 d = k + log2 m (m in [1, 2)); the float32 result equals k (so the ceil is k
    instead of k + 1) iff log2 m is below half the float32 gap next to k on the side
    of k + log2 m, i.e. iff m ** (2 ** t) < 2 with 2 ** -t that half gap."""
    k = floor_log2(d)
    m = d / pow2(k)
    if m == 1:
        return k
    if k == 0:
        return 1
    a = abs(k)
    fa = floor_log2(Fraction(a))
    gap_e = fa - 23 - (1 if (k < 0 and a == 1 << fa) else 0)
    return k if _below2(m, 1 - gap_e) else k + 1


def _ceil_log2_rule(d: Fraction, log2: Log2Rule) -> int:
    """ceil(log2 d) of a descale d > 0: exact, or as torch.log2 in float32 computes it."""
    if log2 is Log2Rule.EXACT:
        return ceil_log2(d)
    if log2 is Log2Rule.TORCH_F32:
        return ceil_rn_log2_f32(d)
    unreachable("log2", log2)


def shared_exponent(amax: Exact, elem_fmt: str, scale_mode: str, log2: str = "exact") -> int:
    """Unbiased, clamped shared exponent of a finite amax (exact rules)."""
    scale_mode = choose("scale_mode", scale_mode, ScaleMode)
    log2 = choose("log2", log2, Log2Rule)
    spec = get_format(elem_fmt)
    emax = spec.emax
    if amax.mag == 0:
        return -127
    a = amax.mag
    if scale_mode is ScaleMode.FLOOR:
        e = floor_log2(a) - emax
    elif scale_mode is ScaleMode.CEIL:
        e = ceil_log2(a) - emax
    elif scale_mode is ScaleMode.EVEN:
        q = F.rnd(exact(a), "float32", Mode.RNE)  # already float32
        e0 = floor_log2(q.mag)
        step = pow2(e0 - spec.man_bits)
        n, r = divmod(q.mag, step)
        ar = (n + (1 if 2 * r >= step else 0)) * step
        e = floor_log2(ar) - emax
    elif scale_mode is ScaleMode.RCEIL:
        d = F.div(amax, exact(spec.max_finite))
        e = -127 if d.mag == 0 else _ceil_log2_rule(d.mag, log2)
    else:
        unreachable("scale_mode", scale_mode)
    return max(-127, min(127, e))


def _elem_code(v: Exact, fmt: str, how: ElemCast, mode: Mode, rb=None, nbits=None) -> int:
    spec = get_format(fmt)
    if how is ElemCast.RNE or mode is not Mode.RNE:
        return rne_signed(v, fmt, mode, rbits=rb, nbits=nbits, nan="nan" if spec.has_nan else "zero")
    if how is ElemCast.PYTORCH_TEST:
        if spec.nbits == 4:
            v = F.bf16(v)
            if v.is_nan:
                v = F.nan(True, 0x7F0000)  # torch's vectorized float->bf16 makes NaN 0xFFFF
    elif how is not ElemCast.TORCHAO:
        unreachable("elem_cast", how)
    if spec.nbits == 8:
        return torch_fp8_code(v, fmt)
    return torchao_floatx_code(v, fmt)


def _torchao_floor_family(vals, amax_v, spec, rule):
    """torchao 0.18 ``to_mx`` FLOOR/CEIL/EVEN, op for op on float32 bits."""
    mbits = spec.man_bits
    emax = spec.emax
    isnan = amax_v.is_nan
    b = F.bits(amax_v) if not isnan else 0x7FC00000
    if rule.scale_mode is ScaleMode.EVEN and not isnan:
        b = (b + (1 << (23 - mbits - 1))) & 0xFF800000
    extracted = ((b >> 23) & 0xFF) - 127
    if rule.scale_mode is ScaleMode.CEIL:
        extracted += 1 if (b & 0x7FFFFF) > 0 else 0
    unb = max(-127, min(128, extracted - emax))
    code = 255 if isnan else unb + 127
    scale = F.from_bits(code << 23)
    scale = F.clamp(scale, exact(pow2(-126)))
    data = [F.div(v, scale) for v in vals]
    if spec.nbits == 8:
        mx = exact(spec.max_finite)
        data = [F.clamp(d, -mx, mx) for d in data]
    return code, data


def _rceil_rcp(code: int, d: Exact, data_path: DataPath) -> Exact:
    """The reciprocal scale an upstream RCEIL path multiplies by (2**(127-code) mostly)."""
    if data_path is DataPath.TORCHAO:
        if code == 255:
            return d
        if code == 254:
            return exact(pow2(-127))
        return F.ONE if code == 0 else exact(pow2(127 - code))
    if data_path is DataPath.PYTORCH_TEST:
        return F.ONE if code == 0 else exact(pow2(127 - code))
    unreachable("data_path", data_path)


def _torchao_rceil(vals, amax_v, spec, rule):
    mx = exact(spec.max_finite)
    d = F.div(amax_v, mx)
    if d.is_nan:
        code = 255
    elif d.is_inf:  # torchao: 254; pytorch_test: ceil(log2(inf)) = inf, clamped to 127
        code = 254
    elif d.mag == 0:
        code = 0
    else:
        code = max(-127, min(127, _ceil_log2_rule(d.mag, rule.log2))) + 127
    rcp = _rceil_rcp(code, d, rule.data_path)
    data = [F.clamp(F.mul(v, rcp), -mx, mx) for v in vals]
    return code, data


def _upstream_block(vals, amax_v, spec, rule):
    """(scale code, FP32 data) of one block by an upstream data path."""
    if rule.scale_mode is ScaleMode.RCEIL:
        return _torchao_rceil(vals, amax_v, spec, rule)
    if rule.scale_mode in (ScaleMode.FLOOR, ScaleMode.CEIL, ScaleMode.EVEN):
        return _torchao_floor_family(vals, amax_v, spec, rule)
    unreachable("scale_mode", rule.scale_mode)


def _exact_block(vals, amax_v, spec, rule, elem_fmt, mode, rbs, nbits):
    """(scale code, element codes) of one block by the exact data path."""
    special = any(v.is_nan or v.is_inf for v in vals)
    if special and rule.specials is BlockSpecials.NAN_SCALE:
        return E8M0_NAN, [spec.nan_code if spec.has_nan else 0] * len(vals)
    e = shared_exponent(amax_v, elem_fmt, rule.scale_mode, rule.log2)
    codes = []
    for j, v in enumerate(vals):
        q = v if not v.is_finite else Exact(Kind.FINITE, v.negative, v.mag / pow2(e))
        kw = dict(rb=rbs[j], nbits=nbits) if mode is Mode.SR else {}
        codes.append(_elem_code(q, elem_fmt, ElemCast.RNE, mode, **kw))
    return e + 127, codes


def quantize(x, rule: MXRule, elem_fmt: str = "float4_e2m1fn", *, profile: str = "",
             mode=Mode.RNE, rbits=None, nbits=None, copy: str = "rowwise") -> BlockScaled:
    """MX-quantize a 2D input along rows (blocks of ``rule.block``); the last dimension
    must be a multiple of the block (no MX profile pads)."""
    check_choice("elem_fmt", elem_fmt, MX_ELEM_FORMATS)
    copy = choose("copy", copy, Copy)
    mode = parse_mode(mode)
    spec = get_format(elem_fmt)
    B = check_positive_int("block", rule.block)
    m = as_matrix(x)
    if copy is Copy.COLUMNWISE:
        m = transpose(m)
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if cols % B:
        raise ValueError(f"x: last dimension {cols} is not a multiple of the MX block {B} "
                         f"(profile {profile or 'mx'} does not pad; valid: multiples of {B})")
    if mode is Mode.SR:
        if rbits is None or nbits is None:
            raise ValueError("rbits/nbits: mode SR needs explicit random bits per element")
        rb = matrix_of_ints(rbits, "rbits")
    elif rbits is not None:
        raise ValueError(f"rbits: random bits are only used by mode SR, not {mode.name}")
    codes = [[0] * cols for _ in range(rows)]
    scodes = [[0] * (cols // B) for _ in range(rows)]
    for r in range(rows):
        for bc in range(cols // B):
            vals = m[r][bc * B:(bc + 1) * B]
            rbs = rb[r][bc * B:(bc + 1) * B] if mode is Mode.SR else None
            if rule.data_path is DataPath.EXACT:
                sc, cs = _exact_block(vals, _amax(vals), spec, rule, elem_fmt, mode, rbs, nbits)
            else:
                sc, data = _upstream_block(vals, _amax(vals), spec, rule)
                cs = [_elem_code(d, elem_fmt, rule.elem_cast, mode,
                                 **(dict(rb=rbs[j], nbits=nbits) if mode is Mode.SR else {}))
                      for j, d in enumerate(data)]
            scodes[r][bc] = sc
            codes[r][bc * B:(bc + 1) * B] = cs
    return BlockScaled(shape=(rows, cols), codes=tuple(map(tuple, codes)), elem_fmt=elem_fmt,
                       scale_codes=tuple(map(tuple, scodes)), scale_fmt="float8_e8m0fnu",
                       block=(1, B), profile=profile)


_OCP = MXRule()
MX_RULES = {
    "ocp_mx_floor": _OCP,
    "ocp_mx_ceil": replace(_OCP, scale_mode=ScaleMode.CEIL),
    "ocp_mx_even": replace(_OCP, scale_mode=ScaleMode.EVEN),
    "ocp_mx_rceil": replace(_OCP, scale_mode=ScaleMode.RCEIL),
    "torchao_mx_floor": MXRule("floor", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_ceil": MXRule("ceil", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_even": MXRule("even", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_rceil": MXRule("rceil", "torchao", "torch_f32", "torchao", "upstream"),
    "pytorch_test_mx": MXRule("rceil", "pytorch_test", "torch_f32", "pytorch_test", "upstream"),
}
