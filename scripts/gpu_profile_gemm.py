"""Issue 18 on the GPU: where the exact block-scaled GEMM's time goes (torch.profiler: CUDA
time per kernel, and the host wall time around it), and the special-row rows of the
distribution table after the counts fix-up.  Public calls only:
fp4ref.harness.bench_gemm.dist_operands + fp4ref.gemm_triton.prepare.

    python scripts/gpu_profile_gemm.py [nvfp4,special,mxfp4,host] > profile.log
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from fp4ref import gemm_triton as GT
from fp4ref.harness.bench_gemm import dist_operands


def operands(kind, fmt, M, N, K):
    gen = torch.Generator().manual_seed(1)
    ac, asc, ta = dist_operands(kind, M, K, fmt, gen)
    bc, bsc, tb = dist_operands(kind, N, K, fmt, gen)
    return [t.cuda() for t in (ac, asc, bc, bsc)], [ta, tb]


def timed(fn, n=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def report(kind, fmt, M, N, K):
    ops, alpha = operands(kind, fmt, M, N, K)
    f = 2.0 * M * N * K
    e2e = timed(lambda: GT.prepare(*ops, fmt=fmt, alpha=alpha)())
    p = GT.prepare(*ops, fmt=fmt, alpha=alpha)
    prep = timed(lambda: GT.prepare(*ops, fmt=fmt, alpha=alpha))
    call = timed(p)
    print(f"== {fmt} {kind} {M}x{N}x{K}: end to end {e2e * 1e3:.3f} ms ({f / e2e / 1e12:.1f} TFLOP/s), "
          f"prepare {prep * 1e3:.3f} ms, call {call * 1e3:.3f} ms ({f / call / 1e12:.1f} TFLOP/s)")
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as pr:
        GT.prepare(*ops, fmt=fmt, alpha=alpha)()
        torch.cuda.synchronize()
    cuda = defaultdict(float)
    n = defaultdict(int)
    for e in pr.events():
        if e.device_type.name == "CUDA":
            cuda[e.name[:70]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            n[e.name[:70]] += 1
    tot = sum(cuda.values())
    print(f"   GPU kernel time {tot / 1e3:.3f} ms of {e2e * 1e3:.3f} ms wall; top kernels:")
    for k, v in sorted(cuda.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {v / 1e3:9.3f} ms  x{n[k]:<4} {k}")


def host_profile(fmt, M, N, K, calls=20):
    """Where prepare's host time goes (cProfile over ``calls`` end-to-end calls, GPU synced)."""
    import cProfile
    import pstats
    ops, alpha = operands("gaussian", fmt, M, N, K)
    GT.prepare(*ops, fmt=fmt, alpha=alpha)()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        GT.prepare(*ops, fmt=fmt, alpha=alpha)()
    torch.cuda.synchronize()
    pr.disable()
    print(f"== host profile {fmt} gaussian {M}x{N}x{K}, {calls} calls (tottime, top 25)")
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


STEPS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["nvfp4", "special"]
if "nvfp4" in STEPS:
    for shape in ((8192, 8192, 8192), (4096, 4096, 4096), (1024, 1024, 4096)):
        report("gaussian", "nvfp4", *shape)
if "special" in STEPS:
    for fmt in ("nvfp4", "ue5m3"):
        for kind in ("heavy_s1", "nan_inf_blocks"):
            report(kind, fmt, 1024, 1024, 4096)
if "mxfp4" in STEPS:
    for shape in ((8192, 8192, 8192), (4096, 4096, 4096)):
        report("gaussian", "mxfp4", *shape)
if "host" in STEPS:
    host_profile("nvfp4", 4096, 4096, 4096)
