"""Side-by-side GEMM throughput: Triton emulated NVFP4 (probe_matched, bit-exact), cuBLAS
bf16, dequantize-then-bf16-matmul, and the torch emulator.

    python -m fp4ref.harness.bench_gemm [--out bench_gemm.json] [--sizes 8192,4096]

``run(device)`` returns one dict per (size, method): seconds per call (median of timed
calls, CUDA events), TFLOP/s (2*M*N*K / s), peak memory (torch.cuda.max_memory_allocated,
reset before each method) and, for the Triton path, the share of 128x128 tiles on each
exact path.  The torch emulator runs at a smaller size (``emu_size``), said in its row.
No timed assertions anywhere: these are measurements.

The operand-distribution table (``dist_rows``, method ``triton_dist``): for each format
(nvfp4, mxfp4, ue5m3) and distribution (``DISTS``: Gaussian, heavy tails
randn * exp(s * randn) for s = 1, 2, 3, per-row and per-block scales 2**(+-12), blocks with
NaN / inf scale codes, all-zero blocks, and real activations: the post-GELU fc2 input and
fc2 weight of ``scripts/train_lm.py --dump-activations PATH`` after its bf16 run, tiled to the
shape, when ``FP4REF_ACTIVATIONS=PATH`` names that file) at ``dist_shape`` (1024 x 1024 x 4096; Gaussian also
at each of ``sizes``): TFLOP/s end to end (prepare + call: decode, route, kernels, fix-ups,
epilogue; quantization by ``gemm_triton.quantize_operand`` is NOT timed), the ratio to
cuBLAS bf16 at the same shape in the same run, the slowdown against that format's Gaussian
row, the share of tiles on each route, and peak memory.  A row whose first call exceeds
``cap_s`` seconds reports ``capped`` with that time as a lower bound instead of being
timed again (a running call cannot be interrupted).  On the CPU the table runs only in the
Triton interpreter (TRITON_INTERPRET=1), at ``cpu_shape``.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from .timing import gemm_section_main, median_seconds, mem_peak, mem_reset

__all__ = ["run", "main", "DISTS", "DIST_FORMATS", "ACTIVATIONS_ENV", "activations", "dist_operands", "dist_rows"]

ACTIVATIONS_ENV = "FP4REF_ACTIVATIONS"
DISTS = ("gaussian", "heavy_s1", "heavy_s2", "heavy_s3", "row_scales_2pm12",
         "block_scales_2pm12", "nan_inf_blocks", "zero_blocks")
DIST_FORMATS = ("nvfp4", "mxfp4", "ue5m3")
SCALE_EXP = 12          # k of the 2**(+-k) row / block scales
SPECIAL_BLOCKS = 4      # blocks per operand given a NaN / inf scale code
ZERO_SHARE = 0.25       # share of all-zero blocks


def run(device="cuda", sizes=(8192, 4096), emu_size: int = 2048, iters: int = 3, *,
        dist: bool = True, dist_shape=(1024, 1024, 4096), cpu_shape=(64, 64, 256),
        cap_s: float = 20.0) -> list[dict]:
    from .. import gemm_triton as GT
    device = torch.device(device)
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    if dist:
        rows += dist_rows(device, sizes, dist_shape, cpu_shape, cap_s, iters)
    if device.type != "cuda":   # the side-by-side rows below are GPU measurements
        return rows
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


def activations(path=None) -> dict | None:
    """The training script's dumped tensors (``FP4REF_ACTIVATIONS`` or ``path``), else None."""
    import os
    path = path or os.environ.get(ACTIVATIONS_ENV)
    if not path:
        return None
    if not os.path.isfile(path):
        raise ValueError(f"{ACTIVATIONS_ENV}: {path!r} is not a file; expected the output of "
                         "scripts/train_lm.py --dump-activations PATH")
    d = torch.load(path, map_location="cpu")
    if not isinstance(d, dict) or not {"fc2_in", "fc2_weight"} <= set(d):
        raise ValueError(f"{ACTIVATIONS_ENV}: {path!r} holds no fc2_in / fc2_weight tensors")
    return d


def _tiled(src: torch.Tensor, R: int, K: int) -> torch.Tensor:
    """``src``'s values in row-major order, repeated to fill [R, K] (K a multiple of the
    source rows keeps each channel at fixed positions)."""
    flat = src.float().reshape(-1)
    return flat.repeat(-(-R * K // flat.numel()))[:R * K].view(R, K)


def dist_operands(kind: str, R: int, K: int, fmt: str, gen: torch.Generator, source=None):
    """(codes, scale codes, per-tensor factor) of one operand [R, K] drawn from ``kind``
    (``DISTS``; "activations": ``source`` tiled), quantized by
    ``gemm_triton.quantize_operand`` (CPU tensors)."""
    from .. import gemm_triton as GT
    from reference.errors import check_choice
    from reference.formats import get_format
    check_choice("kind", kind, DISTS + ("activations",))
    if kind == "activations" and source is None:
        raise ValueError("source: the activations distribution needs a source tensor (FP4REF_ACTIVATIONS)")
    block = GT.OPERAND_FORMATS[fmt].block
    x = torch.randn(R, K, generator=gen) if kind != "activations" else _tiled(source, R, K)
    if kind.startswith("heavy_s"):
        x = x * torch.exp(int(kind[-1]) * torch.randn(R, K, generator=gen))
    elif kind == "row_scales_2pm12":
        x = x * 2.0 ** (SCALE_EXP * (2 * torch.randint(0, 2, (R, 1), generator=gen) - 1))
    elif kind == "block_scales_2pm12":
        e = SCALE_EXP * (2 * torch.randint(0, 2, (R, K // block), generator=gen) - 1)
        x = x * 2.0 ** e.repeat_interleave(block, 1)
    elif kind == "zero_blocks":
        z = torch.rand(R, K // block, generator=gen) < ZERO_SHARE
        x = x * (~z).repeat_interleave(block, 1)
    codes, sc, ts = GT.quantize_operand(x, fmt)
    if kind == "nan_inf_blocks":   # NaN / inf scale codes (inf where the format has one)
        spec = get_format(GT.OPERAND_FORMATS[fmt].scale_fmt)
        specials = [spec.nan_code] + ([spec.inf_code] if spec.has_inf else [])
        rr = torch.randperm(R, generator=gen)[:SPECIAL_BLOCKS]
        for n, r in enumerate(rr.tolist()):
            sc[r, (7 * n) % sc.shape[1]] = specials[n % len(specials)]
    return codes, sc, ts


def _route_shares(p) -> dict:
    """Share of output tiles per Route of a Prepared GEMM (mode None: every tile PAIR)."""
    from ..gemm_triton.options import Route
    mode = p.routing.mode
    if mode is None:
        return {r.name.lower(): float(r == Route.PAIR) for r in Route}
    n = mode.numel()
    return {r.name.lower(): int((mode == r).sum()) / n for r in Route}


def _timed(fn, device, iters: int, cap_s: float) -> tuple[float, bool]:
    """(seconds per call, capped): the first call is timed by the wall clock; over ``cap_s``
    it is the (lower-bound) answer, else the median of up to ``iters`` more fitting the cap."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    if first > cap_s:
        return first, True
    reps = max(1, min(iters, int(cap_s / max(first, 1e-9))))
    return median_seconds(fn, device, reps, warmup=0), False


def _dist_row(GT, fmt, kind, shape, device, gen, iters, cap_s, act=None) -> dict:
    M, N, K = shape
    src = (None, None) if act is None else (act["fc2_in"], act["fc2_weight"])
    ac, asc, ta = dist_operands(kind, M, K, fmt, gen, src[0])
    bc, bsc, tb = dist_operands(kind, N, K, fmt, gen, src[1])
    ops = [t.to(device) for t in (ac, asc, bc, bsc)]

    def call():
        return GT.prepare(*ops, fmt=fmt, alpha=[ta, tb])()
    p = GT.prepare(*ops, fmt=fmt, alpha=[ta, tb])
    extra = {"route": _route_shares(p), "special_rows": int(p.A.bad.sum()),
             "special_cols": int(p.B.bad.sum())}
    if extra["route"].get("wide"):
        extra["wide_fallback_tiles"] = p.wide_fallback_tiles()
    del p
    mem_reset(device)
    sec, capped = _timed(call, device, iters, cap_s)
    f = 2.0 * M * N * K
    row = {"size": f"{M}x{N}x{K}", "method": "triton_dist", "fmt": fmt, "dist": kind,
           "seconds": sec, "tflops": f / sec / 1e12, "capped": capped,
           "cap_s": cap_s, "peak_mem_bytes": mem_peak(device),
           "note": f"{fmt} probe_matched, operands {kind}: end to end prepare + call (decode, "
                   "route, kernels, fix-ups, epilogue); quantization (quantize_operand) not "
                   "timed" + (f"; first call > cap {cap_s:g} s: seconds is a lower bound, "
                              "tflops an upper bound (> cap)" if capped else "")}
    row.update(extra)
    return row


def _cublas_row(shape, device, gen, iters) -> dict:
    M, N, K = shape
    a = torch.randn(M, K, generator=gen).to(device, torch.bfloat16)
    b = torch.randn(K, N, generator=gen).to(device, torch.bfloat16)
    mem_reset(device)
    sec = median_seconds(lambda: a @ b, device, iters)
    return {"size": f"{M}x{N}x{K}", "method": "cublas_bf16", "dist": "gaussian", "seconds": sec,
            "tflops": 2.0 * M * N * K / sec / 1e12, "peak_mem_bytes": mem_peak(device),
            "note": "torch.matmul bf16 -> bf16 (the ratio rows' denominator, same run)"}


def dist_rows(device, sizes=(8192, 4096), shape=(1024, 1024, 4096), cpu_shape=(64, 64, 256),
              cap_s: float = 20.0, iters: int = 3) -> list[dict]:
    """The operand-distribution table (module docstring)."""
    from .. import gemm_triton as GT
    from ..gemm_triton.options import interpret
    device = torch.device(device)
    if device.type != "cuda" and not (GT.HAVE_TRITON and interpret()):
        print("bench_gemm: distribution table skipped: needs CUDA, or TRITON_INTERPRET=1 on "
              "the CPU (a dry run at cpu_shape)", file=sys.stderr)
        return []
    shapes = [tuple(shape)] + [(S, S, S) for S in sizes]
    if device.type != "cuda":
        shapes = [tuple(cpu_shape)]
    gen = torch.Generator(device="cpu").manual_seed(1)
    act = activations()
    if act is None:
        print(f"bench_gemm: no activations row ({ACTIVATIONS_ENV} unset; scripts/train_lm.py "
              "--dump-activations PATH writes one)", file=sys.stderr)
    kinds = DISTS + (("activations",) if act is not None else ())
    rows = []
    for si, shp in enumerate(shapes):
        cub = _cublas_row(shp, device, gen, iters)
        rows.append(cub)
        for fmt in DIST_FORMATS:
            gauss = None
            for kind in (kinds if si == 0 else ("gaussian",)):
                r = _dist_row(GT, fmt, kind, shp, device, gen, iters, cap_s, act)
                gauss = r if kind == "gaussian" else gauss
                r["fraction_of_cublas_bf16"] = r["tflops"] / cub["tflops"]
                r["slowdown_vs_gaussian"] = r["seconds"] / gauss["seconds"]
                print(json.dumps(r), flush=True)
                rows.append(r)
    return rows


def main(argv=None) -> int:
    return gemm_section_main(argv, description="fp4ref GEMM benchmark", run=run, default_out="bench_gemm.json",
                             emu_size=2048, width=32)

if __name__ == "__main__":
    sys.exit(main())
