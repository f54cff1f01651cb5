"""The versioned report schema ("fp4ref.report", version 1): validate, migrate, load.

Documented in docs/report-schema.md.  Validation is hand-written (reports.checks): every
problem is reported with its JSON path (``$.devices[2].validation.matches``).  Building
reports is reports.records, where they live reports.store, the environment
reports.environment.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from probes.device import DEVICE_KINDS
from probes.recorder import NONFINITE_BUCKET
from probes.result import DEVICE_STATUSES
from reference.bits import HEX_RE
from reference.formats import FORMATS
from reference.notation import PARAMETERS as MODEL_PARAMETERS

from . import checks as C

__all__ = [
    "SCHEMA", "SCHEMA_VERSION", "CONFORMANCE_SCHEMA", "CONFORMANCE_SCHEMA_VERSION",
    "DEVICE_KINDS", "DEVICE_STATUSES", "CELL_STATUSES", "TEST_OUTCOMES", "MODEL_PARAMETERS",
    "NONFINITE_BUCKET", "ReportError", "SchemaVersionError",
    "validate_report", "validate_conformance", "check_report", "normalize_report",
    "load_json", "load_report", "load_conformance", "jsonable",
]

SCHEMA = "fp4ref.report"
SCHEMA_VERSION = 1
CONFORMANCE_SCHEMA = "fp4ref.conformance"
CONFORMANCE_SCHEMA_VERSION = 1

CELL_STATUSES = ("agree", "disagree", "skipped")
TEST_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
# device["model"]: MODEL_PARAMETERS (reference.notation.PARAMETERS) are its known keys; others are allowed.

_MIGRATIONS: dict[int, Callable[[dict], dict]] = {}  # old version -> upgrade to version + 1


class ReportError(ValueError):
    """An unreadable or invalid report; ``problems`` lists each one with its JSON path."""

    def __init__(self, message: str, problems: Iterable[str] = ()):
        self.problems = list(problems)
        if self.problems:
            shown = self.problems[:40]
            more = len(self.problems) - len(shown)
            message += "\n" + "\n".join(f"  - {p}" for p in shown)
            if more:
                message += f"\n  ... and {more} more"
        super().__init__(message)


class SchemaVersionError(ReportError):
    """The file is a report of another schema version."""


# --- the rules --------------------------------------------------------------------------
def _mismatch_then(m, p, errs):
    fmt = m.get("format")
    if fmt not in FORMATS:
        return
    spec = FORMATS[fmt]
    for key in ("expected_bits", "got_bits"):
        b = m.get(key)
        if isinstance(b, str) and HEX_RE.match(b) and int(b, 16) >= spec.ncodes:
            errs.append(f"{p}.{key}: {b} does not fit {fmt} ({spec.nbits}-bit codes)")


_MISMATCH = C.obj(
    {"index": lambda v, p, e: (C.integer(0)(v, p, e) if not isinstance(v, list) else C.list_of(C.integer(0))(v, p, e)),
     "shape": C.shape, "expected_bits": C.hex_code, "got_bits": C.hex_code, "format": C.format_name,
     "expected": C.scalar, "got": C.scalar, "ulp": C.nullable(C.integer(0))},
    {"note": C.string}, then=_mismatch_then)


def _validation_then(v, p, errs):
    o, m, pct = v.get("outputs"), v.get("matches"), v.get("agreement_pct")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (o, m)):
        return
    if m > o:
        errs.append(f"{p}.matches: {m} exceeds outputs {o}")
        return
    if isinstance(pct, (int, float)) and not isinstance(pct, bool) and o > 0:
        want = 100.0 * m / o
        if abs(pct - want) > 1e-6:
            errs.append(f"{p}.agreement_pct: {pct} disagrees with 100*matches/outputs = {want}")
    mism = v.get("mismatches")
    if isinstance(mism, list) and len(mism) > o - m:
        errs.append(f"{p}.mismatches: {len(mism)} rows but only {o - m} outputs mismatched")
    hist = v.get("ulp_histogram")
    if isinstance(hist, dict) and all(isinstance(c, int) for c in hist.values()):
        total = sum(hist.values())
        if total != o - m:
            errs.append(f"{p}.ulp_histogram: counts sum to {total}, expected outputs - matches = {o - m}")


def _histogram(v, p, errs):
    if not isinstance(v, dict):
        C.want("an object {ulp: count}")(v, p, errs)
        return
    for k, c in v.items():
        if not (k == NONFINITE_BUCKET or (k.isdigit() and k == str(int(k)))):
            errs.append(f"{p}: key {k!r} must be a non-negative integer ULP distance "
                        f"or {NONFINITE_BUCKET!r}")
        C.integer(1)(c, f"{p}[{k!r}]", errs)


_VALIDATION = C.obj(
    {"outputs": C.integer(1), "matches": C.integer(0), "agreement_pct": C.number(0, 100),
     "shapes": C.list_of(C.shape), "mismatches": C.list_of(_MISMATCH), "ulp_histogram": _histogram},
    {"seed": C.nullable(C.integer(0)), "note": C.string,
     "errors": C.list_of(C.obj({"shape": C.shape, "error": C.nonempty_string}))},
    then=_validation_then)


def _probe_then(v, p, errs):
    b, a = v.get("candidates_before"), v.get("candidates_after")
    if isinstance(a, int) and isinstance(b, int) and a > b:
        errs.append(f"{p}.candidates_after: {a} exceeds candidates_before {b}")


_VALUE = lambda v, p, e: C.any_json(v, p, e)  # noqa: E731  (hex string, number, list, ...)

_PROBE = C.obj(
    {"name": C.nonempty_string, "parameter": C.string, "description": C.string, "operands": C.map_of(C.any_json),
     "predictions": C.map_of(_VALUE), "observed": _VALUE,
     "candidates_before": C.integer(0), "candidates_after": C.integer(0)},
    {"format": C.format_name, "consistent": C.list_of(C.string), "note": C.string},
    then=_probe_then)


def _scan_then(v, p, errs):
    x, y = v.get("x"), v.get("y")
    if isinstance(x, list) and isinstance(y, list) and len(x) != len(y):
        errs.append(f"{p}: x has {len(x)} points but y has {len(y)}")
    if v.get("xscale") == "log" and isinstance(x, list):
        for i, xi in enumerate(x):
            if isinstance(xi, (int, float)) and not isinstance(xi, bool) and xi <= 0:
                errs.append(f"{p}.x[{i}]: {xi} cannot be drawn on a log scale (must be > 0)")
    if v.get("yscale") == "log" and isinstance(y, list):
        for i, yi in enumerate(y):
            if isinstance(yi, (int, float)) and not isinstance(yi, bool) and yi <= 0:
                errs.append(f"{p}.y[{i}]: {yi} cannot be drawn on a log scale (must be > 0 or null)")


_SCAN = C.obj(
    {"name": C.nonempty_string, "x": C.list_of(C.number()), "y": C.list_of(C.nullable(C.number())),
     "xlabel": C.string, "ylabel": C.string},
    {"kind": C.one_of("line", "scatter", "bar"), "xscale": C.one_of("linear", "log"),
     "yscale": C.one_of("linear", "log"),
     "description": C.string},
    then=_scan_then)


def _random_shapes_then(rs, p, errs):
    """Counts that cannot contradict each other (extra.random_shapes, issue 13)."""
    get = lambda k: rs.get(k) if isinstance(rs.get(k), int) else None  # noqa: E731
    for small, big in (("refused", "tried"), ("validated", "tried"), ("bit_exact_shapes", "validated"),
                       ("bit_exact_outputs", "outputs")):
        if get(small) is not None and get(big) is not None and get(small) > get(big):
            errs.append(f"{p}.{small}: {get(small)} exceeds {big} {get(big)}")
    for i, r in enumerate(rs.get("shapes") or []):
        if isinstance(r, dict) and isinstance(r.get("matches"), int) and isinstance(r.get("outputs"), int) \
                and r["matches"] > r["outputs"]:
            errs.append(f"{p}.shapes[{i}].matches: {r['matches']} exceeds outputs {r['outputs']}")


_RANDOM_SHAPE_ROW = C.obj({"shape": C.shape, "outputs": C.integer(0), "matches": C.integer(0)},
                          {"kernels": C.list_of(C.string), "family": C.string, "model": C.string,
                           "source": C.string, "error": C.nullable(C.string),
                           "first_mismatch": C.nullable(C.map_of(C.any_json))}, extra_ok=True)
_RANDOM_SHAPES = C.obj(
    {k: C.integer(0) for k in ("tried", "refused", "validated", "bit_exact_shapes", "outputs",
                               "bit_exact_outputs")},
    {"stopped": C.nullable(C.string), "refusal": C.nullable(C.string), "shapes": C.list_of(_RANDOM_SHAPE_ROW),
     "worst": C.list_of(C.map_of(C.any_json))}, extra_ok=True, then=_random_shapes_then)


def _device_then(d, p, errs):
    extra = d.get("extra")
    if isinstance(extra, dict) and "random_shapes" in extra:  # optional: reports before issue 13 lack it
        _RANDOM_SHAPES(extra["random_shapes"], f"{p}.extra.random_shapes", errs)
    st = d.get("status")
    if st == "error" and not (isinstance(d.get("error"), str) and d["error"].strip()):
        errs.append(f"{p}.error: status is 'error' so error must say what went wrong")
    if st in ("fit", "partial") and d.get("model") is None:
        errs.append(f"{p}.model: status is '{st}' so the inferred model is required")
    if d.get("kind") == "virtual" and d.get("hardware_run") is True:
        errs.append(f"{p}.hardware_run: a 'virtual' device cannot have run on hardware")


_DEVICE = C.obj(
    {"name": C.nonempty_string, "backend": C.string, "kind": C.one_of(*DEVICE_KINDS),
     "hardware_run": C.boolean, "status": C.one_of(*DEVICE_STATUSES)},
    {"capabilities": C.map_of(C.any_json), "error": C.nullable(C.string),
     "model": C.nullable(C.map_of(C.any_json)), "model_summary": C.string,
     "probes": C.list_of(_PROBE), "scans": C.list_of(_SCAN), "validation": C.nullable(_VALIDATION),
     "wall_s": C.nullable(C.number(0)), "notes": C.list_of(C.string), "extra": C.map_of(C.any_json)},
    then=_device_then)

_ENVIRONMENT = C.obj(
    {"platform": C.string, "python": C.string, "torch": C.nullable(C.string), "cuda": C.nullable(C.string),
     "driver": C.nullable(C.string), "gpu": C.nullable(C.string), "libraries": C.map_of(C.nullable(C.string))},
    {"host": C.nullable(C.string), "cpu": C.nullable(C.string), "extra": C.map_of(C.any_json)})

_CELL = C.obj(
    {"implementation": C.nonempty_string, "profile": C.nonempty_string, "status": C.one_of(*CELL_STATUSES),
     "cases": C.integer(0), "agree": C.integer(0), "reason": C.nullable(C.string),
     "counterexample": C.nullable(C.map_of(C.any_json))},
    extra_ok=True,
    then=lambda c, p, errs: (errs.append(f"{p}.agree: {c['agree']} exceeds cases {c['cases']}")
                             if isinstance(c.get("agree"), int) and isinstance(c.get("cases"), int)
                             and c["agree"] > c["cases"] else None))


def _cells_then(conf, p, errs):
    seen = {}
    for i, c in enumerate(conf.get("cells") or []):
        if isinstance(c, dict):
            key = (c.get("implementation"), c.get("profile"))
            if key in seen:
                errs.append(f"{p}.cells[{i}]: duplicate cell {key[0]!r} x {key[1]!r} "
                            f"(first at cells[{seen[key]}])")
            seen.setdefault(key, i)


def _conformance(v, p, errs):
    if not isinstance(v, dict):
        C.want("an object")(v, p, errs)
        return
    if v.get("schema") != CONFORMANCE_SCHEMA:
        errs.append(f"{p}.schema: expected {CONFORMANCE_SCHEMA!r}, got {C.brief(v.get('schema'))}")
        return
    ver = v.get("schema_version")
    if ver != CONFORMANCE_SCHEMA_VERSION:
        errs.append(f"{p}.schema_version: conformance schema version {C.brief(ver)} is not supported; "
                    f"this fp4ref reads version {CONFORMANCE_SCHEMA_VERSION}")
        return
    C.obj({"schema": C.string, "schema_version": C.integer(), "cells": C.list_of(_CELL)}, extra_ok=True,
         then=_cells_then)(v, p, errs)


_TEST = C.obj({"nodeid": C.nonempty_string, "outcome": C.one_of(*TEST_OUTCOMES)},
             {"name": C.string, "duration_s": C.nullable(C.number(0)), "message": C.nullable(C.string)})
_MODULE = C.obj({"module": C.nonempty_string, "tests": C.list_of(_TEST)}, {"summary": C.map_of(C.integer(0))})
_TESTS = C.obj({"modules": C.list_of(_MODULE)},
              {"summary": C.map_of(C.integer(0)), "exitstatus": C.nullable(C.integer()),
               "duration_s": C.nullable(C.number(0)), "args": C.list_of(C.string)})


def _report_then(r, p, errs):
    seen = {}
    for i, d in enumerate(r.get("devices") or []):
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            if d["name"] in seen:
                errs.append(f"{p}.devices[{i}].name: duplicate device name {d['name']!r} "
                            f"(first at devices[{seen[d['name']]}])")
            seen.setdefault(d["name"], i)


_REPORT = C.obj(
    {"schema": C.string, "schema_version": C.integer(), "created": C.timestamp, "fp4ref_version": C.string,
     "environment": _ENVIRONMENT, "devices": C.list_of(_DEVICE),
     "conformance": C.nullable(_conformance)},
    {"title": C.string, "command": C.nullable(C.string), "notes": C.list_of(C.string),
     "tests": C.nullable(_TESTS), "extra": C.map_of(C.any_json)},
    then=_report_then)


def _check_header(obj, where: str) -> None:
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: not an fp4ref report: the top level is {C.type_name(obj)}, "
                          "expected an object")
    schema = obj.get("schema")
    if schema != SCHEMA:
        hint = " (this is a conformance matrix: pass it as the report's 'conformance')" \
            if schema == CONFORMANCE_SCHEMA else ""
        raise ReportError(f"{where}: not an fp4ref report: $.schema is {C.brief(schema)}, "
                          f"expected {SCHEMA!r}{hint}")
    ver = obj.get("schema_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise ReportError(f"{where}: $.schema_version must be an integer, got {C.brief(ver)}")
    if ver > SCHEMA_VERSION:
        from fp4ref import __version__
        raise SchemaVersionError(
            f"{where}: written by a newer fp4ref (report schema_version {ver}); this fp4ref "
            f"{__version__} reads schema_version {SCHEMA_VERSION}. Upgrade fp4ref to read it.")
    if ver < SCHEMA_VERSION and ver not in _MIGRATIONS:
        raise SchemaVersionError(
            f"{where}: written by an older fp4ref (report schema_version {ver}); this fp4ref reads "
            f"schema_version {SCHEMA_VERSION} and has no upgrade from {ver}. Regenerate it "
            f"(make probe) or, for a baseline, record a new one.")


def validate_report(obj) -> list[str]:
    """All problems of a report object, each prefixed with its JSON path ([] = valid)."""
    try:
        _check_header(obj, "report")
    except ReportError as e:
        return [str(e)]
    errs: list[str] = []
    _REPORT(obj, "$", errs)
    return errs


def check_report(obj, where: str = "report") -> dict:
    """Raise ReportError (with every problem listed) unless ``obj`` is a valid report."""
    _check_header(obj, where)
    obj = _migrate(obj)
    errs: list[str] = []
    _REPORT(obj, "$", errs)
    if errs:
        raise ReportError(f"{where}: invalid fp4ref report ({len(errs)} problem(s))", errs)
    return obj


def validate_conformance(obj) -> list[str]:
    errs: list[str] = []
    _conformance(obj, "$", errs)
    return errs


def _migrate(obj: dict) -> dict:
    while obj["schema_version"] < SCHEMA_VERSION:
        obj = _MIGRATIONS[obj["schema_version"]](obj)
    return obj


def normalize_report(report: dict) -> dict:
    """A copy with every optional field present (defaults filled); for renderers and the gate."""
    r = json.loads(json.dumps(report))
    r.setdefault("title", "fp4ref agreement report")
    r.setdefault("command", None)
    r.setdefault("notes", [])
    r.setdefault("tests", None)
    r.setdefault("extra", {})
    from probes.backends import canonical_name
    for d in r["devices"]:
        d["name"] = canonical_name(d["name"])   # older reports cut some names short
        for k, v in (("capabilities", {}), ("error", None), ("model", None), ("model_summary", ""),
                     ("probes", []), ("scans", []), ("validation", None), ("wall_s", None),
                     ("notes", []), ("extra", {})):
            d.setdefault(k, v)
    return r


# --- JSON I/O -------------------------------------------------------------------------
def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON (non-finite numbers are not allowed)")


def load_json(path: "str | os.PathLike") -> Any:
    """Parse a JSON file; ReportError with a clear reason for missing, empty, truncated or corrupt files."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except OSError as e:
        raise ReportError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReportError(f"{p}: corrupt: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise ReportError(f"{p}: empty file (0 bytes of JSON); was the writer interrupted?")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):
            raise ReportError(
                f"{p}: truncated JSON: the file ends (after {len(raw)} bytes) before the document "
                f"is complete ({e.msg}); was the writer interrupted?") from None
        raise ReportError(f"{p}: corrupt JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:
        raise ReportError(f"{p}: corrupt JSON: {e}") from None


def load_report(path: "str | os.PathLike") -> dict:
    """Load and validate a report (normalized: optional fields filled in)."""
    return normalize_report(check_report(load_json(path), str(path)))


def load_conformance(path: "str | os.PathLike") -> dict:
    obj = load_json(path)
    errs = validate_conformance(obj)
    if errs:
        raise ReportError(f"{path}: invalid conformance matrix ({len(errs)} problem(s))", errs)
    return obj


def jsonable(obj: Any) -> Any:
    """Plain JSON types from what writers hold: numpy scalars/arrays, Fraction (as '1/1024'),
    Enum (its name), tuples, Paths.  Non-finite floats are kept (the validator names them)."""
    import enum
    from fractions import Fraction
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return obj.name
    if isinstance(obj, Fraction):
        return str(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy scalars and arrays, torch tensors
        return jsonable(obj.tolist())
    raise TypeError(f"report value of type {type(obj).__name__} ({C.brief(obj)}) is not JSON; "
                    "convert it to str, int, float, bool, list or dict")

