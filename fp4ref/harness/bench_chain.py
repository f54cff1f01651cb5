"""The emulated Blackwell ``kind::mxf4nvf4`` chain (``fp4ref.scaled_mm``, model
``blackwell-mxf4nvf4``, Triton path ``fp4ref.chain_triton``) next to cuBLAS bf16, same run.

    python -m fp4ref.harness.bench_chain [--out bench_chain.json] [--sizes 8192,4096]

``run(device)`` returns one dict per (size, method): seconds per call (median, CUDA events),
TFLOP/s (2*M*N*K / s), peak memory, and for the chain rows ``fraction_of_cublas_bf16`` (the
same size's cuBLAS row of this run), the share of (64 x 64 block, instruction) steps on each
exact path (FAST, MEDIUM, GENERAL) and, for the worst-case operand sets, the slowdown
against the Gaussian operands of the same format and size.  Operands are quantized (and
packed, scales swizzled) once, outside the timing; the timed call is the public
``fp4ref.scaled_mm`` end to end: prepass (decode to bf16, block statistics), plan, kernels,
epilogue.  The torch emulator (the fallback elsewhere) runs at a small shape, in outputs/s.
No timed assertions: these are measurements.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import torch

from .timing import gemm_section_main, median_seconds, mem_peak, mem_reset

__all__ = ["run", "main", "WORST_CASES", "ALT_CONFIGS", "ALT_SETS"]

# worst-case operand sets: name -> (format, what the note says)
WORST_CASES = {
    "nvfp4_wide_scales_nan": ("nvfp4", "random e2m1 codes, scale bytes uniform over all 256 "
                              "e4m3 bytes (sign bit set, subnormal, zero, NaN 0x7F/0xFF)"),
    "nvfp4_heavy_tails": ("nvfp4", "Gaussian times log-normal row/column factors (sigma 2 and "
                          "1): block scales over the whole ue4m3 range, amax/6 quantized"),
    "mxfp4_wide_scales_nan": ("mxfp4", "random e2m1 codes, ue8m0 scale bytes uniform over "
                              "0..255 (2^-127 .. 2^127, NaN 0xFF)"),
}
# alternative FP4REF_CHAIN_CONFIG values ("BM,BN,warps,stages[,GROUP_M[,full_warps[,
# full_split[,gen_split[,gen_warps[,gen_stages[,gen_pct]]]]]]]", chain_triton.parse_config) timed
# next to the default CONFIG on ALT_SETS, same run (the environment variable
# FP4REF_BENCH_CHAIN_CONFIGS="cfg;cfg" replaces them, "" skips them).
ALT_CONFIGS = ("128,128,8,3,8,16,1,4,4,3",)   # GENERAL-only blocks 64 x 16, 4 warps (4 per SM)
ALT_SETS = ("nvfp4_heavy_tails", "nvfp4_wide_scales_nan", "mxfp4_wide_scales_nan")
_SCALE = {"nvfp4": (torch.float8_e4m3fn, "ue4m3", 16), "mxfp4": (torch.float8_e8m0fnu, "ue8m0", 32)}


def _packed(ac, asc, bc, bsc, fmt, device):
    """torch._scaled_mm's arguments: packed a [M, K/2], b = w.t() [K/2, N], swizzled scales."""
    from ..cast import pack_fp4
    from ..scaled_gemm import swizzle_128x4
    sdt = _SCALE[fmt][0]
    a = pack_fp4(ac).view(torch.float4_e2m1fn_x2).to(device)
    w = pack_fp4(bc).view(torch.float4_e2m1fn_x2).to(device)
    return (a, w.t(), swizzle_128x4(asc).view(sdt).to(device),
            swizzle_128x4(bsc).view(sdt).to(device))


def _operands(name: str, S: int, gen):
    """Codes [S, S] of a and w (K-major), scale bytes, alpha for operand set ``name``."""
    from ..gemm_triton import quantize_operand
    fmt = "mxfp4" if name.startswith("mxfp4") else "nvfp4"
    if name.endswith("gaussian") or name == "nvfp4_heavy_tails":
        x, w = torch.randn(S, S, generator=gen), torch.randn(S, S, generator=gen)
        if name == "nvfp4_heavy_tails":
            x = x * torch.exp(2 * torch.randn(S, 1, generator=gen)) \
                * torch.exp(torch.randn(1, S, generator=gen))
            w = w * torch.exp(2 * torch.randn(1, S, generator=gen))
        ac, asc, ta = quantize_operand(x, fmt)
        bc, bsc, tb = quantize_operand(w, fmt)
        return fmt, ac, asc, bc, bsc, ta * tb
    nb = S // _SCALE[fmt][2]
    ac, bc = (torch.randint(0, 16, (S, S), generator=gen, dtype=torch.uint8) for _ in "ab")
    asc, bsc = (torch.randint(0, 256, (S, nb), generator=gen, dtype=torch.int64).to(torch.uint8)
                for _ in "ab")
    return fmt, ac, asc, bc, bsc, None


def _paths(args, fmt, device) -> dict:
    """Shares of the (64 x 64 block, instruction) steps per path, from one extra call."""
    from .. import chain_triton as CT
    from ..scaled_gemm import unswizzle_128x4
    a, b, sa, sb = args
    M, N, K = a.shape[0], b.shape[1], 2 * a.shape[1]
    blk = _SCALE[fmt][2]
    counts = torch.zeros(3, dtype=torch.int32, device=device)
    CT.chain_mm(a.view(torch.uint8), b.t().view(torch.uint8),
                unswizzle_128x4(sa.view(torch.uint8), M, K // blk),
                unswizzle_128x4(sb.view(torch.uint8), N, K // blk), scale_format=_SCALE[fmt][1],
                block=blk, counts=counts)
    c = counts.double().cpu()
    return dict(zip(("fast", "medium", "general"), (c / c.sum()).tolist()))


def run(device="cuda", sizes=(8192, 4096), emu_size: int = 256, iters: int = 10) -> list[dict]:
    # 10 timed calls per row (was 3): at 3, two H200 runs timed the same MXFP4 Gaussian chain
    # at 4.08 and 4.66 ms, moving the worst-case ratio from 11.1x to 9.8x (session 18)
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for S in sizes:
        rows += _size_rows(S, device, gen, iters)
    rows.append(_emulator_row(emu_size, device, gen))
    return rows


def _size_rows(S: int, device, gen, iters: int) -> list[dict]:
    from .. import chain_triton as CT
    from ..scaled_gemm import scaled_mm
    rows = []

    def rec(method, fn, note, extra=None):
        mem_reset(device)
        sec = median_seconds(fn, device, iters)
        r = {"size": S, "method": method, "seconds": sec, "tflops": 2.0 * S ** 3 / sec / 1e12,
             "peak_mem_bytes": mem_peak(device), "note": note}
        r.update(extra or {})
        rows.append(r)
        print(json.dumps(r), flush=True)
        return r

    ops = [torch.randn(S, S, generator=gen).to(device, torch.bfloat16) for _ in "ab"]
    cub = rec("cublas_bf16", lambda: ops[0] @ ops[1], "torch.matmul bf16 -> bf16, same run")
    ops.clear()
    if not (device.type == "cuda" and CT.available()):
        return rows
    gauss = {}
    for name in ("nvfp4_gaussian", "mxfp4_gaussian", *WORST_CASES):
        fmt, ac, asc, bc, bsc, al = _operands(name, S, gen)
        args = _packed(ac, asc, bc, bsc, fmt, device)
        del ac, bc
        note = ("fp4ref.scaled_mm(model='blackwell-mxf4nvf4', out_dtype=bf16) end to end "
                "(prepass, plan, kernels, epilogue); operands quantized, packed and swizzled "
                "once outside the timing; " + (WORST_CASES[name][1] if name in WORST_CASES
                                               else "Gaussian, amax/6 quantized"))
        for cfg in ("", *(_alt_configs() if name in ALT_SETS else ())):
            with _chain_config(cfg):
                r = rec(f"chain_{name}" + (f"@{cfg}" if cfg else ""),
                        lambda: scaled_mm(*args, alpha=al, out_dtype=torch.bfloat16), note,
                        {"paths": _paths(args, fmt, device),
                         "config": cfg or _default_config()})
            r["fraction_of_cublas_bf16"] = cub["seconds"] / r["seconds"]
            if name.endswith("gaussian"):
                gauss.setdefault(fmt, r)      # slowdowns: against the default config
            else:
                r["slowdown_vs_gaussian"] = r["seconds"] / gauss[fmt]["seconds"]
        del args
    return rows


def _default_config() -> str:
    from .. import chain_triton as CT
    c, env = dict(CT.CONFIG), os.environ.get("FP4REF_CHAIN_CONFIG")
    if env:
        c.update(CT.parse_config(env, "FP4REF_CHAIN_CONFIG"))
    return ",".join(str(c[k]) for k in CT.CONFIG_KEYS)


def _alt_configs() -> tuple:
    """ALT_CONFIGS, or FP4REF_BENCH_CHAIN_CONFIGS ("cfg;cfg", "" for none), each checked."""
    from .. import chain_triton as CT
    env = os.environ.get("FP4REF_BENCH_CHAIN_CONFIGS")
    cfgs = ALT_CONFIGS if env is None else tuple(c for c in env.split(";") if c.strip())
    for c in cfgs:
        CT.parse_config(c, "FP4REF_BENCH_CHAIN_CONFIGS")
    return cfgs


@contextlib.contextmanager
def _chain_config(cfg: str):
    """FP4REF_CHAIN_CONFIG set to ``cfg`` inside the block ("": unchanged)."""
    old = os.environ.get("FP4REF_CHAIN_CONFIG")
    if cfg:
        os.environ["FP4REF_CHAIN_CONFIG"] = cfg
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FP4REF_CHAIN_CONFIG", None)
        else:
            os.environ["FP4REF_CHAIN_CONFIG"] = old


def _emulator_row(E: int, device, gen) -> dict:
    """The torch emulator (mxf4nvf4_chain(backend='torch'): the path without CUDA Triton)."""
    from ..scaled_gemm import mxf4nvf4_chain
    fmt, ac, asc, bc, bsc, al = _operands("nvfp4_gaussian", E, gen)
    K = 4 * E
    a = torch.cat([ac] * 4, 1).to(device)
    b = torch.cat([bc] * 4, 1).t().contiguous().to(device)
    sa, sb = torch.cat([asc] * 4, 1).to(device), torch.cat([bsc] * 4, 1).t().contiguous().to(device)
    mem_reset(device)
    sec = median_seconds(lambda: mxf4nvf4_chain(a, b, sa, sb, scale_format="ue4m3", block=16,
                                                alpha=al, backend="torch"), device, 1, warmup=0)
    row = {"size": E, "method": "torch_emulator_blackwell_mxf4nvf4", "seconds": sec,
           "tflops": 2.0 * E * E * K / sec / 1e12, "outputs_per_second": E * E / sec,
           "peak_mem_bytes": mem_peak(device),
           "note": f"the fallback: fp4ref.gemm.emulate under blackwell_mxf4nvf4 at {E} x {E} x "
                   f"{K} on {device.type} (exact int64 emulation, K = {K})"}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    return gemm_section_main(argv, description="fp4ref emulated Blackwell chain benchmark", run=run, default_out="bench_chain.json",
                             emu_size=256, width=52)

if __name__ == "__main__":
    sys.exit(main())
