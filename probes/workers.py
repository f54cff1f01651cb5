"""Probe many devices: in this process or in worker processes, under a time limit.

Each worker rebuilds its device by name (or by its --extra 'module:attr'), so one crashing
backend never takes the others down.  A worker that does not finish is reported with the last
stage its heartbeat file named.  Every device ends as a DeviceResult (probes.result); the
`fp4ref probe` command (reports.probe_run) turns them into a report.
"""
from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .device import DEVICE_KINDS, Device
from .result import DeviceResult, decide_status
from .run import probe_device

__all__ = ["RunOptions", "Display", "run_devices", "select", "load_extra", "load_extras",
           "unfinished", "not_run"]

@dataclass(frozen=True)
class RunOptions:
    """What every device's probe run gets (picklable: it travels to worker processes)."""
    quick: bool = False
    outputs: int = 100_000
    seed: int = 0
    jobs: int = 1
    time_limit_s: float | None = None      # None: wait for every device
    deadline: float | None = None          # time.time() at which time_limit_s is spent
    max_shapes: int = 2
    shape_deadline: float | None = None    # time.time() after which no per-shape inference starts
    extra_specs: dict = field(default_factory=dict)   # device name -> --extra 'module:attr'
    identities: dict = field(default_factory=dict)    # device name -> identity() tuple
    random_shapes: int = 0                 # accepted random shapes per device after its probe
    random_shapes_log: str | None = None   # their JSONL log (None: one per run, in a temp folder)
    random_shapes_until: float | None = None  # time.time() by which the random-shape step stops
    random_shapes_max_mn: int = 4096       # M, N drawn in [1, this] (K: [1, min(16384, caps.max_k)])


class Display(Protocol):
    """Where run_devices reports progress (the command draws it)."""

    def show(self, running: list) -> None:
        """[(device name, stage)] of the devices running now (at most three)."""

    def advance(self) -> None:
        """One more device finished."""


def select(names, pattern):
    """The names matching a comma-separated list of names or globs (all names if empty)."""
    if not pattern:
        return names
    pats = [x.strip() for x in pattern.split(",") if x.strip()]
    return [n for n in names if any(fnmatch.fnmatch(n, q) or q == n for q in pats)]


def load_extra(spec: str):
    """The Device named by 'module:attr' (attr: a Device or a callable returning one).
    ValueError with a readable reason for anything else.  The working directory is on the
    import path, so a module next to the user's shell works with the installed command."""
    mod, _, attr = spec.partition(":")
    if not mod or not (attr or "device").isidentifier():
        raise ValueError(f"--extra: {spec!r} is not 'module:attr'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"--extra {spec}: cannot import module {mod!r}: {e}") from None
    if not hasattr(m, attr or "device"):
        raise ValueError(f"--extra {spec}: module {mod!r} has no attribute {attr or 'device'!r}")
    obj = getattr(m, attr or "device")
    if callable(obj) and not isinstance(obj, Device):
        obj = obj()
    if not isinstance(obj, Device):
        raise ValueError(f"--extra {spec}: expected a probes.device.Device (or a callable returning "
                         f"one), got {type(obj).__name__}")
    return obj


def load_extras(specs, found) -> list:
    """[(Device, spec)]; ValueError for a bad spec or a device name already taken."""
    taken = {d.name: "a detected device" for d in found}
    out = []
    for spec in specs:
        try:
            dev = load_extra(spec)
        except ValueError:
            raise
        except Exception as e:  # the user's module or factory failed: say so, no traceback
            raise ValueError(f"--extra {spec}: {type(e).__name__}: {e}") from None
        if dev.name in taken:
            raise ValueError(f"--extra {spec}: device name {dev.name!r} is already used by "
                             f"{taken[dev.name]}; device names must be unique")
        taken[dev.name] = f"--extra {spec}"
        out.append((dev, spec))
    return out


def not_run(found, pattern) -> dict:
    """{name: DeviceResult} of detected devices that cannot run here (skipped) or whose
    detection failed (error), among those ``pattern`` selects."""
    out = {}
    for d in found:
        if d.status != "available" and (not pattern or select([d.name], pattern)):
            kind = d.kind if d.kind in DEVICE_KINDS else "cpu"
            decision = (decide_status(not_run=d.reason) if d.status == "unavailable"
                        else decide_status(failure=d.reason or "device detection failed"))
            out[d.name] = DeviceResult.decided((d.name, d.backend, kind, False), decision,
                                               notes=[d.reason] if d.reason else [])
    return out


# --- one device, in a worker -------------------------------------------------------------------
def _rebuild(name, opts: RunOptions):
    """The Device named ``name`` built again here, or the error DeviceResult if it cannot be."""
    from .backends import detect
    spec = opts.extra_specs.get(name)
    if spec:
        return load_extra(spec)
    found = [d for d in detect(include=lambda s: s.name == name) if d.name == name]
    if not found or found[0].device is None:
        d = found[0] if found else None
        ident = (name, d.backend if d else "?", d.kind if d else "cpu", False)
        return DeviceResult.decided(ident, decide_status(failure=(d.reason if d else "") or "device vanished"))
    return found[0].device


def _worker(name, opts: RunOptions, beat_dir=None, progress=None) -> DeviceResult:
    """Rebuild the device by name (in a child process, or in-process) and probe it."""
    dev = _rebuild(name, opts)
    if isinstance(dev, DeviceResult):
        return dev
    if progress is None and beat_dir:
        progress = _heartbeat(Path(beat_dir) / f"{_safe_name(name)}.json")
    return probe_device(dev, quick=opts.quick, outputs=opts.outputs, seed=opts.seed, progress=progress,
                        max_shapes=opts.max_shapes, shape_deadline=opts.shape_deadline)


def _safe_name(name: str) -> str:
    """A file name for a device name: distinct names get distinct files (a hash of the name)."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
    return f"{stem}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _heartbeat(path: Path):
    """A progress callback that keeps the worker's last stage in a small JSON file (at most
    once a second), so a device still running at the time limit is reported with where it
    was, not only as unfinished, and the progress display can name the stage."""
    t0, last = time.perf_counter(), [0.0]

    def beat(stage=None, candidates=None, **_):
        now = time.perf_counter()
        if stage is None or now - last[0] < 1.0:
            return
        last[0] = now
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stage": str(stage), "candidates": candidates,
                                   "elapsed_s": round(now - t0, 1)}))
        os.replace(tmp, path)
    return beat


def _last_beat(beat_dir, name) -> dict | None:
    try:
        return json.loads((Path(beat_dir) / f"{_safe_name(name)}.json").read_text())
    except (OSError, ValueError):
        return None


def unfinished(name, opts: RunOptions, why: str, beat_dir=None) -> DeviceResult:
    """The result of a device that did not finish: its own backend and kind (not guessed),
    the reason, and the last stage its heartbeat reported."""
    ident = opts.identities.get(name, (name, "?", "cpu", False))
    hb = _last_beat(beat_dir, name) if beat_dir else None
    if hb:
        why += f" (last stage: {hb['stage']}, {hb['candidates']} candidates, at {hb['elapsed_s']} s)"
    return DeviceResult.decided(ident, decide_status(failure=why), extra={"last_progress": hb} if hb else {})


def _crashed(name, opts, e) -> DeviceResult:
    return unfinished(name, opts, f"worker crashed: {type(e).__name__}: {e}")


# --- many devices ------------------------------------------------------------------------------
def run_devices(chosen: list, opts: RunOptions, results: dict, display: Display) -> None:
    """Probe the ``chosen`` device names into ``results`` ({name: DeviceResult}), as each
    finishes (so an interrupted run keeps what finished).  Inline, one at a time, without a
    time limit and with one job (or one device); else in worker processes, which a time
    limit needs (they can be stopped).  The heartbeat folder is removed however this ends."""
    beat_dir = tempfile.mkdtemp(prefix="fp4ref-probe-")
    try:
        if opts.time_limit_s is None and (opts.jobs <= 1 or len(chosen) <= 1):
            _run_inline(chosen, opts, results, display)
        else:  # a time limit needs workers it can stop, whatever --jobs is
            _run_pool(chosen, opts, results, display, opts.deadline, beat_dir)
    finally:
        shutil.rmtree(beat_dir, ignore_errors=True)


def _run_inline(chosen, opts, results, display):
    """One device at a time in this process, no time limit; the display names each stage."""
    logs = tempfile.mkdtemp(prefix="fp4ref-shapes-") if opts.random_shapes else None
    try:
        for name in chosen:
            def show(stage=None, **_):
                if stage is not None:
                    display.show([(name, str(stage))])
            show("starting")
            try:
                results[name] = _worker(name, opts, progress=show)
            except Exception as e:
                results[name] = _crashed(name, opts, e)
            if _wants_shapes(results[name], opts):
                show("random shapes")
                log = _shapes_log(name, opts, logs)
                try:
                    results[name].extra["random_shapes"] = _random_worker(name, results[name].model, opts, log)
                except Exception as e:  # the probe's result stands; the step says why it ended
                    results[name].extra["random_shapes"] = _cut_shapes(name, opts, log,
                                                                       f"crashed: {type(e).__name__}: {e}")
            display.advance()
    finally:
        if logs:
            shutil.rmtree(logs, ignore_errors=True)


# --- the random-shape step after a device's probe (probes.shape_validation) ---------------------
def _wants_shapes(res: DeviceResult, opts: RunOptions) -> bool:
    """A device with a model gets random shapes; virtual ones do not (their "native" GEMM is
    the simulator over every output: minutes at 4096 x 4096 x 16384)."""
    return opts.random_shapes > 0 and res.model is not None and res.kind != "virtual"


def _shapes_log(name, opts: RunOptions, beat_dir) -> str:
    return opts.random_shapes_log or str(Path(beat_dir) / f"{_safe_name(name)}-shapes.jsonl")


def _random_worker(name, model, opts: RunOptions, log) -> dict:
    """Rebuild the device and run the bounded random-shape validation: its report record."""
    from .shape_validation import bounded_run
    dev = _rebuild(name, opts)
    if isinstance(dev, DeviceResult):
        return _cut_shapes(name, opts, log, f"not started: the device was not rebuilt ({dev.error})")
    return bounded_run(dev, model, shapes=opts.random_shapes, seed=opts.seed, log_path=log,
                       until=opts.random_shapes_until, max_mn=opts.random_shapes_max_mn)


def _cut_shapes(name, opts: RunOptions, log, why: str) -> dict:
    """The record of a random-shape step that did not return: what its log holds so far."""
    from .shape_validation import random_shapes_record
    return random_shapes_record(log, name, stopped=why, requested=opts.random_shapes, seed=opts.seed)


def _ignore_sigint():
    """Workers leave Ctrl-C to the parent, which writes the partial report and stops them."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_pool(chosen, opts, results, display, deadline, beat_dir):
    """Devices in worker processes; at ``deadline`` (time.time(), or None) the unfinished
    ones are reported with their last stage.  A device that finishes with a model gets its
    random-shape step as another task; one still running at the deadline keeps the shapes its
    log holds.  The workers are stopped however this ends."""
    import concurrent.futures as cf
    import multiprocessing as mp
    ex = cf.ProcessPoolExecutor(max_workers=max(1, min(opts.jobs, len(chosen))),
                                mp_context=mp.get_context("spawn"), initializer=_ignore_sigint)
    try:
        futs = {ex.submit(_worker, n, opts, beat_dir): n for n in chosen}
        shapes: dict = {}   # random-shape step future -> device name
        pending = set(futs)
        while pending:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                break
            done, pending = cf.wait(pending, timeout=1.0 if left is None else min(1.0, left),
                                    return_when=cf.FIRST_COMPLETED)
            for f in done:
                if f in shapes:
                    _attach_shapes(results, shapes[f], f, opts, beat_dir)
                    continue
                try:
                    results[futs[f]] = f.result()
                except Exception as e:  # the worker process died
                    results[futs[f]] = _crashed(futs[f], opts, e)
                display.advance()
                if _wants_shapes(results[futs[f]], opts):
                    g = ex.submit(_random_worker, futs[f], results[futs[f]].model, opts,
                                  _shapes_log(futs[f], opts, beat_dir))
                    shapes[g] = futs[f]
                    pending.add(g)
            display.show([(futs[f], str((_last_beat(beat_dir, futs[f]) or {}).get("stage", "starting")))
                          for f in pending if f in futs and f.running()][:3])
        for f in pending:
            if f in shapes:
                results[shapes[f]].extra["random_shapes"] = _cut_shapes(
                    shapes[f], opts, _shapes_log(shapes[f], opts, beat_dir),
                    f"stopped at --time-limit-s {opts.time_limit_s:g}; shapes finished by then are kept")
            else:
                results[futs[f]] = unfinished(futs[f], opts, f"not finished within --time-limit-s "
                                              f"{opts.time_limit_s:g}", beat_dir)
    finally:
        for p in list((getattr(ex, "_processes", None) or {}).values()):
            p.terminate()
        ex.shutdown(wait=False, cancel_futures=True)


def _attach_shapes(results, name, f, opts, beat_dir) -> None:
    """A finished random-shape step's record into the device's extra.random_shapes."""
    try:
        results[name].extra["random_shapes"] = f.result()
    except Exception as e:  # the step's process died: keep what its log holds
        results[name].extra["random_shapes"] = _cut_shapes(name, opts, _shapes_log(name, opts, beat_dir),
                                                           f"crashed: {type(e).__name__}: {e}")
