"""Report schema: validation, loading (versions, corrupt/truncated files), atomic writes,
bit-level helpers, the validation recorder, `fp4ref report` and the pytest plugin."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fp4ref.harness.io import write_json_atomic
from probes.recorder import ValidationRecorder
from reference import bits as B
from reports.cli import report_main
from reports.environment import collect_environment
from reports.records import new_device, new_report, write_report
from reports.schema import ReportError, SchemaVersionError, check_report, load_json, load_report, validate_report
from reports.store import newest_report

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "sample_report.json"


@pytest.fixture
def sample() -> dict:
    return json.loads(SAMPLE.read_text())


def _errors(report) -> str:
    return "\n".join(validate_report(report))


# --- schema -----------------------------------------------------------------------------
def test_sample_report_is_valid(sample):
    assert validate_report(sample) == []
    r = load_report(SAMPLE)
    assert [d["status"] for d in r["devices"]] == ["fit", "fit", "no_fit", "skipped", "error", "fit"]


def test_load_fills_optional_fields(tmp_path):
    r = new_report(environment={"platform": "p", "python": "3", "torch": None, "cuda": None,
                                "driver": None, "gpu": None, "libraries": {}})
    r["devices"].append({"name": "d", "backend": "b", "kind": "cpu", "hardware_run": True,
                         "status": "skipped"})
    p = write_json_atomic(tmp_path / "r.json", r)
    d = load_report(p)["devices"][0]
    assert d["probes"] == [] and d["scans"] == [] and d["validation"] is None and d["model"] is None


def test_builders_make_valid_reports():
    r = new_report()
    d = new_device("cpu blas", "torch.matmul", "cpu", hardware_run=True, status="fit")
    d["model"] = {"fma_width": 1}
    r["devices"].append(d)
    assert validate_report(r) == []
    with pytest.raises(ValueError, match="kind.*'gpu'.*virtual, cpu, cuda, blackwell-only"):
        new_device("x", "y", "gpu", hardware_run=False)


@pytest.mark.parametrize("version, words", [(0, "older fp4ref"), (2, "newer fp4ref"), (99, "Upgrade fp4ref")])
def test_other_schema_versions_are_named(tmp_path, sample, version, words):
    sample["schema_version"] = version
    p = tmp_path / "r.json"
    p.write_text(json.dumps(sample))
    with pytest.raises(SchemaVersionError, match=words) as ei:
        load_report(p)
    assert f"schema_version {version}" in str(ei.value) and "reads schema_version 1" in str(ei.value)


def test_not_a_report(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"schema": "fp4ref.conformance", "schema_version": 1, "cells": []}))
    with pytest.raises(ReportError, match="not an fp4ref report.*conformance matrix"):
        load_report(p)
    p.write_text("[1, 2]")
    with pytest.raises(ReportError, match="top level is list"):
        load_report(p)


def test_truncated_json(tmp_path):
    text = SAMPLE.read_text()
    p = tmp_path / "r.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(ReportError, match="truncated JSON.*writer interrupted"):
        load_report(p)


@pytest.mark.parametrize("content, words", [
    ('{"schema": "fp4ref.report", oops}', "corrupt JSON at line 1 column"),
    ('{"a": 1} trailing', "corrupt JSON"),
    ('{"a": NaN}', "non-finite"),
    ("", "empty file"),
    ("   \n", "empty file"),
])
def test_corrupt_json(tmp_path, content, words):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(ReportError, match=words):
        load_report(p)


def test_corrupt_bytes_and_missing_file(tmp_path):
    p = tmp_path / "r.json"
    p.write_bytes(b'{"x": "\xff\xfe"}')
    with pytest.raises(ReportError, match="not UTF-8"):
        load_json(p)
    with pytest.raises(ReportError, match="no such file"):
        load_report(tmp_path / "missing.json")


def test_missing_fields_are_listed_with_paths(sample):
    del sample["devices"][1]["status"]
    del sample["environment"]["python"]
    del sample["conformance"]["cells"][0]["cases"]
    err = _errors(sample)
    assert "$.devices[1].status: required field is missing" in err
    assert "$.environment.python: required field is missing" in err
    assert "$.conformance.cells[0].cases: required field is missing" in err


def test_type_and_consistency_errors(sample):
    dev = sample["devices"][2]
    v = dev["validation"]
    v["agreement_pct"] = 99.0
    v["mismatches"][0]["format"] = "float7"
    v["mismatches"][1]["got_bits"] = "0x1ffffffff"
    v["mismatches"][2]["expected_bits"] = "3f80"
    v["ulp_histogram"]["1"] += 1
    sample["devices"][1]["probes"][0]["candidates_after"] = 1000
    sample["devices"][1]["scans"][0]["y"].pop()
    sample["devices"][1]["hardware_run"] = "yes"
    sample["devices"][0]["kind"] = "gpu"
    sample["devices"][5]["name"] = sample["devices"][0]["name"]
    sample["devices"][4]["error"] = None
    sample["devices"][1]["model"] = None
    sample["devices"][1]["typo_field"] = 1
    sample["created"] = "2026-11-30T03:12:45+02:00"
    err = _errors(sample)
    for want in [
        "$.devices[2].validation.agreement_pct: 99.0 disagrees with 100*matches/outputs",
        "$.devices[2].validation.mismatches[0].format: unknown format 'float7'; valid choices: float4_e2m1fn",
        "$.devices[2].validation.mismatches[1].got_bits: 0x1ffffffff does not fit float32",
        "$.devices[2].validation.mismatches[2].expected_bits: expected a hex string",
        "$.devices[2].validation.ulp_histogram: counts sum to 1647, expected outputs - matches = 1646",
        "$.devices[1].probes[0].candidates_after: 1000 exceeds candidates_before 96",
        "$.devices[1].scans[0]: x has 33 points but y has 32",
        "$.devices[1].hardware_run: expected true or false, got str 'yes'",
        "$.devices[0].kind: unknown value 'gpu'; valid choices: virtual, cpu, cuda, blackwell-only",
        "$.devices[5].name: duplicate device name",
        "$.devices[4].error: status is 'error' so error must say what went wrong",
        "$.devices[1].model: status is 'fit' so the inferred model is required",
        "$.devices[1].typo_field: unknown field; valid fields: name, backend",
        "$.created: '2026-11-30T03:12:45+02:00' must be in UTC",
    ]:
        assert want in err, f"missing: {want}\n--- got:\n{err}"
    with pytest.raises(ReportError, match=r"invalid fp4ref report \(\d+ problem"):
        check_report(sample)


def test_matches_cannot_exceed_outputs_and_virtual_is_not_hardware(sample):
    sample["devices"][0]["validation"]["matches"] = 16385
    sample["devices"][0]["hardware_run"] = True
    err = _errors(sample)
    assert "$.devices[0].validation.matches: 16385 exceeds outputs 16384" in err
    assert "$.devices[0].hardware_run: a 'virtual' device cannot have run on hardware" in err


def test_conformance_checks(sample):
    cells = sample["conformance"]["cells"]
    cells.append(copy.deepcopy(cells[0]))
    cells[1]["agree"] = 5
    cells[1]["cases"] = 4
    cells[2]["status"] = "maybe"
    err = _errors(sample)
    assert "$.conformance.cells[7]: duplicate cell 'torchao NVFP4Tensor.to_nvfp4' x 'nvfp4_te'" in err
    assert "$.conformance.cells[1].agree: 5 exceeds cases 4" in err
    assert "$.conformance.cells[2].status: unknown value 'maybe'; valid choices: agree, disagree, skipped" in err
    sample["conformance"]["schema_version"] = 2
    assert "conformance schema version 2 is not supported" in _errors(sample)


# --- atomic writes --------------------------------------------------------------------------
def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != "r.json")


def test_atomic_write_replaces_whole_file(tmp_path):
    p = write_json_atomic(tmp_path / "sub" / "r.json", {"a": 1})
    write_json_atomic(p, {"a": [1, 2, 3]})
    assert json.loads(p.read_text()) == {"a": [1, 2, 3]}
    assert _leftovers(p.parent) == []


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": {1, 2}}])
def test_unserializable_object_leaves_old_file(tmp_path, bad):
    p = write_json_atomic(tmp_path / "r.json", {"old": True})
    with pytest.raises((ValueError, TypeError)):
        write_json_atomic(p, bad)
    assert json.loads(p.read_text()) == {"old": True}
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("target", ["fsync", "replace"])
def test_failure_mid_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch, target):
    p = write_json_atomic(tmp_path / "r.json", {"old": True})

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, target, boom)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(p, {"new": "x" * 100000})
    monkeypatch.undo()
    assert json.loads(p.read_text()) == {"old": True}
    assert _leftovers(tmp_path) == []


def test_write_report_validates_first(tmp_path, sample):
    sample["devices"][0]["status"] = "great"
    with pytest.raises(ReportError, match=r"\$.devices\[0\].status"):
        write_report(sample, tmp_path / "r.json")
    assert list(tmp_path.iterdir()) == []


def test_write_report_writes_json_and_html(tmp_path, sample):
    p = write_report(sample, tmp_path / "run" / "report.json")
    assert load_report(p)["devices"][0]["name"] == sample["devices"][0]["name"]
    assert (tmp_path / "run" / "report.html").read_text().startswith("<!DOCTYPE html>")


# --- bits (expected values from the format definitions, by hand) ------------------------------
def test_bits_decode_and_fields():
    assert B.decode_str(0x3F81, "bfloat16") == "1.0078125"
    assert B.field_bits(0x3F81, "bfloat16") == [("sign", "0"), ("exponent", "01111111"), ("mantissa", "0000001")]
    assert B.decode_str(0x7E, "float8_e4m3fn") == "448.0"
    assert B.decode_str(0x7F, "float8_e4m3fn") == "nan"
    assert B.decode_str(0xF, "float4_e2m1fn") == "-6.0"
    assert B.decode_str(0x80000000, "float32") == "-0.0"
    assert B.decode_str(0xFF800000, "float32") == "-inf"
    assert B.exact_str(0x3F800001, "float32") == "8388609*2^-23"
    assert B.exact_str(0x40400000, "float32") == "3"
    assert B.exact_str(0x3E800000, "float32") == "1*2^-2"
    assert B.to_hex(0x7, "float4_e2m1fn") == "0x07"
    assert B.to_hex(1, "float32") == "0x00000001"


@pytest.mark.parametrize("a, b, fmt, ulp", [
    (0x3F800000, 0x3F800001, "float32", 1),
    (0x00000000, 0x80000000, "float32", 0),   # +0 / -0: same value, different bits
    (0x00000001, 0x80000001, "float32", 2),   # +-min subnormal across zero
    (0x7F7FFFFF, 0x7F800000, "float32", 1),   # max finite -> inf
    (0x1, 0x9, "float4_e2m1fn", 2),           # 0.5 and -0.5
    (0x7F800000, 0x7FC00000, "float32", None),
])
def test_ulp_distance(a, b, fmt, ulp):
    assert B.ulp_distance(a, b, fmt) == ulp


def test_validation_recorder_literal_case():
    exp = np.array([0x3F800000, 0x7FC00000, 0x00000000, 0x40000000, 0x7F800000], dtype=np.uint32)
    got = np.array([0x3F800000, 0x7FC00001, 0x80000000, 0x40000002, 0x7FC00000], dtype=np.uint32)
    v = ValidationRecorder("float32", keep=2)
    assert v.add([1, 5, 16], exp.view(np.int32), got.view(np.int32)) == 3  # signed views work
    d = v.to_dict()
    assert (d["outputs"], d["matches"]) == (5, 2)
    assert d["ulp_histogram"] == {"0": 1, "2": 1, "nonfinite": 1}
    assert d["mismatches"][0] == {"index": [2], "shape": [1, 5, 16], "format": "float32",
                                  "expected_bits": "0x00000000", "got_bits": "0x80000000",
                                  "expected": "0.0", "got": "-0.0", "ulp": 0}
    assert len(d["mismatches"]) == 2
    r = new_report()
    dev = new_device("d", "b", "cpu", hardware_run=True, status="no_fit")
    dev["validation"] = d
    r["devices"].append(dev)
    assert validate_report(r) == []
    with pytest.raises(ValueError, match="got_codes"):
        v.add([1, 1, 1], [1, 2], [1])


def test_collect_environment_shape():
    env = collect_environment()
    assert {"platform", "python", "torch", "cuda", "driver", "gpu", "libraries"} <= set(env)


# --- fp4ref report ----------------------------------------------------------------------------
def test_report_cli_explicit(tmp_path, capsys):
    out = tmp_path / "x.html"
    assert report_main(["--input", str(SAMPLE), "--out", str(out)]) == 0
    assert "6 device(s), conformance matrix" in capsys.readouterr().out
    assert "cuBLAS bf16 matmul (H200)" in out.read_text()


def test_report_cli_newest_and_errors(tmp_path, sample, capsys):
    root = tmp_path / "reports"
    old = write_json_atomic(root / "runs" / "20260101T000000Z" / "report.json", sample)
    sample["title"] = "the newest one"
    new = write_json_atomic(root / "cuda" / "20260102T000000Z" / "report.json", sample)
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    assert newest_report(root) == new
    assert report_main(["--reports-dir", str(root)]) == 0
    assert "the newest one" in new.with_suffix(".html").read_text()
    assert report_main(["--reports-dir", str(tmp_path / "none")]) == 2
    assert "no report found" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "fp4ref.report", "schema_version": 7}')
    assert report_main(["--input", str(bad)]) == 2
    assert "newer fp4ref" in capsys.readouterr().err


def test_report_cli_renders_bare_conformance(tmp_path, sample):
    conf = tmp_path / "conformance.json"
    write_json_atomic(conf, sample["conformance"])
    assert report_main(["--input", str(conf)]) == 0
    html = conf.with_suffix(".html").read_text()
    assert 'class="conformance-matrix"' in html and "ml_dtypes float8_e4m3fn" in html


# --- pytest plugin ---------------------------------------------------------------------------
_TESTS = {
    "test_mod_a.py": """
        import pytest
        def test_ok(): pass
        def test_bad(): assert 1 == 2, "<b>hostile</b>"
        @pytest.mark.skip(reason="not here")
        def test_skip(): pass
        @pytest.mark.xfail(reason="known")
        def test_xf(): assert 0
        @pytest.fixture
        def broken(): raise RuntimeError("fixture broke")
        def test_setup_error(broken): pass
        @pytest.fixture
        def td():
            yield
            raise RuntimeError("teardown broke")
        def test_teardown_error(td): pass
    """,
    "test_mod_b.py": "def test_one(): pass\n",
}


def _run_pytest(tmp_path, *args):
    for name, src in _TESTS.items():
        (tmp_path / name).write_text(textwrap.dedent(src))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "reports.pytest_plugin", *args, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist"])
def test_pytest_option_writes_session_report(tmp_path, xdist):
    out = tmp_path / "out" / "session.json"
    proc = _run_pytest(tmp_path, "--fp4ref-report", str(out), *(["-n", "2"] if xdist else []))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"fp4ref report written to {out}" in proc.stdout
    r = load_report(out)
    t = r["tests"]
    mods = {m["module"]: {x["name"]: x for x in m["tests"]} for m in t["modules"]}
    assert set(mods) == {"test_mod_a.py", "test_mod_b.py"}
    a = mods["test_mod_a.py"]
    assert {k: x["outcome"] for k, x in a.items()} == {
        "test_ok": "passed", "test_bad": "failed", "test_skip": "skipped", "test_xf": "xfailed",
        "test_setup_error": "error", "test_teardown_error": "error"}
    assert "<b>hostile</b>" in a["test_bad"]["message"]
    assert a["test_skip"]["message"] == "not here"
    assert "teardown broke" in a["test_teardown_error"]["message"]
    assert t["summary"] == {"passed": 2, "failed": 1, "error": 2, "skipped": 1, "xfailed": 1}
    assert t["exitstatus"] == 1 and r["devices"] == []
    assert [p.name for p in out.parent.iterdir()] == ["session.json"]  # no temp files left


def test_pytest_option_html_and_bad_path(tmp_path):
    out = tmp_path / "session.html"
    proc = _run_pytest(tmp_path, "--fp4ref-report", str(out), "-k", "test_one")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'id="tests"' in out.read_text() and load_report(tmp_path / "session.json")["tests"]
    proc = _run_pytest(tmp_path, "--fp4ref-report", str(tmp_path))
    assert proc.returncode == 4 and "is a directory" in proc.stderr


def test_conftest_registers_plugin():
    import ast
    tree = ast.parse((ROOT / "conftest.py").read_text())
    plugins = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
               and any(getattr(t, "id", None) == "pytest_plugins" for t in n.targets)]
    assert len(plugins) == 1 and plugins[0].count("reports.pytest_plugin") == 1


def test_writer_flow_with_numpy_fraction_enum(tmp_path):
    """What the probe suite does: builders + numpy/Fraction/Enum values -> valid JSON and HTML."""
    import enum
    from fractions import Fraction

    from reports.records import probe_record, scan_record

    class Mode(enum.Enum):
        RTZ = "rtz"
    r = new_report(command="fp4ref probe --device cpu")
    d = new_device("cpu fp32", "torch.matmul", "cpu", hardware_run=True, status="fit",
                   capabilities={"dtypes": ("float32",)})
    d["model"] = {"fma_width": np.int64(4), "lattice": Fraction(1, 1024), "norm_mode": Mode.RTZ,
                  "output": "float32"}
    d["probes"].append(probe_record("p", "fma_width", "why", operands={"a": np.array([1.0, 2.0])},
                                    predictions={"F=1": "0x3f800000", "F=4": "0x3f800001"},
                                    observed="0x3f800001", candidates_before=np.int32(8),
                                    candidates_after=1, format="float32"))
    d["scans"].append(scan_record("err vs K", np.arange(1, 4), [0.5, float("nan"), 2.0], xlabel="K",
                                  ylabel="err", xscale="log"))
    v = ValidationRecorder("float32")
    v.add((2, 2, 8), np.zeros((2, 2), np.int32), np.zeros((2, 2), np.int32))
    d["validation"] = v.to_dict()
    r["devices"].append(d)
    p = write_report(r, tmp_path / "runs" / "x" / "report.json")
    back = load_report(p)["devices"][0]
    assert back["model"] == {"fma_width": 4, "lattice": "1/1024", "norm_mode": "RTZ", "output": "float32"}
    assert back["scans"][0]["y"] == [0.5, None, 2.0] and back["validation"]["agreement_pct"] == 100.0
    assert "snapped to multiples of 1/1024 (2^-10)" in (tmp_path / "runs" / "x" / "report.html").read_text()
    with pytest.raises(TypeError, match="type object .* is not JSON"):
        write_report(dict(r, extra={"x": object()}), tmp_path / "bad.json")


def test_run_dir_layout(tmp_path):
    from reports.environment import machine_slug
    from reports.store import run_dir
    env = {"gpu": "NVIDIA H200", "cpu": "x86_64"}
    assert machine_slug(env) == "nvidia-h200"
    assert machine_slug({"gpu": None, "cpu": "x86_64"}) == "cpu-x86-64"
    d = run_dir(tmp_path, environment=env)
    assert d.parent == tmp_path / "nvidia-h200" and d.name.endswith("Z")
    d.mkdir(parents=True)
    assert run_dir(tmp_path, environment=env) != d
