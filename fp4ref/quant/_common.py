"""Argument checking and small helpers shared by the fast quantizers."""
from __future__ import annotations

import torch

from reference.exact import exact
from reference.recipes import f32 as F

__all__ = ["check_input", "f32_scalar", "pad2d", "check_rbits", "FLT_MAX"]

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
        e = F.f32(exact(v))
    except TypeError:
        raise TypeError(f"{name}: {v!r} is not a number") from None
    return torch.tensor(float(e), dtype=torch.float32, device=device)


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

