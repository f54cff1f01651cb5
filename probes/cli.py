"""`fp4ref probe` (make probe): detect GEMM devices, infer each one's accumulation model,
validate it bit for bit, and write reports/<machine>/<UTC stamp>/report.json (+ HTML).

Devices run in parallel worker processes (``--jobs``); each worker rebuilds its device by
name, so one crashing backend never takes the others down.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

__all__ = ["main", "probe_device"]


def _int_min(lo: int):
    """argparse type: an integer >= lo (argparse names the option in its message, exit 2)."""
    def parse(text):
        try:
            v = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {v}")
        return v
    return parse


def _seconds(text):
    """argparse type: a positive, finite number of seconds."""
    import math
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def _parser():
    from .validate import DEFAULT_SHAPES
    base = sum(m * n for m, n, _ in DEFAULT_SHAPES)
    p = argparse.ArgumentParser(prog="fp4ref probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default=None,
                   help="comma-separated names or globs (e.g. 'cpu-*,cuda-cublas-*'); default: every "
                        "available device")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller probe pools and K (validation is unchanged: every one of the "
                        f"{len(DEFAULT_SHAPES)} validation shapes runs once, {base:,} outputs)")
    p.add_argument("--out", default="reports", help="report root, checked writable before any work "
                                                   "(default: reports)")
    p.add_argument("--validate-outputs", type=_int_min(1), default=base,
                   help=f"at least this many random outputs compared per device (>= 1); every "
                        f"validation shape runs at least once, so at least {base:,} (the default)")
    p.add_argument("--seed", type=_int_min(0), default=0, help="random seed (>= 0)")
    p.add_argument("--jobs", type=_int_min(1), default=None,
                   help="devices probed in parallel (>= 1; default: CPU count, <= 12)")
    p.add_argument("--extra", action="append", default=[],
                   help="module:attr of a user Device (or a callable returning one) to probe too")
    p.add_argument("--list", action="store_true", help="list detected (and --extra) devices and exit")
    p.add_argument("--shape-budget-s", type=_seconds, default=150.0,
                   help="per-shape inference starts only within this many seconds of the run's "
                        "start (keeps `make probe` inside its time budget; default 150)")
    p.add_argument("--max-shapes", type=_int_min(0), default=2,
                   help="shapes inferred on their own per device (>= 0)")
    p.add_argument("--time-limit-s", type=_seconds, default=None,
                   help="write the report after this many seconds (any --jobs, any number of "
                        "devices); unfinished devices are reported as errors with their last stage")
    p.add_argument("--no-html", action="store_true")
    return p


def _select(names, pattern):
    if not pattern:
        return names
    pats = [x.strip() for x in pattern.split(",") if x.strip()]
    return [n for n in names if any(fnmatch.fnmatch(n, q) or q == n for q in pats)]


def _load_extra(spec: str):
    """The Device named by 'module:attr' (attr: a Device or a callable returning one).
    ValueError with a readable reason for anything else.  The working directory is on the
    import path, so a module next to the user's shell works with the installed command."""
    from .device import Device
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


SPLIT_SEARCH_S = 20.0   # per shape: a longer split-K search hands the shape to per-shape inference


def precheck_shapes(dev, model, shapes=None, *, seed=0) -> list:
    """Validation shapes where one heavy-tailed random batch disagrees with ``model`` and
    no split of it (validate's per-shape schedules) explains the outputs."""
    import numpy as np
    from .validate import DEFAULT_SHAPES, _fit_shape, _try_splits, random_batch
    from .sim import simulate_gemm
    caps = dev.caps
    rng = np.random.default_rng(seed)
    out = []
    for shp in sorted({_fit_shape(s, *s, caps) for s in (shapes or DEFAULT_SHAPES)}):
        M, N, K = shp
        try:
            a, b, sa, sb, alpha, got = random_batch(dev, M, N, K, rng, "heavy")
        except Exception:
            continue  # validation reports device errors
        exp = simulate_gemm(model, a, b, scales_a=sa, scales_b=sb, block=caps.block, alpha=alpha)
        if not np.array_equal(exp, got) and _try_splits(model, a, b, sa, sb, caps, alpha, got,
                                                        seconds=SPLIT_SEARCH_S) is None:
            out.append(shp)
    return out


def pick_survivor(dev, survivors, *, seed=0, limit=16):
    """Among candidates that every probe left equivalent, the first (simplest) one that also
    reproduces two random batches (heavy-tailed, cancelling) at the probe shape; None if none
    does.  Narrow outputs can hide a parameter from every probe but not from random sums."""
    import numpy as np
    from .validate import random_batch
    from .sim import simulate_gemm
    caps = dev.caps
    rng = np.random.default_rng(seed)
    K = min(1024, caps.max_k - caps.max_k % caps.k_step())
    mn = -(-64 // caps.mn_multiple) * caps.mn_multiple
    try:
        batches = [random_batch(dev, mn, mn, K, rng, kind) for kind in ("heavy", "cancel")]
    except Exception:
        return None
    for m in survivors[:limit]:
        if all(np.array_equal(simulate_gemm(m, a, b, scales_a=sa, scales_b=sb, block=caps.block,
                                            alpha=al), got) for a, b, sa, sb, al, got in batches):
            return m
    return None


def infer_shapes(dev, shapes, *, quick=False, seed=0, progress=None) -> tuple[dict, list]:
    """Inference at each given (M, N, K) on its own.  Returns ({shape: model} for the shapes
    that fit, report entries for all of them)."""
    from .infer import Inference, short
    models, entries = {}, []
    for shp in shapes:
        t0 = time.perf_counter()
        if progress:
            progress(stage=f"shape {shp}", candidates=1)
        ent = {"shape": list(shp)}
        try:
            r = Inference(dev, quick=quick, seed=seed, shape=shp).run()
        except Exception as e:  # e.g. a K this device cannot take
            ent.update(status="error", error=f"{type(e).__name__}: {e}")
            entries.append(ent)
            continue
        ent["status"] = r.status
        if r.model is not None:
            ent["model"] = r.model.to_dict()
            ent["short"] = short(r.model)
        if r.status == "fit":
            models[tuple(shp)] = r.model
        else:
            ent["notes"] = r.notes[:4]
            if getattr(r, "closest", None) is not None:
                ent["closest"] = short(r.closest)
        ent["probes_asked"] = len(r.asked)
        ent["wall_s"] = round(time.perf_counter() - t0, 3)
        entries.append(ent)
    return models, entries


def probe_device(dev, *, quick=False, outputs=100_000, seed=0, progress=None, per_shape=True,
                 max_shapes=2, shapes=None, shape_deadline=None) -> dict:
    """Infer + validate one device; returns its report record (reports.schema device).
    ``outputs`` >= 1: a fit needs a validation that ran.  ``shape_deadline``: a time.time()
    after which no per-shape inference starts."""
    from reports.schema import new_device
    from .infer import Inference, grid_summary
    if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
        raise ValueError(f"outputs: validated outputs per device must be an integer >= 1, got {outputs!r}")
    t0 = time.perf_counter()
    rec = new_device(dev.name, dev.backend, dev.kind, hardware_run=dev.hardware_run,
                     capabilities=dev.caps.to_dict())
    rec["notes"] = list(dev.notes)
    extra = {"candidate_grid": grid_summary()}
    rec["extra"] = extra
    try:
        res = Inference(dev, quick=quick, seed=seed, progress=progress).run()
    except Exception as e:  # the prober itself failed on this device
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["notes"].append(traceback.format_exc(limit=4))
        rec["wall_s"] = time.perf_counter() - t0
        return rec
    rec["error"] = res.error
    rec["probes"] = res.probes
    rec["scans"] = res.scans
    rec["notes"] += res.notes
    extra.update(device_calls=res.device_calls, probes_asked=len(res.asked),
                 inference_wall_s=round(res.wall_s, 3))
    _record_model(dev, rec, res, seed)
    v = None
    if res.status == "fit":
        if progress:
            progress(stage="validation", candidates=1)
        v = _validate_device(dev, res.model, rec, outputs=outputs, seed=seed, quick=quick,
                             progress=progress, per_shape=per_shape, max_shapes=max_shapes,
                             shapes=shapes, shape_deadline=shape_deadline)
    rec["status"], error, notes = decide_status(res.status, v)
    rec["error"] = error or rec["error"]
    rec["notes"] += notes
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _record_model(dev, rec, res, seed) -> None:
    """The inferred (or closest) model into the record; among survivors the probes left
    equivalent, the one two random batches confirm."""
    from .infer import short
    extra = rec["extra"]
    if res.undetermined:
        extra["undetermined"] = res.undetermined
        extra["equivalent_candidates"] = len(res.survivors)
        rec["notes"].append(f"{len(res.survivors)} candidates are observationally equivalent on every probe; "
                            f"reported: the simplest (parameters left open: {', '.join(res.undetermined)})")
    if res.status == "fit" and len(res.survivors) > 1:
        pick = pick_survivor(dev, res.survivors, seed=seed + 3)
        if pick is not None and pick != res.survivors[0]:
            res.model = pick.replace(name="inferred")
            rec["notes"].append("the probes left several candidates equivalent; two random batches "
                                "chose this one over the simplest")
    if res.model is not None:
        rec["model"] = res.model.to_dict()
        rec["model_summary"] = res.model.describe()
        extra["short"] = short(res.model)


def _validate_device(dev, model, rec, *, outputs, seed, quick, progress, per_shape, max_shapes,
                     shapes, shape_deadline):
    """Per-shape inference of the shapes the model misses, then the full validation."""
    from .validate import validate
    extra = rec["extra"]
    vkw = {} if shapes is None else {"shapes": shapes}
    shape_models, failing = {}, []
    if per_shape and shape_deadline is not None and time.time() > shape_deadline:
        rec["notes"].append("per-shape inference skipped: the run's time budget was spent")
        per_shape = False
    if per_shape:
        # libraries pick the kernel by shape: shapes the model misses on one batch (and no
        # split of it explains) are inferred on their own before the full validation
        failing = precheck_shapes(dev, model, shapes, seed=seed + 2)
        if failing:
            shape_models, extra["shape_models"] = infer_shapes(
                dev, failing[:max_shapes], quick=quick, seed=seed, progress=progress)
    v = validate(dev, model, outputs=outputs, seed=seed + 1, shape_models=shape_models,
                 no_split_search=failing, **vkw)
    rec["validation"] = v.record
    extra["per_shape"] = v.per_shape
    if v.errors:
        extra["validation_errors"] = v.errors
    rec["notes"] += v.notes
    mine = (model.split_k, model.split_tile, model.group_size)
    split = {tuple(s["shape"]): (s["split_k"], s.get("split_tile"), s["group_size"]) for s in v.per_shape
             if (s["split_k"], s.get("split_tile"), s["group_size"]) != mine and not s.get("own_model")}
    if split:
        rec["notes"].append("per-shape schedule (the kernel differs by shape): " + ", ".join(
            f"{list(k)} -> split_k={s}" + (f" (slices rounded up to {t})" if t else "") + f", group_size={g}"
            for k, (s, t, g) in sorted(split.items())))
    return v


def decide_status(inferred: str, v=None) -> tuple[str, str | None, list]:
    """The device's status, decided here and nowhere else: (status, error or None, notes).

    Not 'fit' from inference: kept.  A fit needs a validation that ran: nondeterministic
    repeats -> 'nondeterministic'; no output validated -> 'error'; every output matching
    and no shape raising -> 'fit'; whole shapes failing (mismatching or raising) while
    others match bit for bit -> 'partial'; otherwise 'no_fit' (the model is kept as the
    closest candidate)."""
    if inferred != "fit":
        return inferred, None, []
    if v is None:
        return "error", "inferred a model but no validation ran", []
    if v.nondeterministic:
        return "nondeterministic", None, []
    errs = list(v.errors)
    if v.record is None:
        why = "; ".join(f"{e['shape']}: {e['error']}" for e in errs[:3]) or "no batch ran"
        return "error", f"validation: no output could be validated ({why})", []
    shapes: dict = {}
    for s in v.per_shape:
        ok, n = shapes.get(tuple(s["shape"]), (0, 0))
        shapes[tuple(s["shape"])] = (ok + s["matches"], n + s["outputs"])
    raised = sorted({tuple(e["shape"]) for e in errs})
    good = sorted(k for k, (ok, n) in shapes.items() if ok == n and k not in raised)
    bad = sorted(k for k, (ok, n) in shapes.items() if ok != n)
    rv = v.record
    if not bad and not raised:
        return "fit", None, []
    if good:
        miss = rv["outputs"] - rv["matches"]
        return "partial", None, [
            f"partial: every one of {sum(shapes[k][1] for k in good)} outputs at shapes "
            f"{', '.join(map(str, map(list, good)))} matches bit for bit; "
            + (f"at {', '.join(map(str, map(list, bad)))} the library runs another kernel that no model "
               f"of the family fits ({miss} of {rv['outputs']} outputs differ); see shape_models and "
               f"the mismatch table" if bad else "")
            + (("; " if bad else "") + f"at {', '.join(map(str, map(list, raised)))} the device raised "
               f"(validation errors)" if raised else "")]
    return "no_fit", None, [
        f"no model in the family fits every output: the model that fits every probe (shown) "
        f"disagrees with {rv['outputs'] - rv['matches']} of {rv['outputs']} random outputs "
        f"({rv.get('agreement_pct', 0):.3f}% agreement)"
        + (f", and the device raised at {', '.join(map(str, map(list, raised)))}" if raised else "")
        + "; see the mismatch table"]


def _worker(name, quick, outputs, seed, extra_spec=None, shape_opts=None, progress=None):
    """Rebuild the device by name (in a child process, or in-process), probe it, return its record."""
    from .backends import detect
    if extra_spec:
        dev = _load_extra(extra_spec)
    else:
        found = [d for d in detect(include=lambda s: s.name == name) if d.name == name]
        if not found or found[0].device is None:
            from reports.schema import new_device
            d = found[0] if found else None
            rec = new_device(name, d.backend if d else "?", d.kind if d else "cpu", hardware_run=False,
                             status="error")
            rec["error"] = d.reason if d else "device vanished"
            return rec
        dev = found[0].device
    opts = dict(shape_opts or {})
    beat = opts.pop("heartbeat_dir", None)
    if progress is None and beat:
        progress = _heartbeat(Path(beat) / f"{_safe_name(name)}.json")
    return probe_device(dev, quick=quick, outputs=outputs, seed=seed, progress=progress, **opts)


def _safe_name(name: str) -> str:
    """A file name for a device name: distinct names get distinct files (a hash of the name)."""
    import hashlib
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


def _check_writable(root: Path) -> str | None:
    """None if report folders can be created under ``root``; else why not."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".fp4ref-write-check-", dir=root)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return f"cannot write reports there: {e.strerror or e}"
    return None


def _load_extras(specs, found) -> list:
    """[(Device, spec)]; ValueError for a bad spec or a device name already taken."""
    taken = {d.name: "a detected device" for d in found}
    out = []
    for spec in specs:
        try:
            dev = _load_extra(spec)
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


def _unfinished(name, meta, why, beat_dir) -> dict:
    """The record of a device that did not finish: its own backend and kind (not guessed),
    the reason, and the last stage its heartbeat reported."""
    from reports.schema import new_device
    backend, kind, hw = meta.get(name, ("?", "cpu", False))
    rec = new_device(name, backend, kind, hardware_run=hw, status="error")
    rec["error"] = why
    hb = _last_beat(beat_dir, name) if beat_dir else None
    if hb:
        rec["error"] += (f" (last stage: {hb['stage']}, {hb['candidates']} candidates, "
                         f"at {hb['elapsed_s']} s)")
        rec["extra"] = {"last_progress": hb}
    return rec


def _crashed(name, meta, e) -> dict:
    rec = _unfinished(name, meta, f"worker crashed: {type(e).__name__}: {e}", None)
    return rec


def _run_inline(chosen, ctx, records, prog, task):
    """One device at a time in this process, no time limit; the display names each stage."""
    from rich.markup import escape
    for name in chosen:
        def show(stage=None, **_):
            if stage is not None:
                prog.update(task, description=f"{escape(name)}: {escape(str(stage))}")
        show("starting")
        try:
            records[name] = _worker(name, ctx["quick"], ctx["outputs"], ctx["seed"],
                                    ctx["extra_map"].get(name), ctx["shape_opts"], progress=show)
        except Exception as e:
            records[name] = _crashed(name, ctx["meta"], e)
        prog.advance(task)


def _ignore_sigint():
    """Workers leave Ctrl-C to the parent, which writes the partial report and stops them."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_pool(chosen, ctx, records, prog, task, deadline):
    """Devices in worker processes; at ``deadline`` (time.time(), or None) the unfinished
    ones are reported with their last stage.  The workers are stopped however this ends."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from rich.markup import escape
    ex = cf.ProcessPoolExecutor(max_workers=max(1, min(ctx["jobs"], len(chosen))),
                                mp_context=mp.get_context("spawn"), initializer=_ignore_sigint)
    try:
        futs = {ex.submit(_worker, n, ctx["quick"], ctx["outputs"], ctx["seed"], ctx["extra_map"].get(n),
                          ctx["shape_opts"]): n for n in chosen}
        pending = set(futs)
        while pending:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                break
            done, pending = cf.wait(pending, timeout=1.0 if left is None else min(1.0, left),
                                    return_when=cf.FIRST_COMPLETED)
            for f in done:
                name = futs[f]
                try:
                    records[name] = f.result()
                except Exception as e:  # the worker process died
                    records[name] = _crashed(name, ctx["meta"], e)
                prog.advance(task)
            stages = [f"{escape(futs[f])}: {escape(str((_last_beat(ctx['beat_dir'], futs[f]) or {}).get('stage', 'starting')))}"
                      for f in pending if f.running()][:3]
            prog.update(task, description="; ".join(stages) or "probing")
        for f in pending:
            name = futs[f]
            records[name] = _unfinished(name, ctx["meta"], f"not finished within --time-limit-s "
                                        f"{ctx['time_limit_s']:g}", ctx["beat_dir"])
    finally:
        for p in list((getattr(ex, "_processes", None) or {}).values()):
            p.terminate()
        ex.shutdown(wait=False, cancel_futures=True)


def _summary_table(report, seconds):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=f"fp4ref probe ({seconds:.1f} s)")
    table.add_column("device", overflow="fold")  # full names: wrapped, never cut
    for col in ("status", "inferred model", "validation", "wall s"):
        table.add_column(col, overflow="fold")
    for r in report["devices"]:
        v = r.get("validation")
        vs = f"{v['agreement_pct']:.3f}% of {v['outputs']}" if v else "-"
        mod = (r.get("extra") or {}).get("short") or ((r.get("error") or "").splitlines() or [""])[0][:160]
        table.add_row(Text(r["name"]), Text(r["status"]), Text(mod), Text(vs),
                      Text(f"{r['wall_s']:.1f}" if r.get("wall_s") else "-"))
    return table


def main(argv=None) -> int:
    args = _parser().parse_args(argv)  # bad numbers: argparse names the option, exit 2
    from rich.console import Console
    from rich.markup import escape
    from reports.schema import collect_environment, new_report, run_dir
    from .backends import detect
    con = Console(stderr=True)
    t0 = time.perf_counter()
    problem = _check_writable(Path(args.out))
    if problem:  # before any work: an unwritable --out must not cost a whole run
        con.print(f"[red]--out {escape(args.out)}: {escape(problem)}")
        return 2
    with con.status("detecting devices ..."):
        found = detect()
    try:
        extras = _load_extras(args.extra, found)
    except ValueError as e:
        con.print(f"[red]{escape(str(e))}")
        return 2
    if args.list:
        for d in found:
            why = d.reason.splitlines()[0] if d.reason else ("" if d.default else "(not in the default set)")
            con.print(escape(f"{d.name:42s} {d.status:12s} {why}"))
        for dev, spec in extras:
            con.print(escape(f"{dev.name:42s} {'available':12s} --extra {spec} ({dev.backend})"))
        return 0
    avail = [d.name for d in found if d.status == "available"] + [dev.name for dev, _ in extras]
    # no --devices: the default set (hypothesis devices such as virtual-blackwell-* only on request)
    chosen = _select(avail, args.devices) if args.devices else \
        [d.name for d in found if d.status == "available" and d.default] + [dev.name for dev, _ in extras]
    if args.devices and not chosen:
        con.print(escape(f"--devices: {args.devices!r} matches no available device; valid choices: "
                         f"{', '.join(avail)}"))
        return 2
    env = collect_environment()
    report = new_report(title="fp4ref probe: inferred GEMM accumulation models",
                        command="fp4ref probe " + " ".join(argv if argv is not None else sys.argv[1:]),
                        environment=env)
    out = run_dir(args.out, environment=env, created=report["created"])  # named by the start time
    records = _skipped_records(found, args.devices)
    meta = {d.name: (d.device.backend, d.device.kind, d.device.hardware_run) for d in found if d.device}
    meta.update({dev.name: (dev.backend, dev.kind, dev.hardware_run) for dev, _ in extras})
    beat_dir = tempfile.mkdtemp(prefix="fp4ref-probe-")
    ctx = dict(quick=args.quick, outputs=args.validate_outputs, seed=args.seed, meta=meta,
               extra_map={dev.name: spec for dev, spec in extras}, beat_dir=beat_dir,
               jobs=args.jobs or min(12, os.cpu_count() or 1), time_limit_s=args.time_limit_s,
               shape_opts={"max_shapes": args.max_shapes, "heartbeat_dir": beat_dir,
                           "shape_deadline": time.time() + args.shape_budget_s})
    stopped, rc = None, 0
    try:
        _probe_all(chosen, ctx, records, con, t0)
    except KeyboardInterrupt:
        stopped, rc = "interrupted (Ctrl-C) before it finished", 130
    except Exception as e:  # a crash of the tool itself: keep what finished
        stopped, rc = f"not finished: the run crashed ({type(e).__name__}: {e})", 1
        con.print(f"[red]fp4ref probe crashed: {escape(f'{type(e).__name__}: {e}')}")
    finally:
        shutil.rmtree(beat_dir, ignore_errors=True)
    if stopped:
        for n in chosen:
            records.setdefault(n, _unfinished(n, meta, stopped, None))
        done = sum(1 for n in chosen if records[n]["error"] != stopped)
        report.setdefault("notes", []).append(f"partial report: {stopped}; {done} of {len(chosen)} "
                                              f"devices finished")
    order = [d.name for d in found] + [dev.name for dev, _ in extras]
    report["devices"] = [records[n] for n in order if n in records]
    return _write_and_print(report, out, args, con, t0) or rc


def _probe_all(chosen, ctx, records, con, t0):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=con) as prog:
        task = prog.add_task("probing", total=len(chosen))
        if ctx["time_limit_s"] is None and (ctx["jobs"] <= 1 or len(chosen) <= 1):
            _run_inline(chosen, ctx, records, prog, task)
        else:  # a time limit needs workers it can stop, whatever --jobs is
            deadline = None if ctx["time_limit_s"] is None else time.time() + ctx["time_limit_s"] - (
                time.perf_counter() - t0)
            _run_pool(chosen, ctx, records, prog, task, deadline)


def _skipped_records(found, pattern) -> dict:
    """Devices that could not run here: reported (compactly, by the HTML), not probed."""
    from reports.schema import new_device
    out = {}
    for d in found:
        if d.status != "available" and (not pattern or _select([d.name], pattern)):
            rec = new_device(d.name, d.backend, d.kind if d.kind in ("virtual", "cpu", "cuda", "blackwell-only")
                             else "cpu", hardware_run=False, status="skipped" if d.status == "unavailable" else "error")
            rec["error"] = d.reason or None
            rec["notes"] = [d.reason] if d.reason else []
            out[d.name] = rec
    return out


def _write_and_print(report, out, args, con, t0) -> int:
    from rich.console import Console
    from rich.markup import escape
    from reports.schema import write_report
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = write_report(report, out / "report.json", html=not args.no_html)
    except OSError as e:
        con.print(f"[red]--out {escape(args.out)}: cannot write the report: {escape(str(e))}")
        return 2
    Console().print(_summary_table(report, time.perf_counter() - t0))
    con.print(f"report: {escape(str(path))}", soft_wrap=True)  # one line each: paths to copy
    if not args.no_html:
        con.print(f"html:   {escape(str(path.with_suffix('.html')))}", soft_wrap=True)
    from reports.schema import baseline_key
    con.print(escape(f"gate: fp4ref gate --baseline reports/baselines/{baseline_key(report['environment'])}"
                     f".json --current {path}  (add --accept once to record this run as the baseline)"),
              soft_wrap=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
