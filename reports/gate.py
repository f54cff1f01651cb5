"""Compare a report against a baseline: fail on any numerics change or loss, pass on equal or better.

Failures (regressions): a parameter of a fitted model changed, appeared or vanished; a device
vanished, changed kind, lost real-hardware status or moved to a worse/different status;
validation agreement, max ULP, NaN mismatches or validated-output count got worse; a
conformance cell vanished or changed other than towards 'agree', lost cases, lost agreement
or changed its counterexample; a passing test stopped passing.
Improvements are listed and pass; so are neutral changes (new devices, cells or tests, or a
different best candidate of a device that fits neither before nor now).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

from .model_card import model_line
from .schema import NONFINITE_BUCKET

__all__ = ["GateResult", "compare_reports", "STATUS_RANK", "environment_differences"]

# Higher is better.  Equal rank but different status (no_fit <-> nondeterministic) is a change.
STATUS_RANK = {"fit": 4, "partial": 3, "no_fit": 2, "nondeterministic": 2, "error": 1, "skipped": 0}
_GOOD_TESTS = ("passed", "xfailed")


@dataclass
class GateResult:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # neutral: new devices / cells / tests
    checked: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # e.g. library versions differ

    @property
    def ok(self) -> bool:
        return not self.regressions

    def format(self, baseline_label: str = "baseline", current_label: str = "current") -> str:
        c = self.checked
        head = ("fp4ref gate: PASS" + (f" ({len(self.improvements)} improvement(s))" if self.improvements
                                        else " (no numerics changes)")
                if self.ok else f"fp4ref gate: FAIL: {len(self.regressions)} regression(s) against the baseline")
        lines = [head, f"  baseline: {baseline_label}", f"  current:  {current_label}",
                 f"  compared: {c.get('devices', 0)} device(s), {c.get('cells', 0)} conformance cell(s), "
                 f"{c.get('tests', 0)} test(s)"]
        if self.warnings:
            lines += ["", "Warning: the environments differ (differences below may come from them):"] + [
                f"  [env] {w}" for w in self.warnings]
        for title, items, mark in (("Regressions (fail):", self.regressions, "[worse]"),
                                   ("Improvements:", self.improvements, "[better]"),
                                   ("Other changes (not failures):", self.changes, "[new]")):
            if items:
                lines += ["", title] + [f"  {mark} {s}" for s in items]
        if not self.ok:
            lines += ["", "If these changes are intended, record a new baseline: "
                          "fp4ref gate --baseline <baseline.json> --current <report.json> --accept"]
        return "\n".join(lines)


def _v(x) -> str:
    return json.dumps(x) if not isinstance(x, str) else x


def _pct(v: dict) -> Fraction:
    return Fraction(v["matches"], v["outputs"])


def _pct_str(v: dict) -> str:
    return f"{v['agreement_pct']:.4f}".rstrip("0").rstrip(".") + f"% ({v['matches']}/{v['outputs']})"


def _max_ulp(v: dict) -> int:
    return max((int(k) for k in v["ulp_histogram"] if k != NONFINITE_BUCKET), default=0)


def _compare_model(where: str, b: dict, c: dict, r: GateResult) -> None:
    for k in list(b) + [k for k in c if k not in b]:
        if k not in c:
            r.regressions.append(f"{where}: model parameter {k} vanished (was {_v(b[k])})")
        elif k not in b:
            r.regressions.append(f"{where}: model parameter {k} appeared (now {_v(c[k])})")
        elif b[k] != c[k]:
            r.regressions.append(f"{where}: model parameter {k} changed: {_v(b[k])} -> {_v(c[k])}")


def _compare_validation(where: str, b: dict | None, c: dict | None, r: GateResult) -> None:
    if b is None and c is None:
        return
    if b is None:
        r.improvements.append(f"{where}: now validated: {_pct_str(c)}")
        return
    if c is None:
        r.regressions.append(f"{where}: validation missing (was {_pct_str(b)})")
        return
    pb, pc = _pct(b), _pct(c)
    if pc < pb:
        r.regressions.append(f"{where}: agreement worse: {_pct_str(b)} -> {_pct_str(c)}")
    elif pc > pb:
        r.improvements.append(f"{where}: agreement better: {_pct_str(b)} -> {_pct_str(c)}")
    ub, uc = _max_ulp(b), _max_ulp(c)
    if uc > ub:
        r.regressions.append(f"{where}: largest mismatch worse: {ub} -> {uc} ULP")
    elif uc < ub:
        r.improvements.append(f"{where}: largest mismatch smaller: {ub} -> {uc} ULP")
    nb, nc = b["ulp_histogram"].get(NONFINITE_BUCKET, 0), c["ulp_histogram"].get(NONFINITE_BUCKET, 0)
    if nc > nb:
        r.regressions.append(f"{where}: NaN/inf mismatches worse: {nb} -> {nc}")
    elif nc < nb:
        r.improvements.append(f"{where}: NaN/inf mismatches fewer: {nb} -> {nc}")
    if c["outputs"] < b["outputs"]:
        r.regressions.append(f"{where}: fewer outputs validated (coverage worse): "
                             f"{b['outputs']} -> {c['outputs']}")
    elif c["outputs"] > b["outputs"]:
        r.improvements.append(f"{where}: more outputs validated: {b['outputs']} -> {c['outputs']}")


def _compare_device(b: dict, c: dict, r: GateResult) -> None:
    where = f"device {b['name']!r}"
    if b["kind"] != c["kind"]:
        if b.get("backend") == "?":   # reports before 2026-12-01 stored unfinished devices as cpu
            r.changes.append(f"{where}: kind recorded: {b['kind']} (placeholder) -> {c['kind']}")
        else:
            r.regressions.append(f"{where}: kind changed: {b['kind']} -> {c['kind']}")
    if b["status"] != c["status"]:
        msg = f"{where}: status {b['status']} -> {c['status']}"
        if STATUS_RANK[c["status"]] > STATUS_RANK[b["status"]]:
            r.improvements.append(msg)
        else:
            detail = f" ({c['error']})" if c.get("error") else ""
            r.regressions.append(msg + detail)
    if b["hardware_run"] and not c["hardware_run"]:
        r.regressions.append(f"{where}: no longer run on real hardware")
    elif c["hardware_run"] and not b["hardware_run"]:
        r.improvements.append(f"{where}: now run on real hardware")
    if b["status"] == "fit" and c["status"] == "fit":
        _compare_model(where, b["model"], c["model"], r)
    elif c["status"] == "fit":
        r.improvements.append(f"{where}: model inferred: {model_line(c['model'])}")
    elif b["status"] != "fit" and b.get("model") != c.get("model"):
        r.changes.append(f"{where}: best non-fitting candidate changed: "
                         f"{model_line(b.get('model')) or 'none'} -> {model_line(c.get('model')) or 'none'}")
    _compare_validation(where, b.get("validation"), c.get("validation"), r)


def _cell_str(c: dict) -> str:
    return f"{c['status']} ({c['agree']}/{c['cases']})" if c["status"] != "skipped" else "skipped"


def _compare_conformance(b: dict | None, c: dict | None, r: GateResult) -> None:
    if b is None:
        if c is not None:
            r.improvements.append(f"conformance matrix now present ({len(c['cells'])} cells)")
        return
    if c is None:
        r.regressions.append(f"conformance matrix missing (baseline had {len(b['cells'])} cells)")
        return
    cur = {(x["implementation"], x["profile"]): x for x in c["cells"]}
    base = {(x["implementation"], x["profile"]): x for x in b["cells"]}
    r.checked["cells"] = len(base)
    for key, bc in base.items():
        where = f"conformance {key[0]!r} x {key[1]!r}"
        cc = cur.get(key)
        if cc is None:
            r.regressions.append(f"{where}: cell missing (was {_cell_str(bc)})")
            continue
        if bc["status"] != cc["status"]:
            msg = f"{where}: {_cell_str(bc)} -> {_cell_str(cc)}"
            if cc["status"] == "agree":
                r.improvements.append(msg)
            else:
                reason = f": {cc['reason']}" if cc.get("reason") else ""
                r.regressions.append(msg + reason)
            continue
        if cc["status"] == "skipped":
            continue
        if cc["cases"] < bc["cases"]:
            r.regressions.append(f"{where}: fewer cases: {bc['cases']} -> {cc['cases']}")
        elif cc["cases"] > bc["cases"]:
            r.improvements.append(f"{where}: more cases: {bc['cases']} -> {cc['cases']}")
        if cc["status"] == "disagree":
            fb = Fraction(bc["agree"], bc["cases"] or 1)
            fc = Fraction(cc["agree"], cc["cases"] or 1)
            if fc < fb:
                r.regressions.append(f"{where}: agreement worse: {_cell_str(bc)} -> {_cell_str(cc)}")
            elif fc > fb:
                r.improvements.append(f"{where}: agreement better: {_cell_str(bc)} -> {_cell_str(cc)}")
            if bc.get("counterexample") != cc.get("counterexample"):
                r.regressions.append(f"{where}: counterexample changed: {_v(bc.get('counterexample'))} -> "
                                     f"{_v(cc.get('counterexample'))}")
    for key, cc in cur.items():
        if key not in base:
            r.changes.append(f"conformance {key[0]!r} x {key[1]!r}: new cell, {_cell_str(cc)}")


def _test_outcomes(t: dict | None) -> dict[str, str]:
    if not t:
        return {}
    return {x["nodeid"]: x["outcome"] for m in t["modules"] for x in m["tests"]}


def _compare_tests(b: dict | None, c: dict | None, r: GateResult) -> None:
    tb, tc = _test_outcomes(b), _test_outcomes(c)
    r.checked["tests"] = len(tb)
    for nid, ob in tb.items():
        oc = tc.get(nid)
        if oc is None:
            (r.regressions if ob in _GOOD_TESTS else r.changes).append(f"test {nid}: gone (was {ob})")
        elif ob in _GOOD_TESTS and oc not in _GOOD_TESTS:
            r.regressions.append(f"test {nid}: {ob} -> {oc}")
        elif ob not in _GOOD_TESTS and oc in _GOOD_TESTS:
            r.improvements.append(f"test {nid}: {ob} -> {oc}")
    new = [n for n in tc if n not in tb]
    if new:
        r.changes.append(f"{len(new)} new test(s)" + (f": {', '.join(new[:5])}" + (" ..." if len(new) > 5 else "")))


_UNRECORDED = (None, "", "not recorded", "not recorded in the conformance JSON")


def _ran(report: dict, kind: str) -> bool:
    return any(d["kind"] == kind and d["status"] != "skipped" for d in report["devices"])


def environment_differences(baseline: dict, current: dict) -> tuple[list[str], list[str]]:
    """(hardware, software) differences between the two reports' environments.  Hardware:
    the GPU, or the CPU model / ISA where CPU devices ran (values recorded on both sides
    only).  Software: torch, CUDA, driver and library versions."""
    be, ce = baseline.get("environment") or {}, current.get("environment") or {}
    bx, cx = be.get("extra") or {}, ce.get("extra") or {}
    hard, soft = [], []

    def diff(out, what, b, c):
        if b not in _UNRECORDED and c not in _UNRECORDED and b != c:
            out.append(f"{what}: baseline {_v(b)}, current {_v(c)}")
    gb, gc = be.get("gpu"), ce.get("gpu")
    if (gb or gc) and gb != gc and not (be.get("platform") in _UNRECORDED or ce.get("platform") in _UNRECORDED):
        hard.append(f"GPU: baseline {gb or 'none (CPU only)'}, current {gc or 'none (CPU only)'}")
    if _ran(baseline, "cpu") and _ran(current, "cpu"):
        diff(hard, "CPU architecture", be.get("cpu"), ce.get("cpu"))
        diff(hard, "CPU model", bx.get("cpu_model"), cx.get("cpu_model"))
        diff(hard, "CPU ISA extensions", bx.get("cpu_isa"), cx.get("cpu_isa"))
    for k, what in (("torch", "torch"), ("cuda", "CUDA"), ("driver", "driver")):
        diff(soft, what, be.get(k), ce.get(k))
    bl, cl = be.get("libraries") or {}, ce.get("libraries") or {}
    for lib in sorted(set(bl) & set(cl)):
        diff(soft, lib, bl[lib], cl[lib])
    return hard, soft


def compare_reports(baseline: dict, current: dict) -> GateResult:
    """Both arguments are validated, normalized reports (schema.load_report).  Environment
    differences are listed as warnings (the caller refuses hardware differences)."""
    r = GateResult()
    hard, soft = environment_differences(baseline, current)
    r.warnings = hard + soft
    if not current["devices"] and current.get("conformance") is not None:
        # a conformance matrix alone: gate its cells, not the baseline's devices
        r.changes.append("devices not compared: the current input is a conformance matrix only")
        _compare_conformance(baseline.get("conformance"), current.get("conformance"), r)
        return r
    cur = {d["name"]: d for d in current["devices"]}
    r.checked["devices"] = len(baseline["devices"])
    for bd in baseline["devices"]:
        cd = cur.get(bd["name"])
        if cd is None:
            r.regressions.append(f"device {bd['name']!r}: disappeared (was {bd['status']})")
        else:
            _compare_device(bd, cd, r)
    names = {d["name"] for d in baseline["devices"]}
    for cd in current["devices"]:
        if cd["name"] not in names:
            r.changes.append(f"device {cd['name']!r}: new, status {cd['status']}")
    _compare_conformance(baseline.get("conformance"), current.get("conformance"), r)
    _compare_tests(baseline.get("tests"), current.get("tests"), r)
    return r
