"""fp4ref.gemm.emulate == reference.gemm.dot, bit for bit, for every preset and for
hypothesis-drawn points of the model family, on adversarial operands."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from reference.gemm import PRESETS, GemmModel, ScalePoint
from fp4ref.gemm import emulate, round_float

from .gemm_helpers import (OPERAND_KINDS, matrices, mismatch, ref_matmul, same_bits,
                           scale_value)

_slow = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                 deadline=None)


def _check(model, a, b, paths=("auto",), **kw):
    try:
        want = ref_matmul(model, a, b, **kw)
    except ValueError:
        with pytest.raises(ValueError):
            emulate(model, a, b, **kw)
        assume(False)
        return
    for p in paths:
        got = emulate(model, a, b, _paths=p, **kw)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert same_bits(got, want), f"{model} paths={p}: {mismatch(got, want)}"


@st.composite
def problem(draw, blocked=None, kmax=96):
    blocked = draw(st.booleans()) if blocked is None else blocked
    M = draw(st.integers(1, 3))
    N = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(OPERAND_KINDS))
    kw = {}
    if blocked:
        block = draw(st.sampled_from((1, 2, 4, 16, 32)))
        nb = draw(st.integers(1, max(1, kmax // block)))
        K = block * nb
        sk = draw(st.sampled_from(("narrow", "wide", "special")))
        sa = draw(st.lists(scale_value(sk), min_size=M * nb, max_size=M * nb))
        sb = draw(st.lists(scale_value(sk), min_size=N * nb, max_size=N * nb))
        kw = dict(scales_a=torch.tensor(sa).reshape(M, nb), scales_b=torch.tensor(sb).reshape(nb, N),
                  block=block)
    else:
        K = draw(st.integers(1, kmax))
    a, b = draw(matrices(M, K, N, kind))
    return a, b, kw


@pytest.mark.parametrize("name", list(PRESETS))
@given(prob=problem())
def test_presets(name, prob):
    a, b, kw = prob
    _check(PRESETS[name], a, b, **kw)


@_slow
@given(prob=problem(blocked=True, kmax=512))
def test_probe_matched_long_k(prob):
    a, b, kw = prob
    for name in ("probe_matched", "probe_matched_lattice", "decoded_fp32"):
        _check(PRESETS[name], a, b, **kw)


@st.composite
def family_point(draw):
    from .gemm_helpers import gemm_models
    blocked = draw(st.booleans())
    model = draw(gemm_models(blocked))
    a, b, kw = draw(problem(blocked=blocked, kmax=64))
    K = a.shape[1]
    if blocked and model.scale_point is ScalePoint.GROUP:
        model = model.replace(group_size=kw["block"])
    if K % model.split_k or (blocked and (K // model.split_k) % kw["block"]):
        model = model.replace(split_k=1)
    alpha = draw(st.sampled_from((None, "scalar", "tensor", "list")))
    M, N = a.shape[0], b.shape[1]
    if alpha == "scalar":
        kw["alpha"] = draw(st.sampled_from((0.1, 3.0, 2.0 ** -140, 1e30, -0.5)))
    elif alpha == "tensor":
        kw["alpha"] = torch.tensor(draw(st.lists(st.floats(-4, 4, width=32), min_size=M, max_size=M)))[:, None]
    elif alpha == "list":
        kw["alpha"] = [draw(st.sampled_from((1.5, 2.0 ** 100, 0.3))), torch.full((1, N), 2.0 ** -90)]
    return model, a, b, kw


@_slow
@given(family_point())
def test_family_points(pt):
    model, a, b, kw = pt
    _check(model, a, b, paths=("auto", "generic"), **kw)


@_slow
@given(prob=problem(kmax=48), model=st.sampled_from(list(PRESETS.values())))
def test_limb_accumulator_path(prob, model):
    """Every exact sum through the multi-limb accumulator (the huge-spread path)."""
    a, b, kw = prob
    _check(model, a, b, paths=("limbs",), **kw)


def test_cancellation_and_spread_explicit():
    big = 2.0 ** 100
    a = torch.tensor([[big, 1.0, -big, 2.0 ** -120]])
    b = torch.tensor([[1.0], [2.0 ** -80], [1.0], [2.0 ** 3]])
    for name in PRESETS:
        _check_plain(PRESETS[name], a, b)
    got = emulate("exact", a, b)
    assert float(got) == float(torch.tensor(2.0 ** -80 + 2.0 ** -117, dtype=torch.float32))


def _check_plain(model, a, b, **kw):
    want = ref_matmul(model, a, b, **kw)
    for p in ("auto", "generic", "limbs"):
        got = emulate(model, a, b, _paths=p, **kw)
        assert same_bits(got, want), f"{model.name} {p}: {mismatch(got, want)}"


def test_ties_and_subnormals():
    # a 64-group sum exactly halfway between FP32 neighbours, and subnormal results
    a = torch.tensor([[1.0] + [2.0 ** -24] + [0.0] * 62])
    b = torch.ones(64, 1)
    _check_plain(PRESETS["probe_matched"], a, b)
    assert float(emulate("probe_matched", a, b)) == 1.0  # tie to even
    a2 = torch.tensor([[1.0] + [2.0 ** -24] * 3 + [0.0] * 60])
    assert float(emulate("probe_matched", a2, b)) == 1.0 + 2.0 ** -22  # 1+3*2^-24 rounds up
    tiny = torch.tensor([[2.0 ** -75, -(2.0 ** -75) * 3]])
    _check_plain(PRESETS["fp32_sequential"], tiny, torch.tensor([[2.0 ** -75], [2.0 ** -76]]))
    sc = torch.tensor([[2.0 ** -17, 0.0]])  # zero and subnormal ue5m3-like scales
    _check_plain(PRESETS["probe_matched"], torch.ones(1, 32), torch.ones(32, 2),
                 scales_a=sc, scales_b=torch.tensor([[2.0 ** -17, 3.0], [1.0, 1.0]]), block=16)


@pytest.mark.parametrize("K", [64, 256])
def test_random_nvfp4_like_all_paths(K):
    g = torch.Generator().manual_seed(K)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    M, N = 3, 4
    a = e2m1[torch.randint(0, 8, (M, K), generator=g)] * (torch.randint(0, 2, (M, K), generator=g) * 2 - 1)
    b = e2m1[torch.randint(0, 8, (K, N), generator=g)] * (torch.randint(0, 2, (K, N), generator=g) * 2 - 1)
    sa = (torch.randint(8, 16, (M, K // 16), generator=g) * 2.0 ** torch.randint(-12, 6, (M, K // 16), generator=g))
    sb = (torch.randint(8, 16, (K // 16, N), generator=g) * 2.0 ** torch.randint(-12, 6, (K // 16, N), generator=g))
    for name in PRESETS:
        _check_plain(PRESETS[name], a, b, scales_a=sa, scales_b=sb, block=16,
                     alpha=[torch.tensor(0.75), 2.0 ** -7])


def test_round_float_matches_torch_casts():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-140, 130, (4096,), generator=g)
    x = torch.cat([x, torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0, 65520.0, 65519.0])])
    for fmt, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        want = x.to(dt).to(torch.float64)  # torch casts: RNE with IEEE overflow
        got = round_float(x, fmt, "rne")
        assert same_bits(got, want) or bool(((got == want) | (got.isnan() & want.isnan())).all()), fmt


def test_bad_input():
    a = torch.ones(2, 8)
    b = torch.ones(8, 3)
    with pytest.raises(ValueError, match="block: K=8 is not a multiple of block=3"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2), scales_b=torch.ones(2, 3), block=3)
    with pytest.raises(ValueError, match=r"scales_a: shape \(2, 3\)"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 3), scales_b=torch.ones(2, 3), block=4)
    with pytest.raises(ValueError, match=r"scales_b: shape \(3, 2\)"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2), scales_b=torch.ones(3, 2), block=4)
    with pytest.raises(ValueError, match="needs all three"):
        emulate("probe_matched", a, b, scales_a=torch.ones(2, 2))
    with pytest.raises(ValueError, match="alpha: non-finite"):
        emulate("probe_matched", a, b, alpha=math.inf)
    with pytest.raises(ValueError, match=r"alpha\[1\]: non-finite"):
        emulate("probe_matched", a, b, alpha=[1.0, torch.tensor(math.nan)])
    with pytest.raises(ValueError, match="model: unknown value 'nope'; valid choices"):
        emulate("nope", a, b)
    with pytest.raises(ValueError, match="b: shape"):
        emulate("exact", a, torch.ones(7, 3))
    with pytest.raises(ValueError, match="dtype torch.int32"):
        emulate("exact", a.int(), b)
    with pytest.raises(ValueError, match="lattice"):
        emulate(GemmModel(lattice=Fraction(1, 1000)), a, b)
    with pytest.raises(ValueError, match="split_k"):
        emulate(GemmModel(split_k=3), a, b)
    with pytest.raises(ValueError, match="62"):
        emulate("exact", torch.full((1, 2), 1 + 2.0 ** -52, dtype=torch.float64),
                torch.full((2, 1), 1 + 2.0 ** -40, dtype=torch.float64))
