"""Side-by-side GEMM throughput: Triton emulated NVFP4 (probe_matched, bit-exact), cuBLAS
bf16, dequantize-then-bf16-matmul, and the torch emulator.

    python -m fp4ref.harness.bench_gemm [--out bench_gemm.json] [--sizes 8192,4096]

``run(device)`` returns one dict per (size, method): seconds per call (median of timed
calls, CUDA events), TFLOP/s (2*M*N*K / s), peak memory (torch.cuda.max_memory_allocated,
reset before each method) and, for the Triton path, the share of 128x128 tiles on each
exact path.  The torch emulator runs at a smaller size (``emu_size``), said in its row.
No timed assertions anywhere: these are measurements.
"""
from __future__ import annotations

import json
import sys

import torch

from .timing import gemm_section_main, median_seconds, mem_peak, mem_reset

__all__ = ["run", "main"]


def run(device="cuda", sizes=(8192, 4096), emu_size: int = 2048, iters: int = 3) -> list[dict]:
    from .. import gemm_triton as GT
    device = torch.device(device)
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for S in sizes:
        rows += _size_rows(GT, S, device, gen, iters)
    rows.append(_emulator_row(GT, emu_size, device, gen))
    for S in sizes:  # ratio to cuBLAS at each size
        cub = [r for r in rows if r["size"] == S and r["method"] == "cublas_bf16"]
        for r in rows:
            if r["size"] == S and cub:
                r["fraction_of_cublas_bf16"] = r["tflops"] / cub[0]["tflops"]
    return rows


def _size_rows(GT, S: int, device, gen, iters: int) -> list[dict]:
    """The Triton paths (CUDA only), cuBLAS bf16 and dequantize-then-matmul at S^3."""
    rows = []
    M = N = K = S
    x = torch.randn(M, K, generator=gen).to(device)
    w = torch.randn(N, K, generator=gen).to(device)
    ac, asc, ta = GT.quantize_operand(x, "nvfp4")
    bc, bsc, tb = GT.quantize_operand(w, "nvfp4")
    del x, w

    def rec(method, fn, note="", extra=None):
        mem_reset(device)
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        sec = median_seconds(fn, device, iters)
        peak = mem_peak(device)
        f = 2.0 * S ** 3
        r = {"size": S, "method": method, "seconds": sec, "tflops": f / sec / 1e12,
             "peak_mem_bytes": peak, "peak_mem_over_inputs_bytes": None if peak is None else peak - base,
             "note": note}
        if extra:
            r.update(extra)
        rows.append(r)
        print(json.dumps(r), flush=True)

    if GT.available() and device.type == "cuda":
        stats = GT.route_stats(ac, asc, bc, bsc, fmt="nvfp4")
        rec("triton_nvfp4_probe_matched",
            lambda: GT.blockscaled_mm(ac, asc, bc, bsc, fmt="nvfp4", model="probe_matched",
                                      alpha=[ta, tb]),
            "the public call fp4ref.blockscaled_mm: bit-exact emulation, end to end: code "
            "decode to bf16, tile routing, kernels, fixups, epilogue", extra={"route": stats})
        plan = GT.prepare(ac, asc, bc, bsc, fmt="nvfp4", model="probe_matched", alpha=[ta, tb])
        rec("triton_nvfp4_probe_matched_prepared", plan,
            "operands decoded and routed once (as a layer whose weights are reused): "
            "kernels + fixups + epilogue", extra={"route": stats})
        del plan
    ops = [torch.randn(M, K, generator=gen).to(device, torch.bfloat16),
           torch.randn(K, N, generator=gen).to(device, torch.bfloat16)]
    rec("cublas_bf16", lambda: ops[0] @ ops[1], "torch.matmul bf16 -> bf16")
    ops.clear()
    av, sav = GT.decode_operand(ac, asc, "nvfp4")
    bv, sbv = GT.decode_operand(bc, bsc, "nvfp4")

    def deq_mm():
        a = (av * sav.repeat_interleave(16, 1) * ta).to(torch.bfloat16)
        b = (bv * sbv.repeat_interleave(16, 1) * tb).to(torch.bfloat16)
        return a @ b.t()
    rec("dequantize_bf16_matmul", deq_mm, "decode + dequantize to bf16, then cuBLAS (not exact)")
    return rows


def _emulator_row(GT, E: int, device, gen) -> dict:
    """The torch emulator at E^3 (a smaller size: it is exact int64 work, not a fast path)."""
    from ..gemm import emulate
    x = torch.randn(E, E, generator=gen).to(device)
    ac, asc, ta = GT.quantize_operand(x, "nvfp4")
    bc, bsc, tb = GT.quantize_operand(x.flip(0), "nvfp4")
    av, sav = GT.decode_operand(ac, asc, "nvfp4")
    bv, sbv = GT.decode_operand(bc, bsc, "nvfp4")
    bvt, sbvt = bv.t().contiguous(), sbv.t().contiguous()
    mem_reset(device)
    sec = median_seconds(lambda: emulate("probe_matched", av, bvt, scales_a=sav, scales_b=sbvt,
                                         block=16, alpha=[ta, tb]), device, 1, warmup=0)
    row = {"size": E, "method": "torch_emulator_probe_matched", "seconds": sec,
           "tflops": 2.0 * E ** 3 / sec / 1e12, "peak_mem_bytes": mem_peak(device),
           "note": f"fp4ref.gemm.emulate at {E}^3 (smaller size: it is an exact "
                   "int64 emulator, not a fast path)"}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    return gemm_section_main(argv, description="fp4ref GEMM benchmark", run=run, default_out="bench_gemm.json",
                             emu_size=2048, width=32)

if __name__ == "__main__":
    sys.exit(main())
