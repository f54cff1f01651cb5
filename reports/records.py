"""Building report JSON: the report and device objects, probe and scan evidence, the device
object of a probe's DeviceResult (``device_record``), and ``write_report``.

Models are written in the one notation of reference.notation: the JSON form (``model``),
the sentence form (``model_summary``) and the short form (``extra.short``).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from fp4ref.harness.io import write_json_atomic
from probes.device import DEVICE_KINDS
from probes.result import DEVICE_STATUSES, DeviceResult, ShapeResult
from reference.errors import check_choice
from reference.notation import sentence, short, to_dict

from .environment import collect_environment, utc_now
from .html import write_html
from .schema import SCHEMA, SCHEMA_VERSION, check_report, jsonable

__all__ = ["new_report", "new_device", "device_record", "shape_record", "probe_record", "scan_record",
           "write_report"]


def new_report(*, title: str | None = None, command: str | None = None,
               environment: dict | None = None) -> dict:
    from fp4ref import __version__
    r = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "created": utc_now(),
         "fp4ref_version": __version__,
         "environment": environment if environment is not None else collect_environment(),
         "devices": [], "conformance": None}
    if title is not None:
        r["title"] = title
    if command is not None:
        r["command"] = command
    return r


def new_device(name: str, backend: str, kind: str, *, hardware_run: bool,
               status: str = "skipped", capabilities: dict | None = None) -> dict:
    check_choice("kind", kind, DEVICE_KINDS)
    check_choice("status", status, DEVICE_STATUSES)
    return {"name": name, "backend": backend, "kind": kind, "capabilities": capabilities or {},
            "hardware_run": bool(hardware_run), "status": status, "error": None, "model": None,
            "model_summary": "", "probes": [], "scans": [], "validation": None,
            "wall_s": None, "notes": []}


def shape_record(s: ShapeResult) -> dict:
    """One entry of a device's extra.shape_models (a shape inferred on its own)."""
    ent = {"shape": list(s.shape), "status": s.status}
    if s.error is not None:
        ent["error"] = s.error
        return ent
    if s.model is not None:
        ent.update(model=to_dict(s.model), short=short(s.model))
    if s.notes is not None:
        ent["notes"] = list(s.notes)
    ent.update(probes_asked=s.probes_asked, wall_s=s.wall_s)
    return ent


def device_record(r: DeviceResult) -> dict:
    """The report's device object of a probe result."""
    d = new_device(r.name, r.backend, r.kind, hardware_run=r.hardware_run, status=r.status.value,
                   capabilities=r.capabilities)
    d.update(error=r.error, probes=list(r.probes), scans=list(r.scans), validation=r.validation,
             wall_s=r.wall_s, notes=list(r.notes))
    extra = dict(r.extra)
    if r.model is not None:
        d.update(model=to_dict(r.model), model_summary=sentence(r.model))
        extra["short"] = short(r.model)
    if r.shapes:
        extra["shape_models"] = [shape_record(s) for s in r.shapes]
    if extra:
        d["extra"] = extra
    return d


def probe_record(name: str, parameter: str, description: str, *, operands: dict,
                 predictions: dict, observed, candidates_before: int, candidates_after: int,
                 format: str | None = None) -> dict:
    """One probe's evidence; hex strings in predictions/observed are decoded with ``format``."""
    p = {"name": name, "parameter": parameter, "description": description, "operands": operands,
         "predictions": predictions, "observed": observed,
         "candidates_before": candidates_before, "candidates_after": candidates_after}
    if format is not None:
        p["format"] = format
    return p


def scan_record(name: str, x, y, *, xlabel: str, ylabel: str, kind: str = "line",
                xscale: str = "linear", yscale: str = "linear", description: str = "") -> dict:
    """Plot data; y None (or non-finite) leaves a gap."""
    s = {"name": name, "x": [float(v) if isinstance(v, float) else v for v in x],
         "y": [None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v for v in y],
         "xlabel": xlabel, "ylabel": ylabel, "kind": kind, "xscale": xscale, "yscale": yscale}
    if description:
        s["description"] = description
    return s


def write_report(report: dict, path: "str | os.PathLike", *, html: bool = True) -> Path:
    """Validate, then write report.json atomically (and report.html next to it when html=True).

    numpy / Fraction / Enum values are converted first (``jsonable``)."""
    report = check_report(jsonable(report), str(path))
    p = write_json_atomic(path, report)
    if html:
        write_html(report, p.with_suffix(".html"))
    return p
