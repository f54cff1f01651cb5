"""Fingerprint one GEMM of one GPU against the model a baseline report validated for it.

No tolerance and no golden GPU: seeded crafted probes (the inference's own lattice and
inner-alignment pools, at the probe shape) and seeded random operands at shapes where the
baseline validated the model bit for bit go to the device; its output bits are compared with
the emulator's prediction (probes.sim) from the baseline's model.  A mismatching batch is sent
again with the same operands: identical outputs mean the stack computes other numerics
(deterministic: another kernel, driver or library); different outputs mean the device does not
compute a function of its inputs (suspect hardware), and the XOR of the two outputs names the
flipped bits.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from reference.errors import check_choice
from reference.formats import get_format
from reference.gemm import GemmModel
from reference.notation import from_dict

from . import probes as P
from .device import Device, Runner
from .infer import predict
from .sim import NAN_KEY, bits_to_float, output_bits, simulate_gemm
from .validate import KINDS, random_batch
from .backends import canonical_name

__all__ = ["Expectation", "baseline_expectations", "fingerprint", "inject_fault", "CELL_STATUSES",
           "FAULT_KINDS", "DEFAULT_MACS", "parse_fault", "pick_shapes"]

CELL_STATUSES = ("match", "differs-deterministic", "differs-nondeterministic", "error", "skipped")
FAULT_KINDS = ("flip", "drop-tail")
DEFAULT_MACS = 4_000_000      # random operands per GEMM: about 1 s of emulation on one core
_SHOWN = 8                    # mismatches / flipped outputs listed as evidence


@dataclass
class Expectation:
    """What a baseline says about one GEMM: its model and where it was validated."""
    name: str
    model: GemmModel
    shapes: list = field(default_factory=list)   # [((M, N, K), model at that shape)]
    probe_k: int = 0                             # K of the inference's crafted probes


def _shape_models(extra: dict) -> dict:
    return {tuple(e["shape"]): from_dict(e["model"]) for e in extra.get("shape_models") or []
            if e.get("status") == "fit" and e.get("model")}


def baseline_expectations(report: dict) -> dict:
    """{device name: Expectation} for the baseline's devices with a fit or partial model.
    Only shapes where every validated output matched are kept (a 'partial' model is checked
    where it holds); a shape's own split-K schedule or per-shape model goes with it."""
    out = {}
    for d in report.get("devices") or []:
        if d.get("status") not in ("fit", "partial") or not d.get("model"):
            continue
        model = from_dict(d["model"])
        extra = d.get("extra") or {}
        own = _shape_models(extra)
        good: dict = {}
        for s in extra.get("per_shape") or []:
            shp = tuple(s["shape"])
            if s["matches"] != s["outputs"]:
                good[shp] = None  # one failing batch disqualifies the shape
                continue
            m = own.get(shp) if s.get("own_model") else model.replace(
                split_k=s["split_k"], split_tile=s.get("split_tile"), group_size=s["group_size"])
            if good.get(shp, 0) is not None and m is not None:
                good[shp] = m
        ks = [p["operands"].get("K", 0) for p in d.get("probes") or [] if isinstance(p.get("operands"), dict)]
        name = canonical_name(d["name"])
        out[name] = Expectation(name, model, [(k, m) for k, m in good.items() if m is not None],
                                     max([k for k in ks if isinstance(k, int)], default=0))
    return out


def _hex(key: int, fmt: str) -> str:
    if key == NAN_KEY:
        return "nan"
    return f"0x{int(key):0{get_format(fmt).nbits // 4}x}"


def _fits(shape, caps) -> bool:
    M, N, K = shape
    return (M % caps.mn_multiple == 0 and N % caps.mn_multiple == 0 and K <= caps.max_k
            and K % math.lcm(caps.k_multiple, caps.block or 1) == 0)


def pick_shapes(exp: Expectation, caps, macs: int = DEFAULT_MACS) -> list:
    """Validated shapes within ``macs`` multiply-adds: split-K shapes first (a schedule change
    shows there), then the cheapest; always at least one."""
    ok = [(s, m) for s, m in exp.shapes if _fits(s, caps)]
    ok.sort(key=lambda sm: (sm[1].split_k == 1, sm[0][0] * sm[0][1] * sm[0][2]))
    out, used = [], 0
    for s, m in ok:
        cost = s[0] * s[1] * s[2]
        if out and used + cost > macs:
            continue
        out.append((s, m))
        used += cost
    return out


@dataclass
class _Batch:
    """One comparison: expected and observed keys, and how to send it again."""
    label: str
    shape: tuple
    expected: np.ndarray
    got: np.ndarray
    again: object   # () -> keys of the same call repeated


def _crafted(dev: Device, exp: Expectation, rng, limit: int) -> _Batch | None:
    caps = dev.caps
    step = caps.k_step()
    K = min(exp.probe_k or 2048, caps.max_k)
    K -= K % step
    if K <= 0 or limit <= 0:
        return None
    ctx = P.ProbeContext(caps, K)
    pool = P.cached_pool(P.lattice_pool, ctx) + P.cached_pool(P.inner_pool, ctx)
    if not pool:
        return None
    pick = np.sort(rng.choice(len(pool), size=min(limit, len(pool)), replace=False))
    probes = [pool[i] for i in pick]
    ops = [p.ops for p in probes]
    run = lambda: output_bits(Runner(dev).run(ops), caps.output)  # noqa: E731
    return _Batch(f"crafted ({len(ops)} probes, K <= {K})", (0, 0, K), predict([exp.model], probes)[0],
                  run(), run)


def _random(dev: Device, shape, model: GemmModel, rng, kind: str) -> _Batch:
    caps = dev.caps
    a, b, sa, sb, alpha, got = random_batch(dev, *shape, rng, kind)
    exp = simulate_gemm(model, a, b, scales_a=sa, scales_b=sb, block=caps.block, alpha=alpha)
    again = lambda: output_bits(dev(a, b, scales_a=sa, scales_b=sb, alpha=alpha), caps.output)  # noqa: E731
    return _Batch(f"random {kind}", tuple(shape), exp, got, again)


def _classify(b: _Batch, fmt: str, repeats: int) -> tuple[str, dict]:
    """Status and evidence of a mismatching batch: repeat it, XOR the outputs."""
    bad = np.argwhere(b.expected != b.got)
    ev = {"batch": b.label, "shape": list(b.shape), "outputs": int(b.got.size), "mismatches": len(bad),
          "first": [{"index": [int(x) for x in i], "expected": _hex(b.expected[tuple(i)], fmt),
                     "got": _hex(b.got[tuple(i)], fmt)} for i in bad[:_SHOWN]]}
    for _ in range(repeats):
        again = b.again()
        diff = np.argwhere(again != b.got)
        if len(diff):
            ev["repeat_differs"] = len(diff)
            ev["flipped"] = [{"index": [int(x) for x in i], "first": _hex(b.got[tuple(i)], fmt),
                              "repeat": _hex(again[tuple(i)], fmt),
                              "xor": _xor(b.got[tuple(i)], again[tuple(i)], fmt)} for i in diff[:_SHOWN]]
            return "differs-nondeterministic", ev
    ev["repeats_identical"] = repeats
    return "differs-deterministic", ev


def _xor(k1: int, k2: int, fmt: str) -> str:
    if NAN_KEY in (k1, k2):
        return "nan"
    return _hex(int(k1) ^ int(k2), fmt)


def fingerprint(dev: Device, exp: Expectation, *, seed: int = 0, crafted: int = 512,
                macs: int = DEFAULT_MACS, seconds: float | None = None, repeats: int = 2) -> dict:
    """One cell of the fleet matrix: {"status", "outputs", "mismatches", "shapes", "evidence"}.
    ``seconds``: stop sending random batches after this long (at least one batch runs)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    fmt = dev.caps.output
    cell = {"status": "match", "outputs": 0, "mismatches": 0, "shapes": [], "evidence": None}
    try:
        batches = [_crafted(dev, exp, rng, crafted)]
        shapes = pick_shapes(exp, dev.caps, macs)
        if not shapes:
            cell["notes"] = ["no validated shape of the baseline fits this device's capabilities"]
        for i, (shape, model) in enumerate(shapes):
            if i and seconds is not None and time.perf_counter() - t0 > seconds:
                cell.setdefault("notes", []).append(f"time share spent after {i} of {len(shapes)} shapes")
                break
            batches.append(_random(dev, shape, model, rng, KINDS[i % len(KINDS)]))
            cell["shapes"].append(list(shape))
        for b in batches:
            if b is None:
                continue
            cell["outputs"] += int(b.got.size)
            n_bad = int(np.count_nonzero(b.expected != b.got))
            cell["mismatches"] += n_bad
            if n_bad and cell["status"] == "match":
                cell["status"], cell["evidence"] = _classify(b, fmt, repeats)
    except Exception as e:  # one failing GEMM (a device error, a refused shape) is a cell, not a crash
        cell.update(status="error", error=f"{type(e).__name__}: {e}")
    cell["wall_s"] = round(time.perf_counter() - t0, 3)
    return cell


def parse_fault(spec: str) -> tuple:
    """'flip:1e-4' -> ('flip', 1e-4); 'drop-tail:16' -> ('drop-tail', 16)."""
    kind, _, arg = spec.partition(":")
    check_choice("--inject-fault", kind, FAULT_KINDS)
    try:
        val = float(arg) if kind == "flip" else int(arg)
    except ValueError:
        raise ValueError(f"--inject-fault: {spec!r} needs a number after ':' (flip:1e-4, drop-tail:16)") from None
    if val <= 0 or (kind == "flip" and val > 1):
        raise ValueError(f"--inject-fault: {spec!r}: the value must be in (0, 1] for flip, > 0 for drop-tail")
    return kind, val


def inject_fault(dev: Device, spec: str, *, seed: int = 0) -> Device:
    """A copy of ``dev`` with a fault, to check that the fleet flags it.
    ``flip:P``: each output, with probability P, gets one random significand bit flipped
    (drawn per call: nondeterministic, like a failing multiplier).
    ``drop-tail:T``: the last T terms of K are dropped (deterministic, like a split-K
    schedule that loses the K tail)."""
    kind, val = parse_fault(spec)
    fmt = dev.caps.output
    width = max(1, get_format(fmt).man_bits)
    rng = np.random.default_rng(seed)
    inner = dev.fn

    def fn(a, b, **kw):
        if kind == "drop-tail":
            a = a.copy()
            a[:, max(0, a.shape[1] - int(val)):] = 0.0
            return inner(a, b, **kw)
        out = np.asarray(inner(a, b, **kw), np.float64)
        keys = output_bits(out, fmt)
        hit = (rng.random(keys.shape) < val) & (keys >= 0)
        keys = np.where(hit, keys ^ (1 << rng.integers(0, width, keys.shape)), keys)
        return bits_to_float(keys, fmt)

    bad = Device(dev.name, dev.backend, dev.kind, dev.caps, fn, notes=list(dev.notes))
    bad.notes.append(f"fault injected: {spec}")
    return bad
