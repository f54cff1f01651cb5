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

Tensor-level calls (issue 13: shapes up to 4096 x 4096 x 16384): ``Device.draw(M, N, K,
generator) -> Batch`` (random operands as torch tensors on the device's torch device),
``Device.call_tensors(batch)`` (float32 [M, N] outputs), ``Device.kernels(batch)`` (profiler
kernel names) and ``Device.batch_from(a, b, ...)`` (crafted operands).  A backend supplies
its own (``TensorOps``: CUDA draws on the GPU and calls the op directly); every other device
gets them through the numpy protocol above.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from reference.errors import check_choice
from reference.formats import FORMATS

__all__ = ["Capabilities", "Device", "DeviceError", "AdapterError", "ProtocolError", "Runner", "ALPHA_KINDS",
           "DEVICE_KINDS", "OUTPUT_FORMATS", "DRAW_KINDS", "Batch", "TensorOps", "check_outputs",
           "check_device_name"]

ALPHA_KINDS = ("none", "tensorwise", "rowwise")
DEVICE_KINDS = ("virtual", "cpu", "cuda", "blackwell-only")


OUTPUT_FORMATS = ("float32", "bfloat16", "float16")  # what the simulator can compare bit for bit
DRAW_KINDS = ("normal",)  # operand families of Device.draw (validate.KINDS are the numpy ones)


class DeviceError(RuntimeError):
    """A device call failed (the backend crashed or refused the operands)."""


class AdapterError(DeviceError):
    """The adapter itself failed (TypeError, AttributeError, ...: a bug in the tool's or the
    user's wrapper), as opposed to the library refusing the call (RuntimeError /
    ValueError: a shape it does not take).  A random-shape run logs it as a tool error,
    never as a refused shape."""


def _wrapped(name: str, e: Exception) -> DeviceError:
    cls = DeviceError if isinstance(e, (RuntimeError, ValueError)) else AdapterError
    return cls(f"{name}: {type(e).__name__}: {e}")


class ProtocolError(DeviceError):
    """A device returned something other than what it declared (shape, dtype, or a value that
    is not exactly a value of its declared output format).  Never repaired: rounding the
    outputs here and then inferring that rounding would report the tool's own arithmetic."""


def check_device_name(name) -> str:
    """Device names key the report: non-empty, printable, no surrounding blanks."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"device name: must be a non-empty string, got {name!r}")
    if not name.isprintable() or name != name.strip():
        raise ValueError(f"device name: {name!r} must be printable without leading/trailing blanks")
    return name


def check_outputs(name: str, out, shape: tuple, fmt: str) -> np.ndarray:
    """``out`` as float64 if it is a float array of ``shape`` whose every value is exactly a
    value of ``fmt`` (NaN and infinities included); else ProtocolError naming the first
    offending output (index, value, declared format)."""
    from .sim import bits_to_float, output_bits
    try:
        raw = np.asarray(out)
    except Exception as e:
        raise ProtocolError(f"{name}: protocol error: the output ({type(out).__name__}) is not an array "
                            f"({type(e).__name__}: {e})") from e
    if raw.dtype.kind != "f":
        raise ProtocolError(f"{name}: protocol error: returned dtype {raw.dtype}, expected float64 "
                            f"values exactly representable in the declared output {fmt}")
    if raw.shape != tuple(shape):
        raise ProtocolError(f"{name}: protocol error: returned shape {raw.shape}, expected {tuple(shape)}")
    x = raw.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values are reported below
        back = bits_to_float(output_bits(x, fmt), fmt)
    same = (back.view(np.int64) == x.view(np.int64)) | (np.isnan(x) & np.isnan(back))
    if not same.all():
        idx = tuple(int(i) for i in np.argwhere(~same)[0])
        raise ProtocolError(
            f"{name}: protocol error: output {list(idx)} = {float(x[idx])!r} is not a {fmt} value "
            f"(declared output format {fmt}; {int((~same).sum())} of {x.size} outputs are not). "
            f"Return the values the kernel wrote in {fmt}, or declare the format it writes")
    return x


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
    # The longest K probes and validation use.  256 by default: host BLAS libraries (MKL,
    # oneDNN) cut longer K into panels whose partial sums meet in ways that depend on K itself,
    # so a wrapped CPU matmul with a larger default fits no model (README's wrap example).
    # Declare a larger max_k to probe split-K at long K (the CUDA adapters use 16384).
    max_k: int = 256
    probe_mn: int = 0                 # M = N of probe calls (0: the batch size)
    max_batch: int = 64               # probes per call (diagonal of one GEMM)
    hardware_run: bool = True         # False: emulated / packing exercised only

    def __post_init__(self):
        for f in ("a_format", "b_format") + (("scale_format",) if self.scale_format is not None else ()):
            check_choice(f, getattr(self, f), FORMATS)
        check_choice("output", self.output, OUTPUT_FORMATS)
        check_choice("alpha", self.alpha, ALPHA_KINDS)
        for f, lo in (("k_multiple", 1), ("mn_multiple", 1), ("max_k", 1), ("probe_mn", 0),
                      ("max_batch", 1)) + ((("block", 1),) if self.block is not None else ()):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"{f}: must be an integer >= {lo}, got {v!r}")
        if self.max_k < self.k_step():
            raise ValueError(f"max_k: {self.max_k} is below the smallest probe length {self.k_step()} "
                             "(lcm of 16, k_multiple and block)")
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


@dataclass(frozen=True)
class Batch:
    """One GEMM's operands at a shape, as torch tensors on the device's torch device.

    ``a`` [M, K], ``b`` [K, N]: decoded values (float32, float64 where a format needs it);
    ``scales_a``/``scales_b``: decoded block scales or None; ``alpha``: None or (sa, sb), each
    a float or a 1-D float32 tensor ([M] and [N], rowwise); ``native``: what the device's own
    call takes (native dtypes, layouts), opaque to everyone else."""
    a: Any
    b: Any
    scales_a: Any = None
    scales_b: Any = None
    alpha: Any = None
    native: Any = None
    kind: str = "normal"

    @property
    def shape(self) -> tuple:
        return (int(self.a.shape[0]), int(self.b.shape[1]), int(self.a.shape[1]))

    def sub(self, rows, cols) -> "Batch":
        """The GEMM of rows ``rows`` of A and columns ``cols`` of B (index tensors or slices):
        its outputs are the [rows][:, cols] block of this one's.  A tensorwise alpha (a float
        or a one-element tensor) becomes a float; rowwise vectors are indexed with the rows /
        columns.  ``native`` is dropped (it is the device's own form of the whole batch)."""
        sa = None if self.scales_a is None else self.scales_a[rows]
        sb = None if self.scales_b is None else self.scales_b[:, cols]
        alpha = None
        if self.alpha is not None:
            alpha = (_alpha_part(self.alpha[0], rows), _alpha_part(self.alpha[1], cols))
        return Batch(self.a[rows], self.b[:, cols], sa, sb, alpha, None, self.kind)


def _alpha_part(x, idx):
    """A tensorwise factor as a float, a row/column vector at ``idx``."""
    if isinstance(x, (int, float)) or x.numel() == 1:
        return float(x if isinstance(x, (int, float)) else x.reshape(()))
    if not isinstance(idx, slice):
        idx = idx.to(x.device)
    return x.reshape(-1)[idx]


@dataclass(frozen=True)
class TensorOps:
    """A backend's own tensor-level calls (CUDA: operands drawn on the GPU, the native op
    called directly, no numpy round trip).  ``draw(M, N, K, generator, kind) -> Batch``,
    ``call(batch) -> torch.Tensor`` (float32 [M, N]), ``kernels(batch) -> list[str]``,
    ``pack(a, b, scales_a, scales_b, alpha) -> Batch`` (crafted decoded operands, already on
    ``torch_device``, into the native form); a None keeps the default (the numpy protocol;
    no kernel names)."""
    torch_device: str = "cpu"
    pack: Callable | None = None
    draw: Callable | None = None
    call: Callable | None = None
    kernels: Callable | None = None


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
    tensors: TensorOps | None = None  # tensor-level calls; None: through the numpy protocol

    def __post_init__(self):
        check_device_name(self.name)
        check_choice("kind", self.kind, DEVICE_KINDS)
        if not isinstance(self.caps, Capabilities):
            raise TypeError(f"caps: expected probes.device.Capabilities, got {type(self.caps).__name__}")
        if not callable(self.fn):
            raise TypeError(f"fn: the device's GEMM must be callable, got {type(self.fn).__name__}")

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
            raise _wrapped(self.name, e) from e
        return check_outputs(self.name, out, (a.shape[0], b.shape[1]), self.caps.output)

    @property
    def torch_device(self) -> str:
        """Where this device's Batch tensors live ("cuda" or "cpu")."""
        return self.tensors.torch_device if self.tensors is not None else "cpu"

    def draw(self, M: int, N: int, K: int, generator=None, kind: str = "normal") -> Batch:
        """Random operands at exactly (M, N, K) (``generator``: a torch.Generator on
        ``torch_device``, or an int seed).  A shape the device cannot take is a DeviceError."""
        for nm, v in (("M", M), ("N", N), ("K", K)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{nm}: must be an integer >= 1, got {v!r}")
        check_choice("kind", kind, DRAW_KINDS)
        if isinstance(generator, (int, np.integer)) or generator is None:
            import torch
            generator = torch.Generator(device=self.torch_device).manual_seed(int(generator or 0))
        if self.tensors is not None and self.tensors.draw is not None:
            return self.tensors.draw(int(M), int(N), int(K), generator, kind)
        return _draw_default(self, int(M), int(N), int(K), generator, kind)

    def batch_from(self, a, b, scales_a=None, scales_b=None, alpha=None) -> Batch:
        """A Batch of given decoded operands (torch tensors; moved to ``torch_device``), e.g.
        crafted probes; ``alpha``: None or (sa, sb), floats or [M] / [N] tensors."""
        import torch
        dev = self.torch_device
        mv = lambda t: None if t is None else torch.as_tensor(t).to(dev)  # noqa: E731
        a, b, scales_a, scales_b = mv(a), mv(b), mv(scales_a), mv(scales_b)
        if alpha is not None:
            alpha = tuple(float(x) if np.ndim(x) == 0 else mv(x).float() for x in alpha)
        if self.tensors is not None and self.tensors.pack is not None:
            return self.tensors.pack(a, b, scales_a, scales_b, alpha)
        return Batch(a, b, scales_a, scales_b, alpha)

    def call_tensors(self, batch: Batch):
        """The device's outputs on ``batch``: float32 torch tensor [M, N] (exact output values)."""
        if self.tensors is not None and self.tensors.call is not None:
            self.calls += 1
            try:
                return self.tensors.call(batch)
            except DeviceError:
                raise
            except Exception as e:
                raise _wrapped(self.name, e) from e
        import torch
        np_ = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
        alpha = None
        if batch.alpha is not None:
            alpha = tuple(x if isinstance(x, float) else np_(x) for x in batch.alpha)
        out = self(np_(batch.a), np_(batch.b), scales_a=np_(batch.scales_a),
                   scales_b=np_(batch.scales_b), alpha=alpha)
        return torch.from_numpy(out.astype(np.float32)).to(batch.a.device)

    def kernels(self, batch: Batch) -> list:
        """Names of the kernels the call runs (profiler); [] where unknown (numpy protocol)."""
        t = self.tensors
        return list(t.kernels(batch)) if t is not None and t.kernels is not None else []

    @classmethod
    def wrap(cls, name: str, fn: Callable, caps: Capabilities, *, backend: str = "user",
             kind: str = "cuda") -> "Device":
        """Wrap your own GEMM: ``fn(a, b, **kw) -> outputs`` over decoded float64 operands."""
        return cls(name, backend, kind, caps, fn)


def _draw_default(dev: Device, M: int, N: int, K: int, g, kind: str) -> Batch:
    """Gaussian operands rounded into the device's formats (float64 CPU tensors), block
    scales 2^U(-4, 4) rounded into the scale format, alpha as validation draws it."""
    import torch
    from fp4ref.cast import round_to
    from reference.formats import get_format
    caps = dev.caps
    mm, km = caps.mn_multiple, math.lcm(caps.k_multiple, caps.block or 1)
    if M % mm or N % mm or K % km:
        raise DeviceError(f"{dev.name}: shape {(M, N, K)} refused: M and N must be multiples of {mm}, "
                          f"K of {km}")

    def ops(shape, fmt):
        top = float(get_format(fmt).max_finite)
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = x * (min(1.0, top / 1e6) if get_format(fmt).nbits > 8 else top / (8 if caps.block else 64))
        return round_to(x, fmt)
    a, b = ops((M, K), caps.a_format), ops((K, N), caps.b_format)
    sa = sb = None
    if caps.block_scaled:
        sc = lambda s: round_to(torch.exp2(torch.rand(s, generator=g, dtype=torch.float64) * 8 - 4),  # noqa: E731
                                caps.scale_format)
        sa, sb = sc((M, K // caps.block)), sc((K // caps.block, N))
    alpha = None
    if caps.alpha != "none":
        f = lambda n: (torch.rand(n, generator=g) * 3.75 + 0.25).float()  # noqa: E731
        alpha = (float(f(1)[0]), float(f(1)[0])) if caps.alpha == "tensorwise" else (f(M), f(N))
    return Batch(a, b, sa, sb, alpha, None, kind)


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
