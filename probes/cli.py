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


def _parser():
    p = argparse.ArgumentParser(prog="fp4ref probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default=None,
                   help="comma-separated names or globs (e.g. 'cpu-*,cuda-cublas-*'); default: every "
                        "available device")
    p.add_argument("--quick", action="store_true", help="smaller probe pools and K, fewer validation outputs")
    p.add_argument("--out", default="reports", help="report root (default: reports)")
    p.add_argument("--validate-outputs", type=int, default=None,
                   help="random outputs compared per device (default 100000, quick 20000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="devices probed in parallel (default: CPU count, <= 8)")
    p.add_argument("--extra", action="append", default=[],
                   help="module:attr of a user Device (or a callable returning one) to probe too")
    p.add_argument("--list", action="store_true", help="list detected devices and exit")
    p.add_argument("--shape-budget-s", type=float, default=150.0,
                   help="per-shape inference starts only within this many seconds of the run's "
                        "start (keeps `make probe` inside its time budget; default 150)")
    p.add_argument("--max-shapes", type=int, default=2, help="shapes inferred on their own per device")
    p.add_argument("--time-limit-s", type=float, default=None,
                   help="write the report after this many seconds; unfinished devices are reported as errors")
    p.add_argument("--no-html", action="store_true")
    return p


def _select(names, pattern):
    if not pattern:
        return names
    pats = [x.strip() for x in pattern.split(",") if x.strip()]
    return [n for n in names if any(fnmatch.fnmatch(n, q) or q == n for q in pats)]


def _load_extra(spec: str):
    mod, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(mod), attr or "device")
    return obj() if callable(obj) and not hasattr(obj, "caps") else obj


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
    """``shape_deadline``: a time.time() after which no per-shape inference starts."""
    """Infer + validate one device; returns its report record (reports.schema device)."""
    from reports.schema import new_device
    from .infer import Inference, grid_summary, short
    from .validate import validate
    t0 = time.perf_counter()
    rec = new_device(dev.name, dev.backend, dev.kind, hardware_run=dev.hardware_run,
                     capabilities=dev.caps.to_dict())
    rec["notes"] = list(dev.notes)
    extra = {"candidate_grid": grid_summary()}
    try:
        res = Inference(dev, quick=quick, seed=seed, progress=progress).run()
    except Exception as e:  # the prober itself failed on this device
        rec["status"] = "error"
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["notes"].append(traceback.format_exc(limit=4))
        rec["wall_s"] = time.perf_counter() - t0
        return rec
    rec["status"] = res.status
    rec["error"] = res.error
    rec["probes"] = res.probes
    rec["scans"] = res.scans
    rec["notes"] += res.notes
    extra.update(device_calls=res.device_calls, probes_asked=len(res.asked),
                 inference_wall_s=round(res.wall_s, 3))
    if res.model is not None:
        rec["model"] = res.model.to_dict()
        rec["model_summary"] = res.model.describe()
        extra["short"] = short(res.model)
    if res.undetermined:
        extra["undetermined"] = res.undetermined
        extra["equivalent_candidates"] = len(res.survivors)
        rec["notes"].append(f"{len(res.survivors)} candidates are observationally equivalent on every probe; "
                            f"reported: the simplest (parameters left open: {', '.join(res.undetermined)})")
    if res.status == "fit" and len(res.survivors) > 1:
        pick = pick_survivor(dev, res.survivors, seed=seed + 3)
        if pick is not None and pick != res.survivors[0]:
            res.model = pick.replace(name="inferred")
            rec["model"] = res.model.to_dict()
            rec["model_summary"] = res.model.describe()
            extra["short"] = short(res.model)
            rec["notes"].append("the probes left several candidates equivalent; two random batches "
                                "chose this one over the simplest")
    if res.status == "fit" and outputs > 0:
        if progress:
            progress(stage="validation", candidates=1)
        vkw = {} if shapes is None else {"shapes": shapes}
        shape_models, failing = {}, []
        if per_shape and shape_deadline is not None and time.time() > shape_deadline:
            rec["notes"].append("per-shape inference skipped: the run's time budget was spent")
            per_shape = False
        if per_shape:
            # libraries pick the kernel by shape: shapes the model misses on one batch (and no
            # split of it explains) are inferred on their own before the full validation
            failing = precheck_shapes(dev, res.model, shapes, seed=seed + 2)
            if failing:
                shape_models, extra["shape_models"] = infer_shapes(
                    dev, failing[:max_shapes], quick=quick, seed=seed, progress=progress)
        v = validate(dev, res.model, outputs=outputs, seed=seed + 1, shape_models=shape_models,
                     no_split_search=failing, **vkw)
        rec["validation"] = v.record
        extra["per_shape"] = v.per_shape
        rec["notes"] += v.notes
        mine = (res.model.split_k, res.model.split_tile, res.model.group_size)
        split = {tuple(s["shape"]): (s["split_k"], s.get("split_tile"), s["group_size"]) for s in v.per_shape
                 if (s["split_k"], s.get("split_tile"), s["group_size"]) != mine and not s.get("own_model")}
        if split:
            rec["notes"].append("per-shape schedule (the kernel differs by shape): " + ", ".join(
                f"{list(k)} -> split_k={s}" + (f" (slices rounded up to {t})" if t else "") + f", group_size={g}"
                for k, (s, t, g) in sorted(split.items())))
        if v.nondeterministic:
            rec["status"] = "nondeterministic"
        rec["extra"] = extra
        relabel_partial_fit(rec)
    rec["extra"] = extra
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def relabel_partial_fit(rec: dict) -> dict:
    """A model that fits every probe but not every validated output is not a fit.  If it
    matches every output at some shapes (and the misses are whole shapes where the library
    runs another kernel), the device is 'partial'; otherwise 'no_fit', keeping that model as
    the closest candidate."""
    v = rec.get("validation") or {}
    if rec.get("status") == "fit" and v.get("outputs") and v.get("matches") != v.get("outputs"):
        per = (rec.get("extra") or {}).get("per_shape") or []
        shapes: dict = {}
        for s in per:
            ok, n = shapes.get(tuple(s["shape"]), (0, 0))
            shapes[tuple(s["shape"])] = (ok + s["matches"], n + s["outputs"])
        good = sorted(k for k, (ok, n) in shapes.items() if ok == n)
        bad = sorted(k for k, (ok, n) in shapes.items() if ok != n)
        if good and bad:
            rec["status"] = "partial"
            n_good = sum(shapes[k][1] for k in good)
            rec.setdefault("notes", []).append(
                f"partial: every one of {n_good} outputs at shapes {', '.join(map(str, map(list, good)))} "
                f"matches bit for bit; at {', '.join(map(str, map(list, bad)))} the library runs another "
                f"kernel that no model of the family fits ({v['outputs'] - v['matches']} of "
                f"{v['outputs']} outputs differ); see shape_models and the mismatch table")
        else:
            rec["status"] = "no_fit"
            rec.setdefault("notes", []).append(
                f"no model in the family fits every output: the model that fits every probe (shown) "
                f"disagrees with {v['outputs'] - v['matches']} of {v['outputs']} random outputs "
                f"({v.get('agreement_pct', 0):.3f}% agreement); see the mismatch table")
    return rec


def _worker(name, quick, outputs, seed, extra_spec=None, shape_opts=None):
    """Child process: rebuild the device by name, probe it, return its record."""
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
    progress = _heartbeat(Path(beat) / f"{_safe_name(name)}.json") if beat else None
    return probe_device(dev, quick=quick, outputs=outputs, seed=seed, progress=progress, **opts)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _heartbeat(path: Path):
    """A progress callback that keeps the worker's last stage in a small JSON file (at most
    once a second), so a device still running at the time limit is reported with where it
    was, not only as unfinished."""
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


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    from reports.schema import collect_environment, new_device, new_report, run_dir, write_report
    from .backends import detect
    con = Console(stderr=True)
    t0 = time.perf_counter()
    outputs = args.validate_outputs if args.validate_outputs is not None else (20_000 if args.quick else 100_000)

    with con.status("detecting devices ..."):
        found = detect()
    extras = []
    for spec in args.extra:
        try:
            dev = _load_extra(spec)
            extras.append((dev.name, spec))
        except Exception as e:
            con.print(f"[red]--extra {spec}: {type(e).__name__}: {e}")
            return 2
    avail = [d.name for d in found if d.status == "available"] + [n for n, _ in extras]
    chosen = _select(avail, args.devices)
    if args.list:
        for d in found:
            con.print(f"{d.name:42s} {d.status:12s} {d.reason.splitlines()[0] if d.reason else ''}")
        return 0
    if args.devices and not chosen:
        con.print(f"[red]--devices: {args.devices!r} matches no available device; available: {', '.join(avail)}")
        return 2

    env = collect_environment()
    try:
        import torch
        if torch.cuda.is_available():
            env = collect_environment()  # torch is imported now: CUDA details included
    except Exception:
        pass
    report = new_report(title="fp4ref probe: inferred GEMM accumulation models",
                        command="fp4ref probe " + " ".join(argv if argv is not None else sys.argv[1:]),
                        environment=env)
    records = {}
    for d in found:  # unavailable / crashed backends are reported too
        if d.status != "available" and (not args.devices or _select([d.name], args.devices)):
            rec = new_device(d.name, d.backend, d.kind if d.kind in ("virtual", "cpu", "cuda", "blackwell-only")
                             else "cpu", hardware_run=False, status="skipped" if d.status == "unavailable" else "error")
            rec["error"] = d.reason or None
            rec["notes"] = [d.reason] if d.reason else []
            records[d.name] = rec
    jobs = args.jobs or min(12, os.cpu_count() or 1)
    beat_dir = tempfile.mkdtemp(prefix="fp4ref-probe-")
    shape_opts = {"max_shapes": args.max_shapes, "shape_deadline": time.time() + args.shape_budget_s,
                  "heartbeat_dir": beat_dir}
    extra_map = dict(extras)
    done_rows = []
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=con) as prog:
        task = prog.add_task("probing", total=len(chosen))
        if jobs <= 1 or len(chosen) <= 1:
            for name in chosen:
                prog.update(task, description=f"probing {name}")
                records[name] = _safe_worker(name, args, outputs, extra_map.get(name), shape_opts)
                prog.advance(task)
        else:
            import concurrent.futures as cf
            import multiprocessing as mp
            ex = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
            futs = {ex.submit(_worker, n, args.quick, outputs, args.seed, extra_map.get(n), shape_opts): n
                    for n in chosen}
            left = None if args.time_limit_s is None else max(1.0, args.time_limit_s - (time.perf_counter() - t0))
            try:
                for f in cf.as_completed(futs, timeout=left):
                    name = futs[f]
                    try:
                        records[name] = f.result()
                    except Exception as e:  # the worker process died
                        rec = new_device(name, "?", "cpu", hardware_run=False, status="error")
                        rec["error"] = f"worker crashed: {type(e).__name__}: {e}"
                        records[name] = rec
                    prog.update(task, description=f"done {name}")
                    prog.advance(task)
            except cf.TimeoutError:  # report what finished; the rest is named, not lost
                for f, name in futs.items():
                    if not f.done():
                        rec = new_device(name, "?", "cpu", hardware_run=False, status="error")
                        rec["error"] = f"not finished within --time-limit-s {args.time_limit_s:g}"
                        hb = _last_beat(beat_dir, name)
                        if hb:
                            rec["error"] += (f" (last stage: {hb['stage']}, {hb['candidates']} "
                                             f"candidates, at {hb['elapsed_s']} s)")
                            rec["extra"] = {"last_progress": hb}
                        records[name] = rec
                for p in list(getattr(ex, "_processes", {}).values()):
                    p.terminate()
            ex.shutdown(wait=False, cancel_futures=True)
    shutil.rmtree(beat_dir, ignore_errors=True)
    order = [d.name for d in found] + [n for n, _ in extras]
    report["devices"] = [records[n] for n in order if n in records]
    out = run_dir(args.out, environment=env)
    out.mkdir(parents=True, exist_ok=True)
    path = write_report(report, out / "report.json", html=not args.no_html)

    table = Table(title=f"fp4ref probe ({time.perf_counter() - t0:.1f} s)")
    for col in ("device", "status", "inferred model", "validation", "wall s"):
        table.add_column(col)
    for r in report["devices"]:
        v = r.get("validation")
        vs = f"{v['agreement_pct']:.3f}% of {v['outputs']}" if v else "-"
        mod = (r.get("extra") or {}).get("short") or (r.get("error") or "")[:60]
        table.add_row(r["name"], r["status"], mod, vs, f"{r['wall_s']:.1f}" if r.get("wall_s") else "-")
        done_rows.append(r)
    Console().print(table)
    con.print(f"report: {path}")
    return 0


def _safe_worker(name, args, outputs, extra_spec, shape_opts=None):
    try:
        return _worker(name, args.quick, outputs, args.seed, extra_spec, shape_opts)
    except Exception as e:
        from reports.schema import new_device
        rec = new_device(name, "?", "cpu", hardware_run=False, status="error")
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
