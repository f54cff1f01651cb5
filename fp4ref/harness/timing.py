"""The benchmarks' timers: median seconds per call, CUDA events on a GPU, perf_counter on
the CPU.  One definition for every bench section (cast, quant, gemm, chain, ...)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["time_cpu", "time_cuda", "median_seconds", "timer"]


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
