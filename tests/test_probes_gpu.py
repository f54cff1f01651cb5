"""CUDA adapters on tiny shapes (skipped without a GPU; run with `make test-gpu`)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _small_exact(caps, M=64, N=64, K=128, seed=0):
    # small integers times powers of two: every product and partial sum is exact in any
    # accumulator of the family, so each adapter must return the exact result
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (M, K)).astype(np.float64) * 0.5
    b = rng.integers(-3, 4, (K, N)).astype(np.float64)
    return a, b, a @ b


def test_cuda_adapters_exact_on_tiny_shapes():
    from probes.backends import detect
    devs = [d for d in detect(("probes.backends.cuda", "probes.backends.triton_fp8")) if d.device is not None]
    if not devs:
        pytest.skip("no CUDA adapter available")
    for d in devs:
        caps = d.device.caps
        a, b, exact = _small_exact(caps)
        kw = {}
        if caps.alpha == "tensorwise":
            kw["alpha"] = (1.0, 1.0)
        elif caps.alpha == "rowwise":
            kw["alpha"] = (np.ones(a.shape[0]), np.ones(b.shape[1]))
        got = d.device(a, b, **kw)
        assert np.array_equal(got, exact), d.name


def test_cuda_probe_quick_inference_runs():
    from probes.backends import detect
    from probes.infer import Inference
    devs = [d for d in detect(("probes.backends.cuda",)) if d.device is not None and d.name == "cuda-cublas-bfloat16"]
    if not devs:
        pytest.skip("cuBLAS bf16 adapter unavailable")
    res = Inference(devs[0].device, quick=True).run()
    assert res.status in ("fit", "no_fit")
    assert res.probes
