"""Fused current scaling (amax and s_enc_params in the amax kernel, nvfp4.quantize_packed)
== the unfused path (TQ.amax -> s_enc_params -> two_level_1x16), bit for bit, including
amax = 0, tiny, huge, inf and NaN.  Without CUDA: the Triton interpreter."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
# without CUDA: run in a process of its own under TRITON_INTERPRET=1 (tests/test_interpreter.py)
pytestmark = pytest.mark.triton_interpret

from fp4ref.quant import nvfp4 as FN  # noqa: E402
from fp4ref.quant import triton_quant as TQ  # noqa: E402
from fp4ref.quant import ue5m3 as FU  # noqa: E402

_DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _bits(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).contiguous().view(torch.int32).cpu().tolist()


def _cases():
    g = torch.Generator().manual_seed(7)
    r = torch.randn(6, 64, generator=g)
    big = torch.finfo(torch.bfloat16).max
    tiny = 2.0 ** -133                                       # bf16 subnormal
    out = {"random": r, "zeros": torch.zeros(6, 64), "neg_zeros": -torch.zeros(6, 64),
           "tiny": torch.where(r > 0, tiny, -tiny), "huge": r.sign() * big,
           "wide": r * torch.exp2(torch.randint(-130, 127, (6, 64), generator=g).float())}
    for name, v in (("inf", float("inf")), ("neg_inf", float("-inf")), ("nan", float("nan"))):
        t = r.clone()
        t[2, 5] = v
        out[name] = t
    return {k: v.to(torch.bfloat16).to(_DEV) for k, v in out.items()}


def _unfused(x, T, zero_amax, scale_fmt, z1, amax=None):
    g = TQ.amax(x) if amax is None else torch.tensor(amax, dtype=torch.float32, device=x.device)
    s_enc, dec, mult = FN.s_enc_params(g, T, zero_amax)
    q, s = TQ.two_level_1x16(x, torch.stack((mult, dec)), scale_fmt, z1)
    return q, s, torch.stack((mult, dec, s_enc, g))


@pytest.mark.parametrize("name", list(_cases()))
def test_fused_current_scaling_equals_unfused(name):
    x = _cases()[name]
    if not TQ.available(x):
        pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
    for profile, rule in (("te_nvfp4", None), ("ue5m3", FU.UE5M3_RULE)):
        r = rule or FN.NVFP4_RULES[profile]
        for T in ((None, 2048) if rule else (None,)):
            Tf = FN._fconst(r.target if T is None else T)
            for amax in (None, 0.0, 1e-30, 3.0, float("inf"), float("nan")):
                q1, s1, p1 = FN.quantize_packed(x, profile, amax=amax, target=T, rule=rule)
                q2, s2, p2 = _unfused(x, Tf, r.zero_amax, r.scale_fmt, r.zero_scale_to_one, amax)
                assert torch.equal(q1, q2) and torch.equal(s1, s2), (profile, T, amax)
                assert _bits(p1) == _bits(p2), (profile, T, amax, _bits(p1), _bits(p2))


@pytest.mark.parametrize("zero_amax", ["one", "flt_max"])
def test_params_kernel_edge_amax(zero_amax):
    """te_params on given amax values (including negative and -0, which s_enc_params accepts)."""
    if not TQ.available(torch.zeros(1, device=_DEV)):
        pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
    for T in (448.0, 2048.0, 1.0, 1e-3):
        c = FN._fconst(T * 6)
        for v in (0.0, -0.0, 1e-45, 1e-40, 1e-30, 1.0, 3.0, 2688.0, 1e30, 3.4e38,
                  float("inf"), float("-inf"), float("nan"), -1.0):
            g = torch.tensor(v, dtype=torch.float32, device=_DEV)
            s_enc, dec, mult = FN.s_enc_params(g, T, zero_amax)
            got = TQ.te_params(None, c, zero_amax == "one", g)
            assert _bits(got) == _bits(torch.stack((mult, dec, s_enc, g))), (T, v)


def test_quantize_triton_backend_equals_torch():
    """The public current-scaling path (now fused) against the torch backend."""
    for name, x in _cases().items():
        if not TQ.available(x):
            pytest.skip("needs triton and CUDA or TRITON_INTERPRET=1")
        a = FN.quantize(x, "te_nvfp4", backend="triton")
        b = FN.quantize(x, "te_nvfp4", backend="torch")
        assert a.same_bits(b), name
        for k in ("amax", "s_enc"):
            assert _bits(a.meta[k]) == _bits(b.meta[k]), (name, k)
        u = FU.quantize(x, backend="triton")
        assert u.same_bits(FU.quantize(x, backend="torch")), name


def test_quantize_packed_rejects():
    x = torch.zeros(4, 24, dtype=torch.bfloat16, device=_DEV)
    with pytest.raises(ValueError):
        FN.quantize_packed(x)                      # K not a multiple of 16
    with pytest.raises(ValueError):
        FN.quantize_packed(x[:, :16], "te_nvfp4_4over6")
