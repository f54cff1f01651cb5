"""pytest option ``--fp4ref-report PATH``: write the session's per-test outcomes as an fp4ref report.

The file is an "fp4ref.report" v1 document with no devices and a ``tests`` section
(docs/report-schema.md, "test-session reports"), written atomically at session end.
Under pytest-xdist only the controller writes it.  A path ending in .html also gets
the HTML page; otherwise add ``fp4ref report --input PATH``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("fp4ref")
    group.addoption("--fp4ref-report", metavar="PATH", default=None,
                    help="write an fp4ref agreement report (JSON, schema fp4ref.report) of this test "
                         "session to PATH; a PATH ending in .html writes the page and the JSON next to it")


class _Recorder:
    """Registered only in the process that writes (not in xdist workers)."""

    def __init__(self, path: Path, args: list[str]):
        self.path = path
        self.args = args
        self.start = time.time()
        self.tests: dict[str, dict] = {}  # nodeid -> record, first-seen order
        self.written: str | None = None

    def _record(self, nodeid: str, outcome: str, duration: float, message: str | None) -> None:
        rec = self.tests.get(nodeid)
        if rec is None:
            name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
            self.tests[nodeid] = {"nodeid": nodeid, "name": name, "outcome": outcome,
                                  "duration_s": round(duration, 4), "message": message}
            return
        rec["duration_s"] = round(rec["duration_s"] + duration, 4)
        if outcome == "error" and rec["outcome"] != "failed":  # teardown error
            rec["outcome"], rec["message"] = "error", message

    def pytest_runtest_logreport(self, report):
        out = _outcome(report)
        if out is None:  # passing setup / teardown: only time
            if report.nodeid in self.tests:
                self.tests[report.nodeid]["duration_s"] = round(
                    self.tests[report.nodeid]["duration_s"] + report.duration, 4)
            return
        self._record(report.nodeid, out, report.duration,
                     None if out == "passed" else _message(report))

    def pytest_collectreport(self, report):
        if report.failed:
            self._record(report.nodeid or "<collection>", "error", 0.0, _message(report))

    def pytest_sessionfinish(self, session, exitstatus):
        from .html import write_html
        from fp4ref.harness.io import write_json_atomic
        from .records import write_report
        r = build_session_report(self, exitstatus)
        try:
            if self.path.suffix == ".html":
                write_json_atomic(self.path.with_suffix(".json"), r)
                write_html(r, self.path)
            else:
                write_report(r, self.path, html=False)
            self.written = str(self.path)
        except (OSError, ValueError) as e:
            print(f"\nfp4ref: could not write --fp4ref-report {self.path}: {e}", file=sys.stderr)
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter):
        if self.written:
            terminalreporter.write_line(f"fp4ref report written to {self.written}")


def _message(report) -> str | None:
    lr = report.longrepr
    if lr is None:
        return None
    if isinstance(lr, tuple) and len(lr) == 3:  # skip: (file, line, reason)
        return str(lr[2]).removeprefix("Skipped: ")
    crash = getattr(lr, "reprcrash", None)
    msg = getattr(crash, "message", None) if crash is not None else None
    if not msg:
        text = str(lr).strip()
        msg = text.splitlines()[-1] if text else ""
    return msg[:2000]


def _outcome(report) -> str | None:
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpassed" if xfail else "passed"
        if report.failed:
            return "failed"
        return "xfailed" if xfail else "skipped"
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    return None


def pytest_configure(config):
    path = config.getoption("--fp4ref-report", default=None)
    if not path or hasattr(config, "workerinput"):  # xdist workers: the controller writes
        return
    p = Path(path)
    if p.is_dir():
        raise pytest.UsageError(f"--fp4ref-report: {p} is a directory; give a file such as {p}/report.json")
    config.pluginmanager.register(_Recorder(p, list(config.invocation_params.args)), "fp4ref-report-recorder")


def build_session_report(rec: _Recorder, exitstatus: int | None) -> dict:
    """The test-session variant of the report: no devices, a ``tests`` section grouped by module."""
    from .records import new_report
    from .schema import TEST_OUTCOMES
    modules: dict[str, list] = {}
    for t in rec.tests.values():
        modules.setdefault(t["nodeid"].split("::", 1)[0], []).append(t)
    total = {k: 0 for k in TEST_OUTCOMES}
    mods = []
    for mod, tests in modules.items():
        summ: dict[str, int] = {}
        for t in tests:
            summ[t["outcome"]] = summ.get(t["outcome"], 0) + 1
            total[t["outcome"]] += 1
        mods.append({"module": mod, "summary": summ, "tests": tests})
    r = new_report(title="fp4ref test session report", command="pytest " + " ".join(rec.args))
    r["tests"] = {"exitstatus": None if exitstatus is None else int(exitstatus),
                  "duration_s": round(time.time() - rec.start, 3),
                  "summary": {k: v for k, v in total.items() if v}, "args": rec.args, "modules": mods}
    return r
