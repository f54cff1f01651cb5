"""Block-scaled tensor, exact form (SPEC section 3).

A ``BlockScaled`` holds element codes (row-major, logical shape), one block
scale code per block (1 x B along the contraction dimension or a 2D tile),
optional FP32 per-tensor (or per-tile) decode scales, and the names of the
formats.  ``to_swizzled`` / ``from_swizzled`` give cuBLAS's 128x4 tiled scale
layout used by block-scaled GEMMs.

cuBLAS / PyTorch swizzled layout (cuBLAS docs "1D block scaling factors
layout"; torchao ``to_blocked``; TE ``_recover_swizzled_scales``): the scale
matrix (R rows x C block-columns) is zero-padded to R' = ceil(R/128)*128 and
C' = ceil(C/4)*4, cut into 128 x 4 tiles taken row-tile-major, and inside a
tile the element (r, c) with r = 32*i + j (i < 4, j < 32) goes to offset
16*j + 4*i + c.  Tile (tr, tc) starts at 512 * (tr * C'/4 + tc).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .exact import Exact, Kind, exact
from .formats import get_format

__all__ = ["BlockScaled", "swizzle_index", "swizzled_shape", "to_swizzled", "from_swizzled",
           "pack_fp4", "unpack_fp4", "ceil_div"]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def swizzled_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded (R', C') of a rows x cols scale matrix in the 128x4 layout."""
    return ceil_div(rows, 128) * 128, ceil_div(cols, 4) * 4


def swizzle_index(r: int, c: int, cols: int) -> int:
    """Flat offset of scale (r, c) in the swizzled buffer of a matrix with ``cols`` columns."""
    cp = ceil_div(cols, 4) * 4
    tr, rr = divmod(r, 128)
    tc, cc = divmod(c, 4)
    i, j = divmod(rr, 32)
    return 512 * (tr * (cp // 4) + tc) + 16 * j + 4 * i + cc


def to_swizzled(scales: Sequence[Sequence[int]], pad: int = 0) -> list[int]:
    """Row-major scale codes -> flat swizzled buffer of R' * C' codes (padding = ``pad``)."""
    rows = len(scales)
    cols = len(scales[0]) if rows else 0
    rp, cp = swizzled_shape(rows, cols)
    out = [pad] * (rp * cp)
    for r in range(rows):
        for c in range(cols):
            out[swizzle_index(r, c, cols)] = scales[r][c]
    return out


def from_swizzled(buf: Sequence[int], rows: int, cols: int) -> list[list[int]]:
    """Flat swizzled buffer -> the rows x cols row-major scale codes (padding dropped)."""
    rp, cp = swizzled_shape(rows, cols)
    if len(buf) != rp * cp:
        raise ValueError(f"buf: length {len(buf)} does not match a {rows}x{cols} scale matrix "
                         f"in the 128x4 layout (expected {rp}*{cp} = {rp * cp})")
    return [[buf[swizzle_index(r, c, cols)] for c in range(cols)] for r in range(rows)]


def pack_fp4(codes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Two 4-bit codes per byte along each row, first element in the low nibble.
    An odd row length is padded with a zero nibble."""
    out = []
    for row in codes:
        row = list(row) + ([0] if len(row) % 2 else [])
        for c in row:
            if not 0 <= c < 16:
                raise ValueError(f"codes: {c!r} is not a 4-bit code; valid codes are 0..15")
        out.append([row[k] | (row[k + 1] << 4) for k in range(0, len(row), 2)])
    return out


def unpack_fp4(packed: Sequence[Sequence[int]], cols: int) -> list[list[int]]:
    out = []
    for row in packed:
        r = []
        for b in row:
            r += [b & 0xF, b >> 4]
        if len(r) < cols:
            raise ValueError(f"cols: {cols} exceeds the {len(r)} packed codes per row")
        out.append(r[:cols])
    return out


@dataclass(frozen=True)
class BlockScaled:
    """Exact block-scaled tensor (2D).

    shape         logical (rows, cols)
    codes         element codes, row-major, shape ``shape``
    scale_codes   ceil(rows/bm) x ceil(cols/bk) block scale codes
    block         (bm, bk): (1, B) along the contraction dimension, or a tile
    tensor_scale  None, or a grid of FP32 decode scales (1 x 1 for per-tensor,
                  else one per ``tensor_tile``); dequantized value =
                  elem * scale * tensor_scale
    meta          profile-specific facts (amax, S_enc, masks) for reports
    """
    shape: tuple[int, int]
    codes: tuple[tuple[int, ...], ...]
    elem_fmt: str
    scale_codes: tuple[tuple[int, ...], ...]
    scale_fmt: str
    block: tuple[int, int]
    tensor_scale: tuple[tuple[Exact, ...], ...] | None = None
    tensor_tile: tuple[int, int] | None = None
    profile: str = ""
    meta: Mapping = field(default_factory=dict, compare=False)

    def __post_init__(self):
        rows, cols = self.shape
        bm, bk = self.block
        if len(self.codes) != rows or any(len(r) != cols for r in self.codes):
            raise ValueError(f"codes: shape does not match {self.shape}")
        sr, sc = ceil_div(rows, bm), ceil_div(cols, bk)
        if len(self.scale_codes) != sr or any(len(r) != sc for r in self.scale_codes):
            raise ValueError(f"scale_codes: expected {sr}x{sc} for shape {self.shape} "
                             f"and block {self.block}")

    # --- decoding ---------------------------------------------------------
    def tensor_scale_at(self, r: int, c: int) -> Exact | None:
        if self.tensor_scale is None:
            return None
        if self.tensor_tile is None:
            return self.tensor_scale[0][0]
        th, tw = self.tensor_tile
        return self.tensor_scale[r // th][c // tw]

    def value(self, r: int, c: int) -> Exact:
        """Exact dequantized value elem * scale * tensor_scale (IEEE products of specials)."""
        ef, sf = get_format(self.elem_fmt), get_format(self.scale_fmt)
        bm, bk = self.block
        v = ef.decode(self.codes[r][c])
        s = sf.decode(self.scale_codes[r // bm][c // bk])
        out = _xmul(v, s)
        t = self.tensor_scale_at(r, c)
        return out if t is None else _xmul(out, t)

    def dequantize(self) -> list[list[Exact]]:
        """Exact product rounded once to float32 (RNE), as ``Exact`` values."""
        from .recipes import f32 as F
        rows, cols = self.shape
        return [[F.f32(self.value(r, c)) for c in range(cols)] for r in range(rows)]

    def packed(self) -> list[list[int]]:
        if get_format(self.elem_fmt).nbits != 4:
            raise ValueError(f"elem_fmt: {self.elem_fmt} is not a 4-bit format; only float4 "
                             "codes pack two per byte (6/8-bit codes stay one per byte)")
        return pack_fp4(self.codes)

    def swizzled_scales(self, pad: int = 0) -> list[int]:
        return to_swizzled(self.scale_codes, pad)

    @classmethod
    def from_packed(cls, packed, cols: int, **kw) -> "BlockScaled":
        return cls(codes=tuple(tuple(r) for r in unpack_fp4(packed, cols)), **kw)


def _xmul(a: Exact, b: Exact) -> Exact:
    """Exact product with IEEE specials (no rounding)."""
    a, b = exact(a), exact(b)
    if a.is_nan or b.is_nan:
        return a if a.is_nan else b
    s = a.negative != b.negative
    if a.is_inf or b.is_inf:
        if a.is_zero or b.is_zero:
            return Exact(Kind.NAN, False)
        return Exact(Kind.INF, s)
    return Exact(Kind.FINITE, s, a.mag * b.mag)

