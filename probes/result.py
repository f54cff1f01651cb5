"""What probing one device found, typed: ``DeviceResult`` (and ``ShapeResult`` for a shape
inferred on its own), and ``decide_status``, the one place a device's status is decided.

Nothing in probes/ writes report JSON: the reports layer turns a DeviceResult into the
report's device object (reports.records.device_record).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from reference.errors import check_choice
from reference.gemm import GemmModel

from .device import DEVICE_KINDS

__all__ = ["DeviceStatus", "DEVICE_STATUSES", "Decision", "decide_status", "DeviceResult", "ShapeResult"]


class DeviceStatus(str, enum.Enum):
    """A device's status in a report (the value is what the JSON holds)."""
    FIT = "fit"                            # every validated output matches the model bit for bit
    PARTIAL = "partial"                    # whole shapes match; others run a kernel nothing fits
    NO_FIT = "no_fit"                      # no model of the family fits; the closest is kept
    NONDETERMINISTIC = "nondeterministic"  # identical inputs, different outputs
    ERROR = "error"                        # failed, crashed or did not finish
    SKIPPED = "skipped"                    # cannot run here (e.g. no CUDA device)


DEVICE_STATUSES = tuple(s.value for s in DeviceStatus)


class Decision(NamedTuple):
    status: DeviceStatus
    error: str | None
    notes: list


def decide_status(inferred: str | None = None, v=None, *, failure: str | None = None,
                  not_run: str | None = None) -> Decision:
    """The device's status, decided here and nowhere else: (status, error or None, notes).

    ``not_run``: why the device cannot run here -> 'skipped'.  ``failure``: why probing did
    not finish (detection or inference raised, the worker crashed or vanished, the time
    limit) -> 'error'.  Otherwise ``inferred`` (the inference's status) and ``v`` (the
    validation, or None): not 'fit' from inference: kept.  A fit needs a validation that
    ran: nondeterministic repeats -> 'nondeterministic'; no output validated -> 'error';
    every output matching and no shape raising -> 'fit'; whole shapes failing (mismatching
    or raising) while others match bit for bit -> 'partial'; otherwise 'no_fit' (the model
    is kept as the closest candidate)."""
    if not_run is not None:
        return Decision(DeviceStatus.SKIPPED, not_run or None, [])
    if failure is not None:
        return Decision(DeviceStatus.ERROR, failure, [])
    if inferred != "fit":
        return Decision(DeviceStatus(inferred), None, [])
    if v is None:
        return Decision(DeviceStatus.ERROR, "inferred a model but no validation ran", [])
    if v.nondeterministic:
        return Decision(DeviceStatus.NONDETERMINISTIC, None, [])
    if v.record is None:
        why = "; ".join(f"{e['shape']}: {e['error']}" for e in list(v.errors)[:3]) or "no batch ran"
        return Decision(DeviceStatus.ERROR, f"validation: no output could be validated ({why})", [])
    return _validated(v)


def _validated(v) -> Decision:
    """fit / partial / no_fit from a validation that ran (decide_status)."""
    shapes: dict = {}
    for s in v.per_shape:
        ok, n = shapes.get(tuple(s["shape"]), (0, 0))
        shapes[tuple(s["shape"])] = (ok + s["matches"], n + s["outputs"])
    raised = sorted({tuple(e["shape"]) for e in v.errors})
    good = sorted(k for k, (ok, n) in shapes.items() if ok == n and k not in raised)
    bad = sorted(k for k, (ok, n) in shapes.items() if ok != n)
    rv = v.record
    if not bad and not raised:
        return Decision(DeviceStatus.FIT, None, [])
    at = lambda keys: ", ".join(map(str, map(list, keys)))  # noqa: E731
    if good:
        miss = rv["outputs"] - rv["matches"]
        return Decision(DeviceStatus.PARTIAL, None, [
            f"partial: every one of {sum(shapes[k][1] for k in good)} outputs at shapes "
            f"{at(good)} matches bit for bit; "
            + (f"at {at(bad)} the library runs another kernel that no model "
               f"of the family fits ({miss} of {rv['outputs']} outputs differ); see shape_models and "
               f"the mismatch table" if bad else "")
            + (("; " if bad else "") + f"at {at(raised)} the device raised "
               f"(validation errors)" if raised else "")])
    return Decision(DeviceStatus.NO_FIT, None, [
        f"no model in the family fits every output: the model that fits every probe (shown) "
        f"disagrees with {rv['outputs'] - rv['matches']} of {rv['outputs']} random outputs "
        f"({rv.get('agreement_pct', 0):.3f}% agreement)"
        + (f", and the device raised at {at(raised)}" if raised else "")
        + "; see the mismatch table"])


@dataclass
class ShapeResult:
    """Inference at one (M, N, K) on its own (libraries pick the kernel by shape)."""
    shape: tuple
    status: str                          # the inference's status, or 'error'
    model: GemmModel | None = None
    closest: GemmModel | None = None     # a shape that fits nothing: its closest candidate
    notes: list | None = None            # kept for a shape that does not fit
    probes_asked: int | None = None
    wall_s: float | None = None
    error: str | None = None             # the inference raised (e.g. a K the device cannot take)


@dataclass
class DeviceResult:
    """One device's probe result.  ``status``/``error`` come from a ``Decision`` (build it
    with ``DeviceResult.decided``); the rest is evidence: probe and scan records, the
    validation record (probes.recorder), notes, and ``extra`` (inference counters,
    candidate grid, per-shape validation, ...)."""
    name: str
    backend: str
    kind: str
    hardware_run: bool
    status: DeviceStatus
    error: str | None = None
    capabilities: dict = field(default_factory=dict)
    model: GemmModel | None = None
    probes: list = field(default_factory=list)
    scans: list = field(default_factory=list)
    validation: dict | None = None
    notes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    shapes: list = field(default_factory=list)   # ShapeResult of shapes inferred on their own
    wall_s: float | None = None

    def __post_init__(self):
        check_choice("kind", self.kind, DEVICE_KINDS)
        self.status = DeviceStatus(self.status)
        if self.status is DeviceStatus.ERROR and not self.error:
            raise ValueError(f"DeviceResult {self.name!r}: status 'error' needs an error message")

    @classmethod
    def decided(cls, ident: tuple, decision: Decision, *, error: str | None = None,
                notes=(), **evidence) -> "DeviceResult":
        """``ident`` = (name, backend, kind, hardware_run); the decision's error wins over
        ``error`` (e.g. the inference's), its notes follow ``notes``."""
        return cls(*ident, status=decision.status, error=decision.error or error,
                   notes=list(notes) + list(decision.notes), **evidence)
