"""Host BLAS through torch.matmul on CPU tensors (fp32, bf16)."""
from __future__ import annotations

import numpy as np

from ..device import Capabilities, Device
from . import Spec

__all__ = ["candidates", "cpu_fp32", "cpu_bf16", "CPU_MAX_K"]

# Declared K limit: beyond it the host BLAS blocks K into panels whose partial sums meet in
# ways that depend on K itself (seen with MKL); probes and validation stay within it.
CPU_MAX_K = 256


def _mm(dtype):
    import torch

    def fn(a, b, **_):
        A = torch.from_numpy(a).to(dtype)
        B = torch.from_numpy(b).to(dtype)
        return torch.matmul(A, B).to(torch.float64).numpy()
    return fn


def cpu_fp32() -> Device:
    import torch
    caps = Capabilities("float32", "float32", "float32", probe_mn=64, max_batch=64, max_k=CPU_MAX_K)
    return Device("cpu-torch-fp32", f"torch {torch.__version__} matmul (CPU BLAS), float32",
                  "cpu", caps, _mm(torch.float32))


def cpu_bf16() -> Device:
    import torch
    caps = Capabilities("bfloat16", "bfloat16", "bfloat16", probe_mn=64, max_batch=64, max_k=CPU_MAX_K)
    return Device("cpu-torch-bf16", f"torch {torch.__version__} matmul (CPU), bfloat16 in/out",
                  "cpu", caps, _mm(torch.bfloat16))


def candidates() -> list:
    return [Spec("cpu-torch-fp32", "torch.matmul cpu float32", "cpu", cpu_fp32),
            Spec("cpu-torch-bf16", "torch.matmul cpu bfloat16", "cpu", cpu_bf16)]


_ = np
