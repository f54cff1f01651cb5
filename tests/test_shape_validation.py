"""Random-shape validation (probes.shape_validation) on CPU virtual devices: uniform draws,
refusals, resume, decoded mismatches, summary counts."""
from __future__ import annotations

import json
import struct
from fractions import Fraction

import numpy as np
import pytest

from probes.backends.virtual import virtual_device
from probes.device import Capabilities, Device
from probes.shape_validation import (MAX_DRAWS_PER_SHAPE, _stable_seed, draw_shapes, main, read_log,
                                     summarize, validate_shapes)
from reference.gemm import dot, get_preset
from reference.notation import to_dict

MODEL = get_preset("fp32_sequential")
CAPS = Capabilities("bfloat16", "bfloat16", "float32", max_k=64)
TINY = dict(max_mn=6, max_k=24)


def _same_model(dev, shape, *, base_model, table=None, seed=0):
    """explain_shape stand-in: the base model at every shape (what is validated is then
    exactly the base model, independent of the explainer's search)."""
    from fp4ref.native import ShapeSchedule
    return ShapeSchedule(dev.name, shape, base_model)


def _run(devs, log, n, **kw):
    kw = {**TINY, "explain": _same_model, **kw}
    return validate_shapes(devs, base_models={d.name: MODEL for d in devs}, shapes_per_device=n,
                           log_path=log, **kw)


def _chi2(counts) -> float:
    counts = np.asarray(counts, float)
    e = counts.sum() / len(counts)
    return float(((counts - e) ** 2 / e).sum())


# chi-square critical values at p = 0.001 (df = 15 and 7): a fixed seed, so never flaky
CHI2_15, CHI2_7 = 37.70, 24.32


def test_draws_are_uniform_without_multiple_bias():
    rng = np.random.default_rng(7)
    shapes = np.array(draw_shapes(rng, 8000, max_mn=64, max_k=128))
    assert shapes[:, :2].min() == 1 and shapes[:, :2].max() == 64
    assert shapes[:, 2].min() == 1 and shapes[:, 2].max() == 128
    for col in range(3):  # residues mod 16: a rounding to multiples of 8 or 16 would pile up at 0
        assert _chi2(np.bincount(shapes[:, col] % 16, minlength=16)) < CHI2_15
    assert _chi2(np.bincount((shapes[:, 2] - 1) // 16, minlength=8)) < CHI2_7  # K over its range
    # one at a time and all at once: the same stream (resume draws one at a time)
    a = draw_shapes(np.random.default_rng(3), 5)
    b = draw_shapes(np.random.default_rng(3), 2) + draw_shapes(np.random.default_rng(3), 5)[2:]
    assert a == b


def test_draw_shapes_rejects_bad_bounds():
    with pytest.raises(ValueError, match="max_mn"):
        draw_shapes(np.random.default_rng(0), 1, max_mn=0)


def _refuser(name="refuser"):
    """A library that takes only K % 4 == 0 and N % 2 == 0 (as _scaled_mm needs 16)."""
    inner = virtual_device(MODEL, CAPS, name)

    def fn(a, b, **kw):
        if a.shape[1] % 4 or b.shape[1] % 2:
            raise RuntimeError(f"K={a.shape[1]}, N={b.shape[1]}: need K % 4 == 0 and N % 2 == 0")
        return inner.fn(a, b, **kw)
    return Device(name, "test", "virtual", CAPS, fn)


def _filtered_stream(name, n_accepted, accepts, max_mn, max_k):
    """Oracle: the seeded uniform stream, filtered by the library's rule (rejection sampling:
    accepted shapes are uniform among the shapes the library accepts); an accepted shape
    drawn again is not run again.  [(draw index, shape, refused draws before it)]."""
    stream = draw_shapes(np.random.default_rng(_stable_seed(0, name, max_mn, max_k)), 10000, max_mn=max_mn, max_k=max_k)
    out, seen, refused = [], set(), 0
    for i, sh in enumerate(stream):
        if not accepts(sh):
            refused += 1
        elif sh not in seen:
            seen.add(sh)
            out.append((i, sh, refused))
            refused = 0
    return out[:n_accepted]


def test_refused_shapes_are_counted_and_accepted_ones_are_the_filtered_stream(tmp_path):
    log = tmp_path / "s.jsonl"
    res = _run([_refuser()], log, 40, max_mn=6, max_k=24)
    assert res["stopped"] is None and res["devices"]["refuser"]["accepted"] == 40
    recs = read_log(log)
    want = _filtered_stream("refuser", 40, lambda s: not (s[2] % 4 or s[1] % 2), 6, 24)
    assert [(r["draw"], tuple(r["shape"]), r["refused_before"]) for r in recs] == want
    assert all(r["refused"] is None for r in recs)
    assert "need K % 4 == 0" in next(r["refused_example"] for r in recs if r["refused_before"])
    s = summarize(log)["refuser"]
    assert s["validated"] == 40 and s["refused"] == sum(w[2] for w in want) and s["bit_exact_shapes"] == 40
    assert s["tried"] == 40 + s["refused"] and "need K % 4 == 0" in s["refusal"]


def test_declared_capabilities_refuse_without_a_call(tmp_path):
    """A device drawing through the protocol's default refuses exactly the shapes its caps
    exclude; those are counted without calling it (one draw in 2 * 2 * 8 accepted here)."""
    caps = Capabilities("bfloat16", "bfloat16", "float32", max_k=64, mn_multiple=2, k_multiple=8)
    dev = virtual_device(MODEL, caps, "tiles")
    log = tmp_path / "d.jsonl"
    drawn, real_draw = [], dev.draw
    dev.draw = lambda *a, **k: drawn.append(a[:3]) or real_draw(*a, **k)
    _run([dev], log, 6, max_mn=6, max_k=24)
    want = _filtered_stream("tiles", 6, lambda s: not (s[0] % 2 or s[1] % 2 or s[2] % 8), 6, 24)
    recs = read_log(log)
    assert [(r["draw"], tuple(r["shape"]), r["refused_before"]) for r in recs] == want
    assert drawn == [w[1] for w in want]  # only accepted shapes reached the device
    assert "declared capabilities" in summarize(log)["tiles"]["refusal"]


def test_a_device_refusing_everything_stops_at_the_draw_cap(tmp_path, monkeypatch):
    import probes.shape_validation as sv
    monkeypatch.setattr(sv, "MAX_DRAWS_PER_SHAPE", 5)
    dev = Device("never", "test", "virtual", CAPS, lambda a, b, **kw: (_ for _ in ()).throw(RuntimeError("no")))
    res = _run([dev], tmp_path / "n.jsonl", 3)
    assert "draws in a row refused" in res["devices"]["never"]["stopped"]
    (line,) = read_log(tmp_path / "n.jsonl")  # one line: the cap, with the 5 refusals
    assert line["capped"] and line["refused_before"] == 5 and line["draw"] == 4
    assert summarize(tmp_path / "n.jsonl")["never"]["refused"] == 5
    assert MAX_DRAWS_PER_SHAPE >= 1024


def test_resume_after_interruption_gives_the_same_sequence_without_duplicates(tmp_path):
    devs = [_refuser("r1"), virtual_device(MODEL, CAPS, "v2")]
    fresh = tmp_path / "fresh.jsonl"
    _run(devs, fresh, 6)
    cut = tmp_path / "cut.jsonl"
    seen = []

    def stop_after_four(name, shape, fields):
        seen.append(shape)
        if len(seen) == 4:
            raise KeyboardInterrupt
    res = _run(devs, cut, 6, progress=stop_after_four)
    assert res["stopped"].startswith("interrupted")
    assert len(read_log(cut)) == 4 == res["new"]  # every finished shape is in the log
    with open(cut, "a") as f:
        f.write('{"device": "r1", "shape": [1, ')  # a writer killed mid-line
    _run(devs, cut, 3)  # a smaller target first: each device only tops up to 3
    _run(devs, cut, 6)
    key = lambda r: (r["device"], r["draw"], tuple(r["shape"]), r["refused_before"], r.get("matches"))  # noqa: E731
    assert sorted(map(key, read_log(cut))) == sorted(map(key, read_log(fresh)))
    assert len({(r["device"], tuple(r["shape"])) for r in read_log(cut)}) == len(read_log(cut))
    assert _run(devs, cut, 6)["new"] == 0


def _pairwise_at_large_k(name):
    """A library running another kernel (FP32 pairwise tree, outside the family) at K > 12."""
    return virtual_device(MODEL, CAPS, name, by_shape=lambda M, N, K: "pairwise" if K > 12 else None)


def _f32_hex(x: float) -> str:
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


def test_a_schedule_change_shows_as_non_bit_exact_shapes_with_the_mismatch_decoded(tmp_path):
    dev = _pairwise_at_large_k("split")
    log = tmp_path / "m.jsonl"
    _run([dev], log, 12, max_mn=5, max_k=40)
    recs = read_log(log)
    s = summarize(log)["split"]
    bad = [r for r in recs if r["matches"] != r["outputs"]]
    assert bad and all(r["shape"][2] > 12 for r in bad)
    assert all(r["matches"] == r["outputs"] for r in recs if r["shape"][2] <= 12)
    assert s["bit_exact_shapes"] == len(recs) - len(bad)
    worst = min(bad, key=lambda r: (r["matches"] / r["outputs"], r["shape"]))
    assert (s["worst"][0]["shape"], s["worst"][0]["matches"]) == (worst["shape"], worst["matches"])
    r = bad[0]
    fm = r["first_mismatch"]
    i, j = fm["index"]
    # independent oracle: the exact reference dot product of that output's row and column
    batch = dev.draw(*r["shape"], _stable_seed(0, "split", r["draw"]))
    a = batch.a.numpy()[i]
    b = batch.b.numpy()[:, j]
    want = dot(MODEL, [Fraction(float(x)) for x in a], [Fraction(float(y)) for y in b])
    assert float(fm["emulated"]) == float(want)
    assert fm["emulated_bits"] == _f32_hex(float(want)) and fm["native_bits"] == _f32_hex(float(fm["native"]))
    assert fm["native_bits"] != fm["emulated_bits"]


def test_summary_counts_from_records():
    env = {"device": "d"}
    recs = [{"device": "d", "env": env, "shape": [1, 2, 3], "refused": "no"},
            {"device": "d", "env": env, "shape": [2, 2, 3], "refused": None, "outputs": 4, "matches": 4},
            {"device": "d", "env": env, "shape": [3, 2, 3], "refused": None, "outputs": 6, "matches": 1,
             "kernels": ["k_align1"], "family": "f"},
            {"device": "d", "env": env, "shape": [4, 2, 3], "refused": None, "error": "ValueError: x"},
            {"device": "e", "env": env, "shape": [4, 2, 3], "refused": None, "outputs": 8, "matches": 8}]
    s = summarize(recs)
    assert {k: s["d"][k] for k in ("tried", "refused", "errors", "validated", "bit_exact_shapes", "outputs",
                                   "bit_exact_outputs")} == dict(tried=4, refused=1, errors=1, validated=2,
                                                                 bit_exact_shapes=1, outputs=10, bit_exact_outputs=5)
    assert [w["shape"] for w in s["d"]["worst"]] == [[4, 2, 3], [3, 2, 3]]
    assert s["d"]["worst"][1]["kernels"] == ["k_align1"] and s["e"]["bit_exact_shapes"] == 1


def test_time_limit_stops_cleanly(tmp_path):
    res = _run([virtual_device(MODEL, CAPS, "t")], tmp_path / "t.jsonl", 50, time_limit_s=1e-6)
    assert res["stopped"].startswith("time limit") and "0 of 50" in res["devices"]["t"]["stopped"]


def test_bad_arguments_name_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="shapes_per_device"):
        _run([virtual_device(MODEL, CAPS, "x")], tmp_path / "x.jsonl", -1)
    with pytest.raises(ValueError, match="outputs"):
        _run([virtual_device(MODEL, CAPS, "x")], tmp_path / "x.jsonl", 1, outputs=0)


def test_sampled_outputs_and_real_explainer(tmp_path):
    """The default explainer (probes.explain) on a device the base model fits: every shape
    bit-exact; at least ``outputs`` outputs per shape, all of them where M * N is smaller."""
    dev = virtual_device(MODEL, CAPS, "plain")
    log = tmp_path / "p.jsonl"
    validate_shapes([dev], base_models={"plain": MODEL}, shapes_per_device=3, log_path=log,
                    max_mn=40, max_k=8, outputs=64)
    for r in read_log(log):
        M, N, _ = r["shape"]
        assert r["outputs"] == (M * N if M * N <= 64 else r["outputs"]) and r["outputs"] >= min(64, M * N)
        assert r["matches"] == r["outputs"]


def test_command_writes_log_and_summary(tmp_path, capsys):
    base = tmp_path / "base.json"
    model = to_dict(get_preset("probe_matched").replace(output="float32"))
    base.write_text(json.dumps({"devices": [{"name": "virtual-nvfp4-probe_matched", "model": model}]}))
    log, summ = tmp_path / "c.jsonl", tmp_path / "c.json"
    rc = main(["--baseline", str(base), "--devices", "virtual-nvfp4-probe_matched", "--shapes", "2",
               "--max-mn", "4", "--max-k", "48", "--log", str(log), "--summary-json", str(summ),
               "--table", str(tmp_path / "table.json")])
    assert rc == 0
    from fp4ref.native import ScheduleTable
    assert len(ScheduleTable.load(tmp_path / "table.json").shapes("virtual-nvfp4-probe_matched")) == 2
    s = json.loads(summ.read_text())["devices"]["virtual-nvfp4-probe_matched"]
    assert s["validated"] == 2 and s["refused"] == s["tried"] - 2  # K % 16 != 0 is refused
    assert "random-shape validation" in capsys.readouterr().out


# --- the bounded form inside `fp4ref probe` -------------------------------------------------------
def test_probe_run_attaches_random_shapes_and_the_report_schema_checks_them(monkeypatch):
    import copy
    import probes.workers as W
    from probes.result import DeviceResult, decide_status
    from reports.records import device_record, new_report
    from reports.schema import validate_report
    hw = Device("hw", "test", "cpu", CAPS, virtual_device(MODEL, CAPS, "x").fn)  # a non-virtual device
    monkeypatch.setattr(W, "_worker", lambda name, opts, **kw: DeviceResult.decided(
        ("hw", "test", "cpu", True), decide_status("no_fit"), model=MODEL))  # the probe, skipped
    monkeypatch.setattr(W, "_rebuild", lambda name, opts: hw)
    results = {}

    class Quiet:
        def show(self, running): pass
        def advance(self): pass
    W.run_devices(["hw"], W.RunOptions(random_shapes=2, random_shapes_max_mn=8), results, Quiet())
    rs = results["hw"].extra["random_shapes"]
    assert rs["requested"] == 2 and rs["validated"] == 2 and rs["bit_exact_shapes"] == 2 and rs["stopped"] is None
    report = new_report(title="t")
    report["devices"] = [device_record(results["hw"])]
    assert validate_report(report) == []
    bad = copy.deepcopy(report)
    bad["devices"][0]["extra"]["random_shapes"]["bit_exact_shapes"] = 3
    assert any("bit_exact_shapes: 3 exceeds validated 2" in e for e in validate_report(bad))
    from reports.html import render_html
    page = render_html(report)
    row = rs["shapes"][0]
    assert "Random shapes" in page and " x ".join(map(str, row["shape"])) in page
    assert f"{row['matches']}/{row['outputs']}" in page


def test_bounded_run_does_not_start_without_time(tmp_path):
    import time
    from probes.shape_validation import bounded_run
    rec = bounded_run(virtual_device(MODEL, CAPS, "late"), MODEL, shapes=3, seed=0, log_path=tmp_path / "l.jsonl",
                      until=time.time() + 1)
    assert rec["tried"] == 0 and rec["stopped"].startswith("not started")


@pytest.mark.gpu
def test_cuda_random_shapes_smoke(tmp_path):
    """On a GPU: two small random shapes of cuBLAS bf16 and of a _scaled_mm device run end to
    end (kernel names from the profiler, sampled outputs compared); refused _scaled_mm shapes
    are logged.  Bit-exactness is what `make validate-shapes` measures, not asserted here."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from pathlib import Path
    from probes.backends import detect
    from probes.shape_validation import load_base_models
    models = load_base_models(Path(__file__).resolve().parents[1] / "reports/baselines/redesign/h200-probe-after.json")
    names = ("cuda-cublas-bfloat16", "cuda-scaled_mm-e4m3-tensorwise-fast-float32")
    devs = [d.device for d in detect(include=lambda s: s.name in names) if d.device is not None]
    log = tmp_path / "g.jsonl"
    res = validate_shapes(devs, base_models=models, shapes_per_device=2, log_path=log, max_mn=64, max_k=256)
    assert all(v["accepted"] == 2 for v in res["devices"].values()), res
    s = summarize(log)
    assert s["cuda-cublas-bfloat16"]["validated"] == 2 and s["cuda-cublas-bfloat16"]["outputs"] > 0
    assert any(r["kernels"] for r in read_log(log) if r.get("refused") is None)


def test_an_adapter_bug_is_an_error_not_a_refusal(tmp_path):
    """A TypeError inside the adapter (the H200 run met one: the TF32 switch had lost its
    context manager) is logged as a tool error; only the library's RuntimeError / ValueError
    count as refused shapes."""
    def fn(a, b, **kw):
        raise TypeError("'generator' object does not support the context manager protocol")
    dev = Device("buggy", "test", "virtual", CAPS, fn)
    _run([dev], tmp_path / "b.jsonl", 2, max_mn=6, max_k=24)
    recs = read_log(tmp_path / "b.jsonl")
    assert recs and all(r["refused"] is None and "TypeError" in r["error"] for r in recs)
    s = summarize(tmp_path / "b.jsonl")["buggy"]
    assert s["refused"] == 0 and s["errors"] == len(recs)


def test_retry_misses_checks_missed_shapes_again_and_supersedes_them(tmp_path):
    """--retry-misses: the logged shapes whose latest line missed are run again first (same
    draw, same operands); the summary counts each shape once, by its newest line."""
    log = tmp_path / "r.jsonl"
    _run([_pairwise_at_large_k("dev")], log, 8, max_mn=5, max_k=40)
    first = read_log(log)
    bad = [(r["draw"], r["shape"]) for r in first if r["matches"] != r["outputs"]]
    assert bad and summarize(log)["dev"]["bit_exact_shapes"] == len(first) - len(bad)
    fixed = virtual_device(MODEL, CAPS, "dev")   # what a better tool now explains
    res = _run([fixed], log, 8, max_mn=5, max_k=40, retry_misses=True)
    again = read_log(log)[len(first):]
    assert [(r["draw"], r["shape"]) for r in again] == bad and all(r.get("retry") for r in again)
    assert res["new"] == len(bad)
    s = summarize(log)["dev"]
    assert (s["validated"], s["bit_exact_shapes"], s["superseded"]) == (len(first), len(first), len(bad))
    _run([fixed], log, 8, max_mn=5, max_k=40, retry_misses=True)   # nothing left to retry
    assert len(read_log(log)) == len(first) + len(bad)
