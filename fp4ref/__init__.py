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
    "blockscaled_mm": ("fp4ref.gemm_triton", "blockscaled_mm"),
    "Linear": ("fp4ref.nn", "Linear"),
    "mma": ("fp4ref.mma_tile", "mma"),  # one MMA instruction tile, bit-exact (docs/mma.md)
    "scaled_mm": ("fp4ref.scaled_gemm", "scaled_mm"),  # emulated torch._scaled_mm NVFP4/MXFP4
    # the native GEMM at any shape (issue 13): schedule table + emulation
    "emulate_native": ("fp4ref.native", "emulate_native"),
    "ScheduleTable": ("fp4ref.native", "ScheduleTable"),
}

__all__ = ["__version__", "emulate", *_EXPORTS]

# Presets that model native NVFP4 GEMMs: their operands are E2M1 (FP4) values, the block
# scales carry the magnitude.  Other operands would emulate a GEMM no hardware runs.
_FP4_PRESETS = ("probe_matched", "probe_matched_lattice")
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _check_fp4_operand(name: str, x, model: str) -> None:
    import torch
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return  # the emulator names the problem (not a floating tensor)
    ok = torch.isin(x.abs(), torch.tensor(_E2M1_MAGNITUDES, dtype=x.dtype, device=x.device))
    if not bool(ok.all()):
        idx = [int(i) for i in torch.nonzero(~ok)[0]]
        raise ValueError(f"{name}: element {idx} = {float(x[tuple(idx)])!r} is not an FP4 (E2M1) value; "
                         f"model {model!r} takes decoded E2M1 operands (valid magnitudes: "
                         f"{', '.join(map(str, _E2M1_MAGNITUDES))}) with block scales in scales_a/scales_b")


def emulate(model, a, b, **kw):
    """C = A @ B under ``model`` (a GemmModel or a preset name), bit-identical to
    ``reference.gemm.dot`` per element (see fp4ref.gemm.emulate for the arguments).
    The NVFP4 presets (probe_matched, probe_matched_lattice) check that ``a`` and ``b``
    hold E2M1 values and name the first operand element that is not."""
    from .gemm import emulate as run
    if isinstance(model, str) and model in _FP4_PRESETS:
        _check_fp4_operand("a", a, model)
        _check_fp4_operand("b", b, model)
    return run(model, a, b, **kw)


def __getattr__(name: str):
    if name in _EXPORTS:
        mod, attr = _EXPORTS[name]
        val = getattr(importlib.import_module(mod), attr)
        globals()[name] = val
        return val
    raise AttributeError(f"module 'fp4ref' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
