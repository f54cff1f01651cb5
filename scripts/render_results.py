"""Render docs/results.md (and the README's probe table) from the committed JSON evidence
under reports/baselines/, so no figure in the docs can drift from the file it came from.

    python scripts/render_results.py           # rewrite docs/results.md and the README table
    python scripts/render_results.py --check   # exit 1 when either is out of date

Every number printed here is read from a JSON file named beside it; nothing is typed by
hand.  tests/test_docs.py re-renders in memory and compares the text.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASELINES = ROOT / "reports" / "baselines"
RESULTS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
TABLE_START = "<!-- probe-table:start (scripts/render_results.py) -->"
TABLE_END = "<!-- probe-table:end -->"
STATUSES = ("fit", "partial", "no_fit", "nondeterministic", "error", "timeout", "skipped")


def _load_all(folder: Path) -> dict[str, dict]:
    """name -> parsed JSON of every *.json directly in folder (sorted: stable output)."""
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _kind(doc) -> str:
    if not isinstance(doc, dict):
        return "other"
    if doc.get("schema") == "fp4ref.report":
        return "probe"
    if isinstance(doc.get("rows"), list):
        return "bench"
    if "inputs_per_format_mode" in doc:
        return "verify"
    if doc.get("schema") == "fp4ref.conformance":
        return "conform"
    if doc.get("schema") in ("fp4ref.fleet", "fp4ref.fleet-health"):
        return "fleet"
    return "other"


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:.1f}%"


def _cell(v) -> str:
    """A markdown table cell: pipes escaped, newlines flattened, never truncated."""
    return "" if v is None else str(v).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def _env_line(env: dict) -> str:
    keys = ("gpu", "driver", "cuda", "torch", "python", "cpu")
    return ", ".join(f"{k} {env[k]}" for k in keys if env.get(k))


def _validation(v) -> str:
    if not isinstance(v, dict) or not v.get("outputs"):
        return ""
    return f"{v['matches']:,} of {v['outputs']:,} ({v['agreement_pct']:.3f}%)"


def status_counts(report: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in report["devices"]:
        counts[d["status"]] = counts.get(d["status"], 0) + 1
    return counts


def kind_counts(report: dict) -> str:
    counts: dict[str, int] = {}
    for d in report["devices"]:
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def render_probe(name: str, r: dict) -> list[str]:
    env = r.get("environment") or {}
    out = [f"### `{name}`", "", f"Created {r.get('created')}; {_env_line(env)}; command "
           f"`{r.get('command', '')}`.  Devices: {len(r['devices'])} ({kind_counts(r)}).", ""]
    rows = [[f"`{d['name']}`", d["kind"], d["status"], "yes" if d.get("hardware_run") else "no",
             _validation(d.get("validation")),
             "" if d.get("wall_s") is None else f"{d['wall_s']:.1f}",
             d.get("model_summary") or d.get("error") or ""] for d in r["devices"]]
    return out + _table(["device", "kind", "status", "hardware", "bit-exact validation",
                         "wall s", "model (or error)"], rows) + [""]


def _quant_rows(rows) -> list[list]:
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["name"], "skipped", "", "", "", r.get("reason", "")])
            continue
        dev = r.get("frac_copy_bw_logical_device")
        ratio = r.get("ratio_public_internal")
        out.append([r["name"], f"{r['seconds'] * 1e6:.1f}", _pct(r.get("frac_copy_bw")),
                    _pct(dev), "" if ratio is None else f"{ratio:.2f}", r.get("note", "")])
    return out


def render_bench(name: str, b: dict) -> list[str]:
    out = [f"### `{name}`", "", f"device {b.get('device')}, GPU {b.get('gpu')}, torch "
           f"{b.get('torch')}.", ""]
    by = {}
    for r in b["rows"]:
        by.setdefault(r.get("section", "?"), []).append(r)
    if "quant" in by:
        out += ["Quantizers (fraction of copy bandwidth for the bytes moved; device time "
                "alone; public/internal time ratio):", ""]
        out += _table(["quantizer", "us per call", "of copy bw", "device time only",
                       "public/internal", "note"], _quant_rows(by["quant"])) + [""]
    if "cast" in by:
        rows = [[r.get("name"), _pct(r.get("ratio")), _pct(r.get("target")),
                 r.get("meets_target")] for r in by["cast"] if "ratio" in r]
        out += ["Casts (fraction of the baseline's bandwidth):", ""]
        out += _table(["cast", "of baseline", "target", "meets target"], rows) + [""]
    if "gemm" in by:
        rows = [[r.get("method"), r.get("size"), f"{r['tflops']:.3f}",
                 _pct(r.get("fraction_of_cublas_bf16")), r.get("note", "")]
                for r in by["gemm"] if "tflops" in r]
        out += ["GEMMs:", ""] + _table(["method", "size", "TFLOP/s", "of cuBLAS bf16", "note"],
                                       rows) + [""]
    return out


def render_verify(name: str, v: dict) -> list[str]:
    n = len(v.get("results", {}))
    return [f"### `{name}`", "", f"All {v['inputs_per_format_mode']:,} float32 inputs x {n} "
            f"formats x modes {', '.join(v['modes'])} x backends {', '.join(v['backends'])} "
            f"on {v['device']}: {v['mismatches']} mismatches, ok = {v['ok']}, "
            f"{v['seconds']:.1f} s.", ""]


def render_conform(name: str, c: dict) -> list[str]:
    counts: dict[str, int] = {}
    for cell in c["cells"]:
        counts[cell["status"]] = counts.get(cell["status"], 0) + 1
    rows = [[cell["implementation"], cell["profile"], cell["status"],
             f"{cell.get('agree')}/{cell.get('cases')}", cell.get("reason", "")]
            for cell in c["cells"]]
    return ([f"### `{name}`", "", f"{len(c['cells'])} cells: " +
             ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", ""]
            + _table(["implementation", "profile", "status", "agree/cases", "reason"], rows)
            + [""])


def render_fleet(name: str, f: dict) -> list[str]:
    """A fleet report (GPUs x GEMMs) or its health summary: one row per GPU."""
    recs = f.get("records") or f.get("gpus") or []
    rows = []
    for r in recs:
        ev = r.get("evidence") or [c for c in f.get("cells", []) if c.get("rank") == r.get("rank")]
        def gemms(pick):
            return ", ".join(e.get("gemm", "?") for e in ev if pick(e.get("status"))) or "-"
        rows.append([f"{r.get('host')}:{r.get('gpu_index')}", r.get("name", ""), r.get("driver", ""),
                     r.get("verdict", ""), str(len(ev)),
                     gemms(lambda s: s not in ("match", "skipped", None)),
                     gemms(lambda s: s == "skipped")])
    return ([f"### `{name}`", "", f"{f.get('mode', 'health')}: exit code "
             f"{f.get('exit_code', f.get('summary', {}).get('exit_code', '?'))}.", ""]
            + _table(["GPU", "name", "driver", "verdict", "GEMMs", "not matching",
                     "skipped (no validated model in the baseline)"], rows) + [""])


_RENDER = {"probe": render_probe, "bench": render_bench, "verify": render_verify,
           "conform": render_conform, "fleet": render_fleet}
_TITLES = {"probe": "Probe reports (`make probe`)", "bench": "Benchmarks (`make bench`)",
           "verify": "Exhaustive verification (`make verify-exhaustive`)",
           "conform": "Conformance matrices (`make conform`)",
           "fleet": "Fleet checks (`fp4ref fleet`)", "other": "Other evidence"}


def render_results(folder: Path = BASELINES) -> str:
    docs = _load_all(folder)
    out = ["# Results: every figure rendered from reports/baselines/", "",
           "Generated by `scripts/render_results.py` from the committed JSON files named in "
           "each heading; do not edit by hand (tests/test_docs.py checks it is current).", ""]
    for kind in ("probe", "bench", "verify", "conform", "fleet", "other"):
        names = [n for n, d in docs.items() if _kind(d) == kind]
        if not names:
            continue
        out += [f"## {_TITLES[kind]}", ""]
        for n in names:
            out += _RENDER[kind](n, docs[n]) if kind in _RENDER else [f"- `{n}`"]
        out += [""] if kind == "other" else []
    return "\n".join(out).rstrip() + "\n"


def probe_table(folder: Path = BASELINES) -> str:
    """README table: one row per committed probe report."""
    rows = []
    for n, r in _load_all(folder).items():
        if _kind(r) != "probe":
            continue
        env, c = r.get("environment") or {}, status_counts(r)
        rows.append([env.get("gpu") or "CPU only", f"{env.get('driver')} / torch {env.get('torch')}",
                     f"`{n}`", f"{len(r['devices'])} ({kind_counts(r)})"]
                    + [c.get(s, 0) for s in ("fit", "partial")]
                    + [sum(c.get(s, 0) for s in ("no_fit", "nondeterministic", "error",
                                                 "timeout")), c.get("skipped", 0)])
    return "\n".join(_table(["GPU", "driver / torch", "report", "devices", "fit", "partial",
                             "no fit / error / unfinished", "not run (Blackwell only)"], rows))


def readme_with_table(text: str, folder: Path = BASELINES) -> str:
    a, b = text.index(TABLE_START), text.index(TABLE_END)
    return text[:a] + TABLE_START + "\n" + probe_table(folder) + "\n" + text[b:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="render_results.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only report whether files are current")
    args = ap.parse_args(argv)
    want = {RESULTS: render_results(), README: readme_with_table(README.read_text())}
    stale = [p for p, t in want.items() if not p.exists() or p.read_text() != t]
    if args.check:
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)} (run python scripts/render_results.py)")
        return 1 if stale else 0
    from fp4ref.harness.io import write_text_atomic
    for p in stale:
        write_text_atomic(p, want[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
