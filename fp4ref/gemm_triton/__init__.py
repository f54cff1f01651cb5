"""Triton GEMMs on block-scaled FP4 operands, bit-identical to ``reference.gemm``.

``blockscaled_mm(a_codes, a_scales, b_codes, b_scales, fmt=..., model=...)`` computes
C = A @ B^T (A: M x K, B: N x K, both K-major, as a Linear layer's X and W) for
NVFP4 (e2m1 + ue4m3/e4m3 scales, block 16, per-tensor scales as ``alpha``),
MXFP4 (e2m1 + e8m0, block 32) and UE5M3 (e2m1 + ue5m3, block 16; block 32 too)
under ``probe_matched``, ``probe_matched_lattice`` and ``decoded_fp32``.

Why it is exact (each step is an exact operation, or one IEEE-rounded operation
that is the model's own rounding):

* Operands: a * s_a (e2m1 value times its block scale) has at most 6
  significant bits and lies in bfloat16's range for ue4m3/e4m3/ue5m3 scales, so
  the bf16 operands A' = a * s_a and B' = b * s_b are exact.  All products of one
  block share the unit 2**(e_a + e_b - 2) (e = exponent of the scale's last bit).
* Tensor-core dots: a dot of bf16 values with FP32 accumulation is exact when
  every product and partial sum is a multiple of a unit u below 2**23 * u (no bit
  is lost by alignment to a >= 23-bit window, and the result is an FP32 value).
  A single block (16 or 32 products) always satisfies it (< 2**20 u).  Two blocks
  (32 products, "pair") satisfy it when a Cauchy-Schwarz bound from per-block
  norms says so; the host checks this per 128x128 output tile (``_route``; per call a
  kernel computes the per-tile bounds, ``_pair_bounds``, and the BLOCK scheme is built
  only when some tile fails the certificate).
* Group of 64 (probe_matched): pair tiles: S = fl(t0 + t1) of two exact FP32
  pair sums is the RNE rounding of the exact group sum (IEEE addition of two
  floats is correctly rounded).  Block tiles: four exact block sums are added
  exactly as H + L with a per-output offset M = 1.5 * 2**23 * Q (Q a power of two
  chosen from per-row and per-column bounds): R += t rounds t to a multiple of Q
  (R stays in one binade), t - (R_new - R) is the exact remainder, the remainders
  sum exactly, and S = fl((R - M) + L) is again one correct rounding.  MXFP4
  groups are two single-block sums t_b = D_b * 2**(e_a + e_b) (exact when the
  host's range check holds), S = fl(t0 + t1).
* Cross-group: outer = add_rz(outer, S), an FP32 add rounded toward zero
  (libdevice __nv_fadd_rz on GPU; an exact TwoSum-based emulation otherwise).
* decoded_fp32: acc = fma(a*s_a, b*s_b, acc) per k in order; the product is an
  exact FP32 value, so the FMA is the FP32 RNE add of the reference.
* Everything the checks do not cover (non-finite scales, tiles whose bounds fail,
  MX exponents out of range) is recomputed by the exact torch emulator
  ``fp4ref.gemm.emulate``; lattice and alpha are applied afterwards in FP32
  (exact IEEE ops, or the emulator's exact products for non-FP32 alpha).

Memory: the bf16 operands (M*K + N*K), scale tables (M*K/16 + N*K/16) and the
output; no M x N x K/B intermediates.  Tests: tests/test_gemm_triton.py (GPU:
``python -m pytest -q -m gpu tests/test_gemm_triton.py``); benchmark:
``fp4ref.bench_gemm``.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from fractions import Fraction

import torch

from reference.errors import check_choice
from reference.formats import get_format
from reference.gemm import PRESETS, GemmModel

try:  # triton is optional (pyproject extra "gpu")
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice
    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the machine
    triton = tl = libdevice = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "FORMATS", "blockscaled_mm", "decode_operand", "quantize_operand",
           "available"]

# fmt -> (default scale format, allowed scale formats, default block, allowed blocks)
FORMATS = {
    "nvfp4": ("ue4m3", ("ue4m3", "float8_e4m3fn"), 16, (16, 32)),
    "mxfp4": ("float8_e8m0fnu", ("float8_e8m0fnu",), 32, (32,)),
    "ue5m3": ("ue5m3", ("ue5m3",), 16, (16, 32)),
}
_MODELS = ("probe_matched", "probe_matched_lattice", "decoded_fp32")
_WIN = 23           # tensor-core exactness window (bits): bound < 2**_WIN * unit
_PAIR, _BLOCK, _FIX = 0, 1, 2


def available() -> bool:
    return HAVE_TRITON and torch.cuda.is_available()


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ---------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------
_LUTS: dict = {}


def _lut(fmt: str, device) -> torch.Tensor:
    key = (fmt, str(device))
    if key not in _LUTS:
        spec = get_format(fmt)
        vals = [float(spec.decode(c)) for c in range(spec.ncodes)]
        _LUTS[key] = torch.tensor(vals, dtype=torch.float32, device=device)
    return _LUTS[key]


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
        _check_max([(name, x, 16, "e2m1")])
    else:
        checks.append((name, x, 16, "e2m1"))
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
    if checks is None:
        _check_max([(name, s, get_format(sfmt).ncodes, sfmt)])
    else:
        checks.append((name, s, get_format(sfmt).ncodes, sfmt))
    return s.contiguous()


def _check_max(checks):
    """Raise for the first (name, codes, limit, fmt) whose codes reach limit; one host sync
    for all of them."""
    checks = [c for c in checks if c[1].numel()]
    if not checks:
        return
    mx = torch.stack([c[1].max() for c in checks]).tolist()   # all uint8
    _raise_codes([(name, m, lim, fmt) for (name, _, lim, fmt), m in zip(checks, mx)])


def _raise_codes(items):
    """Raise for the first (name, max code, limit, fmt) whose max reaches the limit."""
    for name, m, lim, fmt in items:
        if m >= lim and fmt == "e2m1":
            raise ValueError(f"{name}: codes must be 4-bit e2m1 codes (0..15) when unpacked")
        if m >= lim:
            raise ValueError(f"{name}: {fmt} codes must lie in [0, {lim - 1}] (sign bit 0), "
                             f"got {m}")


def decode_operand(codes: torch.Tensor, scales: torch.Tensor, fmt: str = "nvfp4", *,
                   scale_fmt: str | None = None, block: int | None = None):
    """(values [R, K] float32, block scales [R, K/B] float32): the exact decoded operand,
    as ``fp4ref.gemm.emulate`` takes it (transpose the B side for emulate's [K, N])."""
    sfmt, block = _fmt_args(fmt, scale_fmt, block)
    s = _scale_codes("scales", scales, sfmt)
    K = s.shape[1] * block
    c = _codes("codes", codes, s.shape[0], K)
    return _lut("float4_e2m1fn", c.device)[c.long()], _lut(sfmt, s.device)[s.long()]


def quantize_operand(x: torch.Tensor, fmt: str = "nvfp4", *, block: int | None = None,
                     scale_fmt: str | None = None):
    """Simple amax/6 block quantizer (RNE) for tests and benchmarks: (codes uint8 [R, K],
    scale codes uint8 [R, K/B], per-tensor factor float).  Not a training recipe."""
    from fp4ref.cast import quantize as cast_q
    sfmt, block = _fmt_args(fmt, scale_fmt, block)
    R, K = x.shape
    xf = x.float()
    g = float(xf.abs().max()) if xf.numel() else 0.0
    ts = 1.0
    if fmt == "nvfp4":
        ts = g / (448 * 6) if g > 0 else 1.0
    elif fmt == "ue5m3":
        ts = g / (448 * 6) if g > 0 else 1.0
    ts = float(torch.tensor(ts, dtype=torch.float32))
    xb = (xf / ts).view(R, K // block, block)
    amax = xb.abs().amax(-1)
    s = amax / 6
    sc = cast_q(s, sfmt, "rne" if sfmt != "float8_e8m0fnu" else "rup")
    sv = _lut(sfmt, x.device)[sc.long()]
    sv = torch.where(sv > 0, sv, torch.ones_like(sv))
    q = torch.where(sv[..., None] > 0, xb / sv[..., None], torch.zeros_like(xb)).clamp(-6, 6)
    codes = cast_q(q.reshape(R, K), "float4_e2m1fn", "rne")
    sc = torch.where(_lut(sfmt, x.device)[sc.long()] > 0, sc,
                     torch.full_like(sc, get_format(sfmt).encode_magnitude(Fraction(1))))
    return codes.to(torch.uint8), sc.to(torch.uint8), ts


def _fmt_args(fmt, scale_fmt, block):
    fmt = check_choice("fmt", fmt, FORMATS)
    dsf, sfs, dblk, blks = FORMATS[fmt]
    sfmt = dsf if scale_fmt is None else scale_fmt
    check_choice("scale_fmt", sfmt, sfs)
    block = dblk if block is None else block
    if block not in blks:
        raise ValueError(f"block: {block!r} is not supported for {fmt}; valid choices: "
                         + ", ".join(map(str, blks)))
    return sfmt, block


# ---------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------
def _build():
    """Define the kernels (lazily, so TRITON_INTERPRET is read at first use)."""
    global _add_rz, _add_rn, _tile, _dot, _e2m1_val  # jit callees are looked up in module globals
    @triton.jit
    def _add_rz(x, y, RZ: tl.constexpr):
        if RZ == 0:   # PTX add.rz.f32 (no .ftz): keeps subnormals
            return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [x, y],
                                             dtype=tl.float32, is_pure=True, pack=1)
        if RZ == 2:
            return libdevice.add_rz(x, y)
        # TwoSum: s = RN(x + y), e = exact error; RZ is s, or s one step toward zero
        s = x + y
        bb = s - x
        e = (x - (s - bb)) + (y - bb)
        bits = s.to(tl.int32, bitcast=True)
        adj = (e != 0) & ((e < 0) != (s < 0))
        r = tl.where(adj, (bits - 1).to(tl.float32, bitcast=True), s)
        fmax = 3.4028234663852886e38
        ovf = (tl.abs(x) <= fmax) & (tl.abs(y) <= fmax) & (tl.abs(s) > fmax)
        return tl.where(ovf, tl.where(s < 0, -fmax, fmax), r)

    @triton.jit
    def _add_rn(x, y, ASM: tl.constexpr):
        # opaque to the compiler: Triton rewrites dot(a, b) + c into dot(a, b, acc=c), which
        # would move this RNE add into the tensor core's own accumulation
        if ASM:
            return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [x, y],
                                             dtype=tl.float32, is_pure=True, pack=1)
        return x + y

    @triton.jit
    def _tile(tiles, pid, M, N, NT, BM: tl.constexpr, BN: tl.constexpr):
        t = tl.load(tiles + pid)
        tm = t // NT
        tn = t % NT
        rm = tm * BM + tl.arange(0, BM)
        rn = tn * BN + tl.arange(0, BN)
        return rm, rn

    @triton.jit
    def _dot(a, b, F32: tl.constexpr):
        if F32:  # the interpreter's bf16 dot is unreliable; fp32 inputs are exact too
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _pair_kernel(A, B, C, tiles, M, N, K: tl.constexpr, NT, alpha,
                     BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
                     ALPHA: tl.constexpr):
        pid = tl.program_id(0)
        rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
        rk = tl.arange(0, 32)
        mm = rm < M
        nm = rn < N
        ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
        bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
        outer = tl.zeros((BM, BN), dtype=tl.float32)
        for g in range(0, K, 64):
            k0 = g + rk
            k1 = g + 32 + rk
            a0 = tl.load(ap + g, mask=mm[:, None] & (k0[None, :] < K), other=0.0)
            b0 = tl.load(bp + g, mask=nm[None, :] & (k0[:, None] < K), other=0.0)
            a1 = tl.load(ap + g + 32, mask=mm[:, None] & (k1[None, :] < K), other=0.0)
            b1 = tl.load(bp + g + 32, mask=nm[None, :] & (k1[:, None] < K), other=0.0)
            t0 = _dot(a0, b0, F32)
            t1 = _dot(a1, b1, F32)
            outer = _add_rz(outer, _add_rn(t0, t1, not F32), RZ)
        if ALPHA:
            outer = outer * alpha
        cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(cp, outer, mask=mm[:, None] & nm[None, :])

    @triton.jit
    def _block_kernel(A, B, C, MA, QB, tiles, M, N, K: tl.constexpr, NT, NG, alpha,
                      BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
                      ALPHA: tl.constexpr):
        pid = tl.program_id(0)
        rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
        rk = tl.arange(0, 16)
        mm = rm < M
        nm = rn < N
        ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
        bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
        outer = tl.zeros((BM, BN), dtype=tl.float32)
        for g in range(0, K, 64):
            gi = g // 64
            ma = tl.load(MA + rm.to(tl.int64) * NG + gi, mask=mm, other=1.0)
            qb = tl.load(QB + rn.to(tl.int64) * NG + gi, mask=nm, other=1.0)
            m0 = ma[:, None] * qb[None, :]           # 1.5 * 2**23 * Q, exact
            r = m0
            lo = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(4):
                kk = g + 16 * j + rk
                a = tl.load(ap + g + 16 * j, mask=mm[:, None] & (kk[None, :] < K), other=0.0)
                b = tl.load(bp + g + 16 * j, mask=nm[None, :] & (kk[:, None] < K), other=0.0)
                t = _dot(a, b, F32)
                r2 = _add_rn(r, t, not F32)           # t rounded to a multiple of Q
                lo = lo + (t - (r2 - r))              # exact remainder, exact sum
                r = r2
            s = (r - m0) + lo                         # one RNE rounding of the exact sum
            outer = _add_rz(outer, s, RZ)
        if ALPHA:  # the epilogue's scalar alpha, one FP32 RNE product (no add follows: no FMA)
            outer = outer * alpha
        cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(cp, outer, mask=mm[:, None] & nm[None, :])

    @triton.jit
    def _mx_kernel(A, B, C, FA, FB, tiles, M, N, K: tl.constexpr, NT, NB, alpha,
                   BM: tl.constexpr, BN: tl.constexpr, RZ: tl.constexpr, F32: tl.constexpr,
                   ALPHA: tl.constexpr):
        pid = tl.program_id(0)
        rm, rn = _tile(tiles, pid, M, N, NT, BM, BN)
        rk = tl.arange(0, 32)
        mm = rm < M
        nm = rn < N
        ap = A + rm[:, None].to(tl.int64) * K + rk[None, :]
        bp = B + rn[None, :].to(tl.int64) * K + rk[:, None]
        outer = tl.zeros((BM, BN), dtype=tl.float32)
        for g in range(0, K, 64):
            s = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(2):
                kk = g + 32 * j + rk
                a = tl.load(ap + g + 32 * j, mask=mm[:, None] & (kk[None, :] < K), other=0.0)
                b = tl.load(bp + g + 32 * j, mask=nm[None, :] & (kk[:, None] < K), other=0.0)
                blk = (g + 32 * j) // 32
                fa = tl.load(FA + rm.to(tl.int64) * NB + blk, mask=mm & (blk < NB), other=0.0)
                fb = tl.load(FB + rn.to(tl.int64) * NB + blk, mask=nm & (blk < NB), other=0.0)
                t = _dot(a, b, F32) * (fa[:, None] * fb[None, :])  # exact (range-checked)
                s = _add_rn(s, t, not F32)                         # t0 + t1: one RNE rounding
            outer = _add_rz(outer, s, RZ)
        if ALPHA:  # the epilogue's scalar alpha, one FP32 RNE product (no add follows: no FMA)
            outer = outer * alpha
        cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(cp, outer, mask=mm[:, None] & nm[None, :])

    @triton.jit
    def _decoded_kernel(AT, BT, C, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        pm = tl.program_id(0)
        pn = tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        mm = rm < M
        nm = rn < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K):
            a = tl.load(AT + k * M + rm, mask=mm, other=0.0)
            b = tl.load(BT + k * N + rn, mask=nm, other=0.0)
            acc = acc + a[:, None] * b[None, :]   # exact product: FP32 RNE add (FMA or not)
        cp = C + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(cp, acc, mask=mm[:, None] & nm[None, :])

    @triton.jit
    def _e2m1_val(c):
        # e2m1 code -> float32 bits: m = 1 is 0.5; m >= 2 is (1 + (m & 1) / 2) * 2**((m >> 1) - 1)
        m = c & 7
        bits = tl.where(m >= 2, ((126 + (m >> 1)) << 23) | ((m & 1) << 22),
                        tl.where(m == 1, 126 << 23, 0))
        return (bits | ((c >> 3) << 31)).to(tl.float32, bitcast=True)

    @triton.jit
    def _decode_kernel(CODES, SC, SLUT, VLUT, OUT, SQ, STATS, NBT, LIMC, LIMS, HB: tl.constexpr,
                       NBP: tl.constexpr, PACKED: tl.constexpr, SCALE: tl.constexpr,
                       WANT_SQ: tl.constexpr, I64: tl.constexpr, CHECK: tl.constexpr):
        # operand blocks are contiguous: block i = code words [i*HB, (i+1)*HB) (a word = two
        # codes: a packed byte, or two one-code bytes read as int16), scale code i, output
        # int32 words [i*HB, (i+1)*HB) holding two bf16 values (low half first)
        pid = tl.program_id(0)
        if I64:
            bi = pid.to(tl.int64) * NBP + tl.arange(0, NBP)
        else:
            bi = pid * NBP + tl.arange(0, NBP)
        bm = bi < NBT
        off = bi[:, None] * HB + tl.arange(0, HB)[None, :]
        w = tl.load(CODES + off, mask=bm[:, None], other=0).to(tl.int32)
        if CHECK:  # code-range check (host reads STATS later); SLUT has 256 entries
            if not PACKED:
                cm = tl.maximum(tl.max(w & 255), tl.max((w >> 8) & 255))
                tl.atomic_max(STATS, cm, mask=cm >= LIMC)   # only bad codes: no contention
            sm = tl.max(tl.load(SC + bi, mask=bm, other=0).to(tl.int32))
            tl.atomic_max(STATS + 1, sm, mask=sm >= LIMS)
        lo = w & 15
        if PACKED:
            hi = (w >> 4) & 15
        else:
            hi = (w >> 8) & 15
        vlo = _e2m1_val(lo)               # e2m1 values, by their float32 bits
        vhi = _e2m1_val(hi)
        if WANT_SQ:                       # multiples of 1/4 below 2**11: exact in any order
            tl.store(SQ + bi, tl.sum(vlo * vlo + vhi * vhi, axis=1), mask=bm)
        if SCALE:
            sc = tl.load(SC + bi, mask=bm, other=0).to(tl.int32)
            s = tl.load(SLUT + sc)        # scale value, 0 where not finite
            vlo = vlo * s[:, None]        # exact: <= 6 significant bits, in bf16's range
            vhi = vhi * s[:, None]
        ulo = vlo.to(tl.uint32, bitcast=True)
        uhi = vhi.to(tl.uint32, bitcast=True)
        word = (uhi & 0xFFFF0000) | (ulo >> 16)   # bf16 = high half of the (exact) fp32
        tl.store(OUT + off, word.to(tl.int32, bitcast=True), mask=bm[:, None])

    @triton.jit
    def _bounds_kernel(SQA, SCA, SQB, SCB, XN, BAD, STATS, SQRT, SANE, UE1, NF, RA, RB, MT, TA, TB,
                       NB, NBP, SQN, NP: tl.constexpr, TM: tl.constexpr, PC: tl.constexpr,
                       XON: tl.constexpr):
        # one row tile of A (t < MT) or B: XN[t, b] = max over the tile's rows of the
        # pair-normalized bound X * 2**-up (``_side_bounds`` + ``pair_norm`` of ``_route``,
        # same float64 operations); BAD[row] = a non-finite scale in the row
        t = tl.program_id(0)
        isa = t < MT
        if isa:
            sqp = SQA
            scp = SCA
        else:
            sqp = SQB
            scp = SCB
        R = tl.where(isa, RA, RB)
        T = tl.where(isa, TA, TB)
        r0 = tl.where(isa, t * TA, (t - MT) * TB)
        ri = tl.arange(0, TM)
        rows = r0 + ri
        rm = (ri < T) & (rows < R)
        roff = rows.to(tl.int64) * NB
        cst = tl.load(SQRT + SQN)              # 1 + 2**-40 (float64)
        bad = tl.zeros((TM,), dtype=tl.int32)
        for p0 in range(0, NP, PC):          # NP = NBP / 2 pairs (constexpr, as K elsewhere)
            c0 = 2 * (p0 + tl.arange(0, PC))
            c1 = c0 + 1
            m0 = rm[:, None] & (c0[None, :] < NB)
            m1 = rm[:, None] & (c1[None, :] < NB)
            s0 = tl.load(scp + roff[:, None] + c0[None, :], mask=m0, other=0).to(tl.int32)
            s1 = tl.load(scp + roff[:, None] + c1[None, :], mask=m1, other=0).to(tl.int32)
            bad = tl.maximum(bad, tl.max(tl.maximum(tl.load(NF + s0), tl.load(NF + s1)), axis=1))
            if XON:
                q0 = tl.load(sqp + roff[:, None] + c0[None, :], mask=m0, other=0.0)
                q1 = tl.load(sqp + roff[:, None] + c1[None, :], mask=m1, other=0.0)
                # |s| * sqrt(sq) * (1 + 2**-40): sq is a multiple of 1/4, sqrt by table
                k0 = tl.minimum((q0 * 4).to(tl.int32), SQN - 1)   # <= 144 * block anyway
                k1 = tl.minimum((q1 * 4).to(tl.int32), SQN - 1)
                x0 = tl.load(SANE + s0) * tl.load(SQRT + k0) * cst
                x1 = tl.load(SANE + s1) * tl.load(SQRT + k1) * cst
                u0 = tl.where(x0 > 0, tl.load(UE1 + s0), 1 << 20)
                u1 = tl.where(x1 > 0, tl.load(UE1 + s1), 1 << 20)
                e = tl.minimum(tl.maximum(-tl.minimum(u0, u1), -1022), 1022)
                p2 = ((e + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
                xo = XN + t.to(tl.int64) * NBP
                tl.store(xo + c0, tl.max(x0 * p2, axis=0), mask=c0 < NBP)
                tl.store(xo + c1, tl.max(x1 * p2, axis=0), mask=c1 < NBP)
        tl.store(BAD + tl.where(isa, 0, RA) + rows, bad.to(tl.uint8), mask=rm)
        nbad = tl.sum(bad)
        tl.atomic_add(STATS + tl.where(isa, 4, 5), nbad, mask=nbad > 0)

    return dict(pair=_pair_kernel, block=_block_kernel, mx=_mx_kernel, decoded=_decoded_kernel,
                decode=_decode_kernel, bounds=_bounds_kernel)


_KERNELS: dict = {}


def _k(name):
    key = _interpret()
    if key not in _KERNELS:
        _KERNELS[key] = _build()
    return _KERNELS[key][name]


# ---------------------------------------------------------------------------
# host side: checks, routing, fixup, epilogue
# ---------------------------------------------------------------------------
@dataclass
class _Op:
    """One operand as codes; float32 values are decoded only where a slow path needs them."""
    codes: torch.Tensor     # uint8 e2m1 codes [R, K] (one per byte) or packed [R, K/2]
    packed: bool
    scode: torch.Tensor     # uint8 scale codes [R, nb]
    sfmt: str
    K: int
    scales: torch.Tensor    # decoded scales float32 [R, nb] (may be non-finite)
    bad: torch.Tensor       # bool [R]: a non-finite scale in the row
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
        v = _lut("float4_e2m1fn", c.device)[c.long()]
        if rows is None:
            self._vals = v
        return v

    @property
    def vals(self) -> torch.Tensor:
        return self.values()


def _prep(name, codes, scales, sfmt, block, rows=None, checks=None) -> _Op:
    """checks: a list the code-range checks are appended to, run by the caller's
    ``_check_max`` (one host sync for both operands) before any table look-up."""
    own = checks is None
    checks = [] if own else checks
    s = _scale_codes(f"{name}_scales", scales, sfmt, checks)
    if isinstance(codes, torch.Tensor) and codes.dim() == 2 and codes.dtype == torch.uint8 \
            and codes.shape[1] * 2 == s.shape[1] * block and codes.shape[0] == s.shape[0]:
        packed = True
    elif isinstance(codes, torch.Tensor) and codes.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        packed = True
    else:
        packed = False
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
    op = _Op(c, packed, s, sfmt, K, None, None)
    if own:
        _check_max(checks)
        _finish(op)
    return op


def _finish(op: _Op) -> _Op:
    """Decoded scales and special rows, once the codes are checked (look-ups need them
    in range)."""
    op.scales = _lut(op.sfmt, op.scode.device)[op.scode.long()]
    op.bad = ~torch.isfinite(op.scales).all(1)
    return op


_AUX: dict = {}


def _aux(kind: str, sfmt: str, device) -> torch.Tensor:
    """Small per-code tables: "sane" (scale value, 0 where not finite), "ue" (unit exponent of
    a finite nonzero scale, int64), "sane64" / "ue1" (|sane| as float64, ue - 1), "sq"
    (float32 square of an e2m1 value, per code), "sqb"
    (per packed byte: square of the low plus the high nibble's value; exact)."""
    key = (kind, sfmt, str(device))
    if key not in _AUX and kind.endswith(":256"):
        # padded to 256 codes (0 past the format's codes, ints as int32) for look-ups that run
        # before the code-range check is read back: any uint8 code stays in bounds
        if kind == "nf:256":   # 1 where the scale is not finite
            t = (~torch.isfinite(_lut(sfmt, "cpu"))).int()
        else:
            t = _aux(kind[:-4], sfmt, "cpu")
            t = t.int() if t.dtype == torch.int64 else t
        _AUX[key] = torch.cat([t, t.new_zeros(256 - t.numel())]).to(device)
    if key not in _AUX and kind.startswith("sqrt"):
        # float64 sqrt(k / 4) for the block's sums of squares k / 4 <= 36 * block (exact
        # multiples of 1/4), then the bound's factor 1 + 2**-40 (``_side_bounds``)
        k = torch.arange(4 * 36 * int(kind[4:]) + 1, dtype=torch.float64)
        t = torch.cat([torch.sqrt(k / 4), torch.tensor([1 + 2.0 ** -40], dtype=torch.float64)])
        _AUX[key] = t.to(device)
    if key not in _AUX and kind in ("sane64", "ue1"):   # |sane| as float64; ue - 1
        t = _aux("sane", sfmt, "cpu").double().abs() if kind == "sane64" else \
            _aux("ue", sfmt, "cpu") - 1
        _AUX[key] = t.to(device)
    if key not in _AUX:
        if kind in ("sane", "ue"):
            v = _lut(sfmt, "cpu")
            sane = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
            if kind == "sane":
                t = sane
            else:
                live = sane != 0
                t = torch.where(live, _unit_exp(torch.where(live, sane, torch.ones_like(sane))),
                                torch.zeros(v.shape, dtype=torch.int64))
        else:
            v = _lut("float4_e2m1fn", "cpu")
            sq = v * v                                           # exact (2 significant bits)
            t = sq if kind == "sq" else (sq[torch.arange(256) & 15] + sq[torch.arange(256) >> 4])
        _AUX[key] = t.to(device)
    return _AUX[key]


def _torch_decode() -> bool:
    return os.environ.get("FP4REF_GEMM_TORCH_DECODE", "0") == "1"


def _block_sq(op: _Op, block: int) -> torch.Tensor:
    """Per row and block: sum of the squared e2m1 values, float32 [R, nb]; exact (multiples of
    1/4 below 2**11), so equal to the float64 sum of squares."""
    if op.packed:
        q = _aux("sqb", "", op.codes.device)[op.codes.long()]
        return q.view(op.R, op.K // block, block // 2).sum(-1)
    q = _aux("sq", "", op.codes.device)[op.codes.long()]
    return q.view(op.R, op.K // block, block).sum(-1)


def _decode_bf16(op: _Op, block: int, scale: bool, want_sq: bool, stats=None, slot: int = 0):
    """(bf16 [R, K] = a * s_a (or a alone when not ``scale``), exact; per-block sums of squares
    float32 [R, nb] or None).  One fused Triton pass (torch fallback: FP4REF_GEMM_TORCH_DECODE=1
    or no kernel available).  ``stats`` (int32, zeros; kernel pass only): the pass also checks
    the code ranges, stats[slot] / [slot + 1] = max e2m1 / scale code where out of range."""
    R, K = op.R, op.K
    nb = K // block
    dev = op.codes.device
    sane = _aux("sane", op.sfmt, dev)
    if _torch_decode() or not HAVE_TRITON or not (dev.type == "cuda" or _interpret()) or R * K == 0:
        v = op.values()
        if scale:
            sa = sane[op.scode.long()]
            v = v * sa.repeat_interleave(block, 1)
        return v.to(torch.bfloat16), (_block_sq(op, block) if want_sq else None)
    out = torch.empty(R, K, dtype=torch.bfloat16, device=dev)
    sq = torch.empty(R, nb, dtype=torch.float32, device=dev) if want_sq else out
    codes = op.codes if op.packed else op.codes.view(torch.int16)   # two codes per word
    HB = block // 2
    NBP = max(1, 2048 // HB)                # 4 KiB of codes (unpacked) / 8 KiB bf16 per program
    nbt = R * nb
    grid = (triton.cdiv(nbt, NBP),)
    check = stats is not None
    _k("decode")[grid](codes, op.scode, _aux("sane:256", op.sfmt, dev), _lut("float4_e2m1fn", dev),
                       out.view(torch.int32), sq, stats[slot:] if check else sq, nbt, 16,
                       get_format(op.sfmt).ncodes, HB=HB, NBP=NBP, PACKED=op.packed, SCALE=scale,
                       WANT_SQ=want_sq, I64=(nbt * HB >= 2 ** 31 - NBP * HB), CHECK=check,
                       num_warps=4)
    return out, (sq if want_sq else None)


def _unit_exp(s: torch.Tensor) -> torch.Tensor:
    """Exponent of the last set bit of |s| (finite, nonzero), as int64; exact."""
    from fp4ref.gemm import _from_float
    return _from_float(s.abs()).E


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, e - 1, e).to(torch.int64)


def _side_bounds(op: _Op, sq: torch.Tensor, block: int, T: int):
    """Per row and block: X = |s| * ||a_block||_2 (an upper bound, float64) and the unit
    exponent of the products' A side (u = 2**(e_last(s) - 1)); padded to T rows.
    ``sq``: the exact per-block sums of squares (float32 [R, nb])."""
    R, nb = op.scode.shape
    sc = op.scode.long()
    # |s| as float64 and (unit exponent - 1) by table look-ups (tables made once per code)
    X = _aux("sane64", op.sfmt, sc.device)[sc] * torch.sqrt(sq.double()) * (1 + 2.0 ** -40)
    # X >= +0 and finite (|s| and sq are), so it is +0 exactly where not live
    ue = torch.where(X > 0, _aux("ue1", op.sfmt, sc.device)[sc], 1 << 20)
    pad = (-R) % T
    if pad:
        X = torch.cat([X, X.new_zeros(pad, nb)])
        ue = torch.cat([ue, ue.new_full((pad, nb), 1 << 20)])
    return X, ue


def _p2(e: torch.Tensor) -> torch.Tensor:
    from fp4ref.gemm import _pow2
    return _pow2(e)


def _pair_ok(XAn: torch.Tensor, XBn: torch.Tensor) -> torch.Tensor:
    """Pair certificate per tile, bool [Mt, Nt]: sum_b X'_ib Y'_jb < 2**_WIN over each pair,
    from the per-tile pair-normalized bounds XAn [Mt, nbp], XBn [Nt, nbp] (float64)."""
    (Mt, nbp), Nt = XAn.shape, XBn.shape[0]
    ok_pair = None
    step = max(1, (1 << 24) // max(1, Mt * Nt))
    for p0 in range(0, nbp // 2, step):  # [Mt, Nt, pairs] in bounded chunks
        xa = XAn.view(Mt, nbp // 2, 2)[:, p0:p0 + step]
        xb = XBn.view(Nt, nbp // 2, 2)[:, p0:p0 + step]
        tot = (xa[:, None] * xb[None]).sum(-1)
        ok = (tot < 2.0 ** _WIN).all(-1)
        ok_pair = ok if ok_pair is None else ok_pair & ok
    if ok_pair is None:
        ok_pair = torch.ones(Mt, Nt, dtype=torch.bool, device=XAn.device)
    return ok_pair


def _pair_bounds(A: _Op, B: _Op, block: int, BM: int, BN: int, sqa, sqb, stats):
    """One kernel pass over both operands' scale codes (and sums of squares when ``sqa`` is
    given): (XAn [Mt, nbp], XBn [Nt, nbp] as ``_route`` computes them, or None; A.bad / B.bad
    set; stats[4] / [5] = number of special rows).  Table look-ups are padded: safe before the
    code-range check is read back."""
    M, N, nb = A.R, B.R, A.scode.shape[1]
    Mt, Nt = -(-M // BM), -(-N // BN)
    dev = A.codes.device
    xon = sqa is not None
    nbp = -(-nb // 4) * 4
    XN = torch.empty(Mt + Nt, nbp, dtype=torch.float64, device=dev) if xon else stats
    bad = torch.empty(M + N, dtype=torch.bool, device=dev)
    sqrt = _aux(f"sqrt{block}", "", dev)
    tabs = [_aux(k, A.sfmt, dev) for k in ("sane64:256", "ue1:256", "nf:256")]
    _k("bounds")[(Mt + Nt,)](sqa if xon else A.scode, A.scode, sqb if xon else B.scode, B.scode,
                             XN, bad.view(torch.uint8), stats, sqrt, *tabs, M, N, Mt, BM, BN, nb,
                             nbp, sqrt.numel() - 1, NP=nbp // 2, TM=max(BM, BN), PC=16, XON=xon,
                             num_warps=4)
    A.bad, B.bad = bad[:M], bad[M:]
    return (XN[:Mt], XN[Mt:]) if xon else (None, None)


def _route_bounds(A: _Op, B: _Op, block: int, BM: int, BN: int, sqa=None, sqb=None):
    """Block 16: per-block bounds X and unit exponents u of both sides, padded to whole tiles
    and to a multiple of 4 blocks, and the per-tile pair-normalized maxima XAn [Mt, nbp],
    XBn [Nt, nbp] (the pair certificate's input; ``_pair_bounds`` is the kernel twin)."""
    M, K = A.R, A.K
    N = B.R
    Mt, Nt = -(-M // BM), -(-N // BN)
    XA, ua = _side_bounds(A, _block_sq(A, block) if sqa is None else sqa, block, BM)
    XB, ub = _side_bounds(B, _block_sq(B, block) if sqb is None else sqb, block, BN)
    nb = K // block
    nbp = -(-nb // 4) * 4
    if nbp != nb:
        XA = torch.cat([XA, XA.new_zeros(XA.shape[0], nbp - nb)], 1)
        XB = torch.cat([XB, XB.new_zeros(XB.shape[0], nbp - nb)], 1)
        ua = torch.cat([ua, ua.new_full((ua.shape[0], nbp - nb), 1 << 20)], 1)
        ub = torch.cat([ub, ub.new_full((ub.shape[0], nbp - nb), 1 << 20)], 1)
    # --- pair certificate: sum_b X'_ib Y'_jb < 2**_WIN over each pair, per tile
    def pair_norm(X, u):
        up = u.view(u.shape[0], nbp // 2, 2).amin(-1)          # pair unit exponent
        Xn = X.view(X.shape[0], nbp // 2, 2) * _p2((-up).clamp(-1022, 1022))[..., None]
        return Xn.view(X.shape[0], nbp)
    XAn = pair_norm(XA, ua).view(Mt, BM, nbp).amax(1)          # [Mt, nbp]
    XBn = pair_norm(XB, ub).view(Nt, BN, nbp).amax(1)          # [Nt, nbp]
    return XA, ua, XB, ub, XAn, XBn


def _route(A: _Op, B: _Op, block: int, BM: int, BN: int, sqa=None, sqb=None):
    """Tile modes [Mt, Nt] (PAIR / BLOCK / FIX) and the BLOCK kernel's offset tables.
    sqa / sqb: per-block sums of squares (from the decode kernel), computed here if None."""
    M, N = A.R, B.R
    Mt, Nt = -(-M // BM), -(-N // BN)
    dev = A.codes.device
    if block == 32:  # one block per half group: always exact
        return torch.zeros(Mt, Nt, dtype=torch.int64, device=dev), None, None
    XA, ua, XB, ub, XAn, XBn = _route_bounds(A, B, block, BM, BN, sqa, sqb)
    NG = XA.shape[1] // 4
    ok_pair = _pair_ok(XAn, XBn)
    # --- block (offset) scheme: Q = 2**(qa + qb), sum|t| <= 2**21 Q, Q <= 2**23 u_min
    SX = XA.view(-1, NG, 4).sum(-1)                            # [Mp, NG]
    MY = XB.view(-1, NG, 4).amax(-1)                           # [Np, NG]
    uga = ua.view(-1, NG, 4).amin(-1)
    ugb = ub.view(-1, NG, 4).amin(-1)
    sa_live, mb_live = SX > 0, MY > 0
    qa = torch.where(sa_live, _ceil_log2(SX) - 21, -30)
    qb = torch.where(mb_live, _ceil_log2(MY), 0)
    ra = torch.where(sa_live, qa - uga, -(1 << 20))
    rb = torch.where(mb_live, qb - ugb, -(1 << 20))
    raT = ra.view(Mt, BM, NG).amax(1)
    rbT = rb.view(Nt, BN, NG).amax(1)
    qaT_hi = qa.view(Mt, BM, NG).amax(1)
    qbT_hi = qb.view(Nt, BN, NG).amax(1)
    qaT_lo = qa.view(Mt, BM, NG).amin(1)
    qbT_lo = qb.view(Nt, BN, NG).amin(1)
    ok_blk = ((raT[:, None, :] + rbT[None, :, :]) <= 23).all(-1)
    ok_blk &= ((qaT_hi[:, None, :] + qbT_hi[None, :, :]) <= 100).all(-1)
    ok_blk &= ((qaT_lo[:, None, :] + qbT_lo[None, :, :]) >= -100).all(-1)
    mode = torch.where(ok_pair, _PAIR, torch.where(ok_blk, _BLOCK, _FIX))
    MA = (1.5 * 2.0 ** 23 * _p2(qa.clamp(-120, 120))).float()[:M].contiguous()
    QB = _p2(qb.clamp(-120, 120)).float()[:N].contiguous()
    return mode, MA, QB


def _route_mx(A: _Op, B: _Op, BM: int, BN: int):
    def ex(op, T):
        s = op.scales
        e = torch.where(torch.isfinite(s) & (s > 0), torch.frexp(s.double())[1].to(torch.int64) - 1,
                        torch.zeros_like(s, dtype=torch.int64))
        pad = (-e.shape[0]) % T
        if pad:
            e = torch.cat([e, e.new_zeros(pad, e.shape[1])])
        e = e.view(-1, T, e.shape[1])
        return e.amax((1, 2)), e.amin((1, 2))
    ahi, alo = ex(A, BM)
    bhi, blo = ex(B, BN)
    # t = D * 2**(ea + eb), D a multiple of 1/4 below 2**11: exact FP32 iff in range; a last
    # bit >= 2**-126 also keeps every sum normal, so flush-to-zero could not matter
    ok = ((ahi[:, None] + bhi[None, :]) <= 117) & ((alo[:, None] + blo[None, :]) >= -124)
    return torch.where(ok, _PAIR, _FIX)


_ORDERS: dict = {}


def _tile_order(Mt: int, Nt: int, group: int, dev):
    """(grouped-order key, linear index, all tiles in key order), flat [Mt * Nt] int64 on
    ``dev``; made once per shape (constant tensors: no per-call torch ops)."""
    k = (Mt, Nt, group, str(dev))
    if k not in _ORDERS:
        if len(_ORDERS) > 64:
            _ORDERS.clear()
        tm = torch.arange(Mt)[:, None].expand(Mt, Nt)
        tn = torch.arange(Nt)[None, :].expand(Mt, Nt)
        key = (((tm // group) * Nt + tn) * group + tm % group).reshape(-1)   # unique
        lin = (tm * Nt + tn).reshape(-1)
        _ORDERS[k] = tuple(t.to(dev) for t in (key, lin, lin[torch.argsort(key)]))
    return _ORDERS[k]


def _tile_lists(mode: torch.Tensor, extra: list | None = None, group: int = 8):
    """Linear indices of the PAIR and BLOCK tiles, each in grouped order (8 row tiles per
    column sweep) so concurrent CTAs share operand panels in L2; one host sync, which also
    reads the scalars in ``extra`` (tensors) back.  Returns (pair, block, fix count, extra)."""
    Mt, Nt = mode.shape
    key, lin, _ = _tile_order(Mt, Nt, group, mode.device)
    span = (Mt + group) * Nt
    m = mode.reshape(-1).long()
    order = torch.argsort((m * span + key))
    lin = lin[order]
    cnt = torch.stack([(m == _PAIR).sum(), (m == _BLOCK).sum(), (m == _FIX).sum()]
                      + [e.reshape(()).long() for e in (extra or [])]).tolist()
    n_p, n_b = cnt[0], cnt[1]
    return lin[:n_p].contiguous(), lin[n_p:n_p + n_b].contiguous(), cnt[2], cnt[3:]


def _check_model(model) -> GemmModel:
    if isinstance(model, str):
        check_choice("model", model, _MODELS)
        return PRESETS[model]
    if isinstance(model, GemmModel):
        for n in _MODELS:
            if PRESETS[n].replace(name=model.name) == model:
                return PRESETS[n]
    raise ValueError(f"model: {model!r} is not supported by the Triton path; valid choices: "
                     + ", ".join(_MODELS) + " (use fp4ref.gemm.emulate for other models)")


def _alpha_list(alpha, M, N, dev):
    """Scalar factors stay Python scalars (no [M, N] tensors); others go through the
    emulator's checks (broadcast, finite)."""
    from fp4ref.gemm import _alpha_factors
    if alpha is None:
        return None, []
    items = _alpha_scalars(alpha)
    if items is not None:
        return _alpha_premul([float(f) for f in items]), []
    return None, _alpha_factors(alpha, M, N, dev)


def _alpha_scalars(alpha):
    """The factors as a list when each is a number or a one-element tensor, else None."""
    items = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha]
    if all(isinstance(f, (int, float)) and not isinstance(f, bool)
           or (isinstance(f, torch.Tensor) and f.numel() == 1) for f in items):
        return items
    return None


def _alpha_premul(vals):
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:
        raise ValueError(f"alpha: non-finite value {bad[0]}; valid choices: finite numbers")
    # premultiplied alpha, exactly as reference.gemm: fp32(f0), then fp32(al * f)
    from reference.exact import exact
    from reference.gemm import _fp32, _mul
    al = _fp32(exact(vals[0]))
    for v in vals[1:]:
        al = _fp32(_mul(al, exact(v)))
    return float(al)


def _alpha_deferred(alpha, dev):
    """Scalar alphas read back in the caller's one host sync: (items, int32 parts to read).
    A float tensor on ``dev`` becomes its float64 bits (exact, as float(t)); the caller
    passes the read words to ``_alpha_values``.  None: not all scalars (``_alpha_list``)."""
    items = None if alpha is None else _alpha_scalars(alpha)
    if items is None:
        return None, []
    parts = [f.detach().reshape(1).to(torch.float64).view(torch.int32) for f in items
             if _alpha_read(f, dev)]
    return items, parts


def _alpha_read(f, dev) -> bool:
    return isinstance(f, torch.Tensor) and f.device == dev and f.dtype.is_floating_point


def _alpha_values(items, words, dev):
    """Python floats of the scalar factors; ``words``: int32 pairs read back for the tensors
    that ``_alpha_deferred`` chose (float64 bits in native byte order)."""
    vals, i = [], 0
    for f in items:
        if _alpha_read(f, dev):
            vals.append(struct.unpack("=d", struct.pack("=ii", words[i], words[i + 1]))[0])
            i += 2
        else:
            vals.append(float(f))
    return vals


def _epilogue(c: torch.Tensor, model: GemmModel, alpha) -> torch.Tensor:
    scalar, factors = alpha
    if model.lattice is not None:
        L = float(model.lattice)
        fin = torch.isfinite(c) & (c.abs() < 2.0 ** 20)
        c = torch.where(fin, torch.round(c * (1 / L)) * L, c)  # exact scalings, RNE to integer
    if scalar is not None:
        c = c * torch.tensor(scalar, dtype=torch.float32, device=c.device)  # FP32 RNE product
    if factors:  # tensor factors: the emulator's exact products
        from fp4ref import gemm as G
        v = G._from_float(c.reshape(-1))
        ctx = G._Ctx.__new__(G._Ctx)
        ctx.m = model
        v = ctx._alpha(v, [f.reshape(-1) for f in factors])
        c = G._to_float(v).float().reshape(c.shape)
    return c


def _fixup(c, model, A: _Op, B: _Op, block, mode, BM, BN, info=None):
    """Recompute (exactly, torch emulator) special rows/columns and FIX tiles.  ``info``:
    (special rows, special columns, any FIX tile) found by ``prepare`` (None: look here)."""
    from fp4ref.gemm import emulate
    raw = model.replace(lattice=None)

    def em(ri, ci):
        return emulate(raw, A.values(ri), B.values(ci).t(), scales_a=A.scales[ri],
                       scales_b=B.scales[ci].t(), block=block)
    M, N = c.shape
    if info is None:
        info = (A.bad.nonzero().squeeze(1), B.bad.nonzero().squeeze(1), bool((mode == _FIX).any()))
    rows, cols, any_fix = info
    if rows is None and cols is None and not any_fix:
        return c
    allr = torch.arange(M, device=c.device)
    allc = torch.arange(N, device=c.device)
    if rows is not None and rows.numel():
        c[rows] = em(rows, allc)
    if cols is not None and cols.numel():
        c[:, cols] = em(allr, cols)
    if any_fix:
        fix = (mode == _FIX)
        tm = fix.any(1).nonzero().squeeze(1)
        tn = fix.any(0).nonzero().squeeze(1)
        ri = (tm[:, None] * BM + torch.arange(BM, device=c.device)).reshape(-1)
        ci = (tn[:, None] * BN + torch.arange(BN, device=c.device)).reshape(-1)
        ri, ci = ri[ri < M], ci[ci < N]
        sub = em(ri, ci)
        keep = fix[ri // BM][:, ci // BN]
        c[ri[:, None], ci[None, :]] = torch.where(keep, sub, c[ri][:, ci])
    return c


def blockscaled_mm(a_codes: torch.Tensor, a_scales: torch.Tensor, b_codes: torch.Tensor,
                   b_scales: torch.Tensor, *, fmt="nvfp4", model="probe_matched", alpha=None,
                   scale_fmt: str | None = None, block: int | None = None,
                   tile: tuple[int, int] | None = None, rz: str = "auto",
                   force: str | None = None) -> torch.Tensor:
    """C [M, N] float32 = A @ B^T under ``model``, bit-identical to ``fp4ref.gemm.emulate``
    / ``reference.gemm.dot`` on the decoded operands.

    a_codes: e2m1 codes [M, K] (uint8, or packed [M, K/2] / float4_e2m1fn_x2);
    b_codes: [N, K]; a_scales [M, K/B], b_scales [N, K/B]: scale codes (uint8 or the
    matching float8 dtype); fmt: "nvfp4", "mxfp4", "ue5m3" (a pair of equal names is
    accepted; mixed formats are rejected); alpha: per-tensor factors (e.g. NVFP4's
    decode scales), a number, a tensor broadcastable to [M, N], or a list of them.
    tile / rz / force are for tests: tile sizes, RZ adds by "asm" (add.rz.f32, the GPU
    default), "libdevice" (__nv_fadd_rz) or "twosum" (exact emulation, interpreter default),
    force "block" / "fix" routing (force never breaks exactness: it only sends tiles
    to slower exact paths).  ``prepare(...)`` + ``plan()`` split the operand decoding and
    routing from the kernels (benchmarks)."""
    return prepare(a_codes, a_scales, b_codes, b_scales, fmt=fmt, model=model, alpha=alpha,
                   scale_fmt=scale_fmt, block=block, tile=tile, rz=rz, force=force)()


def prepare(a_codes, a_scales, b_codes, b_scales, *, fmt="nvfp4", model="probe_matched",
            alpha=None, scale_fmt=None, block=None, tile=None, rz="auto", force=None):
    """Decode, check and route once; returns a callable that runs the kernels, the exact
    fixups and the epilogue (same arguments as ``blockscaled_mm``)."""
    if isinstance(fmt, (tuple, list)):
        if len(fmt) != 2 or fmt[0] != fmt[1]:
            raise ValueError(f"fmt: mixed operand formats {tuple(fmt)!r} are not supported; "
                             f"valid choices: one of {', '.join(FORMATS)} for both operands")
        fmt = fmt[0]
    sfmt, block = _fmt_args(fmt, scale_fmt, block)
    model = _check_model(model)
    check_choice("rz", rz, ("auto", "asm", "libdevice", "twosum"))
    if force is None:  # site-wide override, e.g. FP4REF_GEMM_FORCE=block if a GPU's
        force = os.environ.get("FP4REF_GEMM_FORCE") or None  # pair dots prove inexact
    if force is not None:
        check_choice("force", force, ("pair", "block", "fix"))
    checks = []   # code-range checks of both operands: one host sync
    A = _prep("a", a_codes, a_scales, sfmt, block, checks=checks)
    B = _prep("b", b_codes, b_scales, sfmt, block, checks=checks)
    M, K = A.R, A.K
    N = B.R
    if B.K != K:
        raise ValueError(f"b_codes: K={B.K} differs from a_codes' K={K}")
    if A.codes.device != B.codes.device:
        raise ValueError(f"b_codes: device {B.codes.device} differs from a_codes' {A.codes.device}")
    dev = A.codes.device
    interp = _interpret()
    use_kernel = HAVE_TRITON and (dev.type == "cuda" or interp)
    # NVFP4 / UE5M3 probe_matched(_lattice) with the decode kernel: the code-range checks,
    # special rows, pair certificate and scalar alphas come back in one host sync (below)
    fast = (use_kernel and fmt != "mxfp4" and model is not PRESETS["decoded_fp32"]
            and not _torch_decode() and M * K > 0 and N > 0)
    if not fast:
        _check_max(checks)
        _finish(A)
        _finish(B)
        factors = _alpha_list(alpha, M, N, dev)
    BM, BN = tile or ((32, 32) if interp else (128, 128))
    if not use_kernel:
        raise RuntimeError("blockscaled_mm: needs triton and a CUDA tensor (or TRITON_INTERPRET=1); "
                           "use fp4ref.gemm.emulate on the decoded operands instead")
    RZ = 1 if (rz == "twosum" or (rz == "auto" and interp)) else (2 if rz == "libdevice" else 0)
    F32 = interp
    nb = K // block
    NT = triton.cdiv(N, BN)
    nw = 8 if not interp else 4
    if model is PRESETS["decoded_fp32"]:
        sa = torch.where(torch.isfinite(A.scales), A.scales, torch.zeros_like(A.scales))
        sb = torch.where(torch.isfinite(B.scales), B.scales, torch.zeros_like(B.scales))
        ap = A.vals * sa.repeat_interleave(block, 1)
        bp = B.vals * sb.repeat_interleave(block, 1)
        # products exact FP32 values? (ue4m3 / ue5m3 always; e8m0 when exponents allow)
        ok = bool(torch.isfinite(ap).all() and torch.isfinite(bp).all())
        if ok and fmt == "mxfp4":
            ea = torch.frexp(sa[sa > 0].double())[1] if bool((sa > 0).any()) else torch.zeros(1)
            eb = torch.frexp(sb[sb > 0].double())[1] if bool((sb > 0).any()) else torch.zeros(1)
            # frexp exponents (e + 1): products below 2**128, last bits (and so every
            # partial sum) at or above 2**-126, operands a * s_a normal
            ok = (int(ea.max() + eb.max()) <= 123 and int(ea.min() + eb.min()) >= -122
                  and int(ea.min()) >= -124 and int(eb.min()) >= -124)
        ok = ok and force != "fix"
        apT, bpT = (ap.t().contiguous(), bp.t().contiguous()) if ok else (None, None)
        del ap, bp
        mode = torch.full((triton.cdiv(M, BM), NT), _PAIR if ok else _FIX, device=dev)

        def launch():
            c = torch.zeros(M, N, dtype=torch.float32, device=dev)
            if ok:
                grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
                _k("decoded")[grid](apT, bpT, c, M, N, K, BM=64, BN=64)
            c = _fixup(c, model, A, B, block, mode, BM, BN)
            return _epilogue(c, model, factors)
        return launch
    MA = QB = fa = fb = None
    if fmt == "mxfp4":
        mode = _route_mx(A, B, BM, BN)
        if force == "fix":
            mode = torch.full_like(mode, _FIX)
        sa = _aux("sane", sfmt, dev)[A.scode.long()]   # finite scales, 0 elsewhere
        sb = _aux("sane", sfmt, dev)[B.scode.long()]
        fa = torch.where(sa > 0, sa, torch.zeros_like(sa)).contiguous()
        fb = torch.where(sb > 0, sb, torch.zeros_like(sb)).contiguous()
        ap, _ = _decode_bf16(A, block, scale=False, want_sq=False)   # e2m1 values: exact
        bp, _ = _decode_bf16(B, block, scale=False, want_sq=False)
        ptiles, btiles, n_fix, (nra, nrb) = _tile_lists(mode, [A.bad.sum(), B.bad.sum()])
    elif fast:
        Mt = triton.cdiv(M, BM)
        stats = torch.zeros(8, dtype=torch.int32, device=dev)   # see _decode_bf16, _pair_bounds
        ap, sqa = _decode_bf16(A, block, scale=True, want_sq=block == 16, stats=stats, slot=0)
        bp, sqb = _decode_bf16(B, block, scale=True, want_sq=block == 16, stats=stats, slot=2)
        # the BLOCK scheme (and its offset tables) only when some tile fails the pair
        # certificate, or a path is forced: found after the sync
        routed = force in (None, "pair")     # "pair" forces nothing (as below)
        pair_x = block == 16 and routed
        XAn, XBn = _pair_bounds(A, B, block, BM, BN, sqa if pair_x else None,
                                sqb if pair_x else None, stats)
        parts = [stats] + ([_pair_ok(XAn, XBn).sum(dtype=torch.int32).view(1)] if pair_x else [])
        items, aparts = _alpha_deferred(alpha, dev)
        vals = torch.cat(parts + aparts).tolist()     # the one host sync
        slot = {"a_codes": 0, "a_scales": 1, "b_codes": 2, "b_scales": 3}
        _raise_codes([(name, vals[slot[name]], lim, f) for name, _, lim, f in checks])
        if items is not None:
            words = vals[len(vals) - 2 * len(aparts):]
            factors = (_alpha_premul(_alpha_values(items, words, dev)), [])
        else:
            factors = _alpha_list(alpha, M, N, dev)
        nra, nrb = vals[4], vals[5]
        if routed and (block == 32 or vals[8] == Mt * NT):   # every tile PAIR
            mode, ptiles = None, _tile_order(Mt, NT, 8, dev)[2]
            btiles, n_fix = ptiles[:0], 0
        else:
            mode, MA, QB = _route(A, B, block, BM, BN, sqa, sqb)
            if force == "block" and MA is not None:
                mode = torch.where(mode == _PAIR, _BLOCK, mode)
            elif force == "fix":
                mode = torch.full_like(mode, _FIX)
            ptiles, btiles, n_fix, _ = _tile_lists(mode)
        del sqa, sqb
        if nra or nrb or n_fix:   # decoded scales for the exact fixup (codes now checked)
            _finish(A)
            _finish(B)
    else:
        ap, sqa = _decode_bf16(A, block, scale=True, want_sq=block == 16)  # a * s_a: exact
        bp, sqb = _decode_bf16(B, block, scale=True, want_sq=block == 16)
        mode, MA, QB = _route(A, B, block, BM, BN, sqa, sqb)
        del sqa, sqb
        if force == "block" and MA is not None:
            mode = torch.where(mode == _PAIR, _BLOCK, mode)
        elif force == "fix":
            mode = torch.full_like(mode, _FIX)
        # one host sync: tile lists and whether any fixup is needed
        ptiles, btiles, n_fix, (nra, nrb) = _tile_lists(mode, [A.bad.sum(), B.bad.sum()])
    info = (A.bad.nonzero().squeeze(1) if nra else None, B.bad.nonzero().squeeze(1) if nrb else None,
            n_fix > 0)
    n_p, n_b = ptiles.numel(), btiles.numel()
    need_zero = bool(nra or nrb or n_fix)
    # a scalar alpha goes into the kernels' store when nothing comes after them (no fixup,
    # no lattice): saves one full pass over C
    fuse = factors[0] is not None and not need_zero and model.lattice is None
    al = factors[0] if fuse else 1.0
    if fuse:
        factors = (None, factors[1])

    def launch():
        c = (torch.zeros if need_zero else torch.empty)(M, N, dtype=torch.float32, device=dev)
        if fmt == "mxfp4":
            if n_p:
                _k("mx")[(n_p,)](ap, bp, c, fa, fb, ptiles, M, N, K, NT, nb, al, BM=BM, BN=BN,
                                 RZ=RZ, F32=F32, ALPHA=fuse, num_warps=nw)
        else:
            if n_p:
                _k("pair")[(n_p,)](ap, bp, c, ptiles, M, N, K, NT, al, BM=BM, BN=BN, RZ=RZ,
                                   F32=F32, ALPHA=fuse, num_warps=nw, num_stages=3)
            if n_b:
                _k("block")[(n_b,)](ap, bp, c, MA, QB, btiles, M, N, K, NT, MA.shape[1], al,
                                    BM=BM, BN=BN, RZ=RZ, F32=F32, ALPHA=fuse, num_warps=nw)
        c = _fixup(c, model, A, B, block, mode, BM, BN, info)
        return _epilogue(c, model, factors)
    return launch


def route_stats(a_codes, a_scales, b_codes, b_scales, *, fmt="nvfp4", scale_fmt=None, block=None,
                tile=(128, 128)) -> dict:
    """Fraction of output tiles on each path (for benchmarks and reports)."""
    sfmt, block = _fmt_args(fmt, scale_fmt, block)
    A = _prep("a", a_codes, a_scales, sfmt, block)
    B = _prep("b", b_codes, b_scales, sfmt, block)
    if fmt == "mxfp4":
        mode = _route_mx(A, B, *tile)
    else:
        mode = _route(A, B, block, *tile)[0]  # sums of squares by table look-up (no kernel)
    n = mode.numel()
    return {"pair": int((mode == _PAIR).sum()) / n, "block": int((mode == _BLOCK).sum()) / n,
            "fix": int((mode == _FIX).sum()) / n,
            "special_rows": int(A.bad.sum()), "special_cols": int(B.bad.sum())}
