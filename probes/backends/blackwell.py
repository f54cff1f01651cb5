"""Blackwell-only (sm_100+) block-scaled GEMMs: NVFP4 / MXFP4 ``torch._scaled_mm`` with
swizzled scales, and Transformer Engine.  Not runnable on this project's GPUs: detection
says "not available (needs sm_100+)", reports mark them hardware_run=false, and the
operand packing (FP4 codes two per byte, low nibble first; scale codes in cuBLAS's 128x4
tiled layout) is exercised against virtual devices through ``native=`` (tests).
"""
from __future__ import annotations

import numpy as np

from reference.formats import get_format

from ..device import Capabilities, Device
from . import NotAvailable, Spec

__all__ = ["candidates", "pack_fp4", "unpack_fp4", "scale_codes", "decode_scale_codes", "swizzle_128x4",
           "unswizzle_128x4", "blackwell_device", "emulated_native"]

_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def pack_fp4(x: np.ndarray) -> np.ndarray:
    """Decoded e2m1 values [R, K] (K even) -> uint8 [R, K/2]; element 2i in the low nibble."""
    x = np.asarray(x, np.float64)
    mag = np.abs(x)
    idx = np.searchsorted(_E2M1, mag)
    if idx.max(initial=0) >= 8 or not np.array_equal(_E2M1[np.minimum(idx, 7)], mag):
        raise ValueError("x: values must be exactly representable in float4_e2m1fn")
    code = (idx | (np.signbit(x).astype(np.int64) << 3)).astype(np.uint8)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)


def unpack_fp4(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, np.uint8)
    codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)
    v = _E2M1[codes & 7]
    return np.where(codes & 8, -v, v)


def scale_codes(s: np.ndarray, fmt: str) -> np.ndarray:
    """Decoded block scales -> uint8 codes of ``fmt`` (ue4m3 or float8_e8m0fnu)."""
    spec = get_format(fmt)
    from fractions import Fraction
    flat = [spec.encode_magnitude(Fraction(float(v))) for v in np.asarray(s, np.float64).ravel()]
    return np.array(flat, np.uint8).reshape(np.shape(s))


def decode_scale_codes(c: np.ndarray, fmt: str) -> np.ndarray:
    spec = get_format(fmt)
    return np.array([float(spec.decode(int(v)).mag) for v in np.asarray(c).ravel()]).reshape(np.shape(c))


def swizzle_128x4(s: np.ndarray) -> np.ndarray:
    """[rows, cols] scale codes -> cuBLAS's tiled layout (flat): 128 x 4 tiles, each stored
    as 32 x 16 with row r of the tile at (r % 32, 4 * (r // 32) + c)."""
    rows, cols = s.shape
    R = -(-rows // 128) * 128
    C = -(-cols // 4) * 4
    pad = np.zeros((R, C), s.dtype)
    pad[:rows, :cols] = s
    blocks = pad.reshape(R // 128, 128, C // 4, 4).transpose(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3).reshape(-1)


def unswizzle_128x4(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    R = -(-rows // 128) * 128
    C = -(-cols // 4) * 4
    t = np.asarray(flat).reshape(-1, 32, 4, 4).transpose(0, 2, 1, 3).reshape(R // 128, C // 4, 128, 4)
    return t.transpose(0, 2, 1, 3).reshape(R, C)[:rows, :cols]


def _native_scaled_mm(recipe: str, out: str):
    """The hardware call: torch._scaled_mm on packed FP4 with swizzled scales."""
    import torch

    def call(a_packed, b_packed, sa_swz, sb_swz, M, N, K):
        A = torch.from_numpy(a_packed).cuda().view(torch.float4_e2m1fn_x2)
        B = torch.from_numpy(b_packed).cuda().view(torch.float4_e2m1fn_x2)  # [N, K/2]
        sdt = torch.float8_e4m3fn if recipe == "nvfp4" else torch.float8_e8m0fnu
        SA = torch.from_numpy(sa_swz).cuda().view(sdt)
        SB = torch.from_numpy(sb_swz).cuda().view(sdt)
        C = torch._scaled_mm(A, B.t(), SA, SB, out_dtype=getattr(torch, out))
        torch.cuda.synchronize()
        return C.float().cpu().numpy().astype(np.float64)
    return call


def emulated_native(model, recipe: str, out: str):
    """Stand-in for the hardware call (tests): unpack, unswizzle, decode, run ``model``."""
    from ..sim import bits_to_float, simulate_gemm
    blk = 16 if recipe == "nvfp4" else 32
    sfmt = "ue4m3" if recipe == "nvfp4" else "float8_e8m0fnu"

    def call(a_packed, b_packed, sa_swz, sb_swz, M, N, K):
        a = unpack_fp4(a_packed)
        b = unpack_fp4(b_packed).T
        sa = decode_scale_codes(unswizzle_128x4(sa_swz, M, K // blk), sfmt)
        sb = decode_scale_codes(unswizzle_128x4(sb_swz, N, K // blk), sfmt).T
        keys = simulate_gemm(model.replace(output=out), a, b, scales_a=sa, scales_b=sb, block=blk)
        return bits_to_float(keys, out)
    return call


def blackwell_device(recipe: str, out: str = "float32", native=None) -> Device:
    """An NVFP4 / MXFP4 device; ``native`` replaces the hardware call (tests)."""
    blk, sfmt = (16, "ue4m3") if recipe == "nvfp4" else (32, "float8_e8m0fnu")
    call = native or _native_scaled_mm(recipe, out)

    def fn(a, b, scales_a=None, scales_b=None, **_):
        M, K = a.shape
        N = b.shape[1]
        ap = pack_fp4(a)
        bp = pack_fp4(np.ascontiguousarray(b.T))
        sa = swizzle_128x4(scale_codes(scales_a, sfmt))
        sb = swizzle_128x4(scale_codes(np.ascontiguousarray(scales_b.T), sfmt))
        return call(ap, bp, sa, sb, M, N, K)
    caps = Capabilities("float4_e2m1fn", "float4_e2m1fn", out, block=blk, scale_format=sfmt,
                        k_multiple=32, mn_multiple=16, probe_mn=128, max_batch=64, max_k=16384,
                        hardware_run=native is None)
    return Device(f"blackwell-scaled_mm-{recipe}-{out}", f"torch._scaled_mm {recipe.upper()} "
                  "(packed e2m1, 128x4 swizzled scales)", "blackwell-only", caps, fn)


def _needs_sm100():
    try:
        import torch
    except Exception as e:  # pragma: no cover
        raise NotAvailable(f"torch unavailable: {e}")
    if not torch.cuda.is_available():
        raise NotAvailable("not available (needs sm_100+; no CUDA device here)")
    major, minor = torch.cuda.get_device_capability()
    if major < 10:
        raise NotAvailable(f"not available (needs sm_100+; this GPU is sm_{major}{minor})")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        raise NotAvailable("this torch has no float4_e2m1fn_x2")
    return torch


def _build(recipe, out):
    def build():
        _needs_sm100()
        return blackwell_device(recipe, out)
    return build


def _te_build():
    _needs_sm100()
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:
        raise NotAvailable(f"transformer_engine not installed: {e}")
    # Untested here (no sm_100+ GPU): TE's NVFP4 GEMM is reached through its quantized
    # tensors; an adapter must feed it the decoded operands' codes and block scales.
    raise NotAvailable("Transformer Engine adapter: not implemented for this TE version (untested, "
                       "needs sm_100+)")


def candidates() -> list:
    out = []
    for recipe in ("nvfp4", "mxfp4"):
        for o in ("float32", "bfloat16"):
            out.append(Spec(f"blackwell-scaled_mm-{recipe}-{o}", f"torch._scaled_mm {recipe}",
                            "blackwell-only", _build(recipe, o)))
    out.append(Spec("blackwell-transformer-engine-nvfp4", "transformer_engine general_gemm",
                    "blackwell-only", _te_build))
    return out
