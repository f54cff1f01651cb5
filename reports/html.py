"""report.json -> one self-contained HTML page (inline CSS and SVG, no scripts, no fetches).

jinja2 with autoescape on renders every string from the report; plots are SVG built by a
template macro from coordinates computed here, so no report text reaches markup unescaped.
A Content-Security-Policy meta tag forbids any network fetch as a second line of defence.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jinja2
from markupsafe import Markup

from fp4ref.harness.io import write_text_atomic
from reference import bits as B
from reference.formats import FORMATS

from .model_card import KIND_WORDS, STATUS_WORDS, describe_model, model_line
from .schema import NONFINITE_BUCKET, check_report, jsonable, normalize_report

__all__ = ["render_html", "write_html"]

PLOT_W, PLOT_H = 640, 260
_ML, _MR, _MT, _MB = 64, 16, 30, 46


# --- plots ---------------------------------------------------------------------------------
def _fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e7:
        return str(int(v))
    return f"{v:.3g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _range(vals: list[float], include_zero: bool) -> tuple[float, float]:
    lo, hi = min(vals), max(vals)
    if include_zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _scan_plot(scan: dict) -> dict:
    """Coordinates, ticks and labels for one scan (line / scatter / bar)."""
    log = scan.get("yscale") == "log"
    xlog = scan.get("xscale") == "log"
    pts = [(float(x), float(y)) for x, y in zip(scan["x"], scan["y"]) if y is not None]
    if log:
        pts = [(x, y) for x, y in pts if y > 0]
    if xlog:
        pts = [(x, y) for x, y in pts if x > 0]
    plot = {"name": scan["name"], "xlabel": scan["xlabel"] + (", log scale" if xlog else ""),
            "ylabel": scan["ylabel"] + (", log scale" if log else ""),
            "description": scan.get("description", ""), "kind": scan.get("kind", "line"),
            "w": PLOT_W, "h": PLOT_H, "x0": _ML, "x1": PLOT_W - _MR, "y0": PLOT_H - _MB, "y1": _MT,
            "points": [], "polyline": "", "bars": [], "xticks": [], "yticks": [], "empty": not pts,
            "npoints": len(scan["x"])}
    if not pts:
        return plot
    xs = [math.log2(p[0]) if xlog else p[0] for p in pts]
    ys = [math.log10(p[1]) if log else p[1] for p in pts]
    xlo, xhi = _range(xs, False)
    if plot["kind"] == "bar":
        xlo, xhi = xlo - 0.5, xhi + 0.5
    ylo, yhi = _range(ys, include_zero=not log and min(ys) >= 0)
    if log:
        ylo, yhi = math.floor(ylo), math.ceil(yhi)
        if ylo == yhi:
            yhi += 1

    def sx(x):
        return _ML + (x - xlo) / (xhi - xlo) * (PLOT_W - _ML - _MR)

    def sy(y):
        return PLOT_H - _MB - (y - ylo) / (yhi - ylo) * (PLOT_H - _MT - _MB)

    for (x0, _), x, y in zip(pts, xs, ys):
        plot["points"].append({"x": f"{sx(x):.1f}", "y": f"{sy(y):.1f}",
                               "label": f"({_fmt_num(x0)}, {_fmt_num(10 ** y if log else y)})"})
    plot["polyline"] = " ".join(f"{p['x']},{p['y']}" for p in plot["points"])
    if plot["kind"] == "bar":
        bw = max(2.0, min(40.0, (PLOT_W - _ML - _MR) / max(len(pts), 1) * 0.7))
        base = sy(max(ylo, 0.0) if not log else ylo)
        for p, x in zip(plot["points"], xs):
            top = float(p["y"])
            plot["bars"].append({"x": f"{sx(x) - bw / 2:.1f}", "y": f"{min(top, base):.1f}",
                                 "w": f"{bw:.1f}", "h": f"{abs(base - top):.1f}", "label": p["label"]})
    if xlog:
        e0, e1 = math.ceil(xlo - 1e-9), math.floor(xhi + 1e-9)
        step = max(1, (e1 - e0) // 10 + 1)
        plot["xticks"] = [{"pos": f"{sx(e):.1f}", "label": _fmt_num(2.0 ** e)} for e in range(e0, e1 + 1, step)]
    else:
        plot["xticks"] = [{"pos": f"{sx(t):.1f}", "label": _fmt_num(t)} for t in _nice_ticks(xlo, xhi, 6)
                          if xlo <= t <= xhi]
    if log:
        plot["yticks"] = [{"pos": f"{sy(e):.1f}", "label": _fmt_num(10.0 ** e) if -4 <= e <= 6 else f"1e{e}"}
                          for e in range(int(ylo), int(yhi) + 1)]
    else:
        plot["yticks"] = [{"pos": f"{sy(t):.1f}", "label": _fmt_num(t)} for t in _nice_ticks(ylo, yhi, 5)
                          if ylo <= t <= yhi]
    return plot


def _hist_plot(hist: dict) -> dict:
    """ULP histogram as a bar chart over categories (0, 1, 2, ..., nonfinite)."""
    keys = list(hist)
    labels = [("NaN" if k == NONFINITE_BUCKET else k) for k in keys]
    counts = [hist[k] for k in keys]
    n = len(keys)
    plot = {"name": "ULP distance of mismatching outputs", "xlabel": "ULP distance (output format)",
            "ylabel": "mismatching outputs", "description": "", "kind": "bars", "w": PLOT_W, "h": PLOT_H,
            "x0": _ML, "x1": PLOT_W - _MR, "y0": PLOT_H - _MB, "y1": _MT, "points": [], "polyline": "",
            "bars": [], "xticks": [], "yticks": [], "empty": n == 0, "npoints": n}
    if not n:
        return plot
    ymax = max(counts)
    ticks = _nice_ticks(0, ymax, 4)
    top = max(ymax, ticks[-1])
    slot = (PLOT_W - _ML - _MR) / n
    bw = min(60.0, slot * 0.7)
    for i, (lab, c) in enumerate(zip(labels, counts)):
        cx = _ML + slot * (i + 0.5)
        h = c / top * (PLOT_H - _MT - _MB)
        plot["bars"].append({"x": f"{cx - bw / 2:.1f}", "y": f"{PLOT_H - _MB - h:.1f}", "w": f"{bw:.1f}",
                             "h": f"{h:.1f}", "label": f"{lab} ULP: {c}"})
        plot["xticks"].append({"pos": f"{cx:.1f}", "label": lab})
    plot["yticks"] = [{"pos": f"{PLOT_H - _MB - t / top * (PLOT_H - _MT - _MB):.1f}", "label": _fmt_num(t)}
                      for t in ticks]
    return plot


# --- values and bits -------------------------------------------------------------------
def _compact(v, limit: int = 240) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    if len(s) > limit:
        n = f" ({len(v)} items)" if isinstance(v, (list, dict)) else ""
        s = s[:limit] + f" ...{n}"
    return s


def _decode_value(v, fmt: str | None) -> str:
    """Decoded display of a hex code (or list of codes) in ``fmt``; '' if not applicable."""
    if fmt not in FORMATS:
        return ""
    vals = v if isinstance(v, list) else [v]
    out = []
    for x in vals[:8]:
        if not isinstance(x, str) or not B.HEX_RE.match(x):
            return ""
        c = int(x, 16)
        if c >= FORMATS[fmt].ncodes:
            return ""
        out.append(B.decode_str(c, fmt))
    if len(vals) > 8:
        out.append(f"... ({len(vals)} values)")
    return ", ".join(out)


def _norm(v):
    if isinstance(v, str) and B.HEX_RE.match(v):
        return int(v, 16)
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


def _probe_view(p: dict) -> dict:
    fmt = p.get("format")
    obs = _norm(p["observed"])
    consistent = p.get("consistent")
    preds = []
    for label, val in p["predictions"].items():
        hit = (label in consistent) if consistent is not None else (_norm(val) == obs)
        preds.append({"label": label, "value": _compact(val), "decoded": _decode_value(val, fmt), "hit": hit})
    return {"name": p["name"], "parameter": p["parameter"], "description": p["description"],
            "operands": [{"key": k, "value": _compact(v)} for k, v in p["operands"].items()],
            "predictions": preds, "observed": _compact(p["observed"]),
            "observed_decoded": _decode_value(p["observed"], fmt), "format": fmt or "",
            "before": p["candidates_before"], "after": p["candidates_after"],
            "nhit": sum(1 for x in preds if x["hit"]), "note": p.get("note", "")}


def _fields_view(code: int, other: int | None, fmt: str) -> list[dict]:
    if other is None:
        return [{"field": n, "bits": [(c, False) for c in b]} for n, b in B.field_bits(code, fmt)]
    return B.bit_diff(other, code, fmt)


def _mismatch_view(m: dict) -> dict:
    fmt = m["format"]
    ce, cg = int(m["expected_bits"], 16), int(m["got_bits"], 16)
    xor = ce ^ cg
    return {"index": m["index"] if not isinstance(m["index"], list) else ", ".join(map(str, m["index"])),
            "shape": " x ".join(map(str, m["shape"])), "format": fmt,
            "exp_hex": B.to_hex(ce, fmt), "got_hex": B.to_hex(cg, fmt),
            "exp_fields": _fields_view(ce, None, fmt), "got_fields": _fields_view(cg, ce, fmt),
            "exp_value": B.decode_str(ce, fmt), "got_value": B.decode_str(cg, fmt),
            "exp_exact": B.exact_str(ce, fmt), "got_exact": B.exact_str(cg, fmt),
            "ulp": "NaN involved" if m["ulp"] is None else m["ulp"],
            "nbits": bin(xor).count("1"), "note": m.get("note", "")}


def _cx_rows(cx: dict) -> list[dict]:
    """Counterexample fields; 'X_bits'/'X_code' hex strings decoded with 'X_format' or 'format'."""
    rows = []
    for k, v in cx.items():
        row = {"key": k, "value": _compact(v, 400), "decoded": "", "fields": None}
        if isinstance(v, str) and B.HEX_RE.match(v):
            stem = k.rsplit("_", 1)[0]
            fmt = cx.get(f"{stem}_format") or cx.get("format")
            if isinstance(fmt, str) and fmt in FORMATS and int(v, 16) < FORMATS[fmt].ncodes:
                c = int(v, 16)
                row["decoded"] = f"{B.decode_str(c, fmt)} ({fmt}, exact {B.exact_str(c, fmt)})"
                row["fields"] = _fields_view(c, None, fmt)
        rows.append(row)
    return rows


def _conformance_view(conf: dict | None) -> dict | None:
    if conf is None:
        return None
    impls, profiles = [], []
    for c in conf["cells"]:
        if c["implementation"] not in impls:
            impls.append(c["implementation"])
        if c["profile"] not in profiles:
            profiles.append(c["profile"])
    grid = {(c["implementation"], c["profile"]): c for c in conf["cells"]}
    cxs, rows = [], []
    for impl in impls:
        row = {"implementation": impl, "cells": []}
        for prof in profiles:
            c = grid.get((impl, prof))
            if c is None:
                row["cells"].append(None)
                continue
            view = {"status": c["status"], "cases": c["cases"], "agree": c["agree"],
                    "reason": c.get("reason") or "", "cx": None}
            if c["status"] == "disagree":
                view["cx"] = len(cxs)
                cxs.append({"id": len(cxs), "implementation": impl, "profile": prof,
                            "cases": c["cases"], "agree": c["agree"], "reason": c.get("reason") or "",
                            "rows": _cx_rows(c["counterexample"]) if c.get("counterexample") else []})
            row["cells"].append(view)
        rows.append(row)
    counts = {s: sum(1 for c in conf["cells"] if c["status"] == s) for s in ("agree", "disagree", "skipped")}
    return {"profiles": profiles, "rows": rows, "counterexamples": cxs, "counts": counts,
            "independent": _independent_view(conf.get("independent"))}


def _independent_view(col) -> list[dict]:
    """The matrix's per-profile independent-checks column (fp4ref.harness.conform.independent_column);
    older matrices have none."""
    if not isinstance(col, list):
        return []
    return [{"profile": str(e.get("profile", "")),
             "checked": [str(x) for x in e.get("agreed_in_this_run", [])] +
                        [str(x) for x in e.get("test_suite", [])],
             "literals": [str(x) for x in e.get("spec_literals_only", [])]}
            for e in col if isinstance(e, dict)]


def _device_view(i: int, d: dict) -> dict:
    v = d["validation"]
    val = None
    if v is not None:
        val = {"outputs": v["outputs"], "matches": v["matches"], "pct": f"{v['agreement_pct']:.4f}".rstrip("0").rstrip("."),
               "mismatched": v["outputs"] - v["matches"],
               "shapes": [" x ".join(map(str, s)) for s in v["shapes"]],
               "rows": [_mismatch_view(m) for m in v["mismatches"]],
               "hist": _hist_plot(v["ulp_histogram"]) if v["ulp_histogram"] else None,
               "max_ulp": max((int(k) for k in v["ulp_histogram"] if k != NONFINITE_BUCKET), default=None),
               "full": v["matches"] == v["outputs"]}
    words = describe_model(d["model"], d["status"], d["notes"])
    # reports since the one notation write model_summary as the card's sentences: shown once
    summary = "" if d["model_summary"] and d["model_summary"] in " ".join(words) else d["model_summary"]
    return {"id": f"device-{i}", "name": d["name"], "backend": d["backend"], "kind": d["kind"],
            "kind_words": KIND_WORDS.get(d["kind"], d["kind"]), "hardware_run": d["hardware_run"],
            "status": d["status"], "status_words": STATUS_WORDS.get(d["status"], d["status"]),
            "error": d["error"], "model": d["model"], "model_words": words,
            "model_line": model_line(d["model"]), "model_summary": summary,
            "model_params": [{"key": k, "value": _compact(val_)} for k, val_ in (d["model"] or {}).items()],
            "capabilities": [{"key": k, "value": _compact(val_)} for k, val_ in d["capabilities"].items()],
            "probes": [_probe_view(p) for p in d["probes"]],
            "scans": [_scan_plot(s) for s in d["scans"]], "validation": val,
            "random_shapes": _random_shapes_view((d.get("extra") or {}).get("random_shapes")),
            "wall_s": d["wall_s"], "notes": d["notes"]}


def _random_shapes_view(rs) -> dict | None:
    """A device's extra.random_shapes (probes.shape_validation.random_shapes_record) as the
    card shows it; reports before issue 13 have none."""
    if not isinstance(rs, dict):
        return None
    rows = []
    for r in rs.get("shapes") or []:
        fm = r.get("first_mismatch")
        rows.append({"shape": " x ".join(map(str, r["shape"])), "matches": r["matches"], "outputs": r["outputs"],
                     "exact": r["matches"] == r["outputs"] and not r.get("error"),
                     "family": r.get("family") or "", "kernels": "; ".join(r.get("kernels") or []),
                     "model": r.get("model") or "", "source": r.get("source") or "",
                     "mismatch": r.get("error") or ("" if not fm else
                                                    f"{fm['index']}: {fm['native_bits']} / {fm['emulated_bits']}")})
    return {**{k: rs.get(k, 0) for k in ("tried", "refused", "validated", "bit_exact_shapes", "outputs",
                                         "bit_exact_outputs")},
            "max_mn": rs.get("max_mn", "?"), "max_k": rs.get("max_k", "?"), "stopped": rs.get("stopped"),
            "refusal": (rs.get("refusal") or "")[:200],
            "all_exact": rs.get("validated", 0) > 0 and rs.get("bit_exact_shapes") == rs.get("validated"),
            "rows": rows}


def _tests_view(t: dict | None) -> dict | None:
    if t is None:
        return None
    order = {"failed": 0, "error": 1, "xpassed": 2, "skipped": 3, "xfailed": 4, "passed": 5}
    mods = []
    for m in t["modules"]:
        summ = m.get("summary") or {}
        if not summ:
            for x in m["tests"]:
                summ[x["outcome"]] = summ.get(x["outcome"], 0) + 1
        tests = sorted(m["tests"], key=lambda x: order.get(x["outcome"], 9))
        mods.append({"module": m["module"], "summary": summ, "tests": tests,
                     "bad": summ.get("failed", 0) + summ.get("error", 0)})
    total = t.get("summary") or {}
    if not total:
        for m in mods:
            for k, c in m["summary"].items():
                total[k] = total.get(k, 0) + c
    return {"modules": mods, "summary": total, "exitstatus": t.get("exitstatus"),
            "duration_s": t.get("duration_s"), "args": " ".join(t.get("args") or [])}


def _view(r: dict) -> dict:
    # devices that could not run here (e.g. CUDA devices on a CPU machine) are one compact
    # list, not a card each, and the banner counts only the devices that ran
    devices = [_device_view(i, d) for i, d in enumerate(r["devices"]) if d["status"] != "skipped"]
    unavailable = [{"name": d["name"], "reason": ((d.get("error") or "").splitlines() or ["not available"])[0]}
                   for d in r["devices"] if d["status"] == "skipped"]
    not_hw = [d for d in devices if not d["hardware_run"]]
    env = r["environment"]
    env_rows = [(k, env.get(k)) for k in ("platform", "python", "torch", "cuda", "driver", "gpu", "host", "cpu")
                if k in env]
    return {"title": r["title"], "created": r["created"], "version": r["fp4ref_version"],
            "schema": f"{r['schema']} v{r['schema_version']}", "command": r["command"], "notes": r["notes"],
            "env_rows": env_rows, "libraries": sorted(env["libraries"].items()),
            "devices": devices, "unavailable": unavailable,
            "not_hw": not_hw, "all_not_hw": bool(devices or unavailable) and len(not_hw) == len(devices),
            "conformance": _conformance_view(r["conformance"]), "tests": _tests_view(r["tests"])}


# --- template --------------------------------------------------------------------------
_CSS = """
:root{--fg:#1b1f24;--mut:#57606a;--bd:#d0d7de;--bg2:#f6f8fa;--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--inf:#0969da}
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--fg);margin:0;background:#fff}
main{max-width:1200px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:26px;margin:0 0 4px}h2{font-size:21px;margin:34px 0 10px;border-bottom:1px solid var(--bd);padding-bottom:4px}
h3{font-size:17px;margin:22px 0 8px}h4{font-size:15px;margin:14px 0 6px}
.meta{color:var(--mut);font-size:13px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
pre{background:var(--bg2);padding:8px;border-radius:6px;white-space:pre-wrap;word-break:break-word}
table{border-collapse:collapse;margin:6px 0 12px;font-size:14px}
th,td{border:1px solid var(--bd);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--bg2);font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.banner{border-radius:6px;padding:10px 14px;margin:10px 0;font-weight:600}
.banner.not-hardware{background:#fff8c5;border:2px solid #d4a72c;color:#4d2d00}
.banner.error{background:#ffebe9;border:2px solid var(--bad);color:#82071e}
.badge{display:inline-block;border-radius:10px;padding:0 9px;font-size:12.5px;font-weight:600;color:#fff;white-space:nowrap}
.s-fit,.c-agree{background:var(--ok)}.s-partial{background:#e8c46a}.s-no_fit,.c-disagree{background:var(--bad)}
.s-nondeterministic{background:#8250df}.s-error{background:#a40e26}.s-skipped,.c-skipped{background:#6e7781}
.hw-yes{background:var(--inf)}.hw-no{background:#bf8700}
.device-card{border:1px solid var(--bd);border-radius:8px;padding:4px 18px 14px;margin:22px 0;box-shadow:0 1px 3px rgba(0,0,0,.05)}
.model-card{background:#f0f7ff;border-left:4px solid var(--inf);padding:6px 14px;margin:10px 0;border-radius:4px}
.model-card ol{margin:6px 0;padding-left:22px}
.help{background:var(--bg2);border-radius:8px;padding:8px 16px;font-size:14px}
.probe{border-top:1px dashed var(--bd);padding-top:6px;margin-top:10px}
tr.hit td{background:#dafbe1}
.observed td{font-weight:600;background:#fff8c5}
.plots{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:6px 0;border:1px solid var(--bd);border-radius:6px;padding:6px;background:#fff}
figcaption{font-size:13px;color:var(--mut);max-width:640px}
svg.plot{width:640px;max-width:100%;height:auto;display:block}
svg.plot text{font-size:11px;fill:#57606a;font-family:system-ui,sans-serif}
svg.plot .axis{stroke:#57606a;stroke-width:1}svg.plot .grid{stroke:#eaeef2;stroke-width:1}
svg.plot .line{fill:none;stroke:#0969da;stroke-width:2}svg.plot .pt{fill:#0969da}
svg.plot .bar{fill:#cf222e;opacity:.85}svg.plot .sbar{fill:#0969da;opacity:.85}
.bits .f{padding:0 2px;border-radius:3px;margin-right:3px}
.bits .f-sign{background:#ffebe9}.bits .f-exponent{background:#ddf4ff}.bits .f-mantissa{background:#dafbe1}
.bits .d{background:var(--bad);color:#fff;font-weight:700;border-radius:2px}
.bits div{white-space:nowrap}
.legend span{margin-right:10px}
.conformance-matrix td{text-align:center;min-width:110px}
.cell{display:block;border-radius:4px;color:#fff;padding:2px 4px}
.cell a{color:#fff}
.mut{color:var(--mut)}
.ok{color:var(--ok);font-weight:600}.bad{color:var(--bad);font-weight:600}
details>summary{cursor:pointer}
.t-failed,.t-error{color:var(--bad);font-weight:600}.t-passed{color:var(--ok)}.t-skipped,.t-xfailed{color:var(--mut)}
@media print{.device-card{break-inside:avoid-page}}
"""

_TEMPLATE = r"""{%- macro svgplot(p) -%}
<figure class="plot-figure">
<svg class="plot" viewBox="0 0 {{ p.w }} {{ p.h }}" width="{{ p.w }}" height="{{ p.h }}" role="img">
<title>{{ p.name }}</title>
<rect x="0" y="0" width="{{ p.w }}" height="{{ p.h }}" fill="#fff"/>
{%- for t in p.yticks %}
<line class="grid" x1="{{ p.x0 }}" x2="{{ p.x1 }}" y1="{{ t.pos }}" y2="{{ t.pos }}"/>
<text x="{{ p.x0 - 6 }}" y="{{ t.pos }}" text-anchor="end" dominant-baseline="middle">{{ t.label }}</text>
{%- endfor %}
{%- for t in p.xticks %}
<line class="axis" x1="{{ t.pos }}" x2="{{ t.pos }}" y1="{{ p.y0 }}" y2="{{ p.y0 + 4 }}"/>
<text x="{{ t.pos }}" y="{{ p.y0 + 16 }}" text-anchor="middle">{{ t.label }}</text>
{%- endfor %}
<line class="axis" x1="{{ p.x0 }}" x2="{{ p.x1 }}" y1="{{ p.y0 }}" y2="{{ p.y0 }}"/>
<line class="axis" x1="{{ p.x0 }}" x2="{{ p.x0 }}" y1="{{ p.y1 }}" y2="{{ p.y0 }}"/>
{%- if p.empty %}<text x="{{ (p.x0 + p.x1) / 2 }}" y="{{ (p.y0 + p.y1) / 2 }}" text-anchor="middle">no data to plot</text>{% endif %}
{%- if p.kind == "bars" %}
{%- for b in p.bars %}<rect class="bar" x="{{ b.x }}" y="{{ b.y }}" width="{{ b.w }}" height="{{ b.h }}"><title>{{ b.label }}</title></rect>{% endfor %}
{%- elif p.kind == "bar" %}
{%- for b in p.bars %}<rect class="sbar" x="{{ b.x }}" y="{{ b.y }}" width="{{ b.w }}" height="{{ b.h }}"><title>{{ b.label }}</title></rect>{% endfor %}
{%- else %}
{%- if p.kind == "line" and p.points|length > 1 %}<polyline class="line" points="{{ p.polyline }}"/>{% endif %}
{%- for q in p.points %}<circle class="pt" cx="{{ q.x }}" cy="{{ q.y }}" r="{{ 3 if p.points|length <= 80 else 1.5 }}"><title>{{ q.label }}</title></circle>{% endfor %}
{%- endif %}
<text x="{{ (p.x0 + p.x1) / 2 }}" y="{{ p.h - 8 }}" text-anchor="middle">{{ p.xlabel }}</text>
<text x="{{ p.x0 - 6 }}" y="14" text-anchor="start">&#8593; {{ p.ylabel }}</text>
</svg>
<figcaption><b>{{ p.name }}</b>{% if p.description %}: {{ p.description }}{% endif %}</figcaption>
</figure>
{%- endmacro -%}
{%- macro fields(fs) -%}
<span class="mono">{% for f in fs %}<span class="f f-{{ f.field }}" title="{{ f.field }}">{% for ch, d in f.bits %}{% if d %}<span class="d">{{ ch }}</span>{% else %}{{ ch }}{% endif %}{% endfor %}</span>{% endfor %}</span>
{%- endmacro -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="fp4ref {{ v.version }}">
<title>{{ v.title }}</title>
<style>{{ css }}</style>
</head>
<body>
<main id="report">
<header>
<h1>{{ v.title }}</h1>
<div class="meta">created {{ v.created }} &middot; fp4ref {{ v.version }} &middot; schema {{ v.schema }}{% if v.command %} &middot; command <code>{{ v.command }}</code>{% endif %}</div>
</header>
{%- if v.all_not_hw %}
<div class="banner not-hardware" id="banner-not-hardware">Nothing in this report was run on real hardware. Every device below is virtual, emulated or skipped: the results test the toolkit, not a GPU.</div>
{%- elif v.not_hw %}
<div class="banner not-hardware" id="banner-not-hardware">{{ v.not_hw|length }} of the {{ v.devices|length }} devices that ran were not run on real hardware ({% for d in v.not_hw %}{{ d.name }}{% if not loop.last %}, {% endif %}{% endfor %}); they are marked below.</div>
{%- endif %}
{%- for n in v.notes %}<p class="note">{{ n }}</p>{% endfor %}

{%- if v.devices or v.conformance %}
<section class="help" id="how-to-read">
<h2 style="border:0;margin-top:8px">How to read this report</h2>
<ul>
<li>A <b>GEMM</b> computes C = A&middot;B. Low-precision GEMMs (bf16, FP8, FP4) differ in <i>how</i> they add the products: how many at once, how many bits they keep, how they round. Those choices change the output bits.</li>
<li>fp4ref treats each GEMM implementation (a <b>device</b>) as a black box. <b>Probes</b> are crafted inputs whose outputs differ between candidate models; each probe rules candidates out until one <b>model</b> is left. The <b>model card</b> says in words what that model does.</li>
<li><b>Validation</b> then runs many random inputs through the device and through the exact reference of the inferred model, and counts outputs that agree <i>bit for bit</i>. Mismatches are listed with their bits: sign | exponent | mantissa, with differing bits in red.</li>
<li><b>ULP distance</b>: how many representable values of the output format lie between the expected and the observed output (1 ULP = neighbouring values).</li>
<li>The <b>conformance matrix</b> checks public quantizers against named rounding profiles; a disagreeing cell shows the first input where they differ.</li>
<li>A yellow <b>not run on real hardware</b> banner means the numbers did not come from a GPU (a virtual model, an emulator, or a GPU that was not available).</li>
</ul>
</section>
{%- endif %}

<section id="summary">
<h2>Summary</h2>
{%- if v.devices %}
<table class="summary-table">
<tr><th>device</th><th>backend</th><th>kind</th><th>real hardware</th><th>status</th><th>inferred model</th><th>validation agreement</th></tr>
{%- for d in v.devices %}
<tr><td><a href="#{{ d.id }}">{{ d.name }}</a></td><td>{{ d.backend }}</td><td>{{ d.kind }}</td>
<td>{% if d.hardware_run %}<span class="badge hw-yes">yes</span>{% else %}<span class="badge hw-no">no</span>{% endif %}</td>
<td><span class="badge s-{{ d.status }}">{{ d.status }}</span></td><td class="mono">{{ d.model_line }}</td>
<td class="num">{% if d.validation %}<span class="{{ 'ok' if d.validation.full else 'bad' }}">{{ d.validation.pct }}%</span> ({{ d.validation.matches }}/{{ d.validation.outputs }}){% else %}<span class="mut">not validated</span>{% endif %}</td></tr>
{%- endfor %}
</table>
{%- else %}<p class="mut">No GEMM device ran in this report.</p>{% endif %}
{%- if v.unavailable %}<p class="mut" id="unavailable">Not available on this machine ({{ v.unavailable|length }}): {% for d in v.unavailable %}<span class="mono">{{ d.name }}</span> ({{ d.reason }}){% if not loop.last %}; {% endif %}{% endfor %}.</p>{% endif %}
{%- if v.conformance %}<p>Conformance: <span class="ok">{{ v.conformance.counts.agree }} agree</span>, <span class="bad">{{ v.conformance.counts.disagree }} disagree</span>, {{ v.conformance.counts.skipped }} skipped (<a href="#conformance">matrix</a>).</p>{% endif %}
{%- if v.tests %}<p>Tests: {% for k, c in v.tests.summary|dictsort %}<span class="t-{{ k }}">{{ c }} {{ k }}</span>{% if not loop.last %}, {% endif %}{% endfor %} (<a href="#tests">details</a>).</p>{% endif %}
</section>

<section id="environment">
<h2>Environment</h2>
<table class="env-table">
{%- for k, val in v.env_rows %}<tr><th>{{ k }}</th><td class="mono">{{ val if val is not none else "-" }}</td></tr>{% endfor %}
{%- if v.libraries %}<tr><th>libraries</th><td class="mono">{% for k, val in v.libraries %}{{ k }} {{ val if val is not none else "(not installed)" }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>{% endif %}
</table>
</section>

{%- if v.devices %}
<section id="devices">
<h2>Devices</h2>
{%- for d in v.devices %}
<article class="device-card status-{{ d.status }}" id="{{ d.id }}">
<h3>{{ d.name }} <span class="badge s-{{ d.status }}">{{ d.status }}</span></h3>
<div class="meta">backend <code>{{ d.backend }}</code> &middot; {{ d.kind_words }}{% if d.wall_s is not none %} &middot; {{ '%.1f'|format(d.wall_s) }} s{% endif %}</div>
{%- if not d.hardware_run %}
<div class="banner not-hardware">Not run on real hardware.
{%- if d.kind == "virtual" %} This is a virtual device: the exact reference playing a known model, used to test the probes themselves.
{%- elif d.kind == "blackwell-only" %} This path needs a Blackwell GPU (sm_100+), which was not available: nothing was measured.
{%- else %} Its outputs come from an emulation or were not measured.{% endif %}</div>
{%- endif %}
{%- if d.error %}<div class="banner error">Error: <pre>{{ d.error }}</pre></div>{% endif %}

<div class="model-card">
<h4>Model card: what this GEMM does</h4>
<p><b>Status:</b> {{ d.status_words }}.</p>
{%- if d.model_words %}
{%- if d.status != "fit" %}<p class="mut">Best candidate so far (not a fit):</p>{% endif %}
<ol class="model-steps">{% for s in d.model_words %}<li>{{ s }}</li>{% endfor %}</ol>
{%- elif d.status == "fit" %}<p class="mut">No parameters recorded.</p>{% endif %}
{%- if d.model_summary %}<p><b>Summary from the probe:</b> {{ d.model_summary }}</p>{% endif %}
{%- if d.model_params %}
<details><summary>Raw model parameters ({{ d.model_params|length }})</summary>
<table class="params">{% for p in d.model_params %}<tr><th class="mono">{{ p.key }}</th><td class="mono">{{ p.value }}</td></tr>{% endfor %}</table>
</details>
{%- endif %}
</div>
{%- if d.capabilities %}
<details><summary>Capabilities</summary><table>{% for c in d.capabilities %}<tr><th class="mono">{{ c.key }}</th><td class="mono">{{ c.value }}</td></tr>{% endfor %}</table></details>
{%- endif %}

{%- if d.probes %}
<h4>Probe evidence ({{ d.probes|length }} probe{{ "s" if d.probes|length != 1 }})</h4>
{%- for p in d.probes %}
<div class="probe">
<p><b>{{ loop.index }}. {{ p.name }}</b> &mdash; decides <code>{{ p.parameter }}</code>. {{ p.description }}<br>
<span class="mut">candidates: {{ p.before }} &rarr; {{ p.after }}{% if p.format %}; values are {{ p.format }} codes{% endif %}</span></p>
<table class="operands"><tr><th colspan="2">operands</th></tr>{% for o in p.operands %}<tr><th class="mono">{{ o.key }}</th><td class="mono">{{ o.value }}</td></tr>{% endfor %}</table>
<table class="predictions"><tr><th>candidate</th><th>predicted</th>{% if p.format %}<th>value</th>{% endif %}<th>matches observed?</th></tr>
{%- for c in p.predictions %}<tr class="{{ 'hit' if c.hit else 'miss' }}"><td>{{ c.label }}</td><td class="mono">{{ c.value }}</td>{% if p.format %}<td class="mono">{{ c.decoded }}</td>{% endif %}<td>{% if c.hit %}<span class="ok">yes</span>{% else %}no{% endif %}</td></tr>{% endfor %}
<tr class="observed"><td>observed on the device</td><td class="mono">{{ p.observed }}</td>{% if p.format %}<td class="mono">{{ p.observed_decoded }}</td>{% endif %}<td></td></tr>
</table>
{%- if p.note %}<p class="mut">{{ p.note }}</p>{% endif %}
</div>
{%- endfor %}
{%- endif %}

{%- if d.scans %}
<h4>Scans</h4>
<div class="plots">{% for s in d.scans %}{{ svgplot(s) }}{% endfor %}</div>
{%- endif %}

<h4>Validation</h4>
{%- if d.validation %}
{%- set val = d.validation %}
<p class="validation-summary"><span class="{{ 'ok' if val.full else 'bad' }}">{{ val.pct }}% bit-exact agreement</span>: {{ val.matches }} of {{ val.outputs }} outputs
{%- if not val.full %}; {{ val.mismatched }} mismatched{% if val.max_ulp is not none %}, at most {{ val.max_ulp }} ULP apart{% endif %}{% endif %}.
Shapes (M x N x K): {% for s in val.shapes[:12] %}{{ s }}{% if not loop.last %}, {% endif %}{% endfor %}{% if val.shapes|length > 12 %} ... ({{ val.shapes|length }} shapes){% endif %}.</p>
{%- if val.hist %}<div class="plots">{{ svgplot(val.hist) }}</div>{% endif %}
{%- if val.rows %}
<p class="legend mut">Bits: <span class="bits"><span class="f f-sign">sign</span><span class="f f-exponent">exponent</span><span class="f f-mantissa">mantissa</span></span> &middot; bits that differ from the expected output are <span class="bits"><span class="d">red</span></span>. Showing {{ val.rows|length }} of {{ val.mismatched }} mismatches.</p>
<table class="mismatch-table">
<tr><th>#</th><th>output index</th><th>shape</th><th>format</th><th></th><th>hex</th><th>bits (s | e | m)</th><th>value</th><th>exact</th><th>ULP</th></tr>
{%- for m in val.rows %}
<tr class="mm-expected"><td rowspan="2">{{ loop.index }}</td><td rowspan="2" class="mono">{{ m.index }}</td><td rowspan="2" class="mono">{{ m.shape }}</td><td rowspan="2">{{ m.format }}</td>
<th>expected</th><td class="mono">{{ m.exp_hex }}</td><td class="bits">{{ fields(m.exp_fields) }}</td><td class="mono">{{ m.exp_value }}</td><td class="mono">{{ m.exp_exact }}</td><td rowspan="2" class="num">{{ m.ulp }}<br><span class="mut">{{ m.nbits }} bit(s) differ</span></td></tr>
<tr class="mm-got"><th>got</th><td class="mono">{{ m.got_hex }}</td><td class="bits">{{ fields(m.got_fields) }}</td><td class="mono">{{ m.got_value }}</td><td class="mono">{{ m.got_exact }}</td></tr>
{%- endfor %}
</table>
{%- endif %}
{%- else %}<p class="mut">Not validated{% if d.status in ("skipped", "error") %} (the device did not run){% endif %}.</p>{% endif %}

{%- if d.random_shapes %}
{%- set rs = d.random_shapes %}
<h4>Random shapes</h4>
<p class="random-shapes-summary">Uniformly drawn shapes (M, N &le; {{ rs.max_mn }}, K &le; {{ rs.max_k }}; refused ones redrawn), native against the emulated schedule of each shape, bit for bit:
{{ rs.tried }} tried, {{ rs.refused }} refused{% if rs.refusal %} (e.g. <span class="mono">{{ rs.refusal }}</span>){% endif %}, {{ rs.validated }} validated, <span class="{{ 'ok' if rs.all_exact else 'bad' }}">{{ rs.bit_exact_shapes }} bit-exact shapes</span>, {{ rs.bit_exact_outputs }} of {{ rs.outputs }} sampled outputs bit-exact{% if rs.stopped %}; {{ rs.stopped }}{% endif %}.</p>
{%- if rs.rows %}
<table class="random-shapes"><tr><th>M x N x K</th><th>bit-exact outputs</th><th>kernel family</th><th>model</th><th>source</th><th>first mismatch (index: native / emulated)</th></tr>
{%- for r in rs.rows %}<tr><td class="mono">{{ r.shape }}</td><td class="num"><span class="{{ 'ok' if r.exact else 'bad' }}">{{ r.matches }}/{{ r.outputs }}</span></td><td class="mono" title="{{ r.kernels }}">{{ r.family }}</td><td class="mono">{{ r.model }}</td><td>{{ r.source }}</td><td class="mono">{{ r.mismatch }}</td></tr>{% endfor %}
</table>
{%- endif %}
{%- endif %}

{%- if d.notes %}<h4>Notes</h4><ul>{% for n in d.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
</article>
{%- endfor %}
</section>
{%- endif %}

{%- if v.conformance %}
{%- set c = v.conformance %}
<section id="conformance">
<h2>Conformance matrix</h2>
<p>Each cell: does the implementation (row) reproduce the named profile (column) bit for bit on every test case? <span class="mut">agree/cases is shown; a dash means the pair was not tested.</span></p>
<table class="conformance-matrix">
<tr><th>implementation \ profile</th>{% for p in c.profiles %}<th>{{ p }}</th>{% endfor %}</tr>
{%- for row in c.rows %}
<tr><th>{{ row.implementation }}</th>
{%- for cell in row.cells %}<td>{% if cell is none %}<span class="mut">&ndash;</span>{% else %}<span class="cell c-{{ cell.status }}"{% if cell.reason %} title="{{ cell.reason }}"{% endif %}>{% if cell.cx is not none %}<a href="#cx-{{ cell.cx }}">{{ cell.status }}</a>{% else %}{{ cell.status }}{% endif %}</span><span class="mut">{% if cell.status != "skipped" %}{{ cell.agree }}/{{ cell.cases }}{% else %}{{ cell.reason }}{% endif %}</span>{% endif %}</td>{% endfor %}
</tr>
{%- endfor %}
</table>
{%- if c.independent %}
<h3 id="independent-checks">Independent checks per profile</h3>
<p class="mut">Which implementations that share no code with the profile checked it (cells that agreed in this run, and the test suite's oracles), and which rules are checked only against the spec's literals.</p>
<table class="independent-checks"><tr><th>profile</th><th>checked by</th><th>SPEC literals only</th></tr>
{%- for e in c.independent %}<tr><th class="mono">{{ e.profile }}</th><td>{% for x in e.checked %}{{ x }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td><td>{% for x in e.literals %}<span class="bad">{{ x }}</span>{% if not loop.last %}<br>{% endif %}{% else %}<span class="mut">&ndash;</span>{% endfor %}</td></tr>{% endfor %}
</table>
{%- endif %}
{%- if c.counterexamples %}
<h3>Counterexamples</h3>
{%- for x in c.counterexamples %}
<div class="counterexample" id="cx-{{ x.id }}">
<h4>{{ x.implementation }} vs {{ x.profile }}</h4>
<p>{{ x.agree }} of {{ x.cases }} cases agree.{% if x.reason %} {{ x.reason }}{% endif %}</p>
{%- if x.rows %}
<table class="cx-table">{% for r in x.rows %}<tr><th class="mono">{{ r.key }}</th><td class="mono">{{ r.value }}</td><td class="mono">{{ r.decoded }}{% if r.fields %}<br><span class="bits">{{ fields(r.fields) }}</span>{% endif %}</td></tr>{% endfor %}</table>
{%- else %}<p class="mut">No counterexample recorded.</p>{% endif %}
</div>
{%- endfor %}
{%- endif %}
</section>
{%- endif %}

{%- if v.tests %}
{%- set t = v.tests %}
<section id="tests">
<h2>Test session</h2>
<p>{% for k, n in t.summary|dictsort %}<span class="t-{{ k }}">{{ n }} {{ k }}</span>{% if not loop.last %}, {% endif %}{% endfor %}
{%- if t.exitstatus is not none %} &middot; pytest exit status {{ t.exitstatus }}{% endif %}{% if t.duration_s is not none %} &middot; {{ '%.1f'|format(t.duration_s) }} s{% endif %}{% if t.args %} &middot; <code>pytest {{ t.args }}</code>{% endif %}</p>
<table class="tests-table"><tr><th>module</th><th>outcomes</th></tr>
{%- for m in t.modules %}<tr><td class="mono">{{ m.module }}</td><td>{% for k, n in m.summary|dictsort %}<span class="t-{{ k }}">{{ n }} {{ k }}</span>{% if not loop.last %}, {% endif %}{% endfor %}</td></tr>{% endfor %}
</table>
{%- for m in t.modules %}
<details class="test-module"{% if m.bad %} open{% endif %}><summary class="mono">{{ m.module }} ({{ m.tests|length }} tests)</summary>
<table><tr><th>test</th><th>outcome</th><th>seconds</th><th>message</th></tr>
{%- for x in m.tests %}<tr><td class="mono">{{ x.name or x.nodeid }}</td><td class="t-{{ x.outcome }}">{{ x.outcome }}</td><td class="num">{% if x.duration_s is not none %}{{ '%.2f'|format(x.duration_s) }}{% endif %}</td><td class="mono">{{ x.message or "" }}</td></tr>{% endfor %}
</table></details>
{%- endfor %}
</section>
{%- endif %}
<footer class="meta" style="margin-top:40px">Generated by fp4ref {{ v.version }} from a {{ v.schema }} JSON file (docs/report-schema.md). Self-contained: no scripts, no network.</footer>
</main>
</body>
</html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=False, lstrip_blocks=False)
_TPL = _ENV.from_string(_TEMPLATE)


def render_html(report: dict) -> str:
    """Validate ``report`` (ReportError if invalid) and render the self-contained page."""
    r = normalize_report(check_report(jsonable(report)))
    return _TPL.render(v=_view(r), css=Markup(_CSS))


def write_html(report: dict, path: "str | os.PathLike") -> Path:
    """Render and write atomically; returns the path."""
    return write_text_atomic(path, render_html(report))
