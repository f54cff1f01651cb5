"""Validation: the inferred model against the device on many random outputs, bit for bit.

Operands are random values of the device's formats in three families: ``normal``
(Gaussian, rounded to the format), ``heavy`` (Gaussian times 2^U(-spread, spread): wide
exponent ranges) and ``cancel`` (pairs of products that nearly cancel, plus a few big
terms).  Shapes include small M, N with large K, where libraries split K.  When a shape
disagrees, split_k in {1, 2, 4, 8, 16} is tried on that batch and, if one fits, confirmed
on a fresh batch (libraries choose split-K per shape); that per-shape split is reported.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from fp4ref.gridround import GridFormat, round_int, unpack_ieee
from fp4ref.native import run_schedule, schedule_parts
from reference.formats import FORMATS, get_format
from reference.gemm import GemmModel
from reference.rounding import Mode, Overflow

from .device import Capabilities, Device, DeviceError
from .sim import NAN_KEY, output_bits, simulate_gemm

__all__ = ["random_operands", "validate", "DEFAULT_SHAPES", "ValidationResult", "quantize"]

# (M, N, K): >= 1e5 outputs together; small M, N with large K invite split-K.
# K = 100 (not a multiple of 8) makes cuBLAS fall back to CUTLASS kernels on Hopper.
DEFAULT_SHAPES = ((256, 256, 64), (200, 100, 32), (128, 128, 256), (128, 64, 128), (96, 80, 48),
                  (64, 64, 1024), (64, 64, 100), (16, 16, 4096), (8, 8, 8192), (1, 64, 2048))
KINDS = ("normal", "heavy", "cancel")


def quantize(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round float64 values onto a format's grid, saturating: decoded values, exact in it.

    Nearest, by the fast paths' kernel (fp4ref.gridround), keeping the rules this
    generator has always had so that seeded operands stay bit-identical: float32 is
    numpy's cast after a clip at +-3e38, tf32 rounds that float32 to 11 significant bits
    in its own binade (float32's subnormals included), and formats of 8 bits or fewer
    break ties toward the smaller magnitude, give +0 for -0 and +max for NaN."""
    spec = get_format(fmt)
    if not spec.has_zero:
        raise ValueError(f"fmt: {fmt!r} has no zero, so it is no operand format; valid choices: "
                         + ", ".join(n for n, f in FORMATS.items() if f.has_zero))
    x = np.asarray(x, np.float64)
    if fmt in ("float32", "tf32"):
        y = np.clip(x, -3e38, 3e38).astype(np.float32).astype(np.float64)
        if fmt == "float32":
            return y
        # below tf32's normal range the generator keeps 11 significant bits: scale up 2**64
        s = np.where(np.abs(y) < 2.0 ** -126, 64, 0)
        return np.where(np.isnan(y), y, np.ldexp(_round64(np.ldexp(y, s), spec, Mode.RNE), -s))
    if spec.nbits > 8:  # bfloat16, float16: ties to even
        return _round64(x, spec, Mode.RNE)
    # ties toward the smaller magnitude: RNA of the next float64 toward zero (every
    # midpoint of these grids is a float64, so only exact ties fall below it)
    mag = _round64(np.nextafter(np.abs(x), 0), spec, Mode.RNA)
    mag = np.where(np.isnan(x), float(spec.max_finite), mag)
    return np.where(x < 0, -mag, mag) if spec.signed else mag


def _round64(x: np.ndarray, spec, mode: Mode) -> np.ndarray:
    """float64 values rounded into ``spec``, saturating, as float64: -0 kept, +-inf to
    +-max finite, NaN to NaN."""
    u = unpack_ieee(np, x.view(np.int64), 52, 11)
    r = round_int(np, u.neg, np.where(u.nan | u.inf, 0, u.mag), u.exp, GridFormat.of(spec), mode,
                  overflow=Overflow.SATFINITE, e=u.e)
    v = np.ldexp(r.n.astype(np.float64), r.exp.astype(np.int32))
    v = np.where(u.inf, float(spec.max_finite), v)
    return np.where(u.nan, np.nan, np.where(r.neg, -v, v))


def _scale_values(fmt: str, lo_e: int, hi_e: int, rng, shape) -> np.ndarray:
    spec = get_format(fmt)
    vals = np.array([float(v) for _, v in spec.finite_values if v > 0]) if spec.nbits <= 16 else None
    vals = vals[(vals >= 2.0 ** lo_e) & (vals <= 2.0 ** hi_e)]
    return rng.choice(vals, size=shape)


def random_operands(caps: Capabilities, M: int, N: int, K: int, rng, kind: str = "normal"):
    """Decoded random operands (a [M,K], b [K,N], scales or None) of the device's formats."""
    fa, fb = caps.a_format, caps.b_format

    def draw(shape, fmt, spread):
        spec = get_format(fmt)
        x = rng.standard_normal(shape)
        if spread:
            x = x * np.exp2(rng.integers(-spread, spread + 1, size=shape))
        top = float(spec.max_finite)
        if spec.nbits > 8:
            x = x * min(1.0, top / 1e6)
        else:
            x = x * (top / 8 if caps.block_scaled else top / 64)
        return quantize(x, fmt)

    if kind == "heavy":
        sp = 6 if get_format(fa).nbits <= 8 else 24
    else:
        sp = 0
    a = draw((M, K), fa, sp)
    b = draw((K, N), fb, sp)
    if kind == "cancel":
        # pairs: a[2i+1] = -a[2i], b[2i+1] = b[2i] * (1 + tiny): products nearly cancel
        a[:, 1::2] = -a[:, 0:K - K % 2:2]
        pert = quantize(b[0::2, :][: K // 2] * (1 + 2.0 ** -rng.integers(3, 12, size=(K // 2, N))), fb)
        b[1::2, :] = pert[: (K // 2)]
        # a few big terms keep the accumulator's exponent high
        big = rng.random((M, K)) < 0.02
        a = np.where(big, quantize(a * 16, fa), a)
    sa = sb = None
    if caps.block_scaled:
        nb = K // caps.block
        lo, hi = (-4, 4) if kind != "heavy" else (-8, 8)
        sa = _scale_values(caps.scale_format, lo, hi, rng, (M, nb))
        sb = _scale_values(caps.scale_format, lo, hi, rng, (nb, N))
    return a, b, sa, sb


@dataclass
class ValidationResult:
    record: dict | None
    per_shape: list = field(default_factory=list)   # {"shape", "outputs", "matches", "split_k"}
    nondeterministic: bool = False
    notes: list = field(default_factory=list)
    errors: list = field(default_factory=list)      # {"shape", "error"}: batches that raised
    wall_s: float = 0.0


def _keys(out: np.ndarray, fmt: str) -> np.ndarray:
    return output_bits(out, fmt)


def random_batch(device: Device, M: int, N: int, K: int, rng, kind: str):
    """One random GEMM on the device: (a, b, scales_a, scales_b, alpha, output keys).
    Device errors propagate to the caller."""
    caps = device.caps
    a, b, sa, sb = random_operands(caps, M, N, K, rng, kind)
    alpha = _random_alpha(caps, M, N, rng)
    got = _keys(device(a, b, scales_a=sa, scales_b=sb, alpha=alpha), caps.output)
    return a, b, sa, sb, alpha, got


def _codes(keys: np.ndarray, fmt: str) -> np.ndarray:
    spec = get_format(fmt)
    return np.where(keys == NAN_KEY, spec.nan_code, keys)


def _fit_shape(shape, M, N, K, caps) -> tuple:
    mm = caps.mn_multiple
    step = math.lcm(caps.block or 1, caps.k_multiple)  # any K the device takes
    K = -(-K // step) * step
    return (-(-M // mm) * mm, -(-N // mm) * mm, min(K, caps.max_k - caps.max_k % step))


def validate(device: Device, model: GemmModel, *, outputs: int = 100_000, seed: int = 0,
             shapes=DEFAULT_SHAPES, repeat_check: bool = True, progress=None,
             shape_models: dict | None = None, no_split_search=()) -> ValidationResult:
    """Compare ``model`` with ``device`` on at least ``outputs`` random outputs.

    ``shape_models``: {(M, N, K): model or (model, KLayout[, TileSchedule])} for shapes where
    the library runs another kernel (inferred or explained per shape); those shapes are
    checked against their own model, on the operands in the kernel's K order where a layout
    is given, and per output tile where a tile schedule is.
    ``no_split_search``: shapes where a mismatch is not searched for a split-K schedule
    (a pre-check already found none that explains them)."""
    no_split_search = {tuple(x) for x in no_split_search}
    shape_models = shape_models or {}
    from .recorder import ValidationRecorder
    t0 = time.perf_counter()
    caps = device.caps
    rng = np.random.default_rng(seed)
    rec = ValidationRecorder(caps.output)
    res = ValidationResult(None)
    shapes = [_fit_shape(s, *s, caps) for s in shapes]
    base = sum(M * N for M, N, _ in shapes)
    scale = max(1, -(-outputs // base))
    plan = []
    for rep in range(scale):
        for i, (M, N, K) in enumerate(shapes):
            plan.append((M, N, K, KINDS[(i + rep) % len(KINDS)]))
    done = 0
    for n, (M, N, K, kind) in enumerate(plan):
        if done >= outputs and n >= len(shapes):
            break
        try:
            a, b, sa, sb, alpha, got = random_batch(device, M, N, K, rng, kind)
            sched = shape_models.get((M, N, K), model)
            here = schedule_parts(sched)[0]
            exp = run_schedule(sched, lambda lay, m: simulate_gemm(
                m, *((a, b) if lay is None else lay.pad(a, b)), scales_a=sa, scales_b=sb, block=caps.block,
                alpha=alpha), (M, N, K))
            # the first batch, and every batch the model misses, is sent twice: intermittent
            # noise shows as two answers to one question, not as a model that does not fit
            if repeat_check and (n == 0 or not np.array_equal(exp, got)):
                _repeat(device, (a, b, sa, sb, alpha), got, (M, N, K), res)
                if res.nondeterministic:  # decided: no model can fit answers that vary
                    break
        except DeviceError as e:  # reported in the record (errors), never silently dropped
            res.notes.append(f"shape {(M, N, K)}: device error: {e}")
            res.errors.append({"shape": [M, N, K], "error": str(e)})
            continue
        used = here
        if not np.array_equal(exp, got) and here is model and (M, N, K) not in no_split_search:
            m_fit = _try_splits(model, a, b, sa, sb, caps, alpha, got)
            if m_fit is not None:
                # confirm the per-shape schedule on fresh operands; count only the fresh batch
                a, b, sa, sb = random_operands(caps, M, N, K, rng, kind)
                try:
                    got = _keys(device(a, b, scales_a=sa, scales_b=sb, alpha=alpha), caps.output)
                except DeviceError as e:
                    res.notes.append(f"shape {(M, N, K)}: device error: {e}")
                    res.errors.append({"shape": [M, N, K], "error": str(e)})
                    continue
                exp = simulate_gemm(m_fit, a, b, scales_a=sa, scales_b=sb, block=caps.block, alpha=alpha)
                used = m_fit
        bad = rec.add((M, N, K), _codes(exp, caps.output), _codes(got, caps.output))
        res.per_shape.append({"shape": [M, N, K], "kind": kind, "outputs": int(M * N),
                              "matches": int(M * N - bad), "split_k": int(used.split_k), "split_tile": used.split_tile,
                              "group_size": used.group_size, "own_model": here is not model})
        done += M * N
        if progress:
            progress(done, outputs)
    res.record = rec.to_dict() if rec.outputs else None
    if res.record is not None and res.errors:
        res.record["errors"] = list(res.errors)
    res.wall_s = time.perf_counter() - t0
    return res


def _repeat(device, ops, got, shape, res) -> None:
    a, b, sa, sb, alpha = ops
    again = _keys(device(a, b, scales_a=sa, scales_b=sb, alpha=alpha), device.caps.output)
    if not np.array_equal(got, again):
        res.nondeterministic = True
        n = int((got != again).sum())
        res.notes.append(f"nondeterministic: {n} of {got.size} outputs differ between two identical "
                         f"calls at shape {shape}")


def _random_alpha(caps, M, N, rng):
    if caps.alpha == "none":
        return None
    f = lambda n: np.float32(rng.uniform(0.25, 4.0, n)).astype(np.float64)
    if caps.alpha == "tensorwise":
        return (float(f(1)[0]), float(f(1)[0]))
    return (f(M), f(N))


def _try_splits(model, a, b, sa, sb, caps, alpha, got, seconds: float | None = None):
    """Per-shape schedule: the split of K (and the group size the kernel uses at this K).
    ``seconds``: give up (None) after this long; a sequential-FMA model simulates K steps
    one by one, so at K = 8192 the whole candidate list takes minutes."""
    K = a.shape[1]
    from .grid import split_candidates
    t_end = None if seconds is None else time.perf_counter() + seconds
    for m in split_candidates(model, K):
        if t_end is not None and time.perf_counter() > t_end:
            return None
        e = simulate_gemm(m, a[:8], b[:, :8], scales_a=None if sa is None else sa[:8],
                          scales_b=None if sb is None else sb[:, :8], block=caps.block,
                          alpha=_alpha_rows(alpha, 8))
        if not np.array_equal(e, got[:8, :8]):
            continue
        e = simulate_gemm(m, a, b, scales_a=sa, scales_b=sb, block=caps.block, alpha=alpha)
        if np.array_equal(e, got):
            return m
    return None


def _alpha_rows(alpha, n):
    if alpha is None:
        return None
    sa, sb = alpha
    f = lambda x: x if np.ndim(x) == 0 else np.asarray(x)[:n]
    return (f(sa), f(sb))
