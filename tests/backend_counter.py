"""pytest plugin: which backend (torch or Triton) served each quantizer profile in this run.

Every public quantizer entry of fp4ref.quant is wrapped (outermost call only); a call counts as
"triton" when one of the fused Triton entries ran inside it, else "torch".  The terminal summary
prints the table; a run that selected every tests/test_recipes_*.py module (no -k) fails when
some quantizer profile's torch path never ran (issue 14: a leaked TRITON_INTERPRET once routed
several profiles to the interpreter for a whole session, so their torch path went unchecked).
Under xdist each worker counts and the controller merges (workeroutput)."""
from __future__ import annotations

import functools
import glob
import os
from collections import Counter

import pytest

_COUNTS: Counter = Counter()       # (profile, backend) -> calls
_STATE = {"depth": 0, "triton": False, "full": False}
_ENTRIES = {"nvfp4": ("quantize",), "mx": ("quantize",), "ue5m3": ("quantize",),
            "quartet": ("quest_forward", "quartet_backward"),
            "fusion": ("cta_nvfp4", "row_sr_mxfp4", "h32_mxfp4")}
_TRITON_ENTRIES = ("two_level_1x16_amax", "mx_floor_e2m1")
_ROOT = os.path.dirname(os.path.abspath(__file__))


def quantizer_profiles() -> list[str]:
    from reference.recipes import RECIPE_PROFILES
    return [k for k, p in RECIPE_PROFILES.items() if p.family != "fp8_scaling"]


def _wrap_entry(fn):
    @functools.wraps(fn)
    def entry(*a, **kw):
        outer = _STATE["depth"] == 0
        if outer:
            _STATE["triton"] = False
        _STATE["depth"] += 1
        try:
            out = fn(*a, **kw)
        finally:
            _STATE["depth"] -= 1
        if outer and getattr(out, "profile", ""):
            _COUNTS[(out.profile, "triton" if _STATE["triton"] else "torch")] += 1
        return out
    entry.__fp4ref_counted__ = True
    return entry


def _wrap_triton(fn):
    @functools.wraps(fn)
    def kernel_entry(*a, **kw):
        _STATE["triton"] = True
        return fn(*a, **kw)
    kernel_entry.__fp4ref_counted__ = True
    return kernel_entry


def instrument() -> None:
    """Wrap the entries (idempotent; call again after reloading triton_quant)."""
    import importlib
    for mod, names in _ENTRIES.items():
        m = importlib.import_module(f"fp4ref.quant.{mod}")
        for n in names:
            if not getattr(getattr(m, n), "__fp4ref_counted__", False):
                setattr(m, n, _wrap_entry(getattr(m, n)))
    try:
        from fp4ref.quant import triton_quant as TQ
    except Exception:   # pragma: no cover - triton missing: no Triton backend to count
        return
    for n in _TRITON_ENTRIES:
        f = getattr(TQ, n, None)
        if f is not None and not getattr(f, "__fp4ref_counted__", False):
            setattr(TQ, n, _wrap_triton(f))


def pytest_configure(config):
    instrument()


def pytest_collection_finish(session):
    wanted = {os.path.realpath(p) for p in glob.glob(os.path.join(_ROOT, "test_recipes_*.py"))}
    got = {os.path.realpath(str(it.path)) for it in session.items}
    _STATE["full"] = bool(wanted) and wanted <= got and not session.config.option.keyword


def pytest_sessionfinish(session):
    wo = getattr(session.config, "workeroutput", None)
    if wo is not None:   # xdist worker: hand the counts to the controller
        wo["fp4ref_backends"] = [[p, b, n] for (p, b), n in _COUNTS.items()]
        wo["fp4ref_full"] = _STATE["full"]
        return
    missing = missing_torch_paths()
    if _STATE["full"] and missing and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {}) or {}
    for p, b, n in out.get("fp4ref_backends", []):
        _COUNTS[(p, b)] += n
    _STATE["full"] = _STATE["full"] or bool(out.get("fp4ref_full"))


def missing_torch_paths() -> list[str]:
    return [p for p in quantizer_profiles() if _COUNTS[(p, "torch")] == 0]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "workeroutput", None) is not None or not _COUNTS or \
            not (_STATE["full"] or config.option.verbose > 0):
        return
    tr = terminalreporter
    tr.section("fp4ref: quantizer backends served (calls)")
    for p in quantizer_profiles():
        tr.write_line(f"  {p:24s} torch {_COUNTS[(p, 'torch')]:6d}   triton {_COUNTS[(p, 'triton')]:6d}")
    missing = missing_torch_paths()
    if _STATE["full"] and missing:
        tr.write_line(f"FAILED: the torch path of {', '.join(missing)} never ran in this full "
                      "run (a leaked TRITON_INTERPRET?)", red=True)
