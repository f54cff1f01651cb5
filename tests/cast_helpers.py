"""Shared helpers for the cast tests: input sets, policy sets, and the reference
evaluated once per rounding class.

A class is (kind, sign, interval between consecutive breakpoints or exactly on
one), where the breakpoints are the format's grid values (extended one step
above max, and below min for e8m0's unbounded grid) and their midpoints.  For
every deterministic mode and policy the exact result is constant on a class,
so the reference runs on one member (an actual input) per class.
"""
from __future__ import annotations

import itertools
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
import torch

from reference.formats import get_format
from reference.rounding import (InfPolicy, NanPolicy, Negative, NoZero, Overflow, Policy,
                                Subnormal, default_policy, encode)

RAISES = -1  # marker: the reference raised ValueError for this input


@pytest.fixture(autouse=True, scope="module")
def torch_single_thread():
    """Many small tensor ops: with xdist workers on 2 cores, torch's intra-op
    threads oversubscribe the CPU (measured 7x slower); one thread per worker."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

_FIELDS = {"overflow": Overflow, "inf": InfPolicy, "nan": NanPolicy, "subnormal": Subnormal,
           "no_zero": NoZero, "negative": Negative}


def all_bf16() -> torch.Tensor:
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def all_fp16() -> torch.Tensor:
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)


@lru_cache(maxsize=None)
def all_16bit_f32() -> torch.Tensor:
    """Every bf16 and every fp16 bit pattern, widened exactly to float32."""
    return torch.cat([all_bf16().float(), all_fp16().float()])


@lru_cache(maxsize=None)
def breakpoints(fmt) -> np.ndarray:
    fmt = get_format(fmt)
    grid = {v for _, v in fmt.finite_values}
    q = fmt.quantum(fmt.emax)
    grid |= {fmt.max_finite + q, fmt.max_finite + 2 * q}
    if not fmt.subnormals:  # the reference rounds on the unbounded grid below min
        grid |= {Fraction(1, 1 << k) for k in range(-fmt.emin + 1, 1074)}
    g = sorted(grid)
    pts = sorted(set(g) | {(a + b) / 2 for a, b in zip(g, g[1:])})
    out = np.array([float(p) for p in pts], dtype=np.float64)
    assert all(Fraction(float(p)) == p for p in pts), "breakpoints must be exact in float64"
    return out


def class_keys(x: np.ndarray, fmt) -> np.ndarray:
    """One integer per element naming its rounding class (x: float64 array)."""
    bp = breakpoints(fmt)
    a = np.abs(x)
    sign = np.signbit(x).astype(np.int64)
    j = np.searchsorted(bp, np.nan_to_num(a, nan=0.0, posinf=0.0), side="right") - 1
    exact = (j >= 0) & (bp[np.maximum(j, 0)] == a)
    key = ((j + 2) * 2 + exact) * 2 + sign
    key = np.where(a == 0, -6 + sign, key)
    key = np.where(np.isinf(x), -4 + sign, key)
    key = np.where(np.isnan(x), -2 + sign, key)
    return key


def classes(x: torch.Tensor, fmt):
    """(float64 values, index of one member per class, class of each element)."""
    xf = x.detach().cpu().to(torch.float64).numpy().reshape(-1)
    _, first, inv = np.unique(class_keys(xf, fmt), return_index=True, return_inverse=True)
    return xf, first, inv.reshape(-1)


@lru_cache(maxsize=None)
def classes_16bit(fmt_name: str):
    return classes(all_16bit_f32(), fmt_name)


def ref_codes(x: torch.Tensor, fmt, mode, policy, *, cls=None, **kw) -> np.ndarray:
    """Reference codes for every element (RAISES where it raises), one call per class."""
    fmt = get_format(fmt)
    xf, first, inv = cls if cls is not None else classes(x, fmt)
    out = np.empty(len(first), dtype=np.int64)
    for i, k in enumerate(first):
        try:
            out[i] = encode(float(xf[k]), fmt, mode, policy, **kw).code
        except ValueError:
            out[i] = RAISES
    return out[inv]


def ref_codes_each(values, fmt, mode, policy, **kw) -> np.ndarray:
    """Reference codes element by element (no class caching), for SR and samples."""
    out = []
    for v in values:
        try:
            out.append(encode(float(v), fmt, mode, policy, **kw).code)
        except ValueError:
            out.append(RAISES)
    return np.array(out, dtype=np.int64)


def as_u(codes: torch.Tensor) -> np.ndarray:
    """Codes tensor -> unsigned bit patterns (int32 float32 codes read as 32-bit)."""
    c = codes.detach().cpu().to(torch.int64).numpy().reshape(-1)
    return c & 0xFFFFFFFF


def _valid(fmt, p: Policy) -> bool:
    try:
        p.validate(fmt)
        return True
    except ValueError:
        return False


def _dedupe(fmt, pols):
    seen, out = set(), []
    for p in pols:
        k = (p.overflow, p.inf, p.nan, p.subnormal,
             None if fmt.has_zero else p.no_zero, None if fmt.signed else p.negative)
        if k not in seen and _valid(fmt, p):
            seen.add(k)
            out.append(p)
    return out


def base_policies(fmt) -> list[Policy]:
    """The default policy and a second base that differs in every field it can."""
    fmt = get_format(fmt)
    b1 = default_policy(fmt)
    b2 = Policy(overflow=Overflow.NAN if fmt.has_nan else Overflow.SATFINITE,
                inf=InfPolicy.PROPAGATE if fmt.has_nan else InfPolicy.SATURATE,
                nan=NanPolicy.PRESERVE_SIGN if fmt.has_nan else NanPolicy.TO_MAX,
                subnormal=Subnormal.FLUSH if fmt.has_zero else Subnormal.MIN_AS_ZERO,
                no_zero=NoZero.TO_MIN, negative=Negative.TO_ZERO)
    return [b1, b2]


def ofat_policies(fmt) -> list[Policy]:
    """Every value of every Policy field, one field at a time around the default;
    around the second base (overflow and inf give NaN where they can) the NaN
    policy varies too, since it also sets those NaNs' sign and payload."""
    fmt = get_format(fmt)
    out = []
    for base, fields in zip(base_policies(fmt), (_FIELDS, ("nan",))):
        out.append(base)
        for name in fields:
            for v in _FIELDS[name]:
                out.append(Policy(**{**base.__dict__, name: v}))
    return _dedupe(fmt, out)


def all_policies(fmt) -> list[Policy]:
    """The full cross product of valid policies (fields that matter for fmt)."""
    fmt = get_format(fmt)
    combos = itertools.product(*(list(e) for e in _FIELDS.values()))
    return _dedupe(fmt, (Policy(*c) for c in combos))
