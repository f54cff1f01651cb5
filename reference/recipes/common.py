"""Shared plumbing of the exact recipes: matrices of ``Exact``, blocks, padding."""
from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Sequence

from ..exact import Exact, Kind, exact
from . import f32 as F

__all__ = ["as_matrix", "transpose", "pad_matrix", "amax", "check_tile", "check_positive_int",
           "matrix_of_ints"]


def as_matrix(x, name: str = "x") -> list[list[Exact]]:
    """2D array-like (torch tensor, numpy array, nested sequences) -> rows of ``Exact``."""
    if hasattr(x, "detach"):  # torch tensor: widen exactly through float64
        import torch
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise TypeError(f"{name}: dtype {x.dtype} is not a float dtype; valid choices: "
                            "float32, bfloat16, float16, float64")
        if x.dim() != 2:
            raise ValueError(f"{name}: expected a 2D tensor, got shape {tuple(x.shape)}")
        if x.numel() == 0:
            raise ValueError(f"{name}: empty tensor of shape {tuple(x.shape)}; nothing to "
                             "quantize (valid: at least one row and one column)")
        x = x.detach().cpu()
        if x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            # through the bit patterns: keeps NaN payloads (see f32.py)
            fmt = {torch.float32: "float32", torch.bfloat16: "bfloat16",
                   torch.float16: "float16"}[x.dtype]
            ib = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
                  torch.float16: torch.int16}[x.dtype]
            mask = (1 << (32 if fmt == "float32" else 16)) - 1
            return [[F.from_bits(b & mask, fmt) if fmt == "float32" else F.widen(b & mask, fmt)
                     for b in r] for r in x.view(ib).tolist()]
        x = x.to(torch.float64).tolist()
    elif hasattr(x, "tolist") and hasattr(x, "ndim"):
        if x.ndim != 2:
            raise ValueError(f"{name}: expected a 2D array, got shape {x.shape}")
        x = x.tolist()
    rows = [list(r) for r in x]
    if rows and any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(f"{name}: rows have different lengths")
    if not rows or not rows[0]:
        raise ValueError(f"{name}: empty input; nothing to quantize (valid: at least one row "
                         "and one column)")
    return [[exact(v) for v in r] for r in rows]


def matrix_of_ints(x, name: str) -> list[list[int]]:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [[int(v) for v in r] for r in x]


def transpose(m: Sequence[Sequence]) -> list[list]:
    return [list(c) for c in zip(*m)] if m else []


def pad_matrix(m: list[list[Exact]], bm: int, bk: int) -> list[list[Exact]]:
    """Zero-pad (+0) to multiples of (bm, bk)."""
    rows = len(m)
    cols = len(m[0]) if rows else 0
    pr = -(-rows // bm) * bm
    pc = -(-cols // bk) * bk
    z = F.ZERO
    out = [list(r) + [z] * (pc - cols) for r in m]
    out += [[z] * pc for _ in range(pr - rows)]
    return out


def amax(values: Iterable[Exact]) -> Exact:
    """max |v| with torch.amax semantics: any NaN gives (+)NaN; empty gives +0."""
    best = F.ZERO
    for v in values:
        if v.is_nan:
            return Exact(Kind.NAN, False)
        a = F.fabs(v)
        if F.lt(best, a):
            best = a
    return best


def check_tile(tile, allowed: Sequence[tuple[int, int]], param: str = "tile") -> tuple[int, int]:
    try:
        t = (int(tile[0]), int(tile[1]))
    except Exception:
        t = None
    if t is None or t not in [tuple(a) for a in allowed]:
        raise ValueError(f"{param}: unknown value {tile!r}; valid choices: "
                         + ", ".join(f"{a[0]}x{a[1]}" for a in allowed))
    return t


def check_positive_int(param: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{param}: {v!r} is not an integer >= 1")
    return v



def scalar_exact(v) -> Exact:
    """A scalar (Python number, Exact, or one-element float tensor, NaN payload kept)."""
    if hasattr(v, "detach"):
        import torch
        t = v.detach().cpu().reshape(-1)
        if t.numel() != 1:
            raise ValueError(f"expected a one-element tensor, got shape {tuple(v.shape)}")
        if t.dtype == torch.float32:
            return F.from_bits(t.view(torch.int32).item() & 0xFFFFFFFF)
        return exact(t.to(torch.float64).item())
    return exact(v)


def check_target(T) -> Fraction:
    """A block-scale target T: a finite number > 0 (ValueError naming T otherwise)."""
    if isinstance(T, bool):
        raise ValueError(f"T: {T!r} is not a number; valid: finite > 0")
    try:
        v = scalar_exact(T)
    except (TypeError, ValueError):
        raise ValueError(f"T: {T!r} is not a number; valid: finite > 0") from None
    if not v.is_finite or v.negative or v.mag == 0:
        raise ValueError(f"T: {T!r} is not a valid block-scale target; valid: finite > 0")
    return v.mag
