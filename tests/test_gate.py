"""`fp4ref gate`: each kind of change fails with a readable line; equal or better passes."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from reports.cli import gate_main
from reports.gate import compare_reports
from fp4ref.harness.io import write_json_atomic
from probes.recorder import validation_record
from reports.schema import load_report, normalize_report

SAMPLE = Path(__file__).resolve().parent / "data" / "sample_report.json"
CUBLAS = "cuBLAS bf16 matmul (H200)"
FP8 = "torch._scaled_mm e4m3 use_fast_accum=True (H200)"


@pytest.fixture
def base() -> dict:
    return load_report(SAMPLE)


def dev(r: dict, name: str) -> dict:
    return next(d for d in r["devices"] if d["name"] == name)


def cell(r: dict, impl: str, prof: str) -> dict:
    return next(c for c in r["conformance"]["cells"] if c["implementation"] == impl and c["profile"] == prof)


def gate(base: dict, cur: dict):
    return compare_reports(normalize_report(base), normalize_report(cur))


def fails_with(base: dict, cur: dict, *needles: str) -> str:
    res = gate(base, cur)
    text = res.format()
    assert not res.ok, text
    assert text.startswith("fp4ref gate: FAIL")
    for n in needles:
        assert n in text, f"{n!r} not in:\n{text}"
    return text


def test_identical_passes(base):
    res = gate(base, copy.deepcopy(base))
    assert res.ok and not res.improvements and not res.changes
    assert res.format().startswith("fp4ref gate: PASS (no numerics changes)")


def test_parameter_changed(base):
    cur = copy.deepcopy(base)
    dev(cur, CUBLAS)["model"]["fma_width"] = 32
    dev(cur, CUBLAS)["model"]["lattice"] = "1/1024"
    del dev(cur, CUBLAS)["model"]["split_k"]
    dev(cur, CUBLAS)["model"]["swizzle"] = True
    fails_with(base, cur,
               f"[worse] device {CUBLAS!r}: model parameter fma_width changed: 16 -> 32",
               "model parameter lattice changed: null -> 1/1024",
               "model parameter split_k vanished (was 1)",
               "model parameter swizzle appeared (now true)")


def test_device_gone(base):
    cur = copy.deepcopy(base)
    cur["devices"] = [d for d in cur["devices"] if d["name"] != CUBLAS]
    fails_with(base, cur, f"device {CUBLAS!r}: disappeared (was fit)")


def test_status_worse_and_hardware_lost(base):
    cur = copy.deepcopy(base)
    d = dev(cur, CUBLAS)
    d["status"], d["hardware_run"], d["error"] = "error", False, "CUDA error: device-side assert"
    d["model"], d["validation"] = None, None
    fails_with(base, cur, f"device {CUBLAS!r}: status fit -> error (CUDA error: device-side assert)",
               "no longer run on real hardware", "validation missing (was 100% (1048576/1048576))")


def test_same_rank_status_change_fails(base):
    cur = copy.deepcopy(base)
    dev(cur, FP8)["status"] = "nondeterministic"
    fails_with(base, cur, "status no_fit -> nondeterministic")


def test_agreement_worse(base):
    cur = copy.deepcopy(base)
    d = dev(cur, CUBLAS)
    d["validation"] = validation_record(1048576, 1048570, d["validation"]["shapes"], [], {"1": 4, "3": 2})
    fails_with(base, cur, "agreement worse: 100% (1048576/1048576) -> 99.9994% (1048570/1048576)",
               "largest mismatch worse: 0 -> 3 ULP")


def test_coverage_and_nan_worse(base):
    cur = copy.deepcopy(base)
    v = dev(cur, FP8)["validation"]
    hist = dict(v["ulp_histogram"], nonfinite=2, **{"1": 1200})
    dev(cur, FP8)["validation"] = validation_record(v["outputs"] // 2 + 1646, v["outputs"] // 2, v["shapes"],
                                                    v["mismatches"], hist)
    fails_with(base, cur, "NaN/inf mismatches worse: 1 -> 2", "fewer outputs validated (coverage worse): 65536 -> 34414")


@pytest.mark.parametrize("change, needle", [
    (lambda c: c.update(status="disagree", agree=4095,
                        counterexample={"input_bits": "0x3f800000", "format": "float4_e2m1fn"}),
     "'torchao NVFP4Tensor.to_nvfp4' x 'nvfp4_te': agree (4096/4096) -> disagree (4095/4096)"),
    (lambda c: c.update(status="skipped", reason="torchao missing"),
     "agree (4096/4096) -> skipped: torchao missing"),
    (lambda c: c.update(cases=1024, agree=1024), "fewer cases: 4096 -> 1024"),
])
def test_conformance_cell_worse(base, change, needle):
    cur = copy.deepcopy(base)
    change(cell(cur, "torchao NVFP4Tensor.to_nvfp4", "nvfp4_te"))
    fails_with(base, cur, needle)


def test_conformance_disagreement_changes(base):
    cur = copy.deepcopy(base)
    c = cell(cur, "ml_dtypes float8_e4m3fn", "e4m3_rne_satfinite")
    c["agree"] -= 1
    c["counterexample"]["got_bits"] = "0xff"
    fails_with(base, cur, "'ml_dtypes float8_e4m3fn' x 'e4m3_rne_satfinite': agreement worse",
               "counterexample changed")


def test_conformance_cell_or_matrix_gone(base):
    cur = copy.deepcopy(base)
    cur["conformance"]["cells"].pop(0)
    fails_with(base, cur, "'torchao NVFP4Tensor.to_nvfp4' x 'nvfp4_te': cell missing (was agree (4096/4096))")
    cur["conformance"] = None
    fails_with(base, cur, "conformance matrix missing (baseline had 7 cells)")


def test_improvements_pass_and_are_named(base):
    cur = copy.deepcopy(base)
    d = dev(cur, FP8)
    d["status"] = "fit"
    d["model"]["fma_width"] = 32
    d["validation"] = validation_record(131072, 131072, [[256, 256, 4096]], [], {})
    c = cell(cur, "ml_dtypes float8_e4m3fn", "e4m3_rne_satfinite")
    c.update(status="agree", agree=c["cases"], counterexample=None)
    nv = dev(cur, "NVFP4 block-scaled torch._scaled_mm")
    nv.update(status="fit", hardware_run=True, model={"name": "probe_matched", "group_size": 64},
              validation=validation_record(4096, 4096, [[64, 64, 1024]], [], {}))
    cur["devices"].append({**copy.deepcopy(dev(cur, CUBLAS)), "name": "cuBLAS fp16 matmul (H200)"})
    cur["conformance"]["cells"].append({"implementation": "new impl", "profile": "nvfp4_te", "status": "agree",
                                        "cases": 1, "agree": 1, "reason": None, "counterexample": None})
    res = gate(base, cur)
    text = res.format()
    assert res.ok, text
    assert text.startswith("fp4ref gate: PASS (")
    for n in [f"[better] device {FP8!r}: status no_fit -> fit",
              "agreement better: 97.4884% (63890/65536) -> 100% (131072/131072)",
              "largest mismatch smaller: 16 -> 0 ULP", "NaN/inf mismatches fewer: 1 -> 0",
              "more outputs validated: 65536 -> 131072",
              "'ml_dtypes float8_e4m3fn' x 'e4m3_rne_satfinite': disagree (3791650816/4294967296) -> agree",
              "device 'NVFP4 block-scaled torch._scaled_mm': now run on real hardware",
              "model inferred: probe_matched F=1 align=exact acc=23:RNE G=64:RNE out=float32:RNE",
              "[new] device 'cuBLAS fp16 matmul (H200)': new, status fit",
              "[new] conformance 'new impl' x 'nvfp4_te': new cell, agree (1/1)"]:
        assert n in text, f"{n!r} not in:\n{text}"


def test_tests_section(base):
    b = copy.deepcopy(base)
    b["tests"] = {"modules": [{"module": "tests/t.py", "tests": [
        {"nodeid": "tests/t.py::a", "outcome": "passed"}, {"nodeid": "tests/t.py::b", "outcome": "failed"},
        {"nodeid": "tests/t.py::c", "outcome": "passed"}]}]}
    cur = copy.deepcopy(b)
    t = cur["tests"]["modules"][0]["tests"]
    t[0]["outcome"], t[1]["outcome"] = "failed", "passed"
    t.pop()
    text = fails_with(b, cur, "[worse] test tests/t.py::a: passed -> failed", "[worse] test tests/t.py::c: gone (was passed)")
    assert "[better] test tests/t.py::b: failed -> passed" in text


# --- the command ------------------------------------------------------------------------------
def test_gate_main_exit_codes(tmp_path, base, capsys):
    b = write_json_atomic(tmp_path / "baselines" / "h200.json", base)
    cur = copy.deepcopy(base)
    dev(cur, CUBLAS)["model"]["acc_frac_bits"] = 24
    c = write_json_atomic(tmp_path / "cur.json", cur)
    assert gate_main(["--baseline", str(b), "--current", str(b)]) == 0
    assert gate_main(["--baseline", str(b), "--current", str(c)]) == 1
    out = capsys.readouterr().out
    assert "model parameter acc_frac_bits changed: 23 -> 24" in out and "--accept" in out
    # --accept records the current report; afterwards it passes
    assert gate_main(["--baseline", str(b), "--current", str(c), "--accept"]) == 0
    assert gate_main(["--baseline", str(b), "--current", str(c)]) == 0
    assert json.loads(b.read_text())["devices"][1]["model"]["acc_frac_bits"] == 24


def test_gate_main_default_current_is_newest(tmp_path, base, capsys):
    root = tmp_path / "reports"
    b = write_json_atomic(root / "baselines" / "h200.json", base)
    old = write_json_atomic(root / "runs" / "20260101T000000Z" / "report.json", base)
    cur = copy.deepcopy(base)
    cur["devices"].pop()
    new = write_json_atomic(root / "runs" / "20260102T000000Z" / "report.json", cur)
    os.utime(old, (1_000_000, 1_000_000))
    os.utime(new, (2_000_000, 2_000_000))
    assert gate_main(["--baseline", str(b), "--reports-dir", str(root)]) == 1
    out = capsys.readouterr().out
    assert str(new) in out and "disappeared" in out


def test_gate_main_bad_inputs(tmp_path, base, capsys):
    cur = write_json_atomic(tmp_path / "cur.json", base)
    assert gate_main(["--baseline", str(tmp_path / "nope.json"), "--current", str(cur)]) == 2
    assert "no such baseline; record one with" in capsys.readouterr().err
    newer = dict(base, schema_version=2)
    nb = write_json_atomic(tmp_path / "newer.json", newer)
    assert gate_main(["--baseline", str(nb), "--current", str(cur)]) == 2
    assert "newer fp4ref" in capsys.readouterr().err
    trunc = tmp_path / "trunc.json"
    trunc.write_text(cur.read_text()[:500])
    assert gate_main(["--baseline", str(cur), "--current", str(trunc)]) == 2
    assert "truncated JSON" in capsys.readouterr().err
    # a missing baseline with --accept records it
    nb2 = tmp_path / "baselines" / "new.json"
    assert gate_main(["--baseline", str(nb2), "--current", str(cur), "--accept"]) == 0
    assert load_report(nb2)["devices"] == load_report(cur)["devices"]


# --- issue 15: like with like, conformance gating, file modes --------------------------------
def test_other_gpu_is_refused_not_47_regressions(tmp_path, base, capsys):
    b = write_json_atomic(tmp_path / "h200.json", base)
    cpu = copy.deepcopy(base)
    cpu["environment"].update(gpu=None, driver=None, cuda=None, torch="2.13.0+cpu")
    for d in cpu["devices"]:
        if d["kind"] == "cuda":
            d.update(status="skipped", model=None, validation=None, error="no CUDA device")
    c = write_json_atomic(tmp_path / "cpu.json", cpu)
    assert gate_main(["--baseline", str(b), "--current", str(c)]) == 2
    err = capsys.readouterr().err
    assert "refusing to compare reports from different hardware" in err
    assert "GPU: baseline NVIDIA H200, current none (CPU only)" in err and "--allow-env-mismatch" in err
    assert gate_main(["--baseline", str(b), "--current", str(c), "--allow-env-mismatch"]) == 1
    out = capsys.readouterr().out
    assert "[env] GPU: baseline NVIDIA H200" in out and "[env] torch: baseline 2.11.0+cu130, current 2.13.0+cpu" in out


def test_software_versions_differ_warns_and_compares(base):
    cur = copy.deepcopy(base)
    cur["environment"]["libraries"]["triton"] = "3.7.0"
    cur["environment"]["driver"] = "590.1"
    res = gate(base, cur)
    text = res.format()
    assert res.ok and "[env] driver: baseline 580.65.06, current 590.1" in text
    assert "[env] triton: baseline 3.6.0, current 3.7.0" in text


def test_cpu_model_differs_only_matters_where_cpu_devices_ran(base):
    b, c = copy.deepcopy(base), copy.deepcopy(base)
    b["environment"]["extra"] = {"cpu_model": "Xeon A", "cpu_isa": ["avx2"]}
    c["environment"]["extra"] = {"cpu_model": "EPYC B", "cpu_isa": ["avx2", "avx512f"]}
    from reports.gate import environment_differences
    hard, _ = environment_differences(normalize_report(b), normalize_report(c))
    assert hard == ["CPU model: baseline Xeon A, current EPYC B",
                    'CPU ISA extensions: baseline ["avx2"], current ["avx2", "avx512f"]']
    for r in (b, c):
        for d in r["devices"]:
            if d["kind"] == "cpu":
                d["status"] = "skipped"
    assert environment_differences(normalize_report(b), normalize_report(c)) == ([], [])


CONFORM = Path(__file__).resolve().parents[1] / "reports" / "baselines" / "conform-cpu.json"


def test_conformance_json_can_be_gated(tmp_path, base, capsys):
    conf = json.loads(CONFORM.read_text())
    assert gate_main(["--baseline", str(CONFORM), "--current", str(CONFORM)]) == 0
    worse = copy.deepcopy(conf)
    c0 = worse["cells"][0]
    c0.update(status="disagree", agree=c0["cases"] - 1, counterexample={"input": "0x3f800000"})
    w = write_json_atomic(tmp_path / "conform.json", worse)
    assert gate_main(["--baseline", str(CONFORM), "--current", str(w)]) == 1
    assert "agree (124/124) -> disagree (123/124)" in capsys.readouterr().out
    # a probe report gated together with a conformance JSON (--conformance)
    with_conf = dict(copy.deepcopy(base), conformance=conf)
    b = write_json_atomic(tmp_path / "b.json", with_conf)
    c = write_json_atomic(tmp_path / "c.json", dict(copy.deepcopy(base), conformance=None))
    assert gate_main(["--baseline", str(b), "--current", str(c)]) == 1
    assert "conformance matrix missing" in capsys.readouterr().out
    assert gate_main(["--baseline", str(b), "--current", str(c), "--conformance", str(CONFORM)]) == 0
    assert gate_main(["--baseline", str(b), "--current", str(c), "--conformance", str(w)]) == 1


def test_written_files_have_normal_modes(tmp_path, base):
    mask = os.umask(0o022)
    try:
        p = write_json_atomic(tmp_path / "r.json", base)
        from fp4ref.harness.io import write_text_atomic
        h = write_text_atomic(tmp_path / "r.html", "<html></html>")
    finally:
        os.umask(mask)
    assert p.stat().st_mode & 0o777 == 0o644 and h.stat().st_mode & 0o777 == 0o644


def test_legacy_unfinished_placeholder_kind_is_not_a_regression():
    """Reports before 2026-12-01 stored a device unfinished at the time limit as kind cpu,
    backend '?'; the same device finishing as cuda later is no 'kind changed' regression."""
    from reports.gate import GateResult, _compare_device
    b = dict(name="cuda-cublas-fp32", kind="cpu", backend="?", status="error", model=None,
             validation=None, hardware_run=True)
    c = dict(b, kind="cuda", backend="torch.mm fp32")
    r = GateResult()
    _compare_device(b, c, r)
    assert not any("kind changed" in x for x in r.regressions)
    r2 = GateResult()
    _compare_device(dict(b, backend="torch.mm fp32"), c, r2)
    assert any("kind changed" in x for x in r2.regressions)
