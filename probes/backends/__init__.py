"""Device adapters and detection.

Each backend module exposes ``candidates() -> list[Spec]``; a Spec names a device and knows
how to build it (or why it is not available here).  ``detect()`` builds every spec, catching
crashes, so one broken backend never stops the others.
"""
from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from typing import Callable

__all__ = ["Spec", "Detected", "NotAvailable", "detect", "BACKEND_MODULES", "canonical_name"]

BACKEND_MODULES = ("probes.backends.cpu", "probes.backends.virtual", "probes.backends.cuda",
                   "probes.backends.triton_fp8", "probes.backends.blackwell")


# Reports written before the full names (up to 2026-12-01) cut the output dtype to four
# letters; readers of old baselines map those names to today's.
_LEGACY_SUFFIXES = {"-floa": "-float32", "-bflo": "-bfloat16"}


def canonical_name(name: str) -> str:
    """Today's name of a device named ``name`` in an older report (unchanged otherwise)."""
    for old, new in _LEGACY_SUFFIXES.items():
        if name.endswith(old) and "scaled_mm" in name:
            return name[: -len(old)] + new
    return name


class NotAvailable(Exception):
    """The device cannot run here (reason in the message), e.g. 'needs sm_100+'."""


@dataclass
class Spec:
    name: str
    backend: str
    kind: str
    build: Callable  # () -> Device, raises NotAvailable
    default: bool = True  # part of the default `make probe` set


@dataclass
class Detected:
    name: str
    backend: str
    kind: str
    device: object | None  # Device, or None when unavailable / crashed
    status: str            # "available" | "unavailable" | "error"
    reason: str = ""
    default: bool = True   # part of the default set (no --devices given)


def detect(modules=BACKEND_MODULES, include=None) -> list:
    """Enumerate devices: every spec of every backend module, each built in isolation."""
    out = []
    for modname in modules:
        try:
            mod = importlib.import_module(modname)
            specs = mod.candidates()
        except Exception as e:  # the module itself is broken: report and go on
            out.append(Detected(modname.rsplit(".", 1)[-1], modname, "cpu", None, "error",
                                f"{type(e).__name__}: {e}"))
            continue
        for s in specs:
            if include is not None and not include(s):
                continue
            try:
                dev = s.build()
                out.append(Detected(s.name, s.backend, s.kind, dev, "available", default=s.default))
            except NotAvailable as e:
                out.append(Detected(s.name, s.backend, s.kind, None, "unavailable", str(e),
                                    default=s.default))
            except Exception as e:
                tb = traceback.format_exc(limit=3)
                out.append(Detected(s.name, s.backend, s.kind, None, "error",
                                    f"{type(e).__name__}: {e}\n{tb}"))
    return out
