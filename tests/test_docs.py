"""The docs are evidence-bound: the API examples run (doctest), docs/results.md and the
README's probe table are exactly what scripts/render_results.py renders from the committed
JSON under reports/baselines/, and every doc and public name can be found."""
from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _render():
    spec = importlib.util.spec_from_file_location("render_results",
                                                  ROOT / "scripts" / "render_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("doc", ["docs/api.md", "README.md"])
def test_examples_run(doc, monkeypatch):
    # the docs describe a CPU machine's torch paths, never the Triton interpreter
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = doctest.testfile(str(ROOT / doc), module_relative=False, optionflags=FLAGS,
                           verbose=False, report=True)
    assert res.attempted > 0 and res.failed == 0, res


def test_results_md_is_current():
    R = _render()
    assert (ROOT / "docs" / "results.md").read_text() == R.render_results(), \
        "docs/results.md is stale: run python scripts/render_results.py"


def test_readme_probe_table_is_current():
    R = _render()
    text = (ROOT / "README.md").read_text()
    assert text == R.readme_with_table(text), \
        "README's probe table is stale: run python scripts/render_results.py"


def test_rendered_counts_match_the_report():
    """An independent count of the main H200 report's devices by kind and status appears
    verbatim in the README (the figure that once drifted: "17 CUDA" for 16)."""
    import json
    r = json.loads((ROOT / "reports/baselines/h200-580.159.04.json").read_text())
    cuda = sum(d["kind"] == "cuda" for d in r["devices"])
    fit = sum(d["status"] == "fit" for d in r["devices"])
    row = [ln for ln in (ROOT / "README.md").read_text().splitlines()
           if "`h200-580.159.04.json`" in ln and ln.startswith("|")]
    assert len(row) == 1 and f"{cuda} cuda" in row[0] and f"| {fit} |" in row[0], row


def test_every_doc_and_public_name_is_findable():
    readme = (ROOT / "README.md").read_text()
    for p in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{p.name}" in readme, f"README does not link docs/{p.name}"
    import fp4ref
    api = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in fp4ref.__all__ if f"`{n}`" not in api]
    assert not missing, f"docs/api.md does not document: {missing}"
    assert "3.5 h" in readme and "verify-exhaustive" in readme


def test_wrap_example_marker():
    text = (ROOT / "README.md").read_text()
    assert re.search(r"<!-- wrap-example -->\n```python\n.*Device\.wrap\(", text, re.S)


def test_blackwell_prediction_table_is_current():
    import importlib.util
    spec = importlib.util.spec_from_file_location("blackwell_table", ROOT / "scripts/blackwell_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.table() in (ROOT / "docs/blackwell.md").read_text(), \
        "docs/blackwell.md: rerun `python scripts/blackwell_table.py` and paste its table"
