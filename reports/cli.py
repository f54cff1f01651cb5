"""`fp4ref <command>`: the command table and entry point (the console script), plus the
commands of this layer: `fp4ref report` (JSON -> HTML) and `fp4ref gate` (fail on numerics
changes vs a baseline).

The table lives here, in the top layer, because it names commands of every layer below
(probes, the harness of fp4ref); `python -m fp4ref` reaches it through fp4ref/__main__.py.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from fp4ref.harness.io import write_json_atomic

from .records import new_report
from .schema import (CONFORMANCE_SCHEMA, ReportError, check_report, load_json, normalize_report,
                     validate_conformance)
from .store import newest_report

__all__ = ["COMMANDS", "main", "report_main", "gate_main", "explain_main", "H200_BASELINE"]

# command -> (module, function, help).  Imported lazily so one broken backend
# never stops the others from running.
COMMANDS = {
    "probe": ("reports.probe_run", "main", "probe native GEMMs and infer their accumulation model"),
    "bench": ("fp4ref.harness.bench", "main", "side-by-side throughput ratios (casts, quantizers, GEMMs)"),
    "verify-exhaustive": ("fp4ref.harness.verify", "main", "all 2**32 float32 inputs per <=8-bit format"),
    "conform": ("fp4ref.harness.conform", "main", "conformance matrix of installed public quantizers"),
    "report": ("reports.cli", "report_main", "render report.json files to self-contained HTML"),
    "gate": ("reports.cli", "gate_main", "fail when numerics changed against a baseline"),
    "fleet": ("reports.fleet", "main", "check every GPU of a cluster against its predicted bits (torchrun/srun)"),
    "validate-shapes": ("probes.shape_validation", "main",
                        "native GEMMs vs their emulation at uniformly random shapes (resumable JSONL log)"),
    "explain": ("reports.cli", "explain_main", "which model and split-K schedule a GEMM runs at a shape"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; exit codes: the command's own, 2 for a usage error (unknown command,
    bad value), 130 when interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fp4ref <command> [args]\n\ncommands:")
        for name, (_, _, h) in COMMANDS.items():
            print(f"  {name:<18} {h}")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"fp4ref: unknown command {cmd!r}; valid choices: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    problem = _device_problem(cmd, rest)
    if problem:
        print(f"fp4ref {cmd}: {problem}", file=sys.stderr)
        return 2
    mod, fn, _ = COMMANDS[cmd]
    try:
        rc = getattr(importlib.import_module(mod), fn)(rest)
    except KeyboardInterrupt:
        print(f"fp4ref {cmd}: interrupted", file=sys.stderr)
        return 130
    except ValueError as e:  # a user error (bad name, value or file) is a message, never a traceback
        print(f"fp4ref {cmd}: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


def _device_problem(cmd: str, rest: list[str]) -> str | None:
    """`--device cuda` on a machine without CUDA: say so before the command starts (the
    commands would fail deep inside torch)."""
    if cmd not in ("bench", "verify-exhaustive"):
        return None
    val = None
    for i, a in enumerate(rest):
        if a == "--device" and i + 1 < len(rest):
            val = rest[i + 1]
        elif a.startswith("--device="):
            val = a.split("=", 1)[1]
    if val is None or not val.startswith("cuda"):
        return None
    import torch
    if torch.cuda.is_available():
        return None
    return (f"--device: {val!r} needs a CUDA GPU, and torch {torch.__version__} sees none here "
            f"(torch.cuda.is_available() is False); use --device cpu")


def _err(msg: str) -> int:
    print(f"fp4ref: {msg}", file=sys.stderr)
    return 2


def _load_any(path: Path) -> dict:
    """A report, or a bare conformance matrix wrapped into a report."""
    obj = load_json(path)
    if isinstance(obj, dict) and obj.get("schema") == CONFORMANCE_SCHEMA:
        errs = validate_conformance(obj)
        if errs:
            raise ReportError(f"{path}: invalid conformance matrix ({len(errs)} problem(s))", errs)
        env = obj.get("environment")
        if not isinstance(env, dict) or _env_problems(env):
            env = {"platform": "not recorded in the conformance JSON", "python": "not recorded",
                   "torch": None, "cuda": None, "driver": None, "gpu": None, "libraries": {}}
        r = new_report(title="fp4ref conformance matrix", environment=env)
        r["conformance"] = obj
        return normalize_report(check_report(r, str(path)))
    return normalize_report(check_report(obj, str(path)))


def _env_problems(env: dict) -> list[str]:
    r = new_report(environment=env)
    return [e for e in check_errors(r) if e.startswith("$.environment")]


def check_errors(r: dict) -> list[str]:
    from .schema import validate_report
    return validate_report(r)


def report_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fp4ref report",
        description="Render a report.json (or a conformance JSON) to one self-contained HTML file.")
    ap.add_argument("--input", type=Path, help="report.json (default: newest reports/*/*/report.json)")
    ap.add_argument("--out", type=Path, help="HTML file to write (default: the input with .html)")
    ap.add_argument("--reports-dir", type=Path, default=Path("reports"),
                    help="where to look for the newest report (default: reports)")
    args = ap.parse_args(argv)
    try:
        src = args.input or newest_report(args.reports_dir)
        report = _load_any(src)
        from .html import write_html
        out = write_html(report, args.out or src.with_suffix(".html"))
    except ReportError as e:
        return _err(str(e))
    except OSError as e:
        return _err(f"cannot write HTML: {e}")
    n = len(report["devices"])
    print(f"fp4ref report: {src} -> {out} ({n} device(s)"
          + (", conformance matrix" if report["conformance"] else "") + ")")
    return 0


def gate_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fp4ref gate",
        description="Compare a report with a baseline. Exit 1 with a readable diff when numerics changed "
                    "or got worse (model parameters, device status, validation agreement, conformance "
                    "cells, tests); exit 0 when equal or better; exit 2 for unreadable input.")
    ap.add_argument("--baseline", type=Path, required=True, help="baseline report, e.g. reports/baselines/h200.json")
    ap.add_argument("--current", type=Path, help="report to check (default: newest reports/*/*/report.json)")
    ap.add_argument("--reports-dir", type=Path, default=Path("reports"),
                    help="where to look for the newest report (default: reports)")
    ap.add_argument("--accept", action="store_true",
                    help="after printing the comparison, record the current report as the new baseline")
    ap.add_argument("--conformance", type=Path, default=None,
                    help="a conformance JSON (fp4ref conform --out) gated with the current report "
                         "(replaces its conformance matrix); --baseline and --current may also be "
                         "conformance JSONs")
    ap.add_argument("--allow-env-mismatch", action="store_true",
                    help="compare even when the baseline ran on other hardware (GPU or CPU model); "
                         "by default that is refused, as every hardware difference would read as a regression")
    args = ap.parse_args(argv)
    try:
        cur_path = args.current or newest_report(args.reports_dir, exclude=[args.baseline])
        current = _load_any(cur_path)
        if args.conformance is not None:
            current["conformance"] = _load_any(args.conformance)["conformance"]
        if args.accept and not args.baseline.exists():
            write_json_atomic(args.baseline, current)
            print(f"fp4ref gate: recorded new baseline {args.baseline} from {cur_path}")
            return 0
        if not args.baseline.exists():
            return _err(f"{args.baseline}: no such baseline; record one with "
                        f"`fp4ref gate --baseline {args.baseline} --current <report.json> --accept`")
        baseline = _load_any(args.baseline)
    except ReportError as e:
        return _err(str(e))
    from .gate import compare_reports, environment_differences
    from .environment import baseline_key
    hard, _ = environment_differences(baseline, current)
    if hard and not (args.allow_env_mismatch or args.accept):
        return _err("gate: refusing to compare reports from different hardware (every difference "
                    "would read as a regression):\n  " + "\n  ".join(hard) + "\n"
                    f"Gate against a baseline recorded on this machine (record one: fp4ref gate "
                    f"--baseline {args.baseline.parent / (baseline_key(current['environment']) + '.json')} "
                    f"--current {cur_path} --accept), "
                    "or pass --allow-env-mismatch to compare anyway")
    result = compare_reports(baseline, current)
    print(result.format(f"{args.baseline} (created {baseline['created']}, fp4ref {baseline['fp4ref_version']})",
                        f"{cur_path} (created {current['created']}, fp4ref {current['fp4ref_version']})"))
    if args.accept:
        write_json_atomic(args.baseline, current)
        print(f"\nfp4ref gate: accepted; {args.baseline} now holds {cur_path}")
        return 0
    return 0 if result.ok else 1


# ---- `fp4ref explain` (issue 13) ----------------------------------------------------------
H200_BASELINE = Path("reports/baselines/redesign/h200-probe-after.json")  # newest committed H200 probe


def _parse_shape(text: str) -> tuple:
    parts = text.replace("x", ",").split(",")
    try:
        t = tuple(int(p) for p in parts)
    except ValueError:
        t = ()
    if len(t) != 3 or min(t) < 1:
        raise ValueError(f"--shape: {text!r} is not M,N,K (three integers >= 1, e.g. 33,77,1000)")
    return t


def _explain_device(name: str):
    """The device ``name`` built here; ValueError naming the valid choices otherwise."""
    from probes.backends import canonical_name, detect
    name = canonical_name(name)
    found = detect(include=lambda s: s.name == name)
    if not found:
        names = sorted({s.name for specs in _backend_specs() for s in specs})
        raise ValueError(f"DEVICE: unknown device {name!r}; valid choices: {', '.join(names)}")
    d = found[0]
    if d.device is None:
        raise ValueError(f"DEVICE: {name} is {d.status} here: {d.reason.splitlines()[0] if d.reason else '?'}")
    return d.device


def _backend_specs():
    from probes.backends import BACKEND_MODULES
    out = []
    for modname in BACKEND_MODULES:
        try:
            out.append(importlib.import_module(modname).candidates())
        except Exception:  # a broken backend names no devices
            continue
    return out


def _explain_base(dev, baseline: Path | None, seed: int):
    """(model, where from): the device's model in the baseline report (default: the H200 one,
    for GPU and virtual devices); else a quick inference."""
    from probes.backends import canonical_name
    from reference.notation import from_dict
    # the H200 report's CPU entries ran on that host's CPU, not this one: no default for them
    paths = [baseline] if baseline is not None else ([] if dev.kind == "cpu" else [H200_BASELINE])
    for p in paths:
        if not p.exists():
            if baseline is not None:
                raise ValueError(f"--baseline: {p} does not exist")
            continue
        for d in load_json(p).get("devices", []):
            if canonical_name(d.get("name", "")) == dev.name and d.get("model"):
                return from_dict(d["model"]), str(p)
        if baseline is not None:
            raise ValueError(f"--baseline: {p} has no model for {dev.name}")
    from probes.infer import Inference
    res = Inference(dev, quick=True, seed=seed).run()
    if res.model is None:
        raise ValueError(f"DEVICE: no baseline model for {dev.name} and a quick inference found none "
                         f"({res.status}); pass --baseline REPORT.json")
    return res.model, "quick inference"


def explain_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fp4ref explain",
        description="Which model and schedule (kernel family, split-K, promotion) a native GEMM runs at "
                    "each shape, found by a few probes at that exact shape; recorded in a schedule table "
                    "(fp4ref.emulate_native reads it).")
    ap.add_argument("device", metavar="DEVICE", help="device name, e.g. cuda-cublas-bfloat16")
    ap.add_argument("--shape", action="append", required=True, help="M,N,K (repeatable)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help=f"report whose model for DEVICE is the starting point (default: {H200_BASELINE} "
                         "if it has DEVICE, else a quick inference)")
    ap.add_argument("--table", type=Path, default=None,
                    help="schedule table JSON to read and extend (default: reports/schedules/<env-key>.json)")
    ap.add_argument("--outputs", type=int, default=4096, help="sampled outputs confirmed per shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--heuristic", action="store_true",
                    help="also read cuBLASLt's heuristic (split-K it would pick) and compare it with the probe")
    args = ap.parse_args(argv)
    shapes = [_parse_shape(s) for s in args.shape]
    if args.outputs < 1:
        raise ValueError(f"--outputs: must be >= 1, got {args.outputs}")
    import probes.explain as X
    from probes.device import DeviceError
    from fp4ref.native import ScheduleTable, env_slug, environment_key
    from reference.notation import short
    dev = _explain_device(args.device)
    base, src = _explain_base(dev, args.baseline, args.seed)
    path = args.table or Path("reports/schedules") / (env_slug(environment_key(dev.name)) + ".json")
    table = ScheduleTable.load(path)
    print(f"fp4ref explain: {dev.name}; base model ({src}): {short(base)}")
    rows = []
    for shp in shapes:
        try:
            e = X.explain_shape(dev, shp, base_model=base, table=table, seed=args.seed, outputs=args.outputs)
        except DeviceError as err:
            print(f"  {shp}: refused by the device: {err}")
            rows.append({"shape": list(shp), "refused": str(err)})
            continue
        rows.append(e.to_dict())
        if args.heuristic:  # a prediction, validated here against the probed split
            h = X.cublaslt_heuristic(dev.name, shp)
            rows[-1]["heuristic"] = {**h, "agrees": h.get("split_k") == e.model.split_k if "split_k" in h else None}
            print(f"  {shp}: cuBLASLt heuristic: {h}")
        split = f"S={e.model.split_k}" + (f"/T{e.model.split_tile}" if e.model.split_tile else "")
        print(f"  {shp}: {short(e.model)}\n    kernels: {e.family or '-'} [{'; '.join(k[:70] for k in e.kernels)}]"
              f"\n    split {split}, source {e.source}, {e.matches}/{e.checked_outputs} sampled outputs "
              f"bit-exact{'' if e.exact else ' (NOT exact)'}, {e.wall_s:.2f} s")
    table.save(path)
    print(f"fp4ref explain: table {path} ({len(table)} shape(s))")
    if args.json is not None:
        write_json_atomic(args.json, {"device": dev.name, "base": short(base), "base_source": src, "shapes": rows})
    return 0 if all(r.get("matches") == r.get("checked_outputs") for r in rows if "matches" in r) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
