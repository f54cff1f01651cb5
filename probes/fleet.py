"""`fp4ref fleet`: every GPU of a cluster checked against its predicted bits.

One process per GPU, launched by torchrun (RANK / WORLD_SIZE / LOCAL_RANK) or Slurm's srun
(SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, env:// rendezvous), or alone (one rank, no
process group).  Each rank fingerprints (probes.fleet_fingerprint) or fully probes every GEMM
of its GPU, appending one fsync'd JSONL line per finished GEMM to <out>/ranks/rank-NNNNN.jsonl,
so a rerun with the same --out skips what finished.  Rank 0 gathers the results over gloo
(no NCCL; CPU-only nodes work too) and writes <out>/fleet.json (+ fleet.html, health.json).
Exit code on every rank: 0 every GPU healthy, 1 numerics differ, 2 error.
The command itself (reports.fleet.main) writes the reports; this module does the rank's work.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import platform
import time
from pathlib import Path

# one launcher and process-group helper set, shared with verify-exhaustive (re-exported here)
from fp4ref.harness.launch import close_group, first_host, gather, init_group, launch_env, share_code
from .backends import canonical_name

__all__ = ["parser", "launch_env", "first_host", "gpu_identity", "init_group", "list_devices", "run_rank",
           "load_done", "gather", "share_code", "close_group"]


def parser():
    p = argparse.ArgumentParser(prog="fp4ref fleet", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fingerprint", action="store_true",
                      help="quick check against the baseline's models (the default)")
    mode.add_argument("--probe", action="store_true", help="full probe of every GEMM (minutes per GPU)")
    mode.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                      help="compare two fleet reports; exit 1 on regressions")
    p.add_argument("--baseline", help="probe report whose models are the prediction (fingerprint)")
    p.add_argument("--out", help="fleet output directory (reused on a rerun: finished GEMMs are skipped)")
    p.add_argument("--devices", default=None, help="comma-separated names or globs (default: the GPU's "
                   "GEMMs, or every available device on a node without CUDA)")
    p.add_argument("--extra", action="append", default=[],
                   help="module:attr of a Device, a list of them, or a callable returning either")
    p.add_argument("--inject-fault", default=None,
                   help="flip:P (random bit flips, nondeterministic) or drop-tail:T (deterministic)")
    p.add_argument("--fault-ranks", default=None, help="comma-separated ranks given the fault (default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--crafted", type=int, default=512, help="crafted probes per GEMM")
    p.add_argument("--macs", type=int, default=None, help="multiply-adds of random operands per GEMM")
    p.add_argument("--budget-s", type=float, default=60.0, help="time per GPU for random operands")
    p.add_argument("--repeats", type=int, default=2, help="repeats of a mismatching batch")
    p.add_argument("--quick", action="store_true", help="--probe: quick inference")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="process-group timeout")
    p.add_argument("--no-html", action="store_true")
    return p


# --- this rank's GPU -----------------------------------------------------------------------------
def _dist_version(*names) -> str | None:
    from importlib import metadata
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_identity(env: dict, driver: str | None = None) -> dict:
    """Host, GPU index and UUID, driver and library versions of this rank; selects its GPU
    (LOCAL_RANK) when CUDA is present.  Without CUDA the 'uuid' names host and local rank.
    ``driver``: read by the caller (reports' environment probe, a layer above this one)."""
    import torch
    host = platform.node() or "?"
    ident = {"rank": env["rank"], "host": host, "local_rank": env["local_rank"], "gpu_index": None,
             "uuid": f"cpu:{host}:{env['local_rank']}", "name": platform.machine() or "cpu",
             "driver": None, "torch": torch.__version__, "cuda": torch.version.cuda,
             "cublas": _dist_version("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"),
             "triton": _dist_version("triton")}
    if torch.cuda.is_available():
        idx = env["local_rank"] % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        props = torch.cuda.get_device_properties(idx)
        uuid = str(getattr(props, "uuid", "") or "")
        ident.update(gpu_index=idx, name=props.name, driver=driver,
                     uuid=uuid if uuid.startswith("GPU-") else (f"GPU-{uuid}" if uuid else f"{host}:cuda{idx}"))
    return ident


def _load_extra(spec: str) -> list:
    mod, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(mod), attr or "device")
    if callable(obj) and not hasattr(obj, "caps"):
        obj = obj()
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]


def list_devices(args, env: dict) -> list:
    """(name, Device or None, reason) for this rank: detected devices (default: the GPU's
    GEMMs; every available one without CUDA) plus --extra ones, with --inject-fault applied."""
    import torch
    from .backends import detect
    from .fleet_fingerprint import inject_fault
    found = [] if args.extra and args.devices is None else \
        [d for d in detect() if d.status == "available" and (d.default or args.devices)]
    if args.devices is None and torch.cuda.is_available():
        found = [d for d in found if d.kind in ("cuda", "blackwell-only")]
    devs = [d.device for d in found]
    for spec in args.extra:
        devs += _load_extra(spec)
    if args.devices:
        pats = [x.strip() for x in args.devices.split(",") if x.strip()]
        devs = [d for d in devs if any(fnmatch.fnmatch(d.name, q) for q in pats)]
    ranks = None if args.fault_ranks is None else {int(x) for x in args.fault_ranks.split(",") if x.strip()}
    if args.inject_fault and (ranks is None or env["rank"] in ranks):
        devs = [inject_fault(d, args.inject_fault, seed=args.seed + 7919 * env["rank"]) for d in devs]
    return devs


# --- the per-rank JSONL log -----------------------------------------------------------------------
def _log_path(out: Path, rank: int) -> Path:
    return out / "ranks" / f"rank-{rank:05d}.jsonl"


def load_done(path: Path, rank: int, uuid: str) -> dict:
    """{gemm: cell} of finished GEMMs logged for (rank, uuid); a torn last line is ignored."""
    done = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return done
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the line a killed process was writing
        if isinstance(rec, dict) and rec.get("rank") == rank and rec.get("uuid") == uuid and "gemm" in rec:
            done[rec["gemm"]] = rec
    return done


def _append(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _probe_cell(dev, base, args) -> dict:
    """--probe: full inference + validation, then the inferred model against the baseline's."""
    from reference.notation import to_dict
    from .run import probe_device
    t0 = time.perf_counter()
    r = probe_device(dev, quick=args.quick, outputs=20_000 if args.quick else 100_000, seed=args.seed)
    v = r.validation or {}
    cell = {"status": "match", "outputs": v.get("outputs", 0), "mismatches": v.get("outputs", 0) - v.get("matches", 0),
            "shapes": [], "evidence": None, "probe_status": r.status.value}
    model = None if r.model is None else to_dict(r.model)
    if r.status == "error":
        cell.update(status="error", error=r.error or "probe failed")
    elif r.status == "nondeterministic":
        cell.update(status="differs-nondeterministic", evidence={"notes": r.notes[-4:]})
    elif base is not None and model != base.get("model"):
        cell.update(status="differs-deterministic",
                    evidence={"baseline": _short_of(base.get("model")), "inferred": _short_of(model),
                              "status": r.status.value})
    cell["wall_s"] = round(time.perf_counter() - t0, 3)
    return cell


def _short_of(model: dict | None) -> str | None:
    """The short form of a report's model object (None for none, or one that does not parse)."""
    from reference.notation import from_dict, short
    try:
        return short(from_dict(model)) if model else None
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _cell(dev, args, exps, base_devs, share) -> dict:
    from .fleet_fingerprint import DEFAULT_MACS, fingerprint
    if args.probe:
        return _probe_cell(dev, base_devs.get(dev.name), args)
    exp = exps.get(dev.name)
    if exp is None:
        return {"status": "skipped", "outputs": 0, "mismatches": 0, "shapes": [], "evidence": None,
                "notes": ["the baseline has no fit or partial model for this GEMM"], "wall_s": 0.0}
    return fingerprint(dev, exp, seed=args.seed, crafted=args.crafted, macs=args.macs or DEFAULT_MACS,
                       seconds=share, repeats=args.repeats)


def run_rank(args, env: dict, baseline: dict | None, driver: str | None = None) -> dict:
    """Check every GEMM of this rank's GPU; returns {"gpu": identity, "cells": [...]}."""
    from .fleet_fingerprint import baseline_expectations
    t0 = time.perf_counter()
    ident = gpu_identity(env, driver)
    exps = baseline_expectations(baseline) if baseline else {}
    base_devs = {canonical_name(d["name"]): d for d in (baseline or {}).get("devices", [])}
    log = _log_path(Path(args.out), env["rank"])
    done = load_done(log, env["rank"], ident["uuid"])
    result = {"gpu": ident, "cells": [], "error": None}
    try:
        devs = list_devices(args, env)
    except Exception as e:  # a broken --extra or backend: this GPU is an error, the fleet goes on
        result["error"] = f"{type(e).__name__}: {e}"
        devs = []
    todo = [d for d in devs if d.name not in done]
    for d in devs:
        if d.name in done:
            result["cells"].append(dict(done[d.name], resumed=True))
            continue
        left = max(0.0, args.budget_s - (time.perf_counter() - t0))
        share = left / max(1, len(todo))
        todo = todo[1:]
        cell = {"rank": env["rank"], "uuid": ident["uuid"], "gemm": d.name, **_cell(d, args, exps, base_devs, share)}
        _append(log, cell)
        result["cells"].append(dict(cell, resumed=False))
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    return result
