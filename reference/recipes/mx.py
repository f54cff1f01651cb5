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

__all__ = ["MXRule", "MX_RULES", "MX_ELEM_FORMATS", "quantize", "shared_exponent",
           "ceil_rn_log2_f32", "E8M0_NAN"]

E8M0_NAN = 0xFF
MX_ELEM_FORMATS = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn",
                   "float8_e5m2")
SCALE_MODES = ("floor", "ceil", "even", "rceil")


@dataclass(frozen=True)
class MXRule:
    """One exact MX rule.

    scale_mode  floor: floor(log2 amax) - emax_elem;  ceil: ceil(log2 amax) - emax_elem;
                even: amax rounded to the element's mantissa width (ties away) first, then
                floor;  rceil: ceil(log2(fl(amax / elem_max))) (cuBLAS / TE / torchao RCEIL)
    data_path   "exact": q = round(x / 2**e), saturated (sign of zero kept);
                "torchao": torchao 0.18 arithmetic (FLOOR/CEIL/EVEN: fl(x / max(2**e, 2**-126))
                with the scale built from bits; RCEIL: fl(x * rcp) with rcp = 1 at code 0,
                2**-127 at code 254, NaN at code 255); "pytorch_test": torch's
                ``common_quantized.to_mxfp`` (RCEIL; rcp = 1 at code 0, 2**(127-code) else)
    log2        rceil only: "exact" binade, or "torch_f32" = ceil(RN_f32(log2 d)) as
                ``torch.log2`` computes it (upstream float log2: a descale just above 2**k
                can give 2**k, i.e. clamped elements)
    elem_cast   "rne": exact rounding (``rounding``); "torchao": torchao bit trick for
                float4/6, torch cast for float8; "pytorch_test": bf16 first, then as torchao
    specials    "nan_scale": a NaN or Inf in the block gives scale 0xFF and element codes
                NaN (float8) / +0 (float4/6);  "upstream": whatever ``data_path`` computes
    """
    scale_mode: str = "floor"
    data_path: str = "exact"
    log2: str = "exact"
    elem_cast: str = "rne"
    specials: str = "nan_scale"
    block: int = 32


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


def shared_exponent(amax: Exact, elem_fmt: str, scale_mode: str, log2: str = "exact") -> int:
    """Unbiased, clamped shared exponent of a finite amax (exact rules)."""
    spec = get_format(elem_fmt)
    emax = spec.emax
    if amax.mag == 0:
        return -127
    a = amax.mag
    if scale_mode == "floor":
        e = floor_log2(a) - emax
    elif scale_mode == "ceil":
        e = ceil_log2(a) - emax
    elif scale_mode == "even":
        q = F.rnd(exact(a), "float32", Mode.RNE)  # already float32
        e0 = floor_log2(q.mag)
        step = pow2(e0 - spec.man_bits)
        n, r = divmod(q.mag, step)
        ar = (n + (1 if 2 * r >= step else 0)) * step
        e = floor_log2(ar) - emax
    else:
        d = F.div(amax, exact(spec.max_finite))
        if d.mag == 0:
            e = -127
        else:
            e = ceil_rn_log2_f32(d.mag) if log2 == "torch_f32" else ceil_log2(d.mag)
    return max(-127, min(127, e))


def _elem_code(v: Exact, fmt: str, how: str, mode: Mode, rb=None, nbits=None) -> int:
    spec = get_format(fmt)
    if how == "rne" or mode is not Mode.RNE:
        return rne_signed(v, fmt, mode, rbits=rb, nbits=nbits, nan="nan" if spec.has_nan else "zero")
    if how == "pytorch_test" and spec.nbits == 4:
        v = F.bf16(v)
        if v.is_nan:
            v = F.nan(True, 0x7F0000)  # torch's vectorized float->bf16 makes NaN 0xFFFF
    if spec.nbits == 8:
        return torch_fp8_code(v, fmt)
    return torchao_floatx_code(v, fmt)


def _torchao_floor_family(vals, amax_v, spec, rule):
    """torchao 0.18 ``to_mx`` FLOOR/CEIL/EVEN, op for op on float32 bits."""
    mbits = spec.man_bits
    emax = spec.emax
    isnan = amax_v.is_nan
    b = F.bits(amax_v) if not isnan else 0x7FC00000
    if rule.scale_mode == "even" and not isnan:
        b = (b + (1 << (23 - mbits - 1))) & 0xFF800000
    extracted = ((b >> 23) & 0xFF) - 127
    if rule.scale_mode == "ceil":
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


def _torchao_rceil(vals, amax_v, spec, rule):
    mx = exact(spec.max_finite)
    d = F.div(amax_v, mx)
    if d.is_nan:
        code = 255
    elif d.is_inf and rule.data_path == "torchao":
        code = 254
    elif d.is_inf:  # pytorch_test: ceil(log2(inf)) = inf, clamped to 127
        code = 254
    elif d.mag == 0:
        code = 0
    else:
        e = ceil_rn_log2_f32(d.mag) if rule.log2 == "torch_f32" else ceil_log2(d.mag)
        code = max(-127, min(127, e)) + 127
    if rule.data_path == "torchao":
        if code == 255:
            rcp = d
        elif code == 254:
            rcp = exact(pow2(-127))
        elif code == 0:
            rcp = F.ONE
        else:
            rcp = exact(pow2(127 - code))
    else:
        rcp = F.ONE if code == 0 else exact(pow2(127 - code))
    data = [F.clamp(F.mul(v, rcp), -mx, mx) for v in vals]
    return code, data


def quantize(x, rule: MXRule, elem_fmt: str = "float4_e2m1fn", *, profile: str = "",
             mode=Mode.RNE, rbits=None, nbits=None, copy: str = "rowwise") -> BlockScaled:
    """MX-quantize a 2D input along rows (blocks of ``rule.block``); the last dimension
    must be a multiple of the block (no MX profile pads)."""
    check_choice("elem_fmt", elem_fmt, MX_ELEM_FORMATS)
    check_choice("copy", copy, ("rowwise", "columnwise"))
    mode = parse_mode(mode)
    spec = get_format(elem_fmt)
    B = check_positive_int("block", rule.block)
    m = as_matrix(x)
    if copy == "columnwise":
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
            a = _amax(vals)
            special = any(v.is_nan or v.is_inf for v in vals)
            if rule.data_path == "exact":
                if special and rule.specials == "nan_scale":
                    scodes[r][bc] = E8M0_NAN
                    for j in range(B):
                        codes[r][bc * B + j] = spec.nan_code if spec.has_nan else 0
                    continue
                e = shared_exponent(a, elem_fmt, rule.scale_mode, rule.log2)
                scodes[r][bc] = e + 127
                for j, v in enumerate(vals):
                    q = v if not v.is_finite else Exact(Kind.FINITE, v.negative, v.mag / pow2(e))
                    kw = dict(rb=rb[r][bc * B + j], nbits=nbits) if mode is Mode.SR else {}
                    codes[r][bc * B + j] = _elem_code(q, elem_fmt, "rne", mode, **kw)
                continue
            if rule.scale_mode == "rceil":
                code, data = _torchao_rceil(vals, a, spec, rule)
            else:
                code, data = _torchao_floor_family(vals, a, spec, rule)
            scodes[r][bc] = code
            for j, d in enumerate(data):
                kw = dict(rb=rb[r][bc * B + j], nbits=nbits) if mode is Mode.SR else {}
                codes[r][bc * B + j] = _elem_code(d, elem_fmt, rule.elem_cast, mode, **kw)
    return BlockScaled(shape=(rows, cols), codes=tuple(map(tuple, codes)), elem_fmt=elem_fmt,
                       scale_codes=tuple(map(tuple, scodes)), scale_fmt="float8_e8m0fnu",
                       block=(1, B), profile=profile)


_OCP = MXRule()
MX_RULES = {
    "ocp_mx_floor": _OCP,
    "ocp_mx_ceil": replace(_OCP, scale_mode="ceil"),
    "ocp_mx_even": replace(_OCP, scale_mode="even"),
    "ocp_mx_rceil": replace(_OCP, scale_mode="rceil"),
    "torchao_mx_floor": MXRule("floor", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_ceil": MXRule("ceil", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_even": MXRule("even", "torchao", "exact", "torchao", "upstream"),
    "torchao_mx_rceil": MXRule("rceil", "torchao", "torch_f32", "torchao", "upstream"),
    "pytorch_test_mx": MXRule("rceil", "pytorch_test", "torch_f32", "pytorch_test", "upstream"),
}