"""Step 1, decode: operand checks, and e2m1 codes times block scales -> exact bf16 operands.

a * s_a (e2m1 value times its block scale) has at most 6 significant bits and lies in
bfloat16's range for ue4m3 / e4m3 / ue5m3 scales, so the bf16 operand is exact."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from reference.formats import get_format

from .launch import HAVE_TRITON, kernels
from .options import fmt_args, interpret, torch_decode
from .tables import code_values, e2m1_tables, scale_tables

__all__ = ["CodeCheck", "Operand", "operand", "finish", "check_codes", "raise_codes",
           "decode_bf16", "block_sq", "decode_operand"]


class CodeCheck(NamedTuple):
    """A code-range check: every code of ``codes`` must lie below ``limit``."""
    name: str
    codes: torch.Tensor
    limit: int
    fmt: str


@dataclass
class Operand:
    """One operand as codes; float32 values are decoded only where a slow path needs them."""
    codes: torch.Tensor     # uint8 e2m1 codes [R, K] (one per byte) or packed [R, K/2]
    packed: bool
    scode: torch.Tensor     # uint8 scale codes [R, nb]
    sfmt: str
    K: int
    scales: torch.Tensor | None = None  # decoded scales float32 [R, nb] (``finish``)
    bad: torch.Tensor | None = None     # bool [R]: a non-finite scale in the row
    _vals: torch.Tensor | None = None

    @property
    def R(self) -> int:
        return self.codes.shape[0]

    def values(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """e2m1 values float32 [R, K] (or of the given rows)."""
        if rows is None and self._vals is not None:
            return self._vals
        c = self.codes if rows is None else self.codes[rows]
        if self.packed:
            c = torch.stack((c & 0xF, c >> 4), -1).reshape(c.shape[0], -1)
        v = code_values("float4_e2m1fn", c.device)[c.long()]
        if rows is None:
            self._vals = v
        return v

    @property
    def vals(self) -> torch.Tensor:
        return self.values()


def check_codes(checks: list[CodeCheck]) -> None:
    """Raise for the first check whose codes reach its limit; one host sync for all."""
    checks = [c for c in checks if c.codes.numel()]
    if not checks:
        return
    mx = torch.stack([c.codes.max() for c in checks]).tolist()   # all uint8
    raise_codes([(c.name, m, c.limit, c.fmt) for c, m in zip(checks, mx)])


def raise_codes(items) -> None:
    """Raise for the first (name, max code, limit, fmt) whose max reaches the limit."""
    for name, m, lim, fmt in items:
        if m >= lim and fmt == "e2m1":
            raise ValueError(f"{name}: codes must be 4-bit e2m1 codes (0..15) when unpacked")
        if m >= lim:
            raise ValueError(f"{name}: {fmt} codes must lie in [0, {lim - 1}] (sign bit 0), "
                             f"got {m}")


def _codes(name: str, x: torch.Tensor, rows: int | None, K: int | None,
           checks: list | None = None) -> torch.Tensor:
    """e2m1 codes as uint8 [rows, K]: accepts one code per byte, or packed bytes
    (uint8 [rows, K/2] / float4_e2m1fn_x2), low nibble first."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor of e2m1 codes, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if x.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        x = x.view(torch.uint8)
        packed = True
    elif x.dtype == torch.uint8:
        packed = K is not None and x.shape[1] * 2 == K
    else:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported; valid choices: uint8 codes "
                         "(one per byte or two per byte), torch.float4_e2m1fn_x2")
    if packed:
        x = torch.stack((x & 0xF, x >> 4), -1).reshape(x.shape[0], -1)
    elif checks is None:
        check_codes([CodeCheck(name, x, 16, "e2m1")])
    else:
        checks.append(CodeCheck(name, x, 16, "e2m1"))
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name}: expected {rows} rows, got {x.shape[0]}")
    if K is not None and x.shape[1] != K:
        raise ValueError(f"{name}: expected K={K} codes per row, got {x.shape[1]}")
    return x.contiguous()


def _scale_codes(name: str, s: torch.Tensor, sfmt: str, checks: list | None = None) -> torch.Tensor:
    """Scale codes as uint8; the range check goes into ``checks`` (one sync later) if given."""
    if not isinstance(s, torch.Tensor) or s.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor of {sfmt} scale codes, got "
                         f"{getattr(s, 'shape', type(s).__name__)}")
    allowed = {torch.uint8: None, getattr(torch, "float8_e4m3fn", None): "float8_e4m3fn",
               getattr(torch, "float8_e8m0fnu", None): "float8_e8m0fnu"}
    if s.dtype not in allowed:
        raise ValueError(f"{name}: dtype {s.dtype} is not supported; valid choices: uint8 codes, "
                         "torch.float8_e4m3fn, torch.float8_e8m0fnu")
    implied = allowed[s.dtype]
    if implied is not None and implied != sfmt:
        raise ValueError(f"{name}: dtype {s.dtype} holds {implied} scales but the scale format is "
                         f"{sfmt}; valid choices: uint8 codes or the matching float8 dtype")
    s = s.view(torch.uint8) if s.dtype != torch.uint8 else s
    check = CodeCheck(name, s, get_format(sfmt).ncodes, sfmt)
    if checks is None:
        check_codes([check])
    else:
        checks.append(check)
    return s.contiguous()


def _is_packed(codes, s: torch.Tensor, block: int) -> bool:
    """Packed bytes: float4_e2m1fn_x2, or uint8 with half the codes the scales imply."""
    if isinstance(codes, torch.Tensor) and codes.dim() == 2 and codes.dtype == torch.uint8 \
            and codes.shape[1] * 2 == s.shape[1] * block and codes.shape[0] == s.shape[0]:
        return True
    x2 = getattr(torch, "float4_e2m1fn_x2", None)
    return isinstance(codes, torch.Tensor) and codes.dtype == x2


def operand(name, codes, scales, sfmt, block, checks=None) -> Operand:
    """The checked operand ``name`` ("a" / "b").  checks: a list the code-range checks are
    appended to, run by the caller's ``check_codes`` (one host sync for both operands) before
    any table look-up; None: checked here."""
    own = checks is None
    checks = [] if own else checks
    s = _scale_codes(f"{name}_scales", scales, sfmt, checks)
    packed = _is_packed(codes, s, block)
    if packed:
        if codes.dim() != 2:
            raise ValueError(f"{name}_codes: expected a 2-D tensor of e2m1 codes, got "
                             f"{tuple(codes.shape)}")
        c = codes.view(torch.uint8).contiguous()
        K = 2 * c.shape[1]
    else:
        c = _codes(f"{name}_codes", codes, None, None, checks)
        K = c.shape[1]
    if K % block:
        raise ValueError(f"{name}_codes: K={K} is not a multiple of block={block}")
    if tuple(s.shape) != (c.shape[0], K // block):
        raise ValueError(f"{name}_scales: shape {tuple(s.shape)} does not match "
                         f"[rows, K // block] = [{c.shape[0]}, {K // block}]")
    op = Operand(c, packed, s, sfmt, K)
    if own:
        check_codes(checks)
        finish(op)
    return op


def finish(op: Operand) -> Operand:
    """Decoded scales and special rows, once the codes are checked (look-ups need them
    in range)."""
    op.scales = code_values(op.sfmt, op.scode.device)[op.scode.long()]
    op.bad = ~torch.isfinite(op.scales).all(1)
    return op


def block_sq(op: Operand, block: int) -> torch.Tensor:
    """Per row and block: sum of the squared e2m1 values, float32 [R, nb]; exact (multiples of
    1/4 below 2**11), so equal to the float64 sum of squares."""
    t = e2m1_tables(op.codes.device)
    if op.packed:
        q = t.sqb[op.codes.long()]
        return q.view(op.R, op.K // block, block // 2).sum(-1)
    q = t.sq[op.codes.long()]
    return q.view(op.R, op.K // block, block).sum(-1)


def decode_bf16(op: Operand, block: int, scale: bool, want_sq: bool, stats=None, slot: int = 0):
    """(bf16 [R, K] = a * s_a (or a alone when not ``scale``), exact; per-block sums of squares
    float32 [R, nb] or None).  One fused Triton pass (torch fallback: FP4REF_GEMM_TORCH_DECODE=1
    or no kernel available).  ``stats`` (int32, zeros; kernel pass only): the pass also checks
    the code ranges, stats[slot] / [slot + 1] = max e2m1 / scale code where out of range."""
    R, K = op.R, op.K
    nb = K // block
    dev = op.codes.device
    tabs = scale_tables(op.sfmt, dev)
    if torch_decode() or not HAVE_TRITON or not (dev.type == "cuda" or interpret()) or R * K == 0:
        v = op.values()
        if scale:
            sa = tabs.sane[op.scode.long()]
            v = v * sa.repeat_interleave(block, 1)
        return v.to(torch.bfloat16), (block_sq(op, block) if want_sq else None)
    out = torch.empty(R, K, dtype=torch.bfloat16, device=dev)
    sq = torch.empty(R, nb, dtype=torch.float32, device=dev) if want_sq else out
    codes = op.codes if op.packed else op.codes.view(torch.int16)   # two codes per word
    HB = block // 2
    NBP = max(1, 2048 // HB)                # 4 KiB of codes (unpacked) / 8 KiB bf16 per program
    nbt = R * nb
    grid = (-(-nbt // NBP),)
    check = stats is not None
    kernels().decode[grid](codes, op.scode, tabs.sane_256, code_values("float4_e2m1fn", dev),
                           out.view(torch.int32), sq, stats[slot:] if check else sq, nbt, 16,
                           get_format(op.sfmt).ncodes, HB=HB, NBP=NBP, PACKED=op.packed,
                           SCALE=scale, WANT_SQ=want_sq, I64=(nbt * HB >= 2 ** 31 - NBP * HB),
                           CHECK=check, num_warps=4)
    return out, (sq if want_sq else None)


def decode_operand(codes: torch.Tensor, scales: torch.Tensor, fmt: str = "nvfp4", *,
                   scale_fmt: str | None = None, block: int | None = None):
    """(values [R, K] float32, block scales [R, K/B] float32): the exact decoded operand,
    as ``fp4ref.gemm.emulate`` takes it (transpose the B side for emulate's [K, N])."""
    sfmt, block = fmt_args(fmt, scale_fmt, block)
    s = _scale_codes("scales", scales, sfmt)
    K = s.shape[1] * block
    c = _codes("codes", codes, s.shape[0], K)
    return code_values("float4_e2m1fn", c.device)[c.long()], code_values(sfmt, s.device)[s.long()]
