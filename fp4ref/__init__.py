"""fp4ref: fast paths proven bit-identical to ``reference``, and the public API.

Thin surface over private modules, imported lazily (torch, Triton and the
third-party libraries load only when a name that needs them is used):

    from fp4ref import quantize, dequantize, Mode, Policy
    codes = quantize(x, "float8_e4m3fn", Mode.RNE)            # element casts
    q = quantize_recipe(x, "te_nvfp4")                       # block-scaled recipes
    y = emulate("probe_matched", a, b, scales_a=sa, scales_b=sb, block=16)
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    # formats and rounding (the exact core)
    "FormatSpec": ("reference.formats", "FormatSpec"),
    "FORMATS": ("reference.formats", "FORMATS"),
    "get_format": ("reference.formats", "get_format"),
    "Mode": ("reference.rounding", "Mode"),
    "Policy": ("reference.rounding", "Policy"),
    "default_policy": ("reference.rounding", "default_policy"),
    "CAST_PROFILES": ("reference.profiles", "CAST_PROFILES"),
    # fast element casts
    "quantize": ("fp4ref.cast", "quantize"),
    "dequantize": ("fp4ref.cast", "dequantize"),
    "round_to": ("fp4ref.cast", "round_to"),
    "quantize_profile": ("fp4ref.cast", "quantize_profile"),
    "pack_fp4": ("fp4ref.cast", "pack_fp4"),
    "unpack_fp4": ("fp4ref.cast", "unpack_fp4"),
    "as_torch_dtype": ("fp4ref.cast", "as_torch_dtype"),
    # block-scaled recipes
    "quantize_recipe": ("fp4ref.quant", "quantize"),
    "BlockScaledTensor": ("fp4ref.quant", "BlockScaledTensor"),
    "RECIPE_PROFILES": ("fp4ref.quant", "RECIPE_PROFILES"),
    # GEMM models and emulators
    "GemmModel": ("reference.gemm", "GemmModel"),
    "GEMM_PRESETS": ("reference.gemm", "PRESETS"),
    "emulate": ("fp4ref.gemm", "emulate"),
    "blockscaled_mm": ("fp4ref.gemm_triton", "blockscaled_mm"),
    "Linear": ("fp4ref.nn", "Linear"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        mod, attr = _EXPORTS[name]
        val = getattr(importlib.import_module(mod), attr)
        globals()[name] = val
        return val
    raise AttributeError(f"module 'fp4ref' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
