"""Virtual devices: a hidden GemmModel behind the device protocol.

The inference only calls the device; the model is never read.  Options for tests:
``nondeterministic`` (a random split of K on each call), ``noise`` (probability that an
output's last bit flips, drawn per call) and out-of-family ``variant``s: "pairwise"
(FP32 pairwise-tree summation of FP32-rounded products) and "daz" (subnormal inputs read
as zero, then the model).
"""
from __future__ import annotations

import numpy as np

from reference.gemm import GemmModel, get_preset
from reference.rounding import Mode

from ..device import Capabilities, Device, TensorOps
from ..sim import bits_to_float, output_bits, simulate_gemm
from . import Spec

__all__ = ["virtual_device", "candidates", "VARIANTS", "nvfp4_caps", "mxfp4_caps",
           "blackwell_hypotheses"]

VARIANTS = (None, "pairwise", "daz")


def nvfp4_caps(**kw) -> Capabilities:
    kw.setdefault("max_k", 1 << 16)  # simulated: no K limit of its own (Capabilities defaults to 256)
    return Capabilities("float4_e2m1fn", "float4_e2m1fn", kw.pop("output", "float32"), block=16,
                        scale_format="ue4m3", **kw)


def mxfp4_caps(**kw) -> Capabilities:
    kw.setdefault("max_k", 1 << 16)
    return Capabilities("float4_e2m1fn", "float4_e2m1fn", kw.pop("output", "float32"), block=32,
                        scale_format="float8_e8m0fnu", **kw)


def virtual_device(model: GemmModel, caps: Capabilities, name: str | None = None, *,
                   nondeterministic: bool = False, noise: float = 0.0, variant: str | None = None,
                   seed: int = 0, diag_only: bool = False, by_shape=None, kernel_names=None) -> Device:
    """``diag_only`` (test speed): square calls compute only C[i, i]; the rest is NaN.
    The prober's Runner reads only the diagonal of its probe calls.
    ``by_shape(M, N, K)``: another model (or "pairwise", outside the family) for some
    shapes, as a library that picks its kernel by shape; None keeps ``model``.
    ``kernel_names(M, N, K) -> list[str]``: what ``Device.kernels`` reports at a shape
    (synthetic names, as a profiler would show; tests keep them opaque to explain)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: unknown value {variant!r}; valid choices: {VARIANTS}")
    if model.output != caps.output:
        model = model.replace(output=caps.output)
    rng = np.random.default_rng(seed)

    def fn(a, b, scales_a=None, scales_b=None, alpha=None):
        m = model
        other = by_shape(a.shape[0], b.shape[1], a.shape[1]) if by_shape else None
        if isinstance(other, str) and other == "pairwise":
            return _pairwise(m, a, b, scales_a, scales_b, caps.block, alpha)
        if other is not None:
            m = other.replace(output=caps.output)
        if variant == "daz":
            a = _daz(a, caps.a_format)
            b = _daz(b, caps.b_format)
        if variant == "pairwise":
            return _pairwise(m, a, b, scales_a, scales_b, caps.block, alpha)
        if nondeterministic:
            K = a.shape[1]
            choices = [s for s in (1, 2, 4) if K % s == 0]
            m = m.replace(split_k=int(rng.choice(choices)))
        if diag_only and a.shape[0] == b.shape[1]:
            return _diag(m, a, b, scales_a, scales_b, caps, alpha)
        keys = simulate_gemm(m, a, b, scales_a=scales_a, scales_b=scales_b, block=caps.block, alpha=alpha)
        if noise:
            flip = rng.random(keys.shape) < noise
            keys = np.where(flip & (keys >= 0), keys ^ 1, keys)
        return bits_to_float(keys, caps.output)

    ops = None
    if kernel_names is not None:
        ops = TensorOps(kernels=lambda batch: list(kernel_names(*batch.shape)))
    dev = Device(name or f"virtual-{model.name}", "virtual (hidden GemmModel)", "virtual", caps, fn,
                 tensors=ops)
    dev.notes.append("virtual device: outputs come from a hidden reference.gemm model")
    return dev


def _diag(m, a, b, sa, sb, caps, alpha):
    from ..sim import Operands, simulate
    n = a.shape[0]
    ops = []
    for i in range(n):
        al = None
        if alpha is not None:
            al = tuple(float(x) if np.ndim(x) == 0 else float(np.asarray(x)[i]) for x in alpha)
        ops.append(Operands(a[i], b[:, i], None if sa is None else sa[i], None if sb is None else sb[:, i],
                            caps.block, al))
    keys = simulate([m] * n, ops)
    out = np.full((n, n), np.nan)
    out[np.arange(n), np.arange(n)] = bits_to_float(keys, caps.output)
    return out


def _daz(x, fmt):
    from reference.formats import get_format
    tiny = float(get_format(fmt).min_normal)
    return np.where(np.abs(x) < tiny, 0.0 * np.sign(x), x)


def _pairwise(model, a, b, sa, sb, block, alpha):
    P = a[:, None, :] * b.T[None, :, :]  # [M, N, K], exact products
    if sa is not None:
        s = sa[:, None, :] * sb.T[None, :, :]
        P = P * np.repeat(s, block, axis=2)
    x = P.astype(np.float32)
    while x.shape[2] > 1:
        if x.shape[2] % 2:
            x = np.concatenate([x, np.zeros(x.shape[:2] + (1,), np.float32)], axis=2)
        x = x[:, :, 0::2] + x[:, :, 1::2]
    c = x[:, :, 0].astype(np.float64)
    if alpha is not None:
        c = (c * np.float64(np.float32(np.asarray(alpha[0], np.float64) if np.ndim(alpha[0]) == 0 else
                                        np.asarray(alpha[0])[:, None]) *
             np.float32(np.asarray(alpha[1], np.float64) if np.ndim(alpha[1]) == 0
                        else np.asarray(alpha[1])[None, :]))).astype(np.float32).astype(np.float64)
    return bits_to_float(output_bits(_round_out(c, model.output), model.output), model.output)


def _round_out(c, fmt):
    from ..sim import round_float64
    return round_float64(c, fmt, 0)


def blackwell_hypotheses() -> dict:
    """Name -> (model, caps) of each Blackwell hypothesis (issue 17; docs/blackwell.md),
    as a virtual block-scaled device sees it (float32 output unless named)."""
    from reference.gemm import get_preset
    nv = get_preset("blackwell_mxf4nvf4")
    mx8 = get_preset("blackwell_mxf8f6f4")
    pm = get_preset("probe_matched").replace(output="float32", output_mode=Mode.RNE)
    return {
        "virtual-nvfp4-probe_matched": (pm, nvfp4_caps(max_batch=16)),
        "virtual-nvfp4-probe_matched_lattice": (get_preset("probe_matched_lattice"), nvfp4_caps(max_batch=16)),
        "virtual-blackwell-mxf4nvf4": (nv, nvfp4_caps(max_batch=16)),
        "virtual-blackwell-mxf4nvf4-mxfp4": (
            nv.replace(exp_formats=("float4_e2m1fn", "float4_e2m1fn", "float8_e8m0fnu")),
            mxfp4_caps(max_batch=16)),
        "virtual-blackwell-mxf8f6f4": (mx8, mxfp4_caps(max_batch=16)),
        # cuBLASLt-style: the mxf4nvf4 chain, K split in two, per-tensor alpha, bf16 output
        "virtual-blackwell-cublaslt": (nv.replace(split_k=2, output="bfloat16"),
                                        nvfp4_caps(max_batch=16, alpha="tensorwise", output="bfloat16")),
    }


def candidates() -> list:
    """The SPEC's probe_matched model on NVFP4 operands (the default virtual device) and
    one virtual device per Blackwell hypothesis (not in the default set)."""
    out = []
    for name, (m, caps) in blackwell_hypotheses().items():
        def build(m=m, caps=caps, name=name):
            return virtual_device(m.replace(name=name), caps, name)
        out.append(Spec(name, "virtual (hidden GemmModel)", "virtual", build,
                        default=name == "virtual-nvfp4-probe_matched"))
    return out
