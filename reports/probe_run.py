"""`fp4ref probe` (make probe): detect GEMM devices, infer each one's accumulation model,
validate it bit for bit, and write reports/<machine>/<UTC stamp>/report.json (+ HTML).

Devices run in parallel worker processes (``--jobs``); each worker rebuilds its device by
name, so one crashing backend never takes the others down.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from probes.validate import DEFAULT_SHAPES
from probes.workers import RunOptions, load_extras, not_run, run_devices, select, unfinished

from .environment import baseline_key, collect_environment
from .records import device_record, new_report, write_report
from .store import run_dir

__all__ = ["main", "RANDOM_SHAPES_MARGIN_S"]

# Seconds before --time-limit-s at which the random-shape steps stop starting shapes (one
# shape costs ~1-10 s on the H200; a step still running at the limit keeps its logged shapes).
RANDOM_SHAPES_MARGIN_S = 20.0


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
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def parser():
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
    p.add_argument("--random-shapes", type=_int_min(0), default=4,
                   help="after its probe, each device (not virtual ones) is validated at this many "
                        "uniformly drawn shapes (M, N <= 4096, K <= 16384 and the device's max_k; "
                        "refused shapes redrawn) within the time limit (0: none; default 4); "
                        "`fp4ref validate-shapes` is the full form")
    p.add_argument("--random-shapes-log", default=None,
                   help="append the random shapes to this JSONL log (resumed; default: a log per run, "
                        "summarized in the report)")
    p.add_argument("--no-html", action="store_true")
    return p


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


def _list_devices(con, found, extras) -> int:
    from rich.markup import escape
    for d in found:
        why = d.reason.splitlines()[0] if d.reason else ("" if d.default else "(not in the default set)")
        con.print(escape(f"{d.name:42s} {d.status:12s} {why}"))
    for dev, spec in extras:
        con.print(escape(f"{dev.name:42s} {'available':12s} --extra {spec} ({dev.backend})"))
    return 0


def _options(args, found, extras, started: float) -> RunOptions:
    ids = {d.name: (d.name, d.device.backend, d.device.kind, d.device.hardware_run) for d in found if d.device}
    ids.update({dev.name: (dev.name, dev.backend, dev.kind, dev.hardware_run) for dev, _ in extras})
    deadline = None if args.time_limit_s is None else started + args.time_limit_s
    return RunOptions(quick=args.quick, outputs=args.validate_outputs, seed=args.seed,
                      jobs=args.jobs or min(12, os.cpu_count() or 1), time_limit_s=args.time_limit_s,
                      deadline=deadline, max_shapes=args.max_shapes,
                      shape_deadline=time.time() + args.shape_budget_s,
                      extra_specs={dev.name: spec for dev, spec in extras}, identities=ids,
                      random_shapes=args.random_shapes, random_shapes_log=args.random_shapes_log,
                      # the random-shape steps stop by themselves before the report is written
                      random_shapes_until=None if deadline is None else deadline - RANDOM_SHAPES_MARGIN_S)


def main(argv=None) -> int:
    args = parser().parse_args(argv)  # bad numbers: argparse names the option, exit 2
    from rich.console import Console
    from rich.markup import escape
    from probes.backends import detect
    con = Console(stderr=True)
    t0, started = time.perf_counter(), time.time()
    problem = _check_writable(Path(args.out))
    if problem:  # before any work: an unwritable --out must not cost a whole run
        con.print(f"[red]--out {escape(args.out)}: {escape(problem)}")
        return 2
    with con.status("detecting devices ..."):
        found = detect()
    try:
        extras = load_extras(args.extra, found)
    except ValueError as e:
        con.print(f"[red]{escape(str(e))}")
        return 2
    if args.list:
        return _list_devices(con, found, extras)
    avail = [d.name for d in found if d.status == "available"] + [dev.name for dev, _ in extras]
    # no --devices: the default set (hypothesis devices such as virtual-blackwell-* only on request)
    chosen = select(avail, args.devices) if args.devices else \
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
    results = not_run(found, args.devices)
    opts = _options(args, found, extras, started)
    rc = _probe(chosen, opts, results, report, con)
    order = [d.name for d in found] + [dev.name for dev, _ in extras]
    report["devices"] = [device_record(results[n]) for n in order if n in results]
    return _write_and_print(report, out, args, con, t0) or rc


def _probe(chosen, opts, results, report, con) -> int:
    """Probe ``chosen`` into ``results``; an interrupted or crashed run keeps what finished,
    reports the rest as unfinished and says so in the report's notes.  Returns the exit code."""
    from rich.markup import escape
    stopped, rc = None, 0
    try:
        _probe_with_progress(chosen, opts, results, con)
    except KeyboardInterrupt:
        stopped, rc = "interrupted (Ctrl-C) before it finished", 130
    except Exception as e:  # a crash of the tool itself: keep what finished
        stopped, rc = f"not finished: the run crashed ({type(e).__name__}: {e})", 1
        con.print(f"[red]fp4ref probe crashed: {escape(f'{type(e).__name__}: {e}')}")
    if stopped:
        for n in chosen:
            results.setdefault(n, unfinished(n, opts, stopped))
        done = sum(1 for n in chosen if results[n].error != stopped)
        report.setdefault("notes", []).append(f"partial report: {stopped}; {done} of {len(chosen)} "
                                              f"devices finished")
    return rc


class _RichDisplay:
    """probes.workers.Display on a rich progress bar (device names and stages escaped)."""

    def __init__(self, prog, task):
        self.prog, self.task = prog, task

    def show(self, running):
        from rich.markup import escape
        self.prog.update(self.task, description="; ".join(
            f"{escape(name)}: {escape(stage)}" for name, stage in running) or "probing")

    def advance(self):
        self.prog.advance(self.task)


def _probe_with_progress(chosen, opts, results, con):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=con) as prog:
        task = prog.add_task("probing", total=len(chosen))
        run_devices(chosen, opts, results, _RichDisplay(prog, task))


def _summary_table(report, seconds):
    from rich.table import Table
    from rich.text import Text
    table = Table(title=f"fp4ref probe ({seconds:.1f} s)")
    table.add_column("device", overflow="fold")  # full names: wrapped, never cut
    for col in ("status", "inferred model", "validation", "random shapes", "wall s"):
        table.add_column(col, overflow="fold")
    for r in report["devices"]:
        v = r.get("validation")
        vs = f"{v['agreement_pct']:.3f}% of {v['outputs']}" if v else "-"
        mod = (r.get("extra") or {}).get("short") or ((r.get("error") or "").splitlines() or [""])[0][:160]
        table.add_row(Text(r["name"]), Text(r["status"]), Text(mod), Text(vs),
                      Text(_random_cell((r.get("extra") or {}).get("random_shapes"))),
                      Text(f"{r['wall_s']:.1f}" if r.get("wall_s") else "-"))
    return table


def _random_cell(rs) -> str:
    """'3/4 bit-exact (12 refused)' for a device's extra.random_shapes; '-' without one."""
    if not rs:
        return "-"
    if not rs.get("validated"):
        return "none validated" + (f" ({rs['stopped']})" if rs.get("stopped") else "")
    cell = f"{rs['bit_exact_shapes']}/{rs['validated']} bit-exact"
    return cell + (f" ({rs['refused']} refused)" if rs.get("refused") else "")


def _write_and_print(report, out, args, con, t0) -> int:
    from rich.console import Console
    from rich.markup import escape
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
    con.print(escape(f"gate: fp4ref gate --baseline reports/baselines/{baseline_key(report['environment'])}"
                     f".json --current {path}  (add --accept once to record this run as the baseline)"),
              soft_wrap=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
