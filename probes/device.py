"""The device protocol: a GEMM as a black box over decoded operands.

A device is a callable ``device(a, b, *, scales_a=None, scales_b=None, alpha=None)``:

- ``a`` [M, K] and ``b`` [K, N]: float64 numpy arrays of *decoded* operand values, each
  exactly representable in ``caps.a_format`` / ``caps.b_format``;
- block-scaled GEMMs: ``scales_a`` [M, K // block], ``scales_b`` [K // block, N], decoded
  block scales (exact in ``caps.scale_format``);
- ``alpha``: None or (sa, sb): per-tensor scalars (``caps.alpha == "tensorwise"``) or an [M]
  and an [N] vector (``"rowwise"``), float32 values applied after accumulation;
- returns [M, N] float64 outputs, each exactly the value the GEMM wrote in
  ``caps.output`` (NaN and -0 preserved).

The adapter converts decoded values to its native dtypes (exact by construction), runs the
kernel, and converts back.  Inference only ever calls the device.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from reference.errors import check_choice
from reference.formats import get_format

__all__ = ["Capabilities", "Device", "DeviceError", "Runner", "ALPHA_KINDS", "DEVICE_KINDS"]

ALPHA_KINDS = ("none", "tensorwise", "rowwise")
DEVICE_KINDS = ("virtual", "cpu", "cuda", "blackwell-only")


class DeviceError(RuntimeError):
    """A device call failed (the backend crashed or refused the operands)."""


@dataclass(frozen=True)
class Capabilities:
    a_format: str
    b_format: str
    output: str = "float32"
    block: int | None = None          # block-scaled: scales per `block` consecutive k
    scale_format: str | None = None   # decoded block scales are exact in this format
    alpha: str = "none"               # none | tensorwise | rowwise (float32 factors)
    k_multiple: int = 1               # K must be a multiple (probes are zero-padded at the end)
    mn_multiple: int = 1              # M and N must be multiples (extra rows/cols are zero)
    max_k: int = 1 << 16
    probe_mn: int = 0                 # M = N of probe calls (0: the batch size)
    max_batch: int = 64               # probes per call (diagonal of one GEMM)
    hardware_run: bool = True         # False: emulated / packing exercised only

    def __post_init__(self):
        for f in ("a_format", "b_format", "output"):
            get_format(getattr(self, f))
        if self.scale_format is not None:
            get_format(self.scale_format)
        check_choice("alpha", self.alpha, ALPHA_KINDS)
        if (self.block is None) != (self.scale_format is None):
            raise ValueError("block, scale_format: block-scaled devices need both, others neither")

    @property
    def block_scaled(self) -> bool:
        return self.block is not None

    def k_step(self) -> int:
        """K granularity of probe operands: the device's multiple, the block, and 16."""
        m = 16
        for x in (self.k_multiple, self.block or 1):
            m = m * x // math.gcd(m, x)
        return m

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Device:
    """A named GEMM with declared capabilities; ``fn`` is the callable described above."""
    name: str
    backend: str
    kind: str
    caps: Capabilities
    fn: Callable
    notes: list = field(default_factory=list)
    calls: int = 0

    def __post_init__(self):
        check_choice("kind", self.kind, DEVICE_KINDS)

    @property
    def hardware_run(self) -> bool:
        return self.kind != "virtual" and self.caps.hardware_run

    def __call__(self, a, b, *, scales_a=None, scales_b=None, alpha=None) -> np.ndarray:
        a = np.asarray(a, np.float64)
        b = np.asarray(b, np.float64)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"a, b: need [M, K] and [K, N], got {a.shape} and {b.shape}")
        self.calls += 1
        kw = {}
        if self.caps.block_scaled:
            kw = dict(scales_a=np.asarray(scales_a, np.float64), scales_b=np.asarray(scales_b, np.float64))
        if self.caps.alpha != "none":
            kw["alpha"] = alpha if alpha is not None else (1.0, 1.0)
        try:
            out = self.fn(a, b, **kw)
        except DeviceError:
            raise
        except Exception as e:  # a crashing backend is reported, never fatal to the others
            raise DeviceError(f"{self.name}: {type(e).__name__}: {e}") from e
        out = np.asarray(out, np.float64)
        if out.shape != (a.shape[0], b.shape[1]):
            raise DeviceError(f"{self.name}: returned shape {out.shape}, expected {(a.shape[0], b.shape[1])}")
        return out

    @classmethod
    def wrap(cls, name: str, fn: Callable, caps: Capabilities, *, backend: str = "user",
             kind: str = "cuda") -> "Device":
        """Wrap your own GEMM: ``fn(a, b, **kw) -> outputs`` over decoded float64 operands."""
        return cls(name, backend, kind, caps, fn)


class Runner:
    """Packs single dot products (probes) into device calls and reads the outputs back.

    Probes with equal K (and equal tensorwise alpha) share a call: probe i is row i of A
    and column i of B, and its output is C[i, i].  M and N are padded with zero rows and
    columns to ``caps.probe_mn`` / ``caps.mn_multiple``."""

    def __init__(self, device: Device, shape: tuple | None = None):
        """``shape`` = (M, N): every call has exactly this M and N (libraries pick kernels by
        shape), with at most min(M, N) probes on the diagonal."""
        self.device = device
        self.calls = 0
        self.shape = None if shape is None else (int(shape[0]), int(shape[1]))

    def run(self, ops: list) -> np.ndarray:
        """Outputs (float64) of a list of sim.Operands, in order."""
        caps = self.device.caps
        out = np.full(len(ops), np.nan)
        buckets: dict = {}
        for i, op in enumerate(ops):
            key = (op.K,)
            if caps.alpha == "tensorwise":
                key += (tuple(op.alpha) if op.alpha else (1.0, 1.0),)
            buckets.setdefault(key, []).append(i)
        per = caps.max_batch if self.shape is None else max(1, min(caps.max_batch, *self.shape))
        for key, idx in buckets.items():
            for c0 in range(0, len(idx), per):
                chunk = idx[c0:c0 + per]
                vals = self._call([ops[i] for i in chunk])
                out[chunk] = vals
        return out

    def _call(self, ops: list) -> np.ndarray:
        caps = self.device.caps
        n = len(ops)
        K = ops[0].K
        if self.shape is not None:
            M, N = self.shape
        else:
            mn = max(n, caps.probe_mn)
            M = N = -(-mn // caps.mn_multiple) * caps.mn_multiple
        A = np.zeros((M, K))
        B = np.zeros((K, N))
        kw = {}
        if caps.block_scaled:
            nb = K // caps.block
            sa = np.ones((M, nb))
            sb = np.ones((nb, N))
        for i, op in enumerate(ops):
            A[i] = op.a
            B[:, i] = op.b
            if caps.block_scaled:
                sa[i] = op.scales_a
                sb[:, i] = op.scales_b
        if caps.block_scaled:
            kw = dict(scales_a=sa, scales_b=sb)
        if caps.alpha == "tensorwise":
            al = ops[0].alpha or (1.0, 1.0)
            kw["alpha"] = (float(al[0]), float(al[1]))
        elif caps.alpha == "rowwise":
            ra = np.ones(M)
            rb = np.ones(N)
            for i, op in enumerate(ops):
                if op.alpha:
                    ra[i], rb[i] = op.alpha
            kw["alpha"] = (ra, rb)
        C = self.device(A, B, **kw)
        self.calls += 1
        return np.array([C[i, i] for i in range(n)])
