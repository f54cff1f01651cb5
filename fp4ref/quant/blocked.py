"""Block-scaled tensor, torch form (twin of ``reference.blocked``).

Codes are unpacked (one uint8 per element, logical shape); ``packed()`` gives
two float4 codes per byte (low nibble first).  Scale codes are uint8 for 8-bit
scale formats and int64 (the float32 bit pattern, 0..2**32-1) for float32
scales.  ``to_swizzled`` / ``from_swizzled`` implement cuBLAS's 128x4 tiled
layout (see reference/blocked.py for the index formula and padding).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from reference.blocked import BlockScaled, ceil_div, swizzled_shape
from reference.formats import get_format

__all__ = ["BlockScaledTensor", "to_swizzled", "from_swizzled", "pack_codes", "unpack_codes"]


def to_swizzled(scales: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """(R, C) row-major scales -> flat R'*C' swizzled buffer, padded with ``pad``."""
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2:
        raise ValueError(f"scales: expected a 2D tensor, got "
                         f"{getattr(scales, 'shape', type(scales).__name__)}")
    R, C = scales.shape
    rp, cp = swizzled_shape(R, C)
    p = torch.full((rp, cp), pad, dtype=scales.dtype, device=scales.device)
    p[:R, :C] = scales
    # (tr, i, j, tc, c) -> (tr, tc, j, i, c): offset 512*(tr*C'/4+tc) + 16*j + 4*i + c
    t = p.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(-1).contiguous()


def from_swizzled(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    rp, cp = swizzled_shape(rows, cols)
    if not isinstance(buf, torch.Tensor) or buf.numel() != rp * cp:
        raise ValueError(f"buf: expected {rp}*{cp} = {rp * cp} elements for a {rows}x{cols} "
                         f"scale matrix in the 128x4 layout, got "
                         f"{getattr(buf, 'numel', lambda: None)()}")
    t = buf.reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(rp, cp)[:rows, :cols].contiguous()


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 4-bit codes (..., K) -> (..., ceil(K/2)) bytes, low nibble first; odd K padded
    with a zero nibble."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes: dtype {codes.dtype} is not uint8")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError("codes: values must be 4-bit (0..15) to pack")
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_codes(packed: torch.Tensor, cols: int) -> torch.Tensor:
    if packed.dtype == torch.float4_e2m1fn_x2:
        packed = packed.view(torch.uint8)
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed: dtype {packed.dtype} is not uint8 or float4_e2m1fn_x2")
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
    if cols > out.shape[-1]:
        raise ValueError(f"cols: {cols} exceeds the {out.shape[-1]} packed codes per row")
    return out[..., :cols].contiguous()


def _decode64(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Exact float64 values of codes (float32 scales: codes are their bit patterns)."""
    from fp4ref.cast import dequantize
    spec = get_format(fmt)
    if spec.name == "float32":
        c = codes.to(torch.int64)
        c = torch.where(c >= (1 << 31), c - (1 << 32), c)
        return c.to(torch.int32).view(torch.float32).to(torch.float64)
    return dequantize(codes, spec).to(torch.float64)


@dataclass
class BlockScaledTensor:
    shape: tuple
    codes: torch.Tensor            # uint8 (rows, cols)
    elem_fmt: str
    scale_codes: torch.Tensor      # (ceil(rows/bm), ceil(cols/bk))
    scale_fmt: str
    block: tuple
    # float32 (1, 1) or per tensor_tile grid; default None, through a factory so that the
    # class has no attribute of that name: __getattr__ can then make it lazily (_fused)
    tensor_scale: torch.Tensor | None = field(default_factory=lambda: None)
    tensor_tile: tuple | None = None
    profile: str = ""
    meta: Mapping = field(default_factory=dict)

    def __post_init__(self):
        rows, cols = self.shape
        if tuple(self.codes.shape) != (rows, cols):
            raise ValueError(f"codes: shape {tuple(self.codes.shape)} != {self.shape}")
        self._check_scales()

    def _check_scales(self):
        rows, cols = self.shape
        bm, bk = self.block
        want = (ceil_div(rows, bm), ceil_div(cols, bk))
        if tuple(self.scale_codes.shape) != want:
            raise ValueError(f"scale_codes: shape {tuple(self.scale_codes.shape)} != {want}")

    @classmethod
    def from_packed(cls, shape, packed: torch.Tensor, elem_fmt: str, scale_codes, scale_fmt,
                    block, tensor_scale=None, tensor_tile=None, profile: str = "",
                    meta=None) -> "BlockScaledTensor":
        """A 4-bit tensor from packed codes (uint8 (rows, ceil(cols/2)), low nibble first),
        kept packed: the fused kernels' output goes out as written (unpacking costs more
        than the kernel).  ``codes`` unpacks on first access; ``packed()`` returns this
        buffer until then."""
        rows, cols = shape
        if get_format(elem_fmt).nbits != 4:
            raise ValueError(f"elem_fmt: {elem_fmt} is not a 4-bit format; only float4 codes "
                             "are packed two per byte")
        if packed.dtype != torch.uint8 or tuple(packed.shape) != (rows, (cols + 1) // 2):
            raise ValueError(f"packed: expected uint8 of shape {(rows, (cols + 1) // 2)}, got "
                             f"{packed.dtype} {tuple(packed.shape)}")
        self = cls.__new__(cls)
        vars(self).update(shape=(rows, cols), elem_fmt=elem_fmt, scale_codes=scale_codes,
                          scale_fmt=scale_fmt, block=tuple(block), tensor_scale=tensor_scale,
                          tensor_tile=tensor_tile, profile=profile, meta=dict(meta or {}),
                          _packed=packed)
        self._check_scales()
        return self

    @classmethod
    def _fused(cls, shape: tuple, packed: torch.Tensor, scale_codes: torch.Tensor,
               scale_fmt: str, block: tuple, profile: str,
               par: torch.Tensor | None = None) -> "BlockScaledTensor":
        """``from_packed`` for this package's fused kernels (float4 codes), trusted: the
        shapes are the ones the wrapper allocated, so nothing is re-checked (the public calls
        are launch-bound; each check or view costs host time a ~50 us kernel cannot hide).
        par: the two-level kernels' float32 [4] = [mult, fl(1/S_enc), S_enc, amax], from
        which ``tensor_scale`` ((1, 1) view of fl(1/S_enc)) and ``meta`` (amax, s_enc) are
        made on first access; None: no tensor scale, empty meta."""
        self = object.__new__(cls)
        self.__dict__ = {"shape": shape, "elem_fmt": "float4_e2m1fn", "scale_codes": scale_codes,
                         "scale_fmt": scale_fmt, "block": block, "tensor_tile": None,
                         "profile": profile, "_packed": packed}
        if par is None:
            self.__dict__.update(tensor_scale=None, meta={})
        else:
            self.__dict__["_par"] = par
        return self

    def __getattr__(self, name):
        # only reached for attributes not set: ``codes`` of a tensor made by from_packed /
        # _fused, ``tensor_scale`` and ``meta`` of one made by _fused with par
        d = vars(self)
        if name == "codes" and "_packed" in d:
            d["codes"] = unpack_codes(d.pop("_packed"), self.shape[1])  # codes now rule
            return d["codes"]
        if name in ("tensor_scale", "meta") and "_par" in d:
            _, dec, s_enc, g = d.pop("_par").unbind()
            d["tensor_scale"], d["meta"] = dec.view(1, 1), {"amax": g, "s_enc": s_enc}
            return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # --- conversions --------------------------------------------------------
    def packed(self) -> torch.Tensor:
        """Two float4 codes per byte, low nibble first (the kernel's buffer itself when the
        tensor came packed and ``codes`` was never read)."""
        if get_format(self.elem_fmt).nbits != 4:
            raise ValueError(f"elem_fmt: {self.elem_fmt} is not a 4-bit format; only float4 "
                             "codes pack two per byte")
        p = vars(self).get("_packed")
        return p if p is not None else pack_codes(self.codes)

    def swizzled_scales(self, pad: int = 0) -> torch.Tensor:
        return to_swizzled(self.scale_codes, pad)

    def _expanded_scale(self) -> torch.Tensor:
        bm, bk = self.block
        rows, cols = self.shape
        s = _decode64(self.scale_codes, self.scale_fmt)
        s = s.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:rows, :cols]
        if self.tensor_scale is not None:
            t = self.tensor_scale.to(torch.float64)
            if self.tensor_tile is None:
                s = s * t.reshape(())
            else:
                th, tw = self.tensor_tile
                s = s * t.repeat_interleave(th, 0).repeat_interleave(tw, 1)[:rows, :cols]
        return s

    def dequantize(self) -> torch.Tensor:
        """elem * scale * tensor_scale as an exact float64 product (at most 52 significant
        bits), rounded once to float32."""
        v = _decode64(self.codes, self.elem_fmt)
        return (v * self._expanded_scale()).to(torch.float32)

    def to_reference(self) -> BlockScaled:
        from reference.recipes import f32 as F
        ts = None
        if self.tensor_scale is not None:
            b = self.tensor_scale.to(torch.float32).contiguous().view(torch.int32).tolist()
            ts = tuple(tuple(F.from_bits(v & 0xFFFFFFFF) for v in r) for r in b)
        return BlockScaled(shape=tuple(self.shape),
                           codes=tuple(map(tuple, self.codes.tolist())), elem_fmt=self.elem_fmt,
                           scale_codes=tuple(map(tuple, self.scale_codes.tolist())),
                           scale_fmt=self.scale_fmt, block=tuple(self.block), tensor_scale=ts,
                           tensor_tile=self.tensor_tile, profile=self.profile)

    @classmethod
    def from_reference(cls, b: BlockScaled, device="cpu") -> "BlockScaledTensor":
        from reference.recipes import f32 as F
        sdt = torch.int64 if get_format(b.scale_fmt).nbits > 8 else torch.uint8
        ts = None
        if b.tensor_scale is not None:
            bits = [[F.bits(v) for v in r] for r in b.tensor_scale]
            ts = torch.tensor(bits, dtype=torch.int64)
            ts = torch.where(ts >= (1 << 31), ts - (1 << 32), ts).to(torch.int32).view(torch.float32)
        rows, cols = b.shape
        return cls(tuple(b.shape), torch.tensor(b.codes, dtype=torch.uint8, device=device).reshape(rows, cols),
                   b.elem_fmt, torch.tensor(b.scale_codes, dtype=sdt, device=device).reshape(
                       ceil_div(rows, b.block[0]), ceil_div(cols, b.block[1])),
                   b.scale_fmt, tuple(b.block), ts if ts is None else ts.to(device),
                   b.tensor_tile, b.profile)

    def same_bits(self, other) -> bool:
        """Codes, scale codes and tensor-scale bit patterns all equal (formats too)."""
        if isinstance(other, BlockScaled):
            other = BlockScaledTensor.from_reference(other, self.codes.device)
        if (tuple(self.shape), self.elem_fmt, self.scale_fmt, tuple(self.block), self.tensor_tile) != \
                (tuple(other.shape), other.elem_fmt, other.scale_fmt, tuple(other.block), other.tensor_tile):
            return False
        if not torch.equal(self.codes.cpu(), other.codes.cpu()):
            return False
        if not torch.equal(self.scale_codes.cpu().to(torch.int64), other.scale_codes.cpu().to(torch.int64)):
            return False
        if (self.tensor_scale is None) != (other.tensor_scale is None):
            return False
        if self.tensor_scale is not None:
            a = self.tensor_scale.cpu().to(torch.float32).contiguous().view(torch.int32)
            b = other.tensor_scale.cpu().to(torch.float32).contiguous().view(torch.int32)
            if a.shape != b.shape or not torch.equal(a, b):
                return False
        return True
