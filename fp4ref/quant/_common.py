"""Argument checking and small helpers shared by the fast quantizers."""
from __future__ import annotations

import functools
import math

import torch

from reference.exact import exact
from reference.recipes import f32 as F
from reference.rounding import Mode, parse_mode

__all__ = ["check_input", "f32_scalar", "pad2d", "check_rbits", "FLT_MAX", "mode_arg", "tq",
           "cached_plan"]

FLT_MAX = float(F.F32.max_finite)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_input(x, name: str = "x", dtypes=INPUT_DTYPES) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; valid choices: "
                        + ", ".join(str(d).replace("torch.", "") for d in dtypes))
    if x.dim() != 2:
        raise ValueError(f"{name}: expected a 2D tensor (rows, cols), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name}: empty tensor of shape {tuple(x.shape)}; nothing to quantize "
                         "(valid: at least one row and one column)")
    return x


def f32_scalar(v, device, name: str = "value") -> torch.Tensor:
    """A scalar rounded RNE to float32 exactly once (no double rounding), 0-dim tensor.
    A float32 tensor passes through bit for bit (NaN payload kept)."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{name}: expected a scalar, got shape {tuple(v.shape)}")
        if v.dtype == torch.float32:
            return v.reshape(()).to(device)
        v = v.reshape(()).to(torch.float64).item()
    try:
        f = _f32_cached(v, math.copysign(1.0, v)) if type(v) in (int, float) else \
            float(F.f32(exact(v)))
    except TypeError:
        raise TypeError(f"{name}: {v!r} is not a number") from None
    # torch.full passes the value to a fill kernel: no host-to-device copy, so no host sync
    # (torch.tensor(v, device="cuda") copies from pageable memory and waits for the stream)
    return torch.full((), f, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=256)
def _f32_cached(v, sign: float) -> float:
    """float32 RNE rounding of a Python number, exactly once (cached: exact arithmetic);
    the sign is part of the key because 0.0 == -0.0."""
    return float(F.f32(exact(v)))


def pad2d(x: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    r, c = x.shape
    pr, pc = (-r) % bm, (-c) % bk
    if pr or pc:
        x = torch.nn.functional.pad(x, (0, pc, 0, pr), value=0.0)
    return x


def check_rbits(rbits, nbits, shape, mode_is_sr: bool, mode_name: str):
    if not mode_is_sr:
        if rbits is not None or nbits is not None:
            raise ValueError(f"rbits/nbits: random bits are only used by mode SR, not {mode_name}")
        return None
    if rbits is None or nbits is None:
        raise ValueError("rbits/nbits: mode SR needs explicit random bits (an integer tensor "
                         "shaped like the quantized operand) and their width nbits")
    if not isinstance(rbits, torch.Tensor) or rbits.dtype.is_floating_point:
        raise ValueError("rbits: expected an integer torch.Tensor")
    if tuple(rbits.shape) != tuple(shape):
        raise ValueError(f"rbits: shape {tuple(rbits.shape)} must equal the quantized operand's "
                         f"{tuple(shape)}")
    return rbits



def mode_arg(mode) -> Mode:
    """parse_mode, cached for str arguments: the public fused calls are launch-bound, and
    every microsecond of Python before the launch shows in their throughput."""
    if type(mode) is Mode:
        return mode
    return _mode_cached(mode) if type(mode) is str else parse_mode(mode)


@functools.lru_cache(maxsize=64)
def _mode_cached(mode: str) -> Mode:
    return parse_mode(mode)


def cached_plan(cache: dict, key, make, keep=None):
    """make() cached under key (its result: what a fused call needs, None where no fused
    kernel applies).  None, uncached, where key is unhashable or make raises ValueError /
    TypeError: the caller's full path then checks the arguments and raises that error.
    keep is held with the entry (an object whose id() is part of key stays alive)."""
    try:
        return cache[key][0]
    except KeyError:
        pass
    except TypeError:
        return None
    try:
        plan = make()
    except (ValueError, TypeError):
        return None
    if len(cache) > 1024:
        cache.clear()
    cache[key] = (plan, keep)
    return plan


_TQ: list = []


def tq():
    """The triton_quant module, imported on first use (importing triton takes seconds, so
    CPU-only users never pay it) and then held: no import machinery per call."""
    if not _TQ:
        from . import triton_quant
        _TQ.append(triton_quant)
    return _TQ[0]
