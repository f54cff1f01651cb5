"""The versioned report schema ("fp4ref.report", version 1): build, validate, load, write.

Documented in docs/report-schema.md.  Validation is hand-written: every problem is
reported with its JSON path (``$.devices[2].validation.matches``).  Every write goes
through ``write_json_atomic`` (temp file in the same directory, fsync, os.replace).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

from reference.formats import FORMATS

from .bits import HEX_RE, decode_str, to_hex, ulp_distance

__all__ = [
    "SCHEMA", "SCHEMA_VERSION", "CONFORMANCE_SCHEMA", "CONFORMANCE_SCHEMA_VERSION",
    "DEVICE_KINDS", "DEVICE_STATUSES", "CELL_STATUSES", "TEST_OUTCOMES", "MODEL_PARAMETERS",
    "ReportError", "SchemaVersionError",
    "validate_report", "validate_conformance", "check_report", "normalize_report",
    "load_json", "load_report", "load_conformance", "write_json_atomic", "write_text_atomic",
    "write_report", "jsonable",
    "new_report", "new_device", "probe_record", "scan_record", "mismatch_record",
    "ValidationRecorder", "validation_record", "collect_environment", "utc_now", "baseline_key",
    "cpu_identity",
    "run_dir", "machine_slug", "find_reports", "newest_report",
]

SCHEMA = "fp4ref.report"
SCHEMA_VERSION = 1
CONFORMANCE_SCHEMA = "fp4ref.conformance"
CONFORMANCE_SCHEMA_VERSION = 1

DEVICE_KINDS = ("virtual", "cpu", "cuda", "blackwell-only")
DEVICE_STATUSES = ("fit", "partial", "no_fit", "nondeterministic", "error", "skipped")
CELL_STATUSES = ("agree", "disagree", "skipped")
TEST_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
NONFINITE_BUCKET = "nonfinite"  # ulp_histogram key for mismatches involving NaN

# Known keys of device["model"] (reference.gemm.GemmModel.to_dict()); others are allowed.
MODEL_PARAMETERS = {
    "name": "named model (e.g. probe_matched) or 'custom'",
    "product_format": "null: products exact; else the format products are rounded to",
    "fma_width": "F: products added together with the accumulator in one fused step",
    "align_bits": "null: fused step exact; else fraction bits kept when aligning to the largest exponent",
    "align_mode": "rounding of the alignment shift (RTZ = truncation)",
    "acc_frac_bits": "fraction bits of the accumulator after normalization (23 = FP32)",
    "norm_mode": "rounding of the normalization after each fused step",
    "acc_subnormal": "accumulator subnormals: KEEP or FLUSH",
    "group_size": "products per group/promotion interval before adding into the FP32 accumulator",
    "outer_mode": "rounding of the cross-group (promotion) additions",
    "scale_point": "where block scales apply: PRODUCT or GROUP",
    "lattice": "null or L: results snapped to multiples of L with RNE (e.g. '1/1024')",
    "split_k": "K split into this many slices, summed in FP32 RNE",
    "alpha_mode": "how per-tensor/row scales meet the accumulator",
    "output": "output format",
    "output_mode": "rounding to the output format",
}

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


# --- tiny validation combinators ------------------------------------------------------
Check = Callable[[Any, str, list], None]


def _tname(v) -> str:
    return "null" if v is None else type(v).__name__


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _want(what: str) -> Check:
    def fail(v, p, errs):
        errs.append(f"{p}: expected {what}, got {_tname(v)} {_short(v)}")
    return fail


def _str(v, p, errs):
    if not isinstance(v, str):
        _want("a string")(v, p, errs)


def _nonempty_str(v, p, errs):
    if not isinstance(v, str) or not v.strip():
        _want("a non-empty string")(v, p, errs)


def _bool(v, p, errs):
    if not isinstance(v, bool):
        _want("true or false")(v, p, errs)


def _int(minimum: int | None = None) -> Check:
    def check(v, p, errs):
        if not isinstance(v, int) or isinstance(v, bool):
            _want("an integer")(v, p, errs)
        elif minimum is not None and v < minimum:
            errs.append(f"{p}: must be >= {minimum}, got {v}")
    return check


def _num(minimum: float | None = None, maximum: float | None = None) -> Check:
    def check(v, p, errs):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            _want("a finite number")(v, p, errs)
        elif (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            errs.append(f"{p}: must be in [{minimum}, {maximum}], got {v}")
    return check


def _enum(*choices: str) -> Check:
    def check(v, p, errs):
        if v not in choices or not isinstance(v, str):
            errs.append(f"{p}: unknown value {_short(v)}; valid choices: {', '.join(choices)}")
    return check


def _nullable(c: Check) -> Check:
    def check(v, p, errs):
        if v is not None:
            c(v, p, errs)
    return check


def _list(c: Check) -> Check:
    def check(v, p, errs):
        if not isinstance(v, list):
            _want("a list")(v, p, errs)
            return
        for i, item in enumerate(v):
            c(item, f"{p}[{i}]", errs)
    return check


def _map(c: Check) -> Check:
    def check(v, p, errs):
        if not isinstance(v, dict):
            _want("an object")(v, p, errs)
            return
        for k, item in v.items():
            c(item, f"{p}[{k!r}]", errs)
    return check


def _json(v, p, errs):
    """Any JSON value (finite numbers only)."""
    if v is None or isinstance(v, (str, bool)):
        return
    if isinstance(v, (int, float)):
        _num()(v, p, errs)
    elif isinstance(v, list):
        for i, item in enumerate(v):
            _json(item, f"{p}[{i}]", errs)
    elif isinstance(v, dict):
        for k, item in v.items():
            if not isinstance(k, str):
                errs.append(f"{p}: object keys must be strings, got {_short(k)}")
            _json(item, f"{p}[{k!r}]", errs)
    else:
        _want("a JSON value")(v, p, errs)


def _scalar(v, p, errs):
    if v is not None and not isinstance(v, (str, bool, int, float)):
        _want("a string, number, boolean or null")(v, p, errs)
    elif isinstance(v, float):
        _num()(v, p, errs)


def _obj(required: dict[str, Check], optional: dict[str, Check] | None = None,
         extra_ok: bool = False, then: Callable[[dict, str, list], None] | None = None) -> Check:
    optional = optional or {}

    def check(v, p, errs):
        if not isinstance(v, dict):
            _want("an object")(v, p, errs)
            return
        for k, c in required.items():
            if k not in v:
                errs.append(f"{p}.{k}: required field is missing")
            else:
                c(v[k], f"{p}.{k}", errs)
        for k, c in optional.items():
            if k in v:
                c(v[k], f"{p}.{k}", errs)
        if not extra_ok:
            for k in v:
                if k not in required and k not in optional:
                    errs.append(f"{p}.{k}: unknown field; valid fields: "
                                + ", ".join(list(required) + list(optional)))
        if then is not None:
            then(v, p, errs)
    return check


def _format_name(v, p, errs):
    if not isinstance(v, str) or v not in FORMATS:
        errs.append(f"{p}: unknown format {_short(v)}; valid choices: {', '.join(FORMATS)}")


def _hex(v, p, errs):
    if not isinstance(v, str) or not HEX_RE.match(v):
        _want("a hex string like '0x3f80'")(v, p, errs)


def _created(v, p, errs):
    if not isinstance(v, str):
        _want("an ISO 8601 UTC timestamp string")(v, p, errs)
        return
    try:
        t = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        errs.append(f"{p}: {_short(v)} is not an ISO 8601 timestamp (e.g. 2026-11-30T02:50:00Z)")
        return
    if t.utcoffset() != _dt.timedelta(0):
        errs.append(f"{p}: {_short(v)} must be in UTC (end with Z or +00:00)")


# --- semantic checks -------------------------------------------------------------------
def _shape(v, p, errs):
    if not isinstance(v, list) or len(v) != 3:
        _want("[M, N, K]")(v, p, errs)
        return
    for i, x in enumerate(v):
        _int(1)(x, f"{p}[{i}]", errs)


def _mismatch_then(m, p, errs):
    fmt = m.get("format")
    if fmt not in FORMATS:
        return
    spec = FORMATS[fmt]
    for key in ("expected_bits", "got_bits"):
        b = m.get(key)
        if isinstance(b, str) and HEX_RE.match(b) and int(b, 16) >= spec.ncodes:
            errs.append(f"{p}.{key}: {b} does not fit {fmt} ({spec.nbits}-bit codes)")


_MISMATCH = _obj(
    {"index": lambda v, p, e: (_int(0)(v, p, e) if not isinstance(v, list) else _list(_int(0))(v, p, e)),
     "shape": _shape, "expected_bits": _hex, "got_bits": _hex, "format": _format_name,
     "expected": _scalar, "got": _scalar, "ulp": _nullable(_int(0))},
    {"note": _str}, then=_mismatch_then)


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
        _want("an object {ulp: count}")(v, p, errs)
        return
    for k, c in v.items():
        if not (k == NONFINITE_BUCKET or (k.isdigit() and k == str(int(k)))):
            errs.append(f"{p}: key {k!r} must be a non-negative integer ULP distance "
                        f"or {NONFINITE_BUCKET!r}")
        _int(1)(c, f"{p}[{k!r}]", errs)


_VALIDATION = _obj(
    {"outputs": _int(1), "matches": _int(0), "agreement_pct": _num(0, 100),
     "shapes": _list(_shape), "mismatches": _list(_MISMATCH), "ulp_histogram": _histogram},
    {"seed": _nullable(_int(0)), "note": _str,
     "errors": _list(_obj({"shape": _shape, "error": _nonempty_str}))},
    then=_validation_then)


def _probe_then(v, p, errs):
    b, a = v.get("candidates_before"), v.get("candidates_after")
    if isinstance(a, int) and isinstance(b, int) and a > b:
        errs.append(f"{p}.candidates_after: {a} exceeds candidates_before {b}")


_VALUE = lambda v, p, e: _json(v, p, e)  # noqa: E731  (hex string, number, list, ...)

_PROBE = _obj(
    {"name": _nonempty_str, "parameter": _str, "description": _str, "operands": _map(_json),
     "predictions": _map(_VALUE), "observed": _VALUE,
     "candidates_before": _int(0), "candidates_after": _int(0)},
    {"format": _format_name, "consistent": _list(_str), "note": _str},
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


_SCAN = _obj(
    {"name": _nonempty_str, "x": _list(_num()), "y": _list(_nullable(_num())),
     "xlabel": _str, "ylabel": _str},
    {"kind": _enum("line", "scatter", "bar"), "xscale": _enum("linear", "log"),
     "yscale": _enum("linear", "log"),
     "description": _str},
    then=_scan_then)


def _device_then(d, p, errs):
    st = d.get("status")
    if st == "error" and not (isinstance(d.get("error"), str) and d["error"].strip()):
        errs.append(f"{p}.error: status is 'error' so error must say what went wrong")
    if st in ("fit", "partial") and d.get("model") is None:
        errs.append(f"{p}.model: status is '{st}' so the inferred model is required")
    if d.get("kind") == "virtual" and d.get("hardware_run") is True:
        errs.append(f"{p}.hardware_run: a 'virtual' device cannot have run on hardware")


_DEVICE = _obj(
    {"name": _nonempty_str, "backend": _str, "kind": _enum(*DEVICE_KINDS),
     "hardware_run": _bool, "status": _enum(*DEVICE_STATUSES)},
    {"capabilities": _map(_json), "error": _nullable(_str),
     "model": _nullable(_map(_json)), "model_summary": _str,
     "probes": _list(_PROBE), "scans": _list(_SCAN), "validation": _nullable(_VALIDATION),
     "wall_s": _nullable(_num(0)), "notes": _list(_str), "extra": _map(_json)},
    then=_device_then)

_ENVIRONMENT = _obj(
    {"platform": _str, "python": _str, "torch": _nullable(_str), "cuda": _nullable(_str),
     "driver": _nullable(_str), "gpu": _nullable(_str), "libraries": _map(_nullable(_str))},
    {"host": _nullable(_str), "cpu": _nullable(_str), "extra": _map(_json)})

_CELL = _obj(
    {"implementation": _nonempty_str, "profile": _nonempty_str, "status": _enum(*CELL_STATUSES),
     "cases": _int(0), "agree": _int(0), "reason": _nullable(_str),
     "counterexample": _nullable(_map(_json))},
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
        _want("an object")(v, p, errs)
        return
    if v.get("schema") != CONFORMANCE_SCHEMA:
        errs.append(f"{p}.schema: expected {CONFORMANCE_SCHEMA!r}, got {_short(v.get('schema'))}")
        return
    ver = v.get("schema_version")
    if ver != CONFORMANCE_SCHEMA_VERSION:
        errs.append(f"{p}.schema_version: conformance schema version {_short(ver)} is not supported; "
                    f"this fp4ref reads version {CONFORMANCE_SCHEMA_VERSION}")
        return
    _obj({"schema": _str, "schema_version": _int(), "cells": _list(_CELL)}, extra_ok=True,
         then=_cells_then)(v, p, errs)


_TEST = _obj({"nodeid": _nonempty_str, "outcome": _enum(*TEST_OUTCOMES)},
             {"name": _str, "duration_s": _nullable(_num(0)), "message": _nullable(_str)})
_MODULE = _obj({"module": _nonempty_str, "tests": _list(_TEST)}, {"summary": _map(_int(0))})
_TESTS = _obj({"modules": _list(_MODULE)},
              {"summary": _map(_int(0)), "exitstatus": _nullable(_int()),
               "duration_s": _nullable(_num(0)), "args": _list(_str)})


def _report_then(r, p, errs):
    seen = {}
    for i, d in enumerate(r.get("devices") or []):
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            if d["name"] in seen:
                errs.append(f"{p}.devices[{i}].name: duplicate device name {d['name']!r} "
                            f"(first at devices[{seen[d['name']]}])")
            seen.setdefault(d["name"], i)


_REPORT = _obj(
    {"schema": _str, "schema_version": _int(), "created": _created, "fp4ref_version": _str,
     "environment": _ENVIRONMENT, "devices": _list(_DEVICE),
     "conformance": _nullable(_conformance)},
    {"title": _str, "command": _nullable(_str), "notes": _list(_str),
     "tests": _nullable(_TESTS), "extra": _map(_json)},
    then=_report_then)


def _check_header(obj, where: str) -> None:
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: not an fp4ref report: the top level is {_tname(obj)}, "
                          "expected an object")
    schema = obj.get("schema")
    if schema != SCHEMA:
        hint = " (this is a conformance matrix: pass it as the report's 'conformance')" \
            if schema == CONFORMANCE_SCHEMA else ""
        raise ReportError(f"{where}: not an fp4ref report: $.schema is {_short(schema)}, "
                          f"expected {SCHEMA!r}{hint}")
    ver = obj.get("schema_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise ReportError(f"{where}: $.schema_version must be an integer, got {_short(ver)}")
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


def _umask_mode() -> int:
    """The mode open() would give a new file (0644 under the usual umask 022); mkstemp's
    temp files are 0600, which the rename would otherwise keep."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_json_atomic(path: "str | os.PathLike", obj: Any) -> Path:
    """Write JSON so readers see the old file or the whole new one, never a partial one.

    Serializes first (a bad object leaves nothing behind), writes a temp file in the
    target directory, fsyncs it, then os.replace()s it over ``path``.
    """
    p = Path(path)
    data = (json.dumps(obj, indent=1, sort_keys=False, allow_nan=False, ensure_ascii=False)
            + "\n").encode("utf-8")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), _umask_mode())
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename durable too
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return p


def write_text_atomic(path: "str | os.PathLike", text: str) -> Path:
    """Same protocol as write_json_atomic, for HTML."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fchmod(f.fileno(), _umask_mode())
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p


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
    raise TypeError(f"report value of type {type(obj).__name__} ({_short(obj)}) is not JSON; "
                    "convert it to str, int, float, bool, list or dict")


def write_report(report: dict, path: "str | os.PathLike", *, html: bool = True) -> Path:
    """Validate, then write report.json atomically (and report.html next to it when html=True).

    numpy / Fraction / Enum values are converted first (``jsonable``)."""
    report = check_report(jsonable(report), str(path))
    p = write_json_atomic(path, report)
    if html:
        from .html import write_html
        write_html(report, p.with_suffix(".html"))
    return p


# --- builders for writers (probes, conformance, pytest plugin) ---------------------------
def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(libraries: Iterable[str] = ("numpy", "triton", "ml_dtypes", "torchao",
                                                     "transformer_engine", "jinja2")) -> dict:
    """Versions without importing heavy modules; CUDA details only if torch is already imported."""
    env = {"platform": platform.platform(), "python": platform.python_version(),
           "torch": _version("torch"), "cuda": None, "driver": None, "gpu": None,
           "libraries": {}, "host": platform.node() or None, "cpu": platform.machine() or None}
    for lib in libraries:
        env["libraries"][lib] = _version(lib) or _version(lib.replace("_", "-"))
    env["extra"] = cpu_identity()
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = getattr(torch, "__version__", env["torch"])
        env["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            if torch.cuda.is_available():
                env["gpu"] = torch.cuda.get_device_name(0)
        except Exception:
            pass
    if env["gpu"] and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return env


_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
              "asimd", "sve", "sve2", "bf16", "i8mm")


def cpu_identity() -> dict:
    """The CPU model and the ISA extensions that decide which kernels a host BLAS runs
    (a CPU baseline is keyed by these and the torch version)."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip().lower()
                if k in ("model name", "cpu model") and not model:
                    model = v.strip()
                elif k in ("flags", "features") and not flags:
                    flags = set(v.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or None,
            "cpu_isa": sorted(f for f in _ISA_FLAGS if f in flags)}


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
    from reference.errors import check_choice
    check_choice("kind", kind, DEVICE_KINDS)
    check_choice("status", status, DEVICE_STATUSES)
    return {"name": name, "backend": backend, "kind": kind, "capabilities": capabilities or {},
            "hardware_run": bool(hardware_run), "status": status, "error": None, "model": None,
            "model_summary": "", "probes": [], "scans": [], "validation": None,
            "wall_s": None, "notes": []}


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


def mismatch_record(index, shape, fmt: str, expected_code: int, got_code: int) -> dict:
    """A mismatch row from two codes: hex bits, decoded values and ULP distance (reference.formats)."""
    return {"index": list(index) if isinstance(index, (tuple, list)) else int(index),
            "shape": [int(s) for s in shape], "format": fmt,
            "expected_bits": to_hex(int(expected_code), fmt), "got_bits": to_hex(int(got_code), fmt),
            "expected": decode_str(int(expected_code), fmt), "got": decode_str(int(got_code), fmt),
            "ulp": ulp_distance(int(expected_code), int(got_code), fmt)}


def _is_nan_code(code: int, spec) -> bool:
    from reference.formats import CodeClass
    return spec.classify(code) is CodeClass.NAN


class ValidationRecorder:
    """Accumulates bit-exact comparisons of one output format into a validation record.

    ``add(shape, expected_codes, got_codes)`` takes flat or nested int sequences or
    integer numpy arrays of codes (e.g. ``t.view(torch.int32)`` for float32).  Two NaN codes
    count as a match (NaN is compared by isnan); everything else by its bits (-0 != +0).
    Keeps the first ``keep`` mismatches as table rows; the ULP histogram counts all.
    """

    def __init__(self, fmt: str, keep: int = 50):
        from reference.formats import get_format
        self.spec = get_format(fmt)
        self.fmt = self.spec.name
        self.keep = keep
        self.outputs = 0
        self.matches = 0
        self.shapes: list[list[int]] = []
        self.mismatches: list[dict] = []
        self.hist: dict[str, int] = {}

    def add(self, shape, expected_codes, got_codes) -> int:
        """Compare one GEMM's outputs; returns the number of mismatches."""
        import numpy as np
        e = np.asarray(expected_codes).astype(np.int64).ravel()
        g = np.asarray(got_codes).astype(np.int64).ravel()
        if e.shape != g.shape:
            raise ValueError(f"got_codes: {g.size} codes but expected_codes has {e.size}")
        mask = (1 << self.spec.nbits) - 1
        e &= mask  # signed views (int32 of float32) -> unsigned codes
        g &= mask
        bad = np.nonzero(e != g)[0]
        nbad = 0
        for i in bad.tolist():
            ce, cg = int(e[i]), int(g[i])
            if _is_nan_code(ce, self.spec) and _is_nan_code(cg, self.spec):
                continue
            nbad += 1
            u = ulp_distance(ce, cg, self.spec)
            key = NONFINITE_BUCKET if u is None else str(u)
            self.hist[key] = self.hist.get(key, 0) + 1
            if len(self.mismatches) < self.keep:
                idx = np.unravel_index(i, np.asarray(expected_codes).shape)
                self.mismatches.append(mismatch_record([int(j) for j in idx], shape, self.fmt, ce, cg))
        self.outputs += int(e.size)
        self.matches += int(e.size) - nbad
        self.shapes.append([int(s) for s in shape])
        return nbad

    def to_dict(self) -> dict:
        if self.outputs == 0:
            raise ValueError("ValidationRecorder: no outputs were added; set validation to None instead")
        return validation_record(self.outputs, self.matches, self.shapes, self.mismatches, self.hist)


def validation_record(outputs: int, matches: int, shapes, mismatches, ulp_histogram) -> dict:
    def sort_key(k):
        return (1, 0) if k == NONFINITE_BUCKET else (0, int(k))
    return {"outputs": int(outputs), "matches": int(matches),
            "agreement_pct": 100.0 * matches / outputs, "shapes": [list(s) for s in shapes],
            "mismatches": list(mismatches),
            "ulp_histogram": {k: ulp_histogram[k] for k in sorted(ulp_histogram, key=sort_key)}}


# --- where reports live -------------------------------------------------------------------
def machine_slug(environment: dict | None = None) -> str:
    """'nvidia-h200' from the GPU name, else 'cpu-x86_64': the <device> level of reports/<device>/<stamp>/."""
    import re
    env = environment if environment is not None else collect_environment()
    name = env.get("gpu") or f"cpu-{env.get('cpu') or 'unknown'}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def baseline_key(environment: dict | None = None) -> str:
    """The name a gate baseline of this machine goes by: the GPU and driver, or for a CPU-only
    machine the CPU model and the ISA extensions that pick its BLAS kernels; then torch.
    E.g. 'cpu-x86-64-intel-r-xeon-r-processor-amx-bf16-avx512f-torch2.13.0'."""
    import re
    env = environment if environment is not None else collect_environment()
    x = env.get("extra") or {}
    if env.get("gpu"):
        parts = [env["gpu"], env.get("driver") or "driver-unknown"]
    else:
        isa = [f for f in x.get("cpu_isa") or [] if f in ("avx512f", "amx_bf16", "avx512_bf16", "sve", "bf16")]
        parts = [f"cpu-{env.get('cpu') or 'unknown'}", x.get("cpu_model") or "", *isa]
    parts.append(f"torch{env.get('torch') or 'none'}")
    return re.sub(r"[^a-z0-9.]+", "-", " ".join(p for p in parts if p).lower()).strip("-")


def run_dir(root: "str | os.PathLike" = "reports", group: str | None = None,
            environment: dict | None = None, created: str | None = None) -> Path:
    """reports/<group>/<UTC stamp>/ (group: machine_slug() by default); a fresh directory name
    that the reports/*/*/report.json lookup of `fp4ref report` and `fp4ref gate` finds.
    ``created``: the report's start time (utc_now() form), so the folder is named by when
    the run started, as its 'created' field says; default now."""
    group = group or machine_slug(environment)
    stamp = (created.replace("-", "").replace(":", "") if created
             else _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    p = Path(root) / group / stamp
    n = 1
    while p.exists():
        n += 1
        p = Path(root) / group / f"{stamp}-{n}"
    return p


def find_reports(root: "str | os.PathLike" = "reports") -> list[Path]:
    """reports/*/*/report.json, oldest first (by modification time, then path)."""
    files = [p for p in Path(root).glob("*/*/report.json") if p.is_file()]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def newest_report(root: "str | os.PathLike" = "reports", exclude: Iterable = ()) -> Path:
    ex = {Path(e).resolve() for e in exclude}
    files = [p for p in find_reports(root) if p.resolve() not in ex]
    if not files:
        raise ReportError(f"no report found: nothing matches {Path(root) / '*' / '*' / 'report.json'}; "
                          "run `make probe` or pass --input/--current")
    return files[-1]
