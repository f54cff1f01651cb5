"""`fp4ref probe` end to end on CPU: report written, schema-valid, virtual device fits."""
import json

from probes import cli


def test_probe_cli_virtual_and_report(tmp_path, capsys):
    rc = cli.main(["--devices", "virtual-*", "--quick", "--out", str(tmp_path), "--validate-outputs", "2000",
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
    rc = cli.main(["--extra", "probes_test_userdev:device", "--devices", "user-boom,virtual-*", "--quick",
                   "--out", str(tmp_path), "--validate-outputs", "1000", "--jobs", "1", "--no-html"])
    assert rc == 0
    r = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())
    st = {d["name"]: d["status"] for d in r["devices"]}
    assert st["user-boom"] == "error" and st["virtual-nvfp4-probe_matched"] == "fit"
    _ = np


def test_pick_survivor_prefers_the_candidate_random_sums_confirm():
    # bf16 output hides the accumulator's normalization from the probes; random sums do not
    from probes.backends.virtual import virtual_device
    from probes.cli import pick_survivor
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
        return a @ b
    return Device.wrap("user-slow", slow, Capabilities("float32", "float32"))


def test_unfinished_device_reports_its_last_stage(tmp_path):
    """At --time-limit-s a device still running is an error that says where it was (the
    worker's heartbeat), and the report is still written."""
    rc = cli.main(["--extra", "tests.test_probes_cli:_slow_device", "--devices",
                   "user-slow,virtual-*", "--quick", "--time-limit-s", "15", "--jobs", "2",
                   "--out", str(tmp_path), "--no-html"])
    assert rc == 0
    r = json.loads(next(tmp_path.glob("*/*/report.json")).read_text())
    dev = {d["name"]: d for d in r["devices"]}["user-slow"]
    assert dev["status"] == "error" and "not finished within --time-limit-s 15" in dev["error"]
    assert "last stage:" in dev["error"], dev["error"]
    assert dev["extra"]["last_progress"]["stage"] in dev["error"]
