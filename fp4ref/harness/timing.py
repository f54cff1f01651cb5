"""The benchmarks' timers: median seconds per call, CUDA events on a GPU, perf_counter on
the CPU.  One definition for every bench section (cast, quant, gemm, chain, ...)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["time_cpu", "time_cuda", "median_seconds", "timer", "mem_reset", "mem_peak",
           "gemm_section_main"]


def time_cpu(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median wall seconds of ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def time_cuda(fn: Callable[[], object], reps: int, warmup: int = 1, batch: int = 1) -> float:
    """Median seconds per call between two CUDA events.  ``batch`` > 1: that many calls are
    enqueued back to back between one pair of events (host launch work overlaps the
    previous call's GPU work), i.e. sustained device throughput; ``batch`` = 1 also counts
    the host launch latency."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / batch)
    return statistics.median(ts)


def median_seconds(fn: Callable[[], object], device, reps: int, warmup: int = 1,
                   batch: int = 1) -> float:
    """``time_cuda`` on a CUDA device, else ``time_cpu`` (where ``batch`` plays no part)."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, reps, warmup, batch)
    return time_cpu(fn, reps, warmup)


def timer(device, batch: int = 1) -> Callable[[Callable[[], object], int], float]:
    """``median_seconds`` bound to a device and batch: ``t = timer(dev); t(fn, reps)``."""
    return lambda fn, reps: median_seconds(fn, device, reps, batch=batch)


def gemm_section_main(argv, *, description: str, run, default_out: str, emu_size: int,
                      width: int = 32) -> int:
    """Standalone CLI of a GEMM bench section (``python -m fp4ref.harness.bench_gemm``):
    run(device, sizes, emu_size) -> rows, written atomically as {"meta", "rows"} and printed
    with their fraction of cuBLAS bf16 (same run) and, where present, the slowdown against
    the Gaussian operands."""
    import argparse

    import torch

    from .io import write_json_atomic
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--sizes", default="8192,4096")
    ap.add_argument("--emu-size", type=int, default=emu_size)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    rows = run(args.device, tuple(int(s) for s in args.sizes.split(",")), args.emu_size)
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__}
    write_json_atomic(args.out, {"meta": meta, "rows": rows})
    print(f"wrote {args.out}")
    for r in rows:
        frac, slow = r.get("fraction_of_cublas_bf16"), r.get("slowdown_vs_gaussian")
        print(f"{r['size']:>5} {r['method']:<{width}} {r['tflops']:8.2f} TFLOP/s"
              + (f"  {100 * frac:5.1f}% of cuBLAS bf16" if frac is not None else "")
              + (f"  {slow:5.2f}x the Gaussian time" if slow is not None else "")
              + (f"  peak {r['peak_mem_bytes'] / 2**30:.2f} GiB" if r.get("peak_mem_bytes") else ""))
    return 0


def mem_reset(device) -> None:
    """Start a peak-memory measurement (CUDA; a no-op elsewhere)."""
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def mem_peak(device) -> int | None:
    """Peak bytes allocated since ``mem_reset`` (CUDA), or None."""
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return None
