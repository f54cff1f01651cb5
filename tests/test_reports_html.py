"""HTML report: content, strict escaping of hostile names, no external fetches, headless Chromium."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reports.html import render_html, write_html
from reports.records import scan_record
from reports.schema import ReportError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "sample_report.json"
ARTIFACTS = ROOT / "artifacts" / "reports"

HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "'><svg onload=alert(2)>",
    "</style><script>alert(3)</script>",
    "</title><script>alert(4)</script>",
    "</textarea></svg><iframe src=//evil.example>",
    "{{ 7*7 }}{% raw %}",
    "&amp;<!--",
]


@pytest.fixture
def sample() -> dict:
    return json.loads(SAMPLE.read_text())


class _Tags(HTMLParser):
    """Every element, attribute and the text inside <style>/<title>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.style_text = []
        self.title_text = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "style":
            self.style_text.append(data)
        if self.stack and self.stack[-1] == "title" and "svg" not in self.stack:
            self.title_text.append(data)


def _parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    p.close()
    return p


def _hostile_report(sample: dict) -> dict:
    r = copy.deepcopy(sample)
    h = iter(HOSTILE * 20)
    r["title"] = next(h)
    r["command"] = next(h)
    r["notes"] = [next(h)]
    r["environment"]["gpu"] = "</style><script>alert(5)</script>"
    r["environment"]["libraries"]["<script>x</script>"] = '"><b>'
    for d in r["devices"]:
        d["name"] = next(h) + d["name"]
        d["backend"] = next(h)
        d["notes"] = [next(h)]
        d["capabilities"][next(h)] = next(h)
        if d["model"] is not None:
            d["model"][next(h)] = next(h)
            d["model_summary"] = next(h)
        if d["status"] == "error":
            d["error"] = next(h)
        for p in d["probes"]:
            p["name"], p["description"], p["parameter"] = next(h), next(h), next(h)
            p["operands"][next(h)] = next(h)
            p["predictions"][next(h)] = next(h)
        for s in d["scans"]:
            s["name"], s["xlabel"], s["ylabel"], s["description"] = next(h), next(h), next(h), next(h)
        if d["validation"] and d["validation"]["mismatches"]:
            d["validation"]["mismatches"][0]["note"] = next(h)
    for c in r["conformance"]["cells"]:
        c["implementation"] = next(h) + c["implementation"]
        c["profile"] = next(h) + c["profile"]
        if c["reason"]:
            c["reason"] = next(h)
        if c["counterexample"]:
            c["counterexample"][next(h)] = next(h)
            c["counterexample"]["note"] = next(h)
    return r


# --- content -----------------------------------------------------------------------------------
def test_sample_page_content(sample):
    html = render_html(sample)
    assert html.startswith("<!DOCTYPE html>")
    # the skipped (unavailable) blackwell-only device is listed compactly, not as a card, and
    # the banner counts only the devices that ran (issue 15)
    assert html.count('class="device-card') == 5
    assert html.count('class="model-card"') == 5
    assert html.count('id="banner-not-hardware"') == 1
    assert html.count("Not run on real hardware.") == 2  # virtual, TE error
    assert "2 of the 5 devices that ran were not run on real hardware" in html
    assert 'id="unavailable">Not available on this machine (1): ' in html
    # model card in words (cuBLAS-like device)
    for words in ["16 products plus the running accumulator are added in one fused step",
                  "keeping 26 (23+3) fraction bits", "truncated, i.e. rounded toward zero (RTZ)",
                  "Every 128 products the partial sum is added (promoted) into a separate FP32 accumulator",
                  "Output: round to nearest, ties to even (RNE) to bfloat16"]:
        assert words in html
    # mismatch table: 12 rows, bit fields, the NaN row decoded from reference.formats
    assert html.count('<tr class="mm-expected">') == 12
    assert "0x7f800000" in html and "0x7fc00000" in html and "NaN involved" in html
    assert "97.4884% bit-exact agreement" in html
    # plots: 3 scans + 1 ULP histogram
    assert html.count('<svg class="plot"') == 4
    # conformance: matrix, a linked counterexample decoded bit by bit
    assert 'class="conformance-matrix"' in html and 'href="#cx-0"' in html and 'id="cx-0"' in html
    assert "448.0 (float8_e4m3fn, exact 7*2^6)" in html
    assert "464.0 (float32, exact 29*2^4)" in html
    # probe evidence: the observed value and the candidates that match it
    assert "observed on the device" in html and html.count('<tr class="hit">') >= 6


def test_bit_diff_marks_only_differing_bits(sample):
    sample["devices"][2]["validation"]["mismatches"] = [{
        "index": [0, 0], "shape": [1, 1, 4], "format": "bfloat16", "expected_bits": "0x3f80",
        "got_bits": "0x3f81", "expected": "1.0", "got": "1.0078125", "ulp": 1}]
    html = render_html(sample)
    row = html[html.index('<tr class="mm-got">'):]
    row = row[:row.index("</tr>")]
    assert row.count('<span class="d">') == 1
    assert '<span class="f f-mantissa" title="mantissa">000000<span class="d">1</span></span>' in row
    assert "1.0078125" in row


def test_plots_handle_log_gaps_and_empty(sample):
    sample["devices"][0]["scans"] = [
        scan_record("gappy", [1, 2, 3, 4], [1e-3, None, 10.0, 1e4], xlabel="K", ylabel="err", yscale="log"),
        scan_record("empty", [], [], xlabel="x", ylabel="y"),
        scan_record("bars", [1, 2, 3], [3, 0, 5], xlabel="x", ylabel="y", kind="bar"),
    ]
    html = render_html(sample)
    assert "no data to plot" in html and ">0.001<" in html and ">10000<" in html
    assert html.count('<rect class="sbar"') == 3


def test_invalid_report_is_refused(sample):
    sample["devices"][0]["status"] = "bogus"
    with pytest.raises(ReportError, match=r"\$.devices\[0\].status"):
        render_html(sample)


# --- escaping ---------------------------------------------------------------------------------
def test_hostile_names_are_escaped(sample):
    html = render_html(_hostile_report(sample))
    p = _parse(html)
    names = [t for t, _ in p.tags]
    for bad in ("script", "img", "iframe", "object", "embed", "link", "base", "form", "textarea"):
        assert bad not in names, f"injected <{bad}>"
    assert names.count("style") == 1 and names.count("svg") == 4
    for tag, attrs in p.tags:
        for k in attrs:
            assert not k.startswith("on"), f"injected event handler {k} on <{tag}>"
    assert "alert" not in "".join(p.style_text)  # nothing escaped the <style> element
    assert "".join(p.title_text) == HOSTILE[0]  # the page title is the text, not markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "{{ 7*7 }}" in html and ">49<" not in html  # no template evaluation of data


def test_hostile_attributes_stay_inside_quotes(sample):
    r = _hostile_report(sample)
    r["conformance"]["cells"][1]["reason"] = '" onmouseover="alert(9)'
    p = _parse(render_html(r))
    titles = [a.get("title") for t, a in p.tags if t == "span" and "title" in a]
    assert '" onmouseover="alert(9)' in titles


# --- no network ---------------------------------------------------------------------------------
_URL_ATTRS = ("src", "srcset", "action", "formaction", "poster", "data", "xlink:href", "background", "ping")


def _assert_offline(html: str) -> None:
    p = _parse(html)
    for tag, attrs in p.tags:
        for k, v in attrs.items():
            assert k not in _URL_ATTRS, f"<{tag} {k}={v!r}>"
            if k == "href":
                assert v.startswith("#"), f"<{tag} href={v!r}> is not an in-page link"
        assert tag not in ("script", "link", "img", "iframe", "base")
    css = "".join(p.style_text)
    assert "url(" not in css and "@import" not in css and "@font-face" not in css
    csp = [a["content"] for t, a in p.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; style-src 'unsafe-inline'; img-src data:"]


def test_no_external_urls(sample):
    html = render_html(sample)
    _assert_offline(html)
    assert not re.search(r"https?:|//[a-z0-9]", html, re.I)
    _assert_offline(render_html(_hostile_report(sample)))


# --- headless Chromium ------------------------------------------------------------------------------
def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not on PATH (CI installs Debian's chromium; apt-get install -y chromium)")
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=90)


def test_chromium_renders_sample(tmp_path, sample):
    page = write_html(sample, tmp_path / "sample_report.html")
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path).stdout
    assert dom.count('class="device-card') == 5   # the skipped device is one compact line, not a card
    assert 'class="model-card"' in dom and 'class="mismatch-table"' in dom
    assert dom.count('<svg class="plot"') == 4 and "<polyline" in dom and '<rect class="bar"' in dom
    assert 'id="conformance"' in dom and 'id="banner-not-hardware"' in dom and 'id="environment"' in dom
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "sample_report.png"
    shot.unlink(missing_ok=True)
    _chromium([f"--screenshot={shot}", "--window-size=1300,11000", page.as_uri()], tmp_path)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chromium_runs_no_injected_markup(tmp_path, sample):
    page = write_html(_hostile_report(sample), tmp_path / "hostile.html")
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path).stdout
    assert 'class="mismatch-table"' in dom  # the page rendered
    assert "<script" not in dom and "<img" not in dom and "<iframe" not in dom
    assert dom.count("<style>") == 1


def test_conformance_independent_column_rendered(sample):
    """The matrix's per-profile independent checks (fp4ref.harness.conform.independent_column) are
    shown, SPEC-literal-only rules included; a matrix without the column renders as before."""
    r = copy.deepcopy(sample)
    if not r.get("conformance"):
        pytest.skip("sample report has no conformance matrix")
    r["conformance"]["independent"] = [
        {"profile": "ocp_mx_floor", "agreed_in_this_run": [], "test_suite": ["gfloat <casts>"],
         "spec_literals_only": ["OCP MX shared-scale rule: SPEC literals only"]},
        {"profile": "torchao_mx_floor", "agreed_in_this_run": ["torchao 0.18.0 to_mx [FLOOR]"],
         "test_suite": [], "spec_literals_only": []}]
    html = render_html(r)
    assert 'id="independent-checks"' in html
    assert "OCP MX shared-scale rule: SPEC literals only" in html
    assert "torchao 0.18.0 to_mx [FLOOR]" in html and "gfloat &lt;casts&gt;" in html
    del r["conformance"]["independent"]
    assert 'id="independent-checks"' not in render_html(r)
