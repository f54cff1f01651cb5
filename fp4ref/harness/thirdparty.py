"""Loaders for third-party quantizers that fp4ref checks itself against.

Each loader returns the module (or raises ``Unavailable`` with the reason);
nothing is faked: a missing package is reported, never replaced.

Transformer Engine's pure-PyTorch NVFP4 reference quantizer lives in
``transformer_engine.pytorch.custom_recipes.reference_nvfp4``.  Importing it
normally runs ``transformer_engine/pytorch/__init__.py``, which loads the
compiled CUDA extension.  On a CPU machine (shared/PLATFORM.md) we set
``NVTE_PROJECT_BUILDING=1`` (skips loading the core .so), register a stand-in
for the compiled module ``transformer_engine_torch`` (its ``DType`` enum is
the only thing read at import time), and register ``transformer_engine.pytorch``
as a bare package whose ``__path__`` points at the real directory, so its
submodules import from the installed files without executing its
``__init__.py``.  If pydantic is missing (TE installed with --no-deps), its
``pydantic.dataclasses.dataclass`` is stood in by the stdlib dataclass; the
recipe classes are only constructed, never validated, on this path.
"""
from __future__ import annotations

import enum
import importlib
import importlib.util
import itertools
import os
import sys
import types
from pathlib import Path

__all__ = ["Unavailable", "torchao_mx", "torchao_nvfp4", "te_reference_nvfp4", "te_quantization",
           "te_reference_current_scaling", "te_version", "torchao_version", "torch_test_quantized"]


class Unavailable(RuntimeError):
    """A third-party implementation is not installed or cannot load here (reason in str)."""


def _version(dist: str) -> str | None:
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:
        return None


def torchao_version() -> str | None:
    return _version("torchao")


def te_version() -> str | None:
    return _version("transformer_engine") or _version("transformer-engine")


def torchao_mx():
    try:
        return importlib.import_module("torchao.prototype.mx_formats.mx_tensor")
    except Exception as e:  # noqa: BLE001 - any import failure means "absent here"
        raise Unavailable(f"torchao mx_formats not importable: {type(e).__name__}: {e}") from None


def torchao_nvfp4():
    try:
        return importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"torchao nvfp4 not importable: {type(e).__name__}: {e}") from None


_TQ: dict = {}


def torch_test_quantized():
    """``torch.testing._internal.common_quantized`` (PyTorch's own test reference for MX /
    NVFP4 data: ``to_mxfp``, ``_bfloat16_to_float4_e2m1fn_x2``).

    Its only import beyond torch/numpy is ``common_utils`` for five platform flags;
    ``common_utils`` needs the ``expecttest`` package, absent here.  When that import
    fails, the file is executed with a stand-in providing just those flags (set only
    while the module body runs); the functions used are the shipped code."""
    if "m" in _TQ:
        return _TQ["m"]
    name = "torch.testing._internal.common_quantized"
    try:
        _TQ["m"] = importlib.import_module(name)
        return _TQ["m"]
    except Exception:  # noqa: BLE001
        pass
    try:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise Unavailable(f"{name} is not shipped with this torch")
        import platform
        cu = types.ModuleType("torch.testing._internal.common_utils")
        cu.TEST_WITH_TSAN = False
        cu.IS_PPC = platform.machine() in ("ppc64le", "ppc64")
        cu.IS_MACOS = sys.platform == "darwin"
        cu.IS_WINDOWS = sys.platform == "win32"
        cu.IS_ARM64 = platform.machine() in ("arm64", "aarch64")
        key = "torch.testing._internal.common_utils"
        saved = sys.modules.get(key)
        sys.modules[key] = cu
        try:
            mod = types.ModuleType("fp4ref._torch_common_quantized")
            mod.__file__ = spec.origin
            with open(spec.origin) as f:
                code = compile(f.read(), spec.origin, "exec")
            exec(code, mod.__dict__)
        finally:
            if saved is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = saved
    except Unavailable:
        raise
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"{name}: {type(e).__name__}: {e}") from None
    _TQ["m"] = mod
    return mod


class _CountingMeta(type):
    # Any enum-like attribute read at import time (tex.Foo.kBar) gets a distinct int.
    _ctr = itertools.count(10_000)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return next(cls._ctr)


class _TexStandIn(types.ModuleType):
    """Stand-in for the compiled ``transformer_engine_torch``: any attribute is an inert class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        v = _CountingMeta(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, v)
        return v


_TE_CACHE: dict = {}


def _te_bootstrap():
    if "ok" in _TE_CACHE:
        return
    if "err" in _TE_CACHE:
        raise Unavailable(_TE_CACHE["err"])
    try:
        spec = importlib.util.find_spec("transformer_engine")
    except Exception:  # noqa: BLE001
        spec = None
    if spec is None or not spec.submodule_search_locations:
        _TE_CACHE["err"] = "transformer_engine is not installed"
        raise Unavailable(_TE_CACHE["err"])
    try:
        real = sys.modules.get("transformer_engine_torch")
        if real is None:
            try:  # a real compiled extension wins (GPU machine with full TE)
                importlib.import_module("transformer_engine_torch")
            except Exception:  # noqa: BLE001
                os.environ.setdefault("NVTE_PROJECT_BUILDING", "1")
                tex = _TexStandIn("transformer_engine_torch")
                tex.DType = enum.IntEnum("DType", ["kByte", "kInt32", "kFloat32", "kFloat16",
                                                   "kBFloat16", "kFloat8E4M3", "kFloat8E5M2",
                                                   "kFloat4E2M1"], start=0)
                sys.modules["transformer_engine_torch"] = tex
        if "transformer_engine.pytorch" not in sys.modules and \
                isinstance(sys.modules.get("transformer_engine_torch"), _TexStandIn):
            pt = Path(spec.submodule_search_locations[0]) / "pytorch"
            stub = types.ModuleType("transformer_engine.pytorch")
            stub.__path__ = [str(pt)]
            stub.__package__ = "transformer_engine.pytorch"
            sys.modules["transformer_engine.pytorch"] = stub
        try:
            import pydantic  # noqa: F401
        except ImportError:
            import dataclasses
            pd = types.ModuleType("pydantic")
            pdd = types.ModuleType("pydantic.dataclasses")
            pdd.dataclass = dataclasses.dataclass
            pd.dataclasses = pdd
            sys.modules.setdefault("pydantic", pd)
            sys.modules.setdefault("pydantic.dataclasses", pdd)
        importlib.import_module("transformer_engine")
        # tensor/ first: quantized_tensor and tensor/__init__ import each other.
        importlib.import_module("transformer_engine.pytorch.tensor")
    except Unavailable:
        raise
    except Exception as e:  # noqa: BLE001
        _TE_CACHE["err"] = f"transformer_engine failed to load on this machine: {type(e).__name__}: {e}"
        raise Unavailable(_TE_CACHE["err"]) from None
    _TE_CACHE["ok"] = True


def _te_module(sub: str, what: str):
    """``transformer_engine.pytorch.<sub>`` after the bootstrap; Unavailable names ``what``."""
    _te_bootstrap()
    try:
        return importlib.import_module(f"transformer_engine.pytorch.{sub}")
    except Exception as e:  # noqa: BLE001 - any import failure means "absent here"
        raise Unavailable(f"{what} not importable: {type(e).__name__}: {e}") from None


def te_reference_nvfp4():
    """``transformer_engine.pytorch.custom_recipes.reference_nvfp4`` (runs on CPU)."""
    return _te_module("custom_recipes.reference_nvfp4", "TE reference_nvfp4")


def te_quantization():
    """``transformer_engine.pytorch.quantization`` (FP8 delayed-scaling update functions)."""
    return _te_module("quantization", "TE quantization")


def te_reference_current_scaling():
    """``transformer_engine.pytorch.custom_recipes.reference_current_scaling`` (FP8 scales)."""
    return _te_module("custom_recipes.reference_current_scaling", "TE reference_current_scaling")
