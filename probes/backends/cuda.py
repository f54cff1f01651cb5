"""CUDA GEMMs through torch: cuBLAS bf16/fp16 (FP32 output), TF32, FP32, and FP8 e4m3
``torch._scaled_mm`` (tensorwise / rowwise scales, use_fast_accum on/off, FP32/BF16 out).

Operands arrive decoded (float64) and are cast to the native dtype, exactly (the prober
only sends representable values).  Each device restores any global flag it sets.

Each device also has tensor-level calls (``Device.draw / call_tensors / kernels``): operands
drawn on the GPU with torch (bf16/fp16: randn cast; tf32: float32 with the low 13 bits
cleared; fp8 e4m3: randn * 7 clamped to +-448; scaled_mm's B column-major), the native op
called directly (no numpy round trip: shapes up to 4096 x 4096 x 16384), kernel names from
torch.profiler.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..device import Batch, Capabilities, Device, TensorOps
from . import NotAvailable, Spec

__all__ = ["candidates"]


def _torch_cuda():
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a dependency
        raise NotAvailable(f"torch unavailable: {e}")
    if not torch.cuda.is_available():
        raise NotAvailable("no CUDA device")
    return torch


def _gpu_name(torch) -> str:
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} (sm_{p.major}{p.minor})"


def _to(torch, x, dtype):
    # float64 -> float32 is exact for every operand format here; then the native cast
    t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32)
    return t.to("cuda").to(dtype)


def _back(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def _profile_kernels(torch, fn) -> list:
    """Names of the CUDA kernels ``fn`` launches (one profiled call)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in p.events() if e.device_type.name == "CUDA"})


def _tensor_ops(torch, draw, native, pack) -> TensorOps:
    """TensorOps from ``draw(M, N, K, g, kind) -> Batch``, ``native(batch) -> tensor`` and
    ``pack(a, b, sa, sb, alpha) -> Batch``."""
    def call(batch):
        out = native(batch).float()
        torch.cuda.synchronize()
        return out
    return TensorOps("cuda", pack, draw, call, lambda batch: _profile_kernels(torch, lambda: native(batch)))


def _pack_float(torch, fmt: str):
    """Decoded operands -> the native dtype (exact: the values are in the format)."""
    def pack(a, b, sa=None, sb=None, alpha=None):
        if fmt in ("bfloat16", "float16"):
            dt = getattr(torch, fmt)
            return Batch(a.float(), b.float(), native=(a.to(dt), b.to(dt)))
        a, b = a.float().contiguous(), b.float().contiguous()
        return Batch(a, b, native=(a, b))
    return pack


def _pack_fp8(torch, rowwise: bool):
    """Decoded e4m3 operands -> fp8 (B column-major); alpha (sa, sb) -> scale tensors."""
    def pack(a, b, sa=None, sb=None, alpha=None):
        e4 = torch.float8_e4m3fn
        M, N = a.shape[0], b.shape[1]
        x, y = alpha if alpha is not None else (1.0, 1.0)
        f = lambda v, n: (torch.full((n,), float(v), device="cuda") if isinstance(v, float)  # noqa: E731
                          else v.float().reshape(-1).to("cuda"))
        if rowwise:
            x, y = f(x, M), f(y, N)
            st = (x.reshape(-1, 1), y.reshape(1, -1))
        else:
            st = tuple(torch.tensor(float(v), dtype=torch.float32, device="cuda") for v in (x, y))
            x, y = float(x), float(y)
        B = b.t().contiguous().to(e4).t()
        return Batch(a.float(), b.float(), alpha=(x, y), native=(a.to(e4), B, st))
    return pack


def _draw_float(torch, fmt: str):
    """bf16/fp16: randn cast; tf32: float32 randn with the low 13 bits cleared; fp32: randn."""
    def draw(M, N, K, g, kind="normal"):
        a = torch.randn(M, K, device="cuda", generator=g)
        b = torch.randn(K, N, device="cuda", generator=g)
        if fmt in ("bfloat16", "float16"):
            an, bn = a.to(getattr(torch, fmt)), b.to(getattr(torch, fmt))
            return Batch(an.float(), bn.float(), native=(an, bn), kind=kind)
        if fmt == "tf32":
            a = (a.view(torch.int32) & ~0x1FFF).view(torch.float32)
            b = (b.view(torch.int32) & ~0x1FFF).view(torch.float32)
        return Batch(a, b, native=(a, b), kind=kind)
    return draw


def _draw_fp8(torch, rowwise: bool):
    """e4m3 operands randn * 7 clamped; B column-major; alpha U(0.25, 4) float32 (as the
    numpy path draws it): per tensor, or per row of A and column of B."""
    def draw(M, N, K, g, kind="normal"):
        e4 = torch.float8_e4m3fn
        a = (torch.randn(M, K, device="cuda", generator=g) * 7).clamp(-448, 448).to(e4)
        bt = (torch.randn(N, K, device="cuda", generator=g) * 7).clamp(-448, 448).to(e4)
        u = lambda *s: torch.rand(*s, device="cuda", generator=g) * 3.75 + 0.25  # noqa: E731
        if rowwise:
            sa, sb = u(M), u(N)
            st = (sa.reshape(-1, 1), sb.reshape(1, -1))
            alpha = (sa, sb)
        else:
            sa, sb = u(()), u(())
            st, alpha = (sa, sb), (float(sa), float(sb))
        return Batch(a.float(), bt.t().float(), alpha=alpha, native=(a, bt.t(), st), kind=kind)
    return draw


@contextlib.contextmanager
def _fp32_precision(torch, tf32: bool):
    """TF32 on/off for cuBLAS matmul: the fp32_precision API where it exists (torch >= 2.9;
    mixing it with the legacy flag is an error there), else allow_tf32."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        old = m.fp32_precision
        m.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            m.fp32_precision = old
    else:
        old = m.allow_tf32
        m.allow_tf32 = tf32
        try:
            yield
        finally:
            m.allow_tf32 = old


def _mm16(dtype_name: str):
    def build():
        torch = _torch_cuda()
        dt = getattr(torch, dtype_name)
        a = torch.ones(16, 16, device="cuda", dtype=dt)
        try:
            torch.mm(a, a, out_dtype=torch.float32)
            out = "float32"
        except Exception:
            out = dtype_name  # no FP32-output overload: probe the native-output GEMM
        fmt = {"bfloat16": "bfloat16", "float16": "float16"}[dtype_name]

        def fn(x, y, **_):
            A, B = _to(torch, x, dt), _to(torch, y, dt)
            C = torch.mm(A, B, out_dtype=torch.float32) if out == "float32" else torch.mm(A, B)
            torch.cuda.synchronize()
            return _back(C)
        def native(batch):
            A, B = batch.native
            return torch.mm(A, B, out_dtype=torch.float32) if out == "float32" else torch.mm(A, B)
        caps = Capabilities(fmt, fmt, out, probe_mn=64, max_batch=64, max_k=16384)
        d = Device(f"cuda-cublas-{dtype_name}", f"torch.mm {dtype_name} (cuBLAS), out {out}, "
                   f"{_gpu_name(torch)}", "cuda", caps, fn,
                   tensors=_tensor_ops(torch, _draw_float(torch, fmt), native, _pack_float(torch, fmt)))
        d.notes.append(f"torch {torch.__version__}; out_dtype={out}")
        return d
    return build


def _mm32(tf32: bool):
    def build():
        torch = _torch_cuda()

        def fn(x, y, **_):
            A, B = _to(torch, x, torch.float32), _to(torch, y, torch.float32)
            with _fp32_precision(torch, tf32):
                C = torch.mm(A, B)
                torch.cuda.synchronize()
            return _back(C)
        def native(batch):
            with _fp32_precision(torch, tf32):
                return torch.mm(*batch.native)
        fmt = "tf32" if tf32 else "float32"
        caps = Capabilities(fmt, fmt, "float32", probe_mn=64, max_batch=64, max_k=16384)
        name = "cuda-cublas-tf32" if tf32 else "cuda-cublas-fp32"
        return Device(name, f"torch.mm float32 ({'TF32 allowed' if tf32 else 'IEEE'}), {_gpu_name(torch)}",
                      "cuda", caps, fn,
                      tensors=_tensor_ops(torch, _draw_float(torch, fmt), native, _pack_float(torch, fmt)))
    return build


def _scaled(rowwise: bool, fast: bool, out: str):
    def build():
        torch = _torch_cuda()
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            raise NotAvailable("this torch has no float8_e4m3fn / _scaled_mm")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            raise NotAvailable(f"FP8 GEMMs need sm_89+ (this GPU is sm_{major}{minor})")
        odt = getattr(torch, out)

        def fn(x, y, alpha=None):
            A = _to(torch, x, torch.float8_e4m3fn)
            Bt = _to(torch, np.ascontiguousarray(y.T), torch.float8_e4m3fn)
            B = Bt.t()  # column-major K x N, as cuBLASLt wants
            sa, sb = alpha if alpha is not None else (1.0, 1.0)
            if rowwise:
                sa_t = torch.tensor(np.asarray(sa, np.float32).reshape(-1, 1), device="cuda")
                sb_t = torch.tensor(np.asarray(sb, np.float32).reshape(1, -1), device="cuda")
            else:
                sa_t = torch.tensor(float(sa), dtype=torch.float32, device="cuda")
                sb_t = torch.tensor(float(sb), dtype=torch.float32, device="cuda")
            C = torch._scaled_mm(A, B, scale_a=sa_t, scale_b=sb_t, out_dtype=odt, use_fast_accum=fast)
            torch.cuda.synchronize()
            return _back(C)
        caps = Capabilities("float8_e4m3fn", "float8_e4m3fn", out, alpha="rowwise" if rowwise else "tensorwise",
                            k_multiple=16, mn_multiple=16, probe_mn=64, max_batch=64, max_k=16384)
        def native(batch):
            A, B, (sa_t, sb_t) = batch.native
            return torch._scaled_mm(A, B, scale_a=sa_t, scale_b=sb_t, out_dtype=odt, use_fast_accum=fast)
        name = f"cuda-scaled_mm-e4m3-{'rowwise' if rowwise else 'tensorwise'}-{'fast' if fast else 'slow'}-{out}"
        d = Device(name, f"torch._scaled_mm e4m3 ({'rowwise' if rowwise else 'tensorwise'} scales, "
                   f"use_fast_accum={fast}, out {out}), {_gpu_name(torch)}", "cuda", caps, fn,
                   tensors=_tensor_ops(torch, _draw_fp8(torch, rowwise), native, _pack_fp8(torch, rowwise)))
        # a tiny call now: an unsupported combination fails at detection, not mid-inference
        fn(np.ones((16, 16)), np.ones((16, 16)), (np.ones(16), np.ones(16)) if rowwise else (1.0, 1.0))
        return d
    return build


def candidates() -> list:
    out = [Spec("cuda-cublas-bfloat16", "torch.mm bf16 -> fp32", "cuda", _mm16("bfloat16")),
           Spec("cuda-cublas-float16", "torch.mm fp16 -> fp32", "cuda", _mm16("float16")),
           Spec("cuda-cublas-tf32", "torch.mm tf32", "cuda", _mm32(True)),
           Spec("cuda-cublas-fp32", "torch.mm fp32 (IEEE)", "cuda", _mm32(False))]
    for rowwise in (False, True):
        for fast in (False, True):
            for o in ("float32", "bfloat16"):
                name = f"cuda-scaled_mm-e4m3-{'rowwise' if rowwise else 'tensorwise'}-{'fast' if fast else 'slow'}-{o}"
                out.append(Spec(name, "torch._scaled_mm e4m3", "cuda", _scaled(rowwise, fast, o)))
    return out
