"""Validation combinators for JSON documents: each check appends "<JSON path>: <problem>"
to a list, so a validator reports every problem at once with where it is
(``$.devices[2].validation.matches``).  The report schema (reports.schema) and the fleet
schema (reports.fleet) are written with these.
"""
from __future__ import annotations

import datetime as _dt
import math
from typing import Any, Callable

from reference.bits import HEX_RE
from reference.formats import FORMATS

__all__ = ["Check", "type_name", "brief", "want", "string", "nonempty_string", "boolean", "integer",
           "number", "one_of", "nullable", "list_of", "map_of", "any_json", "scalar", "obj",
           "format_name", "hex_code", "timestamp", "shape"]

Check = Callable[[Any, str, list], None]


def type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def brief(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def want(what: str) -> Check:
    def fail(v, p, errs):
        errs.append(f"{p}: expected {what}, got {type_name(v)} {brief(v)}")
    return fail


def string(v, p, errs):
    if not isinstance(v, str):
        want("a string")(v, p, errs)


def nonempty_string(v, p, errs):
    if not isinstance(v, str) or not v.strip():
        want("a non-empty string")(v, p, errs)


def boolean(v, p, errs):
    if not isinstance(v, bool):
        want("true or false")(v, p, errs)


def integer(minimum: int | None = None) -> Check:
    def check(v, p, errs):
        if not isinstance(v, int) or isinstance(v, bool):
            want("an integer")(v, p, errs)
        elif minimum is not None and v < minimum:
            errs.append(f"{p}: must be >= {minimum}, got {v}")
    return check


def number(minimum: float | None = None, maximum: float | None = None) -> Check:
    def check(v, p, errs):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            want("a finite number")(v, p, errs)
        elif (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            errs.append(f"{p}: must be in [{minimum}, {maximum}], got {v}")
    return check


def one_of(*choices: str) -> Check:
    def check(v, p, errs):
        if v not in choices or not isinstance(v, str):
            errs.append(f"{p}: unknown value {brief(v)}; valid choices: {', '.join(choices)}")
    return check


def nullable(c: Check) -> Check:
    def check(v, p, errs):
        if v is not None:
            c(v, p, errs)
    return check


def list_of(c: Check) -> Check:
    def check(v, p, errs):
        if not isinstance(v, list):
            want("a list")(v, p, errs)
            return
        for i, item in enumerate(v):
            c(item, f"{p}[{i}]", errs)
    return check


def map_of(c: Check) -> Check:
    def check(v, p, errs):
        if not isinstance(v, dict):
            want("an object")(v, p, errs)
            return
        for k, item in v.items():
            c(item, f"{p}[{k!r}]", errs)
    return check


def any_json(v, p, errs):
    """Any JSON value (finite numbers only)."""
    if v is None or isinstance(v, (str, bool)):
        return
    if isinstance(v, (int, float)):
        number()(v, p, errs)
    elif isinstance(v, list):
        for i, item in enumerate(v):
            any_json(item, f"{p}[{i}]", errs)
    elif isinstance(v, dict):
        for k, item in v.items():
            if not isinstance(k, str):
                errs.append(f"{p}: object keys must be strings, got {brief(k)}")
            any_json(item, f"{p}[{k!r}]", errs)
    else:
        want("a JSON value")(v, p, errs)


def scalar(v, p, errs):
    if v is not None and not isinstance(v, (str, bool, int, float)):
        want("a string, number, boolean or null")(v, p, errs)
    elif isinstance(v, float):
        number()(v, p, errs)


def obj(required: dict[str, Check], optional: dict[str, Check] | None = None,
         extra_ok: bool = False, then: Callable[[dict, str, list], None] | None = None) -> Check:
    optional = optional or {}

    def check(v, p, errs):
        if not isinstance(v, dict):
            want("an object")(v, p, errs)
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


def format_name(v, p, errs):
    if not isinstance(v, str) or v not in FORMATS:
        errs.append(f"{p}: unknown format {brief(v)}; valid choices: {', '.join(FORMATS)}")


def hex_code(v, p, errs):
    if not isinstance(v, str) or not HEX_RE.match(v):
        want("a hex string like '0x3f80'")(v, p, errs)


def timestamp(v, p, errs):
    if not isinstance(v, str):
        want("an ISO 8601 UTC timestamp string")(v, p, errs)
        return
    try:
        t = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        errs.append(f"{p}: {brief(v)} is not an ISO 8601 timestamp (e.g. 2026-11-30T02:50:00Z)")
        return
    if t.utcoffset() != _dt.timedelta(0):
        errs.append(f"{p}: {brief(v)} must be in UTC (end with Z or +00:00)")


def shape(v, p, errs):
    """[M, N, K] of positive integers."""
    if not isinstance(v, list) or len(v) != 3:
        want("[M, N, K]")(v, p, errs)
        return
    for i, x in enumerate(v):
        integer(1)(x, f"{p}[{i}]", errs)
