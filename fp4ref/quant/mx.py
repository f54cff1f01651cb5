"""MX quantization, torch (CPU/CUDA), bit-identical to ``reference.recipes.mx``."""
from __future__ import annotations

from functools import lru_cache

import torch

from reference.errors import check_choice
from reference.exact import pow2
from reference.formats import get_format
from reference.recipes import f32 as F
from reference.recipes.mx import MX_ELEM_FORMATS, MX_RULES, MXRule, ceil_rn_log2_f32
from reference.recipes.rules import (BlockSpecials, Copy, DataPath, ElemCast, Log2Rule, ScaleMode,
                                     choose, unreachable)
from reference.rounding import Mode
from . import _elem as E
from ._common import INPUT_DTYPES, cached_plan, mode_arg, tq, check_input, check_rbits
from .blocked import BlockScaledTensor

__all__ = ["quantize", "rceil_f32_thresholds"]


@lru_cache(maxsize=None)
def rceil_f32_thresholds() -> tuple[int, ...]:
    """For k in [-149, 127]: the float32 bit pattern T_k such that a descale d with
    2**k < d < T_k has ceil(RN_f32(log2 d)) = k (torch.log2's quirk), else k + 1.
    T_k = bits(2**k) + 1 when no such d exists.  Found by bisection over
    ``ceil_rn_log2_f32`` (monotone in d within a binade)."""
    out = []
    for k in range(-149, 128):
        lo = int(F.bits(F.f32(_ex(pow2(k)))))
        hi = lo + 1
        # grow until ceil gives k + 1
        step = 1
        while ceil_rn_log2_f32(F.from_bits(hi).mag) == k:
            hi = lo + step
            step *= 2
        a, b = lo + 1, hi  # first d with ceil k+1 lies in [a, b]
        while a < b:
            mid = (a + b) // 2
            if ceil_rn_log2_f32(F.from_bits(mid).mag) == k:
                a = mid + 1
            else:
                b = mid
        out.append(a)
    return tuple(out)


def _ex(v):
    from reference.exact import exact
    return exact(v)


def _floor_log2_f32(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) for finite a > 0 (float32), exactly, via frexp on float64."""
    m, e = torch.frexp(a.to(torch.float64))
    return e.to(torch.int64) - 1


def _ceil_log2_f32(a: torch.Tensor) -> torch.Tensor:
    m, e = torch.frexp(a.to(torch.float64))
    e = e.to(torch.int64)
    return torch.where(m == 0.5, e - 1, e)


def _exact_exponent(amax, spec, rule):
    """Shared exponent (int64) of finite amax per block, exact rules
    (reference.recipes.mx.shared_exponent)."""
    pos = amax > 0
    safe = torch.where(pos, amax, torch.ones_like(amax))
    emax = spec.emax
    mode = rule.scale_mode
    if mode is ScaleMode.FLOOR:
        e = _floor_log2_f32(safe) - emax
    elif mode is ScaleMode.CEIL:
        e = _ceil_log2_f32(safe) - emax
    elif mode is ScaleMode.EVEN:
        m, ex = torch.frexp(safe.to(torch.float64))       # safe = m * 2**ex, m in [0.5, 1)
        scale = 2.0 ** (spec.man_bits + 1)
        n = torch.floor(m * scale + 0.5)                    # RNA to man_bits (+1 implicit)
        e = ex.to(torch.int64) - 1 + (n >= scale).to(torch.int64) - emax
    elif mode is ScaleMode.RCEIL:
        d = safe / float(spec.max_finite)
        pos = pos & (d > 0)
        d = torch.where(d > 0, d, torch.ones_like(d))
        e = _ceil_log2_rule(d, rule.log2)
    else:
        unreachable("scale_mode", mode)
    e = torch.where(pos, e, torch.full_like(e, -127))
    return torch.clamp(e, -127, 127)


def _ceil_log2_rule(d: torch.Tensor, log2: Log2Rule) -> torch.Tensor:
    """ceil(log2 d) of finite descales d > 0: exact, or as torch.log2 in float32 gives it."""
    if log2 is Log2Rule.EXACT:
        return _ceil_log2_f32(d)
    if log2 is Log2Rule.TORCH_F32:
        return _ceil_rn_log2(d)
    unreachable("log2", log2)


def _ceil_rn_log2(d: torch.Tensor) -> torch.Tensor:
    """ceil(RN_f32(log2 d)) for finite d > 0, exactly (threshold table, no float log2)."""
    k = _floor_log2_f32(d)
    th = torch.tensor(rceil_f32_thresholds(), dtype=torch.int64, device=d.device)
    t = th[(k + 149).clamp(0, 276)]
    b = E.f32_bits(d)
    p2 = E.f32_bits(torch.ldexp(torch.ones_like(d, dtype=torch.float64), k).to(torch.float32))
    exact_pow = b == p2
    return torch.where(exact_pow, k, torch.where(b < t, k, k + 1))


def _triton_ok(x, rule, elem_fmt, mode, copy, backend) -> bool:
    """The fused kernel applies (ocp_mx_floor MXFP4, RNE, rowwise, CUDA); backend "triton"
    where it does not is an error."""
    TQ = tq()
    fits = (rule == MX_RULES["ocp_mx_floor"] and elem_fmt == "float4_e2m1fn"
            and mode is Mode.RNE and copy == "rowwise")
    if backend == "triton" and not (fits and TQ.available(x)):
        raise ValueError("backend: triton needs CUDA, triton and ocp_mx_floor MXFP4 RNE "
                         "rowwise; valid choices: auto, torch, triton")
    return backend != "torch" and fits and TQ.available(x)


_PLANS: dict = {}


def _fused_plan(profile, elem_fmt, mode, copy, rule, backend):
    """The profile name when these arguments select the fused kernel (input aside), else
    None; cached per argument set (the checks cost more host time than the launch)."""
    if type(mode) not in (str, Mode):
        return None
    return cached_plan(_PLANS, (profile, elem_fmt, mode, copy, id(rule), backend),
                       lambda: _make_plan(profile, elem_fmt, mode, copy, rule, backend), rule)


def _check_args(profile, elem_fmt, copy, rule, backend):
    """The argument checks ``quantize`` runs first: (profile, rule, copy)."""
    check_choice("backend", backend, ("auto", "torch", "triton"))
    if rule is None:
        profile = check_choice("profile", profile, MX_RULES)
        rule = MX_RULES[profile]
    check_choice("elem_fmt", elem_fmt, MX_ELEM_FORMATS)
    return profile, rule, choose("copy", copy, Copy)


def _make_plan(profile, elem_fmt, mode, copy, rule, backend):
    """The argument checks of ``quantize`` (same order), then the plan: the profile name."""
    profile, rule, copy = _check_args(profile, elem_fmt, copy, rule, backend)
    fits = (backend != "torch" and rule == MX_RULES["ocp_mx_floor"]
            and elem_fmt == "float4_e2m1fn" and mode_arg(mode) is Mode.RNE
            and copy is Copy.ROWWISE)
    return profile if fits else None


def _fused_input(x) -> bool:
    """x is one the fused kernel takes (else the full path checks it and says why not)."""
    return (isinstance(x, torch.Tensor) and x.dtype in INPUT_DTYPES and x.dim() == 2
            and x.shape[1] % 32 == 0 and x.numel() > 0 and tq().available(x))


def quantize(x: torch.Tensor, profile="ocp_mx_floor", elem_fmt: str = "float4_e2m1fn", *,
             mode="rne", rbits=None, nbits=None, copy: str = "rowwise",
             rule: MXRule | None = None, backend: str = "auto") -> BlockScaledTensor:
    """Fast twin of ``reference.recipes.mx.quantize``.  ``backend``: auto (fused Triton
    kernel on CUDA for ocp_mx_floor MXFP4 RNE rowwise), torch, or triton."""
    if rbits is None and nbits is None:   # the fused path, its argument checks cached
        plan = _fused_plan(profile, elem_fmt, mode, copy, rule, backend)
        if plan is not None and _fused_input(x):
            qp, sc = tq().mx_floor_e2m1(x)
            M, K = x.shape
            return BlockScaledTensor._fused((M, K), qp, sc, "float8_e8m0fnu", (1, 32), plan)
    profile, rule, copy = _check_args(profile, elem_fmt, copy, rule, backend)
    check_input(x)
    mode = mode_arg(mode)
    if mode not in (Mode.RNE, Mode.RNA, Mode.SR):
        raise ValueError(f"mode: {mode.name} is not supported; valid choices: RNE, RNA, SR")
    spec = get_format(elem_fmt)
    B = rule.block
    rows, cols = (x.shape[1], x.shape[0]) if copy is Copy.COLUMNWISE else tuple(x.shape)
    if cols % B:
        raise ValueError(f"x: last dimension {cols} is not a multiple of the MX block {B} "
                         f"(profile {profile} does not pad; valid: multiples of {B})")
    rb = check_rbits(rbits, nbits, (rows, cols), mode is Mode.SR, mode.name)
    if _triton_ok(x, rule, elem_fmt, mode, copy, backend):
        # before any torch op on x: the fused kernel reads x itself; codes stay packed
        qp, sc = tq().mx_floor_e2m1(x)
        return BlockScaledTensor._fused((rows, cols), qp, sc, "float8_e8m0fnu", (1, B),
                                        profile)
    xf = x.to(torch.float32)
    if copy is Copy.COLUMNWISE:
        xf = xf.t().contiguous()
    xb = xf.view(rows, cols // B, B)
    amax = E.canon_nan(torch.amax(torch.abs(xb), -1)) if xb.numel() else \
        torch.zeros((rows, cols // B), device=x.device)
    nb = nbits if mode is Mode.SR else None
    if rule.data_path is DataPath.EXACT:
        sc, codes = _exact_path(xb, amax, spec, rule, elem_fmt, mode, rb, nb)
    else:
        sc, data = _upstream_scales(xb, amax, spec, rule)
        codes = _upstream_codes(data.reshape(rows, cols), rule, elem_fmt, spec, mode, rb, nb)
    return BlockScaledTensor((rows, cols), codes.contiguous(), elem_fmt, sc.contiguous(),
                             "float8_e8m0fnu", (1, B), profile=profile)


def _exact_path(xb, amax, spec, rule, elem_fmt, mode, rb, nbits):
    """(E8M0 codes, element codes) by the exact data path: q = x / 2**e rounded exactly."""
    rows, nblk, B = xb.shape
    special = (~torch.isfinite(xb)).any(-1) if xb.numel() else torch.zeros_like(amax, dtype=torch.bool)
    fin_amax = torch.where(special, torch.zeros_like(amax), amax)
    e = _exact_exponent(fin_amax, spec, rule)
    sc = (e + 127).to(torch.uint8)
    q = xb.to(torch.float64) * torch.ldexp(torch.ones_like(e, dtype=torch.float64), -e)[..., None]
    q = torch.where(special[..., None], torch.zeros_like(q), q)
    codes = E.rne_signed(q.reshape(rows, nblk * B), elem_fmt, mode, rb, nbits,
                         "nan" if spec.has_nan else "zero")
    if rule.specials is BlockSpecials.NAN_SCALE:
        sc = torch.where(special, torch.full_like(sc, 0xFF), sc)
        fill = spec.nan_code if spec.has_nan else 0
        codes = torch.where(special.repeat_interleave(B, -1), torch.full_like(codes, fill), codes)
    elif rule.specials is not BlockSpecials.UPSTREAM:
        unreachable("specials", rule.specials)
    return sc, codes


def _upstream_scales(xb, amax, spec, rule):
    """(E8M0 codes, FP32 data) by an upstream data path (reference.recipes.mx
    _torchao_rceil / _torchao_floor_family)."""
    fmax = float(spec.max_finite)
    if rule.scale_mode is ScaleMode.RCEIL:
        d = amax / fmax
        safe = torch.where(torch.isfinite(d) & (d > 0), d, torch.ones_like(d))
        code = torch.clamp(_ceil_log2_rule(safe, rule.log2), -127, 127) + 127
        code = torch.where(d == 0, torch.zeros_like(code), code)
        code = torch.where(torch.isinf(d), torch.full_like(code, 254), code)
        code = torch.where(torch.isnan(d), torch.full_like(code, 255), code)
        data = torch.clamp(xb * _rceil_rcp(code, d, rule.data_path)[..., None], -fmax, fmax)
        return code.to(torch.uint8), data
    if rule.scale_mode not in (ScaleMode.FLOOR, ScaleMode.CEIL, ScaleMode.EVEN):
        unreachable("scale_mode", rule.scale_mode)
    isnan = torch.isnan(amax)
    b = E.f32_bits(amax)
    b = torch.where(isnan, torch.full_like(b, 0x7FC00000), b)
    if rule.scale_mode is ScaleMode.EVEN:
        b = torch.where(isnan, b, (b + (1 << (23 - spec.man_bits - 1))) & 0xFF800000)
    extracted = ((b >> 23) & 0xFF) - 127
    if rule.scale_mode is ScaleMode.CEIL:
        extracted = extracted + ((b & 0x7FFFFF) > 0).to(torch.int64)
    unb = torch.clamp(extracted - spec.emax, -127, 128)
    code = torch.where(isnan, torch.full_like(unb, 255), unb + 127)
    scale = torch.clamp(E.from_f32_bits(code << 23), min=2.0 ** -126)
    data = xb / scale[..., None]
    if spec.nbits == 8:
        data = torch.clamp(data, -fmax, fmax)
    return code.to(torch.uint8), data


def _rceil_rcp(code, d, data_path):
    """The reciprocal scale an upstream RCEIL path multiplies by (2**(127-code) mostly)."""
    pw = E.from_f32_bits(torch.where(code >= 254, (1 << 22) >> (code - 254),
                                     (254 - code) << 23))  # 2**(127-code), exact
    if data_path is DataPath.TORCHAO:
        return torch.where(code == 255, d, torch.where(code == 0, torch.ones_like(d), pw))
    if data_path is DataPath.PYTORCH_TEST:
        return torch.where(code == 0, torch.ones_like(d), pw)
    unreachable("data_path", data_path)


def _upstream_codes(data, rule, elem_fmt, spec, mode, rb, nbits):
    """Element codes of an upstream data path (reference.recipes.mx._elem_code)."""
    how = rule.elem_cast
    if how is ElemCast.RNE or mode is not Mode.RNE:
        return E.rne_signed(data, elem_fmt, mode, rb, nbits, "nan" if spec.has_nan else "zero")
    if how is ElemCast.PYTORCH_TEST:
        if spec.nbits == 4:
            data = E.bf16_torch(data)
    elif how is not ElemCast.TORCHAO:
        unreachable("elem_cast", how)
    if spec.nbits == 8:
        return E.torch_fp8(data, elem_fmt)
    return E.torchao_floatx(data, elem_fmt)
