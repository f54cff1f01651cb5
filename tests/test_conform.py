"""Conformance matrix: cells, shrunk decoded counterexamples, skipped cells, JSON output."""
import json
import os

import pytest

from fp4ref.harness import conform as C
from fp4ref.harness import thirdparty as tp


def test_cell_list_covers_the_brief():
    names = C.cell_names()
    for want in ("NVFP4QuantizerRef [1x16, rowwise]", "NVFP4QuantizerRef [16x16, columnwise]",
                 "RHT", "4over6 MAE", "nvfp4_quantize [two-level]", "nvfp4_quantize [one-level]",
                 "to_nvfp4 [two-level]", "to_mx [FLOOR, float4_e2m1fn]",
                 "to_mx [RCEIL, float8_e5m2]", "to_mx [EVEN, float6_e2m3fn]",
                 "to_mx [CEIL, float6_e3m2fn]", "to_mxfp [mxfp4]"):
        assert any(want in n for n in names), want
    from reference.recipes import RECIPE_PROFILES
    for s in C._cells():
        assert s.profile in RECIPE_PROFILES, s.profile


def test_disagreement_is_shrunk_and_decoded():
    # a deliberately wrong pairing: torchao FLOOR against the CEIL profile
    base = next(s for s in C._cells() if s.implementation.endswith("to_mx [FLOOR, float4_e2m1fn]"))
    spec = C.CellSpec(base.implementation, "torchao_mx_ceil", base.run_impl,
                      C._profile_runner("torchao_mx_ceil", elem_fmt="float4_e2m1fn"),
                      block=32, cols=(32, 64), needs=base.needs)
    r = C.run_cell(spec, cases=4, seed=0, hypothesis_examples=0)
    if r.status == "skipped":
        pytest.skip(r.reason)
    assert r.status == "disagree" and r.agree < r.cases
    ce = r.counterexample
    assert ce["shape"][0] == 1 and ce["shape"][1] <= 32       # shrunk to one row, one block
    assert ce["kind"] in ("elem", "scale")
    assert ce["expected"]["hex"].startswith("0x") and "fields" in ce["got"]
    assert "expected" in ce["text"] and "got" in ce["text"]
    assert ce["exact_reference_agrees_with_fast"] is True


def test_hypothesis_search_finds_and_shrinks():
    base = next(s for s in C._cells() if s.implementation.endswith("to_mx [FLOOR, float8_e4m3fn]"))
    spec = C.CellSpec(base.implementation, "torchao_mx_even", base.run_impl,
                      C._profile_runner("torchao_mx_even", elem_fmt="float8_e4m3fn"),
                      block=32, cols=(32,), needs=base.needs)
    r = C.run_cell(spec, cases=0, seed=0, hypothesis_examples=60)
    if r.status == "skipped":
        pytest.skip(r.reason)
    assert r.status == "disagree" and r.counterexample["shape"] == [1, 32]


def test_absent_implementation_is_skipped_with_reason(monkeypatch):
    spec = next(s for s in C._cells() if "microxcaling" in s.implementation)
    r = C.run_cell(spec, cases=2)
    assert r.status == "skipped" and r.reason and r.cases == 0

    def gone():
        raise tp.Unavailable("torchao is not installed")
    base = next(s for s in C._cells() if "to_mx [FLOOR, float4" in s.implementation)
    spec2 = C.CellSpec(base.implementation, base.profile, base.run_impl, base.run_profile,
                       needs=gone)
    r2 = C.run_cell(spec2, cases=2)
    assert (r2.status, r2.reason) == ("skipped", "torchao is not installed")


def test_main_writes_schema_atomically(tmp_path):
    out = tmp_path / "sub" / "m.json"
    rc = C.main(["--out", str(out), "--cases", "3", "--cells",
                 "*to_mx [FLOOR, float4_e2m1fn]*;*microxcaling*", "--cells",
                 "*current_scaling*float8_e5m2]*"])
    assert rc == 0
    d = json.loads(out.read_text())
    assert len(d["cells"]) == 3
    assert d["schema"] == "fp4ref.conformance" and d["schema_version"] == 1
    assert {c["status"] for c in d["cells"]} <= {"agree", "skipped"}
    for c in d["cells"]:
        assert set(c) == {"implementation", "profile", "status", "cases", "agree", "reason",
                          "counterexample"}
    assert not [f for f in os.listdir(out.parent) if f.startswith(".tmp")]


def test_main_bad_arguments(capsys):
    assert C.main(["--cases", "-1"]) == 2
    with pytest.raises(SystemExit):
        C.main(["--engine", "slow"])
    with pytest.raises(ValueError, match="engine"):
        C.run_conformance(engine="slow")
    assert C.main(["--list"]) == 0
    assert "to_mx" in capsys.readouterr().out


def test_te_loader_does_not_run_pytorch_init():
    try:
        m = tp.te_reference_nvfp4()
    except tp.Unavailable as e:
        pytest.skip(str(e))
    import sys
    assert hasattr(m, "NVFP4QuantizerRef")
    pt = sys.modules["transformer_engine.pytorch"]
    assert not hasattr(pt, "Linear")  # the real __init__ would have defined the modules


def test_independent_column_in_the_matrix(tmp_path):
    """Every recipe profile gets an entry: the cells that agreed in this run, the test suite's
    independent oracles, and the rules checked only against SPEC literals."""
    from reference.recipes import RECIPE_PROFILES
    out = tmp_path / "m.json"
    assert C.main(["--out", str(out), "--cases", "2", "--cells", "*to_mx [FLOOR, float4_e2m1fn]*"]) == 0
    col = {e["profile"]: e for e in json.loads(out.read_text())["independent"]}
    assert set(col) == set(RECIPE_PROFILES)
    assert set(C.INDEPENDENT_TESTS) == set(RECIPE_PROFILES)      # no profile left unlisted
    floor = col["torchao_mx_floor"]
    if tp.torchao_version():
        assert any("to_mx [FLOOR" in i for i in floor["agreed_in_this_run"]), floor
    assert col["ocp_mx_floor"]["agreed_in_this_run"] == []
    assert col["ocp_mx_floor"]["spec_literals_only"]              # shown, not hidden
    assert any("tests/independent" in t for t in col["ue5m3"]["test_suite"])
    from reports.schema import validate_conformance
    assert validate_conformance(json.loads(out.read_text())) == []


def test_cells_matching_nothing_is_an_error(capsys, tmp_path):
    assert C.main(["--out", str(tmp_path / "m.json"), "--cells", "typo*"]) == 2
    err = capsys.readouterr().err
    assert "--cells: 'typo*' matches no cell; valid choices" in err and "te_nvfp4_ref" in err
    assert not (tmp_path / "m.json").exists()


def test_out_checked_writable_before_the_run(capsys, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(C, "run_conformance", lambda *a, **k: ran.append(1) or [])
    assert C.main(["--out", str(tmp_path), "--cells", "te_nvfp4"]) == 2      # a directory
    assert "--out:" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert C.main(["--out", str(blocker / "m.json"), "--cells", "te_nvfp4"]) == 2
    assert "is not writable" in capsys.readouterr().err
    assert ran == []                                  # refused before any cell ran


def test_default_output_under_reports():
    assert C.DEFAULT_OUT.startswith("reports/") and C.DEFAULT_OUT.endswith(".json")
