"""NVFP4-style two-level quantization, torch (CPU/CUDA), bit-identical to
``reference.recipes.nvfp4``: the same FP32 operations in the same order."""
from __future__ import annotations

import functools
from fractions import Fraction

import torch

from reference.errors import check_choice
from reference.exact import exact
from reference.formats import get_format
from reference.recipes import f32 as F
from reference.recipes.common import check_tile, check_target
from reference.recipes.nvfp4 import NVFP4_RULES, TE_RHT_SIGNS, TwoLevelRule, hadamard_matrix
from reference.rounding import Mode, Policy
from fp4ref import cast
from . import _elem as E
from ._common import (mode_arg, tq, FLT_MAX, INPUT_DTYPES, cached_plan, check_input,
                      check_rbits, f32_scalar, pad2d)
from .blocked import BlockScaledTensor

__all__ = ["quantize", "quantize_packed", "rht16"]


@functools.lru_cache(maxsize=256)
def _fconst(v) -> float:   # cached: ~10 us of exact arithmetic per call on a launch-bound path
    return float(F.f32(exact(v)))


def _blocks(x: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    R, C = x.shape
    return x.view(R // bm, bm, C // bk, bk)


def _amax(x: torch.Tensor, dims) -> torch.Tensor:
    return E.canon_nan(torch.amax(torch.abs(x), dim=dims))


def rht16(x: torch.Tensor, signs=TE_RHT_SIGNS, accum: str = "exact") -> torch.Tensor:
    """bf16((x * signs) @ H16 / 4) along rows in groups of 16, one rounding of the exact sum.

    float64 accumulation is exact when a group's non-zero terms span few enough binades;
    other groups (rare) go through the exact reference."""
    R, C = x.shape
    if C % 16:
        raise ValueError(f"x: inner dimension {C} is not a multiple of the Hadamard size 16")
    check_choice("rht_accum", accum, ("exact",))
    x32 = x.to(torch.float32)
    H = torch.tensor(hadamard_matrix(16), dtype=torch.float64, device=x.device)
    S = torch.tensor(signs, dtype=torch.float64, device=x.device)
    M = (S[:, None] * H) * 0.25
    g = x32.to(torch.float64).view(R, C // 16, 16)
    y = g @ M
    # exactness: every term is x_i/4 (<= 24 significant bits); 16 of them sum exactly in
    # float64 when max_exp - min_exp of the non-zero finite terms <= 53 - 24 - 5
    fin = torch.isfinite(g) & (g != 0)
    ex = torch.frexp(torch.where(fin, g, torch.ones_like(g))).exponent
    big = torch.where(fin, ex, torch.full_like(ex, -10_000)).amax(-1)
    small = torch.where(fin, ex, torch.full_like(ex, 10_000)).amin(-1)
    bad = fin.any(-1) & ((big - small) > 24)
    special = (~torch.isfinite(g)).any(-1)
    out = cast.round_to(y.reshape(R, C), "bfloat16", Mode.RNE).to(torch.float32)
    fix = (bad | special).nonzero().tolist()
    if fix:
        xs = x32.to(torch.float64).cpu()
        for r, gi in fix:
            bits = _rht_group_exact(xs[r, gi * 16:(gi + 1) * 16].tolist(), signs)
            out[r, gi * 16:(gi + 1) * 16] = E.from_f32_bits(torch.tensor(bits)).to(out.device)
    return E.canon_nan(out, 0xFFFF0000)


def _rht_group_exact(vals, signs) -> list[int]:
    """One RHT16 group with Python integers: the exact sum rounded once to bf16."""
    import math
    from fractions import Fraction
    from reference.exact import Exact, Kind
    from reference.recipes.nvfp4 import _exact_sum
    H = hadamard_matrix(16)
    if any(math.isnan(v) or math.isinf(v) for v in vals):
        terms_all = None
    out = []
    fin = all(math.isfinite(v) for v in vals)
    if fin:
        mants = []
        for v in vals:
            m, e = math.frexp(v)
            mants.append((int(m * (1 << 53)), e - 53 - 2))  # x/4 = m * 2**(e-53-2)
        emin = min(e for _, e in mants)
        ints = [m << (e - emin) for m, e in mants]
    for j in range(16):
        if fin:
            tot = sum(ints[i] if signs[i] * H[i][j] > 0 else -ints[i] for i in range(16))
            val = Fraction(tot) * Fraction(2) ** emin
            if tot == 0:  # exact zero: -0 only if every term is -0
                neg = all((signs[i] * H[i][j] > 0) == (math.copysign(1, vals[i]) < 0)
                          for i in range(16))
                v = F.NEG_ZERO if neg else F.ZERO
            else:
                v = F.bf16(exact(val))
        else:
            terms = []
            for i in range(16):
                t = exact(vals[i])
                t = t if signs[i] * H[i][j] > 0 else -t
                terms.append(t if not t.is_finite else Exact(Kind.FINITE, t.negative, t.mag / 4))
            v = F.bf16(_exact_sum(terms))
        out.append(F.bits(v))
    return out


def _scale_cast(s: torch.Tensor, fmt: str):
    """FP32 block scale -> (codes, float32 value as the next FP32 step sees it)."""
    if fmt in ("ue4m3", "float8_e4m3fn"):
        s8 = s.to(torch.float8_e4m3fn)
        return s8.view(torch.uint8), s8.to(torch.float32)
    pol = Policy.make(overflow="satfinite", inf="saturate", nan="canonical")
    c = cast.quantize(s, fmt, Mode.RNE, pol)
    return c, cast.dequantize(c, fmt)


def _elem(q, rule, mode, rbits, nbits):
    if rule.elem_cast == "te_ref" and mode is Mode.RNE:
        return E.te_ref_fp4(q)
    if rule.elem_cast == "torchao" and mode is Mode.RNE:
        return E.torchao_floatx(q, "float4_e2m1fn")
    return E.rne_signed(q, "float4_e2m1fn", mode, rbits, nbits, rule.elem_nan)


def _rule_fits(rule, tile, mode, copy) -> bool:
    """The fused kernel computes this rule (x aside)."""
    return (rule.tensor_scale == "te" and rule.block_scale == "te_mul" and rule.encode == "te"
            and rule.elem_cast == "rne" and rule.elem_nan == "max" and not rule.four_over_six
            and rule.pre_round is None and rule.scale_lo is None
            and rule.scale_fmt in ("ue4m3", "ue5m3") and tuple(tile) == (1, 16)
            and mode is Mode.RNE and copy == "rowwise")


def _fused_input(x) -> bool:
    """x is one the fused kernel takes (else the full path checks it and says why not)."""
    return (isinstance(x, torch.Tensor) and x.dtype in INPUT_DTYPES and x.dim() == 2
            and x.shape[1] % 16 == 0 and x.numel() > 0 and tq().available(x))


def _triton_ok(x, rule, tile, mode, copy, backend) -> bool:
    TQ = tq()
    fits = _rule_fits(rule, tile, mode, copy) and x.shape[1] % 16 == 0
    if backend == "triton" and not (fits and TQ.available(x)):
        raise ValueError("backend: triton needs CUDA, triton, a te_nvfp4 / ue5m3 rule with 1x16 "
                         "blocks, RNE, rowwise and a last dimension divisible by 16; valid "
                         "choices: auto, torch, triton")
    return backend != "torch" and fits and TQ.available(x)


def s_enc_params(g_amax: torch.Tensor, Tf: float, zero_amax: str = "one"):
    """(S_enc, fl(1/S_enc), fl(S_enc * fl(1/6))) as the te rule computes them."""
    dev = g_amax.device
    one = E.f32_const(1.0, dev)         # cached constants: these scalar steps are launch-bound
    s_enc = E.tmin(E.f32_const(_fconst(Tf * 6), dev) / g_amax, FLT_MAX)
    z = ((s_enc == 0) | (g_amax == 0)) if zero_amax == "one" else (s_enc == 0)
    s_enc = torch.where(z, one, s_enc)
    sixth = E.const("1/6", dev, lambda: torch.reciprocal(torch.full((), 6.0, device=dev)))
    return s_enc, one / s_enc, s_enc * sixth


def _two_level_triton(x, rule, Tf, amax):
    """Fused path: (packed codes, scale codes, [mult, dec, S_enc, amax]).  bf16: two
    launches for current scaling (torch max|x|; quantize, which computes s_enc_params
    itself), one with amax; other dtypes: three (amax partials; amax and s_enc_params;
    quantize), two with amax."""
    return tq().two_level_1x16_amax(x, _amax_arg(x, amax), _fconst(Tf * 6),
                                    rule.zero_amax == "one", rule.scale_fmt,
                                    rule.zero_scale_to_one)


def _amax_arg(x, amax):
    """amax as the fused kernel takes it: None, or a float32 0-dim tensor on x's device (one
    given so passes as it is: no view op, each costs host time on the launch-bound path)."""
    if amax is None:
        return None
    if type(amax) is torch.Tensor and amax.dtype == torch.float32 and amax.dim() == 0 \
            and amax.get_device() == x.get_device():
        return amax
    return f32_scalar(amax, x.device, "amax")


def _target_f32(T) -> float:
    """fl(T) of a checked block-scale target; plain numbers cached (exact arithmetic costs
    ~10 us, as much as the fused kernel's launch)."""
    if type(T) in (int, float, Fraction):
        return _target_cached(T)
    return _fconst(check_target(T))


@functools.lru_cache(maxsize=64)
def _target_cached(T) -> float:
    return _fconst(check_target(T))


def _quantize_triton(x, plan, amax) -> BlockScaledTensor:
    """The public fused path: one kernel (plus torch's max|x| for current scaling), no host
    sync; the codes stay packed as the kernel wrote them (unpacked on first ``.codes``),
    tensor_scale and meta are views of the kernel's par made on first access."""
    profile, c, zero_amax_one, sfmt, zero_scale_one = plan
    qp, sc, par = tq().two_level_1x16_amax(x, _amax_arg(x, amax), c, zero_amax_one, sfmt,
                                           zero_scale_one)
    M, K = x.shape
    return BlockScaledTensor._fused((M, K), qp, sc, sfmt, (1, 16), profile, par)


_PLANS: dict = {}
_PLAIN = (type(None), int, float, Fraction)   # target types cached by value


def _fused_plan(profile, rule, tile, mode, target, copy, backend):
    """(profile, c = fl(T * 6), zero_amax_one, scale_fmt, zero_scale_to_one) when these
    arguments select the fused kernel (input aside), else None; cached per argument set:
    validating them (check_choice, check_tile, parse_mode, fl(T)) costs more host time than
    the kernel's launch.  Invalid arguments give None: the full path raises their error."""
    if type(tile) is not tuple or type(target) not in _PLAIN or type(mode) not in (str, Mode):
        return None     # (a tensor target could change in place: never cached)
    return cached_plan(_PLANS, (profile, id(rule), tile, mode, type(target), target, copy,
                                backend),
                       lambda: _make_plan(profile, rule, tile, mode, target, copy, backend),
                       rule)


def _make_plan(profile, rule, tile, mode, target, copy, backend):
    """The argument checks of ``quantize`` (same order), then the fused kernel's plan."""
    check_choice("backend", backend, ("auto", "torch", "triton"))
    if rule is None:
        profile = check_choice("profile", profile, NVFP4_RULES)
        rule = NVFP4_RULES[profile]
    check_choice("copy", copy, ("rowwise", "columnwise"))
    bm, bk = check_tile(tile, rule.tiles)
    mode = mode_arg(mode)
    if backend == "torch" or not _rule_fits(rule, (bm, bk), mode, copy):
        return None
    Tf = _target_f32(rule.target if target is None else target)
    return (profile, _fconst(Tf * 6), rule.zero_amax == "one", rule.scale_fmt,
            rule.zero_scale_to_one)


def quantize_packed(x: torch.Tensor, profile="te_nvfp4", *, amax=None, target=None,
                    rule: TwoLevelRule | None = None):
    """``quantize(..., backend="triton")`` (1x16, RNE, rowwise) without unpacking the codes:
    (packed codes uint8 [M, K/2] (low nibble first), scale codes uint8 [M, K/16],
    float32 [4] = [fl(S_enc * fl(1/6)), fl(1/S_enc) (the tensor scale), S_enc, amax]).
    amax None: current scaling.  No host sync; same bits as ``quantize``."""
    if rule is None:
        profile = check_choice("profile", profile, NVFP4_RULES)
        rule = NVFP4_RULES[profile]
    check_input(x)
    _triton_ok(x, rule, (1, 16), Mode.RNE, "rowwise", "triton")   # raises where it does not apply
    return _two_level_triton(x, rule, _target_f32(rule.target if target is None else target),
                             amax)


def quantize(x: torch.Tensor, profile="te_nvfp4", *, tile=(1, 16), amax=None, tensor_scale=None,
             target=None, mode="rne", rbits=None, nbits=None, copy: str = "rowwise",
             rule: TwoLevelRule | None = None, backend: str = "auto") -> BlockScaledTensor:
    """Fast twin of ``reference.recipes.nvfp4.quantize`` (same arguments).  ``backend``:
    auto (fused Triton kernel on CUDA where it applies), torch, or triton."""
    if rbits is None and nbits is None:   # the fused path, its argument checks cached
        plan = _fused_plan(profile, rule, tile, mode, target, copy, backend)
        if plan is not None and _fused_input(x):
            return _quantize_triton(x, plan, amax)
    check_choice("backend", backend, ("auto", "torch", "triton"))
    if rule is None:
        profile = check_choice("profile", profile, NVFP4_RULES)
        rule = NVFP4_RULES[profile]
    check_input(x)
    check_choice("copy", copy, ("rowwise", "columnwise"))
    bm, bk = check_tile(tile, rule.tiles)
    mode = mode_arg(mode)
    if mode not in (Mode.RNE, Mode.SR):
        raise ValueError(f"mode: {mode.name} is not supported; valid choices: RNE, SR")
    if _triton_ok(x, rule, (bm, bk), mode, copy, backend):
        # before any torch op on x: the fused kernel reads x itself (no float32 copy)
        check_rbits(rbits, nbits, tuple(x.shape), False, mode.name)
        Tf = _target_f32(rule.target if target is None else target)
        return _quantize_triton(x, (profile, _fconst(Tf * 6), rule.zero_amax == "one",
                                    rule.scale_fmt, rule.zero_scale_to_one), amax)
    dev = x.device
    xf = x.to(torch.float32)
    if copy == "columnwise":
        xf = rht16(x.t().contiguous(), accum=rule.rht_accum) if rule.rht_columnwise \
            else xf.t().contiguous()
    rows, cols = xf.shape
    if rule.pad == "raise" and (rows % bm or cols % bk):
        raise ValueError(f"x: shape {rows}x{cols} is not a multiple of the {bm}x{bk} block; "
                         f"profile {profile} does not pad (valid: multiples of {bm}x{bk})")
    rb = check_rbits(rbits, nbits, (rows, cols), mode is Mode.SR, mode.name)
    Tf = _target_f32(rule.target if target is None else target)
    xp = pad2d(xf, bm, bk)
    R, C = xp.shape
    if rb is not None:
        rb = pad2d(rb.to(torch.int64), bm, bk)
    g_amax = f32_scalar(amax, dev, "amax") if amax is not None else \
        E.canon_nan(torch.amax(torch.abs(xp)) if xp.numel() else torch.zeros((), device=dev))
    one = torch.ones((), dtype=torch.float32, device=dev)
    six = torch.full((), 6.0, dtype=torch.float32, device=dev)
    meta = {"amax": g_amax}
    ts = s_enc = None
    if rule.tensor_scale == "te":
        s_enc, ts, _ = s_enc_params(g_amax, Tf, rule.zero_amax)
        meta["s_enc"] = s_enc
    elif rule.tensor_scale == "torchao":
        ts = f32_scalar(tensor_scale, dev, "tensor_scale") if tensor_scale is not None else \
            g_amax / torch.full((), 2688.0, device=dev)
    elif tensor_scale is not None:
        raise ValueError("tensor_scale: this profile has no per-tensor scale")
    sfmt = rule.scale_fmt
    smax = float(get_format(sfmt).max_finite)
    xb = _blocks(xp, bm, bk)
    vmax = _amax(xb, (1, 3)) if xp.numel() else torch.zeros((R // bm, C // bk), device=dev)
    if rule.four_over_six:
        codes, sc = _four_over_six(xb, vmax, rule, g_amax, Tf)
    else:
        if rule.block_scale == "te_mul":
            s = vmax * (s_enc * torch.reciprocal(six))
        elif rule.block_scale == "div_first":
            s = (vmax / six) * s_enc
        elif rule.block_scale == "torchao":
            s = (vmax / six) / ts
        else:
            s = vmax / six
        if rule.scale_lo is not None:
            s = torch.clamp(s, min=float(rule.scale_lo), max=smax)
        else:
            s = torch.clamp(E.tmin(s, FLT_MAX), -smax, smax)
        sc, sf = _scale_cast(s, sfmt)
        if rule.zero_scale_to_one:
            z = sf == 0
            one_code = get_format(sfmt).encode_magnitude(Fraction(1))
            sc = torch.where(z, torch.full_like(sc, one_code), sc)
            sf = torch.where(z, one, sf)
        sfe = sf[:, None, :, None]
        if rule.encode == "te":
            mult = E.tmin(one / (sfe * ts), FLT_MAX)
            q = xb * mult
        elif rule.encode == "torchao2":
            q = xb * ((one / ts) / sfe)
        elif rule.encode == "torchao1":
            q = xb * (one / sfe)
        else:
            q = torch.where(sfe == 0, torch.zeros_like(xb), xb / sfe)
        q = torch.clamp(q, -6.0, 6.0).reshape(R, C)
        if rule.pre_round == "bfloat16":
            q = E.bf16_torch(q)
        codes = _elem(q, rule, mode, rb, nbits if mode is Mode.SR else None)
    return BlockScaledTensor((rows, cols), codes[:rows, :cols].contiguous(), "float4_e2m1fn",
                             sc.contiguous(), sfmt, (bm, bk),
                             None if ts is None else ts.reshape(1, 1), None, profile, meta)


def _four_over_six(xb, vmax, rule, g_amax, Tf):
    dev = xb.device
    nbr, bm, nbc, bk = xb.shape
    six = torch.full((), 6.0, device=dev)
    s_enc = E.tmin(torch.full((), _fconst(Tf * 6), device=dev) / g_amax, FLT_MAX)
    s_enc = torch.where(s_enc == 0, torch.ones_like(s_enc), s_enc)
    dec = torch.ones_like(s_enc) / s_enc  # (python float / tensor is reciprocal * float)
    denom = torch.full((), _fconst(Tf * 6), device=dev)
    base = (vmax / six) * s_enc
    lut = cast.dequantize(torch.arange(16, dtype=torch.uint8, device=dev), "float4_e2m1fn")
    cands = []
    for s in (base * 1.5, base):
        s8 = torch.clamp(s, -448.0, 448.0).to(torch.float8_e4m3fn)
        sf = s8.to(torch.float32)
        sfe = sf[:, None, :, None]
        enc = E.tmin(torch.ones_like(sfe) / (sfe * dec), FLT_MAX)
        q = E.te_ref_fp4(torch.clamp(xb * enc, -6.0, 6.0))
        v = lut[q.to(torch.int64)]
        val = ((v * sfe) * g_amax) / denom
        d = val - xb
        t = d.abs() if rule.four_over_six == "mae" else d * d
        err = torch.zeros(t.shape[:3], device=dev)
        for j in range(bk):
            err = err + t[..., j]
        while err.shape[1] > 1:  # CUDA warp tree order over the tile's rows
            h = err.shape[1] // 2
            err = err[:, :h] + err[:, h:2 * h]
        cands.append((s8.view(torch.uint8), q, err[:, 0, :]))
    (c4, q4, e4), (c6, q6, e6) = cands
    pick = e4 < e6
    sc = torch.where(pick, c4, c6)
    q = torch.where(pick[:, None, :, None], q4, q6)
    return q.reshape(nbr * bm, nbc * bk), sc
