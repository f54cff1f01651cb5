"""Fleet reports: `fp4ref fleet` (the command), the fleet JSON and its schema, the per-GPU
health summary, the self-contained HTML matrix (GPUs x GEMMs) and the comparison of two
fleet reports (`fp4ref fleet --compare OLD NEW`, exit 1 on regressions).

Verdict of a GPU: suspect-hardware (some GEMM differs nondeterministically), numerics-differ
(some GEMM differs deterministically), error (a GEMM or the rank failed, or nothing was
checked), healthy.  Exit code: 1 when any GPU's numerics differ, else 2 on any error, else 0.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jinja2

from fp4ref.harness.io import write_json_atomic, write_text_atomic
from probes.fleet_fingerprint import CELL_STATUSES

from .html import _CSS
from . import checks as C
from .environment import collect_environment, utc_now
from .schema import ReportError, check_report, jsonable, load_json

__all__ = ["FLEET_SCHEMA", "HEALTH_SCHEMA", "VERDICTS", "build_fleet", "check_fleet", "check_health",
           "health_summary", "render_fleet_html", "write_fleet", "compare_fleet", "compare_main",
           "summary_text", "main"]

FLEET_SCHEMA, HEALTH_SCHEMA, FLEET_SCHEMA_VERSION = "fp4ref.fleet", "fp4ref.fleet-health", 1
VERDICTS = ("healthy", "numerics-differ", "suspect-hardware", "error")
_EXIT = {"healthy": 0, "numerics-differ": 1, "suspect-hardware": 1, "error": 2}

_GPU = C.obj({"rank": C.integer(0), "host": C.string, "local_rank": C.integer(0), "gpu_index": C.nullable(C.integer(0)),
              "uuid": C.string, "name": C.string, "driver": C.nullable(C.string), "torch": C.nullable(C.string),
              "cuda": C.nullable(C.string), "cublas": C.nullable(C.string), "triton": C.nullable(C.string),
              "verdict": C.one_of(*VERDICTS), "error": C.nullable(C.string)}, {"wall_s": C.nullable(C.number(0))})
_CELL = C.obj({"rank": C.integer(0), "uuid": C.string, "gemm": C.string, "status": C.one_of(*CELL_STATUSES),
               "outputs": C.integer(0), "mismatches": C.integer(0), "shapes": C.list_of(C.any_json), "evidence": C.any_json,
               "wall_s": C.number(0), "resumed": C.boolean},
              {"notes": C.list_of(C.string), "error": C.string, "probe_status": C.string})
_SUMMARY = C.obj({"gpus": C.integer(0), "gemm_checks": C.integer(0), "exit_code": C.integer(0)},
                 {v: C.integer(0) for v in VERDICTS})
_FLEET = C.obj({"schema": C.string, "schema_version": C.integer(1), "created": C.timestamp, "fp4ref_version": C.string,
                "command": C.string, "mode": C.one_of("fingerprint", "probe"), "baseline": C.nullable(C.string),
                "launcher": C.one_of("torchrun", "slurm", "none"), "world_size": C.integer(1),
                "gpus": C.list_of(_GPU), "cells": C.list_of(_CELL), "summary": _SUMMARY})
_HEALTH_REC = C.obj({"host": C.string, "rank": C.integer(0), "gpu_index": C.nullable(C.integer(0)), "uuid": C.string,
                     "name": C.string, "driver": C.nullable(C.string), "verdict": C.one_of(*VERDICTS),
                     "exit_code": C.integer(0), "evidence": C.list_of(C.any_json)})
_HEALTH = C.obj({"schema": C.string, "schema_version": C.integer(1), "created": C.timestamp, "exit_code": C.integer(0),
                 "records": C.list_of(_HEALTH_REC)})


def _check(obj, schema: str, rule, where: str) -> dict:
    if not isinstance(obj, dict) or obj.get("schema") != schema:
        got = obj.get("schema") if isinstance(obj, dict) else type(obj).__name__
        raise ReportError(f"{where}: not an fp4ref fleet file: $.schema is {got!r}, expected {schema!r}")
    errs: list = []
    rule(obj, "$", errs)
    if obj.get("schema_version") != FLEET_SCHEMA_VERSION:
        errs.append(f"$.schema_version: this fp4ref reads {FLEET_SCHEMA_VERSION}, got {obj.get('schema_version')!r}")
    if errs:
        raise ReportError(f"{where}: invalid {schema} file ({len(errs)} problem(s))", errs)
    return obj


def check_fleet(obj, where: str = "fleet report") -> dict:
    """Raise ReportError (every problem listed with its JSON path) unless ``obj`` is valid."""
    return _check(obj, FLEET_SCHEMA, _FLEET, where)


def check_health(obj, where: str = "health summary") -> dict:
    return _check(obj, HEALTH_SCHEMA, _HEALTH, where)


# --- building ---------------------------------------------------------------------------------------
def _verdict(gpu: dict, cells: list) -> str:
    st = {c["status"] for c in cells}
    if "differs-nondeterministic" in st:
        return "suspect-hardware"
    if "differs-deterministic" in st:
        return "numerics-differ"
    if gpu.get("error") or "error" in st or "match" not in st:
        return "error"  # nothing verified is not healthy
    return "healthy"


def _exit_code(verdicts) -> int:
    codes = {_EXIT[v] for v in verdicts}
    return 1 if 1 in codes else (2 if 2 in codes or not codes else 0)


def build_fleet(results: list, meta: dict) -> dict:
    """A fleet report from the ranks' results ({"gpu", "cells", "error", "wall_s"})."""
    from fp4ref import __version__
    gpus, cells = [], []
    for r in sorted(results, key=lambda r: r["gpu"]["rank"]):
        gpu = dict(r["gpu"], error=r.get("error"), wall_s=r.get("wall_s"))
        gpu["verdict"] = _verdict(gpu, r["cells"])
        gpus.append(gpu)
        cells += r["cells"]
    summary = {v: sum(g["verdict"] == v for g in gpus) for v in VERDICTS}
    summary.update(gpus=len(gpus), gemm_checks=len(cells), exit_code=_exit_code(g["verdict"] for g in gpus))
    return {"schema": FLEET_SCHEMA, "schema_version": FLEET_SCHEMA_VERSION, "created": utc_now(),
            "fp4ref_version": __version__, "command": meta["command"], "mode": meta["mode"],
            "baseline": meta.get("baseline"), "launcher": meta["launcher"], "world_size": meta["world_size"],
            "gpus": gpus, "cells": cells, "summary": summary}


def _evidence(c: dict) -> dict:
    e = {"gemm": c["gemm"], "status": c["status"], "outputs": c["outputs"], "mismatches": c["mismatches"]}
    if c.get("evidence"):
        e["detail"] = c["evidence"]
    if c.get("error"):
        e["error"] = c["error"]
    return e


def health_summary(fleet: dict) -> dict:
    """One record per GPU, health-check style: verdict, exit code and the evidence (every
    non-matching GEMM; for a healthy GPU, the GEMMs that matched and how many outputs)."""
    recs = []
    for g in fleet["gpus"]:
        mine = [c for c in fleet["cells"] if c["rank"] == g["rank"] and c["uuid"] == g["uuid"]]
        bad = [c for c in mine if c["status"] not in ("match", "skipped")]
        ev = [_evidence(c) for c in (bad or [c for c in mine if c["status"] == "match"])]
        if g.get("error"):
            ev.insert(0, {"error": g["error"]})
        recs.append({"host": g["host"], "rank": g["rank"], "gpu_index": g["gpu_index"], "uuid": g["uuid"],
                     "name": g["name"], "driver": g["driver"], "verdict": g["verdict"],
                     "exit_code": _EXIT[g["verdict"]], "evidence": ev})
    return {"schema": HEALTH_SCHEMA, "schema_version": FLEET_SCHEMA_VERSION, "created": fleet["created"],
            "exit_code": fleet["summary"]["exit_code"], "records": recs}


def write_fleet(path, results: list, meta: dict, *, html: bool = True, health=None) -> dict:
    """Build, validate and write a fleet report atomically (+ fleet.html, + health JSON)."""
    report = check_fleet(jsonable(build_fleet(results, meta)), str(path))
    p = write_json_atomic(path, report)
    if html:
        write_text_atomic(p.with_suffix(".html"), render_fleet_html(report))
    if health is not None:
        write_json_atomic(health, check_health(health_summary(report), str(health)))
    return report


# --- HTML --------------------------------------------------------------------------------------------
_FLEET_CSS = """
.matrix td.st{text-align:center;min-width:88px;color:#fff;font-weight:600;font-size:12.5px}
.st-match{background:var(--ok)}.st-differs-deterministic{background:var(--bad)}
.st-differs-nondeterministic{background:#8250df}.st-error{background:#a40e26}
.st-skipped,.st-missing{background:#6e7781}
.v-healthy{color:var(--ok);font-weight:600}.v-numerics-differ,.v-error{color:var(--bad);font-weight:600}
.v-suspect-hardware{color:#8250df;font-weight:600}
"""
_SHORT = {"match": "match", "differs-deterministic": "differs (det.)",
          "differs-nondeterministic": "differs (nondet.)", "error": "error", "skipped": "skipped"}

_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>fp4ref fleet: {{ r.summary.gpus }} GPUs</title><style>{{ css }}</style></head>
<body><main>
<h1>fp4ref fleet ({{ r.mode }})</h1>
<p class="meta">{{ r.created }} &middot; fp4ref {{ r.fp4ref_version }} &middot; launcher {{ r.launcher }},
world size {{ r.world_size }} &middot; baseline <code>{{ r.baseline or "-" }}</code></p>
<p id="summary" class="meta">exit code <b>{{ r.summary.exit_code }}</b>:
{% for v in verdicts %}{{ r.summary[v] }} {{ v }}{% if not loop.last %}, {% endif %}{% endfor %}</p>
<h2>GPUs x GEMMs</h2>
<table class="matrix" id="matrix"><thead><tr><th>rank</th><th>host</th><th>GPU</th><th>UUID</th>
<th>driver</th><th>torch / CUDA / cuBLAS</th><th>verdict</th>
{% for g in gemms %}<th class="mono">{{ g }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr><td class="num">{{ row.gpu.rank }}</td><td>{{ row.gpu.host }}</td>
<td>{{ row.gpu.gpu_index if row.gpu.gpu_index is not none else "-" }} {{ row.gpu.name }}</td>
<td class="mono">{{ row.gpu.uuid }}</td><td>{{ row.gpu.driver or "-" }}</td>
<td>{{ row.gpu.torch or "-" }} / {{ row.gpu.cuda or "-" }} / {{ row.gpu.cublas or "-" }}</td>
<td class="v-{{ row.gpu.verdict }}">{{ row.gpu.verdict }}</td>
{% for c in row.cells %}<td class="st st-{{ c.status }}" title="{{ c.title }}">{{ c.text }}</td>{% endfor %}
</tr>{% endfor %}</tbody></table>
<h2>Evidence</h2>
{% for e in evidence %}<div class="evidence"><h3>rank {{ e.rank }} &middot; <code>{{ e.gemm }}</code>:
{{ e.status }}</h3><pre>{{ e.text }}</pre></div>{% else %}<p>Every checked GEMM matched its model bit for bit.</p>{% endfor %}
</main></body></html>
"""
_TPL = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(_TEMPLATE)


def render_fleet_html(report: dict) -> str:
    """One self-contained page: inline CSS, no scripts, no fetches (CSP), every string escaped."""
    gemms = list(dict.fromkeys(c["gemm"] for c in report["cells"]))
    at = {(c["rank"], c["uuid"], c["gemm"]): c for c in report["cells"]}
    rows = []
    for g in report["gpus"]:
        cells = []
        for name in gemms:
            c = at.get((g["rank"], g["uuid"], name))
            st = c["status"] if c else "missing"
            title = "" if c is None else f"{c['outputs']} outputs, {c['mismatches']} differ"
            cells.append({"status": st, "text": _SHORT.get(st, "-"), "title": title})
        rows.append({"gpu": g, "cells": cells})
    evidence = [{"rank": c["rank"], "gemm": c["gemm"], "status": c["status"],
                 "text": json.dumps(c.get("evidence") or {"error": c.get("error")}, indent=1)}
                for c in report["cells"] if c["status"] not in ("match", "skipped")]
    return _TPL.render(r=report, css=_CSS + _FLEET_CSS, gemms=gemms, rows=rows, evidence=evidence,
                       verdicts=VERDICTS)


# --- comparing two fleet reports ----------------------------------------------------------------------
_RANK = {"match": 3, "skipped": 2, "error": 1, "differs-deterministic": 0, "differs-nondeterministic": 0}


def compare_fleet(old: dict, new: dict) -> list:
    """Regressions of ``new`` against ``old``, one readable line each: a (GPU UUID, GEMM)
    whose status got worse or vanished, a GPU that vanished, a GEMM of a new GPU that is
    not matching."""
    key = lambda c: (c["uuid"], c["gemm"])  # noqa: E731
    o = {key(c): c for c in old["cells"]}
    n = {key(c): c for c in new["cells"]}
    out = []
    gone = {g["uuid"] for g in old["gpus"]} - {g["uuid"] for g in new["gpus"]}
    out += [f"GPU {u}: in the old report, missing from the new one" for u in sorted(gone)]
    for k, c in o.items():
        if k[0] in gone:
            continue
        if k not in n:
            out.append(f"GPU {k[0]} GEMM {k[1]}: was {c['status']}, not checked in the new report")
        elif _RANK[n[k]["status"]] < _RANK[c["status"]]:
            out.append(f"GPU {k[0]} GEMM {k[1]}: {c['status']} -> {n[k]['status']}")
    for k, c in n.items():
        if k not in o and c["status"] not in ("match", "skipped"):
            out.append(f"GPU {k[0]} GEMM {k[1]}: new, {c['status']}")
    return out


def load_fleet(path) -> dict:
    return check_fleet(load_json(path), str(path))


def compare_main(old_path, new_path) -> int:
    try:
        old, new = load_fleet(old_path), load_fleet(new_path)
    except (ReportError, OSError, ValueError) as e:
        print(f"fp4ref fleet --compare: {e}", file=sys.stderr)
        return 2
    regs = compare_fleet(old, new)
    for line in regs:
        print(f"REGRESSION {line}")
    print(f"fleet compare: {len(regs)} regression(s)")
    return 1 if regs else 0


def summary_text(report: dict) -> str:
    s = report["summary"]
    lines = [f"fleet: {s['gpus']} GPU(s), {s['gemm_checks']} GEMM checks: "
             + ", ".join(f"{s[v]} {v}" for v in VERDICTS) + f" (exit {s['exit_code']})"]
    for c in report["cells"]:
        if c["status"] not in ("match", "skipped"):
            ev = c.get("evidence") or {}
            lines.append(f"  rank {c['rank']} {c['uuid']} {c['gemm']}: {c['status']}"
                         + (f" at {ev.get('shape')} ({ev.get('batch')})" if ev else f" {c.get('error', '')}"))
    return "\n".join(lines)


# --- the command ----------------------------------------------------------------------------------------
def _prepare(args):
    from probes.fleet import launch_env
    from probes.fleet_fingerprint import parse_fault
    if not args.out:
        raise ValueError("--out: required (the fleet directory; reuse it to resume)")
    if args.inject_fault:
        parse_fault(args.inject_fault)  # a bad spec fails here, before any rank starts work
    if args.baseline is None and not args.probe:
        raise ValueError("--baseline: required for --fingerprint (a probe report, e.g. "
                         "reports/baselines/h200-580.159.04.json)")
    baseline = check_report(load_json(args.baseline), args.baseline) if args.baseline else None
    return launch_env(), baseline


def main(argv=None) -> int:
    """`fp4ref fleet`: every rank checks its GPU, rank 0 writes the fleet report."""
    from probes import fleet as PF
    argv = list(sys.argv[1:] if argv is None else argv)
    args = PF.parser().parse_args(argv)
    if args.compare:
        return compare_main(*args.compare)
    try:
        env, baseline = _prepare(args)
    except (ValueError, OSError) as e:
        print(f"fp4ref fleet: {e}", file=sys.stderr)
        return 2
    grouped = PF.init_group(env, args.timeout_s)
    try:
        result = PF.run_rank(args, env, baseline, driver=collect_environment()["driver"])
        out = Path(args.out)
        meta = {"command": "fp4ref fleet " + " ".join(argv), "mode": "probe" if args.probe else "fingerprint",
                "baseline": args.baseline, "launcher": env["launcher"], "world_size": env["world_size"]}
        write_fleet(out / "ranks" / f"rank-{env['rank']:05d}.json", [result], meta, html=False)
        results = PF.gather(result, env, grouped)
        code = 0
        if env["rank"] == 0:
            report = write_fleet(out / "fleet.json", results, meta, html=not args.no_html,
                                 health=out / "health.json")
            code = report["summary"]["exit_code"]
            print(summary_text(report))
            print(f"fleet report: {out / 'fleet.json'}")
        return PF.share_code(code, grouped)
    finally:
        PF.close_group(grouped)
