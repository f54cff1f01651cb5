"""`fp4ref report` (JSON -> HTML) and `fp4ref gate` (fail on numerics changes vs a baseline)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .schema import (CONFORMANCE_SCHEMA, ReportError, check_report, load_json,
                     new_report, newest_report, normalize_report, validate_conformance,
                     write_json_atomic)

__all__ = ["report_main", "gate_main"]


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
    from .schema import baseline_key
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(report_main())
