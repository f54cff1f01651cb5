"""GPU profiling (one lease): where the emulated GEMM's end-to-end time goes, and the
flat quantizer kernels' (blocks per program, warps) landscape.  Measurements only.

    python scripts/prof_gpu.py [--sizes 4096,8192] [--skip-quant]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")


def ev_time(fn, reps=10, batch=1):
    """Median seconds per call between CUDA events (the benchmarks' timer)."""
    from fp4ref.harness.timing import time_cuda
    return time_cuda(fn, reps, batch=batch)


def wall(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def gemm(sizes):
    from fp4ref import gemm_triton as GT
    from fp4ref.gemm_triton import decode as GD
    from fp4ref.gemm_triton import route as GR
    from torch.profiler import profile, ProfilerActivity
    g = torch.Generator(device="cpu").manual_seed(0)
    for S in sizes:
        x = torch.randn(S, S, generator=g).cuda()
        w = torch.randn(S, S, generator=g).cuda()
        ac, asc, ta = GT.quantize_operand(x, "nvfp4")
        bc, bsc, tb = GT.quantize_operand(w, "nvfp4")
        f = lambda: GT.blockscaled_mm(ac, asc, bc, bsc, fmt="nvfp4", alpha=[ta, tb])  # noqa
        prep = lambda: GT.prepare(ac, asc, bc, bsc, fmt="nvfp4", alpha=[ta, tb])  # noqa
        plan = prep()
        t_e2e, t_prep, t_plan = wall(f), wall(prep), wall(plan)
        print(f"gemm {S}: wall e2e {t_e2e*1e3:.3f} ms, prepare {t_prep*1e3:.3f} ms, "
              f"plan {t_plan*1e3:.3f} ms; events e2e {ev_time(f, 5)*1e3:.3f} ms "
              f"plan {ev_time(plan, 5)*1e3:.3f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                f()
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=15), flush=True)
        # the prepare steps one at a time (synchronized): decode, route (fp4ref/gemm_triton/)
        A = GD.operand("a", ac, asc, "ue4m3", 16)
        B = GD.operand("b", bc, bsc, "ue4m3", 16)
        def dec():
            return GD.decode_bf16(A, 16, scale=True, want_sq=True)
        ap, sqa = dec()
        bp, sqb = GD.decode_bf16(B, 16, scale=True, want_sq=True)
        t_dec = wall(dec)
        t_route = wall(lambda: GR.route(A, B, 16, 128, 128, sqa, sqb))
        mode, _ = GR.route(A, B, 16, 128, 128, sqa, sqb)
        t_tl = wall(lambda: GR.tile_lists(mode, [A.bad.sum(), B.bad.sum()]))
        t_pr = wall(lambda: (GD.operand("a", ac, asc, "ue4m3", 16), GD.operand("b", bc, bsc, "ue4m3", 16)))
        print(f"gemm {S} phases (wall, synced): operand x2 {t_pr*1e3:.3f} ms, decode x1 {t_dec*1e3:.3f} ms, "
              f"route {t_route*1e3:.3f} ms, tile_lists {t_tl*1e3:.3f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            GR.route(A, B, 16, 128, 128, sqa, sqb)
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=20), flush=True)
        del x, w, ac, bc, plan, ap, bp


def quant():
    from fp4ref.quant import triton_quant as TQ
    import triton
    g = torch.Generator(device="cpu").manual_seed(0)
    M = K = 8192
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
    dst = torch.empty_like(x)
    t_copy = ev_time(lambda: dst.copy_(x), 20, 10)
    bw = 4 * M * K / t_copy
    print(f"copy {t_copy*1e6:.1f} us = {bw/1e9:.0f} GB/s", flush=True)
    par = TQ.te_params(x, float(torch.tensor(448.0 * 6, dtype=torch.float32)), False)
    nb16, nb32 = M * K // 16, M * K // 32
    q = torch.empty(M, K // 2, dtype=torch.uint8, device="cuda")
    s16 = torch.empty(M, K // 16, dtype=torch.uint8, device="cuda")
    s32 = torch.empty(M, K // 32, dtype=torch.uint8, device="cuda")
    xi = x.view(-1).view(torch.int32)
    qi = q.view(-1).view(torch.int64)
    by16 = 2 * M * K + M * K // 2 + M * K // 16
    by32 = 2 * M * K + M * K // 2 + M * K // 32
    for name, sf in (("nvfp4", "ue4m3"), ("ue5m3", "ue5m3")):
        mb, bias, mc, nanc, ieee, smax, one = TQ._SCALE[sf]
        kw = dict(SMBITS=mb, SBIAS=bias, SMAXCODE=mc, SNAN=nanc, SIEEE=ieee, SMAX=smax,
                  ZERO_TO_ONE=name == "ue5m3", ONE_CODE=one, I64=False)
        res = []
        for n in (64, 128, 256, 512, 1024, 2048, 4096):
            for nw in (1, 2, 4, 8, 16):
                if n < 32 * nw:
                    continue
                fn = lambda: TQ._two_level_flat_kernel[(triton.cdiv(nb16, n),)](  # noqa
                    xi, qi, s16, par, nb16, NBLK=n, num_warps=nw, **kw)
                try:
                    t = ev_time(fn, 10, 10)
                except Exception as e:  # noqa
                    print(name, n, nw, "failed", type(e).__name__, flush=True)
                    continue
                res.append((t, n, nw))
        res.sort()
        for t, n, nw in res[:6]:
            print(f"{name} NBLK={n} warps={nw}: {t*1e6:.1f} us = {by16/t/bw*100:.1f}% of copy", flush=True)
        print(f"{name} worst: {res[-1]}", flush=True)
    res = []
    for n in (64, 128, 256, 512, 1024, 2048):
        for nw in (1, 2, 4, 8, 16):
            if n < 32 * nw:
                continue
            fn = lambda: TQ._mx_flat_kernel[(triton.cdiv(nb32, n),)](xi, qi, s32, nb32, NBLK=n, I64=False, num_warps=nw)  # noqa
            res.append((ev_time(fn, 10, 10), n, nw))
    res.sort()
    for t, n, nw in res[:4]:
        print(f"mxfp4 NBLK={n} warps={nw}: {t*1e6:.1f} us = {by32/t/bw*100:.1f}% of copy", flush=True)
    # public entry points (autotuned), as bench_quant times them
    from fp4ref.quant import nvfp4
    for label, fn in (("two_level_1x16 ue4m3", lambda: TQ.two_level_1x16(x, par, "ue4m3")),
                      ("two_level_1x16 ue5m3", lambda: TQ.two_level_1x16(x, par, "ue5m3", True)),
                      ("mx_floor_e2m1", lambda: TQ.mx_floor_e2m1(x))):
        t = ev_time(fn, 20, 10)
        by = by32 if "mx" in label else by16
        print(f"public {label}: {t*1e6:.1f} us = {by/t/bw*100:.1f}% of copy", flush=True)
    _ = nvfp4


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--skip-quant", action="store_true")
    ap.add_argument("--skip-gemm", action="store_true")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if not a.skip_quant:
        quant()
    if not a.skip_gemm:
        gemm([int(s) for s in a.sizes.split(",")])
