"""Probe one device: infer its accumulation model, validate it bit for bit, and return a
typed ``DeviceResult`` (probes.result) whose status ``decide_status`` decides.

Shapes the model misses (and no split-K schedule explains) get their own inference first:
libraries pick the kernel, hence the model, by shape.
"""
from __future__ import annotations

import time
import traceback

import numpy as np

from .infer import Inference
from .grid import grid_summary
from .result import DeviceResult, ShapeResult, decide_status
from .sim import simulate_gemm
from .validate import DEFAULT_SHAPES, _fit_shape, _try_splits, random_batch, validate

__all__ = ["probe_device", "infer_shapes", "explain_shapes", "precheck_shapes", "pick_survivor", "identity", "kernels_at",
           "SPLIT_SEARCH_S"]

SPLIT_SEARCH_S = 20.0   # per shape: a longer split-K search hands the shape to per-shape inference
EXPLAIN_S = 15.0        # per shape: explain_shape's search budget inside a probe run


def identity(dev) -> tuple:
    """(name, backend, kind, hardware_run) of a Device: the head of its DeviceResult."""
    return (dev.name, dev.backend, dev.kind, dev.hardware_run)


def precheck_shapes(dev, model, shapes=None, *, seed=0, split_search_s=SPLIT_SEARCH_S) -> list:
    """Validation shapes where one heavy-tailed random batch disagrees with ``model`` and
    no split of it (validate's per-shape schedules, searched for at most ``split_search_s``)
    explains the outputs."""
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
                                                        seconds=split_search_s) is None:
            out.append(shp)
    return out


def explain_shapes(dev, model, shapes, *, seed=0, deadline=None) -> tuple[dict, list]:
    """({shape: (model, KLayout or None, TileSchedule or None)} for the shapes explain_shape
    reproduces bit for bit
    at that exact shape, [the others]).  Only devices that name their kernels: the kernel
    table's rows are what explain adds to the split search.  ``deadline``: a time.time()
    after which no shape is explained."""
    if dev.tensors is None or dev.tensors.kernels is None:
        return {}, list(shapes)
    from .explain import explain_shape
    got, rest = {}, []
    for shp in shapes:
        try:
            if deadline is not None and time.time() > deadline:
                raise TimeoutError("the run's time budget was spent")
            e = explain_shape(dev, tuple(shp), base_model=model, seed=seed, budget_s=EXPLAIN_S)
        except Exception:  # a refusal, or no time: the shape goes to per-shape inference
            rest.append(shp)
            continue
        if e.exact:
            got[tuple(shp)] = (e.model, e.layout, e.tiles)
        else:
            rest.append(shp)
    return got, rest


def _schedule_text(model, layout, tiles) -> str:
    from reference.notation import short
    return (short(model) + ("" if layout is None else f" K order {layout.to_dict()}")
            + ("" if tiles is None else f" tiles {tiles.to_dict()}"))


def pick_survivor(dev, survivors, *, seed=0, limit=16):
    """Among candidates that every probe left equivalent, the first (simplest) one that also
    reproduces two random batches (heavy-tailed, cancelling) at the probe shape; None if none
    does.  Narrow outputs can hide a parameter from every probe but not from random sums."""
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
    that fit, a ShapeResult for each of them)."""
    models, results = {}, []
    for shp in shapes:
        t0 = time.perf_counter()
        if progress:
            progress(stage=f"shape {shp}", candidates=1)
        try:
            r = Inference(dev, quick=quick, seed=seed, shape=shp).run()
        except Exception as e:  # e.g. a K this device cannot take
            results.append(ShapeResult(tuple(shp), "error", error=f"{type(e).__name__}: {e}"))
            continue
        if r.status == "fit":
            models[tuple(shp)] = r.model
        results.append(ShapeResult(tuple(shp), r.status, model=r.model,
                                   notes=None if r.status == "fit" else r.notes[:4],
                                   probes_asked=len(r.asked), wall_s=round(time.perf_counter() - t0, 3)))
    return models, results


def probe_device(dev, *, quick=False, outputs=100_000, seed=0, progress=None, per_shape=True,
                 max_shapes=2, shapes=None, shape_deadline=None) -> DeviceResult:
    """Infer + validate one device.  ``outputs`` >= 1: a fit needs a validation that ran.
    ``shape_deadline``: a time.time() after which no per-shape inference starts."""
    if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
        raise ValueError(f"outputs: validated outputs per device must be an integer >= 1, got {outputs!r}")
    t0 = time.perf_counter()
    ev = {"capabilities": dev.caps.to_dict(), "notes": list(dev.notes),
          "extra": {"candidate_grid": grid_summary()}}
    try:
        res = Inference(dev, quick=quick, seed=seed, progress=progress).run()
    except Exception as e:  # the prober itself failed on this device
        ev["notes"].append(traceback.format_exc(limit=4))
        return DeviceResult.decided(identity(dev), decide_status(failure=f"{type(e).__name__}: {e}"),
                                    wall_s=time.perf_counter() - t0, **ev)
    ev.update(probes=res.probes, scans=res.scans, notes=ev["notes"] + res.notes)
    ev["extra"].update(device_calls=res.device_calls, probes_asked=len(res.asked),
                       inference_wall_s=round(res.wall_s, 3))
    _choose_model(dev, ev, res, seed)
    _kernel_row_fallback(dev, ev, res)
    v = None
    if res.status == "fit":
        if progress:
            progress(stage="validation", candidates=1)
        v = _validate_device(dev, res.model, ev, outputs=outputs, seed=seed, quick=quick,
                             progress=progress, per_shape=per_shape, max_shapes=max_shapes,
                             shapes=shapes, shape_deadline=shape_deadline)
    return DeviceResult.decided(identity(dev), decide_status(res.status, v), error=res.error,
                                model=res.model, wall_s=time.perf_counter() - t0, **ev)


def _choose_model(dev, ev, res, seed) -> None:
    """Among survivors the probes left equivalent, the one two random batches confirm
    (res.model is replaced); the open parameters go into the evidence."""
    if res.undetermined:
        ev["extra"]["undetermined"] = res.undetermined
        ev["extra"]["equivalent_candidates"] = len(res.survivors)
        ev["notes"].append(f"{len(res.survivors)} candidates are observationally equivalent on every probe; "
                           f"reported: the simplest (parameters left open: {', '.join(res.undetermined)})")
    if res.status == "fit" and len(res.survivors) > 1:
        pick = pick_survivor(dev, res.survivors, seed=seed + 3)
        if pick is not None and pick != res.survivors[0]:
            res.model = pick.replace(name="inferred")
            ev["notes"].append("the probes left several candidates equivalent; two random batches "
                               "chose this one over the simplest")


def _kernel_row_fallback(dev, ev, res) -> None:
    """No model of the probe family fits, but the kernel table has a row written for this
    device (e.g. Triton imprecise-0: mma.sync fed in a permuted K order the family cannot
    express): that row becomes the model to validate, each shape in the K order explain
    finds for its kernel.  The validation decides the status, as for an inferred model."""
    from .kernels import device_model
    row = device_model(dev.name) if res.status == "no_fit" else None
    if row is None or dev.tensors is None or dev.tensors.kernels is None:
        return
    res.status, res.model = "fit", row.replace(name="kernel-table", output=dev.caps.output)
    ev["extra"]["model_source"] = "kernel table (probes.kernels)"
    ev["notes"].append("no model of the probe family fits every probe; the kernel table's row for "
                       "this device is validated instead, each shape in its kernel's K order")


def kernels_at(dev, shapes, *, seed=0) -> list:
    """[{"shape", "kernels", "family"}]: the kernels ``dev`` runs at each shape, by the
    profiler's names (one profiled call on a random batch each); [] for a device without
    tensor-level calls (the numpy protocol names no kernels)."""
    if dev.tensors is None or dev.tensors.kernels is None or not shapes:
        return []
    from .kernels import kernel_family
    out = []
    for M, N, K in shapes:
        try:
            names = list(dev.kernels(dev.draw(M, N, K, seed)))
        except Exception as e:  # a refusal or a profiler failure: say so, keep the others
            out.append({"shape": [M, N, K], "kernels": [], "family": "", "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        out.append({"shape": [M, N, K], "kernels": names, "family": kernel_family(names)})
    return out


def _validate_device(dev, model, ev, *, outputs, seed, quick, progress, per_shape, max_shapes,
                     shapes, shape_deadline):
    """Per-shape inference of the shapes the model misses, then the full validation."""
    extra = ev["extra"]
    vkw = {} if shapes is None else {"shapes": shapes}
    shape_models, failing = {}, []
    if per_shape and shape_deadline is not None and time.time() > shape_deadline:
        ev["notes"].append("per-shape inference skipped: the run's time budget was spent")
        per_shape = False
    if per_shape:
        # libraries pick the kernel by shape: shapes the model misses on one batch are
        # explained at that exact shape (the kernel table's K orders and splits, where the
        # device names its kernels), else (no split of it explaining them either) inferred
        # on their own before the full validation
        named = dev.tensors is not None and dev.tensors.kernels is not None
        failing = precheck_shapes(dev, model, shapes, seed=seed + 2, split_search_s=0.0 if named else SPLIT_SEARCH_S)
        shape_models, rest = explain_shapes(dev, model, failing, seed=seed + 5, deadline=shape_deadline)
        if shape_models:
            extra["explained_shapes"] = {str(list(k)): _schedule_text(*v) for k, v in shape_models.items()}
        if rest:
            inferred, ev["shapes"] = infer_shapes(dev, rest[:max_shapes], quick=quick, seed=seed,
                                                  progress=progress)
            shape_models.update(inferred)
    v = validate(dev, model, outputs=outputs, seed=seed + 1, shape_models=shape_models,
                 no_split_search=failing, **vkw)
    ev["validation"] = v.record
    extra["per_shape"] = v.per_shape
    if v.errors:
        extra["validation_errors"] = v.errors
    ev["notes"] += v.notes
    unfitted = kernels_at(dev, sorted({tuple(s["shape"]) for s in v.per_shape if s["matches"] != s["outputs"]}),
                          seed=seed + 4)
    if unfitted:  # partial: each uncovered kernel by its profiler name
        extra["unfitted_kernels"] = unfitted
        ev["notes"].append("kernels no model fits, by shape (profiler names): " + "; ".join(
            f"{u['shape']}: {u['family'] or ', '.join(u['kernels']) or u.get('error', '?')}" for u in unfitted))
    mine = (model.split_k, model.split_tile, model.group_size)
    split = {tuple(s["shape"]): (s["split_k"], s.get("split_tile"), s["group_size"]) for s in v.per_shape
             if (s["split_k"], s.get("split_tile"), s["group_size"]) != mine and not s.get("own_model")}
    if split:
        ev["notes"].append("per-shape schedule (the kernel differs by shape): " + ", ".join(
            f"{list(k)} -> split_k={s}" + (f" (slices rounded up to {t})" if t else "") + f", group_size={g}"
            for k, (s, t, g) in sorted(split.items())))
    return v
