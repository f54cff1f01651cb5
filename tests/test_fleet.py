"""`fp4ref fleet` on CPU: gloo ranks in spawned processes (torchrun, and Slurm's variables), virtual
devices standing in for GPUs, faults caught, a killed rank resumed, reports checked by schema.

The stand-in GPUs are virtual devices over hidden GemmModels (probes.backends.virtual); the
baseline written by the tests records those hidden models, so the expected verdict of every
GPU is known from how the test built it, not from the code under test.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from probes.backends.virtual import virtual_device
from probes.device import Capabilities, Device
from probes.fleet import first_host, launch_env, load_done
from probes.fleet_fingerprint import baseline_expectations, fingerprint, inject_fault, parse_fault
from reference.gemm import AlignRef, GemmModel
from reference.rounding import Mode
from reports import fleet as F
from reports.records import new_device, new_report, write_report
from reports.schema import ReportError

ROOT = Path(__file__).resolve().parents[1]

# Two stand-in GEMMs: a cuBLAS-bf16-like tensor-core model and a sequential FP32 FMA.
BF16 = Capabilities("bfloat16", "bfloat16", "float32", max_k=512, max_batch=16)
FP32 = Capabilities("float32", "float32", "float32", max_k=512, max_batch=16)
M_BF16 = GemmModel("hidden", fma_width=16, align_bits=25, align_mode=Mode.RTZ, acc_frac_bits=23,
                   norm_mode=Mode.RTZ, align_ref=AlignRef.EXPONENT_SUM)
M_FP32 = GemmModel("hidden", fma_width=1, acc_frac_bits=23, norm_mode=Mode.RNE)
SPLIT_SHAPE = (8, 8, 512)       # the library splits K in two here (a per-shape schedule)
WIDE_SHAPE = (256, 256, 16)     # 65536 outputs: a flip in 1e-4 of them shows
SHAPES = ((32, 32, 64), (16, 16, 256), SPLIT_SHAPE, WIDE_SHAPE)


def _by_shape(model):
    return lambda M, N, K: model.replace(split_k=2) if (M, N, K) == SPLIT_SHAPE else None


def _device(name, caps, model, **kw):
    return virtual_device(model, caps, name, by_shape=_by_shape(model), **kw)


def fleet_devices():
    """--extra tests.test_fleet:fleet_devices.  FLEET_TEST_FAULT on rank FLEET_TEST_FAULT_RANK:
    'noise' (a flipped last bit in 1e-4 of the outputs, per call), 'model' (bf16 GEMM
    normalizes RNE instead of RTZ: deterministic), 'die' (the process exits at its second GEMM
    while FLEET_TEST_MARKER does not exist, creating it)."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    fault = os.environ.get("FLEET_TEST_FAULT") if str(rank) == os.environ.get("FLEET_TEST_FAULT_RANK") else None
    bf = M_BF16.replace(norm_mode=Mode.RNE) if fault == "model" else M_BF16
    devs = [_device("gemm-bf16", BF16, bf, noise=1e-4 if fault == "noise" else 0.0, seed=rank),
            _device("gemm-fp32", FP32, M_FP32)]
    if fault == "die":
        marker = Path(os.environ["FLEET_TEST_MARKER"])
        inner = devs[1].fn

        def dying(a, b, **kw):
            if not marker.exists():
                marker.write_text("killed")
                os._exit(9)
            return inner(a, b, **kw)
        devs[1] = Device(devs[1].name, devs[1].backend, devs[1].kind, devs[1].caps, dying)
    return devs


def _baseline_record(name, caps, model) -> dict:
    rec = new_device(name, "virtual (hidden GemmModel)", "virtual", hardware_run=False, status="fit",
                     capabilities=caps.to_dict())
    rec["model"] = model.replace(name="inferred").to_dict()
    per = [{"shape": list(s), "kind": "normal", "outputs": s[0] * s[1], "matches": s[0] * s[1],
            "split_k": 2 if s == SPLIT_SHAPE else 1, "split_tile": None, "group_size": None, "own_model": False}
           for s in SHAPES]
    per.append({"shape": [64, 64, 100], "kind": "heavy", "outputs": 4096, "matches": 4000, "split_k": 1,
                "split_tile": None, "group_size": None, "own_model": False})  # not validated: never used
    rec["extra"] = {"per_shape": per}
    return rec


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    r = new_report(title="fleet test baseline", command="test")
    r["devices"] = [_baseline_record("gemm-bf16", BF16, M_BF16), _baseline_record("gemm-fp32", FP32, M_FP32)]
    return write_report(r, tmp_path_factory.mktemp("base") / "baseline.json", html=False)


@pytest.fixture(scope="module")
def expectations(baseline) -> dict:
    return baseline_expectations(json.loads(baseline.read_text()))


# --- launcher environment -----------------------------------------------------------------------------
def test_launch_env_torchrun_slurm_and_alone():
    assert launch_env({}) == {"launcher": "none", "rank": 0, "world_size": 1, "local_rank": 0,
                              "master_addr": None, "master_port": None}
    tr = launch_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0",
                     "MASTER_PORT": "1234"})
    assert (tr["launcher"], tr["rank"], tr["world_size"], tr["local_rank"], tr["master_addr"],
            tr["master_port"]) == ("torchrun", 3, 8, 1, "n0", 1234)
    sl = launch_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5",
                     "SLURM_JOB_NODELIST": "gpu[07-08,11],cpu1"})
    assert (sl["launcher"], sl["rank"], sl["world_size"], sl["local_rank"], sl["master_addr"],
            sl["master_port"]) == ("slurm", 5, 16, 5, "gpu07", 29500)
    assert launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9",
                       "SLURM_JOB_NODELIST": "a1"})["master_addr"] == "10.0.0.9"
    assert [first_host(s) for s in ("n1", "n[1-4]", "ab[003,9]x,c", "h1,h2")] == ["n1", "n1", "ab003", "h1"]


@pytest.mark.parametrize("env, name", [({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
                                       ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "RANK"),
                                       ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM_NTASKS"),
                                       ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "MASTER_ADDR")])
def test_launch_env_bad_values_name_the_variable(env, name):
    with pytest.raises(ValueError, match=name):
        launch_env(env)


# --- fingerprint classification (in process) ----------------------------------------------------------
def test_baseline_expectations_keep_validated_shapes_with_their_schedule(expectations):
    e = expectations["gemm-bf16"]
    assert e.model == M_BF16.replace(name="inferred")
    got = {s: m.split_k for s, m in e.shapes}
    assert got == {(32, 32, 64): 1, (16, 16, 256): 1, SPLIT_SHAPE: 2, WIDE_SHAPE: 1}


def test_fingerprint_match(expectations):
    cell = fingerprint(_device("gemm-bf16", BF16, M_BF16), expectations["gemm-bf16"], crafted=64)
    assert cell["status"] == "match" and cell["mismatches"] == 0
    assert cell["outputs"] >= 65536 + 64 and list(SPLIT_SHAPE) in cell["shapes"]


def test_fingerprint_wrong_model_is_deterministic_and_named(expectations):
    dev = _device("gemm-bf16", BF16, M_BF16.replace(norm_mode=Mode.RNE))
    cell = fingerprint(dev, expectations["gemm-bf16"], crafted=64)
    assert cell["status"] == "differs-deterministic", cell
    assert cell["evidence"]["repeats_identical"] == 2 and cell["evidence"]["mismatches"] > 0


def test_fingerprint_flipped_bits_are_nondeterministic(expectations):
    dev = _device("gemm-bf16", BF16, M_BF16, noise=1e-4, seed=3)
    cell = fingerprint(dev, expectations["gemm-bf16"], crafted=64)
    assert cell["status"] == "differs-nondeterministic", cell
    ev = cell["evidence"]
    assert ev["shape"] == list(WIDE_SHAPE) and ev["repeat_differs"] >= 1
    for f in ev["flipped"]:  # the virtual fault flips the last bit: XOR of the two outputs is 1
        assert f["xor"] == "0x00000001"
        assert int(f["first"], 16) ^ int(f["repeat"], 16) == 1


def test_injected_faults(expectations):
    good = _device("gemm-fp32", FP32, M_FP32)
    cell = fingerprint(inject_fault(good, "drop-tail:4"), expectations["gemm-fp32"], crafted=32)
    assert cell["status"] == "differs-deterministic"
    cell = fingerprint(inject_fault(good, "flip:1e-3", seed=1), expectations["gemm-fp32"], crafted=32)
    assert cell["status"] == "differs-nondeterministic"
    x = int(cell["evidence"]["flipped"][0]["xor"], 16)
    assert x and x & (x - 1) == 0 and x < 1 << 23  # one significand bit
    assert parse_fault("flip:1e-4") == ("flip", 1e-4) and parse_fault("drop-tail:16") == ("drop-tail", 16)
    for bad, what in (("zap:1", "valid choices"), ("flip:x", "number"), ("flip:2", "value")):
        with pytest.raises(ValueError, match="--inject-fault.*" + what):
            parse_fault(bad)


def test_device_error_is_an_error_cell(expectations):
    def boom(a, b, **kw):
        raise RuntimeError("kernel launch failed")
    cell = fingerprint(Device("gemm-fp32", "x", "virtual", FP32, boom), expectations["gemm-fp32"], crafted=8)
    assert cell["status"] == "error" and "kernel launch failed" in cell["error"]


# --- spawned ranks (gloo) -----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fleet_args(baseline, out, *more) -> list:
    return ["fleet", "--fingerprint", "--baseline", str(baseline), "--out", str(out),
            "--extra", "tests.test_fleet:fleet_devices", "--crafted", "64", *more]


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "FLEET_TEST_", "TORCHELASTIC"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **{k: str(v) for k, v in kw.items()})
    return env


def _spawn_ranks(world: int, args: list, *, slurm: bool = False, **kw) -> list:
    """One `python -m fp4ref fleet` process per rank, with torchrun's or srun's variables."""
    port = _free_port()
    procs = []
    for r in range(world):
        if slurm:
            v = dict(SLURM_PROCID=r, SLURM_NTASKS=world, SLURM_LOCALID=r, SLURM_JOB_NODELIST="localhost",
                     SLURM_LAUNCH_NODE_IPADDR="127.0.0.1", MASTER_PORT=port)
        else:
            v = dict(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "fp4ref", *args], cwd=ROOT, env=_env(**v, **kw),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _wait(procs, timeout=120) -> list:
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out.append((p.returncode, text))
    return out


def _reports(out: Path, world: int) -> tuple[dict, dict]:
    fleet = F.check_fleet(json.loads((out / "fleet.json").read_text()))
    health = F.check_health(json.loads((out / "health.json").read_text()))
    for r in range(world):  # the per-rank reports validate against the same schema
        one = F.check_fleet(json.loads((out / "ranks" / f"rank-{r:05d}.json").read_text()))
        assert [g["rank"] for g in one["gpus"]] == [r]
    return fleet, health


def _verdicts(fleet: dict) -> dict:
    return {g["rank"]: g["verdict"] for g in fleet["gpus"]}


def test_torchrun_two_ranks_one_flipping_bits(tmp_path, baseline):
    """Through torchrun itself: rank 1's bf16 GEMM flips a bit in about 1e-4 of its outputs."""
    out = tmp_path / "fleet"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fp4ref", *_fleet_args(baseline, out)]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(FLEET_TEST_FAULT="noise", FLEET_TEST_FAULT_RANK=1),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode != 0, p.stdout + p.stderr  # torchrun reports the workers' exit code 1 as a failure
    fleet, health = _reports(out, 2)
    assert fleet["launcher"] == "torchrun" and fleet["world_size"] == 2
    assert _verdicts(fleet) == {0: "healthy", 1: "suspect-hardware"}
    assert fleet["summary"]["exit_code"] == 1 and health["exit_code"] == 1
    bad = [c for c in fleet["cells"] if c["status"] != "match"]
    assert [(c["rank"], c["gemm"], c["status"]) for c in bad] == [(1, "gemm-bf16", "differs-nondeterministic")]
    rec = {r["rank"]: r for r in health["records"]}
    assert rec[1]["evidence"][0]["gemm"] == "gemm-bf16" and rec[1]["evidence"][0]["detail"]["flipped"]
    assert rec[0]["verdict"] == "healthy" and {e["gemm"] for e in rec[0]["evidence"]} == {"gemm-bf16", "gemm-fp32"}
    html = (out / "fleet.html").read_text()
    assert html.count('class="st st-match"') == 3 and html.count("st-differs-nondeterministic") >= 2


def test_slurm_variables_three_ranks_one_wrong_model(tmp_path, baseline):
    """srun's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID and env:// rendezvous; every rank
    exits with the fleet's code (srun reports the highest)."""
    out = tmp_path / "fleet"
    res = _wait(_spawn_ranks(3, _fleet_args(baseline, out), slurm=True, FLEET_TEST_FAULT="model",
                             FLEET_TEST_FAULT_RANK=2))
    assert [rc for rc, _ in res] == [1, 1, 1], res
    fleet, _ = _reports(out, 3)
    assert fleet["launcher"] == "slurm" and _verdicts(fleet) == {0: "healthy", 1: "healthy", 2: "numerics-differ"}
    bad = [c for c in fleet["cells"] if c["status"] != "match"]
    assert [(c["rank"], c["gemm"], c["status"]) for c in bad] == [(2, "gemm-bf16", "differs-deterministic")]
    assert bad[0]["evidence"]["shape"] and "gemm-bf16" in res[0][1] and "differs-deterministic" in res[0][1]


def test_killed_rank_resumes_from_its_log(tmp_path, baseline):
    out, marker = tmp_path / "fleet", tmp_path / "killed"
    procs = _spawn_ranks(2, _fleet_args(baseline, out, "--timeout-s", "60"), FLEET_TEST_FAULT="die",
                         FLEET_TEST_FAULT_RANK=1, FLEET_TEST_MARKER=marker)
    assert procs[1].wait(timeout=120) == 9  # killed inside its second GEMM
    _wait(procs[:1], timeout=20)            # rank 0 cannot gather without it (we end it if it waits)
    assert marker.exists() and not (out / "fleet.json").exists()
    log = out / "ranks" / "rank-00001.jsonl"
    uuid = json.loads(log.read_text().splitlines()[0])["uuid"]
    assert list(load_done(log, 1, uuid)) == ["gemm-bf16"]
    res = _wait(_spawn_ranks(2, _fleet_args(baseline, out), FLEET_TEST_FAULT="die", FLEET_TEST_FAULT_RANK=1,
                             FLEET_TEST_MARKER=marker))
    assert [rc for rc, _ in res] == [0, 0], res
    fleet, health = _reports(out, 2)
    resumed = {(c["rank"], c["gemm"]) for c in fleet["cells"] if c["resumed"]}
    assert {(1, "gemm-bf16"), (0, "gemm-bf16"), (0, "gemm-fp32")} == resumed
    assert _verdicts(fleet) == {0: "healthy", 1: "healthy"} and health["exit_code"] == 0
    assert len(load_done(log, 1, uuid)) == 2


# --- in-process command: exit codes, errors, schema, compare --------------------------------------------
def _boom_devices():
    def boom(a, b, **kw):
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")
    return [Device("gemm-fp32", "x", "virtual", FP32, boom)]


def test_single_rank_exit_codes(tmp_path, baseline, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setitem(sys.modules, "fleet_boom", type(sys)("fleet_boom"))
    sys.modules["fleet_boom"].devices = _boom_devices
    base = ["fleet", "--baseline", str(baseline), "--crafted", "16", "--no-html"]
    from reports.cli import main
    assert main([*base, "--out", str(tmp_path / "ok"), "--extra", "tests.test_fleet:fleet_devices",
                 "--devices", "gemm-fp32"]) == 0
    assert main([*base, "--out", str(tmp_path / "err"), "--extra", "fleet_boom:devices"]) == 2
    fleet = F.check_fleet(json.loads((tmp_path / "err" / "fleet.json").read_text()))
    assert fleet["gpus"][0]["verdict"] == "error" and "EXECUTION_FAILED" in fleet["cells"][0]["error"]
    assert main([*base, "--out", str(tmp_path / "det"), "--extra", "tests.test_fleet:fleet_devices",
                 "--devices", "gemm-fp32", "--inject-fault", "drop-tail:8"]) == 1
    assert main([*base, "--out", str(tmp_path / "none"), "--extra", "tests.test_fleet:fleet_devices",
                 "--devices", "nothing-*"]) == 2  # nothing checked is not healthy


@pytest.mark.parametrize("args, words", [
    (["--inject-fault", "melt:1"], ["--inject-fault", "'melt'", "flip", "drop-tail"]),
    (["--inject-fault", "flip:often"], ["--inject-fault", "number"]),
    (["--out", None], ["--out", "required"]),
    (["--baseline", None], ["--baseline", "required"]),
    (["--baseline", "/nonexistent/base.json"], ["/nonexistent/base.json"]),
])
def test_bad_arguments_are_clear_errors(tmp_path, baseline, capsys, args, words):
    from reports.cli import main
    argv = {"--baseline": str(baseline), "--out": str(tmp_path / "o")}
    for k, v in zip(args[::2], args[1::2]):
        argv[k] = v
    flat = ["fleet"] + [x for k, v in argv.items() if v is not None for x in (k, v)]
    assert main(flat) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "Traceback" not in err


def _fleet_doc(cells, gpus=("GPU-a", "GPU-b")) -> dict:
    results = [{"gpu": {"rank": r, "host": "h", "local_rank": r, "gpu_index": r, "uuid": u, "name": "H200",
                        "driver": "580", "torch": "2.11", "cuda": "13.0", "cublas": None, "triton": "3.6"},
                "error": None, "wall_s": 1.0,
                "cells": [{"rank": r, "uuid": u, "gemm": g, "status": st, "outputs": 10, "mismatches": 0,
                           "shapes": [], "evidence": None, "wall_s": 0.1, "resumed": False}
                          for (uu, g), st in cells.items() if uu == u]}
               for r, u in enumerate(gpus)]
    meta = {"command": "t", "mode": "fingerprint", "baseline": None, "launcher": "none", "world_size": len(gpus)}
    return F.check_fleet(json.loads(json.dumps(F.build_fleet(results, meta))))


def test_compare_fleet_names_regressions(tmp_path):
    old = _fleet_doc({("GPU-a", "bf16"): "match", ("GPU-a", "fp8"): "match", ("GPU-b", "bf16"): "error"})
    new = _fleet_doc({("GPU-a", "bf16"): "differs-deterministic", ("GPU-b", "bf16"): "match"})
    regs = F.compare_fleet(old, new)
    assert regs == ["GPU GPU-a GEMM bf16: match -> differs-deterministic",
                    "GPU GPU-a GEMM fp8: was match, not checked in the new report"]
    assert F.compare_fleet(old, old) == []
    gone = _fleet_doc({("GPU-a", "bf16"): "match"}, gpus=("GPU-a",))
    assert F.compare_fleet(old, gone)[0] == "GPU GPU-b: in the old report, missing from the new one"
    from reports.cli import main
    paths = []
    for i, doc in enumerate((old, new)):
        paths.append(tmp_path / f"f{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert main(["fleet", "--compare", str(paths[0]), str(paths[0])]) == 0
    assert main(["fleet", "--compare", str(paths[0]), str(paths[1])]) == 1
    paths[1].write_text(json.dumps(dict(new, schema="fp4ref.report")))
    assert main(["fleet", "--compare", str(paths[0]), str(paths[1])]) == 2


def test_schema_rejects_bad_fleet_files():
    doc = _fleet_doc({("GPU-a", "bf16"): "match"})
    bad = json.loads(json.dumps(doc))
    bad["cells"][0]["status"] = "fine"
    del bad["gpus"][0]["uuid"]
    with pytest.raises(ReportError) as e:
        F.check_fleet(bad)
    text = str(e.value)
    assert "$.cells[0].status" in text and "valid choices" in text and "$.gpus[0].uuid" in text
    with pytest.raises(ReportError, match="fp4ref.fleet"):
        F.check_fleet({"schema": "fp4ref.report"})
    assert F.check_health(F.health_summary(doc))["records"][0]["verdict"] == "healthy"


# --- HTML matrix ----------------------------------------------------------------------------------------
HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


def test_fleet_html_escapes_and_stays_offline():
    doc = _fleet_doc({("GPU-a", HOSTILE): "differs-nondeterministic", ("GPU-b", HOSTILE): "match"})
    doc["gpus"][0]["host"] = HOSTILE
    html = F.render_fleet_html(doc)
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert not re.search(r"https?:|//[a-z0-9]", html, re.I)
    assert html.count('class="st st-match"') == 1 and html.count('class="st st-differs-nondeterministic"') == 1


def test_fleet_html_in_headless_chromium(tmp_path):
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not on PATH (CI installs Debian's chromium; apt-get install -y chromium)")
    doc = _fleet_doc({("GPU-a", "bf16"): "match", ("GPU-b", "bf16"): "differs-deterministic",
                      ("GPU-b", HOSTILE): "error"})
    page = tmp_path / "fleet.html"
    page.write_text(F.render_fleet_html(doc))
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=90).stdout
    assert 'id="matrix"' in dom and dom.count('class="st st-') == 4  # 2 GPUs x 2 GEMMs, one missing
    assert "st-missing" in dom and "<script" not in dom and "<img" not in dom


# --- verify-exhaustive sharded over gloo ranks ----------------------------------------------------------
def test_shard_is_disjoint_and_covering():
    from fp4ref.harness.launch import shard
    for total in (1, 7, 1 << 16, (1 << 32) - 1):
        for world in (1, 2, 3, 8):
            parts = [shard(total, r, world) for r in range(world)]
            assert parts[0][0] == 0 and parts[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_verify_sharded_over_two_ranks_equals_one_rank(tmp_path):
    args = ["verify-exhaustive", "--limit", str(1 << 18), "--formats", "float4_e2m1fn,float8_e4m3fn",
            "--modes", "rne,rtz", "--device", "cpu", "--extra", "0x3F400000"]
    one = subprocess.run([sys.executable, "-m", "fp4ref", *args, "--out", str(tmp_path / "one.json")],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stdout + one.stderr
    res = _wait(_spawn_ranks(2, [*args, "--out", str(tmp_path / "two.json")]))
    assert [rc for rc, _ in res] == [0, 0], res
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert b["ranks"] == 2 and a["ranks"] == 1
    strip = lambda r: {f: {m: {be: (x["inputs"], x["mismatches"]) for be, x in bes.items()}  # noqa: E731
                           for m, bes in ms.items()} for f, ms in r["results"].items()}
    assert strip(a) == strip(b) and strip(a)["float4_e2m1fn"]["RNE"]["torch"] == ((1 << 18) + 1, 0)
    assert "rank 1 of 2: inputs [131072, 262144)" in res[1][1]


# --- on the GPU -------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fleet_fingerprint_healthy_then_injected_fault(tmp_path):
    """torchrun, one rank on this GPU, two cuBLAS GEMMs against the committed H200 baseline."""
    base = ROOT / "reports" / "baselines" / "h200-580.159.04.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "fp4ref",
           "fleet", "--fingerprint", "--baseline", str(base), "--devices", "cuda-cublas-bfloat16,cuda-scaled_mm-*-slow-float32"]
    ok = subprocess.run([*cmd, "--out", str(tmp_path / "ok")], cwd=ROOT, env=_env(), capture_output=True, text=True,
                        timeout=300)
    fleet = F.check_fleet(json.loads((tmp_path / "ok" / "fleet.json").read_text()))
    assert ok.returncode == 0 and fleet["gpus"][0]["verdict"] == "healthy", ok.stdout + ok.stderr
    subprocess.run([*cmd, "--out", str(tmp_path / "bad"), "--inject-fault", "flip:1e-3"], cwd=ROOT, env=_env(),
                   capture_output=True, text=True, timeout=300)
    fleet = F.check_fleet(json.loads((tmp_path / "bad" / "fleet.json").read_text()))
    assert fleet["gpus"][0]["verdict"] == "suspect-hardware"
