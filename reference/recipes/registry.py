"""The one profile registry: every recipe profile, its rule and its exact entry point.

``RECIPE_PROFILES[name]`` is a frozen ``RecipeProfile``: which rule a quantizer
implements, its family, the exact rule record, where it comes from, the
conformance cell (third-party implementation) it is checked against, and
``exact``, the exact quantizer that runs it (None for the FP8 tensor-scale rules,
which are not quantizers).  The fast quantizers keep their own table keyed by the
same names (``fp4ref.quant.FAST_QUANTIZERS``), checked at import to cover it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..rounding import Mode
from . import fusion, mx, nvfp4, quartet
from .mx import MX_RULES
from .nvfp4 import NVFP4_RULES
from .rules import Family, Pad, choose
from .ue5m3 import UE5M3_RULE

__all__ = ["RecipeProfile", "RECIPE_PROFILES"]


@dataclass(frozen=True)
class RecipeProfile:
    name: str
    family: Family
    rule: object       # the family's frozen rule record (None where the function is the rule)
    summary: str       # the exact definition in one paragraph
    source: str        # upstream code / paper it reproduces
    cell: str | None   # conformance implementation it is checked against (None: no public code here)
    pad: Pad           # ZERO (pads to the tile with +0) or RAISE
    # the exact quantizer: exact(x, **kw) -> BlockScaled; None: a tensor-scale rule
    exact: Callable | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "family", choose("family", self.family, Family))
        object.__setattr__(self, "pad", choose("pad", self.pad, Pad))
        if (self.exact is None) != (self.family is Family.FP8_SCALING):
            raise ValueError(f"exact: profile {self.name!r} of family {self.family} needs an "
                             "exact quantizer (None only for fp8_scaling, a tensor-scale rule)")


# --- exact entry points ----------------------------------------------------------------
def _two_level(name: str, rule):
    def run(x, **kw):
        return nvfp4.quantize(x, rule, profile=name, **kw)
    return run


def _mx(name: str, rule, default_mode=None):
    def run(x, **kw):
        if default_mode is not None:
            kw.setdefault("mode", default_mode)
        return mx.quantize(x, rule, kw.pop("elem_fmt", "float4_e2m1fn"), profile=name, **kw)
    return run


def _two_level_profile(name, family, rule, summary, source, cell, pad) -> RecipeProfile:
    return RecipeProfile(name, family, rule, summary, source, cell, pad, _two_level(name, rule))


_TE_STEPS = ("S_enc = min(fl(fl(T*6)/amax), FLT_MAX) (T = 448); s = fl(vec_max * fl(S_enc * "
             "fl(1/6))), min FLT_MAX, clamp 448, e4m3 RNE; enc = min(fl(1/fl(s * fl(1/S_enc))),"
             " FLT_MAX); q = e2m1(clamp(fl(x * enc), +-6))")


def _te_profiles() -> list[RecipeProfile]:
    P, R = _two_level_profile, NVFP4_RULES
    return [
        P("te_nvfp4", Family.NVFP4, R["te_nvfp4"],
          _TE_STEPS + "; S_enc = 1 when amax == 0 or S_enc == 0; cvt.rn.satfinite (sign of zero "
          "kept; NaN -> +6, unverified); tiles 1x16 / 16x16; SR with explicit bits for dY",
          "SPEC 3.1 (TE CUDA kernel, current)", None, Pad.ZERO),
        P("te_nvfp4_2509", Family.NVFP4, R["te_nvfp4_2509"],
          "as te_nvfp4 but s = fl(fl(vec_max / 6) * S_enc) (divide first)",
          "SPEC 3.1 (TE 2025-09)", None, Pad.ZERO),
        P("te_nvfp4_ref", Family.NVFP4, R["te_nvfp4_ref"],
          _TE_STEPS + "; amax == 0 keeps S_enc = FLT_MAX; e2m1 by TE's interval table: -0 and "
          "NaN -> code 0", "transformer_engine 2.20.2 reference_nvfp4.NVFP4QuantizerRef",
          "te_ref_nvfp4", Pad.ZERO),
        P("te_nvfp4_ref_rht", Family.NVFP4, R["te_nvfp4_ref_rht"],
          "te_nvfp4_ref; columnwise copies first get RHT16: bf16(x_signs @ H16 / 4), exact sum "
          "rounded once (TE's fixed signs)", "transformer_engine 2.20.2 (with_rht=True)",
          "te_ref_nvfp4_rht", Pad.ZERO),
        P("te_nvfp4_rht", Family.NVFP4, R["te_nvfp4_rht"],
          "te_nvfp4 with RHT16 on columnwise copies", "SPEC 3.1", None, Pad.ZERO),
        P("te_nvfp4_4over6", Family.NVFP4, R["te_nvfp4_4over6"],
          "S_enc = fl(fl(256*6)/amax); base = fl(fl(vec_max/6) * S_enc); map-4 scale e4m3("
          "fl(base*1.5)), map-6 scale e4m3(base); per row err = sum_f32 |fl(fl(fl(q*s)*amax)/"
          "1536) - x| (16x16: tree sum of rows); map-4 iff err4 < err6",
          "transformer_engine 2.20.2 (nvfp4_use_4over6, MAE, e4m3 max 256)",
          "te_ref_nvfp4_4over6", Pad.ZERO),
        P("te_nvfp4_4over6_mse", Family.NVFP4, R["te_nvfp4_4over6_mse"],
          "te_nvfp4_4over6 with squared errors", "transformer_engine 2.20.2 (MSE)",
          "te_ref_nvfp4_4over6_mse", Pad.ZERO),
    ]


def _other_two_level_profiles() -> list[RecipeProfile]:
    P, R = _two_level_profile, NVFP4_RULES
    return [
        P("torchao_nvfp4", Family.NVFP4, R["torchao_nvfp4"],
          "pts = fl(amax/2688) (or given); s = e4m3(clamp(fl(fl(vec_max/6)/pts), 2**-6, 448)); q ="
          " bittrick_e2m1(clamp(fl(x * fl(fl(1/pts)/s)), +-6)); all-zero tensor -> NaN scales",
          "torchao 0.18 nvfp4_quantize (two-level)", "torchao_nvfp4", Pad.RAISE),
        P("torchao_nvfp4_1level", Family.NVFP4, R["torchao_nvfp4_1level"],
          "s = e4m3(clamp(fl(vec_max/6), 2**-6, 448)); q = bittrick_e2m1(clamp(fl(x * fl(1/s)), "
          "+-6))", "torchao 0.18 nvfp4_quantize (one-level)", "torchao_nvfp4_1level", Pad.RAISE),
        P("pytorch_test_nvfp4", Family.NVFP4, R["pytorch_test_nvfp4"],
          "s = e4m3(min(fl(vec_max/6), 448)); q = e2m1(bf16(clamp(fl(x / s), +-6))); zero scale "
          "-> +0 data (our choice)", "SPEC 3.1 (PyTorch test reference; test file not shipped: "
          "not checked)", None, Pad.RAISE),
        P("ue5m3", Family.UE5M3, UE5M3_RULE,
          "S_enc = min(fl(fl(T*6)/amax_cached), FLT_MAX) (1 at amax 0); s = ue5m3_rne(clamp("
          "fl(vec_max * fl(S_enc*fl(1/6))), 61440)), code 0 -> 1.0; q = e2m1(clamp(fl(x*enc),"
          " +-6)), RNE (SR for dY); B = 16 or 32, 16x16 weights", "UE5M3 paper (our reading)",
          None, Pad.ZERO),
    ]


def _quartet_fusion_profiles() -> list[RecipeProfile]:
    P = RecipeProfile
    return [
        P("quartet_fwd", Family.QUARTET, None,
          "H32 (f32 butterflies) -> e = floor_log2(fl(fl(fl(rms*2.92247856)/6)+1e-8)), rms = "
          "sqrt_f32(fl(sum_f32(y*y)/32)); e2m1 nearest ties-to-zero of y/2**e; mask |y/2**e| < 6",
          "Quartet / QuEST (SPEC 3.4)", None, Pad.RAISE, quartet.quest_forward),
        P("quartet_bwd", Family.QUARTET, None,
          "H32 with caller signs; s = fl(2**floor_log2(amax)/3) (float32 scale); SR_e2m1(fl(y/s))",
          "Quartet (SPEC 3.4)", None, Pad.RAISE, quartet.quartet_backward),
        P("fusion_cta_nvfp4", Family.FUSION, NVFP4_RULES["te_nvfp4"],
          "te_nvfp4 with amax = the CTA tile's amax; one FP32 decode scale per tile",
          "Format-aware fusion (SPEC 3.5)", None, Pad.RAISE, fusion.cta_nvfp4),
        P("fusion_row_sr_mxfp4", Family.FUSION, MX_RULES["ocp_mx_floor"],
          "ocp_mx_floor MXFP4 of gradient rows with SR elements", "Format-aware fusion", None,
          Pad.RAISE, fusion.row_sr_mxfp4),
        P("fusion_h32_mxfp4", Family.FUSION, MX_RULES["ocp_mx_floor"],
          "fixed-sign H32 (f32 butterflies) then ocp_mx_floor MXFP4", "Format-aware fusion", None,
          Pad.RAISE, fusion.h32_mxfp4),
    ]


# MX profiles: (summary, source, conformance cell) per MX_RULES name
_MX_TEXT = {
    "ocp_mx_floor": ("e = floor_log2(amax) - emax_elem (exact), clamp [-127,127]; q = "
                     "round(x/2**e) saturating; NaN/Inf block -> scale 0xFF, codes NaN/+0",
                     "OCP MX v1.0", None),
    "ocp_mx_ceil": ("e = ceil_log2(amax) - emax_elem, else as ocp_mx_floor", "SPEC 3.2", None),
    "ocp_mx_even": ("amax rounded (ties away) to the element mantissa width, then floor",
                    "SPEC 3.2", None),
    "ocp_mx_rceil": ("e = ceil_log2(fl(amax / elem_max)) (exact binade)", "SPEC 3.2 / cuBLAS",
                     None),
    "torchao_mx_floor": ("exponent bits of the f32 amax - emax; q = fl(x / max(2**e, 2**-126)) "
                         "(code-0 blocks divided by 2**-126); Inf amax -> finite scale "
                         "2**(128-emax); NaN -> 0xFF and x/inf data", "torchao 0.18 to_mx FLOOR",
                         "torchao_mx_floor"),
    "torchao_mx_ceil": ("as torchao_mx_floor, +1 when the amax mantissa is non-zero",
                        "torchao 0.18 to_mx CEIL", "torchao_mx_ceil"),
    "torchao_mx_even": ("as torchao_mx_floor after (bits + 2**(22-mbits)) & 0xFF800000",
                        "torchao 0.18 to_mx EVEN", "torchao_mx_even"),
    "torchao_mx_rceil": ("e = ceil(RN_f32(log2 fl(amax/elem_max))) (torch.log2: a descale "
                         "just above 2**k gives 2**k); q = fl(x * rcp), rcp = 1 at code 0, "
                         "2**-127 for Inf (code 254), NaN for NaN (255)",
                         "torchao 0.18 to_mx RCEIL", "torchao_mx_rceil"),
    "pytorch_test_mx": ("torchao_mx_rceil arithmetic without the Inf case (rcp = 2**(127-code), "
                        "1 at code 0); float4 elements rounded to bf16 first",
                        "torch.testing._internal.common_quantized.to_mxfp (torch 2.13)",
                        "pytorch_test_mx"),
}
# microxcaling: ocp_mx_floor with RNA elements by default
MICROXCALING_RULE = mx.MXRule("floor", "exact", "exact", "rne", "nan_scale")


def _mx_profiles() -> list[RecipeProfile]:
    if set(_MX_TEXT) != set(MX_RULES):
        raise ValueError(f"MX_RULES and their profile texts differ: "
                         f"{sorted(set(_MX_TEXT) ^ set(MX_RULES))}")
    return [RecipeProfile(k, Family.MX, MX_RULES[k], summ, src, cell, Pad.RAISE,
                          _mx(k, MX_RULES[k]))
            for k, (summ, src, cell) in _MX_TEXT.items()]


def _fp8_scaling_profiles() -> list[RecipeProfile]:
    P = RecipeProfile
    return [
        P("te_fp8_current", Family.FP8_SCALING, None,
          "scale = fp8_max / amax (FP32 RNE division); amax 0, inf or NaN -> 1.0; inf -> "
          "FLT_MAX; pow2: mantissa truncated", "SPEC 3.6 (TE kernel)", None, Pad.ZERO),
        P("te_fp8_current_ref", Family.FP8_SCALING, None,
          "amax = max(amax, eps); scale = fl(fp8_max / amax); inf -> the input dtype's max; "
          "pow2: 2**(frexp exponent - 1) (NaN amax -> 0.5), 0 for amax inf; amax 0 -> 1; "
          "NaN amax -> NaN", "transformer_engine 2.20.2 reference_current_scaling",
          "te_current_scaling", Pad.ZERO),
        P("te_fp8_delayed", Family.FP8_SCALING, None,
          "amax = max(history) (or most recent); sf = fl(fl(fp8_max/amax)/2**margin); keep "
          "the previous scale unless amax > 0 and finite; inf -> FLT_MAX; history rolls by "
          "one, slot 0 reset to 0", "transformer_engine 2.20.2 quantization."
          "_amax_and_scale_update (not importable here: its module needs onnxscript)",
          None, Pad.ZERO),
    ]


def _build() -> dict[str, RecipeProfile]:
    out = (_te_profiles() + _other_two_level_profiles() + _quartet_fusion_profiles()
           + _mx_profiles() + _fp8_scaling_profiles())
    out.append(RecipeProfile(
        "microxcaling", Family.MX, MICROXCALING_RULE,
        "ocp_mx_floor with RNA elements (microxcaling's default round='nearest' is ties-away)",
        "microsoft/microxcaling (not installed: not checked)", None, Pad.RAISE,
        _mx("microxcaling", MICROXCALING_RULE, Mode.RNA)))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"RECIPE_PROFILES: duplicate names in {names}")
    return {p.name: p for p in out}


RECIPE_PROFILES: Mapping[str, RecipeProfile] = _build()
