"""Per-code lookup tables, built once per format and device.

``code_values`` decodes any format's codes; ``ScaleTables`` holds what the routing needs of a
scale format (finite values, unit exponents), ``E2m1Tables`` the squares of the element
values, ``sqrt_table`` the square roots of the blocks' sums of squares.  Tables read by a
kernel before the code-range check is read back are padded to 256 codes, so any uint8 code
stays in bounds."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from reference.formats import get_format

__all__ = ["code_values", "ScaleTables", "scale_tables", "E2m1Tables", "e2m1_tables",
           "sqrt_table", "unit_exp", "wide_span", "wide_exact"]

_CACHE: dict = {}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def code_values(fmt: str, device) -> torch.Tensor:
    """float32 value of every code of ``fmt`` (NaN / inf where the format has them)."""
    def make():
        spec = get_format(fmt)
        vals = [float(spec.decode(c)) for c in range(spec.ncodes)]
        return torch.tensor(vals, dtype=torch.float32, device=device)
    return _cached(("values", fmt, str(device)), make)


def unit_exp(s: torch.Tensor) -> torch.Tensor:
    """Exponent of the last set bit of |s| (finite, nonzero), as int64; exact."""
    from fp4ref.gemm import _from_float
    return _from_float(s.abs()).E


def _pad256(t: torch.Tensor) -> torch.Tensor:
    t = t.int() if t.dtype == torch.int64 else t     # ints as int32 for the kernels
    return torch.cat([t, t.new_zeros(256 - t.numel())])


@dataclass(frozen=True)
class ScaleTables:
    """Per scale code (index = code)."""
    sane: torch.Tensor        # float32: the scale value, 0 where not finite
    ue: torch.Tensor          # int64: unit exponent of a finite nonzero scale, else 0
    sane64: torch.Tensor      # float64: |sane|
    ue1: torch.Tensor         # int64: ue - 1
    sane_256: torch.Tensor    # sane, padded to 256 codes (0 past the format's codes)
    sane64_256: torch.Tensor  # sane64, padded
    ue1_256: torch.Tensor     # ue1 as int32, padded
    nf_256: torch.Tensor      # int32: 1 where the scale is not finite, padded

    def to(self, device) -> "ScaleTables":
        return ScaleTables(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def _scale_tables_cpu(sfmt: str) -> ScaleTables:
    v = code_values(sfmt, "cpu")
    sane = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
    live = sane != 0
    ue = torch.where(live, unit_exp(torch.where(live, sane, torch.ones_like(sane))),
                     torch.zeros(v.shape, dtype=torch.int64))
    sane64, ue1 = sane.double().abs(), ue - 1
    return ScaleTables(sane, ue, sane64, ue1, _pad256(sane), _pad256(sane64), _pad256(ue1),
                       _pad256((~torch.isfinite(v)).int()))


def scale_tables(sfmt: str, device) -> ScaleTables:
    """The tables of scale format ``sfmt`` on ``device``."""
    cpu = _cached(("scale", sfmt, "cpu"), lambda: _scale_tables_cpu(sfmt))
    return cpu if str(device) == "cpu" else _cached(("scale", sfmt, str(device)),
                                                     lambda: cpu.to(device))


@dataclass(frozen=True)
class E2m1Tables:
    sq: torch.Tensor    # float32 [16]: square of each code's value (exact: 2 significant bits)
    sqb: torch.Tensor   # float32 [256]: per packed byte, low plus high nibble's square (exact)


def e2m1_tables(device) -> E2m1Tables:
    def make():
        v = code_values("float4_e2m1fn", "cpu")
        sq = v * v
        sqb = sq[torch.arange(256) & 15] + sq[torch.arange(256) >> 4]
        return E2m1Tables(sq.to(device), sqb.to(device))
    return _cached(("e2m1", str(device)), make)


def sqrt_table(block: int, device) -> torch.Tensor:
    """float64 sqrt(k / 4) for the block's sums of squares k / 4 <= 36 * block (exact
    multiples of 1/4), then the bound's factor 1 + 2**-40 (``certify.side_bounds``)."""
    def make():
        k = torch.arange(4 * 36 * block + 1, dtype=torch.float64)
        t = torch.cat([torch.sqrt(k / 4), torch.tensor([1 + 2.0 ** -40], dtype=torch.float64)])
        return t.to(device)
    return _cached(("sqrt", block, str(device)), make)


@lru_cache(maxsize=None)
def wide_span(sfmt: str, group: int = 64) -> int:
    """H - L of the WIDE kernel's proof (package docstring) for scale format ``sfmt``: every
    product is a multiple of 2**L (e2m1's 0.5 times the smallest scale quantum, per side: the
    smallest subnormal, or the smallest normal of a format without subnormals and without
    mantissa bits, e8m0) and every partial group sum lies below 2**H (``group`` products of
    (6 * max scale)**2)."""
    from reference.exact import floor_log2
    from reference.formats import get_format
    spec = get_format(sfmt)
    L = 2 * (floor_log2(spec.min_subnormal or spec.min_normal) - 1)
    top = group * (6 * spec.max_finite) ** 2
    H = floor_log2(top) + 1
    return H - L


def wide_exact(sfmt: str) -> bool:
    """True when the WIDE kernel's error terms always sum exactly for this scale format
    (H - L <= 104), so its per-tile flags cannot be set and need no read-back."""
    return wide_span(sfmt) <= 104
