"""Device protocol, detection, CPU backends, Blackwell packing (no GPU needed)."""
import numpy as np
import pytest

from probes.device import Capabilities, Device, DeviceError, Runner
from probes.sim import Operands


def test_capabilities_reject_bad_values():
    with pytest.raises(ValueError, match="alpha"):
        Capabilities("bfloat16", "bfloat16", alpha="columnwise")
    with pytest.raises(ValueError, match="a_format: unknown value 'bfloat17'"):
        Capabilities("bfloat17", "bfloat16")
    with pytest.raises(ValueError, match="block"):
        Capabilities("float4_e2m1fn", "float4_e2m1fn", block=16)


def test_wrap_and_runner_diagonal_packing():
    calls = []

    def fn(a, b, **_):
        calls.append((a.shape, b.shape))
        return a @ b  # float64 matmul: exact for these small integers

    dev = Device.wrap("np", fn, Capabilities("float32", "float32", probe_mn=8, k_multiple=1))
    ops = [Operands(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])),
           Operands(np.array([4.0, 0.0, 1.0]), np.array([2.0, 5.0, 1.0]))]
    out = Runner(dev).run(ops)
    assert list(out) == [6.0, 9.0]
    assert calls == [((8, 3), (3, 8))]


def test_crashing_backend_is_a_device_error():
    def boom(a, b, **_):
        raise RuntimeError("kernel exploded")
    dev = Device.wrap("boom", boom, Capabilities("float32", "float32"))
    with pytest.raises(DeviceError, match="kernel exploded"):
        dev(np.ones((2, 2)), np.ones((2, 2)))


def test_detect_reports_crash_and_continues(monkeypatch):
    import types
    import sys
    from probes.backends import Spec, detect

    bad = types.ModuleType("probes_test_badbackend")
    bad.candidates = lambda: [Spec("bad", "bad", "cpu", lambda: 1 / 0)]
    broken = types.ModuleType("probes_test_brokenmodule")

    def nope():
        raise ImportError("missing library")
    broken.candidates = nope
    monkeypatch.setitem(sys.modules, "probes_test_badbackend", bad)
    monkeypatch.setitem(sys.modules, "probes_test_brokenmodule", broken)
    got = detect(("probes_test_badbackend", "probes_test_brokenmodule", "probes.backends.cpu"))
    st = {d.name: d.status for d in got}
    assert st["bad"] == "error" and st["cpu-torch-fp32"] == "available"
    assert any(d.status == "error" and "missing library" in d.reason for d in got)


def test_blackwell_needs_sm100_here():
    from probes.backends import detect
    got = [d for d in detect(("probes.backends.blackwell",))]
    assert got and all(d.status == "unavailable" for d in got)
    assert all("sm_100" in d.reason or "transformer_engine" in d.reason for d in got)


def test_fp4_packing_round_trip():
    from probes.backends.blackwell import pack_fp4, unpack_fp4
    vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    x = np.random.default_rng(0).choice(np.concatenate([vals, -vals[1:]]), (5, 32))
    p = pack_fp4(x)
    assert p.shape == (5, 16) and p.dtype == np.uint8
    assert np.array_equal(unpack_fp4(p), x)
    # first element in the low nibble: 1.0 (code 2) then 6.0 (code 7) -> 0x72
    assert pack_fp4(np.array([[1.0, 6.0]]))[0, 0] == 0x72
    with pytest.raises(ValueError):
        pack_fp4(np.array([[0.75, 1.0]]))


def test_swizzle_matches_torchao_to_blocked():
    torch = pytest.importorskip("torch")
    try:
        from torchao.prototype.mx_formats.utils import to_blocked
    except Exception:
        pytest.skip("torchao to_blocked unavailable")
    from probes.backends.blackwell import swizzle_128x4, unswizzle_128x4
    s = np.random.default_rng(1).integers(0, 255, (200, 9)).astype(np.uint8)
    f = swizzle_128x4(s)
    assert np.array_equal(f, to_blocked(torch.from_numpy(s)).numpy())
    assert np.array_equal(unswizzle_128x4(f, 200, 9), s)


def test_blackwell_adapter_packing_end_to_end_through_inference():
    # packed operands and swizzled scales go through an emulated native call: the
    # inference must still recover the hidden model (hardware_run=false)
    from reference.gemm import get_preset
    from probes.backends.blackwell import blackwell_device, emulated_native
    from probes.infer import Inference, canonical
    hidden = get_preset("probe_matched")
    dev = blackwell_device("nvfp4", "float32", native=emulated_native(hidden, "nvfp4", "float32"))
    assert not dev.hardware_run
    dev.caps = dev.caps.__class__(**{**dev.caps.to_dict(), "max_k": 1024, "probe_mn": 0, "max_batch": 16})
    res = Inference(dev, quick=True).run()
    assert res.status == "fit"
    assert canonical(res.model.replace(name=hidden.name), dev.caps) == canonical(hidden, dev.caps)


def _cpu(name):
    from probes.backends import detect
    return [d for d in detect(("probes.backends.cpu",)) if d.name == name][0].device


def test_cpu_fp32_infers_a_model_that_validates():
    from probes.infer import Inference
    from probes.validate import validate
    dev = _cpu("cpu-torch-fp32")
    res = Inference(dev, quick=True).run()
    assert res.status == "fit", res.notes[:4]
    v = validate(dev, res.model, outputs=4000, shapes=((16, 16, 64), (32, 32, 256), (64, 64, 128)))
    assert v.record["agreement_pct"] == 100.0, (v.record["mismatches"][:2], v.per_shape)


def test_cpu_bf16_fits_and_validates_or_says_why_not():
    # the host's bf16 GEMM may use pair-wise dot instructions (AVX512-BF16 / AMX) whose
    # order is outside the family: then the report must say so with evidence
    from probes.infer import Inference
    from probes.validate import validate
    dev = _cpu("cpu-torch-bf16")
    res = Inference(dev, quick=True).run()
    if res.status == "fit":
        v = validate(dev, res.model, outputs=4000, shapes=((16, 16, 64), (32, 32, 256)))
        assert v.record["agreement_pct"] == 100.0, v.per_shape
    else:
        assert res.status == "no_fit"
        assert any("contradicted by probe" in n for n in res.notes)


def test_triton_fp8_devices_include_imprecise_zero():
    """max_num_imprecise_acc = 0 is its own device (issue 13), next to unset / 32 / 64 / 128;
    without CUDA (or Triton) building it says why instead of crashing."""
    from probes.backends import NotAvailable
    from probes.backends.triton_fp8 import candidates
    specs = {s.name: s for s in candidates()}
    assert sorted(specs) == sorted(f"triton-dot-e4m3-imprecise-{t}" for t in ("unset", "0", "32", "64", "128"))
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        with pytest.raises(NotAvailable):
            specs["triton-dot-e4m3-imprecise-0"].build()


def test_fp32_precision_switch_is_a_context_manager():
    """cuBLAS TF32 / IEEE devices switch torch's flag inside a with-block and restore it
    (the H200 run of this session found the decorator lost in a refactor: every TF32 / FP32
    call failed)."""
    from types import SimpleNamespace

    from probes.backends import cuda as C
    mm = SimpleNamespace(fp32_precision="ieee")
    fake = SimpleNamespace(backends=SimpleNamespace(cuda=SimpleNamespace(matmul=mm)))
    with C._fp32_precision(fake, True):
        assert mm.fp32_precision == "tf32"
    assert mm.fp32_precision == "ieee"
