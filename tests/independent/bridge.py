"""Test glue only: converts between our integer-pair values and the project's call
conventions (Python floats in, ``Exact`` out). The implementation modules never import this."""
from __future__ import annotations

import math

from .num import V, from_float, to_fraction


def to_float(v: V) -> float:
    """Exactly, for values a binary64 holds (all the test inputs here)."""
    if v.kind == "nan":
        return math.nan
    if v.kind == "inf":
        return -math.inf if v.neg else math.inf
    return math.copysign(math.ldexp(float(v.m), v.e) if v.m else 0.0, -1.0 if v.neg else 1.0)


def rows(x):
    return [[from_float(float(t)) for t in r] for r in x]


def key_mine(v: V):
    k, neg, mag = to_fraction(v)
    return (k, neg, mag)


def key_project(ex):
    """(kind, sign, Fraction) of a project ``Exact``, NaN sign ignored."""
    kind = getattr(ex.kind, "value", str(ex.kind)).lower()
    kind = {"finite": "f", "nan": "nan", "inf": "inf"}.get(kind, kind)
    if kind == "nan":
        return ("nan", None, None)
    if kind == "inf":
        return ("inf", ex.negative, None)
    return ("f", ex.negative, ex.mag)


def lists(t):
    return [list(r) for r in t]
