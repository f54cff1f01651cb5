"""Fast quantization recipes (torch, CPU/CUDA), each bit-identical to its exact
twin in ``reference.recipes``; ``RECIPE_PROFILES`` names every rule.

    q = fp4ref.quant.quantize(x, "te_nvfp4", tile=(16, 16))
    q.codes, q.scale_codes, q.tensor_scale, q.packed(), q.swizzled_scales()
"""
from __future__ import annotations

from reference.recipes import RECIPE_PROFILES, RecipeProfile, get_profile, profile_names
from .blocked import BlockScaledTensor, from_swizzled, pack_codes, to_swizzled, unpack_codes

__all__ = ["quantize", "BlockScaledTensor", "RECIPE_PROFILES", "RecipeProfile", "get_profile",
           "profile_names", "to_swizzled", "from_swizzled", "pack_codes", "unpack_codes"]


_MODS: list = []


def _modules():
    """The recipe modules, imported on first use and then held (no import machinery per
    call: the fused Triton paths are launch-bound)."""
    if not _MODS:
        from . import fusion, mx, nvfp4, quartet, ue5m3
        _MODS.append((fusion, mx, nvfp4, quartet, ue5m3))
    return _MODS[0]


def quantize(x, profile, **kw) -> BlockScaledTensor:
    """Run any profile (keywords as its family's ``quantize``; mx: ``elem_fmt``).

    Where a fused Triton kernel applies (CUDA; ``backend="triton"`` or the default "auto"):
    te_nvfp4 / ue5m3 1x16 RNE rowwise and ocp_mx_floor MXFP4, the call is that kernel (plus
    torch's max|x| for current scaling) with no host sync, and the codes stay packed until
    ``.codes`` is read (``.packed()`` is the kernel's buffer)."""
    fusion, mx, nvfp4, quartet, ue5m3 = _modules()
    # a plain name: one dict lookup (get_profile's check lists every name, ~1 us per call)
    p = RECIPE_PROFILES.get(profile) if type(profile) is str else None
    if p is None:
        p = get_profile(profile)
    if p.family == "fp8_scaling":
        raise ValueError(f"profile: {p.name!r} is a tensor-scale rule, not a quantizer; use "
                         "fp4ref.quant.scaling")
    if p.family == "nvfp4":
        return nvfp4.quantize(x, p.name, **kw)
    if p.family == "ue5m3":
        return ue5m3.quantize(x, **kw)
    if p.family == "mx":
        if p.name == "microxcaling":
            kw.setdefault("mode", "rna")
            q = mx.quantize(x, "microxcaling", kw.pop("elem_fmt", "float4_e2m1fn"), rule=p.rule, **kw)
            return q
        return mx.quantize(x, p.name, kw.pop("elem_fmt", "float4_e2m1fn"), **kw)
    if p.name == "quartet_fwd":
        return quartet.quest_forward(x, **kw)
    if p.name == "quartet_bwd":
        return quartet.quartet_backward(x, **kw)
    if p.name == "fusion_cta_nvfp4":
        return fusion.cta_nvfp4(x, **kw)
    if p.name == "fusion_row_sr_mxfp4":
        return fusion.row_sr_mxfp4(x, **kw)
    return fusion.h32_mxfp4(x, **kw)
