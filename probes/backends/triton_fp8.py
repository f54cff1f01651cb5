"""Triton ``tl.dot`` on FP8 e4m3 with max_num_imprecise_acc unset, 0, 32, 64 and 128.

A small tiled matmul: 64 x 64 output tiles, BK = 128 along K, FP32 accumulator carried
through the K loop as ``tl.dot(a, b, acc)``.  B is stored K-contiguous ([N, K]).  Loads are
masked (zero outside the matrices), as users' kernels do, so every shape runs: the last
K-tile is zero-filled at its end, which adds nothing to any sum (a zero product has no
exponent to align to), so the model at K is the model at the padded K.
0 is passed to ``tl.dot`` as given (issue 13: its own device; unset is not 0 -- Triton
substitutes its sm_90 default for an unset value).
"""
from __future__ import annotations

import numpy as np

from ..device import Batch, Capabilities, Device
from . import NotAvailable, Spec

__all__ = ["candidates", "IMPRECISE"]

IMPRECISE = (None, 0, 32, 64, 128)
BM = BN = 64
BK = 128
_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def mm_fp8(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbn, scm,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IMPRECISE: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * sam + kk[None, :],
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + kk[:, None] + rn[None, :] * sbn,
                        mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            if IMPRECISE < 0:
                acc = tl.dot(a, b, acc)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=IMPRECISE)
        tl.store(c_ptr + rm[:, None] * scm + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    _KERNEL = mm_fp8
    return _KERNEL


def _launch(torch, kern, imp, A, Bn):
    """C [M, N] float32 = the kernel on A [M, K] and Bn [N, K] (both K-contiguous e4m3)."""
    M, K = A.shape
    N = Bn.shape[0]
    C = torch.empty(M, N, dtype=torch.float32, device="cuda")
    kern[(-(-M // BM), -(-N // BN))](A, Bn, C, M, N, K, A.stride(0), Bn.stride(0), C.stride(0),
                                     BM=BM, BN=BN, BK=BK, IMPRECISE=imp)
    return C


def _tensor_ops(torch, kern, imp):
    """Tensor-level calls (probes.device.TensorOps): e4m3 operands drawn on the GPU (randn * 7
    clamped, as the CUDA _scaled_mm devices draw them), the kernel launched on them directly
    (no numpy round trip of up to 4096 x 16384 operands per call), kernel names from the
    profiler ("mm_fp8": probes.kernels keys Triton's K order on it)."""
    from .cuda import _tensor_ops as ops
    e4 = torch.float8_e4m3fn

    def launch(batch):
        return _launch(torch, kern, imp, *batch.native)

    def draw(M, N, K, g, kind="normal"):
        a = (torch.randn(M, K, device="cuda", generator=g) * 7).clamp(-448, 448).to(e4)
        bn = (torch.randn(N, K, device="cuda", generator=g) * 7).clamp(-448, 448).to(e4)
        return Batch(a.float(), bn.float().t(), native=(a, bn), kind=kind)

    def pack(a, b, sa=None, sb=None, alpha=None):
        A = a.to("cuda").float().to(e4).contiguous()
        Bn = b.to("cuda").float().t().contiguous().to(e4)
        return Batch(A.float(), Bn.float().t(), native=(A, Bn))
    return ops(torch, draw, launch, pack)


def _build(imprecise):
    def build():
        try:
            import torch
            import triton  # noqa: F401
        except Exception as e:
            raise NotAvailable(f"triton unavailable: {e}")
        if not torch.cuda.is_available():
            raise NotAvailable("no CUDA device")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            raise NotAvailable(f"FP8 tl.dot needs sm_89+ (this GPU is sm_{major}{minor})")
        kern = _kernel()
        imp = -1 if imprecise is None else int(imprecise)

        def fn(x, y, **_):
            A = torch.from_numpy(np.ascontiguousarray(x)).float().cuda().to(torch.float8_e4m3fn)
            Bn = torch.from_numpy(np.ascontiguousarray(y.T)).float().cuda().to(torch.float8_e4m3fn)
            C = _launch(torch, kern, imp, A, Bn)
            torch.cuda.synchronize()
            return C.cpu().numpy().astype(np.float64)
        caps = Capabilities("float8_e4m3fn", "float8_e4m3fn", "float32", k_multiple=1, mn_multiple=1,
                            probe_mn=64, max_batch=64, max_k=16384)
        tag = "unset" if imprecise is None else str(imprecise)
        d = Device(f"triton-dot-e4m3-imprecise-{tag}", f"triton {triton.__version__} tl.dot e4m3, "
                   f"max_num_imprecise_acc={tag}, BK={BK}", "cuda", caps, fn,
                   tensors=_tensor_ops(torch, kern, imp))
        fn(np.ones((BM, BK)), np.ones((BK, BN)))  # compile now; failures show at detection
        return d
    return build


def candidates() -> list:
    return [Spec(f"triton-dot-e4m3-imprecise-{'unset' if i is None else i}", "triton tl.dot e4m3", "cuda",
                 _build(i)) for i in IMPRECISE]
