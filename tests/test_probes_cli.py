"""`fp4ref probe` end to end on CPU (reports.probe_run over probes.workers / probes.run): report
written, schema-valid, virtual device fits; the DeviceResult status decision."""
import json

from reports import probe_run as cli


def test_probe_cli_virtual_and_report(tmp_path, capsys):
    rc = cli.main(["--devices", "virtual-nvfp4-probe_matched", "--quick", "--out", str(tmp_path), "--validate-outputs", "2000",
                   "--jobs", "1", "--no-html"])
    assert rc == 0
    reports = list(tmp_path.glob("*/*/report.json"))
    assert len(reports) == 1
    from reports.schema import load_report
    r = load_report(reports[0])
    dev = [d for d in r["devices"] if d["name"] == "virtual-nvfp4-probe_matched"][0]
    assert dev["status"] == "fit" and dev["hardware_run"] is False
    assert dev["model"]["fma_width"] == 64 and dev["model"]["group_size"] == 64
    assert dev["model"]["outer_mode"] == "RTZ"
    assert dev["validation"]["agreement_pct"] == 100.0
    assert dev["probes"] and dev["scans"]
    out = capsys.readouterr().out
    assert "fp4ref probe" in out and "fit" in out


def test_probe_cli_rejects_unknown_device(tmp_path):
    assert cli.main(["--devices", "no-such-device", "--out", str(tmp_path)]) == 2


def test_probe_cli_extra_device_that_crashes(tmp_path, monkeypatch):
    import sys
    import types
    import numpy as np
    from probes.device import Capabilities, Device
    mod = types.ModuleType("probes_test_userdev")

    def boom(a, b, **_):
        raise RuntimeError("user kernel crashed")
    mod.device = Device.wrap("user-boom", boom, Capabilities("float32", "float32"))
    monkeypatch.setitem(sys.modules, "probes_test_userdev", mod)
    rc = cli.main(["--extra", "probes_test_userdev:device", "--devices", "user-boom,virtual-nvfp4-probe_matched",
                   "--quick",
                   "--out", str(tmp_path), "--validate-outputs", "1000", "--jobs", "1", "--no-html"])
    assert rc == 0
    r = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())
    st = {d["name"]: d["status"] for d in r["devices"]}
    assert st["user-boom"] == "error" and st["virtual-nvfp4-probe_matched"] == "fit"
    _ = np


def test_pick_survivor_prefers_the_candidate_random_sums_confirm():
    # bf16 output hides the accumulator's normalization from the probes; random sums do not
    from probes.backends.virtual import virtual_device
    from probes.run import pick_survivor
    from probes.device import Capabilities
    from reference.gemm import GemmModel
    from reference.rounding import Mode
    caps = Capabilities("float8_e4m3fn", "float8_e4m3fn", "bfloat16", k_multiple=16, max_k=1024)
    right = GemmModel(fma_width=32, align_bits=13, acc_frac_bits=13, norm_mode=Mode.RTZ, output="bfloat16")
    wrong = right.replace(norm_mode=Mode.RNE)
    dev = virtual_device(right, caps, "v-narrow")
    assert pick_survivor(dev, [wrong, right]) == right
    assert pick_survivor(dev, [wrong]) is None


def _slow_device():
    """A user device that takes a second per call: never done within a short time limit."""
    import time
    from probes.device import Capabilities, Device

    def slow(a, b, **_):
        time.sleep(1.0)
        return (a @ b).astype("float32").astype("float64")  # float32 values, as declared
    return Device.wrap("user-slow", slow, Capabilities("float32", "float32"))


def test_unfinished_device_reports_its_last_stage(tmp_path):
    """At --time-limit-s a device still running is an error that says where it was (the
    worker's heartbeat), and the report is still written."""
    rc = cli.main(["--extra", "tests.test_probes_cli:_slow_device", "--devices",
                   "user-slow,virtual-nvfp4-probe_matched", "--quick", "--time-limit-s", "15", "--jobs", "2",
                   "--out", str(tmp_path), "--no-html"])
    assert rc == 0
    r = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())
    dev = {d["name"]: d for d in r["devices"]}["user-slow"]
    assert dev["status"] == "error" and "not finished within --time-limit-s 15" in dev["error"]
    assert "last stage:" in dev["error"], dev["error"]
    assert dev["extra"]["last_progress"]["stage"] in dev["error"]


# --- issue 15: the device protocol, status decision, safe runs ------------------------------
import os  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from probes.device import Capabilities, Device, ProtocolError  # noqa: E402


def _f32_matmul(a, b, **_):
    """float32 values (numpy's float32 matmul: an oracle independent of the prober)."""
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float64)


def test_declared_bf16_returning_fp32_is_a_protocol_error():
    """The tool never rounds a device's outputs itself: fp32 values under a bf16 declaration
    are an error naming the device, the first output, its value and the declared format."""
    dev = Device.wrap("liar", _f32_matmul, Capabilities("bfloat16", "bfloat16", "bfloat16"))
    a = np.full((2, 3), 1.0)
    b = np.full((3, 2), 1.0 + 2.0 ** -7)  # bf16 values whose sum 3 + 3*2^-7 is not a bf16 value
    with pytest.raises(ProtocolError, match=r"liar: protocol error: output \[0, 0\] = 3\.0234375 "
                                            r"is not a bfloat16 value"):
        dev(a, b)
    from probes.run import probe_device
    rec = probe_device(dev, quick=True, outputs=1000, per_shape=False)
    assert rec.status == "error" and "protocol error" in rec.error


@pytest.mark.parametrize("out, needle", [
    (lambda a, b: a @ b, "is not a float32 value"),                       # float64 sums
    (lambda a, b: np.zeros((1, 1)), r"returned shape \(1, 1\), expected \(2, 2\)"),
    (lambda a, b: np.zeros((2, 2), np.int32), "returned dtype int32"),
    (lambda a, b: np.full((2, 2), 1e39), r"output \[0, 0\] = 1e\+39 is not a float32 value"),
])
def test_protocol_checks_shape_dtype_and_values(out, needle):
    dev = Device.wrap("d", lambda a, b, **_: out(a, b), Capabilities("float32", "float32"))
    a = np.array([[1.0, 2.0 ** -30], [1.0, 3.0]])
    with pytest.raises(ProtocolError, match=needle):
        dev(a, a.T.copy())


def test_protocol_accepts_exact_values_nan_inf_and_signed_zero():
    vals = np.array([[np.nan, -0.0], [np.inf, 1.5]])
    dev = Device.wrap("ok", lambda a, b, **_: vals, Capabilities("bfloat16", "bfloat16", "bfloat16"))
    got = dev(np.ones((2, 1)), np.ones((1, 2)))
    assert np.isnan(got[0, 0]) and np.signbit(got[0, 1]) and got[1, 0] == np.inf and got[1, 1] == 1.5


def test_intermittent_noise_is_nondeterministic_not_no_fit():
    """1% of outputs off by one ULP, intermittently: found by repeating batches."""
    from probes.backends.virtual import virtual_device
    from probes.run import probe_device
    from reference.gemm import GemmModel
    from reference.rounding import Mode
    caps = Capabilities("float32", "float32", "float32", max_k=256, max_batch=16)
    hidden = GemmModel("h", fma_width=1, acc_frac_bits=23, norm_mode=Mode.RNE)
    dev = virtual_device(hidden, caps, "noisy", noise=0.01, seed=4)  # passes the first check
    rec = probe_device(dev, quick=True, outputs=1000, per_shape=False)
    assert rec.status == "nondeterministic", rec.notes[:3]
    assert any("for identical operands" in n for n in rec.notes)


class _V:  # a stand-in ValidationResult
    def __init__(self, record, per_shape, errors=(), nondeterministic=False):
        self.record, self.per_shape, self.errors = record, per_shape, list(errors)
        self.nondeterministic = nondeterministic


def test_status_is_decided_in_one_place_and_fit_needs_a_validation():
    from probes.result import decide_status
    rec = {"outputs": 10, "matches": 10, "agreement_pct": 100.0}
    shp = [{"shape": [2, 5, 16], "outputs": 10, "matches": 10}]
    assert decide_status("fit", _V(rec, shp))[0] == "fit"
    assert decide_status("no_fit", None)[0] == "no_fit"
    assert decide_status("fit", None)[0] == "error"
    st, err, _ = decide_status("fit", _V(None, [], [{"shape": [1, 1, 16], "error": "boom"}]))
    assert st == "error" and "boom" in err
    st, _, notes = decide_status("fit", _V(rec, shp, [{"shape": [1, 1, 16], "error": "boom"}]))
    assert st == "partial" and "[1, 1, 16] the device raised" in notes[0]
    assert decide_status("fit", _V(rec, shp, nondeterministic=True))[0] == "nondeterministic"


def test_validate_outputs_below_one_refused():
    from probes.run import probe_device
    with pytest.raises(ValueError, match="outputs: .* >= 1, got 0"):
        probe_device(None, outputs=0)


def test_a_shape_that_raises_in_validation_is_recorded():
    from probes.validate import validate
    from reference.gemm import GemmModel

    def fn(a, b, **_):
        if a.shape[1] == 32:
            raise RuntimeError("K=32 unsupported")
        return _f32_matmul(a, b)
    dev = Device.wrap("k32", fn, Capabilities("float32", "float32"))
    v = validate(dev, GemmModel("m"), outputs=10, shapes=((4, 4, 16), (4, 4, 32)))
    assert v.errors and v.errors[0]["shape"] == [4, 4, 32] and "K=32 unsupported" in v.errors[0]["error"]
    assert v.record["errors"] == v.errors


@pytest.mark.parametrize("argv, needle", [
    (["--validate-outputs", "0"], "--validate-outputs"), (["--validate-outputs", "-5"], "--validate-outputs"),
    (["--seed", "-1"], "--seed"), (["--jobs", "0"], "--jobs"), (["--jobs", "-3"], "--jobs"),
    (["--max-shapes", "-1"], "--max-shapes"), (["--time-limit-s", "0"], "--time-limit-s"),
    (["--time-limit-s", "nan"], "--time-limit-s"), (["--jobs", "two"], "--jobs"),
])
def test_numeric_arguments_are_validated(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--out", "/nonexistent-never-reached"])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_unwritable_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    import probes.backends as pb
    monkeypatch.setattr(pb, "detect", lambda *a, **k: pytest.fail("probed before checking --out"))
    assert cli.main(["--out", str(blocker / "sub"), "--quick"]) == 2
    assert "--out" in capsys.readouterr().err


def _bad_dtype_device():
    return Device.wrap("[/red] user-ints", lambda a, b, **_: np.zeros((a.shape[0], b.shape[1]), np.int64),
                       Capabilities("float32", "float32"))


def _interrupting_device():
    def fn(a, b, **_):
        raise KeyboardInterrupt
    return Device.wrap("user-ctrl-c", fn, Capabilities("float32", "float32"))


def test_ctrl_c_writes_a_partial_report_and_cleans_up(tmp_path, capsys, monkeypatch):
    """A markup-looking name survives; the finished device is kept; the temp folder goes;
    the run folder is named by the start time; both paths are printed."""
    made = []
    real = __import__("tempfile").mkdtemp
    monkeypatch.setattr("tempfile.mkdtemp", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    rc = cli.main(["--extra", "tests.test_probes_cli:_bad_dtype_device", "--extra",
                   "tests.test_probes_cli:_interrupting_device", "--devices", "user-*,[[]/red]*",
                   "--quick", "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 130
    path = next(tmp_path.glob("*/*/report.json"))
    r = json.loads(path.read_text())
    st = {d["name"]: d for d in r["devices"]}
    assert st["[/red] user-ints"]["status"] == "error" and "dtype int64" in st["[/red] user-ints"]["error"]
    assert st["user-ctrl-c"]["status"] == "error" and "interrupted" in st["user-ctrl-c"]["error"]
    assert st["user-ctrl-c"]["backend"] == "user" and st["user-ctrl-c"]["kind"] == "cuda"
    assert made and not any(os.path.exists(d) for d in made)
    assert path.parent.name == r["created"].replace("-", "").replace(":", "")
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    err = capsys.readouterr().err
    assert f"report: {path}" in err and f"html:   {path.with_suffix('.html')}" in err


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_device_names_validated_at_load(tmp_path, capsys):
    for bad in ("", "  ", "a\nb"):
        with pytest.raises(ValueError, match="device name"):
            Device.wrap(bad, _f32_matmul, Capabilities("float32", "float32"))
    rc = cli.main(["--extra", "tests.test_probes_cli:_bad_dtype_device", "--extra",
                   "tests.test_probes_cli:_bad_dtype_device", "--out", str(tmp_path)])
    assert rc == 2 and "must be unique" in capsys.readouterr().err
    assert not list(tmp_path.glob("*/*"))


def test_extra_must_be_a_device_and_list_shows_extras(tmp_path, capsys):
    assert cli.main(["--extra", "math:pi", "--out", str(tmp_path)]) == 2
    assert "expected a probes.device.Device" in capsys.readouterr().err
    assert cli.main(["--extra", "no_such_module_xyz:dev", "--out", str(tmp_path)]) == 2
    assert "cannot import module" in capsys.readouterr().err
    assert cli.main(["--extra", "tests.test_probes_cli:_bad_dtype_device", "--list",
                     "--out", str(tmp_path)]) == 0
    assert "[/red] user-ints" in capsys.readouterr().err


def test_time_limit_honoured_with_one_device_and_one_job(tmp_path):
    rc = cli.main(["--extra", "tests.test_probes_cli:_slow_device", "--devices", "user-slow",
                   "--quick", "--time-limit-s", "5", "--jobs", "1", "--out", str(tmp_path), "--no-html"])
    assert rc == 0
    dev = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())["devices"][-1]
    assert dev["name"] == "user-slow" and "not finished within --time-limit-s 5" in dev["error"]
    assert dev["backend"] == "user" and dev["kind"] == "cuda"


def test_a_crash_of_the_tool_writes_a_partial_report(tmp_path, monkeypatch):
    import probes.workers as W

    def crash(chosen, opts, results, display):
        results[chosen[0]] = _unfinished_stub(chosen[0])
        raise RuntimeError("bug in the progress display")
    monkeypatch.setattr(W, "_run_inline", crash)
    rc = cli.main(["--extra", "tests.test_probes_cli:_bad_dtype_device", "--extra",
                   "tests.test_probes_cli:_interrupting_device", "--devices", "user-*,[[]/red]*",
                   "--jobs", "1", "--out", str(tmp_path), "--no-html"])
    assert rc == 1
    r = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())
    st = {d["name"]: d for d in r["devices"]}
    assert st["[/red] user-ints"]["error"] == "finished before the crash"
    assert "the run crashed (RuntimeError: bug in the progress display)" in st["user-ctrl-c"]["error"]
    assert any("partial report" in n for n in r["notes"])


def _unfinished_stub(name):
    from probes.result import DeviceResult, decide_status
    return DeviceResult.decided((name, "user", "cuda", True), decide_status(failure="finished before the crash"))


def test_quick_help_states_the_validation_count_that_runs():
    """Every validation shape runs once: 126,368 outputs (the count reports show), quick or not."""
    text = " ".join(cli.parser().format_help().split())
    assert "126,368 outputs" in text and "20000" not in text and "20,000" not in text
    assert cli.parser().parse_args(["--quick"]).validate_outputs == 126_368
